// CUDA forward of channels_last calls with up to 4 channels and 5x5 kernels: two lanes per output
// pixel, lane q taking taps q, q + 2, ..., their partial sums added by one shuffle. A channels_last
// pixel's 2K + 3K^2 = 85 per-pixel values are contiguous, so with one lane per pixel each warp-wide
// load of a tap touches 32 cache lines, and the kernels were bound by L1 and L2 requests rather
// than DRAM. Here the two lanes of a pixel read adjacent taps and, kStaged, each warp first copies
// its 16 pixels' values (a contiguous run of each tensor, 16-byte aligned: the planner checks) to
// shared memory with 16-byte asynchronous copies, one wait a warp, and the taps read them there.
// BENCHMARKS.md has the variants measured on the way (one lane a pixel, unstaged, four lanes).
#include "deform_sepconv_forward_lane_pairs_kernel.cuh"

namespace edsc_ext {

void launch_lane_pairs_forward(const DeformSepconvCall& call, const CudaForwardPlan& plan, const Tensor& output) {
  const CallFacts& f = call.facts;
  const auto stream = current_cuda_stream(call.input.get_device_index());
  const int64_t pixels = f.batch * f.height_out * f.width_out;
  dispatch_kernel_types<KernelTypes<>, dispatch_axis::UpTo4ByteTypes, dispatch_axis::IndexWidth,
                        dispatch_axis::KernelSize5x5<>, dispatch_axis::Layout,
                        dispatch_axis::Variant<kLanePairsForwardVariants>>(
      {f, plan.variant}, "deform_sepconv_forward_lane_pairs_cuda", [&](auto k) {
        using K = decltype(k);
        using scalar_t = typename K::scalar_t;
        constexpr LanePairsForwardVariant v = K::variant;
        deform_sepconv_forward_lane_pairs_cuda_kernel<v.exact_rgb, v.staged_values, scalar_t>
            <<<blocks_for(pixels * kLanesPerPixel), kThreadsPerBlock, 0, stream>>>(
                make_params<scalar_t, int32_t>(call), output.mutable_data_ptr<scalar_t>(), pixels);
        EDSC_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace edsc_ext
