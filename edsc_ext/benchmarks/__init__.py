"""The benchmarks: what the op, the networks and the video tool cost.

- :mod:`edsc_ext.benchmarks.op`: the op against its peers and the memory-bandwidth floor
  (``edsc-benchmark``, or ``python -m edsc_ext.benchmarks.op``);
- :mod:`edsc_ext.benchmarks.networks`: the EDSC networks end to end in each execution variant
  (``edsc-model-benchmark``, or ``python -m edsc_ext.benchmarks.networks``, or ``edsc-benchmark --model``);
- :mod:`edsc_ext.benchmarks.video`: ``edsc-interpolate``'s video path against the network alone
  (``edsc-video-benchmark``, or ``python -m edsc_ext.benchmarks.video``, or ``edsc-benchmark --video``; the
  ``apps`` extra);
- :mod:`edsc_ext.benchmarks.harness`: their one clock, memory release and machine description.

Each is a console script (pyproject.toml's ``[project.scripts]``) that runs its module's ``main``. They
may import the op, the models and the apps; none of those imports them.
"""
