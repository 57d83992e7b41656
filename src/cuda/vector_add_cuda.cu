// CUDA kernel of vector_add: the smallest example of the device rules every op here follows
// (guard on the tensors' device, launch on that device's current stream, check the launch).
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

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

at::Tensor vector_add_cuda(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK_VALUE(a.device() == b.device(), "b is on ", b.device(), " but a is on ", a.device());
  TORCH_CHECK_VALUE(a.sizes() == b.sizes(), "b has shape ", b.sizes(), " but a has shape ", a.sizes());
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "b has dtype ", b.scalar_type(), " but a has dtype ",
                   a.scalar_type());
  const c10::cuda::CUDAGuard device_guard(a.device());
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  at::Tensor out = at::empty(a.sizes(), a.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;
  const auto stream = c10::cuda::getCurrentCUDAStream(a.device().index());
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "vector_add_cuda", [&] {
    vector_add_cuda_kernel<scalar_t><<<blocks_for(out.numel()), kThreadsPerBlock, 0, stream>>>(
        ac.const_data_ptr<scalar_t>(), bc.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), out.numel());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(edsc_ext, CUDA, m) { m.impl("vector_add", &vector_add_cuda); }

}  // namespace edsc_ext
