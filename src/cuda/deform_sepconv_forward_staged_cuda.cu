// CUDA forward with the per-pixel tensors staged in shared memory: NCHW, 5x5 kernels, the half
// types, sm_80+ (plan_cuda_forward). The per-pixel tensors are 2K + 3K^2 = 85 values a pixel, each
// read once: streaming data and the bulk of the bytes. Read on demand, every tap waits on a DRAM
// round trip for its offsets before it can even address the frame, which left the plain kernel
// latency-bound. Here a block of kStagedPixels consecutive output pixels first issues asynchronous
// copies (cp.async) of all its per-pixel values, one commit group per row of taps, then samples row
// by row as the groups land, so later rows' loads overlap the sampling of earlier ones. Each thread
// owns one pixel and loops over the channels, so the values are read from DRAM once whatever C is.
#include "deform_sepconv_forward_staged_kernel.cuh"

namespace edsc_ext {

void launch_staged_forward(const DeformSepconvCall& call, const CudaForwardPlan& plan, const Tensor& output) {
  const CallFacts& f = call.facts;
  const auto stream = current_cuda_stream(call.input.get_device_index());
  const int64_t hw = f.height_out * f.width_out;
  const unsigned int blocks = static_cast<unsigned int>(f.batch * ((hw + kStagedPixels - 1) / kStagedPixels));
  dispatch_kernel_types<KernelTypes<>, dispatch_axis::TwoByteTypes, dispatch_axis::IndexWidth,
                        dispatch_axis::KernelSize5x5<>, dispatch_axis::Layout,
                        dispatch_axis::Variant<kStagedForwardVariants>>(
      {f, plan.variant}, "deform_sepconv_forward_staged_cuda", [&](auto k) {
        using K = decltype(k);
        using scalar_t = typename K::scalar_t;
        const size_t shared = kStagedSegments * kStagedPixels * sizeof(scalar_t);
        deform_sepconv_forward_staged_cuda_kernel<kStagedChannelBlock, K::variant.chunk_bytes, scalar_t>
            <<<blocks, kStagedPixels, shared, stream>>>(make_params<scalar_t, int32_t>(call),
                                                        output.mutable_data_ptr<scalar_t>());
        EDSC_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace edsc_ext
