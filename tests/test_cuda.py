"""The CUDA kernels against the float64 reference (computed on the CPU): every dtype, forward and
all gradients, streams, devices, empty and non-finite inputs, and a tensor of more than 2**31
elements. Every test here is skipped when no GPU is present."""

from __future__ import annotations

import pytest
import torch

import edsc_ext
from edsc_ext import reference as R

from conftest import (
    ALL_PRESENT,
    ARG_NAMES,
    PADDING_MODES,
    assert_close,
    assert_grads_close,
    default_grad_output,
    make_inputs,
    plans_of,
    present_id,
    requires_cuda,
    requires_two_gpus,
)

pytestmark = [pytest.mark.cuda, requires_cuda]

F64, F32, F16, BF16 = torch.float64, torch.float32, torch.float16, torch.bfloat16
DTYPES = [F32, F64, F16, BF16]
DTYPE_IDS = ["f32", "f64", "f16", "bf16"]
OP = edsc_ext.deform_sepconv

CONFIGS = [
    # N, C, H_in, W_in, KH, KW, padding, dilation
    (2, 3, 9, 10, 3, 3, 1, 1),
    (1, 5, 8, 11, 2, 4, (1, 2), (2, 1)),  # rectangular, dilated, C not a multiple of the channel block
    (2, 8, 7, 6, 5, 5, 2, 1),
    (1, 2, 6, 40, 1, 20, (0, 10), 1),  # KW > 16: the wide-kernel backward
    (3, 1, 1, 9, 1, 3, 0, 1),  # 1-pixel-high image
]
CONFIG_IDS = ["3x3", "2x4-dil", "5x5", "1x20", "1px-high"]


def forward_and_grads(fn, case, padding_mode, grad_output=None, which=ARG_NAMES, **extra):
    leaves = case.leaves(which)
    out = leaves.call(fn, padding_mode=padding_mode, **extra)
    if grad_output is None:
        grad_output = default_grad_output(out.shape)
    out.backward(grad_output.to(device=out.device, dtype=out.dtype))
    return out.detach(), leaves.grads()


def reference_and_grads(case, padding_mode, grad_output=None, which=ARG_NAMES):
    """The float64 CPU reference of a case (from its own, possibly rounded, values)."""
    return forward_and_grads(R.deform_sepconv, case.to(F64, "cpu"), padding_mode, grad_output, which)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_matches_reference(gen, config, padding_mode, dtype):
    case = make_inputs(*config, dtype=dtype, device="cuda", generator=gen, offset_scale=3)
    out, grads = forward_and_grads(OP, case, padding_mode)
    torch.cuda.synchronize()
    assert out.device.type == "cuda" and out.dtype == dtype
    assert all(g.device == out.device and g.dtype == dtype for g in grads)
    expected, expected_grads = reference_and_grads(case, padding_mode)
    assert_close(out, expected, dtype)
    assert_grads_close(grads, expected_grads, dtype)


@pytest.mark.parametrize("dtype", [F32, F64, BF16], ids=["f32", "f64", "bf16"])
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[2], CONFIGS[3]], ids=["3x3", "5x5", "1x20"])
def test_global_atomic_input_grad(gen, policy, config, padding_mode, dtype):
    """The input gradient's global-atomic path (kernel_policy(input_grad_tile=False)), which the
    shared-memory tile otherwise hides, with offsets large enough that many samples also leave the
    tile there."""
    case = make_inputs(*config, dtype=dtype, device="cuda", generator=gen, offset_scale=6)
    assert plans_of(case, padding_mode).backward.startswith("tiled")
    policy(input_grad_tile=False)
    assert plans_of(case, padding_mode).backward == "pixels"
    out, grads = forward_and_grads(OP, case, padding_mode)
    expected, expected_grads = reference_and_grads(case, padding_mode)
    assert_close(out, expected, dtype)
    assert_grads_close(grads, expected_grads, dtype)


# Shapes for the 5x5 forward that stages the per-pixel tensors in shared memory in blocks of 128
# pixels: whole blocks (16-byte copies), a partial last block, an output plane of 143 pixels
# (4-byte copies in float32; the plain kernel for the half types, whose plane is then not
# 4-byte aligned), more channels than one channel block with dilation, and C = 1.
STAGED_CONFIGS = [
    (2, 3, 16, 16, 5, 5, 2, 1),
    (2, 4, 9, 20, 5, 5, 2, 1),
    (1, 3, 13, 11, 5, 5, 2, 1),
    (1, 32, 12, 12, 5, 5, (1, 3), (2, 1)),
    (3, 1, 6, 30, 5, 5, 2, 1),
]


@pytest.mark.parametrize("forward", ["staged", "plain"])
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("config", STAGED_CONFIGS, ids=["whole", "partial", "plane143", "c32-dil", "c1"])
def test_forward_paths(gen, policy, config, padding_mode, dtype, forward):
    """The default 5x5 forward and the plain one (kernel_policy(plain_forward=True)) against the
    reference, with every combination of absent per-pixel tensors at 3 channels (the exact-RGB
    kernel, in every dtype) and 1, 2 or 4 (the staged one in the half types)."""
    if forward == "plain":
        policy(plain_forward=True)
    channels = config[1]
    every = config is STAGED_CONFIGS[0] or config is STAGED_CONFIGS[1]
    for present in ALL_PRESENT if every else [(True, True, True, True)]:
        case = make_inputs(*config, present=present, dtype=dtype, device="cuda", generator=gen, offset_scale=3)
        if present[2] or config[7] != 1:  # else the grid-tap forward (when not plain)
            if forward == "staged" and dtype != F32 and channels in (1, 2, 4):
                planned = "staged"
            else:
                planned = "pixels" + ("_rgb" if channels == 3 else "") + ("_prefetch" if channels <= 4 else "")
            assert plans_of(case, padding_mode).forward == planned
        out, _ = forward_and_grads(OP, case, padding_mode)
        expected, _ = reference_and_grads(case, padding_mode)
        assert_close(out, expected, dtype)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("config", [STAGED_CONFIGS[i] for i in (0, 1, 2, 4)],
                         ids=["whole", "partial", "plane143", "c1"])
def test_prefetch_changes_nothing(gen, policy, config, dtype):
    """The NCHW 5x5 kernels first prefetch each warp's per-pixel values into L2
    (kernel_policy(prefetch=False) turns that off). A hint must not change a bit of the output or of
    the per-pixel tensors' gradients, also where a warp's pixels straddle two images (partial,
    plane143) or tensors are absent. The input gradient's cross-tile float atomics may round in
    another order."""
    policy(plain_forward=True)  # the staged half-type forward does not prefetch
    for present in [(True, True, True, True), (False, True, False, True)]:
        case = make_inputs(*config, present=present, dtype=dtype, device="cuda", generator=gen, offset_scale=3)
        results = {}
        for prefetch in (True, False):
            with edsc_ext.kernel_policy(prefetch=prefetch):
                plans = plans_of(case, "border")
                assert plans.forward.endswith("_prefetch") == prefetch, plans
                assert plans.backward.endswith("_prefetch") == prefetch, plans
                results[prefetch] = forward_and_grads(OP, case, "border")
        (out, grads), (out_off, grads_off) = results[True], results[False]
        assert torch.equal(out, out_off)
        assert_close(grads[0], grads_off[0], dtype, what="input gradient")
        for name, g, g_off in zip(ARG_NAMES[1:], grads[1:], grads_off[1:]):
            assert (g is None) == (g_off is None), name
            assert g is None or torch.equal(g, g_off), f"gradient of {name} differs with prefetch on"


# Calls without offsets and dilation (sepconv) take the grid-tap kernels: each 8 x 32 tile of
# output pixels stages the input window its taps read in shared memory (the forward 4, 3, 2 or 1
# channels a pass; the parameter gradients all channels at once, up to 4, else the bilinear
# backward) and holds 8 x 8 taps' weights at a time; without a mask the input gradient is
# gathered, each 8 x 32 tile of input pixels walking the rows of output pixels that reach it. The
# shapes give partial tiles, several passes,
# whole and partial tap chunks, output planes smaller and larger than the input, and sepconv's
# 51 x 51, whose 3-channel float32 window (57 KB, 109 KB with the backward's sums) needs more than
# the default 48 KB of shared memory.
GRID_TAP_CONFIGS = [
    # N, C, H_in, W_in, KH, KW, padding
    (2, 3, 21, 45, 5, 5, 2),
    (1, 5, 12, 70, 3, 9, (0, 4)),
    (2, 4, 9, 33, 8, 10, (3, 6)),
    (1, 6, 17, 40, 13, 11, (6, 5)),
    (1, 3, 20, 36, 51, 51, 25),
]


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("config", GRID_TAP_CONFIGS, ids=["rgb-5x5", "c5-3x9", "c4-8x10", "c6-13x11", "sepconv-51"])
def test_without_offset(gen, config, dtype, layout):
    """The grid-tap kernels against the reference, with and without each of vertical, horizontal
    and mask, forward and every gradient (the input's gathered where there is no mask and at most
    4 channels); once also the per-pixel tensors' gradients alone (a frame that needs none, as in
    sepconv training)."""
    big = config[4] > 16  # the reference's 2601 taps: one combination of tensors there
    for present in [(True, True, False, False)] if big else [p for p in ALL_PRESENT if not p[2]]:
        case = make_inputs(*config, present=present, dtype=dtype, device="cuda", generator=gen)
        if layout == "channels_last":
            case = case.map(lambda t: t.contiguous(memory_format=torch.channels_last))
        runs = [(mode, ARG_NAMES) for mode in PADDING_MODES]
        if present == (True, True, False, False):
            runs.append(("border", ARG_NAMES[1:]))
        for padding_mode, which in runs:
            plans = plans_of(case, padding_mode, which)
            small = config[1] <= 4  # the grid-tap gradients keep every channel in one window
            assert plans.forward == "grid_taps", plans
            assert ("grid_taps_params" in plans.backward) == (small and any(present)), plans
            assert ("gather_input_grad" in plans.backward) == (small and "input" in which and not present[3]), plans
            out, grads = forward_and_grads(OP, case, padding_mode, which=which)
            expected, expected_grads = reference_and_grads(case, padding_mode, which=which)
            assert out.is_contiguous(memory_format=torch.channels_last) == (layout == "channels_last")
            assert_close(out, expected, dtype, what=f"{present_id(present)}, {padding_mode}")
            assert_grads_close(grads, expected_grads, dtype)


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_matches_cpu_op(gen, padding_mode):
    case = make_inputs(2, 7, 33, 35, 3, 3, 1, 2, generator=gen)
    out, grads = forward_and_grads(OP, case.to(device="cuda"), padding_mode)
    cpu_out, cpu_grads = forward_and_grads(OP, case, padding_mode)
    assert_close(out, cpu_out)
    assert_grads_close(grads, cpu_grads)


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_larger_image(gen, dtype):
    """Many threads and blocks, and many atomic adds into the same input pixels."""
    case = make_inputs(2, 6, 64, 72, 4, 3, (2, 1), 1, dtype=dtype, device="cuda", generator=gen, offset_scale=1)
    for mode in PADDING_MODES:
        out, grads = forward_and_grads(OP, case, mode)
        expected, expected_grads = reference_and_grads(case, mode)
        assert_close(out, expected, dtype)
        assert_grads_close(grads, expected_grads, dtype)


@pytest.mark.parametrize("present", ALL_PRESENT, ids=present_id)
def test_absent_tensors(gen, present):
    case = make_inputs(2, 3, 7, 8, 3, 2, 1, (1, 2), present=present, device="cuda", generator=gen)
    for mode in PADDING_MODES:
        out, grads = forward_and_grads(OP, case, mode)
        expected, expected_grads = reference_and_grads(case, mode)
        assert_close(out, expected)
        assert_grads_close(grads, expected_grads)


@pytest.mark.parametrize("kind", ["channels_last", "transposed", "sliced"])
def test_non_contiguous(gen, kind):
    case = make_inputs(2, 3, 7, 8, 3, 3, 1, 1, device="cuda", generator=gen)
    if kind == "channels_last":
        odd = case.map(lambda t: t.contiguous(memory_format=torch.channels_last))
    elif kind == "transposed":
        odd = case.map(lambda t: t.transpose(2, 3).contiguous().transpose(2, 3))
    else:
        odd = case.map(lambda t: torch.cat([t, t], dim=3)[..., : t.shape[3]])
    assert not any(t.is_contiguous() for t in odd.tensors)
    out, grads = forward_and_grads(OP, odd, "border")
    expected, expected_grads = reference_and_grads(case, "border")
    assert_close(out, expected)
    assert_grads_close(grads, expected_grads)


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_side_stream(gen, padding_mode):
    """The kernels run on the current stream: inputs made on a side stream behind a long sleep
    are only ready there, so a kernel launched on another stream would read them too early."""
    case = make_inputs(2, 4, 24, 25, 3, 3, 1, 1, dtype=F32, device="cuda", generator=gen)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        on_side = case.map(lambda t: t * 2)  # written on the side stream, after the sleep
        out, grads = forward_and_grads(OP, on_side, padding_mode)
    side.synchronize()
    expected, expected_grads = reference_and_grads(case.map(lambda t: t * 2), padding_mode)
    assert_close(out, expected, F32)
    assert_grads_close(grads, expected_grads, F32)


@pytest.mark.multi_gpu
@requires_two_gpus
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_other_device(gen, padding_mode):
    """Tensors on cuda:1 while the current device is cuda:0."""
    case = make_inputs(2, 3, 9, 10, 3, 3, 1, 1, dtype=F32, device="cuda:1", generator=gen)
    with torch.cuda.device(0):
        out, grads = forward_and_grads(OP, case, padding_mode)
        assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(1)
    assert out.device == torch.device("cuda:1")
    assert all(g.device == torch.device("cuda:1") for g in grads)
    expected, expected_grads = reference_and_grads(case, padding_mode)
    assert_close(out, expected, F32)
    assert_grads_close(grads, expected_grads, F32)


@pytest.mark.multi_gpu
@requires_two_gpus
def test_mixed_devices_rejected(gen):
    case = make_inputs(1, 2, 5, 5, 3, 3, 1, 1, device="cuda:0", generator=gen)
    with pytest.raises(ValueError, match="mask"):
        OP(*case.tensors[:4], case.mask.to("cuda:1"), padding=1)


@pytest.mark.parametrize("shape, kernel, padding", [
    ((0, 3, 6, 7), (3, 3), 1),  # empty batch
    ((2, 0, 6, 7), (3, 3), 1),  # no channels
    ((2, 3, 2, 7), (3, 3), 0),  # H_out = 0
])
def test_empty(gen, shape, kernel, padding):
    case = make_inputs(*shape, *kernel, padding, 1, device="cuda", generator=gen)
    for mode in PADDING_MODES:
        out, grads = forward_and_grads(OP, case, mode)
        torch.cuda.synchronize()
        assert out.numel() == 0 and out.shape == reference_and_grads(case, mode)[0].shape
        for name, g, t in zip(ARG_NAMES, grads, case.tensors):
            assert g.shape == t.shape and g.device == t.device, name
            assert torch.all(g == 0), name


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("config", [(2, 5, 6, 7, 3, 3, 1, 1), (2, 3, 6, 7, 5, 5, 2, 1)], ids=["3x3-c5", "5x5-rgb"])
def test_non_finite_offset(gen, config, padding_mode, dtype):
    """A NaN or inf offset makes its pixel's output NaN and nothing else; 5x5 RGB takes the kernels
    with straight-line taps, which sample (0, 0) there and apply the NaN after the taps."""
    case = make_inputs(*config, dtype=dtype, device="cuda", generator=gen)
    offset = case.offset.clone()
    offset[1, 9, 3, 2] = float("nan")
    offset[0, 0, 5, 6] = float("inf")
    poisoned = case.replace(offset=offset)
    out = poisoned.call(OP, padding_mode=padding_mode)
    nan = torch.zeros(out.shape, dtype=torch.bool)
    nan[1, :, 3, 2] = True
    nan[0, :, 5, 6] = True
    assert torch.equal(torch.isnan(out).cpu(), nan)
    expected = poisoned.to(F64, "cpu").call(R.deform_sepconv, padding_mode=padding_mode)
    assert_close(out, expected, dtype)
    # The input gradient is unaffected when the poisoned pixels get no gradient.
    grad_output = (~nan).double()
    _, grads = forward_and_grads(OP, poisoned, padding_mode, grad_output, which=("input",))
    _, expected_grads = reference_and_grads(case, padding_mode, grad_output, which=("input",))
    assert_close(grads[0], expected_grads[0], dtype, factor=4)


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_huge_offsets(gen, padding_mode):
    case = make_inputs(2, 3, 6, 7, 3, 3, 1, 1, dtype=F32, device="cuda", generator=gen)
    offset = case.offset.clone()
    offset[0, :, 1:3] = 1e30
    offset[1, 1::2, :, :2] = -1e30
    offset[1, 0::4, 4] = -3e38
    big = case.replace(offset=offset)
    out, grads = forward_and_grads(OP, big, padding_mode)
    assert torch.isfinite(out).all()
    expected, expected_grads = reference_and_grads(big, padding_mode)
    assert_close(out, expected, F32)
    assert_grads_close(grads, expected_grads, F32)


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_gradcheck(gen, padding_mode):
    case = make_inputs(1, 2, 4, 5, 2, 3, 1, (1, 2), device="cuda", generator=gen, outside=0.15).leaves()

    def fn(*tensors):
        return OP(*tensors, **case.kwargs, padding_mode=padding_mode)

    # The input gradient is summed with atomics, so two backward passes may differ in the last bits.
    assert torch.autograd.gradcheck(fn, case.tensors, eps=1e-6, atol=1e-8, rtol=1e-6, nondet_tol=1e-12)


def test_more_than_2_31_elements():
    """An input and output of more than 2**31 elements (float16, 46341 x 46342), so that flat
    indices, including those inside one image plane, need 64 bits. Forward only; a few pixels,
    at the start, the middle and the far corner, are checked against the reference on crops."""
    H, W = 46341, 46342
    numel = H * W
    assert numel > 2**31
    need = 4 * numel * 2 + (2 << 30)  # input, 2-channel offset, output (float16), some slack
    free, _ = torch.cuda.mem_get_info()
    if free < max(need, 16 << 30):
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory, {free / 2**30:.1f} GiB free")
    g = torch.Generator(device="cuda").manual_seed(1234)
    input = torch.randn((1, 1, H, W), device="cuda", dtype=F16, generator=g)
    offset = torch.rand((1, 2, H, W), device="cuda", dtype=F16, generator=g).mul_(3).sub_(1.5)
    assert edsc_ext._plan(input, offset=offset, padding_mode="zeros").forward == "pixels"  # 64-bit indices
    try:
        out = OP(input, offset=offset, padding_mode="zeros")
        torch.cuda.synchronize()
        assert out.shape == (1, 1, H, W)
        points = [(0, 0), (0, W - 1), (1, 1), (H // 2, W // 2), (H - 2, W - 3), (H - 1, 0), (H - 1, W - 1),
                  (H - 1, W - 2), (46340, 46000)]
        picks = torch.Generator().manual_seed(0)
        points += [(int(torch.randint(0, H, (1,), generator=picks)), int(torch.randint(0, W, (1,), generator=picks)))
                   for _ in range(8)]
        for y, x in points:
            # Samples stay within 2.5 pixels of (y, x); a crop of +-3 holds them all (a crop edge at
            # the image edge is the image edge, so the zeros beyond it are the same).
            y0, y1, x0, x1 = max(0, y - 3), min(H, y + 4), max(0, x - 3), min(W, x + 4)
            crop_in = input[:, :, y0:y1, x0:x1].double().cpu()
            crop_off = offset[:, :, y0:y1, x0:x1].double().cpu()
            expected = R.deform_sepconv(crop_in, offset=crop_off)[0, 0, y - y0, x - x0].item()
            actual = out[0, 0, y, x].item()
            assert abs(actual - expected) <= 2e-2 + 2e-3 * abs(expected), (y, x, actual, expected)
        # Border mode too, at the far corner.
        del out
        out = OP(input, offset=offset, padding_mode="border")
        y, x = H - 1, W - 1
        crop_in = input[:, :, y - 3:, x - 3:].double().cpu()
        crop_off = offset[:, :, y - 3:, x - 3:].double().cpu()
        expected = R.deform_sepconv(crop_in, offset=crop_off, padding_mode="border")[0, 0, 3, 3].item()
        assert abs(out[0, 0, y, x].item() - expected) <= 2e-2 + 2e-3 * abs(expected)
    finally:
        del input, offset
        out = None
        torch.cuda.empty_cache()
