// Declarations shared by the translation units of the CUDA backward: the host entry point
// (deform_sepconv_backward_cuda.cu) and one file per dtype that compiles the kernels
// (deform_sepconv_backward_<dtype>_cuda.cu, from deform_sepconv_backward_kernels.cuh), so that a
// parallel build compiles the four at once instead of one long file.
#pragma once

#include <array>

#include "deform_sepconv_cuda.cuh"

namespace edsc_ext {

// Workspace of the deterministic input gradient (see FixedPointAtomicAdd).
struct FixedPointInputGrad {
  at::Tensor sums;      // int64, the input's shape
  at::Tensor scale;     // float64 scalar: 2^62 / bound
  at::Tensor bound;     // float64 scalar
  at::Tensor poisoned;  // int32 flag
};

// Runs the backward kernels of one dtype into `grads` (allocate_deform_sepconv_grads): the
// per-pixel gradients, and the input gradient (into fixed_point.sums when `deterministic`).
template <typename scalar_t>
void launch_deform_sepconv_backward(const DeformSepconvTensors& t, const DeformSepconvConfig& cfg,
                                    std::array<at::Tensor, 5>& grads, bool deterministic,
                                    const FixedPointInputGrad& fixed_point);

// Calls without offsets, dilation or mask and up to 4 channels (sepconv): computes the input
// gradient into grad_input by gathering (deform_sepconv_grid_taps_input_grad_cuda.cu) and returns
// true; false where it does not apply.
bool deform_sepconv_grid_taps_input_grad_cuda(const DeformSepconvTensors& t, const DeformSepconvConfig& cfg,
                                              at::Tensor& grad_input);

}  // namespace edsc_ext
