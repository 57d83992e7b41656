// CPU backward of deform_sepconv, the op's entry: checks, plan, and the kernels of the call's dtype
// pair (run_deform_sepconv_backward_cpu, one unit per pair).
#include "deform_sepconv_backward_cpu.h"

#include <optional>
#include <utility>

#include "backends.h"
#include "cpu_plan.h"
#include "deform_sepconv_call.h"
#include "kernel_policy.h"
#include "ops.h"

namespace edsc_ext {
// See run_deform_sepconv_backward_cpu (deform_sepconv_backward_loops_cpu.h) for how the work is split.
// deterministic: the CPU kernels are deterministic anyway.
DeformSepconvBackwardResult deform_sepconv_backward_cpu(
    const Tensor& grad_output, const Tensor& input, const OptionalTensor& vertical, const OptionalTensor& horizontal,
    const OptionalTensor& offset, const OptionalTensor& mask, int64_t kernel_h, int64_t kernel_w, int64_t pad_h,
    int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t padding_mode,
    const std::vector<bool>& output_mask_list, const OptionalTensor& offset_dx, bool /*deterministic*/) {
  const std::array<bool, 5> output_mask = output_mask_array(output_mask_list);
  const DeformSepconvConfig cfg{kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode};
  const DeformSepconvTensors t =
      prepare_deform_sepconv(input, vertical, horizontal, offset, mask, cfg, &grad_output, offset_dx);
  auto grads = allocate_deform_sepconv_grads(t, output_mask);
  const CpuBackwardPlan plan =
      plan_cpu_backward(describe_call(t, cfg, output_mask, false), this_cpu(), kernel_policy());
  if (plan.kernel == CpuBackwardKernel::kEmpty) return backward_result(std::move(grads));

  dispatch_kernel_types<KernelTypes<>, dispatch_axis::FrameAndParamTypes>(
      kernel_call(t, cfg), "deform_sepconv_backward_cpu", [&](auto k) {
        using K = std::decay_t<decltype(k)>;
        run_deform_sepconv_backward_cpu<typename K::scalar_t, typename K::param_t>(t, cfg, plan, grads);
      });
  return backward_result(std::move(grads));
}

}  // namespace edsc_ext
