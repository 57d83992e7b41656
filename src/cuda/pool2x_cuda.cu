// CUDA launcher of avg_pool2x (the kernels: pool2x_kernel.cuh): the tensors' device, its current stream;
// 16-byte loads and stores where the channels (channels_last) or the output rows (NCHW) and the pointers
// allow them, one value a thread otherwise.
#include "pool2x_kernel.cuh"
#include "resample2x_call.h"
#include "resample2x_launch.cuh"

namespace edsc_ext {

Tensor avg_pool2x_cuda(const Tensor& input) {
  const CudaDeviceGuard device_guard(input.get_device_index());
  Resample2xCall call = prepare_resample2x(input, Resample2x::kAvgPool);
  if (call.output.numel() == 0) return call.output;
  const auto stream = current_cuda_stream(input.get_device_index());
  const auto h = static_cast<int32_t>(call.height), w = static_cast<int32_t>(call.width);
  const int64_t out_h = call.height / 2, out_w = call.width / 2;
  dispatch_kernel_types<KernelTypes<>, dispatch_axis::DtypePairs<dispatch_axis::same_dtypes>>(
      call.facts, "avg_pool2x_cuda", [&](auto k) {
        using scalar_t = typename decltype(k)::scalar_t;
        constexpr int kVec = 16 / sizeof(scalar_t);
        const scalar_t* in = call.input.const_data_ptr<scalar_t>();
        scalar_t* out = call.output.mutable_data_ptr<scalar_t>();
        const bool vector = aligned_16(in) && aligned_16(out);
        if (call.format == MemoryFormat::ChannelsLast) {
          const int64_t rows = call.batch * out_h;
          const bool wide = vector && call.channels % kVec == 0;
          const auto blocks = static_cast<int32_t>(wide ? call.channels / kVec : call.channels);
          if (wide) {
            launch_rows(avg_pool2x_channels_last_cuda_kernel<scalar_t, kVec>, rows, out_w * blocks, stream, in, out,
                        static_cast<int32_t>(rows), h, w, blocks);
          } else {
            launch_rows(avg_pool2x_channels_last_cuda_kernel<scalar_t, 1>, rows, out_w * blocks, stream, in, out,
                        static_cast<int32_t>(rows), h, w, blocks);
          }
        } else {
          const int64_t rows = call.batch * call.channels * out_h;
          if (vector && out_w % kVec == 0) {
            launch_rows(avg_pool2x_nchw_cuda_kernel<scalar_t, kVec>, rows, out_w / kVec, stream, in, out,
                        static_cast<int32_t>(rows), h, w);
          } else {
            launch_rows(avg_pool2x_nchw_cuda_kernel<scalar_t, 1>, rows, out_w, stream, in, out,
                        static_cast<int32_t>(rows), h, w);
          }
        }
      });
  return call.output;
}

}  // namespace edsc_ext
