"""Image IO without dependencies: a small PNG reader/writer on zlib and torch, PIL when present.

``read_png``/``write_png`` handle 8-bit, non-interlaced PNGs: grayscale, gray+alpha, RGB, RGBA and
palette images (what video frames and the Middlebury/Vimeo-90k data sets use). Decoding undoes the
per-row filters of all five PNG filter types with vectorised torch operations: the Sub, Average and
Paeth filters make each pixel depend on its left neighbour, the Up filter on the pixel above, so the
image is reconstructed one anti-diagonal at a time (every pixel of a diagonal only needs the
diagonals before it), a few hundred small vector steps instead of a Python loop over bytes.

``read_image``/``write_image`` are the entry points the rest of the package uses: float tensors
(C, H, W) in [0, 1], RGB. PNGs always go through this module; other formats (JPEG, ...) need
Pillow.
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import Union

import torch
from torch import Tensor

__all__ = ["read_png", "write_png", "read_image", "write_image", "IMAGE_EXTENSIONS"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".tif", ".tiff", ".webp")
# PNG colour type -> channels (palette images are expanded to RGB or RGBA).
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}

PathLike = Union[str, "os.PathLike[str]"]


def _chunks(data: bytes):
    if data[:8] != PNG_SIGNATURE:
        raise ValueError("not a PNG file (bad signature)")
    pos = 8
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if len(body) != length:
            raise ValueError(f"truncated PNG chunk {kind!r}")
        yield kind, body
        pos += 12 + length
        if kind == b"IEND":
            return
    raise ValueError("truncated PNG (no IEND chunk)")


def _unfilter(raw: bytes, height: int, width: int, bpp: int) -> Tensor:
    """Undo the PNG row filters of 8-bit data; returns (height, width, bpp) uint8."""
    stride = width * bpp
    if len(raw) < height * (stride + 1):
        raise ValueError("truncated PNG image data")
    rows = torch.frombuffer(bytearray(raw[:height * (stride + 1)]), dtype=torch.uint8).view(height, stride + 1)
    kinds = rows[:, 0].to(torch.int32)
    if int(kinds.max()) > 4:
        raise ValueError(f"bad PNG filter type {int(kinds.max())}")
    data = rows[:, 1:].to(torch.int32).view(height, width, bpp)
    if bool((kinds == 0).all()):
        return data.to(torch.uint8)
    # Reconstruct into a buffer with one zero row above and one zero column on the left, so that
    # the left (a), up (b) and up-left (c) neighbours of every pixel exist; flattened, the pixels
    # of one anti-diagonal y + x = d are equally spaced (by width), as are their neighbours.
    wp = width + 1
    buf = torch.zeros((height + 1) * wp, bpp, dtype=torch.int32)
    filt = data.reshape(height * width, bpp)
    kind_of = kinds.repeat_interleave(width)  # filter type of each pixel (its row's)
    for d in range(height + width - 1):
        y0, y1 = max(0, d - width + 1), min(height - 1, d)
        count = y1 - y0 + 1
        # pixel (y, x = d - y) sits at buffer index (y + 1) * wp + (x + 1) = y * width + d + wp + 1
        start = y0 * width + d + wp + 1
        sel = slice(start, start + (count - 1) * width + 1, width)
        # In the filtered pixels, (y, x) is at y * width + x: the diagonal is spaced by width - 1.
        first = y0 * width + (d - y0)
        step = width - 1 if count > 1 else 1
        src = slice(first, first + (count - 1) * step + 1, step)
        a = buf[sel.start - 1:sel.stop - 1:width]
        b = buf[sel.start - wp:sel.stop - wp:width]
        c = buf[sel.start - wp - 1:sel.stop - wp - 1:width]
        f = filt[src]
        kind = kind_of[src].view(count, 1)
        p = a + b - c
        pa, pb, pc = (p - a).abs(), (p - b).abs(), (p - c).abs()
        paeth = torch.where((pa <= pb) & (pa <= pc), a, torch.where(pb <= pc, b, c))
        pred = torch.where(kind == 1, a, torch.where(kind == 2, b, torch.where(kind == 3, (a + b) >> 1,
                                                                               torch.where(kind == 4, paeth, 0))))
        buf[sel] = (f + pred) & 255
    return buf.view(height + 1, wp, bpp)[1:, 1:].to(torch.uint8)


def read_png(path_or_bytes: Union[PathLike, bytes]) -> Tensor:
    """Reads an 8-bit non-interlaced PNG into a (H, W, C) uint8 tensor, C = 1, 2, 3 or 4 (palette
    images come back as RGB, or RGBA when they have transparency)."""
    data = bytes(path_or_bytes) if isinstance(path_or_bytes, (bytes, bytearray)) else open(path_or_bytes, "rb").read()
    header = None
    idat = []
    palette = transparency = None
    for kind, body in _chunks(data):
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"PLTE":
            palette = body
        elif kind == b"tRNS":
            transparency = body
    if header is None:
        raise ValueError("PNG without IHDR chunk")
    width, height, depth, color, _, _, interlace = header
    if color not in _CHANNELS:
        raise ValueError(f"unsupported PNG colour type {color}")
    if depth != 8:
        raise ValueError(f"only 8-bit PNGs are supported, this one has {depth} bits per sample")
    if interlace:
        raise ValueError("interlaced PNGs are not supported")
    channels = _CHANNELS[color]
    pixels = _unfilter(zlib.decompress(b"".join(idat)), height, width, channels)
    if color == 3:
        if palette is None:
            raise ValueError("palette PNG without PLTE chunk")
        table = torch.frombuffer(bytearray(palette), dtype=torch.uint8).view(-1, 3)
        if transparency is not None:
            alpha = torch.full((table.shape[0], 1), 255, dtype=torch.uint8)
            alpha[:len(transparency), 0] = torch.frombuffer(bytearray(transparency), dtype=torch.uint8)
            table = torch.cat([table, alpha], dim=1)
        pixels = table[pixels[..., 0].long()]
    return pixels


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def write_png(path: PathLike, pixels: Tensor, compression: int = 6) -> None:
    """Writes a (H, W) or (H, W, C) uint8 tensor, C in 1..4, as an 8-bit PNG (Up filter on every
    row but the first)."""
    if pixels.dim() == 2:
        pixels = pixels.unsqueeze(-1)
    if pixels.dim() != 3 or pixels.shape[2] not in (1, 2, 3, 4) or pixels.dtype != torch.uint8:
        raise ValueError(f"write_png needs a (H, W[, C]) uint8 tensor with C in 1..4, got {pixels.dtype} "
                         f"of shape {tuple(pixels.shape)}")
    height, width, channels = pixels.shape
    color = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    rows = pixels.detach().cpu().contiguous().view(height, width * channels)
    filtered = rows.clone()
    filtered[1:] = rows[1:] - rows[:-1]  # uint8 arithmetic wraps mod 256, as the Up filter wants
    kinds = torch.full((height, 1), 2, dtype=torch.uint8)
    kinds[:1] = 0
    raw = _bytes(torch.cat([kinds, filtered], dim=1))
    header = struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, compression))
                + _chunk(b"IEND", b""))


def _bytes(t: Tensor) -> bytes:
    # Without numpy: a bytearray that torch writes into.
    out = bytearray(t.numel())
    torch.frombuffer(out, dtype=torch.uint8).copy_(t.reshape(-1))
    return bytes(out)


def _pil():
    try:
        from PIL import Image
    except ImportError:
        return None
    return Image


def read_image(path: PathLike) -> Tensor:
    """Reads an image file as a float32 (3, H, W) RGB tensor in [0, 1] (gray is repeated to three
    channels, alpha dropped)."""
    if str(path).lower().endswith(".png"):
        pixels = read_png(path)
    else:
        image_module = _pil()
        if image_module is None:
            raise RuntimeError(f"reading {path}: only PNG is supported without Pillow (pip install pillow)")
        with image_module.open(path) as image:
            image = image.convert("RGB")
            raw = bytearray(image.tobytes())
            pixels = torch.frombuffer(raw, dtype=torch.uint8).view(image.height, image.width, 3)
    if pixels.shape[2] in (2, 4):
        pixels = pixels[..., :-1]
    if pixels.shape[2] == 1:
        pixels = pixels.expand(-1, -1, 3)
    return pixels.permute(2, 0, 1).float().div_(255)


def to_uint8(image: Tensor) -> Tensor:
    """(C, H, W) float in [0, 1] -> (H, W, C) uint8, rounded to nearest."""
    return image.detach().clamp(0, 1).mul(255).round_().to(torch.uint8).permute(1, 2, 0).cpu()


def write_image(path: PathLike, image: Tensor) -> None:
    """Writes a float (C, H, W) RGB tensor in [0, 1] (rounded to 8 bits); PNG without Pillow."""
    pixels = to_uint8(image)
    if str(path).lower().endswith(".png"):
        write_png(path, pixels)
        return
    image_module = _pil()
    if image_module is None:
        raise RuntimeError(f"writing {path}: only PNG is supported without Pillow (pip install pillow)")
    image_module.fromarray(pixels.numpy()).save(path)
