"""The benchmarks: what the op, the networks and the video tool cost.

- :mod:`edsc_ext.benchmarks.op`: the op against its peers and the memory-bandwidth floor
  (``python -m edsc_ext.benchmark``);
- :mod:`edsc_ext.benchmarks.networks`: the EDSC networks end to end in each execution variant
  (``python -m edsc_ext.model_benchmark``, or ``python -m edsc_ext.benchmark --model``);
- :mod:`edsc_ext.benchmarks.video`: ``edsc-interpolate``'s video path against the network alone
  (``python -m edsc_ext.benchmarks.video``, or ``python -m edsc_ext.benchmark --video``; the ``apps`` extra);
- :mod:`edsc_ext.benchmarks.harness`: their one clock, memory release and machine description.

They may import the op, the models and the apps; none of those imports them.
"""
