"""The release version (without the local label that a binary build appends, e.g. +cu130torch2.14)."""

__version__ = "0.1.0"

# Where the workflow publishes the prebuilt wheels: one find-links page per build flavour,
# WHEEL_INDEX + "/" + "<cuda tag>torch<major.minor>" + ".html". A wheel records the index it was
# published to (EDSC_EXT_WHEEL_INDEX at build time); this is the fallback for other builds.
WHEEL_INDEX = "https://edsc-ext.github.io/edsc_ext/whl"
