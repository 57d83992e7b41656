"""Makes the packages named in EDSC_EXT_HIDE_PACKAGES (comma-separated import names, e.g. ``av,PIL``)
look uninstalled in this process and in every Python it starts (they inherit the environment):
``import av`` raises ModuleNotFoundError and ``importlib.util.find_spec("av")`` returns None, as without
the package. Put this folder first on PYTHONPATH (tools/optional_packages.py does)."""

import os
import sys

for _name in filter(None, (n.strip() for n in os.environ.get("EDSC_EXT_HIDE_PACKAGES", "").split(","))):
    # None in sys.modules: the import system's own "not importable" mark (import raises, find_spec is None).
    sys.modules[_name] = None
