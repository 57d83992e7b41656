// The CPU backward's per-dtype-pair entry (deform_sepconv_backward_cpu.cpp dispatches to it). Its
// definition (deform_sepconv_backward_loops_cpu.h) is compiled once per pair, each in a unit of its own
// (deform_sepconv_backward_<frame>[_<per-pixel>]_cpu.cpp), so that a build compiles them in parallel.
#pragma once

#include "cpu_plan.h"
#include "deform_sepconv_call.h"

namespace edsc_ext {

// Fills `grads` (allocate_grads) as `plan` (plan_cpu_backward) says, for a frame of scalar_t and
// per-pixel tensors of param_t.
template <typename scalar_t, typename param_t>
void run_deform_sepconv_backward_cpu(const DeformSepconvCall& call, const CpuBackwardPlan& plan,
                                     DeformSepconvGrads& grads);

}  // namespace edsc_ext
