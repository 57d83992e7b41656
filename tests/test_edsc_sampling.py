"""padding_mode="edsc" (the EDSC layer's sampling, in the kernels) and split offsets (dy and dx as two
tensors, read where they are): against the float64 reference and the original layer's transcription,
on the CPU and, where present, on a GPU; and the EDSC drop-in makes no pass over the per-pixel
tensors of its own."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import edsc_ext
from edsc_ext import reference as R
from edsc_ext.models import compat
from edsc_ext.ops import H200, normalize_args

from conftest import (
    ALL_PRESENT,
    ARG_NAMES,
    DispatchedOps,
    assert_close,
    default_grad_output,
    make_inputs,
    present_id,
    requires_cuda,
    split,
)
from test_compat import make_case, original_dsepconv

F64, F32 = torch.float64, torch.float32
FORWARD = torch.ops.edsc_ext.deform_sepconv_forward
BACKWARD = torch.ops.edsc_ext.deform_sepconv_backward
HALF = (torch.float16, torch.bfloat16)


def outputs_and_grads(case, padding_mode, split_offsets: bool, device="cpu", dtype=F64, layout="contiguous"):
    """The op's output and the gradients of all five arguments (the offset's as interleaved (dy, dx))."""
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    leaves = [None if t is None else t.detach().to(device, dtype).contiguous(memory_format=fmt).requires_grad_()
              for t in case.tensors]
    input, vertical, horizontal, offset, mask = leaves
    offset_arg = offset
    if split_offsets and offset is not None:
        dy, dx = (t.detach().requires_grad_() for t in split(offset))
        offset_arg = (dy, dx)
    out = edsc_ext.deform_sepconv(input, vertical, horizontal, offset_arg, mask, **case.kwargs,
                                  padding_mode=padding_mode)
    out.backward(default_grad_output(out.shape).to(out))
    grads = [None if t is None else t.grad for t in leaves]
    if split_offsets and offset is not None:
        assert offset.grad is None
        assert dy.grad.dtype == dtype and dx.grad.dtype == dtype
        grads[3] = torch.stack((dy.grad, dx.grad), dim=2).flatten(1, 2)
    return out.detach(), grads


# ---------------------------------------------------------------------------------------------
# "edsc" mode: the reference is the original layer


@pytest.mark.parametrize("k", [5, 3, 4, 1])
def test_reference_edsc_mode_is_the_original_layer(gen, k):
    padded, vertical, horizontal, offset_x, offset_y, mask = make_case(gen, k=k)
    expected = original_dsepconv(padded, vertical, horizontal, offset_x, offset_y, mask)
    for fn in (R.deform_sepconv, R.deform_sepconv_grid_sample):
        out = fn(padded, vertical, horizontal, (offset_x, offset_y), mask, padding_mode="edsc")
        assert_close(out, expected, F64, what=fn.__name__)


def test_edsc_mode_with_virtual_padding_is_the_padded_frame(gen):
    """Replicate padding then the original's sampling == "edsc" with virtual padding, gradients included."""
    case = make_inputs(2, 3, 9, 8, 5, 5, 2, 1, generator=gen, offset_scale=3, outside=0.2)
    frame = case.input.detach().clone().requires_grad_()
    padded = F.pad(frame, (2, 2, 2, 2), mode="replicate")
    tensors = [t.detach().clone().requires_grad_() for t in case.tensors[1:]]
    dy, dx = split(tensors[2])
    via_pad = edsc_ext.deform_sepconv(padded, tensors[0], tensors[1], (dy, dx), tensors[3], padding_mode="edsc")
    virtual = edsc_ext.deform_sepconv(frame, tensors[0], tensors[1], (dy, dx), tensors[3], padding=2,
                                      padding_mode="edsc")
    assert_close(virtual, via_pad)
    grad = default_grad_output(virtual.shape)
    assert_close(torch.autograd.grad(virtual, frame, grad)[0], torch.autograd.grad(via_pad, frame, grad)[0],
                 what="grad of input")


def test_edsc_mode_gradcheck_split_offsets(gen):
    case = make_inputs(1, 2, 5, 6, 3, 3, 1, 1, generator=gen, offset_scale=2, outside=0.3)
    dy, dx = split(case.offset)
    tensors = [t.detach().clone().requires_grad_() for t in (case.input, case.vertical, case.horizontal, dy, dx,
                                                              case.mask)]

    def fn(input, vertical, horizontal, dy, dx, mask):
        return edsc_ext.deform_sepconv(input, vertical, horizontal, (dy, dx), mask, padding=1, padding_mode="edsc")

    assert torch.autograd.gradcheck(fn, tensors, eps=1e-6, atol=1e-7)


# The kernels' "edsc" mode against the reference: shapes of test_deform_sepconv.CONFIGS (odd and
# even kernels, rectangular, dilated, many channels, 1-pixel-high), every dtype and layout.
CONFIGS = [
    (2, 3, 7, 8, 3, 3, 1, 1),
    (1, 2, 6, 9, 2, 4, (1, 2), (2, 1)),
    (1, 3, 10, 11, 5, 5, 2, 2),
    (3, 17, 6, 5, 3, 2, 0, 1),
    (1, 2, 1, 6, 1, 3, 0, 1),
    (2, 3, 9, 9, 5, 5, 0, 1),
]


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [F64, F32, *HALF], ids=["f64", "f32", "f16", "bf16"])
def test_edsc_mode_matches_reference(gen, dtype, layout):
    for config in CONFIGS:
        case = make_inputs(*config, generator=gen, offset_scale=3, outside=0.2).to(dtype).to(F64)
        out, grads = outputs_and_grads(case, "edsc", False, dtype=dtype, layout=layout)
        expected, expected_grads = outputs_and_grads_reference(case)
        assert out.dtype == dtype
        assert_close(out, expected, dtype, what=f"output {config}")
        for name, g, r in zip(ARG_NAMES, grads, expected_grads):
            assert_close(g, r, dtype, factor=4, what=f"grad of {name} {config}")


@pytest.mark.parametrize("present", ALL_PRESENT, ids=present_id)
def test_edsc_mode_absent_tensors(gen, present):
    case = make_inputs(2, 2, 6, 7, 3, 2, 1, (1, 2), present=present, generator=gen)
    out, grads = outputs_and_grads(case, "edsc", False)
    expected, expected_grads = outputs_and_grads_reference(case)
    assert_close(out, expected)
    for name, g, r in zip(ARG_NAMES, grads, expected_grads):
        assert (g is None) == (r is None), name
        if r is not None:
            assert_close(g, r, factor=4, what=f"grad of {name}")


def outputs_and_grads_reference(case):
    leaves = case.leaves()
    out = leaves.call(R.deform_sepconv, padding_mode="edsc")
    out.backward(default_grad_output(out.shape))
    return out.detach(), list(leaves.grads())


# ---------------------------------------------------------------------------------------------
# Split offsets: the same call as the interleaved offset


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "edsc"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [F64, F32, *HALF], ids=["f64", "f32", "f16", "bf16"])
def test_split_offsets_equal_interleaved_cpu(gen, padding_mode, layout, dtype):
    for config in ((2, 3, 7, 8, 5, 5, 2, 1), (1, 17, 6, 5, 3, 2, (1, 0), (1, 2))):
        case = make_inputs(*config, generator=gen, offset_scale=3)
        out, grads = outputs_and_grads(case, padding_mode, True, dtype=dtype, layout=layout)
        ref_out, ref_grads = outputs_and_grads(case, padding_mode, False, dtype=dtype, layout=layout)
        # The same arithmetic on the same values, read from other addresses: bit for bit.
        assert torch.equal(out, ref_out)
        for name, g, r in zip(ARG_NAMES, grads, ref_grads):
            assert torch.equal(g, r), f"grad of {name}"
        if layout == "channels_last":
            assert out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("padding_mode", ["zeros", "edsc"])
def test_split_offsets_match_reference(gen, padding_mode):
    case = make_inputs(2, 3, 7, 6, 5, 5, 2, 1, generator=gen, offset_scale=3)
    out, grads = outputs_and_grads(case, padding_mode, True)
    leaves = case.leaves()
    expected = leaves.call(R.deform_sepconv, padding_mode=padding_mode)
    expected.backward(default_grad_output(expected.shape))
    assert_close(out, expected)
    for name, g, r in zip(ARG_NAMES, grads, leaves.grads()):
        assert_close(g, r, factor=4, what=f"grad of {name}")


def test_split_offsets_errors(gen):
    case = make_inputs(1, 2, 6, 6, 3, 3, 1, 1, generator=gen)
    dy, dx = split(case.offset)
    v, h = case.vertical, case.horizontal
    with pytest.raises(ValueError, match=r"offset\[1\] \(dx\) must have KH\*KW = 9 channels"):
        edsc_ext.deform_sepconv(case.input, v, h, (dy, dx[:, :4]), padding=1)
    with pytest.raises(ValueError, match=r"offset\[0\] \(dy\) must have spatial size"):
        edsc_ext.deform_sepconv(case.input, v, h, (dy[..., :3], dx), padding=1)
    with pytest.raises(TypeError, match=r"offset\[1\] \(dx\) has dtype torch.float32"):
        edsc_ext.deform_sepconv(case.input, v, h, (dy, dx.float()), padding=1)
    with pytest.raises(TypeError, match="pair"):
        edsc_ext.deform_sepconv(case.input, v, h, (dy, dx, dx), padding=1)
    # The kernel size follows from split offsets' one channel a tap.
    assert normalize_args(case.input, None, h, (dy, dx), padding=1).kernel_h == 3
    # The op itself, called directly, checks what memory safety needs (through the stable ABI every
    # C++ error is a RuntimeError).
    with pytest.raises(RuntimeError, match="offset_dx"):
        FORWARD(case.input, v, h, None, None, 3, 3, 1, 1, 1, 1, 0, offset_dx=dx)


def test_split_offsets_compile_fullgraph(gen):
    tensors = [t.float() for t in make_case(gen, n=1)]
    compiled = torch.compile(compat.FunctionDSepconv, backend="aot_eager", fullgraph=True)
    leaves = [t.clone().requires_grad_() for t in tensors]
    out = compiled(*leaves)
    out.sum().backward()
    eager = [t.clone().requires_grad_() for t in tensors]
    expected = compat.FunctionDSepconv(*eager)
    expected.sum().backward()
    assert_close(out, expected, F32)
    for a, b in zip(leaves, eager):
        assert_close(a.grad, b.grad, F32, factor=4)


# ---------------------------------------------------------------------------------------------
# The EDSC drop-in: no elementwise pass, no copy


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_compat_runs_the_op_alone_forward_and_backward(gen, layout):
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    tensors = [t.float().contiguous(memory_format=fmt).requires_grad_() for t in make_case(gen, n=2, c=3)]
    with DispatchedOps() as forward_ops:
        out = compat.FunctionDSepconv(*tensors)
    assert forward_ops.names == ["edsc_ext.deform_sepconv_forward.default"]
    grad = torch.randn(out.shape, generator=gen).to(out).contiguous(memory_format=fmt)
    with DispatchedOps() as backward_ops:
        grads = torch.autograd.grad(out, tensors, grad)
    assert backward_ops.names == ["edsc_ext.deform_sepconv_backward.default"]
    assert [g.shape for g in grads] == [t.shape for t in tensors]
    # The unpadded form inside models.EDSC(sampling="compat") too.
    frame = tensors[0][:, :, 2:-2, 2:-2].detach().contiguous(memory_format=fmt)
    with DispatchedOps() as ops:
        compat.compat_deform_sepconv(frame, *tensors[1:], padding=2)
    assert ops.names == ["edsc_ext.deform_sepconv_forward.default"]


def test_compat_half_precision_matches_transcription(gen):
    tensors = make_case(gen, n=1, h=9, w=10)
    for dtype in HALF:
        rounded = [t.to(dtype) for t in tensors]
        out = compat.FunctionDSepconv(*rounded)
        assert out.dtype == dtype
        assert_close(out, original_dsepconv(*(t.double() for t in rounded)), dtype)


# ---------------------------------------------------------------------------------------------
# Plans


def test_plans_of_split_offsets_and_edsc_mode(gen):
    cuda = H200
    for dtype, channels, layout, forward, backward in (
        # NCHW RGB float32 (the EDSC call): the same kernels as an interleaved offset.
        (F32, 3, "contiguous", "pixels_rgb", "tiled_rgb_lean_prefetch"),
        # 2-byte NCHW with 4 channels: not the staged forward, whose copies are of (dy, dx) pairs.
        (torch.float16, 4, "contiguous", "pixels_prefetch", "tiled_prefetch"),
        # channels_last: not the lane-pair forward nor the warp-staged backward.
        (F32, 3, "channels_last", "pixels_rgb", "tiled_blocks3"),
    ):
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        case = make_inputs(2, channels, 12, 16, 5, 5, 2, 1, generator=gen).map(
            lambda t, dtype=dtype, fmt=fmt: t.to(dtype).contiguous(memory_format=fmt).to("meta").requires_grad_())
        dy, dx = split(case.offset)
        plans = edsc_ext._plan(case.input, case.vertical, case.horizontal, (dy, dx), case.mask, **case.kwargs,
                               padding_mode="edsc", device=cuda)
        assert plans == (forward, backward), (dtype, channels, layout)
        interleaved = edsc_ext._plan(*case.tensors, **case.kwargs, padding_mode="edsc", device=cuda)
        assert interleaved.forward != forward or layout == "contiguous" and dtype == F32
    # Without offsets, edsc mode does not take the grid-tap kernels (their taps are not shifted).
    case = make_inputs(1, 3, 12, 16, 5, 5, 2, 1, present=(True, True, False, True), dtype=F32, generator=gen)
    assert edsc_ext._plan(*case.tensors, **case.kwargs, padding_mode="border", device=cuda).forward == "grid_taps_pass3"
    assert not edsc_ext._plan(*case.tensors, **case.kwargs, padding_mode="edsc", device=cuda).forward.startswith(
        "grid_taps")
    assert not edsc_ext._plan(*case.tensors, **case.kwargs, padding_mode="edsc").forward.startswith("grid_taps")


# ---------------------------------------------------------------------------------------------
# CUDA


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [F64, F32, *HALF], ids=["f64", "f32", "f16", "bf16"])
def test_cuda_split_offsets_edsc_mode(gen, layout, dtype):
    for config in ((2, 3, 13, 17, 5, 5, 2, 1), (1, 4, 9, 11, 5, 5, 2, 1), (1, 32, 8, 9, 3, 3, 1, 1)):
        case = make_inputs(*config, generator=gen, offset_scale=3, outside=0.2)
        rounded = case.to(dtype).to(F64)
        for padding_mode in ("edsc", "border"):
            out, grads = outputs_and_grads(rounded, padding_mode, True, device="cuda", dtype=dtype, layout=layout)
            ref, ref_grads = outputs_and_grads(rounded, padding_mode, False)
            assert_close(out, ref, dtype, what=f"{padding_mode} {config}")
            for name, g, r in zip(ARG_NAMES, grads, ref_grads):
                assert_close(g, r, dtype, factor=4, what=f"grad of {name} ({padding_mode} {config})")


@requires_cuda
@pytest.mark.cuda
def test_cuda_compat_deterministic_and_drop_in(gen):
    """The fixed-point input gradient's bound covers edsc mode's doubled samples (weights up to 4)."""
    tensors = [t.cuda() for t in make_case(gen, n=2, h=16, w=16, outside=0.5)]
    grad_out = torch.randn(2, 3, 16, 16, generator=gen, dtype=F64).cuda()
    leaves = [t.float().requires_grad_() for t in tensors]
    torch.use_deterministic_algorithms(True)
    try:
        assert edsc_ext._plan(*leaves[:3], (leaves[3], leaves[4]), leaves[5], padding_mode="edsc").backward.endswith(
            "fixed_point")
        out = compat.FunctionDSepconv(*leaves)
        (g1,) = torch.autograd.grad(out, leaves[0], grad_out.float())
        out = compat.FunctionDSepconv(*leaves)
        (g2,) = torch.autograd.grad(out, leaves[0], grad_out.float())
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(g1, g2)
    ref = [t.detach().double().cpu().requires_grad_() for t in leaves]
    (expected,) = torch.autograd.grad(original_dsepconv(*ref), ref[0], grad_out.cpu())
    assert_close(g1, expected, F32, factor=4, what="grad of input")
