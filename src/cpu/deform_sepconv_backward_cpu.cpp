// CPU backward of deform_sepconv, the op's entry: checks, plan, and the kernels of the call's dtype
// pair (run_deform_sepconv_backward_cpu, one unit per pair).
#include "deform_sepconv_backward_cpu.h"

#include <utility>

#include "backends.h"

namespace edsc_ext {

// See run_deform_sepconv_backward_cpu (deform_sepconv_backward_loops_cpu.h) for how the work is split.
// args.deterministic: the CPU kernels are deterministic anyway.
DeformSepconvBackwardResult deform_sepconv_backward_cpu(const DeformSepconvArgs& args) {
  const DeformSepconvCall call = prepare(args);
  auto grads = allocate_grads(call, args.output_mask);
  const CpuBackwardPlan plan = plan_cpu_backward(call.facts, this_cpu(), kernel_policy());
  if (plan.kernel == CpuBackwardKernel::kEmpty) return backward_result(std::move(grads));

  dispatch_kernel_types<KernelTypes<>, dispatch_axis::FrameAndParamTypes>(
      call.facts, "deform_sepconv_backward_cpu", [&](auto k) {
        using K = decltype(k);
        run_deform_sepconv_backward_cpu<typename K::scalar_t, typename K::param_t>(call, plan, grads);
      });
  return backward_result(std::move(grads));
}

}  // namespace edsc_ext
