// CUDA kernel of vector_add: the smallest example of the device rules every op here follows
// (guard on the tensors' device, launch on that device's current stream, check the launch).
#include "backends.h"
#include "cuda_host.cuh"
#include "launch.cuh"

namespace edsc_ext {
namespace {

template <typename scalar_t>
__global__ void vector_add_cuda_kernel(const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                                       scalar_t* __restrict__ out, int64_t n) {
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += int64_t(blockDim.x) * gridDim.x) {
    out[k] = a[k] + b[k];
  }
}

}  // namespace

Tensor vector_add_cuda(const Tensor& a, const Tensor& b) {
  check_vector_add(a, b);
  const CudaDeviceGuard device_guard(a.get_device_index());
  const Tensor ac = contiguous_in(a), bc = contiguous_in(b);
  Tensor out = empty_in(a, a.sizes(), MemoryFormat::Contiguous);
  if (out.numel() == 0) return out;
  const auto stream = current_cuda_stream(a.get_device_index());
  CallFacts facts;  // of the dispatch, the dtype only
  facts.frame_dtype = facts.param_dtype = a.scalar_type();
  dispatch_kernel_types<KernelTypes<>, dispatch_axis::AllTypes>(facts, "vector_add_cuda", [&](auto k) {
    using scalar_t = typename decltype(k)::scalar_t;
    vector_add_cuda_kernel<scalar_t><<<blocks_for(out.numel()), kThreadsPerBlock, 0, stream>>>(
        ac.const_data_ptr<scalar_t>(), bc.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), out.numel());
    EDSC_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace edsc_ext
