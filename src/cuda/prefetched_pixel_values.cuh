// L2 prefetch of a warp's per-pixel values in NCHW-contiguous calls with 5x5 kernels.
//
// The plain NCHW kernels read each tap's offsets and mask from global memory when the tap comes:
// streaming data, read once, and each tap waits for its offsets before it can address the frame.
// ncu showed the forward waiting mostly on those loads (long scoreboard) at 16 resident warps per
// SM. In NCHW a warp's 32 consecutive pixels hold one contiguous run (a 128-byte line in float32)
// of each of the 2K + 3K^2 = 85 planes, so three prefetch instructions per lane, the lanes
// splitting the planes, put every line the warp will read in flight at once; the loads that follow
// wait on L2 rather than DRAM (BENCHMARKS.md: prefetching into L1, or a row at a time, was no
// better). The planner decides where it runs (CudaForwardPlan::prefetch, CudaBackwardPlan::prefetch;
// the policy's prefetch=False turns it off).
#pragma once

#include "warp_staged_values.cuh"

namespace edsc_ext {

__device__ __forceinline__ void prefetch_l2(const void* address) {
#ifdef __CUDA_ARCH__
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(address));
#else
  (void)address;  // a hint: nothing to do where the device code runs on the CPU (tests/cuda_emulation)
#endif
}

// Prefetches into L2 the lines of a warp's run of output pixels, from global pixel `first` to
// `last` (n * H_out * W_out + pixel, both inclusive, in at most two images), in every plane of the
// present per-pixel tensors: plane m < 2K + 3K^2 is vertical m, horizontal m - K, offset m - 2K
// (split offsets: dy, then dx), then mask. Lane `lane` takes planes lane, lane + 32, ...
template <int K, typename scalar_t, typename param_t>
__device__ __forceinline__ void prefetch_warp_planes_l2(const DeformSepconvParams<scalar_t, int32_t, param_t>& p,
                                                        int32_t first, int32_t last, int lane) {
  constexpr int kPlanes = 2 * K + 3 * K * K;
  const int32_t hw = p.height_out * p.width_out;
  const int32_t n_first = first / hw, pixel_first = first - n_first * hw;
  const int32_t n_last = last / hw, pixel_last = last - n_last * hw;
  EDSC_UNROLL
  for (int q = lane; q < kPlanes; q += kWarpSize) {
    const param_t* base;
    int32_t planes, m;
    if (q < K) {
      base = p.vertical, planes = K, m = q;
    } else if (q < 2 * K) {
      base = p.horizontal, planes = K, m = q - K;
    } else if (q < 2 * K + 2 * K * K) {
      m = q - 2 * K;
      if (p.offset_dx == nullptr) {
        base = p.offset, planes = 2 * K * K;
      } else {
        base = m < K * K ? p.offset : p.offset_dx, planes = K * K, m = m < K * K ? m : m - K * K;
      }
    } else {
      base = p.mask, planes = K * K, m = q - 2 * K - 2 * K * K;
    }
    if (base == nullptr) continue;
    const param_t* a = base + (n_first * planes + m) * hw + pixel_first;
    const param_t* b = base + (n_last * planes + m) * hw + pixel_last;
    prefetch_l2(a);
    // A run that is not line-aligned (or 2-byte values past one line) spans a second line.
    if ((reinterpret_cast<uintptr_t>(a) >> 7) != (reinterpret_cast<uintptr_t>(b) >> 7)) prefetch_l2(b);
  }
}

}  // namespace edsc_ext
