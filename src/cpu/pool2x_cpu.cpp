// CPU kernel of avg_pool2x: a loop over the output's rows in either memory format, with the math the
// CUDA kernels use (src/pool2x.h). It is the op's CPU implementation (opcheck, the CPU tests); the
// networks on the CPU keep F.avg_pool2d, whose kernel is vectorised.
#include "pool2x.h"
#include "resample2x_call.h"

namespace edsc_ext {

Tensor avg_pool2x_cpu(const Tensor& input) {
  Resample2xCall call = prepare_resample2x(input, Resample2x::kAvgPool);
  if (call.output.numel() == 0) return call.output;
  const int64_t n_size = call.batch, c_size = call.channels;
  const int64_t out_h = call.height / 2, out_w = call.width / 2;
  const std::array<int64_t, 4> in_strides = dense_strides(call.input.sizes(), call.format);
  const std::array<int64_t, 4> out_strides = dense_strides(call.output.sizes(), call.format);
  dispatch_kernel_types<KernelTypes<>, dispatch_axis::DtypePairs<dispatch_axis::same_dtypes>>(
      call.facts, "avg_pool2x_cpu", [&](auto k) {
        using scalar_t = typename decltype(k)::scalar_t;
        using acc_t = opmath_t<scalar_t>;
        const scalar_t* in = call.input.const_data_ptr<scalar_t>();
        scalar_t* out = call.output.mutable_data_ptr<scalar_t>();
        torch::stable::parallel_for(0, n_size * out_h, 1, [&](int64_t begin, int64_t end) {
          for (int64_t row = begin; row < end; ++row) {
            const int64_t n = row / out_h, oy = row % out_h;
            const scalar_t* top = in + n * in_strides[0] + 2 * oy * in_strides[2];
            const scalar_t* bottom = top + in_strides[2];
            scalar_t* out_row = out + n * out_strides[0] + oy * out_strides[2];
            for (int64_t ox = 0; ox < out_w; ++ox) {
              const int64_t left = 2 * ox * in_strides[3], right = left + in_strides[3];
              for (int64_t c = 0; c < c_size; ++c) {
                const int64_t at = c * in_strides[1];
                out_row[c * out_strides[1] + ox * out_strides[3]] = static_cast<scalar_t>(
                    avg_pool2x_value(static_cast<acc_t>(top[at + left]), static_cast<acc_t>(top[at + right]),
                                     static_cast<acc_t>(bottom[at + left]), static_cast<acc_t>(bottom[at + right])));
              }
            }
          }
        });
      });
  return call.output;
}

}  // namespace edsc_ext
