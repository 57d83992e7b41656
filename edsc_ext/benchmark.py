"""``python -m edsc_ext.benchmark``, the op benchmark's command, and its first module name: the very module
:mod:`edsc_ext.benchmarks.op`, under both names."""

import sys

from .benchmarks import op

if __name__ == "__main__":
    sys.exit(op.main())
sys.modules[__name__] = op
