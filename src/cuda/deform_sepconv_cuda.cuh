// Shared by the CUDA translation units of deform_sepconv (forward, backward): headers, the
// device facts the planners take, the exact-block view of a call's params and the asynchronous copies.
#pragma once

#include "cuda_host.cuh"
#include "cuda_plan.h"
#include "deform_sepconv_call.h"
#include "launch.cuh"

namespace edsc_ext {

// The facts of device `device_index` that plan_cuda_forward / plan_cuda_backward take.
CudaDeviceFacts cuda_device_facts(int64_t device_index);

// The kernels' view of a call's params: with kExactBlock (the call has exactly kChannelBlock
// channels; the hosts choose it for RGB) a copy whose channel count is a compile-time constant,
// which removes the per-channel branches from the taps; otherwise the params themselves.
template <bool kExactBlock, int kChannelBlock, typename Params>
__device__ __forceinline__ decltype(auto) with_exact_block(const Params& params) {
  if constexpr (kExactBlock) {
    Params exact = params;
    exact.channels = kChannelBlock;
    return exact;
  } else {
    return (params);  // a reference
  }
}

// Asynchronous global-to-shared copies (cp.async, sm_80+) of kBytes = 4, 8 or 16 bytes, the
// bytes past src_bytes zero-filled; they land by commit group (copy_async_wait). The staged
// kernels use them to have the next values in flight while they compute with the current ones.
template <int kBytes>
__device__ __forceinline__ void copy_async(void* shared, const void* global, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned int dst = static_cast<unsigned int>(__cvta_generic_to_shared(shared));
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global), "r"(src_bytes) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(global), "n"(kBytes), "r"(src_bytes)
                 : "memory");
  }
#else
  // Before sm_80: a plain (synchronous) copy with cp.async's zero fill.
  unsigned char* d = static_cast<unsigned char*>(shared);
  const unsigned char* s = static_cast<const unsigned char*>(global);
  for (int b = 0; b < kBytes; ++b) d[b] = b < src_bytes ? s[b] : 0;
#endif
}

__device__ __forceinline__ void copy_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most `pending` (a constant after unrolling) commit groups are still in flight.
__device__ __forceinline__ void copy_async_wait(int pending) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  switch (pending) {
    case 0:
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
      break;
    case 1:
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
      break;
    case 2:
      asm volatile("cp.async.wait_group 2;\n" ::: "memory");
      break;
    case 3:
      asm volatile("cp.async.wait_group 3;\n" ::: "memory");
      break;
    default:
      asm volatile("cp.async.wait_group 4;\n" ::: "memory");
      break;
  }
#endif
}

}  // namespace edsc_ext
