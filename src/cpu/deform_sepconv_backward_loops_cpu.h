// The CPU backward of deform_sepconv: parallel over (image, band of output rows), per-pixel work from
// src/sampling.h. Included by the per-dtype units only
// (deform_sepconv_backward_cpu.h says why).
#pragma once

#include <optional>
#include <vector>

#include "cpu_loops.h"
#include "deform_sepconv_backward_cpu.h"

namespace edsc_ext {
namespace cpu_backward {

template <typename acc_t>
struct NoInputGrad {
  template <typename index_t>
  EDSC_CPU_INLINE void operator()(index_t, index_t, index_t, acc_t) const {}
};

// Adds into one batch element's input gradient (or a band's scratch copy of it), owned by one task.
template <typename acc_t, typename index_t>
struct PlaneAdd {
  acc_t* grad;  // grad_input[n]
  index_t width, channel_stride, pixel_stride;
  EDSC_CPU_INLINE void operator()(index_t c, index_t y, index_t x, acc_t v) const {
    grad[c * channel_stride + (y * width + x) * pixel_stride] += v;
  }
};

// Scratch of the row-wise backward (acc_t), sized for one call: the weight rows, dL/dout of the
// row (C x W), the input rows of a tap row (C x W_in) and their gradient (C x W_in), the channel
// sums s and the vertical-gradient row (W each), the horizontal-gradient rows (KW x W).
template <typename acc_t>
struct GridTapRowScratch {
  std::vector<acc_t> data;
  acc_t *v_rows, *h_rows, *g, *in_rows, *din, *s, *gv, *gh;
  GridTapRowScratch(int64_t KH, int64_t KW, int64_t C, int64_t W, int64_t W_in)
      : data(static_cast<size_t>((KH + KW + C + 2 + KW) * W + 2 * C * W_in)) {
    v_rows = data.data();
    h_rows = v_rows + KH * W;
    g = h_rows + KW * W;
    s = g + C * W;
    gv = s + W;
    gh = gv + W;
    in_rows = gh + KW * W;
    din = in_rows + C * W_in;
  }
  GridTapRowScratch(const GridTapRowScratch&) = delete;  // the pointers point into `data`
  GridTapRowScratch& operator=(const GridTapRowScratch&) = delete;
};

// Backward of output row (n, y) of a call without offsets or dilation (takes_grid_taps), the
// input gradient's adds going to `image_grad` (grad_input[n] or a band's scratch copy; nullptr:
// not wanted). Per tap (i, j) and pixel x, with T_c the input value the tap read:
// s = sum_c dL/dout_c * T_c; dV_i += H_j M s; dH_j += V_i M s; dM = V_i H_j s; and
// dL/dout_c * V_i * H_j * M goes to the input pixel. All loops run along x over whole rows.
template <bool kChannelsLast, typename scalar_t, typename acc_t, typename index_t, typename param_t>
EDSC_CPU_INLINE inline void deform_sepconv_backward_grid_taps_row(
    const DeformSepconvParams<scalar_t, index_t, param_t>& p, const scalar_t* grad_output,
    const DeformSepconvParamGrads<param_t>& grads, acc_t* image_grad, index_t n, index_t y,
    GridTapRowScratch<acc_t>& b) {
  const index_t KH = p.kernel_h, KW = p.kernel_w, C = p.channels, width = p.width_out, width_in = p.width_in;
  const index_t hw_out = p.height_out * width;
  const PixelView<index_t> v_view = pixel_view<kChannelsLast>(n, y * width, KH, hw_out);
  const PixelView<index_t> h_view = pixel_view<kChannelsLast>(n, y * width, KW, hw_out);
  const PixelView<index_t> m_view = pixel_view<kChannelsLast>(n, y * width, KH * KW, hw_out);
  const PixelView<index_t> go_view = pixel_view<kChannelsLast>(n, y * width, C, hw_out);
  const index_t m_step = pixel_step<kChannelsLast>(KH * KW);
  load_grid_weight_rows<kChannelsLast>(p, n, y, b.v_rows, b.h_rows);
  for (index_t c = 0; c < C; ++c) {
    for (index_t x = 0; x < width; ++x) {
      b.g[c * width + x] =
          static_cast<acc_t>(grad_output[go_view.base + c * go_view.stride + x * pixel_step<kChannelsLast>(C)]);
    }
  }
  if (grads.horizontal) std::fill(b.gh, b.gh + KW * width, acc_t(0));
  const index_t plane = input_channel_stride<kChannelsLast>(p), pixel_stride = input_pixel_stride<kChannelsLast>(p);
  const scalar_t* image = p.input + n * C * p.height_in * width_in;
  const bool clamps = p.padding.clamps;  // outside the row: the edge pixels, else zeros
  const index_t last = width_in - 1;
  for (index_t i = 0; i < KH; ++i) {
    const acc_t* v = b.v_rows + i * width;
    index_t iy = y - p.pad_h + i;
    const bool row_inside = grid_tap_pixel(iy, p.height_in, p.padding);  // else not clamped: T = 0
    if (row_inside) {
      for (index_t c = 0; c < C; ++c) {
        const scalar_t* src = image + c * plane + iy * width_in * pixel_stride;
        for (index_t q = 0; q < width_in; ++q) b.in_rows[c * width_in + q] = static_cast<acc_t>(src[q * pixel_stride]);
      }
      if (image_grad) std::fill(b.din, b.din + C * width_in, acc_t(0));
    }
    std::fill(b.gv, b.gv + width, acc_t(0));
    for (index_t j = 0; j < KW; ++j) {
      const acc_t* h = b.h_rows + j * width;
      const param_t* m = p.mask ? p.mask + m_view.base + (i * KW + j) * m_view.stride : nullptr;
      std::fill(b.s, b.s + width, acc_t(0));
      const GridTapColumns<index_t> cols(j, p.pad_w, width, width_in);
      if (row_inside) {
        for (index_t c = 0; c < C; ++c) {
          const acc_t* g = b.g + c * width;
          const acc_t* in = b.in_rows + c * width_in;
          multiply_add_row(b.s + cols.begin, g + cols.begin, in + cols.begin + cols.shift, cols.end - cols.begin);
          if (clamps) {
            multiply_add_row(b.s, g, in[0], cols.begin);
            multiply_add_row(b.s + cols.end, g + cols.end, in[last], width - cols.end);
          }
        }
      }
      if (grads.mask) {
        param_t* gm = grads.mask + m_view.base + (i * KW + j) * m_view.stride;
        for (index_t x = 0; x < width; ++x) gm[x * m_step] = static_cast<param_t>(v[x] * h[x] * b.s[x]);
      }
      if (m) {
        for (index_t x = 0; x < width; ++x) b.s[x] *= static_cast<acc_t>(m[x * m_step]);
      }
      multiply_add_row(b.gv, h, b.s, width);
      if (grads.horizontal) multiply_add_row(b.gh + j * width, v, b.s, width);
      if (image_grad && row_inside) {
        // The tap's weight V_i H_j M per pixel (in s, no longer needed), then each channel's adds.
        for (index_t x = 0; x < width; ++x) b.s[x] = v[x] * h[x] * (m ? static_cast<acc_t>(m[x * m_step]) : acc_t(1));
        for (index_t c = 0; c < C; ++c) {
          const acc_t* g = b.g + c * width;
          acc_t* din = b.din + c * width_in;
          multiply_add_row(din + cols.begin + cols.shift, g + cols.begin, b.s + cols.begin, cols.end - cols.begin);
          if (clamps) {
            for (index_t x = 0; x < cols.begin; ++x) din[0] += g[x] * b.s[x];
            for (index_t x = cols.end; x < width; ++x) din[last] += g[x] * b.s[x];
          }
        }
      }
    }
    if (grads.vertical) {
      for (index_t x = 0; x < width; ++x) {
        grads.vertical[v_view.base + i * v_view.stride + x * pixel_step<kChannelsLast>(KH)] =
            static_cast<param_t>(b.gv[x]);
      }
    }
    if (image_grad && row_inside) {
      for (index_t c = 0; c < C; ++c) {
        acc_t* dst = image_grad + c * plane + iy * width_in * pixel_stride;
        for (index_t q = 0; q < width_in; ++q) dst[q * pixel_stride] += b.din[c * width_in + q];
      }
    }
  }
  if (grads.horizontal) {
    for (index_t j = 0; j < KW; ++j) {
      for (index_t x = 0; x < width; ++x) {
        grads.horizontal[h_view.base + j * h_view.stride + x * pixel_step<kChannelsLast>(KW)] =
            static_cast<param_t>(b.gh[j * width + x]);
      }
    }
  }
}

// Scratch of the sample-row backward (deform_sepconv_backward_sample_row), sized for one call: the
// weight rows (KH and KW rows of W), dL/dout of the row (C x W), one tap's samples, channel sums and
// weights (W each), and the vertical and horizontal gradient rows.
template <typename acc_t, typename index_t>
struct SampleRowScratch {
  std::vector<acc_t> data;
  std::vector<BilinearSample<acc_t, index_t>> samples;
  acc_t *v_rows, *h_rows, *g, *sw, *sly, *slx, *ws, *gv, *gh;
  SampleRowScratch(int64_t KH, int64_t KW, int64_t C, int64_t W)
      : data(static_cast<size_t>((KH + KW + C + 5 + KW) * W)), samples(static_cast<size_t>(W)) {
    v_rows = data.data();
    h_rows = v_rows + KH * W;
    g = h_rows + KW * W;
    sw = g + C * W;
    sly = sw + W;
    slx = sly + W;
    ws = slx + W;
    gv = ws + W;
    gh = gv + W;
  }
  SampleRowScratch(const SampleRowScratch&) = delete;  // the pointers point into `data`
  SampleRowScratch& operator=(const SampleRowScratch&) = delete;
};

// Backward of output row (n, y) of a call with offsets, tap by tap along the row: the tap's sample
// for every pixel of the row (make_bilinear_sample), then for each channel the pixels' corner
// reads, sums and input-gradient adds, then the pixels' parameter gradients. The same math as
// deform_sepconv_backward_pixel_with, in an order whose iterations are independent (the pixels of
// one tap), so that the core overlaps them, where the per-pixel loop ran one dependent chain.
// `image_grad`: grad_input[n] or a band's scratch copy; nullptr: not wanted.
template <bool kChannelsLast, typename scalar_t, typename acc_t, typename index_t, typename param_t>
EDSC_CPU_INLINE inline void deform_sepconv_backward_sample_row(const DeformSepconvParams<scalar_t, index_t, param_t>& p,
                                                               const scalar_t* grad_output,
                                                               const DeformSepconvParamGrads<param_t>& grads,
                                                               acc_t* image_grad, index_t n, index_t y,
                                                               SampleRowScratch<acc_t, index_t>& b) {
  const index_t KH = p.kernel_h, KW = p.kernel_w, C = p.channels, width = p.width_out;
  const index_t hw_out = p.height_out * width;
  const index_t taps = KH * KW;
  const bool split = p.split_offsets();
  const PixelView<index_t> v_view = pixel_view<kChannelsLast>(n, y * width, KH, hw_out);
  const PixelView<index_t> h_view = pixel_view<kChannelsLast>(n, y * width, KW, hw_out);
  const PixelView<index_t> m_view = pixel_view<kChannelsLast>(n, y * width, taps, hw_out);
  const PixelView<index_t> o_view = pixel_view<kChannelsLast>(n, y * width, (split ? 1 : 2) * taps, hw_out);
  const PixelView<index_t> go_view = pixel_view<kChannelsLast>(n, y * width, C, hw_out);
  const index_t m_step = pixel_step<kChannelsLast>(taps), o_step = pixel_step<kChannelsLast>((split ? 1 : 2) * taps);
  const index_t o_tap = split ? o_view.stride : 2 * o_view.stride;  // tap t's dy to tap t + 1's
  const param_t* dx_base = split ? p.offset_dx : p.offset;
  const index_t dx_shift = split ? index_t(0) : o_view.stride;  // from a tap's dy to its dx
  load_grid_weight_rows<kChannelsLast>(p, n, y, b.v_rows, b.h_rows);
  for (index_t c = 0; c < C; ++c) {
    for (index_t x = 0; x < width; ++x) {
      b.g[c * width + x] =
          static_cast<acc_t>(grad_output[go_view.base + c * go_view.stride + x * pixel_step<kChannelsLast>(C)]);
    }
  }
  const bool param_grads = grads.any();
  if (grads.horizontal) std::fill(b.gh, b.gh + KW * width, acc_t(0));
  const index_t plane = input_channel_stride<kChannelsLast>(p), pixel_stride = input_pixel_stride<kChannelsLast>(p);
  const scalar_t* image = p.input + n * C * p.height_in * p.width_in;
  PlaneAdd<acc_t, index_t> add{image_grad, p.width_in, plane, pixel_stride};
  const int64_t y_base = static_cast<int64_t>(y) - p.pad_h, x_base = -static_cast<int64_t>(p.pad_w);
  for (index_t i = 0; i < KH; ++i) {
    const acc_t* v = b.v_rows + i * width;
    const acc_t py0 = static_cast<acc_t>(y_base + static_cast<int64_t>(i) * p.dilation_h);
    if (grads.vertical) std::fill(b.gv, b.gv + width, acc_t(0));
    for (index_t j = 0; j < KW; ++j) {
      const index_t t = i * KW + j;
      const acc_t* h = b.h_rows + j * width;
      const param_t* m = p.mask ? p.mask + m_view.base + t * m_view.stride : nullptr;
      const param_t* dy = p.offset ? p.offset + o_view.base + t * o_tap : nullptr;
      const param_t* dx = p.offset ? dx_base + o_view.base + t * o_tap + dx_shift : nullptr;
      const int64_t x0 = x_base + static_cast<int64_t>(j) * p.dilation_w;
      for (index_t x = 0; x < width; ++x) {
        acc_t py = py0, px = static_cast<acc_t>(x0 + x);
        if (dy) {
          py += static_cast<acc_t>(dy[x * o_step]);
          px += static_cast<acc_t>(dx[x * o_step]);
        }
        b.samples[x] = make_bilinear_sample<acc_t, index_t>(py, px, p.height_in, p.width_in, p.padding, pixel_stride,
                                                            p.frame_pad_h, p.frame_pad_w);
      }
      if (image_grad) {
        // The tap's weight a pixel, V_i H_j M and the doubled border's factor; 0 where the sample is
        // not finite (it then scatters zeros, as the per-pixel backward does).
        for (index_t x = 0; x < width; ++x) {
          const auto& s = b.samples[x];
          const acc_t w = v[x] * h[x] * (m ? static_cast<acc_t>(m[x * m_step]) : acc_t(1)) * s.weight_scale();
          b.ws[x] = s.finite ? w : acc_t(0);
        }
      }
      if (param_grads) {
        std::fill(b.sw, b.sw + width, acc_t(0));
        std::fill(b.sly, b.sly + width, acc_t(0));
        std::fill(b.slx, b.slx + width, acc_t(0));
      }
      for (index_t c = 0; c < C; ++c) {
        const acc_t* g = b.g + c * width;
        const scalar_t* in = image + c * plane;
        if (param_grads) {
          for (index_t x = 0; x < width; ++x) {
            const auto& s = b.samples[x];
            const Corners<acc_t> corners = load_corners<acc_t>(s, in);
            b.sw[x] += g[x] * interpolate(s, corners);
            b.sly[x] += g[x] * interpolate_dy(s, corners);
            b.slx[x] += g[x] * interpolate_dx(s, corners);
            if (image_grad) scatter_corners(s, g[x] * b.ws[x], c, add);
          }
        } else {
          for (index_t x = 0; x < width; ++x) scatter_corners(b.samples[x], g[x] * b.ws[x], c, add);
        }
      }
      if (!param_grads) continue;
      for (index_t x = 0; x < width; ++x) {
        const auto& s = b.samples[x];
        const acc_t wm = m ? static_cast<acc_t>(m[x * m_step]) : acc_t(1);
        const acc_t scale = s.weight_scale();
        acc_t grad_w = b.sw[x] * scale, grad_ly = b.sly[x] * scale, grad_lx = b.slx[x] * scale;
        if (!s.finite && C > 0) grad_w = grad_ly = grad_lx = quiet_nan<acc_t>();
        const acc_t w = v[x] * h[x] * wm;
        if (grads.vertical) b.gv[x] += grad_w * h[x] * wm;
        if (grads.horizontal) b.gh[j * width + x] += grad_w * v[x] * wm;
        if (grads.mask) {
          grads.mask[m_view.base + t * m_view.stride + x * m_step] = static_cast<param_t>(grad_w * v[x] * h[x]);
        }
        if (grads.offset) {
          const index_t at = o_view.base + t * o_tap + x * o_step;
          grads.offset[at] = static_cast<param_t>(grad_ly * w * s.y.dcoord);
          (split ? grads.offset_dx : grads.offset)[at + dx_shift] = static_cast<param_t>(grad_lx * w * s.x.dcoord);
        }
      }
    }
    if (grads.vertical) {
      for (index_t x = 0; x < width; ++x) {
        grads.vertical[v_view.base + i * v_view.stride + x * pixel_step<kChannelsLast>(KH)] =
            static_cast<param_t>(b.gv[x]);
      }
    }
  }
  if (grads.horizontal) {
    for (index_t j = 0; j < KW; ++j) {
      for (index_t x = 0; x < width; ++x) {
        grads.horizontal[h_view.base + j * h_view.stride + x * pixel_step<kChannelsLast>(KW)] =
            static_cast<param_t>(b.gh[j * width + x]);
      }
    }
  }
}

}  // namespace cpu_backward

// The CPU backward is deterministic, free of atomics, and its result does not depend on the number
// of threads, to the last bit: every plane it adds into is owned by one task and filled in pixel
// order, and how the work is split depends on the shape alone (plan_cpu_backward).
// - Usually one fused pass (each sample computed once for the parameter gradients and the input
//   gradient) over tasks of (n, band of output rows): band 0 of image n adds straight into
//   grad_input[n], later bands into scratch planes, summed into it afterwards in band order.
// - When those scratch planes would exceed the policy's scratch budget, two passes instead
//   (kPixelsTwoPass): the parameter gradients in parallel over pixels, then the input gradient in
//   parallel over (n, channel) planes (every sample of output plane (n, c) lands in input plane
//   (n, c) alone), which samples again but needs no scratch.
template <typename scalar_t, typename param_t>
void run_deform_sepconv_backward_cpu(const DeformSepconvCall& call, const CpuBackwardPlan& plan,
                                     DeformSepconvGrads& grads) {
  using namespace cpu_backward;
  using acc_t = opmath_t<scalar_t>;
  const CallFacts& f = call.facts;
  const int64_t kernel_h = f.kernel_h, kernel_w = f.kernel_w;
  using Seed = KernelTypes<kernel_facts::Dtypes<scalar_t, param_t>>;
  dispatch_cpu_loop_shape<Seed>(f, "deform_sepconv_backward_cpu", [&](auto k) {
    using K = decltype(k);
    using index_t = typename K::index_t;
    constexpr bool kChannelsLast = K::kChannelsLast;
    constexpr int kKernelH = K::kKernelH, kKernelW = K::kKernelW;
    const auto p = make_params<scalar_t, index_t, param_t>(call);
    const scalar_t* go = call.grad_output->const_data_ptr<scalar_t>();
    const auto param_grads = make_param_grads<param_t>(grads);
    // Half types accumulate the input gradient in a float plane, rounded once at the end.
    constexpr bool kSeparateAcc = !std::is_same_v<acc_t, scalar_t>;
    OptionalTensor acc;
    if (grads[0].numel() > 0) acc = kSeparateAcc ? torch::stable::to(grads[0], scalar_type_of<acc_t>()) : grads[0];
    acc_t* gin = acc.has_value() ? acc->mutable_data_ptr<acc_t>() : nullptr;
    const bool avx2 = plan.avx2;
    // Calls without offsets: the row-wise backward (deform_sepconv_backward_grid_taps_row), with
    // one scratch a task.
    const bool grid_taps = plan.kernel == CpuBackwardKernel::kGridTapRows;
    const bool sample_rows = plan.kernel == CpuBackwardKernel::kSampleRows;
    using SampleRows = SampleRowScratch<acc_t, index_t>;
    // The parameter gradients alone: no adds to share, so parallel over pixels (rows for grid taps).
    const auto parameter_grad_pass = [&] {
      if (sample_rows) {
        torch::stable::parallel_for(0, p.batch * p.height_out, std::max<int64_t>(1, kPixelGrain / p.width_out),
                                    [&](int64_t begin, int64_t end) {
                                      SampleRows scratch(kernel_h, kernel_w, p.channels, p.width_out);
                                      run_for_cpu<param_t>(avx2, [&]() EDSC_CPU_INLINE {
                                        for (int64_t row = begin; row < end; ++row) {
                                          deform_sepconv_backward_sample_row<kChannelsLast>(
                                              p, go, param_grads, static_cast<acc_t*>(nullptr),
                                              static_cast<index_t>(row / p.height_out),
                                              static_cast<index_t>(row % p.height_out), scratch);
                                        }
                                      });
                                    });
        return;
      }
      if (grid_taps) {
        torch::stable::parallel_for(
            0, p.batch * p.height_out, std::max<int64_t>(1, kPixelGrain / p.width_out),
            [&](int64_t begin, int64_t end) {
              GridTapRowScratch<acc_t> scratch(kernel_h, kernel_w, p.channels, p.width_out, p.width_in);
              run_for_cpu<param_t>(avx2, [&]() EDSC_CPU_INLINE {
                for (int64_t row = begin; row < end; ++row) {
                  deform_sepconv_backward_grid_taps_row<kChannelsLast>(
                      p, go, param_grads, static_cast<acc_t*>(nullptr), static_cast<index_t>(row / p.height_out),
                      static_cast<index_t>(row % p.height_out), scratch);
                }
              });
            });
        return;
      }
      NoInputGrad<acc_t> no_input_grad;
      for_each_output_pixel<index_t, param_t>(
          avx2, p.batch, p.height_out, p.width_out, [&](index_t n, index_t y, index_t x) EDSC_CPU_INLINE {
            deform_sepconv_backward_pixel<kCpuChannelBlock, kKernelH, kKernelW, kMaxKernelWidth, kChannelsLast,
                                          scalar_t, acc_t, index_t>(p, go, param_grads, no_input_grad, index_t(0),
                                                                    index_t(0), n, y, x);
          });
    };
    if (gin == nullptr) {
      parameter_grad_pass();
    } else {
      const int64_t image = p.channels * p.height_in * p.width_in;  // one grad_input[n], any layout
      const int64_t bands = plan.bands;
      const auto add_into = [&](acc_t* image_grad) {
        return PlaneAdd<acc_t, index_t>{image_grad, p.width_in, input_channel_stride<kChannelsLast>(p),
                                        input_pixel_stride<kChannelsLast>(p)};
      };
      if (plan.kernel != CpuBackwardKernel::kPixelsTwoPass) {
        OptionalTensor scratch;
        if (bands > 1) scratch = zeros_in(*acc, {p.batch * (bands - 1) * image}, MemoryFormat::Contiguous);
        acc_t* extra = scratch.has_value() ? scratch->mutable_data_ptr<acc_t>() : nullptr;
        torch::stable::parallel_for(0, p.batch * bands, 1, [&](int64_t begin, int64_t end) {
          std::optional<GridTapRowScratch<acc_t>> scratch;
          if (grid_taps) scratch.emplace(kernel_h, kernel_w, p.channels, p.width_out, p.width_in);
          std::optional<SampleRows> rows;
          if (sample_rows) rows.emplace(kernel_h, kernel_w, p.channels, p.width_out);
          run_for_cpu<param_t>(avx2, [&]() EDSC_CPU_INLINE {
            for (int64_t task = begin; task < end; ++task) {
              const index_t n = static_cast<index_t>(task / bands);
              const int64_t band = task % bands;
              const auto add = add_into(band == 0 ? gin + n * image : extra + (n * (bands - 1) + band - 1) * image);
              const index_t y_begin = static_cast<index_t>(band * p.height_out / bands);
              const index_t y_end = static_cast<index_t>((band + 1) * p.height_out / bands);
              if (grid_taps) {
                for (index_t y = y_begin; y < y_end; ++y) {
                  deform_sepconv_backward_grid_taps_row<kChannelsLast>(p, go, param_grads, add.grad, n, y, *scratch);
                }
                continue;
              }
              if (sample_rows) {
                for (index_t y = y_begin; y < y_end; ++y) {
                  deform_sepconv_backward_sample_row<kChannelsLast>(p, go, param_grads, add.grad, n, y, *rows);
                }
                continue;
              }
              for (index_t y = y_begin; y < y_end; ++y) {
                for (index_t x = 0; x < p.width_out; ++x) {
                  deform_sepconv_backward_pixel<kCpuChannelBlock, kKernelH, kKernelW, kMaxKernelWidth, kChannelsLast,
                                                scalar_t, acc_t, index_t>(p, go, param_grads, add, index_t(0),
                                                                          p.channels, n, y, x);
                }
              }
            }
          });
        });
        if (extra != nullptr) {
          // grad_input[n] += band 1 + band 2 + ..., in that order for every element.
          torch::stable::parallel_for(0, p.batch * image, kPixelGrain * 16, [&](int64_t begin, int64_t end) {
            for (int64_t k = begin; k < end; ++k) {
              const int64_t n = k / image, e = k % image;
              acc_t v = gin[k];
              for (int64_t b = 0; b < bands - 1; ++b) v += extra[(n * (bands - 1) + b) * image + e];
              gin[k] = v;
            }
          });
        }
      } else {
        if (param_grads.any()) parameter_grad_pass();
        // A task per (n, block of channels): blocks of kCpuChannelBlock (one sample for the
        // block) where that still makes a task per thread, single channels otherwise. A
        // channel's adds are the same either way, so the thread count changes no bit.
        const auto input_grad_pass = [&](auto channel_block) {
          constexpr int kBlock = decltype(channel_block)::value;
          const DeformSepconvParamGrads<param_t> none{};
          const index_t blocks = (p.channels + kBlock - 1) / kBlock;
          torch::stable::parallel_for(0, p.batch * blocks, 1, [&](int64_t begin, int64_t end) {
            run_for_cpu<param_t>(avx2, [&]() EDSC_CPU_INLINE {
              for (int64_t task = begin; task < end; ++task) {
                const index_t n = static_cast<index_t>(task / blocks);
                const index_t c0 = static_cast<index_t>(task % blocks) * kBlock;
                const index_t c1 = std::min<index_t>(c0 + kBlock, p.channels);
                const auto add = add_into(gin + n * image);
                for (index_t y = 0; y < p.height_out; ++y) {
                  for (index_t x = 0; x < p.width_out; ++x) {
                    deform_sepconv_backward_pixel<kBlock, kKernelH, kKernelW, kMaxKernelWidth, kChannelsLast, scalar_t,
                                                  acc_t, index_t>(p, go, none, add, c0, c1, n, y, x);
                  }
                }
              }
            });
          });
        };
        if (plan.input_grad_channel_block == kCpuChannelBlock) {
          input_grad_pass(std::integral_constant<int, kCpuChannelBlock>{});
        } else {
          input_grad_pass(std::integral_constant<int, 1>{});
        }
      }
    }
    if (kSeparateAcc && acc.has_value()) torch::stable::copy_(grads[0], *acc);
  });
}

}  // namespace edsc_ext
