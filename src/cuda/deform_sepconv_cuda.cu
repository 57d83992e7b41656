// CUDA backend of deform_sepconv. Every entry point takes a device guard from the input and
// launches on that device's current stream, so a tensor on cuda:1 works whatever the current
// device is. Per-pixel work comes from include/edsc_ext/deform_sepconv_pixel.h.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "edsc_ext/ops.h"
#include "launch.cuh"

namespace edsc_ext {
namespace {

// Output channels a forward thread accumulates in registers; more channels become more threads.
constexpr int kCudaChannelBlock = 4;

template <typename scalar_t, typename index_t>
__global__ void __launch_bounds__(kThreadsPerBlock)
    deform_sepconv_forward_cuda_kernel(const DeformSepconvParams<scalar_t, index_t> p, scalar_t* __restrict__ output,
                                       int64_t work_items) {
  using acc_t = at::opmath_type<scalar_t>;
  const index_t hw = p.height_out * p.width_out;
  const index_t channel_blocks = (p.channels + kCudaChannelBlock - 1) / kCudaChannelBlock;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < work_items;
       k += int64_t(blockDim.x) * gridDim.x) {
    // Work item (n, channel block, y, x), x fastest so neighbouring threads read neighbouring
    // per-pixel parameters.
    const index_t item = static_cast<index_t>(k);
    const index_t pixel = item % hw;
    const index_t rest = item / hw;
    const index_t c0 = (rest % channel_blocks) * kCudaChannelBlock;
    const index_t n = rest / channel_blocks;
    deform_sepconv_forward_pixel<kCudaChannelBlock, scalar_t, acc_t, index_t>(p, output, n, pixel / p.width_out,
                                                                             pixel % p.width_out, c0);
  }
}

// Adds one sample's contribution to the input gradient (float32 for the half types, which a
// final cast rounds once).
template <typename acc_t>
struct AtomicAddInputGrad {
  acc_t* grad;
  template <typename index_t>
  __host__ __device__ void operator()(index_t idx, acc_t value) const {
#ifdef __CUDA_ARCH__
    atomicAdd(grad + idx, value);
#endif
  }
};

// One fused pass per output pixel: every requested gradient from one computation of its samples.
template <int kMaxWidth, typename scalar_t, typename index_t>
__global__ void __launch_bounds__(kThreadsPerBlock)
    deform_sepconv_backward_cuda_kernel(const DeformSepconvParams<scalar_t, index_t> p,
                                        const scalar_t* __restrict__ grad_output,
                                        const DeformSepconvParamGrads<scalar_t> param_grads,
                                        AtomicAddInputGrad<at::opmath_type<scalar_t>> add_input_grad,
                                        int64_t work_items) {
  using acc_t = at::opmath_type<scalar_t>;
  const index_t hw = p.height_out * p.width_out;
  const bool input_grad = add_input_grad.grad != nullptr;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < work_items;
       k += int64_t(blockDim.x) * gridDim.x) {
    const index_t item = static_cast<index_t>(k);
    const index_t pixel = item % hw;
    const index_t n = item / hw;
    deform_sepconv_backward_pixel<kMaxWidth, scalar_t, acc_t, index_t>(p, grad_output, param_grads, input_grad,
                                                                       add_input_grad, n, pixel / p.width_out,
                                                                       pixel % p.width_out, 0, p.channels);
  }
}

at::Tensor deform_sepconv_forward_cuda(const at::Tensor& input, const std::optional<at::Tensor>& vertical,
                                       const std::optional<at::Tensor>& horizontal,
                                       const std::optional<at::Tensor>& offset, const std::optional<at::Tensor>& mask,
                                       int64_t kernel_h, int64_t kernel_w, int64_t pad_h, int64_t pad_w,
                                       int64_t dilation_h, int64_t dilation_w, int64_t padding_mode) {
  const c10::cuda::CUDAGuard device_guard(input.device());
  const DeformSepconvConfig cfg{kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode};
  const DeformSepconvTensors t = prepare_deform_sepconv(input, vertical, horizontal, offset, mask, cfg);
  at::Tensor output = at::empty({input.size(0), input.size(1), t.height_out, t.width_out}, input.options());
  if (output.numel() == 0) return output;
  const auto stream = c10::cuda::getCurrentCUDAStream(input.device().index());
  const int64_t work_items = input.size(0) * ((input.size(1) + kCudaChannelBlock - 1) / kCudaChannelBlock) *
                             t.height_out * t.width_out;

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "deform_sepconv_forward_cuda", [&] {
    EDSC_DISPATCH_INDEX_TYPE(t.use_32bit_indexing, [&] {
      deform_sepconv_forward_cuda_kernel<scalar_t, index_t>
          <<<blocks_for(work_items), kThreadsPerBlock, 0, stream>>>(make_params<scalar_t, index_t>(t, cfg),
                                                                    output.mutable_data_ptr<scalar_t>(), work_items);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return output;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> deform_sepconv_backward_cuda(
    const at::Tensor& grad_output, const at::Tensor& input, const std::optional<at::Tensor>& vertical,
    const std::optional<at::Tensor>& horizontal, const std::optional<at::Tensor>& offset,
    const std::optional<at::Tensor>& mask, int64_t kernel_h, int64_t kernel_w, int64_t pad_h, int64_t pad_w,
    int64_t dilation_h, int64_t dilation_w, int64_t padding_mode, std::array<bool, 5> output_mask) {
  const c10::cuda::CUDAGuard device_guard(input.device());
  const DeformSepconvConfig cfg{kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode};
  const DeformSepconvTensors t = prepare_deform_sepconv(input, vertical, horizontal, offset, mask, cfg, &grad_output);
  auto grads = allocate_deform_sepconv_grads(t, output_mask);
  const int64_t work_items = input.size(0) * t.height_out * t.width_out;
  if (work_items == 0 || input.size(1) == 0) return {grads[0], grads[1], grads[2], grads[3], grads[4]};
  const auto stream = c10::cuda::getCurrentCUDAStream(input.device().index());

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "deform_sepconv_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    at::Tensor grad_input_acc;
    if (grads[0].numel() > 0) {
      grad_input_acc = std::is_same_v<acc_t, scalar_t>
                           ? grads[0]
                           : at::zeros(input.sizes(), input.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
    }
    const AtomicAddInputGrad<acc_t> add_input_grad{grad_input_acc.defined() ? grad_input_acc.mutable_data_ptr<acc_t>()
                                                                            : nullptr};
    const auto param_grads = make_param_grads<scalar_t>(grads);
    EDSC_DISPATCH_INDEX_TYPE(t.use_32bit_indexing, [&] {
      const auto p = make_params<scalar_t, index_t>(t, cfg);
      const scalar_t* go = t.grad_output.const_data_ptr<scalar_t>();
      if (kernel_w <= kSmallKernelWidth) {
        deform_sepconv_backward_cuda_kernel<kSmallKernelWidth, scalar_t, index_t>
            <<<blocks_for(work_items), kThreadsPerBlock, 0, stream>>>(p, go, param_grads, add_input_grad, work_items);
      } else {
        deform_sepconv_backward_cuda_kernel<kMaxKernelWidth, scalar_t, index_t>
            <<<blocks_for(work_items), kThreadsPerBlock, 0, stream>>>(p, go, param_grads, add_input_grad, work_items);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    if (grad_input_acc.defined() && !grad_input_acc.is_same(grads[0])) grads[0].copy_(grad_input_acc);
  });
  return {grads[0], grads[1], grads[2], grads[3], grads[4]};
}

}  // namespace

TORCH_LIBRARY_IMPL(edsc_ext, CUDA, m) {
  m.impl("deform_sepconv_forward", &deform_sepconv_forward_cuda);
  m.impl("deform_sepconv_backward", &deform_sepconv_backward_cuda);
}

}  // namespace edsc_ext
