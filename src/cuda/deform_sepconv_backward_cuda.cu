// CUDA backward of deform_sepconv: the host entry point. It takes a device guard from the input and
// launches on that device's current stream, so a tensor on cuda:1 works whatever the current
// device is. plan_cuda_backward (cuda_plan.h) chooses the kernels: the grid-tap ones
// (deform_sepconv_grid_taps_input_grad_cuda.cu, deform_sepconv_backward_grid_taps_cuda.cu) and the
// bilinear one for the rest (deform_sepconv_backward_launch.cuh, compiled once per dtype).
#include <limits>

#include "backends.h"
#include "deform_sepconv_backward_cuda.cuh"

namespace edsc_ext {
namespace {

// Bound on the magnitude of any input-gradient element: every contribution is
// dL/dout * V_i * H_j * M_t * (bilinear weight <= 1), so summing max_c |dL/dout| * sum_i |V_i| *
// sum_j |H_j| * max_t |M_t| over all output pixels bounds every element's total (times the padding
// mode's bound_factor: a doubled border weighs up to 2 per axis). Device-side only.
FixedPointInputGrad prepare_fixed_point_input_grad(const DeformSepconvCall& t) {
  constexpr ScalarType f64 = ScalarType::Double;
  const auto scalar = [&](double value) {
    return torch::stable::full(torch::headeronly::IntHeaderOnlyArrayRef(), value, f64, std::nullopt, t.input.device());
  };
  const auto abs = [](const Tensor& v) { return call_aten("aten::abs", "", v); };
  const auto mul = [](const Tensor& a, const Tensor& b) { return call_aten("aten::mul", "Tensor", a, b); };
  const auto channel_max = [&](const Tensor& v) { return torch::stable::to(torch::stable::amax(abs(v), 1), f64); };
  const auto channel_sum = [&](const Tensor& v) {
    return torch::stable::sum(abs(v), std::vector<int64_t>{1}, false, f64);
  };
  Tensor per_pixel = channel_max(*t.grad_output);
  per_pixel = mul(per_pixel, t.vertical.has_value() ? channel_sum(*t.vertical) : scalar(double(t.facts.kernel_h)));
  per_pixel = mul(per_pixel, t.horizontal.has_value() ? channel_sum(*t.horizontal) : scalar(double(t.facts.kernel_w)));
  if (t.mask.has_value()) per_pixel = mul(per_pixel, channel_max(*t.mask));
  FixedPointInputGrad w;
  w.bound = mul(torch::stable::sum(per_pixel), scalar(double(t.facts.padding.bound_factor)));
  w.scale = call_aten("aten::where", "self", call_aten("aten::gt", "Tensor", w.bound, scalar(0.0)),
                      call_aten("aten::div", "Tensor", scalar(4.611686018427387904e18), w.bound), scalar(1.0));
  w.sums = zeros_in(t.input, t.input.sizes(), t.facts.memory_format(), ScalarType::Long);
  w.poisoned = torch::stable::new_zeros(t.input, {1}, ScalarType::Int);
  return w;
}

Tensor finish_fixed_point_input_grad(const FixedPointInputGrad& w) {
  const Tensor value = call_aten("aten::div", "Tensor", torch::stable::to(w.sums, ScalarType::Double), w.scale);
  const Tensor no_poison = torch::stable::new_zeros(w.poisoned, torch::headeronly::IntHeaderOnlyArrayRef());
  const Tensor bad = call_aten("aten::logical_or", "", call_aten("aten::gt", "Tensor", w.poisoned, no_poison),
                               call_aten("aten::logical_not", "", call_aten("aten::isfinite", "", w.bound)));
  const Tensor nan =
      torch::stable::full(torch::headeronly::IntHeaderOnlyArrayRef(), std::numeric_limits<double>::quiet_NaN(),
                          ScalarType::Double, std::nullopt, value.device());
  return call_aten("aten::where", "self", bad, nan, value);
}

}  // namespace

DeformSepconvBackwardResult deform_sepconv_backward_cuda(const DeformSepconvArgs& args) {
  const Tensor& input = args.input;
  const CudaDeviceGuard device_guard(input.get_device_index());
  const KernelPolicy policy = kernel_policy();
  const bool many_channels_last = input.dim() == 4 && wants_channels_last(input) && input.size(1) > kSmallChannels;
  std::optional<DeformSepconvCall> prepared;
  CudaBackwardPlan plan;
  if (!many_channels_last || backward_may_take_channel_lanes(input.size(1), policy)) {
    prepared = prepare(args);
    plan = plan_cuda_backward(prepared->facts, cuda_device_facts(input.get_device_index()), policy);
  }
  if (!prepared || plan.nchw_copies) {
    // A channels_last call with many channels that the channel lanes do not take (off, a channel
    // count that is not a multiple of their block, float64, a deterministic input gradient): one
    // thread per output pixel loops over the channels, so in channels_last each of its frame loads
    // (a corner, a channel) would land on another lane's cache line (twice the NCHW time with 32
    // channels on the H200, BENCHMARKS.md); copying every tensor to NCHW and the gradients back
    // costs a few percent of it.
    const auto nchw = [](const OptionalTensor& v) -> OptionalTensor {
      return v.has_value() ? OptionalTensor(contiguous_in(*v)) : v;
    };
    const Tensor grad_output = contiguous_in(*args.grad_output), frame = contiguous_in(input);
    const OptionalTensor vertical = nchw(args.vertical), horizontal = nchw(args.horizontal), offset = nchw(args.offset),
                         mask = nchw(args.mask), offset_dx = nchw(args.offset_dx);
    auto grads = deform_sepconv_backward_cuda(
        with_tensors(args, frame, vertical, horizontal, offset, mask, offset_dx, &grad_output));
    const auto back = [](const Tensor& g) { return g.numel() > 0 ? contiguous_in(g, MemoryFormat::ChannelsLast) : g; };
    return {back(std::get<0>(grads)), back(std::get<1>(grads)), back(std::get<2>(grads)),
            back(std::get<3>(grads)), back(std::get<4>(grads)), back(std::get<5>(grads))};
  }
  const DeformSepconvCall& call = *prepared;
  auto grads = allocate_grads(call, args.output_mask);
  if (plan.empty) return backward_result(std::move(grads));
  if (plan.gather_input_grad) launch_gather_input_grad(call, plan, grads[0]);
  if (plan.grid_tap_param_grads) launch_grid_taps_param_grads(call, plan, grads);
  if (plan.kernel != CudaBackwardKernel::kNone) {
    FixedPointInputGrad fixed_point;
    if (plan.deterministic) fixed_point = prepare_fixed_point_input_grad(call);
    dispatch_kernel_types<KernelTypes<>, dispatch_axis::FrameAndParamTypes>(
        call.facts, "deform_sepconv_backward_cuda", [&](auto k) {
          using K = decltype(k);
          using scalar_t = typename K::scalar_t;
          // The kernels add the input gradient up in acc_t: into grads[0] where that is its dtype.
          using acc_t = typename K::acc_t;
          constexpr bool kSeparateAcc = !std::is_same_v<acc_t, scalar_t>;
          Tensor grad_input_acc;
          if (plan.kernel_input_grad && !plan.deterministic) {
            if (kSeparateAcc) {
              grad_input_acc = zeros_in(input, input.sizes(), call.facts.memory_format(), scalar_type_of<acc_t>());
            } else {
              grad_input_acc = grads[0];
            }
          }
          launch_deform_sepconv_backward<scalar_t, typename K::param_t>(call, plan, grads, grad_input_acc, fixed_point);
          if (kSeparateAcc && grad_input_acc.defined()) torch::stable::copy_(grads[0], grad_input_acc);
        });
    if (plan.deterministic) torch::stable::copy_(grads[0], finish_fixed_point_input_grad(fixed_point));
  }
  return backward_result(std::move(grads));
}

}  // namespace edsc_ext
