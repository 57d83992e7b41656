"""The applications built on the EDSC networks, apart from the op's API and its build/loading code.

- :mod:`edsc_ext.apps.interpolate`: the ``edsc-interpolate`` command (an image pair, a folder of
  frames or a video file; any frame rate, scene cuts, tiles; also ``python -m edsc_ext.apps.interpolate``);
- :mod:`edsc_ext.apps.evaluate`: PSNR/SSIM on the Middlebury frames (``python -m edsc_ext.apps.evaluate``);
- :mod:`edsc_ext.apps.engine`: checkpoint loading with one-line errors, and the inference engine
  (batches, EDSC_s bisection, overlapping tiles, the fallback to tiles on CUDA out-of-memory);
- :mod:`edsc_ext.apps.timing`: which output frame sits where (``--factor``/``--fps``, variable
  frame rates) and the scene-cut measure;
- :mod:`edsc_ext.apps.video`: video files through PyAV, streamed by a decode and an encode thread
  (decoded frames to the encoder as they are where they fit);
- :mod:`edsc_ext.apps.frames`: frames between host and device: layouts (the decoder's planar YUV
  of 8 to 12 bits, RGB), the colour conversion on the device, page-locked transfers on side streams;
- :mod:`edsc_ext.apps.stages`: the stage profile of a video run (each stage's busy time, CPU cores,
  the bound);
- :mod:`edsc_ext.apps.images`: images through Pillow;
- :mod:`edsc_ext.apps.common`: the error type the commands print in one line, progress bars
  (tqdm), atomic outputs.

They need the ``apps`` extra's packages: ``pip install tqdm pillow "av>=18"`` (or, in the checkout,
``pip install --no-build-isolation ".[apps]"``).
"""
