"""The release version (without the local label that a binary build appends, e.g. +cu130torch2.14)."""

__version__ = "0.1.0"

# Where prebuilt wheels are published: one find-links page per build flavour,
# WHEEL_INDEX + "/" + "<cuda tag>torch<major.minor>" + ".html". The release workflow passes its index
# (EDSC_EXT_WHEEL_INDEX) to the wheels it builds, which record it; no release has been published yet,
# so other builds know of none and their import errors suggest no wheel page.
WHEEL_INDEX = None
