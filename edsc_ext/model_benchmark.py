"""``python -m edsc_ext.model_benchmark``, the networks benchmark's command, and its first module name: the very
module :mod:`edsc_ext.benchmarks.networks`, under both names."""

import sys

from .benchmarks import networks

if __name__ == "__main__":
    sys.exit(networks.main())
sys.modules[__name__] = networks
