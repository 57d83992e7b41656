"""Drop-in replacement for the adaptive deformable separable convolution of the EDSC repository.

The EDSC code (Cheng & Chen, ``networks/dsepconv.py``) ships a cupy-only layer::

    from networks import dsepconv
    out = dsepconv.FunctionDSepconv(padded_frame, vertical, horizontal, offset_x, offset_y, mask)

Swap the import for ``from edsc_ext.models import compat as dsepconv`` and the same call runs on the CPU and
on any GPU, in float32/float64/float16/bfloat16, with every gradient (the input frame's included,
which the original never computed). Its forward is the original's, which differs from the clean
:func:`edsc_ext.deform_sepconv` in three ways:

* ``input`` is the frame already replicate-padded by ``K//2``; the output is ``K - 1`` smaller;
  ``offset_x`` (despite its name) displaces the *vertical* coordinate and ``offset_y`` the
  horizontal one; tap ``t = i*K + j`` (i vertical, j horizontal).
* Tap (i, j) at output (y, x) samples the padded frame at ``(y + i + s + offset_x, x + j + s +
  offset_y)`` with ``s = 1 - (K-1)//2``: at K=5 the taps start one pixel up-left of centred ones.
* Out of range, the original clamps the coordinate to ``[0, size-1]`` *and* both bilinear corners,
  weighting them with the clamped coordinate; both corners then land on the border pixel with
  weight 1 each, so a sample with ``p < 0`` or ``p >= size-1`` reads twice that border pixel
  along that axis (four times in a corner). Inside ``[0, size-1)`` it is plain bilinear sampling.

So the original's sample is ``a(py) * a(px) * S_border(py, px)``, with ``S_border`` the op's
``padding_mode="border"`` sample and ``a(p) = 2`` where ``p < 0 or p >= size-1`` (else 1). The
core op computes exactly this as ``padding_mode="edsc"`` (the tap shift, the border sampling and
the doubling, in the kernels of every backend, dtype and layout), reading ``offset_x`` and
``offset_y`` where they are as split offsets: this layer makes no copy and no elementwise pass of
the per-pixel tensors. The gradients are the exact derivatives of the original forward: the
offset gradient is the bilinear derivative inside the frame and 0 where the original clamps
(where its output does not depend on the offset); only on the measure-zero set of coordinates
exactly at ``0`` or ``size-1``, where the original forward jumps, is the derivative undefined,
and the op reports 0 there.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..ops import deform_sepconv

__all__ = ["FunctionDSepconv", "ModuleDSepconv", "compat_deform_sepconv", "tap_shift"]


def tap_shift(kernel_size: int) -> int:
    """The original's first-tap position relative to the output pixel in the padded frame:
    ``1 - (K-1)//2`` (-1 for K=5, where a centred kernel would start at 0)."""
    return 1 - (kernel_size - 1) // 2


def _check(input, vertical, horizontal, offset_x, offset_y, mask, padding: int) -> int:
    names = ("input", "vertical", "horizontal", "offset_x", "offset_y", "mask")
    tensors = (input, vertical, horizontal, offset_x, offset_y, mask)
    for name, t in zip(names, tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D, got shape {tuple(t.shape)}")
    k = vertical.shape[1]
    if horizontal.shape[1] != k:
        raise ValueError(f"vertical and horizontal must have the same number of taps K (the original's kernels "
                         f"are square), got {k} and {horizontal.shape[1]}")
    n, _, h_out, w_out = vertical.shape
    for name, t, channels in (("horizontal", horizontal, k), ("offset_x", offset_x, k * k),
                              ("offset_y", offset_y, k * k), ("mask", mask, k * k)):
        if tuple(t.shape) != (n, channels, h_out, w_out):
            raise ValueError(f"{name} must have shape (N, {'K' if channels == k else 'K*K'}, H, W) = "
                             f"{(n, channels, h_out, w_out)} for vertical of shape {tuple(vertical.shape)}, "
                             f"got {tuple(t.shape)}")
    h_in, w_in = input.shape[2] + 2 * padding, input.shape[3] + 2 * padding
    if (h_in, w_in) != (h_out + k - 1, w_out + k - 1):
        what = "input" if padding == 0 else f"input padded by {padding}"
        raise ValueError(f"{what} must be the frame replicate-padded by K//2 on each side (K - 1 in all), of size "
                         f"(H + K - 1, W + K - 1) = {(h_out + k - 1, w_out + k - 1)} for kernels of shape "
                         f"{tuple(vertical.shape)}; got {(h_in, w_in)} (input shape {tuple(input.shape)})")
    return k


def compat_deform_sepconv(input: Tensor, vertical: Tensor, horizontal: Tensor, offset_x: Tensor,
                          offset_y: Tensor, mask: Tensor, *, padding: int = 0) -> Tensor:
    """The EDSC layer's forward through :func:`edsc_ext.deform_sepconv`.

    ``input`` is the replicate-padded frame (``padding=0``, the original's calling convention), or
    the unpadded frame with ``padding=K//2``: replicate padding followed by the original's sampling
    is exactly border-mode sampling of the unpadded frame with virtual padding, so this skips the
    padded copy and gives the same values and gradients (the input gradient then lands on the
    unpadded frame, as backpropagating through ``F.pad`` would). See the module docstring.
    """
    _check(input, vertical, horizontal, offset_x, offset_y, mask, padding)
    # offset_x displaces the vertical coordinate: it is the dy of the op's split offsets.
    return deform_sepconv(input, vertical, horizontal, (offset_x, offset_y), mask, padding=padding,
                          padding_mode="edsc")


def FunctionDSepconv(input: Tensor, vertical: Tensor, horizontal: Tensor, offset_x: Tensor,
                     offset_y: Tensor, mask: Tensor) -> Tensor:  # noqa: N802 (the original's name)
    """``networks/dsepconv.py``'s ``FunctionDSepconv``, on any device, differentiable in all six.

    Args:
        input: (N, C, H + K - 1, W + K - 1), the frame replicate-padded by K//2 on each side.
        vertical, horizontal: (N, K, H, W) per-pixel separable kernels.
        offset_x: (N, K*K, H, W) displacement of the *vertical* coordinate of tap ``i*K + j``.
        offset_y: (N, K*K, H, W) displacement of the *horizontal* coordinate.
        mask: (N, K*K, H, W) per-tap modulation.

    Returns:
        (N, C, H, W).
    """
    return compat_deform_sepconv(input, vertical, horizontal, offset_x, offset_y, mask)


class ModuleDSepconv(nn.Module):
    """Module form of :func:`FunctionDSepconv` (the original's ``ModuleDSepconv``)."""

    def forward(self, input: Tensor, vertical: Tensor, horizontal: Tensor, offset_x: Tensor,
                offset_y: Tensor, mask: Tensor) -> Tensor:
        return compat_deform_sepconv(input, vertical, horizontal, offset_x, offset_y, mask)
