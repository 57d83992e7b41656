// Declarations shared by the translation units of the CUDA backward: the host entry point
// (deform_sepconv_backward_cuda.cu), which plans a call (cuda_plan.h); one file per dtype
// (and per mixed-precision pair) that compiles the bilinear kernels (deform_sepconv_backward_<dtype>_cuda.cu, from
// deform_sepconv_backward_launch.cuh), so that a parallel build compiles them at once instead
// of one long file; and the grid-tap kernels' units.
#pragma once

#include <array>

#include "deform_sepconv_cuda.cuh"

namespace edsc_ext {

// Workspace of the deterministic input gradient (see FixedPointAtomicAdd).
struct FixedPointInputGrad {
  Tensor sums;      // int64, the input's shape
  Tensor scale;     // float64 scalar: 2^62 / bound
  Tensor bound;     // float64 scalar
  Tensor poisoned;  // int32 flag
};

// Runs the plan's bilinear kernel (CudaBackwardPlan::kernel) of one dtype pair (the frame's
// scalar_t, the per-pixel tensors' param_t) into `grads`
// (allocate_grads): the per-pixel gradients the grid-tap kernel did not compute,
// and the input gradient if it was not gathered: into grad_input_acc (opmath_t<scalar_t>,
// zero-filled; grads[0] itself where that is the type), or fixed_point.sums when plan.deterministic.
template <typename scalar_t, typename param_t>
void launch_deform_sepconv_backward(const DeformSepconvCall& call, const CudaBackwardPlan& plan,
                                    const DeformSepconvGrads& grads, const Tensor& grad_input_acc,
                                    const FixedPointInputGrad& fixed_point);

// The grid-tap calls (no offsets or dilation, up to 4 channels): the input gradient gathered into
// grad_input (no mask; deform_sepconv_grid_taps_input_grad_cuda.cu), and the per-pixel tensors'
// gradients (deform_sepconv_backward_grid_taps_cuda.cu), as planned.
void launch_gather_input_grad(const DeformSepconvCall& call, const CudaBackwardPlan& plan, const Tensor& grad_input);
void launch_grid_taps_param_grads(const DeformSepconvCall& call, const CudaBackwardPlan& plan,
                                  const DeformSepconvGrads& grads);

}  // namespace edsc_ext
