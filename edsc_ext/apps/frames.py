"""Frames between host memory and the network: layouts, colour conversion on the device, transfers.

The decode thread hands over frames as the decoder made them; the conversion to the network's input
(BGR float, (3, H, W) in [0, 1]) and back happens on the engine's device, in torch, so that the host
threads do no per-pixel work beyond one copy:

- **planar YUV** (what nearly every camera and encoder writes: 4:2:0, 4:2:2 or 4:4:4, 8, 10 or 12 bits,
  ``yuv420p``, ``yuv420p10le``, ``yuv422p``, ...): the three planes one after another in one flat array
  (uint8, or uint16 holding the 10/12-bit codes). Uploaded as they are (half the bytes of 8-bit RGB at
  4:2:0), converted with the video's matrix (BT.601, BT.709 or BT.2020 non-constant luminance) and range
  (limited or full, scaled to the bit depth), the chroma repeated over the pixels it covers, as FFmpeg's
  swscale does (its RGB differs from this by at most 3 levels, 1 on average). Back, the chroma of a
  block is the mean of its pixels: a frame converted there and back keeps its chroma exactly and its
  luma to within one code. 10-bit video stays 10-bit: no 8-bit step anywhere.
- ``rgb24`` / ``rgb48le``: packed RGB, 8 or 16 bits, converted from and to the video's own format by
  swscale in the decode and encode threads (other matrices and pixel formats, images, folders of frames).

On CUDA, host buffers are page-locked and the copies run on side streams, ordered against the
network by events, so transfers overlap the network and the main thread never waits for the GPU:
a :class:`HostFrame` coming back carries the event the encode thread waits on before reading it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["Layout", "HostFrame", "Transfer", "YUV_MATRICES", "PLANAR_YUV", "yuv_layout_of", "to_model",
           "from_model", "host_array"]

# Luma weights (Kr, Kb) of the YUV matrices converted on the device, by FFmpeg's AVColorSpace:
# 1 BT.709, 5 BT.470BG and 6 SMPTE 170M (both BT.601), 9 BT.2020 non-constant luminance; 2
# (unspecified) is BT.601, swscale's default.
YUV_MATRICES = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722), "bt2020": (0.2627, 0.0593)}
_MATRIX_OF_COLORSPACE = {1: "bt709", 2: "bt601", 5: "bt601", 6: "bt601", 9: "bt2020"}
# AVColorRange: 2 is full (JPEG) range; 0 (unspecified) and 1 are limited.
_FULL_RANGE = 2
# The planar YUV formats converted on the device: (bits per sample, log2 of the chroma's horizontal and
# vertical subsampling). The yuvj ones are full range whatever the tag says.
PLANAR_YUV: Dict[str, Tuple[int, int, int]] = {
    "yuv420p": (8, 1, 1), "yuvj420p": (8, 1, 1), "yuv422p": (8, 1, 0), "yuvj422p": (8, 1, 0),
    "yuv444p": (8, 0, 0), "yuvj444p": (8, 0, 0),
    "yuv420p10le": (10, 1, 1), "yuv422p10le": (10, 1, 0), "yuv444p10le": (10, 0, 0),
    "yuv420p12le": (12, 1, 1), "yuv422p12le": (12, 1, 0), "yuv444p12le": (12, 0, 0),
}


@dataclass(frozen=True)
class Layout:
    """How one frame lies in host memory: ``format`` a planar YUV format of :data:`PLANAR_YUV` (its
    planes one after another in a flat array, with the YUV ``matrix`` and range), 'rgb24' ((H, W, 3)
    uint8) or 'rgb48le' (uint16)."""

    format: str
    height: int
    width: int
    matrix: str = "bt601"
    full_range: bool = False

    @property
    def planar(self) -> bool:
        return self.format in PLANAR_YUV

    @property
    def bits(self) -> int:
        if self.planar:
            return PLANAR_YUV[self.format][0]
        return 16 if self.format == "rgb48le" else 8

    @property
    def plane_shapes(self) -> List[Tuple[int, int]]:
        """(height, width) of the Y, U and V planes (chroma sizes rounded up, as FFmpeg's)."""
        _, sx, sy = PLANAR_YUV[self.format]
        chroma = (-(-self.height >> sy), -(-self.width >> sx))
        return [(self.height, self.width), chroma, chroma]

    @property
    def shape(self) -> tuple:
        if self.planar:
            return (sum(h * w for h, w in self.plane_shapes),)
        return (self.height, self.width, 3)

    @property
    def dtype(self):
        return np.uint8 if self.bits == 8 else np.uint16

    @property
    def torch_dtype(self) -> torch.dtype:
        """The tensors' dtype: uint8, or int16 holding the bits of the uint16 samples (torch has few
        uint16 kernels, on CUDA fewer)."""
        return torch.uint8 if self.bits == 8 else torch.int16

    def planes(self, array: np.ndarray) -> List[np.ndarray]:
        """Views of the Y, U and V planes of a flat planar ``array``."""
        out, offset = [], 0
        for h, w in self.plane_shapes:
            out.append(array[offset:offset + h * w].reshape(h, w))
            offset += h * w
        return out


def yuv_layout_of(pix_fmt: str, colorspace: int, color_range: int, width: int, height: int) -> Optional[Layout]:
    """The planar layout of frames of this pixel format and colour tags, or None where they are
    converted by swscale instead (another format or matrix)."""
    if pix_fmt not in PLANAR_YUV:
        return None
    matrix = _MATRIX_OF_COLORSPACE.get(int(colorspace))
    if matrix is None:
        return None
    full = pix_fmt.startswith("yuvj") or int(color_range) == _FULL_RANGE
    return Layout(pix_fmt, height, width, matrix, full)


def _yuv_scales(layout: Layout) -> Tuple[float, float, float, float]:
    """(luma offset, luma scale, chroma offset, chroma scale) of the layout's codes: full range 0..2^b-1,
    limited 16..235 / 16..240 times 2^(b-8)."""
    bits = layout.bits
    if layout.full_range:
        top = float((1 << bits) - 1)
        return 0.0, top, float(1 << (bits - 1)), top
    scale = float(1 << (bits - 8))
    return 16.0 * scale, 219.0 * scale, 128.0 * scale, 224.0 * scale


def _as_float(host: Tensor) -> Tensor:
    """Integer samples as float32; int16 holds uint16's bits (16-bit RGB may use the sign bit)."""
    if host.dtype in (torch.int16, torch.uint16):
        return host.view(torch.int16).to(torch.int32).bitwise_and_(0xFFFF).float()
    return host.float()


def to_model(host: Tensor, layout: Layout) -> Tensor:
    """Frames as ``layout`` lays them out, (..., *layout.shape) integer tensors on any device ->
    the network's input, BGR float32 (..., 3, H, W) in [0, 1] on the same device."""
    if layout.planar:
        h, w = layout.height, layout.width
        lead = host.shape[:-1]
        flat = _as_float(host)
        (_, _), (ch, cw), _ = layout.plane_shapes
        _, sx, sy = PLANAR_YUV[layout.format]
        y = flat[..., :h * w].reshape(*lead, h, w)
        u = flat[..., h * w:h * w + ch * cw].reshape(*lead, ch, cw)
        v = flat[..., h * w + ch * cw:].reshape(*lead, ch, cw)
        y_offset, luma, c_offset, chroma = _yuv_scales(layout)
        kr, kb = YUV_MATRICES[layout.matrix]
        y = (y - y_offset) / luma

        def full_size(c: Tensor) -> Tensor:  # chroma repeated over the pixels it covers, as swscale's
            c = (c - c_offset) / chroma
            if sx:
                c = c.repeat_interleave(1 << sx, -1)[..., :w]
            if sy:
                c = c.repeat_interleave(1 << sy, -2)[..., :h, :]
            return c

        u, v = full_size(u), full_size(v)
        r = y + (2 * (1 - kr)) * v
        b = y + (2 * (1 - kb)) * u
        g = (y - kr * r - kb * b) / (1 - kr - kb)
        return torch.stack([b, g, r], dim=-3).clamp_(0, 1)
    scale = 65535.0 if layout.format == "rgb48le" else 255.0
    return _as_float(host).movedim(-1, -3).flip(-3).div_(scale)


def from_model(bgr: Tensor, layout: Layout) -> Tensor:
    """The network's output, BGR (..., 3, H, W) in [0, 1] (any float dtype), -> integer frames in
    ``layout`` (..., *layout.shape), on the same device (uint8, or int16 for more than 8 bits)."""
    bgr = bgr.float().clamp(0, 1)
    b, g, r = bgr.unbind(-3)
    top = (1 << layout.bits) - 1
    if layout.planar:
        kr, kb = YUV_MATRICES[layout.matrix]
        y_offset, luma, c_offset, chroma = _yuv_scales(layout)
        _, sx, sy = PLANAR_YUV[layout.format]
        y = kr * r + (1 - kr - kb) * g + kb * b

        def subsampled(c: Tensor) -> Tensor:  # the mean of the pixels a chroma sample covers
            if not (sx or sy):
                return c
            lead = c.shape[:-2]
            pooled = F.avg_pool2d(c.reshape(-1, 1, *c.shape[-2:]), (1 << sy, 1 << sx), ceil_mode=True)
            return pooled.reshape(*lead, *pooled.shape[-2:])

        cb = subsampled((b - y) / (2 * (1 - kb)))
        cr = subsampled((r - y) / (2 * (1 - kr)))
        planes = [y * luma + y_offset, cb * chroma + c_offset, cr * chroma + c_offset]
        lead = bgr.shape[:-3]
        flat = torch.cat([p.reshape(*lead, -1) for p in planes], dim=-1).round_().clamp_(0, top)
        return flat.to(layout.torch_dtype)
    pixels = torch.stack([r, g, b], dim=-1).mul_(top).round_()
    if layout.format == "rgb48le":  # 0..65535 as int16's bits (the cast wraps)
        return pixels.to(torch.int32).to(torch.int16)
    return pixels.to(torch.uint8)


def host_array(tensor: Tensor, layout: Layout) -> np.ndarray:
    """A host tensor of ``layout``'s samples as the numpy array PyAV takes (uint16 for more than 8 bits)."""
    array = tensor.numpy()
    return array.view(np.uint16) if array.dtype == np.int16 else array


def host_tensor(array: np.ndarray) -> Tensor:
    """The inverse of :func:`host_array`: a numpy array of samples as a tensor (int16 for uint16)."""
    return torch.from_numpy(array.view(np.int16) if array.dtype == np.uint16 else array)


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
    stream each way, ordered against the current (the network's) stream by events; elsewhere plain
    tensors. ``profile`` (a :class:`~edsc_ext.apps.stages.StageProfile`) times the copies."""

    def __init__(self, device: torch.device, profile=None):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.profile = profile
        # One stream each way: an upload need not queue behind a download that waits for the network.
        self.up = torch.cuda.Stream(self.device) if self.cuda else None
        self.down = torch.cuda.Stream(self.device) if self.cuda else None

    def host_buffer(self, layout: Layout) -> Tuple[Tensor, np.ndarray]:
        """A host tensor for one frame of ``layout`` (page-locked on CUDA) and its numpy view, to be
        filled by the decode thread: its copy to the device then needs no staging."""
        tensor = torch.empty(layout.shape, dtype=layout.torch_dtype, pin_memory=self.cuda)
        return tensor, host_array(tensor, layout)

    def pin(self, array: np.ndarray) -> Tensor:
        """A host tensor of ``array`` ready to be copied (page-locked on CUDA: a copy)."""
        host = host_tensor(array)
        return host.pin_memory() if self.cuda else host

    def upload(self, host: Tensor) -> Tensor:
        """``host`` (from :meth:`host_buffer` or :meth:`pin`) on the device. On CUDA the copy runs on
        the upload stream, overlapping the network's work queued before it, and the current stream
        waits for it."""
        if not self.cuda:
            return host
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.up):
            if self.profile is not None:
                with self.profile.device("upload", self.device, self.up, frames=0):
                    on_device = host.to(self.device, non_blocking=True)
            else:
                on_device = host.to(self.device, non_blocking=True)
        compute.wait_stream(self.up)
        on_device.record_stream(compute)  # allocated on the upload stream, read by the network's
        return on_device

    def download(self, frames: Tensor, layout: Layout) -> List[HostFrame]:
        """``frames`` (N, *layout.shape) on the device -> N :class:`HostFrame`, whose :meth:`get`
        waits (CUDA) for the copy. The copy runs on the download stream once the current stream's
        work so far (what makes the frames) is done; this thread does not wait."""
        if not self.cuda:
            arrays = host_array(frames.cpu(), layout)
            return [HostFrame(arrays[i], layout) for i in range(len(arrays))]
        self.down.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.down):
            host = torch.empty(frames.shape, dtype=frames.dtype, pin_memory=True)
            if self.profile is not None:
                with self.profile.device("download", self.device, self.down, frames=0):
                    host.copy_(frames, non_blocking=True)
            else:
                host.copy_(frames, non_blocking=True)
            ready = torch.cuda.Event(blocking=True)  # the encode thread sleeps on it, leaving its core to x264
            ready.record(self.down)
        frames.record_stream(self.down)
        arrays = host_array(host, layout)
        return [HostFrame(arrays[i], layout, ready, host) for i in range(len(arrays))]
