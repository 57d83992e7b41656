"""Frames between host memory and the network: layouts, colour conversion on the device, transfers.

The decode thread hands over frames as PyAV lays them out; the conversion to the network's input
(BGR float, (3, H, W) in [0, 1]) and back happens on the engine's device, in torch, so that the host
threads do no per-pixel work beyond one copy:

- ``yuv420p`` (8-bit 4:2:0, what nearly every camera and encoder writes): the three planes stacked
  into one (H * 3/2, W) uint8 array (PyAV's ``to_ndarray()`` without a format). Uploaded as is
  (half the bytes of RGB), converted with the video's matrix (BT.601, or BT.709) and range
  (limited 16..235 or full), the chroma repeated over its 2x2 pixels, as FFmpeg's swscale does (its
  RGB differs from this by at most 3 levels, 1 on average). Back to yuv420p the chroma is the mean
  of each 2x2 block: a frame converted there and back keeps its chroma exactly and its luma to
  within one level. Other matrices (BT.2020, ...) and formats go the packed way.
- ``rgb24`` / ``rgb48le``: packed RGB, 8 or 16 bits, converted from and to the video's own format
  by swscale in the decode and encode threads (10-bit and 4:4:4 video, images, folders of frames).

On CUDA, host buffers are page-locked and the copies run on a side stream, ordered against the
network by events, so transfers overlap the network and the main thread never waits for the GPU:
a :class:`HostFrame` coming back carries the event the encode thread waits on before reading it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["Layout", "HostFrame", "Transfer", "YUV_MATRICES", "yuv_layout_of", "to_model", "from_model"]

# Luma weights (Kr, Kb) of the YUV matrices converted on the device, by FFmpeg's AVColorSpace:
# 1 BT.709, 5 BT.470BG and 6 SMPTE 170M (both BT.601); 2 (unspecified) is BT.601, swscale's default.
YUV_MATRICES = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722)}
_MATRIX_OF_COLORSPACE = {1: "bt709", 2: "bt601", 5: "bt601", 6: "bt601"}
# AVColorRange: 2 is full (JPEG) range; 0 (unspecified) and 1 are limited.
_FULL_RANGE = 2


@dataclass(frozen=True)
class Layout:
    """How one frame lies in host memory: ``format`` 'yuv420p' (planes stacked into (H * 3/2, W)
    uint8, with the YUV ``matrix`` and range), 'rgb24' ((H, W, 3) uint8) or 'rgb48le' (uint16)."""

    format: str
    height: int
    width: int
    matrix: str = "bt601"
    full_range: bool = False

    @property
    def shape(self) -> tuple:
        if self.format == "yuv420p":
            return (self.height * 3 // 2, self.width)
        return (self.height, self.width, 3)

    @property
    def dtype(self):
        return np.uint16 if self.format == "rgb48le" else np.uint8


def yuv_layout_of(pix_fmt: str, colorspace: int, color_range: int, width: int, height: int) -> Optional[Layout]:
    """The yuv420p layout of frames of this pixel format and colour tags, or None where they are
    converted by swscale instead (another format or matrix, odd sizes)."""
    if pix_fmt not in ("yuv420p", "yuvj420p") or width % 2 or height % 2:
        return None
    matrix = _MATRIX_OF_COLORSPACE.get(int(colorspace))
    if matrix is None:
        return None
    full = pix_fmt == "yuvj420p" or int(color_range) == _FULL_RANGE
    return Layout("yuv420p", height, width, matrix, full)


def _yuv_scales(layout: Layout):
    # (luma offset, luma scale, chroma scale) of 8-bit codes: full range 0..255, limited 16..235 / 16..240.
    return (0.0, 255.0, 255.0) if layout.full_range else (16.0, 219.0, 224.0)


def to_model(host: Tensor, layout: Layout) -> Tensor:
    """Frames as ``layout`` lays them out, (..., *layout.shape) integer tensors on any device ->
    the network's input, BGR float32 (..., 3, H, W) in [0, 1] on the same device."""
    if layout.format == "yuv420p":
        h, w = layout.height, layout.width
        lead = host.shape[:-2]
        flat = host.reshape(*lead, -1).float()
        y = flat[..., :h * w].reshape(*lead, h, w)
        u = flat[..., h * w:h * w * 5 // 4].reshape(*lead, h // 2, w // 2)
        v = flat[..., h * w * 5 // 4:].reshape(*lead, h // 2, w // 2)
        offset, luma, chroma = _yuv_scales(layout)
        kr, kb = YUV_MATRICES[layout.matrix]
        y = (y - offset) / luma
        # Chroma repeated over its 2x2 block, as swscale's unscaled conversion does.
        u = ((u - 128.0) / chroma).repeat_interleave(2, -1).repeat_interleave(2, -2)
        v = ((v - 128.0) / chroma).repeat_interleave(2, -1).repeat_interleave(2, -2)
        r = y + (2 * (1 - kr)) * v
        b = y + (2 * (1 - kb)) * u
        g = (y - kr * r - kb * b) / (1 - kr - kb)
        return torch.stack([b, g, r], dim=-3).clamp_(0, 1)
    scale = 65535.0 if layout.format == "rgb48le" else 255.0
    # uint16 has few kernels (on CUDA even fewer): read as int16, widened, the sign's wrap undone.
    pixels = host.view(torch.int16).to(torch.int32).bitwise_and_(0xFFFF) if host.dtype == torch.uint16 else host
    return pixels.movedim(-1, -3).flip(-3).float().div_(scale)


def from_model(bgr: Tensor, layout: Layout) -> Tensor:
    """The network's output, BGR (..., 3, H, W) in [0, 1] (any float dtype), -> integer frames in
    ``layout`` (..., *layout.shape), on the same device."""
    bgr = bgr.float().clamp(0, 1)
    b, g, r = bgr.unbind(-3)
    if layout.format == "yuv420p":
        kr, kb = YUV_MATRICES[layout.matrix]
        offset, luma, chroma = _yuv_scales(layout)
        y = kr * r + (1 - kr - kb) * g + kb * b
        # Chroma of each 2x2 block: the mean of its four pixels (linear, so the mean of the RGB too).
        cb = F.avg_pool2d(((b - y) / (2 * (1 - kb))).unsqueeze(-3), 2).squeeze(-3)
        cr = F.avg_pool2d(((r - y) / (2 * (1 - kr))).unsqueeze(-3), 2).squeeze(-3)
        planes = [y * luma + offset, cb * chroma + 128.0, cr * chroma + 128.0]
        lead = bgr.shape[:-3]
        flat = torch.cat([p.reshape(*lead, -1) for p in planes], dim=-1)
        return flat.round_().clamp_(0, 255).to(torch.uint8).reshape(*lead, *layout.shape)
    scale = 65535.0 if layout.format == "rgb48le" else 255.0
    pixels = torch.stack([r, g, b], dim=-1).mul_(scale).round_()
    if layout.format == "rgb48le":  # 0..65535 as int16's bits (the cast wraps), seen as uint16
        return pixels.to(torch.int32).to(torch.int16).view(torch.uint16)
    return pixels.to(torch.uint8)


@dataclass
class HostFrame:
    """One output frame in host memory: ``array`` laid out as ``layout``. ``ready`` (CUDA) is the
    event after which the array is filled: :meth:`get` waits for it. ``keep`` holds the
    page-locked tensor the array views."""

    array: np.ndarray
    layout: Layout
    ready: Optional["torch.cuda.Event"] = None
    keep: Optional[Tensor] = None

    def get(self) -> np.ndarray:
        if self.ready is not None:
            self.ready.synchronize()
            self.ready = None
        return self.array


class Transfer:
    """Host <-> device copies of frames for one device. On CUDA: page-locked host memory and a side
    stream, ordered against the current (the network's) stream by events; elsewhere plain tensors."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        # One stream each way: an upload need not queue behind a download that waits for the network.
        self.up = torch.cuda.Stream(self.device) if self.cuda else None
        self.down = torch.cuda.Stream(self.device) if self.cuda else None

    def pin(self, array: np.ndarray) -> Tensor:
        """A host tensor of ``array`` ready to be copied (page-locked on CUDA: a copy). Called from
        the decode thread, so that the copy is not the main thread's."""
        host = torch.from_numpy(array)
        return host.pin_memory() if self.cuda else host

    def upload(self, host: Tensor) -> Tensor:
        """``host`` (from :meth:`pin`) on the device. On CUDA the copy runs on the upload stream,
        overlapping the network's work queued before it, and the current stream waits for it."""
        if not self.cuda:
            return host
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.up):
            on_device = host.to(self.device, non_blocking=True)
        compute.wait_stream(self.up)
        on_device.record_stream(compute)  # allocated on the upload stream, read by the network's
        return on_device

    def download(self, frames: Tensor, layout: Layout) -> List[HostFrame]:
        """``frames`` (N, *layout.shape) on the device -> N :class:`HostFrame`, whose :meth:`get`
        waits (CUDA) for the copy. The copy runs on the download stream once the current stream's
        work so far (what makes the frames) is done; this thread does not wait."""
        if not self.cuda:
            arrays = frames.cpu().numpy()
            return [HostFrame(arrays[i], layout) for i in range(len(arrays))]
        self.down.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.down):
            host = torch.empty(frames.shape, dtype=frames.dtype, pin_memory=True)
            host.copy_(frames, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self.down)
        frames.record_stream(self.down)
        arrays = host.numpy()
        return [HostFrame(arrays[i], layout, ready, host) for i in range(len(arrays))]
