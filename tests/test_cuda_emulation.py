"""The CUDA kernels' device code, run on the CPU (tests/cuda_emulation): each block's threads are OS threads,
so shared memory, __syncthreads and warp shuffles behave as a kernel relies on them. Machines without a GPU
(CI, a development machine) check here what a kernel computes and how its threads share the work; the GPU
suite checks the same kernels on the device, at speed, with the sanitizers.

The harness (tests/cuda_emulation/emulated_kernels.cpp) is compiled with the host compiler against the
kernels' headers (src/cuda, EDSC_CUDA_EMULATION) and the planner (src/cuda/deform_sepconv_plan_cuda.cpp); it
runs the kernel the planner picks for an H200, and its results are compared with the CPU op's, which the
float64 reference tests check. Emulated: every forward kernel (grid taps, staged, lane pairs, pixels) and
every backward kernel (the grid-tap ones, the gather where it needs no fold; tiled, warp-staged or not; one
thread a pixel; the channel lanes; the lane tile), in float32 and, where the planner gives them, the half types;
and the kernels of upsample_bilinear2x and avg_pool2x.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess

import pytest
import torch

import edsc_ext
from edsc_ext import _build_support as bs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESS = os.path.join(REPO, "tests", "cuda_emulation")
SOURCES = [os.path.join(HARNESS, "emulated_kernels.cpp"),
           os.path.join(REPO, "src", "cuda", "deform_sepconv_plan_cuda.cpp")]


def _digest() -> str:
    h = hashlib.sha256()
    for root in (os.path.join(REPO, "src"), os.path.join(REPO, "include"), HARNESS):
        for dirpath, _, files in sorted(os.walk(root)):
            for name in sorted(files):
                with open(os.path.join(dirpath, name), "rb") as f:
                    h.update(name.encode() + f.read())
    return h.hexdigest()[:16]


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the emulation harness")
    from torch.utils.cpp_extension import include_paths

    library = tmp_path_factory.mktemp("cuda_emulation") / f"emulated_kernels_{_digest()}.so"
    macros = [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in bs.stable_abi_macros()]
    command = [compiler, "-std=c++20", "-O2", "-g0", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden",
               "-DEDSC_CUDA_EMULATION", "-DEDSC_EXT_CUDA_SASS=90", "-DEDSC_EXT_CUDA_PTX=0", *macros,
               f"-I{HARNESS}", f"-I{os.path.join(REPO, 'src')}", f"-I{os.path.join(REPO, 'include')}",
               *[f"-I{path}" for path in include_paths()], *SOURCES, "-o", str(library)]
    built = subprocess.run(command, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-4000:]
    lib = ctypes.CDLL(str(library))
    lib.edsc_emulated_backward.restype = ctypes.c_int
    lib.edsc_emulated_forward.restype = ctypes.c_int
    lib.edsc_emulation_check.restype = ctypes.c_int
    lib.edsc_emulated_resample2x.restype = ctypes.c_int
    return lib


def _pointer(t):
    return ctypes.c_void_p(t.data_ptr()) if t is not None else ctypes.c_void_p(0)


def test_the_emulation_shuffles_and_guards_shared_memory(harness):
    """Warp shuffles deliver the partner lane's value, and a write past a launch's dynamic shared memory
    is reported (as compute-sanitizer's memcheck would on the GPU)."""
    error = ctypes.create_string_buffer(512)
    assert harness.edsc_emulation_check(0, error, 512) == 0, error.value.decode()
    assert harness.edsc_emulation_check(1, error, 512) == 1
    assert "wrote past its 256 bytes of dynamic shared memory" in error.value.decode()


DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _geometry(x, v, h, out_shape, padding, mode, channels_last, dilation=1):
    n, c, h_in, w_in = x.shape
    return (ctypes.c_int64 * 14)(n, c, h_in, w_in, *out_shape[2:], v.shape[1], h.shape[1], padding, padding, dilation,
                                 dilation, edsc_ext.ops.PADDING_MODES[mode], int(channels_last))


def _emulated_forward(lib, x, v, h, off, m, out_shape, padding, mode, channels_last, plain=False, dilation=1,
                      packed_frame=True, prefetch=True):
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    inputs = [None if t is None else t.detach().contiguous(memory_format=fmt) for t in (x, v, h, off, m)]
    output = torch.empty(out_shape, dtype=x.dtype).contiguous(memory_format=fmt)
    plan, error = ctypes.create_string_buffer(256), ctypes.create_string_buffer(512)
    status = lib.edsc_emulated_forward(_geometry(x, v, h, out_shape, padding, mode, channels_last, dilation),
                                       DTYPE_CODES[x.dtype], int(plain), int(packed_frame),
                                       int(prefetch), *[_pointer(t) for t in inputs],
                                       _pointer(output), plan, 256, error, 512)
    assert status == 0, error.value.decode()
    return plan.value.decode(), output


def _emulated_backward(lib, x, v, h, off, m, grad_out, padding, mode, channels_last, lane_tile=False,
                       input_grad_tile=True, dilation=1, lean_rgb_backward=True):
    geometry = _geometry(x, v, h, grad_out.shape, padding, mode, channels_last, dilation)
    fmt = torch.channels_last if channels_last else torch.contiguous_format

    def dense(t):
        return None if t is None else t.detach().contiguous(memory_format=fmt)

    inputs = [dense(t) for t in (x, v, h, off, m, grad_out)]
    # The input gradient in float32, as the kernels accumulate it; the per-pixel ones in their dtype.
    grads = [None if t is None else torch.zeros_like(t, dtype=torch.float32 if k == 0 else t.dtype)
             for k, t in enumerate(inputs[:5])]
    plan, error = ctypes.create_string_buffer(256), ctypes.create_string_buffer(512)
    status = lib.edsc_emulated_backward(geometry, DTYPE_CODES[x.dtype], int(lane_tile), int(input_grad_tile),
                                        int(lean_rgb_backward), *[_pointer(t) for t in inputs],
                                        *[_pointer(g) for g in grads], plan, 256, error, 512)
    assert status == 0, error.value.decode()
    return plan.value.decode(), grads


def _case(c, k, mode, channels_last, seed, dtype=torch.float32, offsets=True, mask=True, size=13, dilation=1):
    """A random call (size x size output, padding dilation * (K // 2)) in ``dtype``, its output gradient,
    and the CPU op's gradients (None for an absent tensor)."""
    gen = torch.Generator().manual_seed(seed)
    n, padding = 2, dilation * (k // 2)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(n, c, size, size, generator=gen)
    v = torch.randn(n, k, size, size, generator=gen)
    h = torch.randn(n, k, size, size, generator=gen)
    # Offsets of a few pixels: most taps land in the tile's footprint, some beyond it (the global fallback).
    off = torch.randn(n, 2 * k * k, size, size, generator=gen) * 3
    m = torch.rand(n, k * k, size, size, generator=gen)
    present = (True, True, True, offsets, mask)
    args = [t.to(dtype).contiguous(memory_format=fmt).requires_grad_() if keep else None
            for t, keep in zip((x, v, h, off, m), present)]
    out = edsc_ext.deform_sepconv(*args, padding=padding, dilation=dilation, padding_mode=mode)
    grad_out = torch.randn(out.shape, generator=gen).to(dtype).contiguous(memory_format=fmt)
    given = [t for t in args if t is not None]
    found = iter(torch.autograd.grad(out, given, grad_out))
    expected = [None if t is None else next(found) for t in args]
    return args, grad_out, padding, expected


def _assert_grads_match(grads, expected, tolerance=2e-5):
    """Each gradient within ``tolerance`` of the CPU op's, relative to its largest element. The CPU op
    rounds its 16-bit results from the same float32 sums, summed in another order: they may differ by
    a rounding step of the dtype."""
    for name, got, want in zip(("input", "vertical", "horizontal", "offset", "mask"), grads, expected):
        if want is None:
            continue
        scale = want.abs().max().item()
        apart = (got.to(want.dtype).float() - want.float()).abs().max().item()  # rounded as the launcher does
        assert apart <= tolerance * max(scale, 1.0), (name, apart, scale)


TOLERANCES = {torch.float32: 2e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}


@pytest.mark.parametrize("c, k, mode, channels_last, dtype, expected_plan", [
    # EDSC's call: exact RGB, the padding mode compiled in, the L2 prefetch
    (3, 5, "border", False, torch.float32, "tiled_rgb_lean_prefetch"),
    (5, 5, "edsc", False, torch.float32, "tiled_prefetch"),  # a second block of channels, the doubled border
    (4, 3, "zeros", False, torch.float32, "tiled"),  # run-time kernel size
    (3, 3, "border", True, torch.float32, "tiled"),  # channels_last: the tile flushed channel-fastest
    (3, 5, "border", True, torch.float32, "tiled_warp_staged_rgb"),  # each warp's values staged in shared memory
    (4, 5, "zeros", True, torch.float32, "tiled_warp_staged"),
    (3, 5, "border", False, torch.bfloat16, "tiled_rgb_lean_prefetch"),
    (4, 5, "border", True, torch.float16, "tiled_warp_staged"),
])
def test_the_tiled_backward_computes_what_the_cpu_op_does(harness, c, k, mode, channels_last, dtype, expected_plan):
    args, grad_out, padding, expected = _case(c, k, mode, channels_last, 1000 + c * 10 + k, dtype=dtype)
    plan, grads = _emulated_backward(harness, *args, grad_out, padding, mode, channels_last)
    assert plan == expected_plan, plan
    _assert_grads_match(grads, expected, TOLERANCES[dtype])


@pytest.mark.parametrize("mode, dilation", [("zeros", 2), ("border", 1), ("edsc", 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_lean_rgb_backward_compiled_per_padding_mode(harness, mode, dilation, dtype):
    """The exact-RGB NCHW backward through the tile (kernel_policy lean_rgb_backward, the default) is compiled
    once per padding mode: each mode, and the generic tiled kernel it replaces, against the CPU op, with taps
    leaving the image on every side and landing beyond the tile's footprint (the global fallback); then
    non-finite offsets (NaN, +-inf) poison exactly the parameter gradients the CPU op's do, and the input
    gradient stays finite and equal."""
    seed = 7700 + 10 * list(edsc_ext.ops.PADDING_MODES).index(mode) + list(TOLERANCES).index(dtype)
    args, grad_out, padding, expected = _case(3, 5, mode, False, seed, dtype=dtype, dilation=dilation)
    for lean in (True, False):
        plan, grads = _emulated_backward(harness, *args, grad_out, padding, mode, False, dilation=dilation,
                                         lean_rgb_backward=lean)
        assert plan == ("tiled_rgb_lean_prefetch" if lean else "tiled_rgb_prefetch"), plan
        _assert_grads_match(grads, expected, TOLERANCES[dtype])

    x, v, h, off, m = (t.detach() for t in args)
    off = off.clone()
    off[0, 7, 2, 3] = float("nan")
    off[1, 30, 5, 0] = float("inf")
    off[1, 11, 12, 12] = -float("inf")
    given = [t.clone().requires_grad_() for t in (x, v, h, off, m)]
    out = edsc_ext.deform_sepconv(*given, padding=padding, dilation=dilation, padding_mode=mode)
    expected = torch.autograd.grad(out, given, grad_out)
    plan, grads = _emulated_backward(harness, x, v, h, off, m, grad_out, padding, mode, False, dilation=dilation)
    assert plan == "tiled_rgb_lean_prefetch", plan
    assert not grads[0].isnan().any() and not expected[0].isnan().any()
    for name, got, want in zip(("input", "vertical", "horizontal", "offset", "mask"), grads, expected):
        assert want.isnan().any() or name == "input", name
        assert torch.equal(got.isnan(), want.isnan()), name
    finite = [(g.masked_fill(g.isnan(), 0), w.masked_fill(w.isnan(), 0)) for g, w in zip(grads, expected)]
    _assert_grads_match([g for g, _ in finite], [w for _, w in finite], TOLERANCES[dtype])


@pytest.mark.parametrize("c, k, channels_last, expected_plan", [
    (3, 5, False, "pixels_blocks3"), (5, 3, False, "pixels"), (4, 5, True, "pixels")])
def test_the_pixels_backward_computes_what_the_cpu_op_does(harness, c, k, channels_last, expected_plan):
    """kernel_policy(input_grad_tile=False): one thread a pixel, the input gradient through global atomics."""
    args, grad_out, padding, expected = _case(c, k, "border", channels_last, 5000 + c * 10 + k)
    plan, grads = _emulated_backward(harness, *args, grad_out, padding, "border", channels_last,
                                     input_grad_tile=False)
    assert plan == expected_plan, plan
    _assert_grads_match(grads, expected)


@pytest.mark.parametrize("c, channels_last, dtype, lean, expected_plan", [
    (3, False, torch.bfloat16, True, "tiled_rgb_lean_prefetch"),
    (3, False, torch.float16, False, "tiled_rgb_prefetch"),
    (4, True, torch.float16, True, "tiled_warp_staged"),
    (32, True, torch.bfloat16, True, "lane_tile4"),
])
@pytest.mark.parametrize("mode", ["border", "edsc"])
def test_the_half_types_one_word_tile_stays_below_their_rounding(harness, c, channels_last, dtype, lean,
                                                                  expected_plan, mode):
    """A half-type call's tile holds one int32 word an element (FixedPointTileAdd, kBits 30) where float32's
    holds two: the input gradient's float32 sums, before the launcher rounds them to the dtype, stay within
    1e-4 of the largest element of the float64 reference's (a quarter of float16's rounding step there,
    a fortieth of bfloat16's), with taps on the image's border (edsc: the border pixel counted twice) and
    beyond the tile's footprint."""
    seed = 8800 + c + 7 * int(channels_last) + 3 * list(TOLERANCES).index(dtype) + (50 if mode == "edsc" else 0)
    args, grad_out, padding, _ = _case(c, 5, mode, channels_last, seed, dtype=dtype)
    plan, grads = _emulated_backward(harness, *args, grad_out, padding, mode, channels_last, lane_tile=True,
                                     lean_rgb_backward=lean)
    assert plan == expected_plan, plan
    given = [t.detach().double().requires_grad_() for t in args]
    out = edsc_ext.deform_sepconv(*given, padding=padding, padding_mode=mode)
    want = torch.autograd.grad(out, given[0], grad_out.double())[0]
    got = grads[0].double()
    assert got.dtype == torch.float64 and grads[0].dtype == torch.float32
    apart = (got - want).abs().max().item() / want.abs().max().item()
    assert apart < 1e-4, apart


@pytest.mark.parametrize("c, channels_last, dtype, size, expected_plan", [
    (3, False, torch.bfloat16, (8, 32), "tiled_rgb_lean_prefetch"),
    (3, False, torch.float32, (8, 32), "tiled_rgb_lean_prefetch"),
    (4, True, torch.float16, (8, 32), "tiled_warp_staged"),
    (32, True, torch.float16, (8, 8), "lane_tile4"),
])
def test_the_fixed_point_tile_holds_the_doubled_borders_worst_case(harness, c, channels_last, dtype, size,
                                                                   expected_plan):
    """The worst case of a fixed-point tile: every tap of one block's pixels lands on the frame's corner
    pixel beyond the padding in both axes (edsc: counted 4 times), all of one sign, and the pixels'
    bound sums to a hair below a power of two (2^20 - 1 units of 2^-10). The scale counts the doubled
    border (the padding's bound_factor), so the corner's int32 words hold the sum: the gradient there
    is exact, where a scale without the factor would wrap the one-word tile around."""
    gen = torch.Generator().manual_seed(9100 + c + list(TOLERANCES).index(dtype))
    k, (height, width) = 5, size
    pixels = height * width  # one block's tile
    largest = 255 if dtype == torch.bfloat16 else 2047  # integers the dtype holds exactly
    units = torch.randint(largest // 3, largest + 1, (pixels,), generator=gen)
    # 25 taps a pixel of |V H M| = 1: the pixels' bound is 25 * sum(units) * 2^-10 = (2^20 - 1) * 2^-10.
    target = ((1 << 20) - 1) // (k * k)
    while int(units.sum()) != target:
        step = 1 if int(units.sum()) < target else -1
        pick = torch.randint(0, pixels, (1,), generator=gen).item()
        if 1 <= int(units[pick]) + step <= largest:
            units[pick] += step
    sign = 1.0 if torch.rand(1, generator=gen).item() < 0.5 else -1.0
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(1, c, height, width, generator=gen)
    v, h = torch.ones(1, k, height, width), torch.ones(1, k, height, width)
    off = torch.full((1, 2 * k * k, height, width), -64.0)  # far before the corner in both axes
    m = torch.ones(1, k * k, height, width)
    grad_out = (sign * units.double() / 1024).reshape(1, 1, height, width).expand(1, c, height, width)
    args = [t.to(dtype).contiguous(memory_format=fmt) for t in (x, v, h, off, m)]
    grad_out = grad_out.to(dtype).contiguous(memory_format=fmt)
    plan, grads = _emulated_backward(harness, *args, grad_out, k // 2, "edsc", channels_last, lane_tile=True)
    assert plan == expected_plan, plan
    given = [t.detach().double().requires_grad_() for t in args]
    out = edsc_ext.deform_sepconv(*given, padding=k // 2, padding_mode="edsc")
    want = torch.autograd.grad(out, given[0], grad_out.double())[0]
    corner = sign * 4 * k * k * int(units.sum()) / 1024
    assert torch.allclose(want[0, :, 0, 0], torch.full((c,), corner, dtype=torch.float64))
    assert torch.equal(grads[0].double(), want), (grads[0][0, :, 0, 0], corner)


@pytest.mark.parametrize("lane_tile", [False, True], ids=["channel_lanes", "lane_tile"])
@pytest.mark.parametrize("c, k, mode, lanes, dilation", [
    (8, 5, "border", 1, 1),   # a tile row a warp of 32 pixels
    (16, 3, "zeros", 2, 1),   # run-time kernel size
    (24, 5, "edsc", 4, 1),    # three blocks on four lanes: one lane idle
    (32, 5, "border", 4, 1),  # the feat case's channels
    (32, 5, "zeros", 4, 5),   # a 35 x 35 footprint: four passes of 8 channels through the tile
    (40, 3, "edsc", 8, 1),    # five blocks: the lane tile's lane 0 takes two
    (64, 5, "zeros", 8, 1),   # eight blocks: the lane tile's four lanes take two each
    (72, 3, "border", 16, 1),  # nine blocks: more than the lane tile takes, the channel lanes
])
def test_the_channel_lanes_compute_what_the_cpu_op_does(harness, c, k, mode, lanes, dilation, lane_tile):
    """The channels_last backward of many channels, with the input gradient through global atomics (the
    channel lanes) or, for 8 to 64 channels, through the fixed-point tile on at most 4 lanes (policy
    lane_tile)."""
    args, grad_out, padding, expected = _case(c, k, mode, True, 2000 + c * 10 + k + dilation, dilation=dilation)
    plan, grads = _emulated_backward(harness, *args, grad_out, padding, mode, True, lane_tile=lane_tile,
                                     dilation=dilation)
    wanted = f"lane_tile{min(lanes, 4)}" if lane_tile and c <= 64 else f"channel_lanes{lanes}"
    assert plan == wanted, plan
    _assert_grads_match(grads, expected)


@pytest.mark.parametrize("lane_tile", [False, True], ids=["channel_lanes", "lane_tile"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_the_channel_lanes_in_half_precision(harness, dtype, lane_tile):
    """The half types: vector loads of 8 values (16 bytes) a corner, float32 sums, 16-bit per-pixel
    gradients; 32 channels, 5x5."""
    args, grad_out, padding, expected = _case(32, 5, "border", True, 3000, dtype=dtype)
    plan, grads = _emulated_backward(harness, *args, grad_out, padding, "border", True, lane_tile=lane_tile)
    assert plan == f"{'lane_tile' if lane_tile else 'channel_lanes'}4", plan
    _assert_grads_match(grads, expected, TOLERANCES[dtype])


@pytest.mark.parametrize("c, k, channels_last, dtype, plain, expected_plan", [
    # kernel_policy(plain_forward=True): each variant of the pixels kernel.
    (3, 5, False, torch.float32, True, "pixels_rgb"),  # EDSC's call: exact RGB, the padding mode compiled in
    (4, 5, False, torch.float32, True, "pixels_prefetch"),
    (5, 3, False, torch.float32, True, "pixels"),  # two channel blocks, the second partial
    (3, 5, True, torch.float32, True, "pixels_rgb"),
    (4, 3, True, torch.float32, True, "pixels_vectorized"),  # a corner's 4 channels in one load
    (16, 5, True, torch.float32, True, "pixels_vectorized8"),  # 8 channels a thread, two 16-byte loads a corner
    (16, 3, True, torch.bfloat16, True, "pixels_vectorized8"),  # 8 channels in one 16-byte load
    # 2-byte: the frame packed, and the L2 prefetch of the per-pixel values
    (3, 5, False, torch.float16, True, "pixels_rgb_packed_prefetch"),
    # The defaults: the specialised forwards.
    (3, 5, True, torch.float32, False, "lane_pairs_rgb_staged"),  # two lanes a pixel, values staged a warp at a time
    (4, 5, True, torch.bfloat16, False, "lane_pairs_staged"),
    # NCHW 2-byte types (16 x 16 outputs: each image's planes 16-byte aligned): the block's values staged.
    (4, 5, False, torch.bfloat16, False, "staged_chunk16"),
    (2, 5, False, torch.float16, False, "staged_chunk16"),
])
def test_the_forward_computes_what_the_cpu_op_does(harness, c, k, channels_last, dtype, plain, expected_plan):
    """The forward kernels, each variant of their tables instantiated through the launchers' dispatch."""
    mode = "edsc" if c == 5 else "border"  # the doubled border and shifted taps once
    size = 16 if expected_plan.startswith("staged") else 13
    args, _, padding, _ = _case(c, k, mode, channels_last, 4000 + c * 10 + k, dtype=dtype, size=size)
    _assert_forward_matches(harness, args, padding, mode, channels_last, dtype, plain, expected_plan)


@pytest.mark.parametrize("mode, dilation", [("zeros", 2), ("border", 1), ("edsc", 1)])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_exact_rgb_forward_compiled_per_padding_mode(harness, mode, dilation, channels_last, dtype):
    """The exact-RGB pixel kernels are compiled once per padding mode (the mode's traits constants in the
    taps): each mode against the CPU op, in both layouts, taps leaving the image on every side; then
    non-finite offsets (NaN, +-inf) make NaN in every channel of their own pixels and nowhere else."""
    seed = 7000 + 10 * list(edsc_ext.ops.PADDING_MODES).index(mode) + int(channels_last)
    args, _, padding, _ = _case(3, 5, mode, channels_last, seed, dtype=dtype, dilation=dilation)
    expected_plan = "pixels_rgb_packed_prefetch" if not channels_last and dtype != torch.float32 else "pixels_rgb"
    _assert_forward_matches(harness, args, padding, mode, channels_last, dtype, True, expected_plan, dilation)

    x, v, h, off, m = (t.detach() for t in args)
    off = off.clone()
    off[0, 7, 2, 3] = float("nan")
    off[1, 30, 5, 0] = float("inf")
    off[1, 11, 12, 12] = -float("inf")
    with torch.no_grad():
        expected = edsc_ext.deform_sepconv(x, v, h, off, m, padding=padding, dilation=dilation, padding_mode=mode)
    plan, output = _emulated_forward(harness, x, v, h, off, m, expected.shape, padding, mode, channels_last,
                                     plain=True, dilation=dilation)
    assert plan == expected_plan, plan
    poisoned = torch.zeros(expected.shape[0], 1, *expected.shape[2:], dtype=torch.bool)
    poisoned[0, 0, 2, 3] = poisoned[1, 0, 5, 0] = poisoned[1, 0, 12, 12] = True
    assert torch.equal(expected.isnan(), poisoned.expand_as(expected))
    assert torch.equal(output.isnan(), poisoned.expand_as(output))
    finite = ~poisoned.expand_as(output)
    scale = expected[finite].abs().max().item()
    assert (output[finite].float() - expected[finite].float()).abs().max().item() <= TOLERANCES[dtype] * max(scale, 1.0)


def _assert_forward_matches(harness, args, padding, mode, channels_last, dtype, plain, expected_plan, dilation=1,
                            packed_frame=True, prefetch=True):
    with torch.no_grad():
        expected = edsc_ext.deform_sepconv(*args, padding=padding, dilation=dilation, padding_mode=mode)
    plan, output = _emulated_forward(harness, *args, expected.shape, padding, mode, channels_last, plain=plain,
                                     dilation=dilation, packed_frame=packed_frame, prefetch=prefetch)
    assert plan == expected_plan, plan
    scale = expected.abs().max().item()
    assert (output.float() - expected.float()).abs().max().item() <= TOLERANCES[dtype] * max(scale, 1.0)
    return output


@pytest.mark.parametrize("mode, dilation", [("zeros", 2), ("border", 1), ("edsc", 1)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("prefetch", [False, True], ids=["no_prefetch", "prefetch"])
def test_the_packed_rgb_frame_gives_the_planes_values(harness, mode, dilation, dtype, prefetch):
    """An NCHW RGB call in a half type reads a packed (N, H, W, 4) copy of its frame, one load a corner: against
    the CPU op, and bit for bit what the kernel reading the three planes gives (the same sums in the same order),
    on odd sizes whose taps leave the image on every side."""
    seed = 7500 + 10 * list(edsc_ext.ops.PADDING_MODES).index(mode) + int(prefetch)
    args, _, padding, _ = _case(3, 5, mode, False, seed, dtype=dtype, dilation=dilation, size=13)
    outputs = {}
    for packed in (True, False):
        expected_plan = "pixels_rgb" + ("_packed" if packed else "") + ("_prefetch" if prefetch else "")
        outputs[packed] = _assert_forward_matches(harness, args, padding, mode, False, dtype, True, expected_plan,
                                                  dilation, packed_frame=packed, prefetch=prefetch)
    assert torch.equal(outputs[True], outputs[False])


@pytest.mark.parametrize("c, mask, channels_last, mode, expected_forward, expected_backward", [
    (3, False, False, "zeros", "grid_taps_pass3", "grid_taps_params+gather_input_grad"),  # sepconv
    # A mask: the input gradient scattered by the tile.
    (4, True, False, "border", "grid_taps_pass4", "grid_taps_params+tiled_prefetch"),
    (2, False, True, "border", "grid_taps_pass2", "grid_taps_params"),  # the gather's fold and layout: not emulated
])
def test_the_grid_tap_kernels_compute_what_the_cpu_op_does(harness, c, mask, channels_last, mode, expected_forward,
                                                           expected_backward):
    """Calls without offsets (sepconv, K = 5): each tile's input window in shared memory, forward and the
    per-pixel tensors' gradients; the gathered input gradient where it needs no fold (zeros, NCHW)."""
    args, grad_out, padding, expected = _case(c, 5, mode, channels_last, 6000 + c, offsets=False, mask=mask)
    _assert_forward_matches(harness, args, padding, mode, channels_last, torch.float32, False, expected_forward)
    if expected_backward.endswith("params"):
        return
    plan, grads = _emulated_backward(harness, *args, grad_out, padding, mode, channels_last)
    assert plan == expected_backward, plan
    _assert_grads_match(grads, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("vector", [False, True], ids=["one_value", "16_bytes"])
def test_the_upsampling_kernels_compute_what_the_cpu_op_does(harness, dtype, channels_last, vector):
    """upsample_bilinear2x's CUDA kernels, each thread 16 bytes of the output or one value: bit for bit the CPU
    op's values (the same header's math), which are F.interpolate's (float64) within the dtype's rounding; sizes
    down to one row or column, where an axis has no second sample."""
    gen = torch.Generator().manual_seed(8100 + 4 * list(DTYPE_CODES).index(dtype) + 2 * channels_last + vector)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    for n, c, h, w in ((2, 16, 5, 4), (1, 8, 1, 4), (1, 24, 3, 1), (2, 3, 2, 4)):
        if vector and (c if channels_last else 2 * w) % (16 // dtype.itemsize):
            continue
        x = torch.randn(n, c, h, w, generator=gen).to(dtype).contiguous(memory_format=fmt)
        out = torch.full((n, c, 2 * h, 2 * w), float("nan"), dtype=dtype).contiguous(memory_format=fmt)
        error = ctypes.create_string_buffer(512)
        status = harness.edsc_emulated_resample2x(0, (ctypes.c_int64 * 4)(n, c, h, w), int(channels_last),
                                                  int(vector), DTYPE_CODES[dtype], _pointer(x), _pointer(out), error,
                                                  512)
        assert status == 0, error.value.decode()
        cpu = edsc_ext.upsample_bilinear2x(x)
        assert torch.equal(out, cpu), (n, c, h, w)
        reference = torch.nn.functional.interpolate(x.double(), scale_factor=2, mode="bilinear", align_corners=True)
        torch.testing.assert_close(out.double(), reference, rtol=TOLERANCES[dtype], atol=TOLERANCES[dtype],
                                   msg=lambda m, size=(n, c, h, w): f"{size}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("vector", [False, True], ids=["one_value", "16_bytes"])
def test_the_pooling_kernels_compute_what_the_cpu_op_does(harness, dtype, channels_last, vector):
    """avg_pool2x's CUDA kernels, each thread 16 bytes of the output or one value: bit for bit the CPU op's values
    (the same header's math), which are F.avg_pool2d's (float64) within the dtype's rounding; odd sizes, whose last
    row and column no block reads, and the smallest input."""
    gen = torch.Generator().manual_seed(8200 + 4 * list(DTYPE_CODES).index(dtype) + 2 * channels_last + vector)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    for n, c, h, w in ((2, 16, 6, 32), (1, 8, 3, 33), (1, 24, 2, 2), (2, 3, 5, 17)):
        if vector and (c if channels_last else w // 2) % (16 // dtype.itemsize):
            continue
        x = torch.randn(n, c, h, w, generator=gen).to(dtype).contiguous(memory_format=fmt)
        out = torch.full((n, c, h // 2, w // 2), float("nan"), dtype=dtype).contiguous(memory_format=fmt)
        error = ctypes.create_string_buffer(512)
        status = harness.edsc_emulated_resample2x(1, (ctypes.c_int64 * 4)(n, c, h, w), int(channels_last),
                                                  int(vector), DTYPE_CODES[dtype], _pointer(x), _pointer(out), error,
                                                  512)
        assert status == 0, error.value.decode()
        assert torch.equal(out, edsc_ext.avg_pool2x(x)), (n, c, h, w)
        reference = torch.nn.functional.avg_pool2d(x.double(), 2)
        torch.testing.assert_close(out.double(), reference, rtol=TOLERANCES[dtype], atol=TOLERANCES[dtype],
                                   msg=lambda m, size=(n, c, h, w): f"{size}: {m}")
