"""``edsc_ext.compat``, the drop-in's first name (``from edsc_ext import compat as dsepconv``): the very
module :mod:`edsc_ext.models.compat`, under both names."""

import sys

from .models import compat

sys.modules[__name__] = compat
