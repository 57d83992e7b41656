"""Pure-PyTorch implementations of ``deform_sepconv``: the ground truth and the baseline.

* :func:`deform_sepconv` is the reference the compiled kernels are tested against. It follows the
  definition literally, one tap at a time, and is differentiable by autograd, so its gradients are
  the reference gradients too (right-hand derivative at integer coordinates, through ``floor``; zero
  offset gradient where ``padding_mode="border"`` clamps a coordinate). It computes in the dtype it
  is given: call it in float64 for a ground truth.
* :func:`deform_sepconv_grid_sample` is what one would write without this package: every tap's
  sample positions stacked into one big grid for :func:`torch.nn.functional.grid_sample`. It gives
  the same result as the reference and serves as the baseline for benchmarks.

Both take exactly the arguments of :func:`edsc_ext.deform_sepconv` and validate them with the same
:func:`edsc_ext.ops.normalize_args`, so they raise the same errors.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .ops import normalize_args

__all__ = ["deform_sepconv", "deform_sepconv_grid_sample"]


def edsc_tap_shift(kernel: int) -> int:
    """Where ``padding_mode="edsc"`` moves tap 0 (the EDSC layer's ``1 - (K-1)//2``)."""
    return 1 - (kernel - 1) // 2


def _positions(args, dtype: torch.dtype):
    """Undeformed sample positions: rows ``y - pad_h`` as (H_out, 1), columns ``x - pad_w`` as (1, W_out)
    (plus the tap shift in "edsc" mode)."""
    h_out, w_out = args.output_size
    device = args.input.device
    shift_h = edsc_tap_shift(args.kernel_h) if args.padding_mode == "edsc" else 0
    shift_w = edsc_tap_shift(args.kernel_w) if args.padding_mode == "edsc" else 0
    rows = torch.arange(h_out, dtype=dtype, device=device).sub_(args.pad_h - shift_h).view(h_out, 1)
    cols = torch.arange(w_out, dtype=dtype, device=device).sub_(args.pad_w - shift_w).view(1, w_out)
    return rows, cols


def _edsc_factor(p: Tensor, size: int, pad: int) -> Tensor:
    """"edsc" mode's factor along one axis: 2 outside [-pad, size - 1 + pad), else 1 (no gradient)."""
    p = p.detach()
    return 1 + ((p < -pad) | (p >= size - 1 + pad)).to(p.dtype)


def _clamp_coordinate(p: Tensor, size: int, padding_mode: str) -> Tensor:
    """Bring a coordinate into the range where sampling it is safe and means what the op says.

    "border": clamp into [0, size-1]; the gradient is 0 where ``p <= 0`` or ``p >= size-1`` (the
    borders count as clamped, as in grid_sample's ``clip_coordinates_set_grad``).
    "zeros": clamp into [-2, size+1], where every corner of a clamped point is outside the image
    anyway, so neither the value nor the gradient changes; it only keeps ``floor(p)`` a small integer.
    (``p`` is finite: :func:`_sample_or_poison` handles the others.)
    """
    if padding_mode in ("border", "edsc"):
        inside = (p > 0) & (p < size - 1)
        return torch.where(inside, p, p.detach().clamp(0, size - 1))
    return p.clamp(-2, size + 1)


def _bilinear(planes: Tensor, height: int, width: int, py: Tensor, px: Tensor, padding_mode: str,
              frame_pad=(0, 0)) -> Tensor:
    """Sample ``planes`` (N, C, H*W+1: the flattened image plus one trailing zero) at finite (N, H_out, W_out)
    positions ``py``, ``px``; returns (N, C, H_out, W_out). ``frame_pad``: the call's padding, where
    "edsc" mode starts counting border pixels twice."""
    n, c = planes.shape[:2]
    factor = None
    if padding_mode == "edsc":
        factor = (_edsc_factor(py, height, frame_pad[0]) * _edsc_factor(px, width, frame_pad[1])).unsqueeze(1)
    py = _clamp_coordinate(py, height, padding_mode)
    px = _clamp_coordinate(px, width, padding_mode)
    y0 = torch.floor(py).detach()
    x0 = torch.floor(px).detach()
    ly, lx = py - y0, px - x0
    y0, x0 = y0.long(), x0.long()
    out = 0
    for dy, wy in ((0, 1 - ly), (1, ly)):
        for dx, wx in ((0, 1 - lx), (1, lx)):
            yy, xx = y0 + dy, x0 + dx
            inside = (yy >= 0) & (yy < height) & (xx >= 0) & (xx < width)
            # Corners outside the image read the trailing zero at index H*W.
            index = torch.where(inside, yy * width + xx, height * width)
            index = index.reshape(n, 1, py.shape[1] * py.shape[2]).expand(n, c, -1)
            values = planes.gather(2, index).view(n, c, *py.shape[1:])
            out = out + (wy * wx).unsqueeze(1) * values
    return out if factor is None else out * factor


def deform_sepconv(input: Tensor, vertical: Optional[Tensor] = None, horizontal: Optional[Tensor] = None,
                   offset=None, mask: Optional[Tensor] = None, *,
                   kernel_size=None, padding=0, dilation=1, padding_mode: str = "zeros") -> Tensor:
    r"""Reference ``deform_sepconv``: same arguments, errors and result as :func:`edsc_ext.deform_sepconv`.

    ``out[n,c,y,x] = sum_{i<KH, j<KW} V[n,i,y,x] * Hz[n,j,y,x] * M[n,t,y,x] * S(input[n,c], py, px)``
    with ``t = i*KW + j``, ``py = y - pad_h + i*dil_h + offset[n,2t,y,x]``,
    ``px = x - pad_w + j*dil_w + offset[n,2t+1,y,x]`` and S bilinear sampling with pixel centres at
    integer coordinates (corners outside the image are 0; in "border" mode the coordinates are first
    clamped into the image; "edsc" mode: see :func:`edsc_ext.deform_sepconv`). A non-finite offset
    makes its output pixel NaN in every channel, and its gradients follow the op's rule (README, "The
    op"; :func:`_sample_or_poison`). Split offsets (``offset=(dy, dx)``) are taken too.

    Pure PyTorch and differentiable by autograd in all five tensors. Loops over the taps, so only one
    tap's samples exist at a time. Computes in the dtype of ``input`` (float16 and bfloat16 in
    float32, like the kernels, whose coordinates would otherwise be rounded; so are half-type
    per-pixel tensors with a float32 input), and returns that dtype.
    """
    args = normalize_args(input, vertical, horizontal, offset, mask, kernel_size=kernel_size,
                          padding=padding, dilation=dilation, padding_mode=padding_mode)
    dtype = input.dtype
    offset, offset_dx = args.offset, args.offset_dx
    compute = torch.promote_types(dtype, torch.float32)
    input, vertical, horizontal, offset, mask, offset_dx = (
        t if t is None or t.dtype == compute else t.to(compute)
        for t in (input, vertical, horizontal, offset, mask, offset_dx))
    n, c, height, width = input.shape
    h_out, w_out = args.output_size
    rows, cols = _positions(args, input.dtype)
    # The flattened image plus one zero that every outside corner reads.
    planes = F.pad(input.reshape(n, c, height * width), (0, 1))
    out = input.new_zeros((n, c, h_out, w_out))
    for i in range(args.kernel_h):
        for j in range(args.kernel_w):
            t = i * args.kernel_w + j
            py = (rows + i * args.dilation_h).expand(n, h_out, w_out)
            px = (cols + j * args.dilation_w).expand(n, h_out, w_out)
            if offset is None:
                sample = _bilinear(planes, height, width, py, px, args.padding_mode, (args.pad_h, args.pad_w))
            else:
                py = py + (offset[:, 2 * t] if offset_dx is None else offset[:, t])
                px = px + (offset[:, 2 * t + 1] if offset_dx is None else offset_dx[:, t])
                sample = _sample_or_poison(planes, height, width, py, px, args)
            weight = None
            for w in (vertical[:, i] if vertical is not None else None,
                      horizontal[:, j] if horizontal is not None else None,
                      mask[:, t] if mask is not None else None):
                if w is not None:
                    weight = w if weight is None else weight * w
            out = out + (sample if weight is None else weight.unsqueeze(1) * sample)
    return out.to(dtype)


def _sample_or_poison(planes: Tensor, height: int, width: int, py: Tensor, px: Tensor, args) -> Tensor:
    """One tap's samples (N, C, H_out, W_out) at positions that may be non-finite, by the op's rule
    (README, "The op"): where py or px is NaN or +-inf the sample is NaN and reads no pixel, so the
    frame gets no gradient from it, while its derivative by the position is NaN (both offset
    components), and so are the tap's vertical, horizontal and mask gradients (through the NaN value).
    The kernels do the same: they sample (0, 0) there, scatter zeros and set those gradients to NaN."""
    finite = torch.isfinite(py) & torch.isfinite(px)
    sample = _bilinear(planes, height, width, torch.where(finite, py, 0), torch.where(finite, px, 0),
                       args.padding_mode, (args.pad_h, args.pad_w))
    # 0 where finite and NaN elsewhere, a constant: py * poison is 0 (gradient 0) at finite positions and
    # NaN (gradient NaN) at the others, without touching the frame's gradient.
    poison = torch.where(finite, 0.0, float("nan")).to(py.dtype)
    return torch.where(finite.unsqueeze(1), sample, 0) + (py * poison + px * poison).unsqueeze(1)


def deform_sepconv_grid_sample(input: Tensor, vertical: Optional[Tensor] = None,
                               horizontal: Optional[Tensor] = None, offset=None,
                               mask: Optional[Tensor] = None, *, kernel_size=None, padding=0, dilation=1,
                               padding_mode: str = "zeros") -> Tensor:
    """Baseline ``deform_sepconv`` built on :func:`torch.nn.functional.grid_sample`.

    All KH*KW taps' sample positions go into one (N, KH*KW*H_out, W_out, 2) grid, normalised for
    ``align_corners=True`` (pixel centres at integer coordinates), sampled in one call with
    grid_sample's own ``padding_mode`` ("zeros" or "border", whose clamping and zero gradient at the
    borders are exactly the op's; "edsc" samples in "border" mode and weighs in its factor), then
    weighted by V*Hz*M and summed over the taps. This materialises
    every tap's samples, (N, C, KH*KW, H_out, W_out), which is what the fused kernels avoid.

    Same arguments, errors and result as :func:`edsc_ext.deform_sepconv` (up to rounding in the
    coordinate normalisation); float16 needs a device whose grid_sample supports it.
    """
    args = normalize_args(input, vertical, horizontal, offset, mask, kernel_size=kernel_size,
                          padding=padding, dilation=dilation, padding_mode=padding_mode)
    if any(t is not None and t.dtype != input.dtype for t in args.per_pixel):
        # Mixed precision: the per-pixel tensors in the frame's dtype, as the kernels compute.
        args = args._replace(**{name: getattr(args, name).to(input.dtype)
                                for name in ("vertical", "horizontal", "offset", "mask", "offset_dx")
                                if getattr(args, name) is not None})
        vertical, horizontal, mask = args.vertical, args.horizontal, args.mask
    offset = args.offset
    n, c, height, width = input.shape
    kh, kw = args.kernel_h, args.kernel_w
    taps = kh * kw
    h_out, w_out = args.output_size
    # Positions in at least float32 (a bfloat16 arange is not exact past 256); the grid itself must
    # have the input's dtype.
    coord_dtype = torch.promote_types(input.dtype, torch.float32)
    rows, cols = _positions(args, coord_dtype)
    tap_i = torch.arange(kh, device=input.device).repeat_interleave(kw)  # i of tap t
    tap_j = torch.arange(kw, device=input.device).repeat(kh)  # j of tap t
    py = (rows + (tap_i * args.dilation_h).to(coord_dtype).view(taps, 1, 1)).expand(n, taps, h_out, w_out)
    px = (cols + (tap_j * args.dilation_w).to(coord_dtype).view(taps, 1, 1)).expand(n, taps, h_out, w_out)
    if offset is not None:
        py = py + (offset[:, 0::2] if args.offset_dx is None else offset)
        px = px + (offset[:, 1::2] if args.offset_dx is None else args.offset_dx)
    edsc_factor = None
    if padding_mode == "edsc":
        edsc_factor = _edsc_factor(py, height, args.pad_h) * _edsc_factor(px, width, args.pad_w)
        padding_mode = "border"

    # align_corners=True maps -1..1 onto 0..size-1, which cannot address a 1-pixel (or empty) side:
    # grow such a side to 2 pixels at its far end, with zeros ("zeros", or an empty image) or a copy
    # of the pixel ("border"); neither changes any sample or gradient.
    grow_h, grow_w = max(0, 2 - height), max(0, 2 - width)
    if grow_h or grow_w:
        replicate = padding_mode == "border" and height > 0 and width > 0
        input = F.pad(input, (0, grow_w, 0, grow_h), mode="replicate" if replicate else "constant")
    finite = None
    if offset is not None:
        finite = (torch.isfinite(py) & torch.isfinite(px)).all(dim=1, keepdim=True)  # (N, 1, H_out, W_out)
        if padding_mode == "zeros":
            # Huge coordinates: keep them small (and still outside) so nothing overflows in grid_sample.
            py, px = py.clamp(-2, height + 1), px.clamp(-2, width + 1)
    grid = torch.stack((px * (2 / (input.shape[3] - 1)) - 1, py * (2 / (input.shape[2] - 1)) - 1), dim=-1)
    grid = grid.to(input.dtype)
    samples = F.grid_sample(input, grid.reshape(n, taps * h_out, w_out, 2), mode="bilinear",
                            padding_mode=padding_mode, align_corners=True)
    samples = samples.view(n, c, taps, h_out, w_out)

    weight = None
    if vertical is not None:
        weight = vertical[:, tap_i]
    if horizontal is not None:
        weight = horizontal[:, tap_j] if weight is None else weight * horizontal[:, tap_j]
    if mask is not None:
        weight = mask if weight is None else weight * mask
    if edsc_factor is not None:
        weight = edsc_factor.to(input.dtype) if weight is None else weight * edsc_factor.to(weight.dtype)
    out = (samples if weight is None else samples * weight.unsqueeze(1)).sum(dim=2)
    if finite is not None:
        out = torch.where(finite, out, torch.full_like(out, float("nan")))
    return out
