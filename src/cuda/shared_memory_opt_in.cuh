// Opting kernels in to more dynamic shared memory than the kDefaultSharedBytes a block gets by
// default (how much they need and whether the device has it is the planner's: cuda_plan.h).
#pragma once

#include <map>
#include <mutex>
#include <utility>

#include "deform_sepconv_cuda.cuh"

namespace edsc_ext {

// Opts `kernel` in to `shared` bytes of dynamic shared memory where that is past the default.
template <typename Kernel>
void opt_in_dynamic_shared(Kernel kernel, size_t shared) {
  if (shared > static_cast<size_t>(kDefaultSharedBytes)) {
    EDSC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  }
}

// The same for a kernel with static shared memory too (the warp-staged backward tile), where
// static + dynamic may pass the default: once per device, kernel and size, since
// cudaFuncSetAttribute can hold the host until pending copies finish, and this way a CUDA-graph
// capture after the usual warm-up makes no such call.
template <typename Kernel>
void opt_in_dynamic_shared_once(Kernel kernel, size_t dynamic) {
  static std::mutex mutex;
  // Per (device, kernel): its static shared memory, and the dynamic size it is opted in to.
  static std::map<std::pair<int, const void*>, std::pair<size_t, size_t>> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const int device = current_cuda_device();
  const auto key = std::make_pair(device, reinterpret_cast<const void*>(kernel));
  auto found = known.find(key);
  if (found == known.end()) {
    cudaFuncAttributes attributes{};
    EDSC_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    found = known
                .emplace(key, std::make_pair(attributes.sharedSizeBytes,
                                             static_cast<size_t>(kDefaultSharedBytes) - attributes.sharedSizeBytes))
                .first;
  }
  auto& [static_bytes, opted_in] = found->second;
  EDSC_CHECK(static_cast<int64_t>(static_bytes + dynamic) <=
                 cuda_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "planned shared memory (", static_bytes, " static + ", dynamic, " dynamic bytes) exceeds the device's");
  if (dynamic > opted_in) {
    EDSC_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dynamic)));
    opted_in = dynamic;
  }
}

}  // namespace edsc_ext
