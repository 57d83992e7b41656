"""The pure-PyTorch reference (edsc_ext.reference) against the definition, hand-computed cases and
the grid_sample baseline. Everything else is tested against this reference, so it is pinned down
here independently of the compiled kernels."""

from __future__ import annotations

import math

import pytest
import torch

from edsc_ext import reference as R

from conftest import ALL_PRESENT, ARG_NAMES, PADDING_MODES, assert_close, make_inputs

F64 = torch.float64


def naive(input, vertical, horizontal, offset, mask, KH, KW, padding, dilation, padding_mode):
    """The formula, one output element at a time in Python floats."""
    N, C, H, W = input.shape
    ph, pw = padding
    dh, dw = dilation
    Ho, Wo = H + 2 * ph - dh * (KH - 1), W + 2 * pw - dw * (KW - 1)
    out = torch.zeros(N, C, Ho, Wo, dtype=F64)

    def pixel(n, c, yy, xx):
        if 0 <= yy < H and 0 <= xx < W:
            return input[n, c, yy, xx].item()
        return 0.0

    for n in range(N):
        for c in range(C):
            for y in range(Ho):
                for x in range(Wo):
                    total = 0.0
                    for i in range(KH):
                        for j in range(KW):
                            t = i * KW + j
                            py = y - ph + i * dh + (offset[n, 2 * t, y, x].item() if offset is not None else 0.0)
                            px = x - pw + j * dw + (offset[n, 2 * t + 1, y, x].item() if offset is not None else 0.0)
                            if padding_mode == "border":
                                py = min(max(py, 0.0), H - 1.0)
                                px = min(max(px, 0.0), W - 1.0)
                            y0, x0 = math.floor(py), math.floor(px)
                            ly, lx = py - y0, px - x0
                            s = ((1 - ly) * (1 - lx) * pixel(n, c, y0, x0) + (1 - ly) * lx * pixel(n, c, y0, x0 + 1)
                                 + ly * (1 - lx) * pixel(n, c, y0 + 1, x0) + ly * lx * pixel(n, c, y0 + 1, x0 + 1))
                            w = 1.0
                            if vertical is not None:
                                w *= vertical[n, i, y, x].item()
                            if horizontal is not None:
                                w *= horizontal[n, j, y, x].item()
                            if mask is not None:
                                w *= mask[n, t, y, x].item()
                            total += w * s
                    out[n, c, y, x] = total
    return out


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("KH, KW, padding, dilation", [(3, 2, (1, 0), (1, 2)), (2, 2, 1, 1), (1, 3, (0, 2), 1)])
def test_matches_naive_loop(gen, padding_mode, KH, KW, padding, dilation):
    case = make_inputs(1, 1, 4, 5, KH, KW, padding, dilation, generator=gen, offset_scale=3, outside=0.2)
    pad = (padding, padding) if isinstance(padding, int) else padding
    dil = (dilation, dilation) if isinstance(dilation, int) else dilation
    expected = naive(*case.tensors, KH, KW, pad, dil, padding_mode)
    actual = case.call(R.deform_sepconv, padding_mode=padding_mode)
    assert_close(actual, expected, what="reference vs naive loop")


@pytest.mark.parametrize("present", ALL_PRESENT[::3])
def test_matches_naive_loop_absent_tensors(gen, present):
    case = make_inputs(1, 2, 4, 5, 2, 3, 1, 1, present=present, generator=gen)
    for mode in PADDING_MODES:
        expected = naive(*case.tensors, 2, 3, (1, 1), (1, 1), mode)
        assert_close(case.call(R.deform_sepconv, padding_mode=mode), expected, what=f"{mode} {present}")


CONFIGS = [
    # N, C, H_in, W_in, KH, KW, padding, dilation
    (2, 3, 7, 8, 3, 3, 1, 1),
    (1, 2, 6, 9, 2, 4, (1, 2), (2, 1)),
    (2, 1, 5, 5, 1, 5, (0, 2), 1),
    (1, 2, 9, 7, 4, 1, (2, 0), (1, 3)),
    (1, 2, 1, 6, 1, 3, 0, 1),  # a 1-pixel-high image
    (1, 1, 6, 1, 3, 1, 1, 2),  # a 1-pixel-wide image
]


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("config", CONFIGS)
def test_matches_grid_sample_baseline(gen, config, padding_mode):
    case = make_inputs(*config, generator=gen, offset_scale=3).leaves()
    ours = case.call(R.deform_sepconv, padding_mode=padding_mode)
    base = case.call(R.deform_sepconv_grid_sample, padding_mode=padding_mode)
    assert_close(base, ours, what="grid_sample baseline")
    grad_out = torch.randn(ours.shape, generator=gen, dtype=F64)
    g_ours = torch.autograd.grad(ours, case.tensors, grad_out)
    g_base = torch.autograd.grad(base, case.tensors, grad_out)
    for name, a, b in zip(ARG_NAMES, g_base, g_ours):
        assert_close(a, b, what=f"grad of {name}")


@pytest.mark.parametrize("present", ALL_PRESENT)
def test_grid_sample_baseline_absent_tensors(gen, present):
    case = make_inputs(2, 2, 5, 6, 3, 2, 1, (1, 2), present=present, generator=gen)
    for mode in PADDING_MODES:
        assert_close(case.call(R.deform_sepconv_grid_sample, padding_mode=mode),
                     case.call(R.deform_sepconv, padding_mode=mode), what=f"{mode} {present}")


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_identity(gen, padding_mode):
    x = torch.randn(2, 3, 5, 7, generator=gen, dtype=F64)
    out = R.deform_sepconv(x, kernel_size=1, padding_mode=padding_mode)
    assert torch.equal(out, x)
    # A zero offset and unit weights are the same as none.
    ones, zeros = torch.ones(2, 1, 5, 7, dtype=F64), torch.zeros(2, 2, 5, 7, dtype=F64)
    assert torch.equal(R.deform_sepconv(x, ones, ones, zeros, ones, padding_mode=padding_mode), x)
    # The baseline agrees up to the rounding of its coordinate normalisation.
    assert_close(R.deform_sepconv_grid_sample(x, kernel_size=1, padding_mode=padding_mode), x)


def test_integer_shift_zeros(gen):
    x = torch.randn(1, 2, 6, 7, generator=gen, dtype=F64)
    offset = torch.empty(1, 2, 6, 7, dtype=F64)
    offset[:, 0], offset[:, 1] = 2.0, -1.0  # dy = 2, dx = -1
    out = R.deform_sepconv(x, offset=offset)
    expected = torch.zeros_like(x)
    expected[:, :, :4, 1:] = x[:, :, 2:, :6]  # out[y, x] = in[y + 2, x - 1], 0 outside
    assert torch.equal(out, expected)


def test_integer_shift_border(gen):
    x = torch.randn(1, 2, 6, 7, generator=gen, dtype=F64)
    offset = torch.empty(1, 2, 6, 7, dtype=F64)
    offset[:, 0], offset[:, 1] = 2.0, -1.0
    out = R.deform_sepconv(x, offset=offset, padding_mode="border")
    ys = (torch.arange(6) + 2).clamp(0, 5)
    xs = (torch.arange(7) - 1).clamp(0, 6)
    assert torch.equal(out, x[:, :, ys][:, :, :, xs])


def test_padding_replicates_in_border_mode(gen):
    # A 3x3 box filter of ones with padding 1: border mode is replicate padding, zeros mode is zero padding.
    x = torch.randn(1, 1, 4, 5, generator=gen, dtype=F64)
    box = torch.ones(1, 1, 3, 3, dtype=F64)
    border = R.deform_sepconv(x, kernel_size=3, padding=1, padding_mode="border")
    replicate = torch.nn.functional.conv2d(torch.nn.functional.pad(x, (1, 1, 1, 1), mode="replicate"), box)
    assert_close(border, replicate)
    zeros = R.deform_sepconv(x, kernel_size=3, padding=1)
    assert_close(zeros, torch.nn.functional.conv2d(x, box, padding=1))


def test_separable_kernel_is_a_convolution(gen):
    # Constant per-pixel kernels and no offset: an ordinary (correlation-style) separable convolution.
    x = torch.randn(2, 3, 6, 8, generator=gen, dtype=F64)
    kv = torch.randn(3, generator=gen, dtype=F64)
    kh = torch.randn(5, generator=gen, dtype=F64)
    v = kv.view(1, 3, 1, 1).expand(2, 3, 6, 8)
    h = kh.view(1, 5, 1, 1).expand(2, 5, 6, 8)
    out = R.deform_sepconv(x, v, h, padding=(1, 2))
    weight = torch.outer(kv, kh).expand(3, 1, 3, 5)
    assert_close(out, torch.nn.functional.conv2d(x, weight, padding=(1, 2), groups=3))


def test_half_pixel_is_the_mean():
    x = torch.tensor([[[[1.0, 2.0], [3.0, 10.0]]]], dtype=F64)
    offset = torch.full((1, 2, 2, 2), 0.5, dtype=F64)
    out = R.deform_sepconv(x, offset=offset)
    # (0.5, 0.5) averages all four; (0.5, 1.5) half of the right column (the rest is outside).
    expected = torch.tensor([[[[4.0, 3.0], [3.25, 2.5]]]], dtype=F64)
    assert torch.equal(out, expected)
    out = R.deform_sepconv(x, offset=offset, padding_mode="border")
    # Border: (0.5, 1.5) is clamped to (0.5, 1); (1.5, 1.5) to (1, 1).
    expected = torch.tensor([[[[4.0, 6.0], [6.5, 10.0]]]], dtype=F64)
    assert torch.equal(out, expected)


def test_offset_gradient_is_right_hand_derivative():
    x = torch.arange(20, dtype=F64).view(1, 1, 4, 5) ** 2
    offset = torch.zeros(1, 2, 4, 5, dtype=F64, requires_grad=True)  # exactly on the grid
    R.deform_sepconv(x, offset=offset).sum().backward()
    xp = torch.nn.functional.pad(x, (0, 1, 0, 1))
    # d/dy at an integer y is P(y + 1) - P(y), including the last row where P(y + 1) = 0 (zeros mode).
    assert torch.equal(offset.grad[:, 0], (xp[:, 0, 1:, :5] - xp[:, 0, :4, :5]))
    assert torch.equal(offset.grad[:, 1], (xp[:, 0, :4, 1:] - xp[:, 0, :4, :5]))


def test_border_clamped_offset_has_zero_gradient(gen):
    x = torch.randn(1, 2, 4, 5, generator=gen, dtype=F64)
    offset = torch.tensor([-3.5, 0.25], dtype=F64).view(1, 2, 1, 1).repeat(1, 1, 4, 5).requires_grad_()
    out = R.deform_sepconv(x, offset=offset, padding_mode="border")
    # py is clamped to 0 everywhere (also where y - 3.5 is between -3.5 and -0.5).
    assert_close(out, R.deform_sepconv(x[:, :, :1].expand(1, 2, 4, 5), offset=offset.detach() * torch.tensor(
        [0.0, 1.0], dtype=F64).view(1, 2, 1, 1), padding_mode="border"))
    out.sum().backward()
    assert torch.all(offset.grad[:, 0] == 0)
    assert torch.all(offset.grad[:, 1, :, :4] != 0)
    assert torch.all(offset.grad[:, 1, :, 4] == 0)  # px = 4.25 is clamped to W - 1 = 4 in the last column
    # The exact borders count as clamped too (grid_sample's convention).
    on_border = torch.zeros(1, 2, 4, 5, dtype=F64)
    on_border[:, 0] = -torch.arange(4, dtype=F64).view(4, 1)  # py = 0 exactly
    on_border[:, 1] = (4 - torch.arange(5, dtype=F64)).view(1, 5)  # px = 4 = W - 1 exactly
    on_border.requires_grad_()
    R.deform_sepconv(x, offset=on_border, padding_mode="border").sum().backward()
    assert torch.all(on_border.grad == 0)


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_offset_poisons_only_its_pixel(gen, padding_mode, bad):
    case = make_inputs(2, 3, 5, 6, 3, 3, 1, 1, generator=gen)
    offset = case.offset.clone()
    offset[1, 7, 2, 4] = bad  # tap 3's dx at pixel (2, 4) of batch 1
    out = case.replace(offset=offset).call(R.deform_sepconv, padding_mode=padding_mode)
    expected_nan = torch.zeros(out.shape, dtype=torch.bool)
    expected_nan[1, :, 2, 4] = True
    assert torch.equal(torch.isnan(out), expected_nan)
    clean = case.call(R.deform_sepconv, padding_mode=padding_mode)
    assert torch.equal(out[~expected_nan], clean[~expected_nan])
    base = case.replace(offset=offset).call(R.deform_sepconv_grid_sample, padding_mode=padding_mode)
    assert torch.equal(torch.isnan(base), expected_nan)


def test_huge_offset(gen):
    x = torch.randn(1, 2, 4, 5, generator=gen, dtype=F64)
    for dy, dx in [(1e30, 0.0), (-1e30, 0.25), (0.5, 1e30), (-1e30, -1e30)]:
        offset = torch.tensor([dy, dx], dtype=F64).view(1, 2, 1, 1).repeat(1, 1, 4, 5)
        assert torch.equal(R.deform_sepconv(x, offset=offset), torch.zeros_like(x))
        assert torch.equal(R.deform_sepconv_grid_sample(x, offset=offset), torch.zeros_like(x))
    # Border: clamped onto the last row / first column.
    offset = torch.tensor([1e30, -1e30], dtype=F64).view(1, 2, 1, 1).repeat(1, 1, 4, 5)
    out = R.deform_sepconv(x, offset=offset, padding_mode="border")
    assert torch.equal(out, x[:, :, 3:, :1].expand(1, 2, 4, 5))
    # float32 too: no overflow in the index computation.
    out32 = R.deform_sepconv(x.float(), offset=offset.float() * -1, padding_mode="border")
    assert torch.equal(out32, x.float()[:, :, :1, 4:].expand(1, 2, 4, 5))
    offset = offset.clone().requires_grad_()
    R.deform_sepconv(x, offset=offset, padding_mode="border").sum().backward()
    assert torch.all(offset.grad == 0)


@pytest.mark.parametrize("fn", [R.deform_sepconv, R.deform_sepconv_grid_sample])
def test_empty_shapes(fn):
    for shape, ks in [((0, 3, 5, 5), 3), ((2, 0, 5, 5), 3), ((1, 2, 2, 2), 3)]:
        x = torch.randn(shape, dtype=F64, requires_grad=True)
        out = fn(x, kernel_size=ks)
        n, c, h, w = shape
        assert out.shape == (n, c, h - ks + 1, w - ks + 1)
        out.sum().backward()
        assert torch.equal(x.grad, torch.zeros(shape, dtype=F64))


def test_float32_close_to_float64(gen):
    case = make_inputs(2, 3, 8, 9, 3, 3, 1, 1, generator=gen)
    for mode in PADDING_MODES:
        expected = case.call(R.deform_sepconv, padding_mode=mode)
        assert_close(case.to(torch.float32).call(R.deform_sepconv, padding_mode=mode), expected, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_half_precision_keeps_coordinates_exact(gen, dtype):
    # Rows past 256 (bfloat16) or 2048 (float16) are not representable in the dtype itself: the
    # reference computes positions in float32 like the kernels and returns the input's dtype.
    case = make_inputs(1, 2, 2100, 3, 3, 1, (1, 0), 1, generator=gen, present=(True, False, True, False))
    low = case.to(dtype)
    out = low.call(R.deform_sepconv)
    assert out.dtype == dtype
    assert_close(out, low.to(F64).call(R.deform_sepconv), dtype)


@pytest.mark.parametrize("fn", [R.deform_sepconv, R.deform_sepconv_grid_sample])
def test_validates_like_the_op(fn):
    x = torch.randn(1, 2, 5, 5)
    with pytest.raises(ValueError, match="offset"):
        fn(x, offset=torch.zeros(1, 3, 5, 5))
    with pytest.raises(ValueError, match="kernel_size"):
        fn(x, offset=torch.zeros(1, 8, 5, 5), mask=torch.ones(1, 4, 5, 5))
    with pytest.raises(TypeError, match="mask"):
        fn(x, kernel_size=1, mask=torch.ones(1, 1, 5, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="padding_mode"):
        fn(x, kernel_size=1, padding_mode="reflect")
