// Launch helpers of the 2x resampling kernels (upsample2x_cuda.cu, pool2x_cuda.cu): a 2-D grid whose
// y dimension walks the output rows and whose x dimension a row's items, both in grid-stride loops.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda_host.cuh"
#include "launch.cuh"

namespace edsc_ext {

inline bool aligned_16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

// One launch of `kernel` over `rows` output rows of `row_items` items each.
template <typename Kernel, typename... Args>
void launch_rows(Kernel kernel, int64_t rows, int64_t row_items, cudaStream_t stream, Args... args) {
  const dim3 grid(
      static_cast<unsigned int>(std::max<int64_t>(1, (row_items + kThreadsPerBlock - 1) / kThreadsPerBlock)),
      static_cast<unsigned int>(std::min<int64_t>(rows, 65535)));
  kernel<<<grid, kThreadsPerBlock, 0, stream>>>(args...);
  EDSC_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace edsc_ext
