"""The release version (without the local label that a binary build appends: +cu130, +cu128 or +cpu)."""

__version__ = "0.1.0"

# Where prebuilt wheels are published: one find-links page per build flavour, WHEEL_INDEX + "/" + label +
# ".html", label cu130, cu128 or cpu (one stable-ABI wheel per flavour serves every torch from the floor
# on, so no torch version in it; .github/workflows/wheels.yml makes the pages). The release workflow
# passes its index (EDSC_EXT_WHEEL_INDEX) to the wheels it builds, which record it; no release has been
# published yet, so other builds know of none and their import errors suggest no wheel page.
WHEEL_INDEX = None
