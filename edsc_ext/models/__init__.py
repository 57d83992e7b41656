"""The EDSC networks, the drop-in for the EDSC repository's layer, and their export, built on the op.

- :mod:`edsc_ext.models.networks`: EDSC_s and EDSC_m (their names are also this package's:
  ``from edsc_ext.models import EDSC_s, load_checkpoint``);
- :mod:`edsc_ext.models.compat`: the drop-in for the EDSC repository's cupy layer;
- :mod:`edsc_ext.models.onnx`: ONNX export of models that use the op (needs the ``deploy`` extra).

They import the op (:mod:`edsc_ext`) and nothing of the apps or the benchmarks.
"""

from .networks import *  # noqa: F401,F403
from .networks import __all__  # noqa: F401
