// The kernels' entry points that src/deform_sepconv.cpp registers for the CPU and CUDA dispatch
// keys, with the argument types of the op schemas there (through TORCH_BOX).
#pragma once

#include <cstdint>
#include <vector>

#include "ops.h"

namespace edsc_ext {

#define EDSC_FORWARD_PARAMS                                                                                            \
  const Tensor &input, const OptionalTensor &vertical, const OptionalTensor &horizontal, const OptionalTensor &offset, \
      const OptionalTensor &mask, int64_t kernel_h, int64_t kernel_w, int64_t pad_h, int64_t pad_w,                    \
      int64_t dilation_h, int64_t dilation_w, int64_t padding_mode, const OptionalTensor &offset_dx
#define EDSC_BACKWARD_PARAMS                                                                                        \
  const Tensor &grad_output, const Tensor &input, const OptionalTensor &vertical, const OptionalTensor &horizontal, \
      const OptionalTensor &offset, const OptionalTensor &mask, int64_t kernel_h, int64_t kernel_w, int64_t pad_h,  \
      int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t padding_mode,                                  \
      const std::vector<bool>&output_mask, const OptionalTensor &offset_dx, bool deterministic

Tensor deform_sepconv_forward_cpu(EDSC_FORWARD_PARAMS);
DeformSepconvBackwardResult deform_sepconv_backward_cpu(EDSC_BACKWARD_PARAMS);
Tensor vector_add_cpu(const Tensor& a, const Tensor& b);
// vector_add's argument checks, shared by both backends.
void check_vector_add(const Tensor& a, const Tensor& b);

#ifdef EDSC_EXT_WITH_CUDA
Tensor deform_sepconv_forward_cuda(EDSC_FORWARD_PARAMS);
DeformSepconvBackwardResult deform_sepconv_backward_cuda(EDSC_BACKWARD_PARAMS);
Tensor vector_add_cuda(const Tensor& a, const Tensor& b);
#endif

}  // namespace edsc_ext
