"""Images through Pillow: float (3, H, W) RGB tensors in [0, 1] in and out.

Reading (:func:`read_image`):

- 8-bit images of any mode Pillow knows (RGB, palette, grayscale, CMYK, ...) become RGB;
  grayscale is repeated to three channels;
- 16-bit grayscale (PNG/TIFF mode ``I;16``/``I``) keeps its 16 bits (divided by 65535); 16-bit
  colour PNGs are read by Pillow at 8 bits per channel; 32-bit float images are refused;
- alpha (RGBA, LA, palette transparency) is dropped: the colour values are used as they are and
  the output is RGB;
- an EXIF orientation tag is applied (the image comes upright, as a viewer shows it);
- of a multi-frame file (animated GIF/PNG, multi-page TIFF) the first frame is read.

Writing (:func:`write_image`): 8-bit RGB (rounded), in the format of the file's extension, through
a temporary file renamed at the end. Every failure is a :class:`~edsc_ext.apps.common.UserError`
naming the file.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Tuple

import numpy as np
import torch
from torch import Tensor

from .common import UserError, atomic_path, describe_os_error, require

__all__ = ["read_image", "read_array", "array_to_tensor", "write_image", "write_array", "image_size", "to_uint8",
           "IMAGE_EXTENSIONS", "is_image_name", "check_writable_image_name"]

# The extensions taken as frames in a folder (and accepted as image outputs).
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp")


def _pil():
    return require("PIL.Image", "reading and writing images")


def is_image_name(path) -> bool:
    return Path(path).suffix.lower() in IMAGE_EXTENSIONS


def _open(path):
    """The opened PIL image of ``path`` (lazily: only the header is read)."""
    image_module = _pil()
    path = Path(path)
    try:
        return image_module.open(path)
    except OSError as e:  # includes PIL.UnidentifiedImageError
        if isinstance(e, image_module.UnidentifiedImageError):
            raise UserError(f"{path}: not an image file (Pillow cannot identify it)") from None
        raise UserError(describe_os_error(e, path)) from None
    except Exception as e:  # noqa: BLE001 (a corrupt header can raise anything: SyntaxError, ValueError, ...)
        raise UserError(f"{path}: corrupt image ({type(e).__name__}: {e})") from None


def image_size(path) -> Tuple[int, int]:
    """(width, height) of an image as :func:`read_image` returns it (EXIF rotation applied), from
    its header only."""
    with _open(path) as image:
        width, height = image.size
        try:
            orientation = image.getexif().get(0x0112, 1)
        except Exception:  # noqa: BLE001 (a broken EXIF block: read_image reports it)
            orientation = 1
    return (height, width) if orientation in (5, 6, 7, 8) else (width, height)


def read_array(path) -> np.ndarray:
    """Reads an image file as an (H, W, 3) RGB array: uint8, or uint16 for 16-bit grayscale (see
    the module's notes on bit depths, grayscale, alpha and EXIF rotation)."""
    from PIL import ImageOps

    path = Path(path)
    with _open(path) as image:
        try:
            image.load()
            image = ImageOps.exif_transpose(image)
            return _to_array(image, path)
        except UserError:
            raise
        except OSError as e:
            if e.errno is not None:
                raise UserError(describe_os_error(e, path)) from None
            raise UserError(f"{path}: corrupt or truncated image ({e})") from None
        except Exception as e:  # noqa: BLE001 (zlib.error, SyntaxError, ValueError, ... of a damaged file)
            raise UserError(f"{path}: corrupt or truncated image ({type(e).__name__}: {e})") from None


def _to_array(image, path: Path) -> np.ndarray:
    mode = image.mode
    if mode.startswith("I;16") or mode == "I":  # 16-bit grayscale (Pillow's I;16, or 32-bit I)
        gray = np.clip(np.array(image), 0, 65535).astype(np.uint16)
        return np.repeat(gray[..., None], 3, axis=2)
    if mode == "F":
        raise UserError(f"{path}: 32-bit floating-point images are not supported (save it with 8 or 16 bits)")
    if mode != "RGB":
        image = image.convert("RGBA" if "A" in mode or "transparency" in image.info else "RGB")
    return np.ascontiguousarray(np.array(image)[..., :3])  # alpha dropped


def array_to_tensor(array: np.ndarray) -> Tensor:
    """(H, W, 3) uint8/uint16 array -> float32 (3, H, W) in [0, 1]."""
    scale = 65535.0 if array.dtype == np.uint16 else 255.0
    if array.dtype == np.uint16:
        array = array.astype(np.float32)
    return torch.from_numpy(array).permute(2, 0, 1).float().div_(scale)


def read_image(path) -> Tensor:
    """Reads an image file as a float32 (3, H, W) RGB tensor in [0, 1]."""
    return array_to_tensor(read_array(path))


def to_uint8(image: Tensor) -> Tensor:
    """(C, H, W) float in [0, 1] -> (H, W, C) uint8 on the CPU, rounded to nearest."""
    return image.detach().clamp(0, 1).mul(255).round_().to(torch.uint8).permute(1, 2, 0).cpu()


def _format_of(path: Path) -> str:
    image_module = _pil()
    image_module.init()
    fmt = image_module.registered_extensions().get(path.suffix.lower())
    if fmt is None or fmt not in image_module.SAVE:
        raise UserError(f"{path}: cannot write images of this kind (use .png, .jpg, .bmp, .tif or .webp)")
    return fmt


def check_writable_image_name(path) -> None:
    """Raises a UserError, before any work, if ``path``'s extension is no image format Pillow writes."""
    _format_of(Path(path))


def _save(image, fileobj, fmt: str) -> None:
    image.save(fileobj, format=fmt)


def write_image(path, image: Tensor) -> None:
    """Writes a float (3, H, W) RGB tensor in [0, 1] as an 8-bit RGB image (format from the
    extension), atomically: a failure leaves no file under ``path``."""
    image_module = _pil()
    path = Path(path)
    fmt = _format_of(path)
    pil_image = image_module.fromarray(to_uint8(image).numpy())
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            _save(pil_image, f, fmt)
    except OSError as e:
        raise UserError(describe_os_error(e, path)) from None


def write_array(path, pixels) -> None:
    """Writes an (H, W, 3) or (H, W) uint8 array (numpy or torch) as an image, atomically."""
    image_module = _pil()
    path = Path(path)
    fmt = _format_of(path)
    array = np.ascontiguousarray(np.asarray(pixels.cpu() if isinstance(pixels, Tensor) else pixels))
    if array.dtype != np.uint8 or array.ndim not in (2, 3):
        raise ValueError(f"write_array needs an (H, W[, C]) uint8 array, got {array.dtype} of shape {array.shape}")
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            _save(image_module.fromarray(array), f, fmt)
    except OSError as e:
        raise UserError(describe_os_error(e, path)) from None


def encode_image(image: Tensor, fmt: str = "PNG") -> bytes:
    """The bytes of ``image`` as an 8-bit RGB file of format ``fmt`` (tests and tools)."""
    buffer = io.BytesIO()
    _pil().fromarray(to_uint8(image).numpy()).save(buffer, format=fmt)
    return buffer.getvalue()
