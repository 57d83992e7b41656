"""Kernel paths: each CPU and CUDA kernel family that a call can take (the planners' choices, see
test_plans.py, and the kernel_policy switches that force the alternatives), run against the float64
reference with an assertion that the path meant did run (edsc_ext._plan). CPU: the grid-tap rows,
the instruction sets; CUDA: the 5x5 staged, plain and prefetching forwards, the global-atomic input
gradient, the grid-tap kernels, the channels_last warp-staged kernels.

CUDA cases carry the ``cuda`` mark and skip cleanly without a GPU."""

from __future__ import annotations

import pytest
import torch

import edsc_ext
from edsc_ext import reference
from edsc_ext.ops import normalize_args

from conftest import (
    ALL_PRESENT,
    ARG_NAMES,
    BF16,
    DEVICES,
    F16,
    F32,
    F64,
    GRAD_FACTOR,
    PADDING_MODES,
    assert_close,
    assert_grads_close,
    cases,
    dtypes,
    forward_and_grads,
    make_inputs,
    memory_format,
    mixed,
    named,
    per_device,
    plans_of,
    present_id,
    reference_and_grads,
    requires_cuda,
)

OP = edsc_ext.deform_sepconv
# The instruction set the CPU plans name (the policy's cpu_isa="auto": torch's capability).
ISA = "/avx2" if edsc_ext._plan(torch.zeros(1, 1, 1, 1), kernel_size=1).forward.endswith("/avx2") else "/baseline"


def cpu_plan(kernel: str, dtype: torch.dtype) -> str:
    """A CPU plan's name: the kernel, the instruction set, and for 16-bit calls the float32 frame they run on."""
    return kernel + ISA + ("+float32_frame" if dtype in (torch.float16, torch.bfloat16) else "")


# ---------------------------------------------------------------------------------------------
# Without offsets: the grid-tap kernels


# Calls without offsets or dilation take the grid-tap kernels (every tap reads one input pixel).
#
# CPU: the row-wise kernels; output narrower and wider than the input, a kernel wider than the
# image, many channels, sepconv's 51 x 51 on a small frame.
CPU_GRID_TAP_CONFIGS = {
    # N, C, H_in, W_in, KH, KW, padding
    "3x5": (2, 3, 7, 9, 3, 5, (1, 2)),
    "4x6": (1, 5, 6, 8, 4, 6, (0, 4)),
    "wider-than-image": (1, 2, 5, 4, 3, 9, (1, 4)),
    "sepconv-51": (1, 3, 12, 14, 51, 51, 25),
}
#
# CUDA: each 8 x 32 tile of output pixels stages the input window its taps read in shared memory
# (the forward 4, 3, 2 or 1 channels a pass; the parameter gradients all channels at once, up to 4,
# else the bilinear backward) and holds 8 x 8 taps' weights at a time; without a mask the input
# gradient is gathered, each 8 x 32 tile of input pixels walking the rows of output pixels that
# reach it. The shapes give partial tiles, several passes, whole and partial tap chunks, output
# planes smaller and larger than the input, and sepconv's 51 x 51, whose 3-channel float32 window
# (57 KB, 109 KB with the backward's sums) needs more than the default 48 KB of shared memory.
CUDA_GRID_TAP_CONFIGS = {
    "rgb-5x5": (2, 3, 21, 45, 5, 5, 2),
    "c5-3x9": (1, 5, 12, 70, 3, 9, (0, 4)),
    "c4-8x10": (2, 4, 9, 33, 8, 10, (3, 6)),
    "c6-13x11": (1, 6, 17, 40, 13, 11, (6, 5)),
    "sepconv-51": (1, 3, 20, 36, 51, 51, 25),
}


def _assert_grid_tap_plans(case, padding_mode, which, present, device):
    """The call runs the grid-tap kernels of its device (for CUDA: the parameter gradients in the
    window while it holds every channel, the input gradient gathered where there is no mask)."""
    plans = plans_of(case, padding_mode, which)
    if device == "cpu":
        dtype = case.input.dtype
        assert plans == (cpu_plan("grid_taps_rows", dtype), cpu_plan("grid_taps_rows", dtype)), plans
    else:
        small = case.input.shape[1] <= 4  # the grid-tap gradients keep every channel in one window
        assert plans.forward.startswith("grid_taps_pass"), plans
        assert ("grid_taps_params" in plans.backward) == (small and any(present)), plans
        assert ("gather_input_grad" in plans.backward) == (small and "input" in which and not present[3]), plans


@pytest.mark.parametrize("device, config, dtype, layout", per_device(
    cpu=cases(CPU_GRID_TAP_CONFIGS, dtypes(F64, F32, BF16), named("contiguous", "channels_last")),
    cuda=cases(CUDA_GRID_TAP_CONFIGS, dtypes(F32, F16, BF16), named("contiguous", "channels_last"))))
def test_without_offset(gen, device, config, dtype, layout):
    """The grid-tap forward and backward against the reference in both padding modes, with and
    without each of vertical, horizontal and mask, every gradient and (once) the per-pixel
    tensors' alone (a frame that needs none, as in sepconv training). On the CPU the per-pixel
    bilinear code (kernel_policy(grid_taps=False)) must agree too."""
    big = config[4] > 16  # the reference's 2601 taps: one combination of tensors there
    for present in [(True, True, False, False)] if big else [p for p in ALL_PRESENT if not p[2]]:
        case = make_inputs(*config, present=present, dtype=dtype, device=device, generator=gen)
        if layout == "channels_last":
            case = case.map(lambda t: t.contiguous(memory_format=torch.channels_last))
        runs = [(mode, ARG_NAMES) for mode in PADDING_MODES]
        if present == (True, True, False, False):
            runs.append(("border", ARG_NAMES[1:]))
        for padding_mode, which in runs:
            what = f"{present_id(present)}, {padding_mode}"
            _assert_grid_tap_plans(case, padding_mode, which, present, device)
            out, grads = forward_and_grads(OP, case, padding_mode, which=which)
            assert out.is_contiguous(memory_format=torch.channels_last) == (layout == "channels_last")
            expected, expected_grads = reference_and_grads(case, padding_mode, which=which)
            assert_close(out, expected, dtype, what=what)
            assert_grads_close(grads, expected_grads, dtype)
            if device == "cpu" and not big:
                with edsc_ext.kernel_policy(grid_taps=False):
                    bilinear_backward = ("sample_rows" if case.input.shape[1] < 8 else
                                         "pixels_fused" if "input" in which else "pixels_params")
                    assert plans_of(case, padding_mode, which) == (cpu_plan("pixels", dtype),
                                                                   cpu_plan(bilinear_backward, dtype)), what
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
    expected, expected_grads = reference_and_grads(case, padding_mode)
    assert_grads_close(grads, expected_grads)


# ---------------------------------------------------------------------------------------------
# CUDA: the 5x5 forwards, prefetching, the input gradient's global atomics


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


@pytest.mark.cuda
@requires_cuda
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
                assert plans_of(case, padding_mode).forward.startswith("staged_chunk")
            else:
                # The exact-RGB kernel prefetches 2-byte per-pixel values only, and packs a 2-byte frame.
                prefetch = channels <= 4 and (channels != 3 or dtype != F32)
                packed = channels == 3 and dtype != F32
                planned = ("pixels" + ("_rgb" if channels == 3 else "") + ("_packed" if packed else "")
                           + ("_prefetch" if prefetch else ""))
                assert plans_of(case, padding_mode).forward == planned
        out, _ = forward_and_grads(OP, case, padding_mode)
        expected, _ = reference_and_grads(case, padding_mode)
        assert_close(out, expected, dtype)


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("config", [STAGED_CONFIGS[0], STAGED_CONFIGS[2], (3, 3, 37, 70, 5, 5, (4, 2), (2, 1))],
                         ids=["whole", "plane143", "dilated"])
def test_the_packed_frame_changes_nothing(gen, policy, config, padding_mode, dtype):
    """An NCHW RGB call in a half type reads a packed (N, H, W, 4) copy of its frame, one load a corner
    (kernel_policy(packed_frame=False) reads the three planes): the same sums in the same order, so the
    same output bit for bit, for every padding mode and with absent tensors; the reference agrees."""
    for present in [(True, True, True, True), (True, False, True, False)]:
        case = make_inputs(*config, present=present, dtype=dtype, device="cuda", generator=gen, offset_scale=3)
        outputs = {}
        for packed in (True, False):
            with edsc_ext.kernel_policy(packed_frame=packed):
                assert plans_of(case, padding_mode).forward == (
                    "pixels_rgb" + ("_packed" if packed else "") + "_prefetch")
                outputs[packed] = forward_and_grads(OP, case, padding_mode)[0]
        assert torch.equal(outputs[True], outputs[False])
        expected, _ = reference_and_grads(case, padding_mode)
        assert_close(outputs[True], expected, dtype)


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("config", [STAGED_CONFIGS[i] for i in (0, 1, 2, 4)],
                         ids=["whole", "partial", "plane143", "c1"])
def test_prefetch_changes_nothing(gen, policy, config, dtype):
    """The NCHW 5x5 kernels first prefetch each warp's per-pixel values into L2 (the exact-RGB forward
    only 2-byte ones; kernel_policy(prefetch=False) turns that off). A hint must not change a bit of the
    output or of the per-pixel tensors' gradients, also where a warp's pixels straddle two images
    (partial, plane143) or tensors are absent. The input gradient's cross-tile float atomics may round
    in another order."""
    policy(plain_forward=True)  # the staged half-type forward does not prefetch
    for present in [(True, True, True, True), (False, True, False, True)]:
        case = make_inputs(*config, present=present, dtype=dtype, device="cuda", generator=gen, offset_scale=3)
        results = {}
        for prefetch in (True, False):
            with edsc_ext.kernel_policy(prefetch=prefetch):
                plans = plans_of(case, "border")
                forward_prefetches = prefetch and (config[1] != 3 or dtype != F32)
                assert plans.forward.endswith("_prefetch") == forward_prefetches, plans
                assert plans.backward.endswith("_prefetch") == prefetch, plans
                results[prefetch] = forward_and_grads(OP, case, "border")
        (out, grads), (out_off, grads_off) = results[True], results[False]
        assert torch.equal(out, out_off)
        assert_close(grads[0], grads_off[0], dtype, what="input gradient")
        for name, g, g_off in zip(ARG_NAMES[1:], grads[1:], grads_off[1:]):
            assert (g is None) == (g_off is None), name
            assert g is None or torch.equal(g, g_off), f"gradient of {name} differs with prefetch on"


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("dtype", [F32, F64, BF16], ids=["f32", "f64", "bf16"])
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("config", [(2, 3, 9, 10, 3, 3, 1, 1), (2, 8, 7, 6, 5, 5, 2, 1),
                                    (1, 2, 6, 40, 1, 20, (0, 10), 1)], ids=["3x3", "5x5", "1x20"])
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


# ---------------------------------------------------------------------------------------------
# channels_last


# channels_last calls index NHWC memory directly in every kernel: the shapes below take the 5x5
# specialisation and the run-time one with dilation and a tile pass of several channels; the modes
# take the CUDA backward's shared-memory tile (fixed point, or float for float64), its global-atomic
# path and the deterministic one; on the CPU the backward splits them into 8 and 7 bands of rows
# per image.
CHANNELS_LAST_CONFIGS = [(2, 3, 12, 40, 5, 5, 2, 1), (1, 10, 9, 11, 3, 4, (1, 2), (2, 1))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["default", "global", "deterministic"])
@pytest.mark.parametrize("dtype", [F64, F32, F16, BF16], ids=["f64", "f32", "f16", "bf16"])
@pytest.mark.parametrize("config", CHANNELS_LAST_CONFIGS, ids=["5x5", "3x4-dil"])
def test_channels_last_paths(gen, request, policy, config, dtype, mode, device):
    if mode == "global":
        policy(input_grad_tile=False)
    elif mode == "deterministic":
        request.getfixturevalue("deterministic")
    case = make_inputs(*config, dtype=dtype, device=device, generator=gen, offset_scale=3)
    odd = case.map(lambda t: t.contiguous(memory_format=torch.channels_last))
    if device == "cuda":
        backward = plans_of(odd, "zeros").backward
        tiled = mode == "default" or (mode == "deterministic" and dtype != F64)
        assert backward.startswith("nchw_copies+" if config[1] > 4 else "tiled" if tiled else "pixels"), backward
        assert ("tiled" in backward) == tiled and ("fixed_point" in backward) == (mode == "deterministic"), backward
    grad_output = torch.randn(case.input.shape[:2] + normalize_args(*case.tensors, **case.kwargs).output_size,
                              generator=gen, dtype=F64)
    out, grads = forward_and_grads(OP, odd, "zeros", grad_output.contiguous(memory_format=torch.channels_last))
    for name, t in zip(("output",) + ARG_NAMES, (out,) + tuple(grads)):
        assert t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous(), (name, t.stride())
    expected, expected_grads = reference_and_grads(case, "zeros", grad_output)
    tol_dtype = F32 if mode == "deterministic" and dtype == F64 else dtype
    assert_close(out, expected, tol_dtype)
    assert_grads_close(grads, expected_grads, tol_dtype)
    if mode == "deterministic":
        _, again = forward_and_grads(OP, odd, "zeros", grad_output.contiguous(memory_format=torch.channels_last))
        for name, g, g0 in zip(ARG_NAMES, again, grads):
            assert torch.equal(g, g0), f"grad of {name} differs between two deterministic runs"


# The CUDA channels_last 5x5 kernels that stage each warp's per-pixel values through shared memory
# (the lane-pair forward in float32 and the half types, the tiled backward; up to 4 channels; 6
# channels take the backward on NCHW copies): 7 x 45 outputs leave the last warp of each tile row
# 13 pixels, and the forward's warps (16 pixels) straddle rows and images, the last one partial;
# every combination of absent tensors; plain and dilated; the deterministic tile too. At dilation
# 4 the backward's tile holds 3 channels a pass, so 4 channels take a second pass, which stages
# the values again (the first pass's gradients replaced them in shared memory).
# kernel_policy(warp_staging=False, plain_forward=True) gives the unstaged kernels, which must agree.
@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("mode", ["default", "deterministic"])
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("channels", [1, 3, 4, 6])
def test_channels_last_warp_staged(gen, request, channels, dtype, mode):
    if mode == "deterministic":
        request.getfixturevalue("deterministic")
    as_cl = lambda t: t.contiguous(memory_format=torch.channels_last)  # noqa: E731
    # Deterministic mode takes the same staged code with a different global fallback: two
    # combinations of absent tensors cover it, the default mode all 16.
    presents = ALL_PRESENT if mode == "default" else [(True, True, True, True), (True, False, True, False)]
    for present in presents:
        for dilation, padding_mode in ((1, "zeros"), (2, "border"), (4, "zeros")):
            case = make_inputs(3, channels, 7, 45, 5, 5, 2 * dilation, dilation, present=present, dtype=dtype,
                               device="cuda", generator=gen, offset_scale=3)
            grad_output = torch.randn((3, channels, 7, 45), generator=gen, dtype=F64)
            results = []
            for staged in (True, False):
                with edsc_ext.kernel_policy(warp_staging=staged, plain_forward=not staged):
                    plans = plans_of(case.map(as_cl), padding_mode)
                    # A 1-channel channels_last tensor is contiguous too: that call is NCHW.
                    stages = staged and 1 < channels <= 4
                    if present[2] or dilation > 1:  # else the grid-tap kernels
                        assert plans.forward.startswith("lane_pairs" if stages else "pixels"), plans
                        assert ("warp_staged" in plans.backward) == stages, plans
                        assert plans.backward.startswith("nchw_copies+tiled" if channels > 4 else "tiled"), plans
                    out, grads = forward_and_grads(OP, case.map(as_cl), padding_mode, as_cl(grad_output))
                assert out.is_contiguous(memory_format=torch.channels_last), out.stride()
                results.append((out, grads))
            expected, expected_grads = reference_and_grads(case, padding_mode, grad_output)
            for out, grads in results:
                assert_close(out, expected, dtype)
                assert_grads_close(grads, expected_grads, dtype)
            if mode == "deterministic":
                _, again = forward_and_grads(OP, case.map(as_cl), padding_mode, as_cl(grad_output))
                for name, g, g0 in zip(ARG_NAMES, again, results[0][1]):
                    assert g is None and g0 is None or torch.equal(g, g0), f"grad of {name} differs between two runs"


# Frame dtype and per-pixel dtype ("same", or bfloat16 with a float32 frame: mixed precision takes a
# float32 frame) of the channels_last vector-load and channel-lane tests.
PER_PIXEL_DTYPES = [(F32, "same"), (F16, "same"), (BF16, "same"), (F32, "bf16")]
PER_PIXEL_IDS = ["f32-same", "f16-same", "bf16-same", "f32-bf16"]


# The CUDA channels_last one-thread-per-(pixel, channel block) forward with whole blocks of channels
# reads each bilinear corner's block with vector loads (kernel_policy(vector_loads=True), the
# default): blocks of 8 a thread where the channel count is a multiple of 8 (8 channels: one block,
# 16: two), else of 4 (12 channels: three blocks; 4 channels, which only the plain forward or mixed
# precision sends here rather than to the lane pairs), the 5x5 specialisation and a run-time kernel
# size with dilation, every padding mode (EDSC mode's doubled border samples included), float32 and
# the half types, and float32 frames with bfloat16 per-pixel tensors; the scalar loads
# (vector_loads=False) must agree, and both the float64 reference.
@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("dtype, per_pixel", PER_PIXEL_DTYPES, ids=PER_PIXEL_IDS)
@pytest.mark.parametrize("config", [(2, 8, 9, 37, 5, 5, 2, 1), (1, 16, 10, 21, 3, 4, (1, 2), (2, 1)),
                                    (1, 12, 10, 21, 3, 4, (1, 2), (2, 1)), (2, 4, 7, 45, 5, 5, 2, 1)],
                         ids=["c8-5x5", "c16-3x4-dil", "c12-3x4-dil", "c4-5x5"])
def test_channels_last_vector_loads(gen, config, dtype, per_pixel):
    as_cl = lambda t: t.contiguous(memory_format=torch.channels_last)  # noqa: E731
    base = make_inputs(*config, dtype=F64, generator=gen, offset_scale=3)
    case = (mixed(base, BF16, "cuda", "channels_last") if per_pixel == "bf16"
            else base.map(lambda t: as_cl(t.to("cuda", dtype))))
    grad_output = torch.randn(case.input.shape[:2] + normalize_args(*case.tensors, **case.kwargs).output_size,
                              generator=gen, dtype=F64)
    for padding_mode in PADDING_MODES + ("edsc",):
        expected, expected_grads = reference_and_grads(case, padding_mode, grad_output)
        for vector in (True, False):
            # 4 channels of one dtype would take the lane-pair forward: the plain forward instead.
            plain = config[1] == 4 and per_pixel == "same"
            with edsc_ext.kernel_policy(vector_loads=vector, plain_forward=plain):
                vectorized = "pixels_vectorized8" if config[1] % 8 == 0 else "pixels_vectorized"
                assert plans_of(case, padding_mode).forward == (vectorized if vector else "pixels"), (
                    padding_mode, vector)
                out, grads = forward_and_grads(OP, case, padding_mode, as_cl(grad_output))
            assert out.is_contiguous(memory_format=torch.channels_last), out.stride()
            what = f"{padding_mode} vector_loads={vector}"
            assert_close(out, expected, dtype, what=what)
            # Each gradient has its argument's dtype: the per-pixel ones bfloat16 in the mixed case.
            assert_grads_close(grads, expected_grads, BF16 if per_pixel == "bf16" else dtype)


def _lanes(config):
    """The channel lanes a pixel of a call of config[1] channels: a lane a block of 8, a power of two, at most 32."""
    return min(32, 1 << (config[1] // 8 - 1).bit_length())


def _tile_lanes(config):
    """The lane tile's lanes a pixel: the channel lanes', at most 4 (a lane then takes up to two blocks)."""
    return min(4, _lanes(config))


def _many_channel_cases(gen, config, dtype, per_pixel, absent_horizontal=False):
    """The channels_last calls of the many-channel backward tests, on CUDA: every padding mode, absent
    tensors, each gradient alone; yields (case, present, which, padding_mode, grad_output, and the float64
    reference's output and gradients)."""
    as_cl = lambda t: t.contiguous(memory_format=torch.channels_last)  # noqa: E731
    variants = [((True,) * 4, ARG_NAMES, mode) for mode in PADDING_MODES + ("edsc",)]
    if absent_horizontal:
        variants.append(((True, False, True, True), ARG_NAMES, "zeros"))
    variants += [((False, True, True, False), ARG_NAMES, "border"), ((True,) * 4, ("input",), "zeros"),
                 ((True,) * 4, ARG_NAMES[1:], "border")]
    for present, which, padding_mode in variants:
        base = make_inputs(*config, present=present, dtype=F64, generator=gen, offset_scale=3)
        case = (mixed(base, BF16, "cuda", "channels_last") if per_pixel == "bf16"
                else base.map(lambda t: as_cl(t.to("cuda", dtype))))
        grad_output = torch.randn(case.input.shape[:2] + normalize_args(*case.tensors, **case.kwargs).output_size,
                                  generator=gen, dtype=F64)
        expected, expected_grads = reference_and_grads(case, padding_mode, grad_output, which=which)
        yield case, present, which, padding_mode, grad_output, expected, expected_grads


# The CUDA channels_last backward of a multiple of 8 channels (kernel_policy(channel_lanes=True), the
# default) takes the channel lanes: 2^k adjacent threads share a pixel's channels in blocks of 8
# read with vector loads, sum each tap's sums through shuffles and take turns storing the pixel's
# gradients; the input gradient goes through vector atomics (the lane tile off, which takes 8 to 64 channels).
# 8 channels: one lane a pixel; 16: two; 24: three blocks on four lanes (one idle); 64: eight;
# 320 (40 blocks): 32 lanes, some with two blocks. The 5x5 specialisation and a dilated run-time
# 3x4 kernel (outputs whose last warp is partial), every padding mode, float32, the half types and
# float32 frames with bfloat16 per-pixel tensors, split offsets, absent tensors and each gradient
# alone; NCHW copies (channel_lanes=False) must agree, and both the float64 reference.
@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("dtype, per_pixel", PER_PIXEL_DTYPES, ids=PER_PIXEL_IDS)
@pytest.mark.parametrize("config", [(2, 8, 9, 37, 5, 5, 2, 1), (1, 16, 10, 21, 3, 4, (1, 2), (2, 1)),
                                    (1, 24, 7, 13, 5, 5, 2, 1), (1, 64, 6, 11, 5, 5, 2, 1),
                                    (1, 320, 4, 5, 3, 4, (1, 2), (2, 1))],
                         ids=["c8-5x5", "c16-3x4-dil", "c24-5x5", "c64-5x5", "c320-3x4-dil"])
def test_channels_last_channel_lanes(gen, config, dtype, per_pixel):
    as_cl = lambda t: t.contiguous(memory_format=torch.channels_last)  # noqa: E731
    lanes = _lanes(config)
    for case, present, which, padding_mode, grad_output, expected, expected_grads in _many_channel_cases(
            gen, config, dtype, per_pixel, absent_horizontal=True):
        for lanes_on in (True, False):
            with edsc_ext.kernel_policy(channel_lanes=lanes_on, lane_tile=False):
                backward = plans_of(case, padding_mode, which=which).backward
                assert (backward == f"channel_lanes{lanes}" if lanes_on else backward.startswith("nchw_copies+")), (
                    present, which, padding_mode, lanes_on, backward)
                out, grads = forward_and_grads(OP, case, padding_mode, as_cl(grad_output), which=which)
            for name, g in zip(ARG_NAMES, grads):
                assert g is None or g.is_contiguous(memory_format=torch.channels_last), (name, g.stride())
            what = f"{padding_mode} {present} {which} channel_lanes={lanes_on}"
            assert_close(out, expected, dtype, what=what)
            assert_grads_close(grads, expected_grads, BF16 if per_pixel == "bf16" else dtype)
    # Split offsets ((dy, dx) as two tensors, as the EDSC heads make them) take the lanes too.
    base = make_inputs(*config, dtype=F64, generator=gen, offset_scale=3)
    case = base.map(lambda t: as_cl(t.to("cuda", dtype)))
    dy, dx = (as_cl(t).detach().requires_grad_() for t in (case.offset[:, 0::2], case.offset[:, 1::2]))
    leaves = case.leaves()
    with edsc_ext.kernel_policy(channel_lanes=True, lane_tile=False):
        assert edsc_ext._plan(leaves.input, leaves.vertical, leaves.horizontal, (dy, dx), leaves.mask, **case.kwargs,
                              padding_mode="border").backward == f"channel_lanes{lanes}"
        out = OP(leaves.input, leaves.vertical, leaves.horizontal, (dy, dx), leaves.mask, **case.kwargs,
                 padding_mode="border")
        grad_output = torch.randn(out.shape, generator=gen, dtype=F64)
        out.backward(as_cl(grad_output).to("cuda", dtype))
    expected, expected_grads = reference_and_grads(case, "border", grad_output)
    offset_grad = torch.stack((dy.grad, dx.grad), 2).flatten(1, 2)
    assert_close(out.detach(), expected, dtype)
    assert_grads_close(leaves.grads()[:3] + (offset_grad, leaves.mask.grad), expected_grads, dtype)


# The lane tile (kernel_policy(lane_tile=True), the default): the channel lanes' calls of 8 to 64 channels
# with the input gradient add it into a fixed-point tile in shared memory, flushed once per tile and pass of
# channels (c32 with a dilation of 5 takes four passes of 8; c16 a dilated run-time 3x4 kernel), on at most 4
# lanes a pixel (40 and 64 channels: a lane then takes two blocks, one lane of 40's, every lane of 64's). The
# float64 reference as for the lanes; without the input gradient the lanes stay; a deterministic input
# gradient takes the tile too (flushed into the fixed-point sums), and repeats bit for bit.
@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("dtype, per_pixel", PER_PIXEL_DTYPES, ids=PER_PIXEL_IDS)
@pytest.mark.parametrize("config", [(2, 8, 9, 37, 5, 5, 2, 1), (1, 24, 7, 13, 5, 5, 2, 1), (2, 32, 7, 19, 5, 5, 2, 1),
                                    (1, 32, 6, 11, 5, 5, 10, 5), (1, 16, 10, 21, 3, 4, (1, 2), (2, 1)),
                                    (1, 40, 6, 11, 3, 4, (1, 2), (2, 1)), (2, 64, 7, 19, 5, 5, 2, 1)],
                         ids=["c8-5x5", "c24-5x5", "c32-5x5", "c32-5x5-dil5", "c16-3x4-dil", "c40-3x4-dil", "c64-5x5"])
def test_channels_last_lane_tile(gen, config, dtype, per_pixel):
    as_cl = lambda t: t.contiguous(memory_format=torch.channels_last)  # noqa: E731
    lanes, tile_lanes = _lanes(config), _tile_lanes(config)
    for case, present, which, padding_mode, grad_output, expected, expected_grads in _many_channel_cases(
            gen, config, dtype, per_pixel):
        with edsc_ext.kernel_policy(lane_tile=True):
            backward = plans_of(case, padding_mode, which=which).backward
            wanted = f"lane_tile{tile_lanes}" if "input" in which else f"channel_lanes{lanes}"
            assert backward == wanted, (present, which, padding_mode, backward)
            out, grads = forward_and_grads(OP, case, padding_mode, as_cl(grad_output), which=which)
        for name, g in zip(ARG_NAMES, grads):
            assert g is None or g.is_contiguous(memory_format=torch.channels_last), (name, g.stride())
        assert_close(out, expected, dtype, what=f"{padding_mode} {present} {which}")
        assert_grads_close(grads, expected_grads, BF16 if per_pixel == "bf16" else dtype)
    if per_pixel == "bf16":
        return
    case = make_inputs(*config, dtype=F64, generator=gen, offset_scale=3).map(lambda t: as_cl(t.to("cuda", dtype)))
    grad_output = as_cl(torch.randn(case.input.shape[:2] + normalize_args(*case.tensors, **case.kwargs).output_size,
                                    generator=gen, dtype=F64).to("cuda", dtype))
    enabled = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with edsc_ext.kernel_policy(lane_tile=True):
            assert plans_of(case, "border").backward == f"lane_tile{tile_lanes}+fixed_point"
            runs = [forward_and_grads(OP, case, "border", grad_output) for _ in range(3)]
    finally:
        torch.use_deterministic_algorithms(enabled)
    for out, grads in runs[1:]:
        assert torch.equal(out, runs[0][0]), "deterministic runs differ"
        assert all(torch.equal(g, g0) for g, g0 in zip(grads, runs[0][1])), "deterministic runs differ"
    expected, expected_grads = reference_and_grads(case, "border", grad_output.to(F64))
    assert_grads_close(runs[0][1], expected_grads, dtype)


# The lean exact-RGB backward (kernel_policy(lean_rgb_backward=True), the default): NCHW calls of exactly 3
# channels with the 5x5 kernel, float32 and the half types (mixed precision too), with the input gradient
# through the tile, a kernel per padding mode. Against the float64 reference in every mode, absent tensors and
# the input gradient alone, a dilation whose taps reach past the tile's footprint (the global fallback); the
# generic tiled kernel (lean_rgb_backward=False) agrees with it; a deterministic input gradient repeats bit for bit.
@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("dtype, per_pixel", PER_PIXEL_DTYPES, ids=PER_PIXEL_IDS)
@pytest.mark.parametrize("config", [(2, 3, 9, 37, 5, 5, 2, 1), (1, 3, 17, 40, 5, 5, 4, 2)], ids=["5x5", "5x5-dil2"])
def test_nchw_rgb_lean_backward(gen, config, dtype, per_pixel):
    variants = [((True,) * 4, ARG_NAMES, mode) for mode in PADDING_MODES + ("edsc",)]
    variants += [((False, True, True, False), ARG_NAMES, "border"), ((True, True, False, True), ARG_NAMES, "edsc"),
                 ((True,) * 4, ("input",), "zeros")]
    grad_dtype = BF16 if per_pixel == "bf16" else dtype
    for present, which, padding_mode in variants:
        base = make_inputs(*config, present=present, dtype=F64, generator=gen, offset_scale=4)
        case = mixed(base, BF16, "cuda") if per_pixel == "bf16" else base.map(lambda t: t.to("cuda", dtype))
        grad_output = torch.randn(case.input.shape[:2] + normalize_args(*case.tensors, **case.kwargs).output_size,
                                  generator=gen, dtype=F64)
        expected, expected_grads = reference_and_grads(case, padding_mode, grad_output, which=which)
        results = {}
        for lean in (True, False):
            with edsc_ext.kernel_policy(lean_rgb_backward=lean):
                backward = plans_of(case, padding_mode, which=which).backward
                assert backward == ("tiled_rgb_lean_prefetch" if lean else "tiled_rgb_prefetch"), (present, backward)
                results[lean] = forward_and_grads(OP, case, padding_mode, grad_output, which=which)
            assert_close(results[lean][0], expected, dtype, what=f"{padding_mode} {present} {which}")
            assert_grads_close(results[lean][1], expected_grads, grad_dtype)
        for name, a, b in zip(ARG_NAMES, results[True][1], results[False][1]):
            assert (a is None) == (b is None), name
            if a is not None:
                assert_close(a, b.double(), grad_dtype, factor=GRAD_FACTOR, what=f"lean against generic: {name}")
    if per_pixel == "bf16":
        return
    case = make_inputs(*config, dtype=F64, generator=gen, offset_scale=4).map(lambda t: t.to("cuda", dtype))
    grad_output = torch.randn(case.input.shape[:2] + normalize_args(*case.tensors, **case.kwargs).output_size,
                              generator=gen, dtype=F64).to("cuda", dtype)
    enabled = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert plans_of(case, "edsc").backward == "tiled_rgb_lean_prefetch+fixed_point"
        runs = [forward_and_grads(OP, case, "edsc", grad_output) for _ in range(3)]
    finally:
        torch.use_deterministic_algorithms(enabled)
    for _, grads in runs[1:]:
        assert all(torch.equal(g, g0) for g, g0 in zip(grads, runs[0][1])), "deterministic runs differ"
    expected, expected_grads = reference_and_grads(case, "edsc", grad_output.to(F64))
    assert_grads_close(runs[0][1], expected_grads, dtype)


# Calls the channel lanes do not take run the backward on NCHW copies: a channel count that is not a
# multiple of 8, float64, a deterministic input gradient (float atomics), a grad_output that starts
# off a 16-byte boundary. (The float64 and deterministic results are checked by
# test_channels_last_paths; here the plans, and that a misaligned grad_output still gives the
# reference.)
@pytest.mark.cuda
@requires_cuda
def test_channels_last_channel_lanes_fall_back(gen, policy):
    policy(channel_lanes=True, lane_tile=False)
    as_cl = lambda t: t.contiguous(memory_format=torch.channels_last)  # noqa: E731
    for channels, dtype in ((12, F32), (8, F64)):
        case = make_inputs(1, channels, 6, 9, 5, 5, 2, 1, dtype=dtype, device="cuda", generator=gen).map(as_cl)
        assert plans_of(case).backward.startswith("nchw_copies+"), (channels, dtype)
    case = make_inputs(1, 16, 6, 9, 5, 5, 2, 1, dtype=F32, device="cuda", generator=gen, offset_scale=3).map(as_cl)
    assert plans_of(case).backward == "channel_lanes2"
    assert plans_of(case, which=ARG_NAMES[1:]).backward == "channel_lanes2"
    enabled = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert plans_of(case).backward.startswith("nchw_copies+"), "deterministic input gradient"
        # Without the input gradient nothing is added atomically: the lanes stay.
        assert plans_of(case, which=ARG_NAMES[1:]).backward == "channel_lanes2"
    finally:
        torch.use_deterministic_algorithms(enabled)
    leaves = case.leaves()
    out = OP(*leaves.tensors, **case.kwargs, padding_mode="zeros")
    grad_output = torch.randn(out.shape, generator=gen, dtype=F64)
    storage = torch.zeros(out.numel() + 1, dtype=F32, device="cuda")
    shifted = storage[1:].view(out.shape[0], out.shape[2], out.shape[3], out.shape[1]).permute(0, 3, 1, 2)
    shifted.copy_(grad_output)
    assert shifted.is_contiguous(memory_format=torch.channels_last) and shifted.data_ptr() % 16 != 0
    out.backward(shifted)
    expected, expected_grads = reference_and_grads(case, "zeros", grad_output)
    assert_grads_close(leaves.grads(), expected_grads, F32)


# A channels_last frame that starts off a 16-byte boundary (a view into a larger buffer, used in
# place) cannot take the vector loads: the planner sends it to the scalar ones; one that starts 16
# bytes in takes them. The same results.
@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("shift", [1, 4], ids=["off-16-bytes", "on-16-bytes"])
def test_channels_last_vector_loads_frame_alignment(gen, shift):
    case = make_inputs(2, 8, 9, 37, 5, 5, 2, 1, dtype=F32, device="cuda", generator=gen, offset_scale=3)
    case = case.map(lambda t: t.contiguous(memory_format=torch.channels_last))
    N, C, H, W = case.input.shape
    storage = torch.zeros(N * H * W * C + shift, dtype=F32, device="cuda")
    frame = storage[shift:].view(N, H, W, C).permute(0, 3, 1, 2)
    frame.copy_(case.input)
    assert frame.is_contiguous(memory_format=torch.channels_last)
    assert (frame.data_ptr() % 16 == 0) == (shift == 4)
    shifted = case.replace(input=frame)
    # (plans_of would plan fresh copies, which the allocator aligns.)
    plans = edsc_ext._plan(*shifted.tensors, **shifted.kwargs, padding_mode="border")
    assert plans.forward == ("pixels_vectorized8" if shift == 4 else "pixels"), plans
    out = OP(*shifted.tensors, **shifted.kwargs, padding_mode="border")
    assert_close(out, reference.deform_sepconv(*case.to(F64, "cpu").tensors, **case.kwargs, padding_mode="border"),
                 F32)


# The staged kernels read each tap's (dy, dx) as one aligned pair, and the channels_last forward
# copies each warp's run of values in 16-byte pieces. A channels_last offset tensor that starts one
# element past a pair boundary (a view into a larger buffer, used in place) cannot be read either
# way: the host must route it to the unstaged kernels; one that starts two elements in (pairs
# aligned, the run not on 16 bytes) takes the forward's unstaged lane-pair kernel. Same results.
@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("shift", [1, 2], ids=["off-pair", "off-16-bytes"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_channels_last_offset_off_pair_boundary(gen, dtype, shift):
    as_cl = lambda t: t.contiguous(memory_format=torch.channels_last)  # noqa: E731
    case = make_inputs(2, 3, 7, 45, 5, 5, 2, 1, dtype=dtype, device="cuda", generator=gen, offset_scale=3)
    leaves = case.map(as_cl).leaves()
    N, taps2, H, W = case.offset.shape
    storage = torch.zeros(N * H * W * taps2 + shift, dtype=dtype, device="cuda")
    shifted = lambda flat: flat[shift:].view(N, H, W, taps2).permute(0, 3, 1, 2)  # noqa: E731
    shifted(storage).copy_(case.offset)
    storage.requires_grad_()
    offset = shifted(storage)
    assert offset.is_contiguous(memory_format=torch.channels_last)
    pair_bytes = 2 * offset.element_size()
    assert (offset.data_ptr() % pair_bytes != 0) == (shift == 1)
    assert offset.data_ptr() % 16 != 0
    plans = edsc_ext._plan(leaves.input, leaves.vertical, leaves.horizontal, offset, leaves.mask, **case.kwargs,
                           padding_mode="zeros")
    # Off the pair boundary: the one-thread forward and the unstaged tile; else the unstaged lane pairs.
    expected = ("pixels_rgb", "tiled_blocks3") if shift == 1 else ("lane_pairs_rgb", "tiled_warp_staged_rgb")
    assert plans == expected, plans
    out = OP(leaves.input, leaves.vertical, leaves.horizontal, offset, leaves.mask, **case.kwargs,
             padding_mode="zeros")
    grad_output = torch.randn(out.shape, generator=gen, dtype=F64)
    out.backward(as_cl(grad_output).to(device="cuda", dtype=dtype))
    grads = leaves.grads()[:3] + (shifted(storage.grad), leaves.mask.grad)
    expected, expected_grads = reference_and_grads(case, "zeros", grad_output)
    assert out.is_contiguous(memory_format=torch.channels_last), out.stride()
    assert_close(out.detach(), expected, dtype)
    assert_grads_close(grads, expected_grads, dtype)


# ---------------------------------------------------------------------------------------------
# CPU instruction sets


@pytest.mark.parametrize("dtype", [F64, F32, F16, BF16], ids=["f64", "f32", "f16", "bf16"])
@pytest.mark.parametrize("config", [(1, 3, 17, 19, 5, 5, 2, 1), (2, 10, 9, 11, 3, 4, (1, 2), (2, 1))],
                         ids=["5x5", "3x4-dil"])
def test_cpu_instruction_sets(gen, monkeypatch, config, dtype):
    """The CPU loops run compiled for AVX2 + FMA where the CPU has them, else for the x86-64 baseline
    the wheels target (kernel_policy(cpu_isa="baseline") forces it): both match the float64 reference, in
    the forward and every gradient, and each is repeatable bit for bit."""
    case = make_inputs(*config, dtype=dtype, generator=gen, offset_scale=3)
    expected, expected_grads = reference_and_grads(case, "zeros")
    # 16-bit calls run on a float32 copy of the frame (kernel_policy(cpu_float32_frame=True), the default).
    suffix = "+float32_frame" if dtype in (F16, BF16) else ""
    for isa in ("auto", "baseline"):
        with edsc_ext.kernel_policy(cpu_isa=isa):
            plans = plans_of(case)
            backward = "sample_rows" if config[1] < 8 else "pixels_fused"  # fewer than 8 channels: row by row
            assert plans == ("pixels" + (ISA if isa == "auto" else "/baseline") + suffix,
                             backward + (ISA if isa == "auto" else "/baseline") + suffix), plans
            out, grads = forward_and_grads(OP, case, "zeros")
            again, again_grads = forward_and_grads(OP, case, "zeros")
        assert_close(out, expected, dtype, what=f"output ({isa})")
        assert_grads_close(grads, expected_grads, dtype)
        assert torch.equal(out, again)
        for name, g, g0 in zip(ARG_NAMES, again_grads, grads):
            assert torch.equal(g, g0), f"grad of {name} ({isa})"


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("offsets", [True, False], ids=["bilinear", "grid_taps"])
def test_cpu_16bit_calls_run_on_a_float32_frame(gen, dtype, layout, offsets):
    """A CPU call whose frame and per-pixel tensors are 16-bit runs on a float32 copy of the frame (and of
    grad_output); kernel_policy(cpu_float32_frame=False) runs the 16-bit loops. Both accumulate in float
    and round once, so the output and every gradient come out bit for bit alike, in the frame's dtype and
    layout, within the dtype's tolerance of the float64 reference; a call that wants only the frame's
    gradient gets only that. On an AVX2 machine the twin reads and writes float16 per-pixel values with
    F16C's conversions (src/cpu/f16c_half.h), the 16-bit loops with c10::Half's software ones: equal bits
    show that they round alike."""
    present = (True, True, offsets, offsets)
    case = make_inputs(2, 4, 13, 15, 5, 5, padding=2, present=present, dtype=dtype, generator=gen,
                       offset_scale=3)
    case = case.map(lambda t: t.contiguous(memory_format=memory_format(layout)))
    expected, expected_grads = reference_and_grads(case, "border")
    runs = {}
    for float32_frame in (True, False):
        with edsc_ext.kernel_policy(cpu_float32_frame=float32_frame):
            forward, backward = plans_of(case, "border")
            assert forward.startswith("pixels/" if offsets else "grid_taps_rows/"), forward
            assert forward.endswith("+float32_frame") == backward.endswith("+float32_frame") == float32_frame
            assert ISA in forward and ISA in backward, (forward, backward)
            runs[float32_frame] = forward_and_grads(OP, case, "border")
    (out, grads), (native_out, native_grads) = runs[True], runs[False]
    assert out.dtype == dtype and out.is_contiguous(memory_format=memory_format(layout))
    assert torch.equal(out, native_out)
    for name, g, native in zip(ARG_NAMES, grads, native_grads):
        assert (g is None) == (native is None) and (g is None or torch.equal(g, native)), name
    assert grads[0].dtype == dtype and grads[0].is_contiguous(memory_format=memory_format(layout))
    assert_close(out, expected, dtype, what="output")
    assert_grads_close(grads, expected_grads, dtype)
    frame_only, frame_only_grads = forward_and_grads(OP, case, "border", which=("input",))
    assert torch.equal(frame_only, out) and torch.equal(frame_only_grads[0], grads[0])
    assert all(g is None for g in frame_only_grads[1:])
