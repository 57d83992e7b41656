// CUDA launcher of upsample_bilinear2x (the kernels: upsample2x_kernel.cuh): the tensors' device, its
// current stream; 16-byte stores where the channels (channels_last) or the output rows (NCHW) and the
// pointers allow them, one value a thread otherwise.
#include "resample2x_call.h"
#include "resample2x_launch.cuh"
#include "upsample2x_kernel.cuh"

namespace edsc_ext {

Tensor upsample_bilinear2x_cuda(const Tensor& input) {
  const CudaDeviceGuard device_guard(input.get_device_index());
  Resample2xCall call = prepare_resample2x(input, Resample2x::kUpsampleBilinear);
  if (call.output.numel() == 0) return call.output;
  const auto stream = current_cuda_stream(input.get_device_index());
  const auto h = static_cast<int32_t>(call.height), w = static_cast<int32_t>(call.width);
  dispatch_kernel_types<KernelTypes<>, dispatch_axis::DtypePairs<dispatch_axis::same_dtypes>>(
      call.facts, "upsample_bilinear2x_cuda", [&](auto k) {
        using scalar_t = typename decltype(k)::scalar_t;
        using acc_t = opmath_t<scalar_t>;
        constexpr int kVec = 16 / sizeof(scalar_t);
        const scalar_t* in = call.input.const_data_ptr<scalar_t>();
        scalar_t* out = call.output.mutable_data_ptr<scalar_t>();
        const acc_t scale_h = upsample2x_scale<acc_t>(call.height), scale_w = upsample2x_scale<acc_t>(call.width);
        const bool vector = aligned_16(in) && aligned_16(out);
        if (call.format == MemoryFormat::ChannelsLast) {
          const int64_t rows = call.batch * 2 * call.height;
          if (vector && call.channels % kVec == 0) {
            const auto blocks = static_cast<int32_t>(call.channels / kVec);
            launch_rows(upsample2x_channels_last_cuda_kernel<scalar_t, kVec>, rows, 2 * call.width * blocks, stream, in,
                        out, static_cast<int32_t>(rows), h, w, blocks, scale_h, scale_w);
          } else {
            const auto blocks = static_cast<int32_t>(call.channels);
            launch_rows(upsample2x_channels_last_cuda_kernel<scalar_t, 1>, rows, 2 * call.width * blocks, stream, in,
                        out, static_cast<int32_t>(rows), h, w, blocks, scale_h, scale_w);
          }
        } else {
          const int64_t rows = call.batch * call.channels * 2 * call.height;
          if (vector && (2 * call.width) % kVec == 0) {
            launch_rows(upsample2x_nchw_cuda_kernel<scalar_t, kVec>, rows, 2 * call.width / kVec, stream, in, out,
                        static_cast<int32_t>(rows), h, w, scale_h, scale_w);
          } else {
            launch_rows(upsample2x_nchw_cuda_kernel<scalar_t, 1>, rows, 2 * call.width, stream, in, out,
                        static_cast<int32_t>(rows), h, w, scale_h, scale_w);
          }
        }
      });
  return call.output;
}

}  // namespace edsc_ext
