// The kernel policy: which kernel families the planners (src/cpu/deform_sepconv_plan.h,
// src/cuda/deform_sepconv_plan.h) may choose, and the CPU backward's scratch budget. Python sets it
// with edsc_ext.kernel_policy(...) (edsc_ext/_policy.py, README "Kernel policy"); it is one
// process-wide value, not per thread, because the backward of a call runs on autograd's own
// threads. Each op call reads it once, with one atomic load, so a call sees one consistent policy
// and changing it never races with calls in flight. Nothing here reads the environment:
// edsc_ext/_policy.py turns the EDSC_EXT_* variables into the initial policy, once, at import.
#pragma once

#include <cstdint>

namespace edsc_ext {

struct KernelPolicy {
  // Calls without offsets or dilation may take the grid-tap kernels (CPU: rows, CUDA: shared-memory
  // windows); false sends them to the bilinear kernels.
  bool grid_taps = true;
  // CUDA: every forward takes the one-thread-per-(pixel, channel block) kernel, the grid-tap,
  // staged and lane-pair forwards none.
  bool plain_forward = false;
  // CUDA, NCHW 5x5: each warp prefetches its per-pixel values into L2 first.
  bool prefetch = true;
  // CUDA backward: the input gradient through the shared-memory tile; false: global atomics.
  bool input_grad_tile = true;
  // CUDA, channels_last 5x5 backward: per-pixel values staged through shared memory a warp at a time.
  bool warp_staging = true;
  // CUDA, channels_last per-pixel forward of a multiple of 4 channels: each bilinear corner's block
  // of 4 channels in one vector load; false loads them one by one.
  bool vector_loads = true;
  // CUDA, channels_last backward of a multiple of 8 channels: the channel lanes (adjacent threads
  // share a pixel's channels in blocks read with vector loads) instead of NCHW copies.
  bool channel_lanes = true;
  // CPU: the baseline (x86-64 SSE2) loops even where torch reports AVX2 or better.
  bool cpu_baseline = false;
  // CPU backward: megabytes of scratch planes for splitting one image over threads; beyond it (or
  // at 0) the input gradient takes a pass per (image, channel block) instead.
  int64_t cpu_scratch_mb = 256;

  bool operator==(const KernelPolicy& other) const {
    return grid_taps == other.grid_taps && plain_forward == other.plain_forward && prefetch == other.prefetch &&
           input_grad_tile == other.input_grad_tile && warp_staging == other.warp_staging &&
           vector_loads == other.vector_loads && channel_lanes == other.channel_lanes &&
           cpu_baseline == other.cpu_baseline && cpu_scratch_mb == other.cpu_scratch_mb;
  }
};

// The process-wide policy (one atomic load) and its replacement (one atomic store).
KernelPolicy kernel_policy();
void set_kernel_policy(const KernelPolicy& policy);

}  // namespace edsc_ext
