"""PSNR/SSIM on the Middlebury frames (also ``python -m edsc_ext.evaluate``): kept at this name; the
code is in :mod:`edsc_ext.apps.evaluate`."""

import sys

from .apps.evaluate import *  # noqa: F401,F403
from .apps.evaluate import __all__, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
