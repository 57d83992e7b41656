// CUDA backward of the grid-tap calls (no offsets or dilation; grid_tap_window.cuh), the per-pixel
// tensors' gradients: planned by plan_cuda_backward (CudaBackwardPlan::grid_tap_param_grads).
#include "deform_sepconv_backward_grid_taps_kernel.cuh"
#include "shared_memory_opt_in.cuh"

namespace edsc_ext {

void launch_grid_taps_param_grads(const DeformSepconvCall& call, const CudaBackwardPlan& plan,
                                  const DeformSepconvGrads& grads) {
  EDSC_CHECK(call.facts.channels <= kSmallChannels, "grid-tap backward: not planned for this call");
  const auto stream = current_cuda_stream(call.input.get_device_index());
  dispatch_kernel_types<KernelTypes<>, dispatch_axis::UpTo4ByteTypes, dispatch_axis::FixedIndex<int64_t>,
                        dispatch_axis::Layout, dispatch_axis::SmallChannels, dispatch_axis::MaskPresence,
                        dispatch_axis::Variant<kGridTapsParamsVariants>>(
      {call.facts, plan.grid_tap_params_variant}, "deform_sepconv_backward_grid_taps_cuda", [&](auto k) {
        using K = decltype(k);
        using scalar_t = typename K::scalar_t;
        const size_t shared = static_cast<size_t>(plan.grid_tap_shared_bytes);
        const auto kernel =
            deform_sepconv_backward_grid_taps_cuda_kernel<K::kChannels, K::kChannelsLast, K::kMask, scalar_t>;
        opt_in_dynamic_shared(kernel, shared);
        kernel<<<grid_taps_grid(call.facts), kGridTileThreads, shared, stream>>>(
            make_params<scalar_t, int64_t>(call), call.grad_output->const_data_ptr<scalar_t>(),
            make_param_grads<scalar_t>(grads), plan.window);
        EDSC_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace edsc_ext
