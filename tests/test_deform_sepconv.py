"""The compiled op on the CPU against the float64 reference: values, gradients, layouts, dtypes,
edge cases and argument checking."""

from __future__ import annotations

import pytest
import torch

import edsc_ext
from edsc_ext import reference as R
from edsc_ext.ops import normalize_args

from conftest import (
    ALL_PRESENT,
    ARG_NAMES,
    PADDING_MODES,
    Case,
    assert_close,
    assert_grads_close,
    default_grad_output,
    make_inputs,
    plans_of,
    present_id,
)

F64, F32 = torch.float64, torch.float32
OP = edsc_ext.deform_sepconv
# The instruction set the CPU plans name (the policy's cpu_isa="auto": torch's capability).
ISA = "/avx2" if edsc_ext._plan(torch.zeros(1, 1, 1, 1), kernel_size=1).forward.endswith("/avx2") else "/baseline"
FORWARD = torch.ops.edsc_ext.deform_sepconv_forward
BACKWARD = torch.ops.edsc_ext.deform_sepconv_backward

CONFIGS = [
    # N, C, H_in, W_in, KH, KW, padding, dilation
    (2, 3, 7, 8, 3, 3, 1, 1),
    (1, 2, 6, 9, 2, 4, (1, 2), (2, 1)),  # rectangular, even, dilated
    (2, 1, 5, 5, 1, 5, (0, 2), 1),
    (1, 4, 9, 7, 4, 1, (2, 0), (1, 3)),
    (1, 3, 10, 11, 5, 5, 2, 2),
    (3, 17, 6, 5, 3, 2, 0, 1),  # more channels than a channel block
    (1, 2, 1, 6, 1, 3, 0, 1),  # 1-pixel-high image
]
CONFIG_IDS = ["3x3", "2x4-dil", "1x5", "4x1-dil", "5x5-dil2", "17ch", "1px-high"]


def reference(case: Case, padding_mode: str, **extra) -> torch.Tensor:
    """The float64 reference of a case (computed from the case's own, possibly rounded, values)."""
    return case.to(F64).call(R.deform_sepconv, padding_mode=padding_mode, **extra)


def forward_and_grads(fn, case: Case, padding_mode: str, grad_output=None, which=ARG_NAMES, **extra):
    """fn's output and the gradients of the present tensors named in ``which`` (None for the rest)."""
    leaves = case.leaves(which)
    if padding_mode is not None:
        extra["padding_mode"] = padding_mode
    out = leaves.call(fn, **extra)
    if grad_output is None:
        grad_output = default_grad_output(out.shape)
    out.backward(grad_output.to(out.dtype))
    return out.detach(), leaves.grads()


def assert_matches_reference(case: Case, padding_mode: str, grad_output=None, run=None):
    """The op's output and all gradients on `run` (default: `case`) equal the reference's on `case`."""
    out, grads = forward_and_grads(OP, run if run is not None else case, padding_mode, grad_output)
    expected, expected_grads = forward_and_grads(R.deform_sepconv, case, padding_mode, grad_output)
    assert_close(out, expected, what=padding_mode)
    assert_grads_close(grads, expected_grads)


# ---------------------------------------------------------------------------------------------
# Forward values


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_forward_matches_reference(gen, config, padding_mode, dtype):
    case = make_inputs(*config, dtype=dtype, generator=gen, offset_scale=3)
    out = case.call(OP, padding_mode=padding_mode)
    assert out.dtype == dtype and out.is_contiguous()
    assert_close(out, reference(case, padding_mode), dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_forward_half_precision(gen, padding_mode, dtype):
    case = make_inputs(2, 3, 8, 9, 3, 3, 1, 1, dtype=dtype, generator=gen)
    out = case.call(OP, padding_mode=padding_mode)
    assert out.dtype == dtype
    assert_close(out, reference(case, padding_mode), dtype)
    out, grads = forward_and_grads(OP, case, padding_mode)
    _, expected = forward_and_grads(R.deform_sepconv, case.to(F64), padding_mode)
    assert all(g.dtype == dtype for g in grads)
    assert_grads_close(grads, expected, dtype)


@pytest.mark.parametrize("present", ALL_PRESENT, ids=present_id)
def test_absent_tensors(gen, present):
    case = make_inputs(2, 2, 6, 7, 3, 2, 1, (1, 2), present=present, generator=gen)
    for mode in PADDING_MODES:
        assert_matches_reference(case, mode)
    if present[0] and present[1]:
        # The kernel size then follows from vertical and horizontal.
        no_ks = case.replace(kwargs={k: v for k, v in case.kwargs.items() if k != "kernel_size"})
        assert torch.equal(no_ks.call(OP), case.call(OP))


def _layout(t: torch.Tensor, kind: str) -> torch.Tensor:
    """The same values as t in a non-contiguous layout."""
    if kind == "transposed":
        return t.transpose(2, 3).contiguous().transpose(2, 3)
    if kind == "sliced":
        big = torch.zeros(t.shape[0] + 1, t.shape[1] * 2, t.shape[2] + 3, t.shape[3] * 2, dtype=t.dtype)
        view = big[1:, ::2, 2:-1, 1::2]
        view.copy_(t)
        return view
    if kind == "channels_last":
        return t.contiguous(memory_format=torch.channels_last)
    if kind == "batch_expanded":  # stride 0 in the batch dimension
        return t[:1].expand(t.shape)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["transposed", "sliced", "channels_last", "batch_expanded"])
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_non_contiguous_inputs(gen, kind, padding_mode):
    case = make_inputs(2, 3, 6, 7, 3, 3, 1, 1, generator=gen)
    odd = case.map(lambda t: _layout(t, kind))
    if kind == "batch_expanded":
        case = odd.map(lambda t: t.contiguous())  # the expected values: both batch items alike
    assert not any(t.is_contiguous() for t in odd.tensors)
    assert_matches_reference(case, padding_mode, run=odd)


def test_does_not_modify_inputs(gen):
    case = make_inputs(2, 3, 6, 7, 3, 3, 1, 1, generator=gen).leaves()
    before = case.map(lambda t: t.detach().clone())
    out = case.call(OP, padding_mode="border")
    out.backward(torch.ones_like(out))
    for name, a, b in zip(ARG_NAMES, case.tensors, before.tensors):
        assert torch.equal(a.detach(), b), name


# ---------------------------------------------------------------------------------------------
# Gradients


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_gradients_match_reference(gen, config, padding_mode):
    case = make_inputs(*config, generator=gen, offset_scale=3)
    grad_output = None
    assert_matches_reference(case, padding_mode, grad_output)


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_gradients_on_the_integer_grid(gen, padding_mode):
    """Conventions where S is not differentiable: at integer coordinates the offset gradient is the
    right-hand derivative; in border mode it is 0 on the borders themselves (py <= 0, py >= H-1)."""
    case = make_inputs(2, 3, 5, 6, 3, 3, 1, 1, generator=gen)
    integer = torch.randint(-3, 4, case.offset.shape, generator=gen).double()
    integer[0, :, 0] = 0.0  # untouched taps, some of them exactly on the image border
    integer[1, 0::2, 2] = -3.0  # py = 2 - 1 + i - 3: rows -2, -1 and exactly 0
    case = case.replace(offset=integer)
    assert_matches_reference(case, padding_mode)


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_gradients_float32(gen, padding_mode):
    case = make_inputs(2, 3, 8, 7, 3, 3, 1, 1, generator=gen, dtype=F32)
    _, grads = forward_and_grads(OP, case, padding_mode)
    _, expected = forward_and_grads(R.deform_sepconv, case.to(F64), padding_mode)
    assert_grads_close(grads, expected, F32)


@pytest.mark.parametrize("arg", ARG_NAMES)
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_gradcheck(gen, padding_mode, arg):
    """Finite differences (sample positions kept off the integer grid, where S has kinks)."""
    case = make_inputs(1, 2, 4, 5, 2, 3, 1, (1, 2), generator=gen, outside=0.15).leaves([arg])
    x = getattr(case, arg)

    def fn(t):
        return case.replace(**{arg: t}).call(OP, padding_mode=padding_mode)

    assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_gradcheck_all_arguments_fast_mode(gen, padding_mode):
    case = make_inputs(2, 3, 6, 7, 3, 3, 1, 1, generator=gen).leaves()

    def fn(*tensors):
        return OP(*tensors, **case.kwargs, padding_mode=padding_mode)

    assert torch.autograd.gradcheck(fn, case.tensors, eps=1e-6, atol=1e-8, rtol=1e-6, fast_mode=True)


@pytest.mark.parametrize("which", [("input",), ("vertical",), ("horizontal",), ("offset",), ("mask",),
                                   ("offset", "mask"), ("input", "horizontal"), ()])
def test_only_required_grads(gen, monkeypatch, which):
    """Only the gradients that autograd needs are asked of the backward op."""
    calls = []
    real = BACKWARD

    def spy(*args):
        calls.append(list(args[-1]))
        return real(*args)

    monkeypatch.setattr(torch.ops.edsc_ext, "deform_sepconv_backward", spy)
    case = make_inputs(1, 2, 5, 6, 3, 3, 1, 1, generator=gen)
    leaves = case.leaves(which)
    out = leaves.call(OP, padding_mode="border")
    if not which:
        assert not out.requires_grad and out.grad_fn is None
        return
    out.backward(torch.ones_like(out))
    assert calls == [[name in which for name in ARG_NAMES]]
    _, expected = forward_and_grads(R.deform_sepconv, case, "border", torch.ones_like(out), which=which)
    assert_grads_close(leaves.grads(), expected)


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_backward_op_output_mask(gen, padding_mode):
    case = make_inputs(1, 2, 5, 6, 2, 3, 1, 1, generator=gen)
    args = normalize_args(*case.tensors, **case.kwargs, padding_mode=padding_mode)
    grad_output = torch.randn((1, 2) + args.output_size, generator=gen, dtype=F64)
    full = BACKWARD(grad_output, *args.op_args(), [True] * 5)
    _, expected = forward_and_grads(R.deform_sepconv, case, padding_mode, grad_output)
    assert_grads_close(full, expected)
    for k in range(5):
        mask = [i == k for i in range(5)]
        grads = BACKWARD(grad_output, *args.op_args(), mask)
        # The sixth, offset_dx's gradient, is empty without split offsets.
        assert len(grads) == 6 and grads[5].numel() == 0
        for i, g in enumerate(grads[:5]):
            if i == k:
                assert torch.equal(g, full[i]), ARG_NAMES[i]
            else:
                assert g.numel() == 0, f"{ARG_NAMES[i]} was not asked for but has shape {tuple(g.shape)}"


def test_meta_tensors_give_shapes():
    meta = make_inputs(2, 3, 6, 7, 3, 2, 1, (1, 2)).to(device="meta")
    out = meta.call(OP, padding_mode="border")
    assert out.device.type == "meta" and out.shape == (2, 3, 6, 7 + 2 - 2)


@pytest.mark.parametrize("KW", [17, 128])
def test_wide_kernels(gen, KW):
    """Kernel widths past the small accumulator array, up to the supported maximum."""
    case = make_inputs(1, 2, 3, KW + 3, 2, KW, (1, 2), 1, generator=gen)
    for mode in PADDING_MODES:
        assert_matches_reference(case, mode)


def test_parallel_and_deterministic(gen):
    """An image large enough to split over threads: correct, bitwise repeatable, and the same
    with one thread as with several."""
    case = make_inputs(2, 6, 40, 44, 3, 3, 1, 1, generator=gen, dtype=F32)
    out, grads = forward_and_grads(OP, case, "zeros")
    expected, expected_grads = forward_and_grads(R.deform_sepconv, case.to(F64), "zeros")
    assert_close(out, expected, F32)
    assert_grads_close(grads, expected_grads, F32)
    again, grads_again = forward_and_grads(OP, case, "zeros")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single, grads_single = forward_and_grads(OP, case, "zeros")
    finally:
        torch.set_num_threads(threads)
    for a, b, c in zip((out,) + grads, (again,) + grads_again, (single,) + grads_single):
        assert torch.equal(a, b) and torch.equal(a, c)


def _random_call(seed: int):
    """A random geometry, set of optional tensors, padding mode and data, drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)

    def integer(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    kh, kw, dh, dw, ph, pw = integer(1, 4), integer(1, 4), integer(1, 3), integer(1, 3), integer(0, 3), integer(0, 3)
    h_in = integer(max(1, dh * (kh - 1) - 2 * ph), 8)
    w_in = integer(max(1, dw * (kw - 1) - 2 * pw), 8)
    present = tuple(bool(integer(0, 1)) for _ in range(4))
    mode = PADDING_MODES[integer(0, 1)]
    case = make_inputs(integer(1, 2), integer(1, 5), h_in, w_in, kh, kw, (ph, pw), (dh, dw), present=present,
                       offset_scale=integer(0, 4), generator=g)
    return case, mode


@pytest.mark.parametrize("seed", range(60))
def test_random_sweep(seed):
    """Random geometry, optional tensors and modes: forward and gradients in float64."""
    case, mode = _random_call(seed)
    assert_matches_reference(case, mode)


# ---------------------------------------------------------------------------------------------
# Edge cases


@pytest.mark.parametrize("shape, kernel, padding", [
    ((0, 3, 6, 7), (3, 3), 1),  # empty batch
    ((2, 0, 6, 7), (3, 3), 1),  # no channels
    ((2, 3, 2, 7), (3, 3), 0),  # H_out = 0
    ((2, 3, 6, 2), (2, 3), 0),  # W_out = 0
    ((1, 2, 0, 5), (3, 3), 2),  # an empty image with padding: a (2, 7) output of zeros
], ids=["N=0", "C=0", "H_out=0", "W_out=0", "H_in=0"])
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_empty(gen, shape, kernel, padding, padding_mode):
    case = make_inputs(*shape, *kernel, padding, 1, generator=gen)
    out, grads = forward_and_grads(OP, case, padding_mode)
    expected, expected_grads = forward_and_grads(R.deform_sepconv, case, padding_mode)
    assert out.shape == expected.shape
    n, c, h, w = shape
    if h == 0:
        assert out.shape == (1, 2, 2, 7)
        assert torch.equal(out, torch.zeros_like(out))
    else:
        assert out.numel() == 0
    for name, g, t in zip(ARG_NAMES, grads, case.tensors):
        assert g.shape == t.shape, name
        assert torch.all(g == 0), name


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_offset(gen, padding_mode, bad):
    case = make_inputs(2, 3, 6, 7, 3, 3, 1, 1, generator=gen)
    offset = case.offset.clone()
    offset[1, 9, 3, 2] = bad  # tap 4's dx at pixel (3, 2) of batch 1
    poisoned = case.replace(offset=offset)
    out = poisoned.call(OP, padding_mode=padding_mode)
    nan = torch.zeros(out.shape, dtype=torch.bool)
    nan[1, :, 3, 2] = True
    assert torch.equal(torch.isnan(out), nan)
    assert_close(out, reference(poisoned, padding_mode))
    # Gradients elsewhere are unaffected. (At the poisoned pixel itself they are not specified.)
    grad_output = torch.ones_like(out)
    grad_output[1, :, 3, 2] = 0
    _, grads = forward_and_grads(OP, poisoned, padding_mode, grad_output)
    _, expected = forward_and_grads(R.deform_sepconv, case, padding_mode, grad_output)
    assert_close(grads[0], expected[0], what="grad of input")
    for name, g, e in zip(ARG_NAMES[1:], grads[1:], expected[1:]):
        keep = torch.ones(g.shape, dtype=torch.bool)
        keep[1, :, 3, 2] = False
        assert_close(g[keep], e[keep], what=f"grad of {name}")


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_huge_offsets(gen, padding_mode):
    case = make_inputs(2, 2, 5, 6, 3, 3, 1, 1, generator=gen)
    offset = case.offset.clone()
    offset[0, :, 1:3] = 1e30
    offset[1, 1::2, :, :2] = -1e30
    offset[1, 0::4, 4] = -3e38
    big = case.replace(offset=offset)
    for dtype in (F32, F64):
        out = big.to(dtype).call(OP, padding_mode=padding_mode)
        assert torch.isfinite(out).all()
        assert_close(out, reference(big.to(dtype), padding_mode), dtype)
    out, grads = forward_and_grads(OP, big, padding_mode)
    _, expected = forward_and_grads(R.deform_sepconv, big, padding_mode)
    assert_grads_close(grads, expected)
    assert torch.all(grads[3][0, :, 1:3] == 0)  # no offset gradient where the sample is far away


def test_single_pixel_input(gen):
    case = make_inputs(2, 3, 1, 1, 3, 3, 1, 1, generator=gen)
    for mode in PADDING_MODES:
        assert_matches_reference(case, mode)


# ---------------------------------------------------------------------------------------------
# Real-world call styles and the module


def test_adacof_style(gen):
    """AdaCoF: per-pixel offsets and occlusion weights, no separable kernels, 5x5 with dilation 2."""
    case = make_inputs(2, 3, 12, 13, 5, 5, 4, 2, present=(False, False, True, True), generator=gen)
    case = case.replace(kwargs=dict(kernel_size=5, dilation=2, padding=4))
    out, grads = forward_and_grads(OP, case, "zeros")
    assert out.shape == (2, 3, 12, 13)
    expected, expected_grads = forward_and_grads(R.deform_sepconv, case, "zeros")
    assert_close(out, expected)
    assert_grads_close(grads, expected_grads)


def test_sepconv_style(gen):
    """SepConv: per-pixel vertical and horizontal 1-D kernels only."""
    case = make_inputs(2, 3, 11, 12, 5, 5, 2, 1, present=(True, True, False, False), generator=gen)
    case = case.replace(kwargs=dict(padding=2))
    out, grads = forward_and_grads(OP, case, "zeros")
    expected, expected_grads = forward_and_grads(R.deform_sepconv, case, "zeros")
    assert_close(out, expected)
    assert_grads_close(grads, expected_grads)


# Calls without offsets or dilation take the row-wise kernels (every tap reads one input pixel):
# output narrower and wider than the input, a kernel wider than the image, many channels, sepconv's
# 51 x 51 on a small frame.
GRID_TAP_CONFIGS = [
    # N, C, H_in, W_in, KH, KW, padding
    (2, 3, 7, 9, 3, 5, (1, 2)),
    (1, 5, 6, 8, 4, 6, (0, 4)),
    (1, 2, 5, 4, 3, 9, (1, 4)),
    (1, 3, 12, 14, 51, 51, 25),
]


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [F64, F32, torch.bfloat16], ids=["f64", "f32", "bf16"])
@pytest.mark.parametrize("config", GRID_TAP_CONFIGS, ids=["3x5", "4x6", "wider-than-image", "sepconv-51"])
def test_without_offset(gen, config, dtype, layout):
    """The row-wise forward and backward against the reference in both padding modes, with and
    without each of vertical, horizontal and mask, every gradient and (once) the per-pixel
    tensors' alone; the per-pixel bilinear code (kernel_policy(grid_taps=False)) agrees."""
    big = config[4] > 16  # the reference's 2601 taps: one combination of tensors there
    for present in [(True, True, False, False)] if big else [p for p in ALL_PRESENT if not p[2]]:
        case = make_inputs(*config, present=present, dtype=dtype, generator=gen)
        if layout == "channels_last":
            case = case.map(lambda t: t.contiguous(memory_format=torch.channels_last))
        runs = [(mode, ARG_NAMES) for mode in PADDING_MODES]
        if present == (True, True, False, False):
            runs.append(("border", ARG_NAMES[1:]))
        for padding_mode, which in runs:
            what = f"{present_id(present)}, {padding_mode}"
            out, grads = forward_and_grads(OP, case, padding_mode, which=which)
            assert out.is_contiguous(memory_format=torch.channels_last) == (layout == "channels_last")
            expected, expected_grads = forward_and_grads(R.deform_sepconv, case.to(F64), padding_mode, which=which)
            assert_close(out, expected, dtype, what=what)
            assert_grads_close(grads, expected_grads, dtype)
            assert plans_of(case, padding_mode, which) == ("grid_taps_rows" + ISA, "grid_taps_rows" + ISA), what
            if not big:
                with edsc_ext.kernel_policy(grid_taps=False):
                    bilinear_backward = "pixels_fused" if "input" in which else "pixels_params"
                    assert plans_of(case, padding_mode, which) == ("pixels" + ISA, bilinear_backward + ISA), what
                    bilinear, bilinear_grads = forward_and_grads(OP, case, padding_mode, which=which)
                assert_close(out, bilinear.to(F64), dtype, what=what)
                assert_grads_close(grads, [None if g is None else g.to(F64) for g in bilinear_grads], dtype)


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("shape", [(1, 3, 0, 5), (1, 2, 4, 0)], ids=["H_in=0", "W_in=0"])
def test_without_offset_empty_image(gen, shape, padding_mode):
    """A frame with no rows or columns but padding: a real output of zeros, which the grid-tap
    kernels leave to the bilinear code (border mode has no edge pixel to clamp to)."""
    n, c, h, w = shape
    case = make_inputs(n, c, h, w, 5, 5, 3, present=(True, True, False, False), generator=gen)
    out, grads = forward_and_grads(OP, case, padding_mode)
    assert out.shape == (n, c, h + 2, w + 2) and torch.equal(out, torch.zeros_like(out))
    expected, expected_grads = forward_and_grads(R.deform_sepconv, case, padding_mode)
    assert_grads_close(grads, expected_grads)


@pytest.mark.parametrize("K", [3, 5])
def test_edsc_style(gen, K):
    """EDSC: separable kernels, offsets and mask, same-size output, replicate padding."""
    case = make_inputs(1, 3, 10, 9, K, K, K // 2, 1, generator=gen)
    case = case.replace(kwargs=dict(padding=K // 2))
    out, grads = forward_and_grads(OP, case, "border")
    assert out.shape == case.input.shape
    expected, expected_grads = forward_and_grads(R.deform_sepconv, case, "border")
    assert_close(out, expected)
    assert_grads_close(grads, expected_grads)


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_module_matches_functional(gen, padding_mode):
    case = make_inputs(2, 3, 7, 8, 3, 2, (1, 2), (2, 1), generator=gen)
    module = edsc_ext.nn.DeformSepConv2d(kernel_size=(3, 2), padding=(1, 2), dilation=(2, 1),
                                         padding_mode=padding_mode)
    assert isinstance(module, torch.nn.Module)
    assert list(module.parameters()) == []
    out, grads = forward_and_grads(module, case.replace(kwargs={}), None)
    expected, expected_grads = forward_and_grads(OP, case, padding_mode)
    assert torch.equal(out, expected)
    for g, e in zip(grads, expected_grads):
        assert torch.equal(g, e)
    # Defaults: infer the kernel size, no padding, zeros.
    plain = edsc_ext.nn.DeformSepConv2d()
    sep = make_inputs(1, 2, 6, 6, 3, 3, present=(True, True, False, False), generator=gen)
    assert torch.equal(plain(*sep.tensors), OP(*sep.tensors))


# ---------------------------------------------------------------------------------------------
# Argument checking: each bad call raises a TypeError/ValueError that names the argument.


def _bad_calls():
    x = torch.randn(2, 3, 6, 6)
    v, h = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    off, m = torch.randn(2, 18, 4, 4), torch.rand(2, 9, 4, 4)
    return [
        ("input ndim", lambda: OP(x[0], v, h), ValueError, "input"),
        ("input not a tensor", lambda: OP(x.tolist(), v, h), TypeError, "input"),
        ("input None", lambda: OP(None, v, h), TypeError, "input"),
        ("vertical ndim", lambda: OP(x, v[0], h), ValueError, "vertical"),
        ("mask ndim", lambda: OP(x, v, h, off, m.flatten(2)), ValueError, "mask"),
        ("offset not a tensor", lambda: OP(x, v, h, 0.5), TypeError, "offset"),
        ("batch mismatch", lambda: OP(x, v, h, off[:1]), ValueError, "offset"),
        ("batch mismatch vertical", lambda: OP(x, v[:1], h), ValueError, "vertical"),
        ("KH vs kernel_size", lambda: OP(x, v, h, kernel_size=(2, 3)), ValueError, "vertical"),
        ("KW vs kernel_size", lambda: OP(x, v, h, kernel_size=(3, 5)), ValueError, "horizontal"),
        ("offset channels", lambda: OP(x, v, h, off[:, :16]), ValueError, "offset"),
        ("odd offset channels", lambda: OP(x, None, None, off[:, :17]), ValueError, "offset"),
        ("offset taps vs KH", lambda: OP(x, v, None, torch.randn(2, 10, 4, 4)), ValueError, "offset"),
        ("mask channels", lambda: OP(x, v, h, off, m[:, :8]), ValueError, "mask"),
        ("spatial size", lambda: OP(x, v, h[:, :, :3]), ValueError, "horizontal"),
        ("negative padding", lambda: OP(x, v, h, padding=-1), ValueError, "padding"),
        ("negative padding pair", lambda: OP(x, v, h, padding=(1, -1)), ValueError, "padding"),
        ("padding triple", lambda: OP(x, v, h, padding=(1, 1, 1)), TypeError, "padding"),
        ("padding float", lambda: OP(x, v, h, padding=1.0), TypeError, "padding"),
        ("dilation 0", lambda: OP(x, v, h, dilation=0), ValueError, "dilation"),
        ("kernel_size 0", lambda: OP(x, None, None, kernel_size=0), ValueError, "kernel_size"),
        ("kernel_size bool", lambda: OP(x, kernel_size=True), TypeError, "kernel_size"),
        ("padding_mode", lambda: OP(x, v, h, padding_mode="reflect"), ValueError, "padding_mode"),
        ("padding_mode None", lambda: OP(x, v, h, padding_mode=None), ValueError, "padding_mode"),
        ("integer input", lambda: OP(x.long(), v.long(), h.long()), TypeError, "input"),
        ("integer offset", lambda: OP(x, v, h, off.int()), TypeError, "offset"),
        ("bool mask", lambda: OP(x, v, h, off, m > 0.5), TypeError, "mask"),
        ("mixed dtypes", lambda: OP(x, v, h.double()), TypeError, "horizontal"),
        ("mixed dtypes half", lambda: OP(x, v, h, off, m.half()), TypeError, "mask"),
        ("devices", lambda: OP(x, v.to("meta"), h), ValueError, "vertical"),
        ("devices input", lambda: OP(x.to("meta"), v, h, off), ValueError, "vertical"),
        ("ambiguous kernel", lambda: OP(x, None, None, off, m), ValueError, "kernel_size"),
        ("no kernel info", lambda: OP(x), ValueError, "kernel_size"),
        ("negative output", lambda: OP(x, kernel_size=9), ValueError, "output size"),
        ("too wide", lambda: OP(x, kernel_size=(1, 129), padding=(0, 64)), ValueError, "KW"),
    ]


@pytest.mark.parametrize("name, call, exc, match", _bad_calls(), ids=[c[0] for c in _bad_calls()])
def test_bad_arguments(name, call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(padding=-1), ValueError, "padding"),
    (dict(dilation=0), ValueError, "dilation"),
    (dict(padding_mode="circular"), ValueError, "padding_mode"),
    (dict(kernel_size=(3, 3, 3)), TypeError, "kernel_size"),
    (dict(kernel_size=0), ValueError, "kernel_size"),
])
def test_module_rejects_bad_geometry_at_construction(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        edsc_ext.nn.DeformSepConv2d(**kwargs)


def test_raw_ops_check_shapes(gen):
    """The compiled ops check what memory safety depends on even when called directly (TORCH_CHECK
    variants raise RuntimeError, ValueError or TypeError; any of them, never a crash)."""
    ERRORS = (RuntimeError, ValueError, TypeError)
    case = make_inputs(1, 2, 5, 6, 3, 3, 1, 1, generator=gen)
    args = list(normalize_args(*case.tensors, **case.kwargs).op_args())
    bad_offset = list(args)
    bad_offset[3] = case.offset[:, :16]
    with pytest.raises(ERRORS, match="offset"):
        FORWARD(*bad_offset)
    bad_kernel = list(args)
    bad_kernel[5] = 4  # kernel_h disagrees with vertical
    with pytest.raises(ERRORS):
        FORWARD(*bad_kernel)
    bad_mode = args[:-1] + [7]
    with pytest.raises(ERRORS, match="padding"):
        FORWARD(*bad_mode)
    with pytest.raises(ERRORS):
        FORWARD(*args[:8], -1, *args[9:])  # negative padding
    with pytest.raises(ERRORS):
        BACKWARD(torch.zeros(1, 2, 4, 4, dtype=F64), *args, [True] * 5)  # grad_output of the wrong size
    with pytest.raises(ERRORS):
        FORWARD(case.input.float(), *args[1:])  # mixed dtypes
