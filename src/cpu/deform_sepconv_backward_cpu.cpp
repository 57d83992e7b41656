// CPU backward of deform_sepconv, the op's entry: checks, plan, and the kernels of the call's dtype
// pair (run_deform_sepconv_backward_cpu, one unit per pair).
#include "deform_sepconv_backward_cpu.h"

#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <optional>

#include "deform_sepconv_plan.h"
#include "edsc_ext/deform_sepconv_call.h"
#include "edsc_ext/kernel_policy.h"
#include "edsc_ext/ops.h"

namespace edsc_ext {
namespace {

// See run_deform_sepconv_backward_cpu (deform_sepconv_backward_loops_cpu.h) for how the work is split.
DeformSepconvBackwardResult deform_sepconv_backward_cpu(
    const at::Tensor& grad_output, const at::Tensor& input, const std::optional<at::Tensor>& vertical,
    const std::optional<at::Tensor>& horizontal, const std::optional<at::Tensor>& offset,
    const std::optional<at::Tensor>& mask, int64_t kernel_h, int64_t kernel_w, int64_t pad_h, int64_t pad_w,
    int64_t dilation_h, int64_t dilation_w, int64_t padding_mode, std::array<bool, 5> output_mask,
    const std::optional<at::Tensor>& offset_dx) {
  const DeformSepconvConfig cfg{kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode};
  const DeformSepconvTensors t =
      prepare_deform_sepconv(input, vertical, horizontal, offset, mask, cfg, &grad_output, offset_dx);
  auto grads = allocate_deform_sepconv_grads(t, output_mask);
  const CpuBackwardPlan plan =
      plan_cpu_backward(describe_call(t, cfg, output_mask, false), this_cpu(), kernel_policy());
  if (plan.kernel == CpuBackwardKernel::kEmpty) return backward_result(grads);

  EDSC_DISPATCH_FRAME_AND_PARAM_TYPES(input.scalar_type(), t.param_dtype, "deform_sepconv_backward_cpu",
                                      [&] { run_deform_sepconv_backward_cpu<scalar_t, param_t>(t, cfg, plan, grads); });
  return backward_result(grads);
}

}  // namespace

TORCH_LIBRARY_IMPL(edsc_ext, CPU, m) { m.impl("deform_sepconv_backward", &deform_sepconv_backward_cpu); }

}  // namespace edsc_ext
