// CPU kernel of upsample_bilinear2x: a loop over the output's rows in either memory format, with the
// math the CUDA kernels use (src/upsample2x.h). It is the op's CPU implementation (opcheck, the CPU
// tests); the networks on the CPU keep F.interpolate, whose kernel is vectorised.
#include "resample2x_call.h"
#include "upsample2x.h"

namespace edsc_ext {

Tensor upsample_bilinear2x_cpu(const Tensor& input) {
  Resample2xCall call = prepare_resample2x(input, Resample2x::kUpsampleBilinear);
  if (call.output.numel() == 0) return call.output;
  const int64_t n_size = call.batch, c_size = call.channels, in_h = call.height, in_w = call.width;
  const int64_t out_h = 2 * in_h, out_w = 2 * in_w;
  const std::array<int64_t, 4> in_strides = dense_strides(call.input.sizes(), call.format);
  const std::array<int64_t, 4> out_strides = dense_strides(call.output.sizes(), call.format);
  dispatch_kernel_types<KernelTypes<>, dispatch_axis::DtypePairs<dispatch_axis::same_dtypes>>(
      call.facts, "upsample_bilinear2x_cpu", [&](auto k) {
        using scalar_t = typename decltype(k)::scalar_t;
        using acc_t = opmath_t<scalar_t>;
        const scalar_t* in = call.input.const_data_ptr<scalar_t>();
        scalar_t* out = call.output.mutable_data_ptr<scalar_t>();
        const acc_t scale_h = upsample2x_scale<acc_t>(in_h), scale_w = upsample2x_scale<acc_t>(in_w);
        torch::stable::parallel_for(0, n_size * out_h, 1, [&](int64_t begin, int64_t end) {
          for (int64_t row = begin; row < end; ++row) {
            const int64_t n = row / out_h, oy = row % out_h;
            const Upsample2xTap<acc_t> ty =
                upsample2x_tap(static_cast<int32_t>(oy), static_cast<int32_t>(in_h), scale_h);
            const scalar_t* row_lo = in + n * in_strides[0] + ty.lo * in_strides[2];
            const scalar_t* row_hi = in + n * in_strides[0] + ty.hi * in_strides[2];
            scalar_t* out_row = out + n * out_strides[0] + oy * out_strides[2];
            for (int64_t ox = 0; ox < out_w; ++ox) {
              const Upsample2xTap<acc_t> tx =
                  upsample2x_tap(static_cast<int32_t>(ox), static_cast<int32_t>(in_w), scale_w);
              const int64_t lo = tx.lo * in_strides[3], hi = tx.hi * in_strides[3];
              for (int64_t c = 0; c < c_size; ++c) {
                const int64_t at = c * in_strides[1];
                out_row[c * out_strides[1] + ox * out_strides[3]] = static_cast<scalar_t>(
                    upsample2x_blend(ty, tx, static_cast<acc_t>(row_lo[at + lo]), static_cast<acc_t>(row_lo[at + hi]),
                                     static_cast<acc_t>(row_hi[at + lo]), static_cast<acc_t>(row_hi[at + hi])));
              }
            }
          }
        });
      });
  return call.output;
}

}  // namespace edsc_ext
