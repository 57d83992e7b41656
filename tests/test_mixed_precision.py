"""Mixed precision: per-pixel tensors (vertical, horizontal, offset, mask) in float16 / bfloat16
with a float32 frame, read by the kernels as they are (no copies), computed in float32; the output
and the frame's gradient float32, each per-pixel gradient in its tensor's dtype. Against the
float64 reference of the rounded inputs, bitwise against the same call with float32 copies of
the per-pixel tensors (CPU), under autograd, torch.compile, autocast, CUDA graphs; the
plans that take such calls; the dtype errors."""

from __future__ import annotations

import pytest
import torch

import edsc_ext
from edsc_ext.ops import H200, autocast_dtypes, normalize_args

from conftest import (
    ALL_PRESENT,
    ARG_NAMES,
    BF16,
    DEVICES,
    F16,
    F32,
    F64,
    GRAD_FACTOR,
    LAYOUTS,
    DispatchedOps,
    assert_close,
    capture_and_replay,
    default_grad_output,
    make_inputs,
    memory_format,
    mixed,
    present_id,
    requires_cuda,
    split,
)

HALF = (F16, BF16)
HALF_IDS = ["f16", "bf16"]
FORWARD = torch.ops.edsc_ext.deform_sepconv_forward
BACKWARD = torch.ops.edsc_ext.deform_sepconv_backward


def run(case, padding_mode, split_offsets=False, grad_output=None, fn=edsc_ext.deform_sepconv):
    """fn's output and the gradients of every present tensor (the offset's interleaved (dy, dx))."""
    leaves = case.leaves()
    input, vertical, horizontal, offset, mask = leaves.tensors
    offset_arg = offset
    if split_offsets and offset is not None:
        dy, dx = (t.detach().requires_grad_() for t in split(offset))
        offset_arg = (dy, dx)
    out = fn(input, vertical, horizontal, offset_arg, mask, **case.kwargs, padding_mode=padding_mode)
    if grad_output is None:
        grad_output = default_grad_output(out.shape)
    out.backward(grad_output.to(device=out.device, dtype=out.dtype))
    grads = list(leaves.grads())
    if split_offsets and offset is not None:
        assert dy.grad.dtype == dy.dtype and dx.grad.dtype == dx.dtype
        grads[3] = torch.stack((dy.grad, dx.grad), dim=2).flatten(1, 2)
    return out.detach(), grads


def assert_mixed_result(case, out, grads, per_pixel_dtype, padding_mode, what=""):
    """Dtypes (output and input gradient float32, per-pixel gradients per_pixel_dtype), values
    against the float64 reference of the rounded inputs."""
    assert out.dtype == F32, what
    for name, g, t in zip(ARG_NAMES, grads, case.tensors):
        assert (g is None) == (t is None), f"grad of {name} {what}"
        if g is not None:
            assert g.dtype == (F32 if name == "input" else per_pixel_dtype), f"grad of {name}: {g.dtype} {what}"
    ref, ref_grads = run(case.to(F64, "cpu"), padding_mode, fn=edsc_ext.reference.deform_sepconv)
    assert_close(out, ref, F32, what=f"output {what}")
    for name, g, r in zip(ARG_NAMES, grads, ref_grads):
        if g is not None:
            # The frame's gradient is summed in float32; a per-pixel one is rounded to its dtype.
            assert_close(g, r, F32 if name == "input" else per_pixel_dtype, factor=GRAD_FACTOR,
                         what=f"grad of {name} {what}")


# ---------------------------------------------------------------------------------------------
# Values


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("per_pixel_dtype", HALF, ids=HALF_IDS)
def test_mixed_matches_reference(gen, device, layout, per_pixel_dtype):
    configs = [(2, 3, 11, 13, 5, 5, 2, 1), (1, 4, 9, 10, 3, 3, 1, 1), (1, 2, 7, 9, 3, 4, (1, 2), (1, 2))]
    if device == "cuda":
        configs.append((1, 32, 12, 14, 5, 5, 2, 1))  # more channels than the RGB kernels
    for config in configs:
        case = mixed(make_inputs(*config, generator=gen, offset_scale=3, outside=0.2), per_pixel_dtype, device,
                     layout)
        for padding_mode in ("zeros", "border", "edsc"):
            for split_offsets in (False, True):
                out, grads = run(case, padding_mode, split_offsets)
                assert_mixed_result(case, out, grads, per_pixel_dtype, padding_mode,
                                    what=f"{config} {padding_mode} split={split_offsets}")


@pytest.mark.parametrize("present", ALL_PRESENT, ids=[present_id(p) for p in ALL_PRESENT])
def test_mixed_absent_tensors(gen, present):
    """Every combination of absent tensors, the grid-tap kernels (no offsets) included."""
    for per_pixel_dtype in HALF:
        case = mixed(make_inputs(2, 3, 8, 9, 3, 3, 1, 1, present=present, generator=gen), per_pixel_dtype)
        for padding_mode in ("zeros", "border"):
            out, grads = run(case, padding_mode)
            assert_mixed_result(case, out, grads, per_pixel_dtype, padding_mode, what=f"{present} {padding_mode}")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("present", [(True, True, True, True), (True, True, False, False)], ids=["vhom", "vh--"])
def test_mixed_is_the_float32_computation_cpu(gen, layout, present):
    """On the CPU a half per-pixel tensor is converted to float32 where it is read, so the call
    equals, bit for bit, the all-float32 call on float32 copies of the same values: the output and
    the input gradient exactly, each per-pixel gradient as the float32 one rounded to its dtype.
    (Without offsets this is the grid-tap kernel, with them the per-pixel one.)"""
    for per_pixel_dtype in HALF:
        case = mixed(make_inputs(2, 3, 10, 12, 5, 5, 2, 1, present=present, generator=gen), per_pixel_dtype,
                     layout=layout)
        widened = case.map(lambda t: t.float())
        assert edsc_ext._plan(*case.leaves().tensors, **case.kwargs) == edsc_ext._plan(
            *widened.leaves().tensors, **widened.kwargs)
        for padding_mode in ("zeros", "border", "edsc"):
            out, grads = run(case, padding_mode)
            out32, grads32 = run(widened, padding_mode)
            assert torch.equal(out, out32), padding_mode
            assert torch.equal(grads[0], grads32[0]), padding_mode
            for name, g, g32 in zip(ARG_NAMES[1:], grads[1:], grads32[1:]):
                if g is not None:
                    assert torch.equal(g, g32.to(per_pixel_dtype)), f"grad of {name} ({padding_mode})"


def test_mixed_deterministic_cpu_and_thread_count(gen):
    case = mixed(make_inputs(1, 3, 16, 16, 5, 5, 2, 1, generator=gen), BF16)
    first = run(case, "border")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        again = run(case, "border")
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(first[0], again[0])
    for g, h in zip(first[1], again[1]):
        assert torch.equal(g, h)


# ---------------------------------------------------------------------------------------------
# The op's contract: autograd, torch.compile, autocast (opcheck: test_opcheck.py)


def test_mixed_compile_fullgraph(gen):
    case = mixed(make_inputs(2, 3, 9, 10, 5, 5, 2, 1, generator=gen), F16)

    def layer(input, vertical, horizontal, offset, mask, **kwargs):
        return edsc_ext.deform_sepconv(input, vertical, horizontal, offset, mask, **kwargs) * 2

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    out, grads = run(case, "border", fn=compiled)
    eager, eager_grads = run(case, "border", fn=layer)
    assert out.dtype == F32
    assert torch.equal(out, eager)
    for g, e in zip(grads, eager_grads):
        assert g.dtype == e.dtype and torch.equal(g, e)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_autocast_reads_half_per_pixel_tensors_as_they_are(gen, device, layout):
    """An autocast network's call (float32 frame, half heads) makes no copy: the only ops
    dispatched are the op's forward, then its backward."""
    for per_pixel_dtype in HALF:
        case = mixed(make_inputs(2, 3, 9, 10, 5, 5, 2, 1, generator=gen), per_pixel_dtype, device, layout)
        leaves = case.leaves()
        dy, dx = (t.detach().requires_grad_() for t in split(case.offset))
        with torch.autocast(device, dtype=per_pixel_dtype):
            with DispatchedOps() as forward_ops:
                out = edsc_ext.deform_sepconv(leaves.input, leaves.vertical, leaves.horizontal, (dy, dx), leaves.mask,
                                              **case.kwargs, padding_mode="edsc")
        assert forward_ops.names == ["edsc_ext.deform_sepconv_forward.default"]
        assert out.dtype == F32
        grad = default_grad_output(out.shape).to(out).contiguous(memory_format=memory_format(layout))
        inputs = (leaves.input, leaves.vertical, leaves.horizontal, dy, dx, leaves.mask)
        with DispatchedOps() as backward_ops:
            grads = torch.autograd.grad(out, inputs, grad)
        assert backward_ops.names == ["edsc_ext.deform_sepconv_backward.default"]
        assert [g.dtype for g in grads] == [F32] + [per_pixel_dtype] * 5


def test_autocast_policy_table():
    # (frame, per-pixel dtypes) -> (frame dtype, per-pixel dtype) of the call.
    cases = {
        (F32, (F16,)): (F32, F16),
        (F32, (BF16,)): (F32, BF16),
        (F32, (F16, BF16)): (F32, F32),
        (F32, (F16, F32)): (F32, F32),
        (F16, (F16,)): (F16, F16),
        (F16, (F32,)): (F32, F32),
        (BF16, (F16,)): (F32, F32),
        (F64, (F32,)): (F64, F64),
        (F64, (F16,)): (F64, F64),
        (F32, (F64,)): (F64, F64),
        (F32, ()): (F32, F32),
    }
    for (frame, per_pixel), expected in cases.items():
        assert autocast_dtypes(frame, set(per_pixel)) == expected, (frame, per_pixel)


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_casts_only_what_the_kernels_cannot_read(gen, device):
    """A float16 frame with float32 kernels runs in float32 (the frame is cast up; no tensor is
    cast down) and each gradient comes back in its argument's dtype."""
    case = make_inputs(1, 3, 7, 8, 3, 3, 1, 1, generator=gen).to(device=device)
    case = case.replace(input=case.input.half(), vertical=case.vertical.float(), horizontal=case.horizontal.float(),
                        offset=case.offset.float(), mask=case.mask.float())
    leaves = case.leaves()
    with torch.autocast(device, dtype=F16):
        with DispatchedOps() as ops:
            out = leaves.call(edsc_ext.deform_sepconv, padding_mode="border")
    assert out.dtype == F32
    copies = [name for name in ops.names if "deform_sepconv" not in name]
    assert len(copies) == 1 and "_to_copy" in copies[0], ops.names  # the frame alone
    out.backward(default_grad_output(out.shape).to(out))
    assert [t.grad.dtype for t in leaves.tensors] == [F16, F32, F32, F32, F32]


# ---------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_dtype_errors(gen, device):
    case = make_inputs(1, 2, 5, 5, 3, 3, 1, 1, generator=gen).to(device=device)
    f64_frame = mixed(case, F16, device, frame_dtype=F64)
    with pytest.raises(TypeError, match="vertical has dtype torch.float16 but input has dtype torch.float64"):
        f64_frame.call(edsc_ext.deform_sepconv)
    half_frame = mixed(case, F32, device, frame_dtype=F16)
    with pytest.raises(TypeError, match="float16 / bfloat16 with a float32 input"):
        half_frame.call(edsc_ext.deform_sepconv)
    bf16_frame = mixed(case, F16, device, frame_dtype=BF16)
    with pytest.raises(TypeError, match="vertical has dtype torch.float16 but input has dtype torch.bfloat16"):
        bf16_frame.call(edsc_ext.deform_sepconv)
    # The per-pixel tensors share one dtype.
    uneven = mixed(case, F16, device).replace(mask=case.mask.to(device, BF16))
    with pytest.raises(TypeError, match="mask has dtype torch.bfloat16 but vertical has dtype torch.float16"):
        uneven.call(edsc_ext.deform_sepconv)
    dy, dx = split(mixed(case, F16, device).offset)
    with pytest.raises(TypeError, match=r"offset\[1\] \(dx\) has dtype torch.float32"):
        edsc_ext.deform_sepconv(case.input.float(), None, None, (dy, dx.float()), kernel_size=3, padding=1)
    # The compiled op checks the same rule when called directly, naming the tensors (a RuntimeError: errors
    # cross the stable ABI as one type; the Python layer above raised the TypeErrors).
    args = normalize_args(*mixed(case, F16, device).tensors, **case.kwargs)
    with pytest.raises(RuntimeError, match="vertical has dtype Half but input has dtype Double"):
        FORWARD(**{**args.op_kwargs(), "input": args.input.double()})
    with pytest.raises(RuntimeError, match="mask has dtype BFloat16 but vertical has dtype Half"):
        FORWARD(**{**args.op_kwargs(), "mask": args.mask.bfloat16()})
    out = FORWARD(**args.op_kwargs())
    with pytest.raises(RuntimeError, match="grad_output has dtype Half but input has dtype Float"):
        BACKWARD(grad_output=out.half(), **args.op_kwargs(), output_mask=[True] * 5)


# ---------------------------------------------------------------------------------------------
# Plans


def test_plans_of_mixed_precision_calls(gen):
    """Mixed calls take the kernels that read per-pixel values through GlobalPixelValues: on CUDA
    not the grid-tap, staged or lane-pair forwards nor the warp-staged backward, whose copies are in
    the frame's dtype; on the CPU the same plans as float32."""
    for per_pixel_dtype in HALF:
        for channels, layout, present, expected32, expected in (
            # The exact-RGB forward prefetches 2-byte per-pixel values only.
            (3, "contiguous", (True,) * 4, ("pixels_rgb", "tiled_rgb_lean_prefetch"),
             ("pixels_rgb_prefetch", "tiled_rgb_lean_prefetch")),
            (4, "contiguous", (True,) * 4, ("pixels_prefetch", "tiled_prefetch"),
             ("pixels_prefetch", "tiled_prefetch")),
            (3, "channels_last", (True,) * 4, ("lane_pairs_rgb_staged", "tiled_warp_staged_rgb"),
             ("pixels_rgb", "tiled_blocks3")),
            (8, "channels_last", (True,) * 4, ("pixels_vectorized8", "lane_tile1"),
             ("pixels_vectorized8", "lane_tile1")),
            (3, "contiguous", (True, True, False, False), ("grid_taps_pass3", "grid_taps_params+gather_input_grad"),
             ("pixels_rgb_prefetch", "tiled_rgb_lean_prefetch")),
        ):
            base = make_inputs(2, channels, 12, 16, 5, 5, 2, 1, present=present, generator=gen)
            case = mixed(base, per_pixel_dtype, layout=layout).map(lambda t: t.to("meta"))
            all32 = mixed(base, F32, layout=layout).map(lambda t: t.to("meta"))
            assert edsc_ext._plan(*all32.leaves().tensors, **all32.kwargs, device=H200) == expected32
            assert edsc_ext._plan(*case.leaves().tensors, **case.kwargs, device=H200) == expected, (
                per_pixel_dtype, channels, layout, present)
            cpu = mixed(base, per_pixel_dtype, layout=layout)
            cpu32 = mixed(base, F32, layout=layout)
            assert edsc_ext._plan(*cpu.leaves().tensors, **cpu.kwargs) == edsc_ext._plan(
                *cpu32.leaves().tensors, **cpu32.kwargs)


# ---------------------------------------------------------------------------------------------
# CUDA


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("per_pixel_dtype", HALF, ids=HALF_IDS)
def test_cuda_mixed_plans_ran_and_deterministic(gen, per_pixel_dtype):
    """The plans above on the GPU itself, with their results; and the deterministic (fixed-point)
    input gradient, bitwise repeatable."""
    for channels, layout in ((3, "contiguous"), (4, "contiguous"), (3, "channels_last"), (8, "channels_last")):
        case = mixed(make_inputs(2, channels, 12, 16, 5, 5, 2, 1, generator=gen), per_pixel_dtype, "cuda", layout)
        plans = edsc_ext._plan(*case.leaves().tensors, **case.kwargs)
        assert plans == edsc_ext._plan(*case.leaves().tensors, **case.kwargs, device=H200)
        assert not plans.forward.startswith(("staged", "lane_pairs", "grid_taps")) and "warp_staged" not in plans[1]
        out, grads = run(case, "border")
        assert_mixed_result(case, out, grads, per_pixel_dtype, "border", what=f"{channels} {layout} {plans}")
    case = mixed(make_inputs(2, 3, 16, 16, 5, 5, 2, 1, generator=gen), per_pixel_dtype, "cuda")
    torch.use_deterministic_algorithms(True)
    try:
        assert edsc_ext._plan(*case.leaves().tensors, **case.kwargs).backward.endswith("fixed_point")
        first = run(case, "edsc")
        again = run(case, "edsc")
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(first[1][0], again[1][0])
    assert_mixed_result(case, *first, per_pixel_dtype, "edsc", what="deterministic")


@requires_cuda
@pytest.mark.cuda
def test_cuda_graph_of_mixed_call(gen):
    """Forward + backward of a mixed call captured once in a CUDA graph and replayed on new values."""
    cases = [mixed(make_inputs(2, 3, 10, 12, 5, 5, 2, 1, generator=gen), BF16, "cuda") for _ in range(3)]
    results = capture_and_replay(cases[0], cases[1:], "border")
    for new, (out, grads) in zip(cases[1:], results):
        assert_mixed_result(new, out, grads, BF16, "border", what="graph replay")
    assert not torch.equal(results[0][0], results[1][0])
