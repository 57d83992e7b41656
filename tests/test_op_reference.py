"""The compiled op against the float64 reference (edsc_ext.reference, itself pinned down by
test_reference.py): forward values and every gradient on each device and dtype, finite differences,
a random sweep of geometries, the call styles of the networks that use the op, and the module.

CUDA cases carry the ``cuda`` mark and skip cleanly without a GPU; their reference is computed on
the CPU from the case's own (possibly rounded) values."""

from __future__ import annotations

import pytest
import torch

import edsc_ext
from edsc_ext.ops import normalize_args

from conftest import (
    ARG_NAMES,
    BF16,
    F16,
    F32,
    F64,
    PADDING_MODES,
    assert_close,
    assert_grads_close,
    assert_matches_reference,
    cases,
    dtypes,
    forward_and_grads,
    make_inputs,
    named,
    per_device,
    reference,
    reference_and_grads,
    requires_cuda,
    synchronize,
)

OP = edsc_ext.deform_sepconv
BACKWARD = torch.ops.edsc_ext.deform_sepconv_backward
MODES = named(*PADDING_MODES)

CPU_CONFIGS = {
    # N, C, H_in, W_in, KH, KW, padding, dilation
    "3x3": (2, 3, 7, 8, 3, 3, 1, 1),
    "2x4-dil": (1, 2, 6, 9, 2, 4, (1, 2), (2, 1)),  # rectangular, even, dilated
    "1x5": (2, 1, 5, 5, 1, 5, (0, 2), 1),
    "4x1-dil": (1, 4, 9, 7, 4, 1, (2, 0), (1, 3)),
    "5x5-dil2": (1, 3, 10, 11, 5, 5, 2, 2),
    "17ch": (3, 17, 6, 5, 3, 2, 0, 1),  # more channels than a channel block
    "1px-high": (1, 2, 1, 6, 1, 3, 0, 1),  # 1-pixel-high image
}
CUDA_CONFIGS = {
    "3x3": (2, 3, 9, 10, 3, 3, 1, 1),
    "2x4-dil": (1, 5, 8, 11, 2, 4, (1, 2), (2, 1)),  # rectangular, dilated, C not a multiple of the channel block
    "5x5": (2, 8, 7, 6, 5, 5, 2, 1),
    "1x20": (1, 2, 6, 40, 1, 20, (0, 10), 1),  # KW > 16: the wide-kernel backward
    "1px-high": (3, 1, 1, 9, 1, 3, 0, 1),  # 1-pixel-high image
}


# ---------------------------------------------------------------------------------------------
# Forward values and gradients


@pytest.mark.parametrize("device, config, padding_mode, dtype", per_device(
    cpu=cases(CPU_CONFIGS, MODES, dtypes(F64)),
    cuda=cases(CUDA_CONFIGS, MODES, dtypes(F32, F64, F16, BF16))))
def test_matches_reference(gen, device, config, padding_mode, dtype):
    """The output and all five gradients, in every dtype the device computes in (the CPU's
    float32 and half types: test_forward_matches_reference, test_gradients_float32,
    test_forward_half_precision)."""
    case = make_inputs(*config, dtype=dtype, device=device, generator=gen, offset_scale=3)
    out, grads = forward_and_grads(OP, case, padding_mode)
    synchronize(device)
    assert out.device.type == device and out.dtype == dtype and out.is_contiguous()
    assert all(g.device == out.device and g.dtype == dtype for g in grads)
    expected, expected_grads = reference_and_grads(case, padding_mode)
    assert_close(out, expected, dtype)
    assert_grads_close(grads, expected_grads, dtype)


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("config", list(CPU_CONFIGS.values()), ids=list(CPU_CONFIGS))
def test_forward_matches_reference(gen, config, padding_mode, dtype):
    """The CPU forward alone in float32 and float64 (on CUDA test_matches_reference checks it in every dtype)."""
    case = make_inputs(*config, dtype=dtype, generator=gen, offset_scale=3)
    out = case.call(OP, padding_mode=padding_mode)
    assert out.dtype == dtype and out.is_contiguous()
    assert_close(out, reference(case, padding_mode), dtype)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_forward_half_precision(gen, padding_mode, dtype):
    """The CPU in float16 and bfloat16 (on CUDA: test_matches_reference)."""
    case = make_inputs(2, 3, 8, 9, 3, 3, 1, 1, dtype=dtype, generator=gen)
    out = case.call(OP, padding_mode=padding_mode)
    assert out.dtype == dtype
    assert_close(out, reference(case, padding_mode), dtype)
    out, grads = forward_and_grads(OP, case, padding_mode)
    _, expected = reference_and_grads(case, padding_mode)
    assert all(g.dtype == dtype for g in grads)
    assert_grads_close(grads, expected, dtype)


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_gradients_float32(gen, padding_mode):
    case = make_inputs(2, 3, 8, 7, 3, 3, 1, 1, generator=gen, dtype=F32)
    _, grads = forward_and_grads(OP, case, padding_mode)
    _, expected = reference_and_grads(case, padding_mode)
    assert_grads_close(grads, expected, F32)


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


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_larger_image(gen, padding_mode, dtype):
    """Many threads and blocks, and many atomic adds into the same input pixels."""
    case = make_inputs(2, 6, 64, 72, 4, 3, (2, 1), 1, dtype=dtype, device="cuda", generator=gen, offset_scale=1)
    out, grads = forward_and_grads(OP, case, padding_mode)
    expected, expected_grads = reference_and_grads(case, padding_mode)
    assert_close(out, expected, dtype)
    assert_grads_close(grads, expected_grads, dtype)


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_matches_cpu_op(gen, padding_mode):
    """The CUDA kernels give the CPU kernels' values (float64) on an image of many blocks."""
    case = make_inputs(2, 7, 33, 35, 3, 3, 1, 2, generator=gen)
    out, grads = forward_and_grads(OP, case.to(device="cuda"), padding_mode)
    cpu_out, cpu_grads = forward_and_grads(OP, case, padding_mode)
    assert_close(out, cpu_out)
    assert_grads_close(grads, cpu_grads)


# ---------------------------------------------------------------------------------------------
# Finite differences


@pytest.mark.parametrize("arg", ARG_NAMES)
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_gradcheck(gen, padding_mode, arg):
    """Finite differences of each argument alone (sample positions kept off the integer grid,
    where S has kinks)."""
    case = make_inputs(1, 2, 4, 5, 2, 3, 1, (1, 2), generator=gen, outside=0.15).leaves([arg])
    x = getattr(case, arg)

    def fn(t):
        return case.replace(**{arg: t}).call(OP, padding_mode=padding_mode)

    assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("device, config, outside, fast_mode, nondet_tol", per_device(
    cpu={"fast": ((2, 3, 6, 7, 3, 3, 1, 1), 0.1, True, 0.0)},
    # The CUDA input gradient is summed with atomics, so two backward passes may differ in the last bits.
    cuda={"full": ((1, 2, 4, 5, 2, 3, 1, (1, 2)), 0.15, False, 1e-12)}))
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_gradcheck_all_arguments(gen, device, config, outside, fast_mode, nondet_tol, padding_mode):
    case = make_inputs(*config, device=device, generator=gen, outside=outside).leaves()

    def fn(*tensors):
        return OP(*tensors, **case.kwargs, padding_mode=padding_mode)

    assert torch.autograd.gradcheck(fn, case.tensors, eps=1e-6, atol=1e-8, rtol=1e-6, fast_mode=fast_mode,
                                    nondet_tol=nondet_tol)


# ---------------------------------------------------------------------------------------------
# The gradients autograd asks for


@pytest.mark.parametrize("which", [("input",), ("vertical",), ("horizontal",), ("offset",), ("mask",),
                                   ("offset", "mask"), ("input", "horizontal"), ()])
def test_only_required_grads(gen, monkeypatch, which):
    """Only the gradients that autograd needs are asked of the backward op."""
    calls = []
    real = BACKWARD

    names = [argument.name for argument in BACKWARD.default._schema.arguments]

    def spy(*args, **kwargs):
        calls.append(list({**dict(zip(names, args)), **kwargs}["output_mask"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.ops.edsc_ext, "deform_sepconv_backward", spy)
    case = make_inputs(1, 2, 5, 6, 3, 3, 1, 1, generator=gen)
    leaves = case.leaves(which)
    out = leaves.call(OP, padding_mode="border")
    if not which:
        assert not out.requires_grad and out.grad_fn is None
        return
    out.backward(torch.ones_like(out))
    assert calls == [[name in which for name in ARG_NAMES]]
    _, expected = reference_and_grads(case, "border", torch.ones_like(out), which=which)
    assert_grads_close(leaves.grads(), expected)


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_backward_op_output_mask(gen, padding_mode):
    case = make_inputs(1, 2, 5, 6, 2, 3, 1, 1, generator=gen)
    args = normalize_args(*case.tensors, **case.kwargs, padding_mode=padding_mode)
    grad_output = torch.randn((1, 2) + args.output_size, generator=gen, dtype=F64)
    full = BACKWARD(grad_output=grad_output, **args.op_kwargs(), output_mask=[True] * 5)
    _, expected = reference_and_grads(case, padding_mode, grad_output)
    assert_grads_close(full, expected)
    for k in range(5):
        mask = [i == k for i in range(5)]
        grads = BACKWARD(grad_output=grad_output, **args.op_kwargs(), output_mask=mask)
        # The sixth, offset_dx's gradient, is empty without split offsets.
        assert len(grads) == 6 and grads[5].numel() == 0
        for i, g in enumerate(grads[:5]):
            if i == k:
                assert torch.equal(g, full[i]), ARG_NAMES[i]
            else:
                assert g.numel() == 0, f"{ARG_NAMES[i]} was not asked for but has shape {tuple(g.shape)}"


# ---------------------------------------------------------------------------------------------
# A random sweep


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
# Real-world call styles and the module


def test_adacof_style(gen):
    """AdaCoF: per-pixel offsets and occlusion weights, no separable kernels, 5x5 with dilation 2."""
    case = make_inputs(2, 3, 12, 13, 5, 5, 4, 2, present=(False, False, True, True), generator=gen)
    case = case.replace(kwargs=dict(kernel_size=5, dilation=2, padding=4))
    out, grads = forward_and_grads(OP, case, "zeros")
    assert out.shape == (2, 3, 12, 13)
    expected, expected_grads = reference_and_grads(case, "zeros")
    assert_close(out, expected)
    assert_grads_close(grads, expected_grads)


def test_sepconv_style(gen):
    """SepConv: per-pixel vertical and horizontal 1-D kernels only."""
    case = make_inputs(2, 3, 11, 12, 5, 5, 2, 1, present=(True, True, False, False), generator=gen)
    case = case.replace(kwargs=dict(padding=2))
    out, grads = forward_and_grads(OP, case, "zeros")
    expected, expected_grads = reference_and_grads(case, "zeros")
    assert_close(out, expected)
    assert_grads_close(grads, expected_grads)


@pytest.mark.parametrize("K", [3, 5])
def test_edsc_style(gen, K):
    """EDSC: separable kernels, offsets and mask, same-size output, replicate padding."""
    case = make_inputs(1, 3, 10, 9, K, K, K // 2, 1, generator=gen)
    case = case.replace(kwargs=dict(padding=K // 2))
    out, grads = forward_and_grads(OP, case, "border")
    assert out.shape == case.input.shape
    expected, expected_grads = reference_and_grads(case, "border")
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
