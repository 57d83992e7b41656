"""edsc_ext.models.compat (the EDSC repository's FunctionDSepconv) against a float64 transcription of the
original layer written from its specification, values and all six gradients, on the CPU and (cases
marked ``cuda``, skipped without a GPU) on CUDA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edsc_ext.models import compat

from conftest import assert_close, off_grid_offset, per_device

F64 = torch.float64
NAMES = ("input", "vertical", "horizontal", "offset_x", "offset_y", "mask")


def original_dsepconv(input, vertical, horizontal, offset_x, offset_y, mask):
    """The original layer, transcribed from its facts in plain PyTorch (differentiable by autograd).

    Tap (i, j) of output (y, x) samples the padded frame at (y + i + s + offset_x, x + j + s +
    offset_y), s = 1 - (K-1)//2. Per axis the coordinate p is clamped to q in [0, size-1]; the lower
    corner floor(p) and the upper one floor(p) + 1 are each clamped into [0, size-1]; the weights
    are (1 + lo - q) and (1 - (hi - q)) with the clamped corners and coordinate.
    """
    n, c, h_in, w_in = input.shape
    k = vertical.shape[1]
    h, w = vertical.shape[2:]
    s = 1 - (k - 1) // 2
    rows = torch.arange(h, dtype=input.dtype).view(1, h, 1)
    cols = torch.arange(w, dtype=input.dtype).view(1, 1, w)
    flat = input.reshape(n, c, h_in * w_in)

    def axis(p, size):
        q = p.clamp(0, size - 1)
        lo = torch.floor(p.detach())
        hi = lo + 1
        lo, hi = lo.clamp(0, size - 1), hi.clamp(0, size - 1)
        return lo.long(), hi.long(), 1 + (lo - q), 1 - (hi - q)

    def gather(yy, xx):
        index = (yy * w_in + xx).reshape(n, 1, h * w).expand(n, c, h * w)
        return flat.gather(2, index).view(n, c, h, w)

    out = 0
    for i in range(k):
        for j in range(k):
            t = i * k + j
            py = rows + (i + s) + offset_x[:, t]
            px = cols + (j + s) + offset_y[:, t]
            top, bottom, w_top, w_bottom = axis(py, h_in)
            left, right, w_left, w_right = axis(px, w_in)
            value = (gather(top, left) * (w_top * w_left).unsqueeze(1)
                     + gather(top, right) * (w_top * w_right).unsqueeze(1)
                     + gather(bottom, left) * (w_bottom * w_left).unsqueeze(1)
                     + gather(bottom, right) * (w_bottom * w_right).unsqueeze(1))
            out = out + value * (vertical[:, i] * horizontal[:, j] * mask[:, t]).unsqueeze(1)
    return out


def make_case(gen, n=2, c=3, h=7, w=9, k=5, offset_scale=2.0, outside=0.15):
    lo, hi = (k - 1) // 2, k // 2  # K//2 on each side for the odd K of EDSC
    frame = torch.rand(n, c, h, w, generator=gen, dtype=F64)
    padded = F.pad(frame, (lo, hi, lo, hi), mode="replicate")
    vertical = torch.randn(n, k, h, w, generator=gen, dtype=F64)
    horizontal = torch.randn(n, k, h, w, generator=gen, dtype=F64)
    # Off the integer grid (kinks of the bilinear interpolation, the original's jumps at 0 and
    # size-1), a fraction of them far outside the frame.
    offset_x = off_grid_offset((n, k * k, h, w), offset_scale, gen, outside, far=h + 4)
    offset_y = off_grid_offset((n, k * k, h, w), offset_scale, gen, outside, far=w + 4)
    mask = torch.rand(n, k * k, h, w, generator=gen, dtype=F64)
    return [padded, vertical, horizontal, offset_x, offset_y, mask]


def grads_of(fn, tensors, grad_out):
    leaves = [t.detach().clone().requires_grad_(True) for t in tensors]
    out = fn(*leaves)
    out.backward(grad_out)
    return out.detach(), [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("device, k, h, w, dtype", per_device(
    cpu={f"k{k}-f64": (k, 7, 9, F64) for k in (5, 3, 4)},
    cuda={"k5-f32": (5, 13, 11, torch.float32), "k5-f64": (5, 13, 11, F64)}))
def test_matches_transcription(gen, device, k, h, w, dtype):
    """The values (against the transcription of the rounded inputs) and, in float64, all six gradients."""
    tensors = make_case(gen, h=h, w=w, k=k)
    grad_out = torch.randn(2, 3, h, w, generator=gen, dtype=F64)
    ref, ref_grads = grads_of(original_dsepconv, tensors, grad_out)
    out, grads = grads_of(compat.FunctionDSepconv, [t.to(device, dtype) for t in tensors], grad_out.to(device, dtype))
    assert out.device.type == device and out.dtype == dtype
    assert_close(out, ref if dtype == F64 else original_dsepconv(*(t.to(dtype).double() for t in tensors)), dtype)
    if dtype == F64:
        for name, g, r in zip(NAMES, grads, ref_grads):
            assert_close(g, r, F64, factor=4, what=f"grad of {name}")
    # The doubling past the borders really is exercised by this case.
    s = compat.tap_shift(k)
    py = torch.arange(h, dtype=F64).view(1, 1, h, 1) + (torch.arange(k).repeat_interleave(k) + s).view(1, -1, 1, 1)
    assert ((py + tensors[3]) < 0).any() and ((py + tensors[3]) >= h + k - 2).any()


def test_float32_forward_to_float32_rounding(gen):
    tensors = make_case(gen, n=1, h=12, w=10)
    ref = original_dsepconv(*tensors)
    out = compat.FunctionDSepconv(*(t.float() for t in tensors))
    assert out.dtype == torch.float32
    assert_close(out, original_dsepconv(*(t.float().double() for t in tensors)), torch.float32)
    assert_close(out, ref, torch.float32, factor=10)


def test_integer_positions_and_exact_borders(gen):
    """Zero and integer offsets put samples exactly on pixels, on the borders 0 and size-1 and
    beyond (the original's doubling starts at p = -1 for y = 0 with no offset at all): exact."""
    padded, vertical, horizontal, _, _, mask = make_case(gen, n=1, h=6, w=8)
    for offset_x, offset_y in (
        (torch.zeros_like(mask), torch.zeros_like(mask)),
        (torch.randint(-9, 10, mask.shape, generator=gen).double(),
         torch.randint(-11, 12, mask.shape, generator=gen).double()),
    ):
        args = (padded, vertical, horizontal, offset_x, offset_y, mask)
        assert_close(compat.FunctionDSepconv(*args), original_dsepconv(*args), F64)
    # Coordinates landing exactly on size-1 (doubled) and exactly on 0 (not doubled).
    h_in, w_in = padded.shape[2:]
    s = compat.tap_shift(5)
    base_y = (torch.arange(6, dtype=F64).view(1, 1, 6, 1)
              + (torch.arange(5).repeat_interleave(5) + s).view(1, -1, 1, 1))
    base_x = (torch.arange(8, dtype=F64).view(1, 1, 1, 8) + (torch.arange(5).repeat(5) + s).view(1, -1, 1, 1))
    for target_y, target_x in ((h_in - 1, w_in - 1), (0, 0), (h_in - 1, 0)):
        args = (padded, vertical, horizontal, (target_y - base_y).expand_as(mask).contiguous(),
                (target_x - base_x).expand_as(mask).contiguous(), mask)
        assert_close(compat.FunctionDSepconv(*args), original_dsepconv(*args), F64)


def test_module_and_unpadded_form(gen):
    tensors = make_case(gen, n=1)
    out = compat.ModuleDSepconv()(*tensors)
    assert_close(out, original_dsepconv(*tensors), F64)
    # The unpadded frame with virtual padding K//2 is the same function, gradients included.
    frame = tensors[0][:, :, 2:-2, 2:-2].detach().clone().requires_grad_(True)
    padded = F.pad(frame, (2, 2, 2, 2), mode="replicate")
    grad_out = torch.randn_like(out)
    ref = original_dsepconv(padded, *tensors[1:])
    (g_ref,) = torch.autograd.grad(ref, frame, grad_out)
    direct = compat.compat_deform_sepconv(frame, *tensors[1:], padding=2)
    (g,) = torch.autograd.grad(direct, frame, grad_out)
    assert_close(direct, ref, F64)
    assert_close(g, g_ref, F64, factor=4, what="grad of the unpadded frame")


def test_errors(gen):
    padded, v, h, ox, oy, m = make_case(gen, n=1)
    with pytest.raises(ValueError, match="replicate-padded"):
        compat.FunctionDSepconv(padded[:, :, 1:], v, h, ox, oy, m)
    with pytest.raises(ValueError, match="same number of taps"):
        compat.FunctionDSepconv(padded, v, h[:, :3], ox, oy, m)
    with pytest.raises(ValueError, match="offset_y"):
        compat.FunctionDSepconv(padded, v, h, ox, oy[:, :24], m)


def test_torch_compile_traces(gen):
    tensors = [t.float() for t in make_case(gen, n=1)]
    compiled = torch.compile(compat.FunctionDSepconv, backend="eager", fullgraph=True)
    assert_close(compiled(*tensors), compat.FunctionDSepconv(*tensors), torch.float32)
