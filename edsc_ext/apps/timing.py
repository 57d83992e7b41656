"""Where the output frames sit in time, and the scene-cut measure.

Time mapping (times are exact :class:`~fractions.Fraction` seconds, from the frames' own
timestamps, so variable-frame-rate input is handled as it is):

- ``--factor N``: between input frames i and i+1 (at times t_i < t_{i+1}) the output has frame i,
  then N-1 new frames at t_i + j (t_{i+1} - t_i) / N, i.e. at positions s = j/N of the interval.
- ``--fps F``: output frame k sits at time t_0 + k / F. Where an input frame falls there (to within
  half a tick of the input's time base) it is copied, else the frame is interpolated at its
  fractional position s between the two input frames around it.

A video file's last frame lasts until the video ends (its timestamp plus its duration), so the
output has as many frames after it as fit before that end (copies of it: there is no next frame):
the output lasts as long as the input (to within one output frame period). A folder of N frames at
``--input-fps`` R is taken the same way, each frame lasting 1/R: it lasts N/R (x2: 2N frames).

Scene cuts (:func:`scene_score`): the mean absolute difference, in percent of full scale, of the two
frames' luma after an area-average downscale to 64 pixels on the longer side: a video's own Y plane
(averaged, then scaled from its range to [0, 1]) where the frames come as YUV planes, else BT.601
weights of RGB. Computed in numpy by the decode thread (no pool of threads woken per frame).
Motion within a shot scores a few percent (the 640x360 DAVIS clip car-turn, a panning shot: at most
4.3, 2.3 on average), a cut between different shots usually 10 or more: ``DEFAULT_SCENE_THRESHOLD``
is 10. Across a cut no frame is synthesised: the frames that fall between the two input frames are
copies of the one before the cut.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import List, Optional

import numpy as np
import torch
from torch import Tensor

__all__ = ["Schedule", "scene_score", "luma_thumbnail", "area_average", "thumbnail_size", "DEFAULT_SCENE_THRESHOLD",
           "parse_rate"]

DEFAULT_SCENE_THRESHOLD = 10.0
THUMBNAIL_SIZE = 64


def parse_rate(text: str) -> Fraction:
    """A frame rate from the command line: ``60``, ``59.94``, ``23.976`` or ``24000/1001``.
    Decimals with three digits that are those of an NTSC rate (23.976, 29.97, 59.94, 119.88) mean
    the exact N*1000/1001."""
    text = text.strip()
    try:
        rate = Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"not a frame rate: {text!r} (e.g. 60, 59.94 or 24000/1001)") from None
    if rate <= 0:
        raise ValueError(f"the frame rate must be positive, got {text}")
    if "." in text:
        ntsc = Fraction(round(rate * Fraction(1001, 1000)) * 1000, 1001)
        if abs(float(ntsc) - float(rate)) < 0.0006 and ntsc.denominator != 1:
            return ntsc
    return rate


@dataclass
class Output:
    """One output frame: its time (seconds), and what it is made of: the input frame ``index``
    when ``position`` is 0, else the frame at ``position`` in (0, 1) between input frames
    ``index`` and ``index + 1``."""

    time: Fraction
    index: int
    position: Fraction = Fraction(0)

    @property
    def is_copy(self) -> bool:
        return self.position == 0


class Schedule:
    """The output frames, interval by interval: :meth:`between` for the frames in
    [t_i, t_{i+1}), :meth:`after_last` for those from the last input frame to the end.

    ``factor`` N or ``fps`` F (exactly one); ``start`` is the first input frame's time;
    ``tolerance`` how close (seconds) an output time must be to an input frame's to be a copy of
    it (half a tick of the input's time base)."""

    def __init__(self, factor: Optional[int] = None, fps: Optional[Fraction] = None, start: Fraction = Fraction(0),
                 tolerance: Fraction = Fraction(0), snap_depth: Optional[int] = None):
        if (factor is None) == (fps is None):
            raise ValueError("give exactly one of factor and fps")
        self.factor, self.fps = factor, (Fraction(fps) if fps is not None else None)
        self.start, self.tolerance = Fraction(start), Fraction(tolerance)
        # EDSC_s: positions within the timestamps' rounding of a dyadic k/2^d are taken as that.
        self.snap_depth = snap_depth
        self._next_k = 0  # fps: the first output frame not given out yet

    def _snap(self, position: Fraction, interval: Fraction) -> Fraction:
        if self.snap_depth is None or position == 0:
            return position
        grid = 1 << self.snap_depth
        nearest = Fraction(round(position * grid), grid)
        return nearest if abs(nearest - position) * interval <= self.tolerance else position

    def between(self, index: int, t0: Fraction, t1: Fraction) -> List[Output]:
        """Output frames with time in [t0, t1), t0 and t1 the times of input frames index, index+1."""
        if t1 <= t0:
            raise ValueError(f"input frame {index + 1} is not later than frame {index} ({float(t1):.6f} s <= "
                             f"{float(t0):.6f} s)")
        interval = t1 - t0
        if self.factor is not None:
            return [Output(t0 + interval * j / self.factor, index, Fraction(j, self.factor))
                    for j in range(self.factor)]
        out = []
        while True:
            time = self.start + self._next_k / self.fps
            if time >= t1 - self.tolerance:
                return out
            if time <= t0 + self.tolerance:
                position = Fraction(0)  # an input frame falls there (or one was skipped at t0)
            else:
                position = self._snap((time - t0) / interval, interval)
            out.append(Output(time, index, position))
            self._next_k += 1

    def after_last(self, index: int, t_last: Fraction, end: Optional[Fraction]) -> List[Output]:
        """Output frames from the last input frame (``index`` at ``t_last``) until ``end`` (when
        the input ends; None: the last frame ends it): copies of it."""
        if end is None or end <= t_last:
            if self.fps is not None:
                time = self.start + self._next_k / self.fps
                if time > t_last + self.tolerance:
                    return []
                self._next_k += 1
            return [Output(t_last, index)]
        if self.factor is not None:
            return [Output(t_last + (end - t_last) * j / self.factor, index) for j in range(self.factor)]
        out = []
        while True:
            time = self.start + self._next_k / self.fps
            if time >= end - self.tolerance:
                return out
            out.append(Output(time, index))
            self._next_k += 1


def constant_rate_count(frames: int, rate: Fraction, factor: Optional[int], fps: Optional[Fraction],
                        ends: bool) -> int:
    """How many frames a constant-rate input of ``frames`` frames at ``rate`` gives (for the
    progress bar's total); ``ends``: the last frame lasts one period (a video, a folder of frames) or ends it."""
    if frames <= 0:
        return 0
    if factor is not None:
        return frames * factor if ends else (frames - 1) * factor + 1
    duration = Fraction(frames if ends else frames - 1) / rate
    return math.ceil(duration * fps) if ends else math.floor(duration * fps) + 1


def _bins(size: int, count: int) -> List[tuple]:
    """The [start, end) of each of ``count`` averaging bins over ``size`` (adaptive pooling's: they
    overlap by a pixel where ``size`` is not a multiple of ``count``)."""
    return [(i * size // count, -(-(i + 1) * size // count)) for i in range(count)]


def area_average(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """``pixels`` (H, W) or (H, W, C), any numeric dtype, averaged down to (height, width[, C]) float64
    over adaptive pooling's bins (torch's ``adaptive_avg_pool2d``), in numpy: one thread, no pool of
    threads woken for a small result."""
    h, w = pixels.shape[:2]
    # Integers summed as integers (exact, and fast), the rows of a bin first (whole rows at a time).
    total = np.uint64 if pixels.dtype.kind in "ui" else np.float64
    if h % height == 0 and w % width == 0:
        blocks = pixels.reshape(height, h // height, width, w // width, *pixels.shape[2:])
        return blocks.sum(axis=1, dtype=total).sum(axis=2) / ((h // height) * (w // width))
    rows = np.stack([pixels[a:b].sum(axis=0, dtype=total) / (b - a) for a, b in _bins(h, height)])
    return np.stack([rows[:, a:b].sum(axis=1) / (b - a) for a, b in _bins(w, width)], axis=1)


def thumbnail_size(height: int, width: int) -> tuple:
    """(height, width) of the scene measure's thumbnail of a frame: at most 64 pixels on the longer side."""
    scale = THUMBNAIL_SIZE / max(height, width)
    if scale >= 1:
        return height, width
    return max(1, round(height * scale)), max(1, round(width * scale))


def luma_thumbnail(frame) -> Tensor:
    """(3, H, W) RGB in [0, 1] (a tensor on any device, or a numpy array) -> its luma (BT.601 weights),
    area-averaged to at most 64 pixels on the longer side, a float32 CPU tensor (the scene measure's
    view of a frame). An (H, W) input is taken as the luma itself (a video's Y plane, scaled to [0, 1])."""
    if isinstance(frame, Tensor):
        frame = frame.detach().to("cpu", torch.float32).numpy()
    h, w = frame.shape[-2:]
    size = thumbnail_size(h, w)
    if frame.ndim == 2:
        luma = area_average(frame, *size)
    else:  # averaging is linear: the channels first, then their weighted sum
        r, g, b = (area_average(channel, *size) for channel in frame[:3])
        luma = 0.299 * r + 0.587 * g + 0.114 * b
    return torch.from_numpy(luma.astype(np.float32))


def scene_score(first, second) -> float:
    """The scene-change score of two frames, 0..100: the mean absolute difference, in percent, of
    their luma thumbnails (:func:`luma_thumbnail`). Takes frames (3, H, W) or thumbnails."""
    a = first if first.dim() == 2 else luma_thumbnail(first)
    b = second if second.dim() == 2 else luma_thumbnail(second)
    return 100.0 * (a - b).abs().mean().item()
