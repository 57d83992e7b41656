// CUDA forward, one thread per (n, block of kPixelChannelBlock channels, output pixel), compiled
// for each memory layout, with consecutive threads on adjacent memory (x fastest in NCHW, the
// channel block in channels_last): the kernel of every call no specialised kernel takes
// (plan_cuda_forward). With 5x5 kernels, exactly 3 channels (RGB) make the channel count a
// compile-time constant, and a kernel per padding mode leaves no branch in a tap
// (deform_sepconv_forward_pixel_static_padding); in NCHW with one channel
// block each warp first prefetches its per-pixel values into L2 (prefetched_pixel_values.cuh); in
// channels_last whole blocks of channels load a corner as one vector. An exact-RGB NCHW call in a half
// type reads a packed copy of its frame (pack_rgb_frame_cuda_kernel, here first: each bilinear corner is
// one 8-byte load instead of three 2-byte ones, which bound that kernel). The per-pixel tensors are read
// at their own strides (views, e.g. channel slices of the EDSC heads' outputs, in place), except by
// the prefetching kernel, which the planner gives dense tensors only.
#include "deform_sepconv_forward_cuda.cuh"
#include "deform_sepconv_forward_pixels_kernel.cuh"

namespace edsc_ext {

void launch_pixels_forward(const DeformSepconvCall& call, const CudaForwardPlan& plan, const Tensor& output) {
  const CallFacts& f = call.facts;
  const auto stream = current_cuda_stream(call.input.get_device_index());
  const int channel_block = kPixelsForwardVariants[plan.variant].channel_block;
  const int64_t work_items = f.batch * ((f.channels + channel_block - 1) / channel_block) * f.height_out * f.width_out;
  // Mixed precision (per-pixel tensors in a half type, a float32 frame) is read here as it is.
  dispatch_kernel_types<KernelTypes<>, dispatch_axis::FrameAndParamTypes, dispatch_axis::IndexWidth,
                        dispatch_axis::KernelSize5x5<>, dispatch_axis::Layout,
                        dispatch_axis::Variant<kPixelsForwardVariants>, dispatch_axis::PaddingModeOfVariant>(
      {f, plan.variant}, "deform_sepconv_forward_pixels_cuda", [&](auto k) {
        using K = decltype(k);
        using scalar_t = typename K::scalar_t;
        constexpr PixelsForwardVariant v = K::variant;
        const auto p = make_params<scalar_t, typename K::index_t, typename K::param_t>(call);
        const PackedRgbPixel<scalar_t>* packed_frame = nullptr;
        Tensor packed;  // kept until the forward is queued
        if constexpr (v.packed_frame) {
          packed = empty_in(call.input, {f.batch, 4, f.height_in, f.width_in}, MemoryFormat::ChannelsLast);
          auto* pixels = reinterpret_cast<PackedRgbPixel<scalar_t>*>(packed.mutable_data_ptr<scalar_t>());
          const int64_t count = f.batch * f.height_in * f.width_in;
          pack_rgb_frame_cuda_kernel<scalar_t><<<blocks_for(count), kThreadsPerBlock, 0, stream>>>(
              p.input, pixels, static_cast<int32_t>(f.height_in * f.width_in), static_cast<int32_t>(count));
          EDSC_CUDA_KERNEL_LAUNCH_CHECK();
          packed_frame = pixels;
        }
        // Channel blocks of 3: exactly RGB, the channel count a constant.
        deform_sepconv_forward_cuda_kernel<v.channel_block, K::kKernelH, K::kKernelW, K::kChannelsLast, v.prefetch,
                                           v.channel_block == 3, v.vector_loads, scalar_t, typename K::index_t,
                                           typename K::param_t, K::kPaddingMode, v.packed_frame>
            <<<blocks_for(work_items), kThreadsPerBlock, 0, stream>>>(p, output.mutable_data_ptr<scalar_t>(),
                                                                      work_items, packed_frame);
        EDSC_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace edsc_ext
