// Shared by the CUDA translation units of deform_sepconv (forward, backward): headers, the
// device facts the planners take, the dispatch of a plan's variant row and the asynchronous copies.
#pragma once

#include <cstddef>
#include <iterator>
#include <stdexcept>
#include <type_traits>

#include "cuda_host.cuh"
#include "cuda_plan.h"
#include "deform_sepconv_call.h"
#include "deform_sepconv_tensors.h"
#include "kernel_policy.h"
#include "launch.cuh"

namespace edsc_ext {

// The facts of device `device_index` that plan_cuda_forward / plan_cuda_backward take.
CudaDeviceFacts cuda_device_facts(int64_t device_index);

// The VariantFacts of the calls a launcher's KernelTypes K serves (cuda_plan.h: a variant row is
// instantiated for K where its scope admits these).
template <typename K>
constexpr VariantFacts variant_facts() {
  return {K::kKernelH == kSpecializedKernel && K::kKernelW == kSpecializedKernel,
          std::is_same_v<typename K::index_t, int32_t>, K::kChannelsLast,
          static_cast<int64_t>(sizeof(typename K::scalar_t)),
          std::is_same_v<typename K::scalar_t, typename K::param_t>};
}

// Row kRow of a variant table (cuda_plan.h) as a type: V::row is the row's value, a constant that
// nested lambdas read without capturing anything.
template <const auto& kTable, size_t kRow>
struct VariantRow {
  static constexpr auto row = kTable[kRow];
};

namespace variant_detail {
template <const auto& kTable, size_t kRow, typename Body>
void run_row(size_t row, const Body& body) {
  constexpr size_t kRows = std::size(kTable);
  if constexpr (kRow < kRows) {
    if (row == kRow) return body(VariantRow<kTable, kRow>{});
    return run_row<kTable, kRow + 1>(row, body);
  } else {
    throw std::logic_error(message("a plan names variant row ", row, " of a table of ", kRows));
  }
}
}  // namespace variant_detail

// Calls body(VariantRow<kTable, row>) for the plan's row of a variant table; the body instantiates
// the row (if constexpr on its scope for the launcher's KernelTypes).
template <const auto& kTable, typename Body>
void dispatch_variant_row(int row, const Body& body) {
  variant_detail::run_row<kTable, 0>(static_cast<size_t>(row), body);
}

// A planned variant that is not compiled for the call's types: the planner checked the scope
// (find_variant), so this is a bug between the two, stopped before anything runs.
[[noreturn]] inline void variant_not_compiled(const char* launcher, const char* variant) {
  throw std::logic_error(message(launcher, ": variant ", variant, " was planned for a call it is not compiled for"));
}

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
