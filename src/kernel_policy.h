// The kernel policy: which kernel families the planners (src/cpu/cpu_plan.h,
// src/cuda/cuda_plan.h) may choose, and the CPU backward's scratch budget. Python sets it
// with edsc_ext.kernel_policy(...) (edsc_ext/_policy.py, README "Kernel policy"); it is one
// process-wide value, not per thread, because the backward of a call runs on autograd's own
// threads. Each op call reads it once, with one atomic load, so a call sees one consistent policy
// and changing it never races with calls in flight. Nothing here reads the environment:
// edsc_ext/_policy.py turns the EDSC_EXT_* variables into the initial policy, once, at import.
#pragma once

#include <cstdint>

namespace edsc_ext {

// The switches, each spelled here once: (name, default). The struct's fields, the ops'
// set_kernel_policy / get_kernel_policy schemas and arguments (src/deform_sepconv.cpp) and the
// packed word (src/kernel_policy.cpp) are made from this list.
//   grid_taps: calls without offsets or dilation may take the grid-tap kernels (CPU: rows, CUDA:
//     shared-memory windows); false sends them to the bilinear kernels.
//   plain_forward: CUDA: every forward takes the one-thread-per-(pixel, channel block) kernel, the
//     grid-tap, staged and lane-pair forwards none.
//   prefetch: CUDA, NCHW 5x5: each warp prefetches its per-pixel values into L2 first.
//   input_grad_tile: CUDA backward: the input gradient through the shared-memory tile; false: global
//     atomics.
//   warp_staging: CUDA, channels_last 5x5 backward: per-pixel values staged through shared memory a
//     warp at a time.
//   vector_loads: CUDA, channels_last per-pixel forward of a multiple of 4 channels: each bilinear
//     corner's block of 4 channels in one vector load; false loads them one by one.
//   channel_lanes: CUDA, channels_last backward of a multiple of 8 channels: the channel lanes
//     (adjacent threads share a pixel's channels in blocks read with vector loads) instead of NCHW
//     copies.
//   cpu_baseline: CPU: the baseline (x86-64 SSE2) loops even where the CPU has AVX2 + FMA.
#define EDSC_KERNEL_POLICY_SWITCHES(X) \
  X(grid_taps, true)                   \
  X(plain_forward, false)              \
  X(prefetch, true)                    \
  X(input_grad_tile, true)             \
  X(warp_staging, true)                \
  X(vector_loads, true)                \
  X(channel_lanes, true)               \
  X(cpu_baseline, false)

struct KernelPolicy {
#define EDSC_POLICY_FIELD(name, default_value) bool name = default_value;
  EDSC_KERNEL_POLICY_SWITCHES(EDSC_POLICY_FIELD)
#undef EDSC_POLICY_FIELD
  // CPU backward: megabytes of scratch planes for splitting one image over threads; beyond it (or
  // at 0) the input gradient takes a pass per (image, channel block) instead.
  int64_t cpu_scratch_mb = 256;

  // Spelled out: torch's extension builds before 2.14 compile as C++17, which has no defaulted ==.
  bool operator==(const KernelPolicy& other) const {
#define EDSC_POLICY_EQUAL(name, default_value) name == other.name&&
    return EDSC_KERNEL_POLICY_SWITCHES(EDSC_POLICY_EQUAL) cpu_scratch_mb == other.cpu_scratch_mb;
#undef EDSC_POLICY_EQUAL
  }
};

// The process-wide policy (one atomic load) and its replacement (one atomic store).
KernelPolicy kernel_policy();
void set_kernel_policy(const KernelPolicy& policy);

}  // namespace edsc_ext
