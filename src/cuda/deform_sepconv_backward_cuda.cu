// CUDA backward of deform_sepconv: the host entry point. It takes a device guard from the input and
// launches on that device's current stream, so a tensor on cuda:1 works whatever the current
// device is. plan_cuda_backward (deform_sepconv_plan.h) chooses the kernels: the grid-tap ones
// (deform_sepconv_grid_taps_input_grad_cuda.cu, deform_sepconv_backward_grid_taps_cuda.cu) and the
// bilinear one for the rest (deform_sepconv_backward_launch.cuh, compiled once per dtype).
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "deform_sepconv_backward_cuda.cuh"
#include "edsc_ext/ops.h"

namespace edsc_ext {
namespace {

// Bound on the magnitude of any input-gradient element: every contribution is
// dL/dout * V_i * H_j * M_t * (bilinear weight <= 1), so summing max_c |dL/dout| * sum_i |V_i| *
// sum_j |H_j| * max_t |M_t| over all output pixels bounds every element's total (times 4 in EDSC
// mode, whose doubled border samples weigh up to 2 per axis). Device-side only.
FixedPointInputGrad prepare_fixed_point_input_grad(const DeformSepconvTensors& t, const DeformSepconvConfig& cfg) {
  const auto f64 = t.input.options().dtype(at::kDouble);
  const auto abs = [](const at::TensorBase& v) { return at::Tensor(v).abs(); };
  at::Tensor per_pixel = abs(t.grad_output).amax(1).to(at::kDouble);
  per_pixel = per_pixel * (t.vertical.defined() ? abs(t.vertical).sum(1, false, at::kDouble)
                                                : at::scalar_tensor(double(cfg.kernel_h), f64));
  per_pixel = per_pixel * (t.horizontal.defined() ? abs(t.horizontal).sum(1, false, at::kDouble)
                                                  : at::scalar_tensor(double(cfg.kernel_w), f64));
  if (t.mask.defined()) per_pixel = per_pixel * abs(t.mask).amax(1).to(at::kDouble);
  FixedPointInputGrad w;
  const at::Tensor bound = per_pixel.sum() * (cfg.padding_mode == kPaddingEdsc ? 4.0 : 1.0);
  w.bound = bound;
  w.scale = at::where(bound > 0, at::scalar_tensor(4.611686018427387904e18, f64) / bound, at::scalar_tensor(1.0, f64));
  w.sums = at::empty(t.input.sizes(), t.input.options().dtype(at::kLong).memory_format(t.memory_format())).zero_();
  w.poisoned = at::zeros({1}, t.input.options().dtype(at::kInt));
  return w;
}

at::Tensor finish_fixed_point_input_grad(const FixedPointInputGrad& w) {
  const at::Tensor value = at::Tensor(w.sums).to(at::kDouble) / at::Tensor(w.scale);
  const at::Tensor bad = (at::Tensor(w.poisoned) > 0).logical_or(at::Tensor(w.bound).isfinite().logical_not());
  return at::where(bad, at::scalar_tensor(std::numeric_limits<double>::quiet_NaN(), value.options()), value);
}

DeformSepconvBackwardResult deform_sepconv_backward_cuda(
    const at::Tensor& grad_output, const at::Tensor& input, const std::optional<at::Tensor>& vertical,
    const std::optional<at::Tensor>& horizontal, const std::optional<at::Tensor>& offset,
    const std::optional<at::Tensor>& mask, int64_t kernel_h, int64_t kernel_w, int64_t pad_h, int64_t pad_w,
    int64_t dilation_h, int64_t dilation_w, int64_t padding_mode, std::array<bool, 5> output_mask,
    const std::optional<at::Tensor>& offset_dx) {
  const c10::cuda::CUDAGuard device_guard(input.device());
  const KernelPolicy policy = kernel_policy();
  const bool many_channels_last = input.dim() == 4 && wants_channels_last(input) && input.size(1) > kSmallChannels;
  std::optional<DeformSepconvTensors> prepared;
  CudaBackwardPlan plan;
  const DeformSepconvConfig cfg{kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode};
  if (!many_channels_last || backward_may_take_channel_lanes(input.size(1), policy)) {
    prepared = prepare_deform_sepconv(input, vertical, horizontal, offset, mask, cfg, &grad_output, offset_dx);
    plan = plan_cuda_backward(describe_call(*prepared, cfg, output_mask, at::globalContext().deterministicAlgorithms()),
                              cuda_device_facts(input.device().index()), policy);
  }
  if (!prepared || plan.nchw_copies) {
    // A channels_last call with many channels that the channel lanes do not take (off, a channel
    // count that is not a multiple of their block, float64, a deterministic input gradient): one
    // thread per output pixel loops over the channels, so in channels_last each of its frame loads
    // (a corner, a channel) would land on another lane's cache line (twice the NCHW time with 32
    // channels on the H200, BENCHMARKS.md); copying every tensor to NCHW and the gradients back
    // costs a few percent of it.
    const auto nchw = [](const std::optional<at::Tensor>& v) -> std::optional<at::Tensor> {
      return v.has_value() ? std::optional<at::Tensor>(v->contiguous()) : v;
    };
    auto grads = deform_sepconv_backward_cuda(
        grad_output.contiguous(), input.contiguous(), nchw(vertical), nchw(horizontal), nchw(offset), nchw(mask),
        kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode, output_mask, nchw(offset_dx));
    const auto back = [](const at::Tensor& g) {
      return g.numel() > 0 ? g.contiguous(at::MemoryFormat::ChannelsLast) : g;
    };
    return {back(std::get<0>(grads)), back(std::get<1>(grads)), back(std::get<2>(grads)),
            back(std::get<3>(grads)), back(std::get<4>(grads)), back(std::get<5>(grads))};
  }
  const DeformSepconvTensors& t = *prepared;
  auto grads = allocate_deform_sepconv_grads(t, output_mask);
  if (plan.empty) return backward_result(grads);
  if (plan.gather_input_grad) launch_gather_input_grad(t, cfg, plan, grads[0]);
  if (plan.grid_tap_param_grads) launch_grid_taps_param_grads(t, cfg, plan, grad_buffers(grads));
  if (plan.kernel != CudaBackwardKernel::kNone) {
    FixedPointInputGrad fixed_point;
    if (plan.deterministic) fixed_point = prepare_fixed_point_input_grad(t, cfg);
    EDSC_DISPATCH_FRAME_AND_PARAM_TYPES(input.scalar_type(), t.param_dtype, "deform_sepconv_backward_cuda", [&] {
      // The kernels add the input gradient up in acc_t: into grads[0] where that is its dtype.
      using acc_t = at::opmath_type<scalar_t>;
      at::Tensor grad_input_acc;
      if (plan.kernel_input_grad && !plan.deterministic) {
        grad_input_acc =
            std::is_same_v<acc_t, scalar_t>
                ? grads[0]
                : at::empty(
                      input.sizes(),
                      input.options().dtype(c10::CppTypeToScalarType<acc_t>::value).memory_format(t.memory_format()))
                      .zero_();
      }
      launch_deform_sepconv_backward<scalar_t, param_t>(t, cfg, plan, grad_buffers(grads), grad_input_acc, fixed_point);
      if (grad_input_acc.defined() && !grad_input_acc.is_same(grads[0])) grads[0].copy_(grad_input_acc);
    });
    if (plan.deterministic) grads[0].copy_(finish_fixed_point_input_grad(fixed_point));
  }
  return backward_result(grads);
}

}  // namespace

TORCH_LIBRARY_IMPL(edsc_ext, CUDA, m) { m.impl("deform_sepconv_backward", &deform_sepconv_backward_cuda); }

}  // namespace edsc_ext
