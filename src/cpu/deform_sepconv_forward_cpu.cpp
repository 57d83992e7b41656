// CPU forward of deform_sepconv: torch's parallel_for over output pixels, per-pixel work from
// src/sampling.h; calls without offsets (sepconv) by rows instead.
#include <algorithm>
#include <vector>

#include "backends.h"
#include "cpu_loops.h"

namespace edsc_ext {
namespace {

// Forward of one output row (n, y) of a call without offsets or dilation (kGridTapRows): every
// tap reads one input pixel, so the row is, per channel, sum_i V_i * sum_j H_j * M_t * (input row
// y - pad_h + i, shifted by j - pad_w), and each of those is a loop along x over contiguous rows
// that the compiler vectorises, where the per-pixel bilinear code computed four samples' weights
// and corners per tap (BENCHMARKS.md, "CPU", has the times). The weight
// rows are converted to acc_t once per row (`weights`: KH + KW rows of W_out); `in_row` (W_in),
// `sum` and `acc` (W_out) are scratch.
template <bool kChannelsLast, typename scalar_t, typename acc_t, typename index_t, typename param_t>
EDSC_CPU_INLINE inline void deform_sepconv_forward_grid_taps_row(
    const DeformSepconvParams<scalar_t, index_t, param_t>& p, scalar_t* output, index_t n, index_t y, acc_t* weights,
    acc_t* in_row, acc_t* sum, acc_t* acc) {
  const index_t KH = p.kernel_h, KW = p.kernel_w, width = p.width_out, width_in = p.width_in;
  const index_t hw_out = p.height_out * width;
  const PixelView<index_t> m_view = pixel_view<kChannelsLast>(n, y * width, KH * KW, hw_out);
  const PixelView<index_t> out_view = pixel_view<kChannelsLast>(n, y * width, p.channels, hw_out);
  acc_t* v_rows = weights;
  acc_t* h_rows = weights + KH * width;
  load_grid_weight_rows<kChannelsLast>(p, n, y, v_rows, h_rows);
  const index_t plane = input_channel_stride<kChannelsLast>(p), pixel_stride = input_pixel_stride<kChannelsLast>(p);
  const scalar_t* image = p.input + n * p.channels * p.height_in * width_in;
  const bool clamps = p.padding.clamps;  // outside the row: the edge pixels, else zeros
  for (index_t c = 0; c < p.channels; ++c) {
    std::fill(acc, acc + width, acc_t(0));
    for (index_t i = 0; i < KH; ++i) {
      index_t iy = y - p.pad_h + i;
      if (!grid_tap_pixel(iy, p.height_in, p.padding)) continue;  // not clamped: a row of zeros
      const scalar_t* src = image + c * plane + iy * width_in * pixel_stride;
      for (index_t q = 0; q < width_in; ++q) in_row[q] = static_cast<acc_t>(src[q * pixel_stride]);
      std::fill(sum, sum + width, acc_t(0));
      for (index_t j = 0; j < KW; ++j) {
        const acc_t* h = h_rows + j * width;
        const GridTapColumns<index_t> cols(j, p.pad_w, width, width_in);
        const index_t shift = cols.shift, inside_begin = cols.begin, inside_end = cols.end;
        if (p.mask) {
          const param_t* m = p.mask + m_view.base + (i * KW + j) * m_view.stride;
          const index_t m_step = pixel_step<kChannelsLast>(KH * KW);
          for (index_t x = inside_begin; x < inside_end; ++x) {
            sum[x] += h[x] * static_cast<acc_t>(m[x * m_step]) * in_row[x + shift];
          }
          if (clamps) {
            for (index_t x = 0; x < inside_begin; ++x) sum[x] += h[x] * static_cast<acc_t>(m[x * m_step]) * in_row[0];
            for (index_t x = inside_end; x < width; ++x) {
              sum[x] += h[x] * static_cast<acc_t>(m[x * m_step]) * in_row[width_in - 1];
            }
          }
        } else {
          multiply_add_row(sum + inside_begin, h + inside_begin, in_row + inside_begin + shift,
                           inside_end - inside_begin);
          if (clamps) {
            multiply_add_row(sum, h, in_row[0], inside_begin);
            multiply_add_row(sum + inside_end, h + inside_end, in_row[width_in - 1], width - inside_end);
          }
        }
      }
      multiply_add_row(acc, v_rows + i * width, sum, width);
    }
    scalar_t* out = output + out_view.base + c * out_view.stride;
    for (index_t x = 0; x < width; ++x) out[x * pixel_step<kChannelsLast>(p.channels)] = static_cast<scalar_t>(acc[x]);
  }
}

// Rows of a call without offsets (CpuForwardKernel::kGridTapRows), in tasks of whole rows, about
// kPixelGrain pixels each, with one scratch a task.
template <bool kChannelsLast, typename scalar_t, typename acc_t, typename index_t, typename param_t>
void forward_grid_tap_rows(const DeformSepconvParams<scalar_t, index_t, param_t>& p, scalar_t* out, bool avx2) {
  const int64_t height = p.height_out, width = p.width_out;
  torch::stable::parallel_for(0, p.batch * height, std::max<int64_t>(1, kPixelGrain / std::max<int64_t>(1, width)),
                              [&](int64_t begin, int64_t end) {
                                std::vector<acc_t> scratch((p.kernel_h + p.kernel_w + 2) * width + p.width_in);
                                acc_t* weights = scratch.data();
                                acc_t* sum = weights + (p.kernel_h + p.kernel_w) * width;
                                acc_t* acc = sum + width;
                                acc_t* in_row = acc + width;
                                run_for_cpu<param_t>(avx2, [&]() EDSC_CPU_INLINE {
                                  for (int64_t row = begin; row < end; ++row) {
                                    deform_sepconv_forward_grid_taps_row<kChannelsLast>(
                                        p, out, static_cast<index_t>(row / height), static_cast<index_t>(row % height),
                                        weights, in_row, sum, acc);
                                  }
                                });
                              });
}

Tensor run_forward(const DeformSepconvCall& call, const CpuForwardPlan& plan) {
  const CallFacts& f = call.facts;
  Tensor output = empty_in(call.input, {f.batch, f.channels, f.height_out, f.width_out}, f.memory_format());
  switch (plan.kernel) {
    case CpuForwardKernel::kEmpty:
      break;
    case CpuForwardKernel::kGridTapRows:
      dispatch_kernel_types<KernelTypes<>, dispatch_axis::FrameAndParamTypes, dispatch_axis::IndexWidth,
                            dispatch_axis::Layout>(f, "deform_sepconv_forward_cpu", [&](auto k) {
        using K = decltype(k);
        using scalar_t = typename K::scalar_t;
        with_cpu_param_type<typename K::scalar_t, typename K::param_t>(plan.avx2, [&](auto param_type) {
          forward_grid_tap_rows<K::kChannelsLast, scalar_t, typename K::acc_t>(
              make_params<scalar_t, typename K::index_t, typename decltype(param_type)::type>(call),
              output.mutable_data_ptr<scalar_t>(), plan.avx2);
        });
      });
      break;
    case CpuForwardKernel::kPixels:
      dispatch_kernel_types<KernelTypes<>, dispatch_axis::FrameAndParamTypes>(
          f, "deform_sepconv_forward_cpu", [&](auto types) {
            dispatch_cpu_loop_shape<decltype(types)>(f, "deform_sepconv_forward_cpu", [&](auto k) {
              using K = decltype(k);
              using scalar_t = typename K::scalar_t;
              using index_t = typename K::index_t;
              with_cpu_param_type<typename K::scalar_t, typename K::param_t>(plan.avx2, [&](auto param_type) {
                using param_t = typename decltype(param_type)::type;
                const auto p = make_params<scalar_t, index_t, param_t>(call);
                scalar_t* out = output.mutable_data_ptr<scalar_t>();
                for_each_output_pixel<index_t, param_t>(
                    plan.avx2, p.batch, p.height_out, p.width_out,
                    [&](index_t n, index_t y, index_t x) EDSC_CPU_INLINE {
                      for (index_t c0 = 0; c0 < p.channels; c0 += kCpuChannelBlock) {
                        // Strided for dense tensors too (their strides are the dense ones): one
                        // instantiation, a few index multiplies a pixel.
                        deform_sepconv_forward_pixel<kCpuChannelBlock, K::kKernelH, K::kKernelW, K::kChannelsLast,
                                                     scalar_t, typename K::acc_t, index_t, /*kVectorLoads=*/false,
                                                     /*kStrided=*/true>(p, out, n, y, x, c0);
                      }
                    });
              });
            });
          });
      break;
  }
  return output;
}

}  // namespace

Tensor deform_sepconv_forward_cpu(const DeformSepconvArgs& args) {
  // Per-pixel tensors that are views (channel slices of wider tensors, expanded ones) are read in
  // place: the per-pixel loops take their strides (GlobalPixelValues<..., kStrided>).
  const KernelPolicy policy = kernel_policy();
  const DeformSepconvCall call = prepare(args);
  const CpuForwardPlan plan = plan_cpu_forward(call.facts, this_cpu(), policy);
  if (!plan.float32_frame) return run_forward(call, plan);
  const MemoryFormat format = call.facts.memory_format();
  const DeformSepconvCall twin =
      prepare(with_frame(args, call, converted(call.input, ScalarType::Float, format), nullptr));
  return converted(run_forward(twin, plan_cpu_forward(twin.facts, this_cpu(), policy)), call.facts.frame_dtype, format);
}

}  // namespace edsc_ext
