// CUDA forward of the grid-tap calls (no offsets or dilation; grid_tap_window.cuh): one
// shared-memory load and one multiply-add per tap and channel. Each thread owns one output pixel
// and holds kGridTapChunk of its vertical and horizontal weights at a time in registers;
// kPassChannels channels share a window.
#include "deform_sepconv_forward_grid_taps_kernel.cuh"
#include "shared_memory_opt_in.cuh"

namespace edsc_ext {

void launch_grid_taps_forward(const DeformSepconvCall& call, const CudaForwardPlan& plan, const Tensor& output) {
  const auto stream = current_cuda_stream(call.input.get_device_index());
  // A mask is a load a tap; sepconv has none, and then the taps are loads from shared memory only.
  dispatch_kernel_types<KernelTypes<>, dispatch_axis::UpTo4ByteTypes, dispatch_axis::FixedIndex<int64_t>,
                        dispatch_axis::Layout, dispatch_axis::MaskPresence,
                        dispatch_axis::Variant<kGridTapsForwardVariants>>(
      {call.facts, plan.variant}, "deform_sepconv_forward_grid_taps_cuda", [&](auto k) {
        using K = decltype(k);
        using scalar_t = typename K::scalar_t;
        constexpr int kPass = K::variant.pass_channels;
        const GridWindow window = plan.window;
        const size_t shared = static_cast<size_t>(kPass) * window.size() * sizeof(typename K::acc_t);
        const auto kernel = deform_sepconv_forward_grid_taps_cuda_kernel<kPass, K::kChannelsLast, K::kMask, scalar_t>;
        opt_in_dynamic_shared(kernel, shared);
        kernel<<<grid_taps_grid(call.facts), kGridTileThreads, shared, stream>>>(
            make_params<scalar_t, int64_t>(call), output.mutable_data_ptr<scalar_t>(), window);
        EDSC_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace edsc_ext
