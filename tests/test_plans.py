"""Kernel plans and the kernel policy: which kernels a call runs (edsc_ext._plan, the planners in
src/cpu/cpu_plan.h and src/cuda/cuda_plan.h) and how edsc_ext.kernel_policy
changes that. The table test lists the plans of representative calls, for this CPU build and for
an H200, so that a change of selection shows in review; it describes the calls with meta tensors,
so it needs neither the memory of the benchmark sizes nor a GPU."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading

import pytest
import torch

import edsc_ext
from edsc_ext import _policy
from edsc_ext.benchmarks import op as B
from edsc_ext.ops import H200, CpuFacts, CudaDeviceFacts

F64, F32, F16, BF16 = torch.float64, torch.float32, torch.float16, torch.bfloat16
CPU = CpuFacts(avx2=True, threads=2)
CASES = {c.name: c for c in B.CASES}


def meta_call(case: B.Case, dtype=F32, channels_last=False, channels=None, grads=True, param_dtype=None,
              views=False, **changes):
    """(args, kwargs) of edsc_ext._plan for a benchmark case as meta tensors (every present tensor
    requiring grad when ``grads``; the per-pixel ones in ``param_dtype``, default ``dtype``; with
    ``views``, as channel slices of wider tensors, which the forwards read in place)."""
    case = dataclasses.replace(case, **changes) if changes else case
    c = case.c if channels is None else channels
    hw = (case.h, case.w)

    def tensor(*shape, dtype=param_dtype or dtype, view=views):
        n, k, h, w = shape
        t = torch.empty(n, k + 3 if view else k, h, w, device="meta", dtype=dtype)
        if channels_last:
            t = t.contiguous(memory_format=torch.channels_last)
        return t[:, :k].detach().requires_grad_(grads) if view else t.requires_grad_(grads)

    taps = case.k * case.k
    frame = tensor(case.n, c, case.h_in, case.w_in, dtype=dtype, view=False)
    v = tensor(case.n, case.k, *hw) if case.separable else None
    h = tensor(case.n, case.k, *hw) if case.separable else None
    offset = tensor(case.n, 2 * taps, *hw) if case.deformable else None
    mask = tensor(case.n, taps, *hw) if case.deformable else None
    return (frame, v, h, offset, mask), case.kwargs()


def plans(call, device, deterministic=False):
    args, kwargs = call
    enabled = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        return edsc_ext._plan(*args, **kwargs, device=device)
    finally:
        torch.use_deterministic_algorithms(enabled)


TRAIN, SEPCONV, ADACOF, FEAT = CASES["train"], CASES["sepconv"], CASES["adacof"], CASES["feat"]

# name -> (call, deterministic)
TABLE_CALLS = {
    **{f"{name} f32": (meta_call(case), False) for name, case in CASES.items()},
    **{f"{name} bf16": (meta_call(case, BF16), False) for name, case in CASES.items()},
    "train f16": (meta_call(TRAIN, F16), False),
    "train f64": (meta_call(TRAIN, F64), False),
    "train f32 channels_last": (meta_call(TRAIN, channels_last=True), False),
    "train bf16 channels_last": (meta_call(TRAIN, BF16, channels_last=True), False),
    "feat f32 channels_last": (meta_call(FEAT, channels_last=True), False),
    "feat bf16 channels_last": (meta_call(FEAT, BF16, channels_last=True), False),
    "feat f64 channels_last": (meta_call(FEAT, F64, channels_last=True), False),
    "feat f32+bf16 channels_last": (meta_call(FEAT, channels_last=True, param_dtype=BF16), False),
    "train f32+f16 channels_last": (meta_call(TRAIN, channels_last=True, param_dtype=F16), False),
    "train f32 deterministic": (meta_call(TRAIN), True),
    "train f64 deterministic": (meta_call(TRAIN, F64), True),
    "train f32 channels_last deterministic": (meta_call(TRAIN, channels_last=True), True),
    "sepconv f32 deterministic": (meta_call(SEPCONV), True),
    "train f32 C=1": (meta_call(TRAIN, channels=1), False),
    "train bf16 C=1": (meta_call(TRAIN, BF16, channels=1), False),
    "train f32 C=4": (meta_call(TRAIN, channels=4), False),
    "train f16 C=4": (meta_call(TRAIN, F16, channels=4), False),
    "train f32 C=32": (meta_call(TRAIN, channels=32), False),
    "train f32 K=1": (meta_call(TRAIN, k=1, padding=0), False),
    "train f32 K=3": (meta_call(TRAIN, k=3, padding=1), False),
    "sepconv f32 K=5": (meta_call(SEPCONV, k=5, padding=2), False),
    "sepconv f32 C=32": (meta_call(SEPCONV, channels=32, k=5, padding=2), False),
    "sepconv f32 channels_last": (meta_call(SEPCONV, channels_last=True), False),
    "sepconv f64": (meta_call(SEPCONV, F64, k=5, padding=2), False),
    "adacof f32 channels_last": (meta_call(ADACOF, channels_last=True), False),
    "train f32 views": (meta_call(TRAIN, views=True), False),
    "train f32 channels_last views": (meta_call(TRAIN, channels_last=True, views=True), False),
    "train f16 C=4 views": (meta_call(TRAIN, F16, channels=4, views=True), False),
    "feat f32 channels_last views": (meta_call(FEAT, channels_last=True, views=True), False),
    "sepconv f32 channels_last views": (meta_call(SEPCONV, channels_last=True, views=True), False),
    "train f32 frame grad only": (meta_call(TRAIN, grads=False), False),
    "train f32 no grads": (meta_call(TRAIN, grads=False), False),
}
# Only the frame requires a gradient / nothing does.
for t in TABLE_CALLS["train f32 frame grad only"][0][0][1:]:
    t.requires_grad_(False)
TABLE_CALLS["train f32 frame grad only"][0][0][0].requires_grad_(True)

# name -> (CPU forward, CPU backward, H200 forward, H200 backward)
EXPECTED_PLANS = {
    'train f32': ('pixels/avx2', 'sample_rows/avx2', 'pixels_rgb', 'tiled_rgb_lean_prefetch'),
    'infer f32': ('pixels/avx2', 'sample_rows/avx2', 'pixels_rgb', 'tiled_rgb_lean_prefetch'),
    'batch f32': ('pixels/avx2', 'sample_rows/avx2', 'pixels_rgb', 'tiled_rgb_lean_prefetch'),
    'feat f32': ('pixels/avx2', 'pixels_fused/avx2', 'pixels', 'tiled_prefetch'),
    'feat64 f32': ('pixels/avx2', 'pixels_fused/avx2', 'pixels', 'tiled_prefetch'),
    'sepconv f32': ('grid_taps_rows/avx2', 'grid_taps_rows/avx2', 'grid_taps_pass3', 'grid_taps_params+gather_input_grad'),
    'adacof f32': ('pixels/avx2', 'sample_rows/avx2', 'pixels_rgb', 'tiled_rgb_lean_prefetch'),
    'train bf16': ('pixels/avx2+float32_frame', 'sample_rows/avx2+float32_frame', 'pixels_rgb_packed_prefetch', 'tiled_rgb_lean_prefetch'),
    'infer bf16': ('pixels/avx2+float32_frame', 'sample_rows/avx2+float32_frame', 'pixels_rgb_packed_prefetch', 'tiled_rgb_lean_prefetch'),
    'batch bf16': ('pixels/avx2+float32_frame', 'sample_rows/avx2+float32_frame', 'pixels_rgb_packed_prefetch', 'tiled_rgb_lean_prefetch'),
    'feat bf16': ('pixels/avx2+float32_frame', 'pixels_fused/avx2+float32_frame', 'pixels', 'tiled_prefetch'),
    'feat64 bf16': ('pixels/avx2+float32_frame', 'pixels_fused/avx2+float32_frame', 'pixels', 'tiled_prefetch'),
    'sepconv bf16': ('grid_taps_rows/avx2+float32_frame', 'grid_taps_rows/avx2+float32_frame', 'grid_taps_pass3', 'grid_taps_params+gather_input_grad'),
    'adacof bf16': ('pixels/avx2+float32_frame', 'sample_rows/avx2+float32_frame', 'pixels_rgb_packed_prefetch', 'tiled_rgb_lean_prefetch'),
    'train f16': ('pixels/avx2+float32_frame', 'sample_rows/avx2+float32_frame', 'pixels_rgb_packed_prefetch', 'tiled_rgb_lean_prefetch'),
    'train f64': ('pixels/avx2', 'sample_rows/avx2', 'pixels_rgb', 'tiled_rgb_prefetch'),
    'train f32 channels_last': ('pixels/avx2', 'sample_rows/avx2', 'lane_pairs_rgb_staged', 'tiled_warp_staged_rgb'),
    'train bf16 channels_last': ('pixels/avx2+float32_frame', 'sample_rows/avx2+float32_frame', 'lane_pairs_rgb_staged', 'tiled_warp_staged_rgb'),
    'feat f32 channels_last': ('pixels/avx2', 'pixels_fused/avx2', 'pixels_vectorized8', 'lane_tile4'),
    'feat bf16 channels_last': ('pixels/avx2+float32_frame', 'pixels_fused/avx2+float32_frame', 'pixels_vectorized8', 'lane_tile4'),
    'feat f64 channels_last': ('pixels/avx2', 'pixels_fused/avx2', 'pixels', 'nchw_copies+tiled_prefetch'),
    'feat f32+bf16 channels_last': ('pixels/avx2', 'pixels_fused/avx2', 'pixels_vectorized8', 'lane_tile4'),
    'train f32+f16 channels_last': ('pixels/avx2', 'sample_rows/avx2', 'pixels_rgb', 'tiled_blocks3'),
    'train f32 deterministic': ('pixels/avx2', 'sample_rows/avx2', 'pixels_rgb', 'tiled_rgb_lean_prefetch+fixed_point'),
    'train f64 deterministic': ('pixels/avx2', 'sample_rows/avx2', 'pixels_rgb', 'pixels_blocks3+fixed_point'),
    'train f32 channels_last deterministic': ('pixels/avx2', 'sample_rows/avx2', 'lane_pairs_rgb_staged', 'tiled_warp_staged_rgb+fixed_point'),
    'sepconv f32 deterministic': ('grid_taps_rows/avx2', 'grid_taps_rows/avx2', 'grid_taps_pass3', 'grid_taps_params+gather_input_grad'),
    'train f32 C=1': ('pixels/avx2', 'sample_rows/avx2', 'pixels_prefetch', 'tiled_prefetch'),
    'train bf16 C=1': ('pixels/avx2+float32_frame', 'sample_rows/avx2+float32_frame', 'staged_chunk16', 'tiled_prefetch'),
    'train f32 C=4': ('pixels/avx2', 'sample_rows/avx2', 'pixels_prefetch', 'tiled_prefetch'),
    'train f16 C=4': ('pixels/avx2+float32_frame', 'sample_rows/avx2+float32_frame', 'staged_chunk16', 'tiled_prefetch'),
    'train f32 C=32': ('pixels/avx2', 'pixels_fused/avx2', 'pixels', 'tiled_prefetch'),
    'train f32 K=1': ('pixels/avx2', 'sample_rows/avx2', 'pixels', 'tiled'),
    'train f32 K=3': ('pixels/avx2', 'sample_rows/avx2', 'pixels', 'tiled'),
    'sepconv f32 K=5': ('grid_taps_rows/avx2', 'grid_taps_rows/avx2', 'grid_taps_pass3', 'grid_taps_params+gather_input_grad'),
    'sepconv f32 C=32': ('grid_taps_rows/avx2', 'grid_taps_rows/avx2', 'grid_taps_pass4', 'tiled_prefetch'),
    'sepconv f32 channels_last': ('grid_taps_rows/avx2', 'grid_taps_rows/avx2', 'grid_taps_pass3', 'grid_taps_params+gather_input_grad'),
    'sepconv f64': ('grid_taps_rows/avx2', 'grid_taps_rows/avx2', 'pixels_rgb', 'tiled_rgb_prefetch'),
    'adacof f32 channels_last': ('pixels/avx2', 'sample_rows/avx2', 'lane_pairs_rgb_staged', 'tiled_warp_staged_rgb'),
    'train f32 views': ('pixels/avx2', 'sample_rows/avx2', 'pixels_rgb', 'tiled_rgb_lean_prefetch'),
    'train f32 channels_last views': ('pixels/avx2', 'sample_rows/avx2', 'pixels_rgb', 'tiled_warp_staged_rgb'),
    'train f16 C=4 views': ('pixels/avx2+float32_frame', 'sample_rows/avx2+float32_frame', 'pixels', 'tiled_prefetch'),
    'feat f32 channels_last views': ('pixels/avx2', 'pixels_fused/avx2', 'pixels_vectorized8', 'lane_tile4'),
    'sepconv f32 channels_last views': ('pixels/avx2', 'grid_taps_rows/avx2', 'pixels', 'grid_taps_params+gather_input_grad'),
    'train f32 frame grad only': ('pixels/avx2', 'sample_rows/avx2', 'pixels_rgb', 'tiled_rgb_lean_prefetch'),
    'train f32 no grads': ('pixels/avx2', 'none', 'pixels_rgb', 'none'),
}


def test_plan_table():
    """The plans of the representative calls, for an AVX2 CPU with 2 threads and for an H200."""
    actual = {}
    for name, (call, deterministic) in TABLE_CALLS.items():
        cpu, cuda = plans(call, CPU, deterministic), plans(call, H200, deterministic)
        actual[name] = (cpu.forward, cpu.backward, cuda.forward, cuda.backward)
    lines = [f"    {name!r}: {value!r}," for name, value in actual.items()]
    assert actual == EXPECTED_PLANS, "the plans changed; the table now reads:\n" + "\n".join(lines)


# Each keyword of the policy and a call whose plan it changes: (keyword, value, call, device,
# default plans, plans under the policy).
POLICY_CASES = [
    ("grid_taps", False, meta_call(SEPCONV, k=5, padding=2), H200,
     ("grid_taps_pass3", "grid_taps_params+gather_input_grad"), ("pixels_rgb", "tiled_rgb_lean_prefetch")),
    ("grid_taps", False, meta_call(SEPCONV), CPU,
     ("grid_taps_rows/avx2", "grid_taps_rows/avx2"), ("pixels/avx2", "sample_rows/avx2")),
    ("plain_forward", True, meta_call(TRAIN, F16, channels=4), H200,
     ("staged_chunk16", "tiled_prefetch"), ("pixels_prefetch", "tiled_prefetch")),
    ("plain_forward", True, meta_call(TRAIN, channels_last=True), H200,
     ("lane_pairs_rgb_staged", "tiled_warp_staged_rgb"), ("pixels_rgb", "tiled_warp_staged_rgb")),
    ("plain_forward", True, meta_call(SEPCONV), H200,
     ("grid_taps_pass3", "grid_taps_params+gather_input_grad"), ("pixels", "grid_taps_params+gather_input_grad")),
    # The exact-RGB forward prefetches 2-byte per-pixel values only.
    ("prefetch", False, meta_call(TRAIN, F16), H200,
     ("pixels_rgb_packed_prefetch", "tiled_rgb_lean_prefetch"), ("pixels_rgb_packed", "tiled_rgb_lean")),
    ("packed_frame", False, meta_call(TRAIN, BF16), H200,
     ("pixels_rgb_packed_prefetch", "tiled_rgb_lean_prefetch"), ("pixels_rgb_prefetch", "tiled_rgb_lean_prefetch")),
    ("prefetch", False, meta_call(TRAIN), H200,
     ("pixels_rgb", "tiled_rgb_lean_prefetch"), ("pixels_rgb", "tiled_rgb_lean")),
    ("input_grad_tile", False, meta_call(TRAIN), H200,
     ("pixels_rgb", "tiled_rgb_lean_prefetch"), ("pixels_rgb", "pixels_blocks3")),
    ("lean_rgb_backward", False, meta_call(TRAIN), H200,
     ("pixels_rgb", "tiled_rgb_lean_prefetch"), ("pixels_rgb", "tiled_rgb_prefetch")),
    ("warp_staging", False, meta_call(TRAIN, channels_last=True), H200,
     ("lane_pairs_rgb_staged", "tiled_warp_staged_rgb"), ("lane_pairs_rgb_staged", "tiled_blocks3")),
    ("vector_loads", False, meta_call(FEAT, channels_last=True), H200,
     ("pixels_vectorized8", "lane_tile4"), ("pixels", "lane_tile4")),
    ("channel_lanes", False, meta_call(FEAT, channels_last=True), H200,
     ("pixels_vectorized8", "lane_tile4"), ("pixels_vectorized8", "nchw_copies+tiled_prefetch")),
    ("lane_tile", False, meta_call(FEAT, channels_last=True), H200,
     ("pixels_vectorized8", "lane_tile4"), ("pixels_vectorized8", "channel_lanes4")),
    ("cpu_scratch_mb", 0, meta_call(FEAT), CPU,
     ("pixels/avx2", "pixels_fused/avx2"), ("pixels/avx2", "pixels_two_pass/avx2")),
    ("cpu_isa", "baseline", meta_call(TRAIN), CPU,
     ("pixels/avx2", "sample_rows/avx2"), ("pixels/baseline", "sample_rows/baseline")),
    ("cpu_float32_frame", False, meta_call(TRAIN, F16), CPU,
     ("pixels/avx2+float32_frame", "sample_rows/avx2+float32_frame"), ("pixels/avx2", "sample_rows/avx2")),
    ("cpu_sample_rows", False, meta_call(TRAIN), CPU,
     ("pixels/avx2", "sample_rows/avx2"), ("pixels/avx2", "pixels_fused/avx2")),
]


@pytest.mark.parametrize("keyword, value, call, device, default, changed", POLICY_CASES,
                         ids=[f"{c[0]}-{'cpu' if isinstance(c[3], CpuFacts) else 'h200'}" for c in POLICY_CASES])
def test_policy_changes_plan(keyword, value, call, device, default, changed):
    assert plans(call, device) == default
    with edsc_ext.kernel_policy(**{keyword: value}) as policy:
        assert getattr(policy, keyword) == value and edsc_ext.current_kernel_policy() == policy
        assert plans(call, device) == changed
    assert plans(call, device) == default


@pytest.mark.parametrize("channels, dtype, expected", [
    (8, F32, "channel_lanes1"), (16, BF16, "channel_lanes2"), (24, F16, "channel_lanes4"),
    (64, F32, "channel_lanes8"), (256, F32, "channel_lanes32"), (320, F32, "channel_lanes32"),
    (12, F32, "nchw_copies+tiled_prefetch"), (32, F64, "nchw_copies+tiled_prefetch")])
def test_channel_lanes_plans(channels, dtype, expected):
    """With kernel_policy(channel_lanes=True) (the default) and the lane tile off (which takes 8 to 64
    channels with the input gradient, below), the H200 plan of a channels_last backward of a
    multiple of 8 channels (float32 or a half type) gives a pixel one thread per block of 8 channels,
    rounded up to a power of two, at most a warp; other counts and float64 run on NCHW copies. A
    deterministic input gradient (float atomics would not be) runs on NCHW copies too; without the
    input gradient the lanes stay."""
    with edsc_ext.kernel_policy(lane_tile=False):
        channel_lanes_plans(channels, dtype, expected)
    if channels > 64:  # the lane tile's default stops at 4 lanes of two blocks
        channel_lanes_plans(channels, dtype, expected)


def channel_lanes_plans(channels, dtype, expected):
    call = meta_call(FEAT, dtype, channels_last=True, channels=channels)
    assert edsc_ext.current_kernel_policy().channel_lanes
    assert plans(call, H200).backward == expected
    assert plans(call, H200, deterministic=True).backward.startswith("nchw_copies+")
    (frame, *rest), kwargs = call
    frame.requires_grad_(False)
    assert plans(((frame, *rest), kwargs), H200, deterministic=True).backward.startswith(
        "channel_lanes" if "lanes" in expected else "nchw_copies+")
    # Mixed precision (a float32 frame, bfloat16 per-pixel tensors) reads them as they are.
    if dtype == F32:
        assert plans(meta_call(FEAT, F32, channels_last=True, channels=channels, param_dtype=BF16),
                     H200).backward == expected
    with edsc_ext.kernel_policy(channel_lanes=False):
        assert plans(call, H200).backward.startswith("nchw_copies+")


# A Turing-like device: 64 KB of shared memory a block, no cp.async.
SM75 = CudaDeviceFacts(7, 5, 65536)


@pytest.mark.parametrize("channels, dtype, lanes, tile_lanes", [
    (8, F32, 1, 1), (16, BF16, 2, 2), (24, F16, 4, 4), (32, F32, 4, 4), (40, F32, 8, 4), (64, F32, 8, 4),
    (64, BF16, 8, 4)])
def test_lane_tile_plans(channels, dtype, lanes, tile_lanes):
    """kernel_policy(lane_tile=True), the default: the channel lanes' calls of 8 to 64 channels that want
    the input gradient take the lane tile on at most 4 lanes a pixel (beyond 32 channels a lane takes two
    blocks of 8), deterministic ones too (its fixed point); without the input gradient the lanes stay; on
    a device with 64 KB of shared memory a block too (fewer channels a pass), but not where one block of
    channels does not fit (a wide dilation)."""
    call = meta_call(FEAT, dtype, channels_last=True, channels=channels)
    assert edsc_ext.current_kernel_policy().lane_tile
    with edsc_ext.kernel_policy(lane_tile=True):
        assert plans(call, H200).backward == f"lane_tile{tile_lanes}"
        assert plans(call, H200, deterministic=True).backward == f"lane_tile{tile_lanes}+fixed_point"
        assert plans(call, SM75).backward == f"lane_tile{tile_lanes}"
        (frame, *rest), kwargs = call
        frame.requires_grad_(False)
        assert plans(((frame, *rest), kwargs), H200).backward == f"channel_lanes{lanes}"
        wide = meta_call(FEAT, dtype, channels_last=True, channels=channels, dilation=40, padding=80)
        assert plans(wide, SM75).backward == f"channel_lanes{lanes}"


@pytest.mark.parametrize("channels, lanes", [(72, 16), (128, 16), (256, 32)])
def test_the_lane_tile_leaves_more_than_64_channels_to_the_channel_lanes(channels, lanes):
    """The lane tile takes at most 4 lanes a pixel (with 8 its tiles are 4 pixels wide: their halo cost
    more than the atomics saved, 1.35-1.45x the channel lanes' time at 64 channels) of at most two blocks
    of 8 channels each: more channels keep the channel lanes."""
    call = meta_call(FEAT, F32, channels_last=True, channels=channels)
    with edsc_ext.kernel_policy(lane_tile=True):
        assert plans(call, H200).backward == f"channel_lanes{lanes}"
        assert plans(call, H200, deterministic=True).backward.startswith("nchw_copies+")




def test_every_cuda_plan_names_a_variant_compiled_for_its_call():
    """The CUDA planner picks the bilinear kernels' variant from the tables in cuda_plan.h and checks
    that the row is compiled for the call (find_variant); the launchers instantiate only those rows.
    Over dtypes, layouts, channel counts, kernel sizes, offsets or none, determinism, the policy's
    extremes and two devices, no plan may name a row its launcher lacks (the planner raises)."""
    dtypes = [(F64, None), (F32, None), (F16, None), (BF16, None), (F32, BF16), (F32, F16)]
    policies = [{}, {f.name: False for f in dataclasses.fields(edsc_ext.KernelPolicy) if f.type in ("bool", bool)},
                {"lane_tile": False}, {"prefetch": False}]
    seen = set()
    for case in (TRAIN, SEPCONV):
        for k in (1, 3, 5):
            for channels in (1, 2, 3, 4, 6, 8, 32):
                for channels_last in (False, True):
                    for dtype, param_dtype in dtypes:
                        call = meta_call(case, dtype, channels_last=channels_last, channels=channels,
                                         param_dtype=param_dtype, k=k, padding=k // 2)
                        for policy in policies:
                            with edsc_ext.kernel_policy(**policy):
                                for device in (H200, SM75):
                                    for deterministic in (False, True):
                                        forward, backward = plans(call, device, deterministic)
                                        assert forward and backward
                                        seen.update((forward, backward))
    # RGB whose tile holds fewer than 3 channels a pass (a wide dilation): blocks of 3, not exact RGB.
    seen.update(plans(meta_call(TRAIN, channels_last=True, dilation=8), H200))
    # The sweep reached the variants of the tables (by name: each row's is its own), but those that
    # need an alignment a meta tensor does not have (lane pairs unstaged, the staged forward's
    # 4-byte copies).
    parts = {part for plan in seen for part in plan.split("+")}
    for name in ("pixels", "pixels_rgb", "pixels_rgb_prefetch", "pixels_rgb_packed", "pixels_rgb_packed_prefetch",
                 "pixels_prefetch", "pixels_vectorized",
                 "pixels_vectorized8", "grid_taps_pass4", "grid_taps_pass3", "grid_taps_pass2", "grid_taps_pass1",
                 "staged_chunk16", "lane_pairs_staged", "lane_pairs_rgb_staged"):
        assert name in seen, name
    for name in ("pixels", "pixels_blocks3", "tiled", "tiled_blocks3", "tiled_rgb_prefetch", "tiled_rgb_lean_prefetch",
                 "tiled_warp_staged",
                 "tiled_warp_staged_blocks3", "tiled_warp_staged_rgb", "tiled_prefetch", "channel_lanes1",
                 "lane_tile1", "lane_tile4", "grid_taps_params", "gather_input_grad"):
        assert name in parts, name


def test_every_policy_keyword_has_a_plan_test():
    assert {f.name for f in dataclasses.fields(edsc_ext.KernelPolicy)} == {c[0] for c in POLICY_CASES}


def compiled_values():
    """The compiled library's policy by name (torch.ops.edsc_ext.get_kernel_policy)."""
    names, values = torch.ops.edsc_ext.get_kernel_policy()
    return dict(zip(names, values))


def test_policy_is_the_compiled_librarys_switch_table():
    """KernelPolicy is made from the compiled switch table (src/kernel_policy.h): its fields, in order,
    are the switches of the set/get ops, its defaults theirs, and its docstring carries each switch's
    description, written once in C++ (the op kernel_policy_switches)."""
    switches = json.loads(torch.ops.edsc_ext.kernel_policy_switches())
    fields = dataclasses.fields(edsc_ext.KernelPolicy)
    assert [f.name for f in fields] == [s["name"] for s in switches] == list(compiled_values())
    assert [f.default for f in fields] == [s["default"] for s in switches]
    assert {s["kind"] for s in switches} == {"flag", "count", "choice"}
    doc = " ".join(edsc_ext.KernelPolicy.__doc__.split())
    for s in switches:
        assert f"{s['name']}: {' '.join(s['description'].split())}" in doc, s["name"]
    # The description Python used to restate had drifted from the C++ one ("4" against "4 or 8").
    assert "block of 4 or 8 channels" in next(s["description"] for s in switches if s["name"] == "vector_loads")
    arguments = [a.name for a in torch.ops.edsc_ext.set_kernel_policy.default._schema.arguments]
    returns = [r.name for r in torch.ops.edsc_ext.get_kernel_policy.default._schema.returns]
    assert arguments == returns == ["names", "values"]


def test_policy_ops_check_names_and_values():
    """The set op takes switches by name and refuses an unknown one or a value out of range."""
    names, values = torch.ops.edsc_ext.get_kernel_policy()
    with pytest.raises(RuntimeError, match="unknown switch 'grid_tap'; the switches are grid_taps, plain_forward"):
        torch.ops.edsc_ext.set_kernel_policy(["grid_tap"], [0])
    with pytest.raises(RuntimeError, match="grid_taps must be 0 or 1, got 2"):
        torch.ops.edsc_ext.set_kernel_policy(["grid_taps"], [2])
    with pytest.raises(RuntimeError, match=r"cpu_scratch_mb must be in \[0, 2147483647\], got -1"):
        torch.ops.edsc_ext.set_kernel_policy(["cpu_scratch_mb"], [-1])
    assert torch.ops.edsc_ext.get_kernel_policy() == (names, values)


def test_policy_reaches_the_op():
    """The compiled op reads the policy the Python context set (one value for the process), and the
    block restores it, nested or left by an exception."""
    default = compiled_values()
    assert default == {"grid_taps": 1, "plain_forward": 0, "prefetch": 1, "packed_frame": 1, "input_grad_tile": 1,
                       "warp_staging": 1, "vector_loads": 1, "channel_lanes": 1, "lane_tile": 1,
                       "lean_rgb_backward": 1, "cpu_scratch_mb": 256, "cpu_isa": 0, "cpu_float32_frame": 1, "cpu_sample_rows": 1}
    assert _policy.compiled_kernel_policy() == edsc_ext.KernelPolicy()
    with edsc_ext.kernel_policy(grid_taps=False, cpu_scratch_mb=7):
        assert compiled_values() == {**default, "grid_taps": 0, "cpu_scratch_mb": 7}
        with edsc_ext.kernel_policy(cpu_isa="baseline", grid_taps=True, vector_loads=False, channel_lanes=False):
            assert compiled_values() == {**default, "vector_loads": 0, "channel_lanes": 0, "cpu_scratch_mb": 7,
                                         "cpu_isa": 1}
            assert _policy.compiled_kernel_policy() == edsc_ext.current_kernel_policy()
        assert compiled_values() == {**default, "grid_taps": 0, "cpu_scratch_mb": 7}
        with pytest.raises(RuntimeError, match="inside"):
            with edsc_ext.kernel_policy(plain_forward=True):
                raise RuntimeError("inside")
        assert edsc_ext.current_kernel_policy().plain_forward is False
    assert compiled_values() == default


def test_policy_is_process_wide():
    """Another thread (as autograd's backward threads are) runs under the policy that is current."""
    seen = []
    call = meta_call(SEPCONV)
    with edsc_ext.kernel_policy(grid_taps=False):
        thread = threading.Thread(target=lambda: seen.append(plans(call, CPU)))
        thread.start()
        thread.join()
    assert seen == [("pixels/avx2", "sample_rows/avx2")]


def test_policy_blocks_of_two_threads_do_not_mix():
    """Blocks entered from two threads run one after the other, each seeing only its own change."""
    errors = []
    barrier = threading.Barrier(2)

    def run(keyword):
        barrier.wait()
        for _ in range(50):
            with edsc_ext.kernel_policy(**{keyword: False}) as policy:
                current = edsc_ext.current_kernel_policy()
                if current != policy or sum(not getattr(current, k) for k in ("prefetch", "warp_staging")) != 1:
                    errors.append(current)
    threads = [threading.Thread(target=run, args=(k,)) for k in ("prefetch", "warp_staging")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and edsc_ext.current_kernel_policy() == edsc_ext.KernelPolicy()


def test_policy_arguments_are_checked():
    with pytest.raises(TypeError, match="unknown keyword.*grid_tap"):
        with edsc_ext.kernel_policy(grid_tap=False):
            pass
    with pytest.raises(TypeError, match="grid_taps must be a bool"):
        with edsc_ext.kernel_policy(grid_taps=0):
            pass
    with pytest.raises(ValueError, match="cpu_scratch_mb must be an int >= 0"):
        with edsc_ext.kernel_policy(cpu_scratch_mb=-1):
            pass
    with pytest.raises(ValueError, match="cpu_isa must be 'auto' or 'baseline'"):
        with edsc_ext.kernel_policy(cpu_isa="avx512"):
            pass
    assert edsc_ext.current_kernel_policy() == edsc_ext.KernelPolicy()


def test_policy_from_environment():
    """The EDSC_EXT_* switches of earlier versions set the initial policy (read once, at import)."""
    assert _policy._from_environment({}) == edsc_ext.KernelPolicy()
    policy = _policy._from_environment({
        "EDSC_EXT_GRID_TAPS": "0", "EDSC_EXT_FORWARD": "plain", "EDSC_EXT_PREFETCH": "0",
        "EDSC_EXT_INPUT_GRAD": "global", "EDSC_EXT_WARP_STAGING": "0", "EDSC_EXT_CPU_SCRATCH_MB": "16",
        "EDSC_EXT_CPU_ISA": "baseline"})
    assert policy == edsc_ext.KernelPolicy(grid_taps=False, plain_forward=True, prefetch=False,
                                           input_grad_tile=False, warp_staging=False, cpu_scratch_mb=16,
                                           cpu_isa="baseline")
    with pytest.raises(ValueError, match="EDSC_EXT_CPU_SCRATCH_MB"):
        _policy._from_environment({"EDSC_EXT_CPU_SCRATCH_MB": "lots"})


def test_policy_under_torch_compile():
    """A compiled function reads the policy when it runs, not when it was compiled."""
    case = B.CPU_CASES[4]  # sepconv, no offsets
    inputs = case.make_inputs(F32, "cpu", seed=0)
    compiled = torch.compile(lambda *t: edsc_ext.deform_sepconv(*t, **case.kwargs()), backend="eager",
                             fullgraph=True)
    grid = compiled(*inputs)
    with edsc_ext.kernel_policy(grid_taps=False):
        bilinear = compiled(*inputs)
        assert edsc_ext._plan(*inputs, **case.kwargs()).forward.startswith("pixels/")
    torch.testing.assert_close(grid, bilinear, rtol=1e-5, atol=1e-6)


def test_policy_block_inside_a_compiled_function():
    """A policy block inside compiled code still sets the policy for the op calls in it, and restores it."""
    case = B.CPU_CASES[4]  # sepconv, no offsets
    inputs = case.make_inputs(F32, "cpu", seed=0)
    seen = []

    def layer(*t):
        with edsc_ext.kernel_policy(grid_taps=False):
            seen.append(edsc_ext.current_kernel_policy().grid_taps)
            return edsc_ext.deform_sepconv(*t, **case.kwargs())

    out = torch.compile(layer, backend="eager")(*inputs)
    assert seen and not any(seen)
    assert edsc_ext.current_kernel_policy().grid_taps
    torch.testing.assert_close(out, edsc_ext.deform_sepconv(*inputs, **case.kwargs()), rtol=1e-5, atol=1e-6)


def test_import_does_not_load_dynamo():
    """``import edsc_ext`` leaves torch._dynamo unloaded (its import takes seconds); the policy's
    graph-break wrapper is made once a process has loaded it."""
    code = "import sys, edsc_ext; assert 'torch._dynamo' not in sys.modules, 'torch._dynamo was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))


def test_plan_arguments_are_checked():
    args, kwargs = meta_call(TRAIN)
    with pytest.raises(ValueError, match="meta tensors need device"):
        edsc_ext._plan(*args, **kwargs)
    with pytest.raises(ValueError, match="offset must have 2\\*KH\\*KW = 50 channels"):
        edsc_ext._plan(args[0], args[1], args[2], args[4], args[4], **kwargs, device=H200)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_plan_of_this_gpu():
    """A CUDA tensor is planned for its own device, with the facts the op reads."""
    case = B.CASES[0].tiny()
    inputs = case.make_inputs(F32, "cuda", seed=0)
    facts = CudaDeviceFacts.of(torch.device("cuda"))
    assert edsc_ext._plan(*inputs, **case.kwargs()) == edsc_ext._plan(*inputs, **case.kwargs(), device=facts)
