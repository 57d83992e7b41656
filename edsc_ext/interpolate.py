"""``edsc-interpolate`` (also ``python -m edsc_ext.interpolate``): kept at this name; the code is in
:mod:`edsc_ext.apps.interpolate` (and the modules beside it)."""

import sys

from .apps.common import progress  # noqa: F401  (examples/train.py's progress bar)
from .apps.interpolate import *  # noqa: F401,F403
from .apps.interpolate import __all__, interpolate_video, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
