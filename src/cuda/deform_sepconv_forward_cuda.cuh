// Declarations shared by the translation units of the CUDA forward: the host entry point
// (deform_sepconv_forward_cuda.cu), which plans a call (cuda_plan.h), and one unit per
// kernel family, each launching the plan's variant of its kernel.
#pragma once

#include "cuda_plan.h"
#include "deform_sepconv_cuda.cuh"

namespace edsc_ext {

// Each writes `output` (allocated in the call's memory format) on the current stream, with the
// plan's row of its family's variant table (cuda_plan.h).
void launch_grid_taps_forward(const DeformSepconvCall& call, const CudaForwardPlan& plan, const Tensor& output);
void launch_staged_forward(const DeformSepconvCall& call, const CudaForwardPlan& plan, const Tensor& output);
void launch_lane_pairs_forward(const DeformSepconvCall& call, const CudaForwardPlan& plan, const Tensor& output);
void launch_pixels_forward(const DeformSepconvCall& call, const CudaForwardPlan& plan, const Tensor& output);

}  // namespace edsc_ext
