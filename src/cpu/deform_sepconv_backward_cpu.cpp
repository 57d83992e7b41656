// CPU backward of deform_sepconv, the op's entry: checks, plan, and the kernels of the call's dtype
// pair (run_deform_sepconv_backward_cpu, one unit per pair).
#include "deform_sepconv_backward_cpu.h"

#include <utility>

#include "backends.h"
#include "cpu_loops.h"

namespace edsc_ext {

namespace {

DeformSepconvGrads run_backward(const DeformSepconvCall& call, const CpuBackwardPlan& plan,
                                const std::array<bool, 5>& output_mask) {
  auto grads = allocate_grads(call, output_mask);
  if (plan.kernel == CpuBackwardKernel::kEmpty) return grads;
  dispatch_kernel_types<KernelTypes<>, dispatch_axis::FrameAndParamTypes>(
      call.facts, "deform_sepconv_backward_cpu", [&](auto k) {
        using K = decltype(k);
        with_cpu_param_type<typename K::scalar_t, typename K::param_t>(plan.avx2, [&](auto param_type) {
          run_deform_sepconv_backward_cpu<typename K::scalar_t, typename decltype(param_type)::type>(call, plan, grads);
        });
      });
  return grads;
}

}  // namespace

// See run_deform_sepconv_backward_cpu (deform_sepconv_backward_loops_cpu.h) for how the work is split.
// args.deterministic: the CPU kernels are deterministic anyway.
DeformSepconvBackwardResult deform_sepconv_backward_cpu(const DeformSepconvArgs& args) {
  const KernelPolicy policy = kernel_policy();
  const DeformSepconvCall call = prepare(args);
  const CpuBackwardPlan plan = plan_cpu_backward(call.facts, this_cpu(), policy);
  if (!plan.float32_frame) return backward_result(run_backward(call, plan, args.output_mask));
  // The float32-frame twin (cpu_plan.h: takes_float32_frame): its input gradient rounded to the frame's
  // dtype, the per-pixel ones already in theirs; what was not asked for as the 16-bit call returns it.
  const MemoryFormat format = call.facts.memory_format();
  const Tensor frame = converted(call.input, ScalarType::Float, format);
  const Tensor grad_output = converted(*call.grad_output, ScalarType::Float, format);
  const DeformSepconvCall twin = prepare(with_frame(args, call, frame, &grad_output));
  DeformSepconvGrads grads = run_backward(twin, plan_cpu_backward(twin.facts, this_cpu(), policy), args.output_mask);
  grads[0] = args.output_mask[0] ? converted(grads[0], call.facts.frame_dtype, format)
                                 : empty_in(call.input, {0}, MemoryFormat::Contiguous);
  for (size_t k = 1; k < grads.size(); ++k) {
    // The twin's placeholders (allocate_grads) take its float32 frame's dtype.
    if (grads[k].scalar_type() != call.facts.param_dtype)
      grads[k] = empty_in(call.input, {0}, MemoryFormat::Contiguous);
  }
  return backward_result(std::move(grads));
}

}  // namespace edsc_ext
