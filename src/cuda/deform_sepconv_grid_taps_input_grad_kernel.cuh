// The CUDA backward's gathered input gradient kernel (the launcher: deform_sepconv_grid_taps_input_grad_cuda.cu, which
// says what it does; the tests' CUDA emulation includes it too).
#pragma once

#include "deform_sepconv_backward_cuda.cuh"
#include "grid_tap_window.cuh"

namespace edsc_ext {
namespace {

// VirtualDomain and GatherLayout, which the planner sizes, are in cuda_plan.h.

template <int kChannels, bool kChannelsLast, typename scalar_t>
__global__ void __launch_bounds__(kGridTileThreads)
    deform_sepconv_input_grad_grid_taps_cuda_kernel(const DeformSepconvParams<scalar_t, int64_t> p,
                                                    const scalar_t* __restrict__ grad_output,
                                                    opmath_t<scalar_t>* __restrict__ grad_virtual,
                                                    const VirtualDomain domain, const GatherLayout layout) {
  using acc_t = opmath_t<scalar_t>;
  EDSC_EXTERN_SHARED(unsigned char, gather_raw);
  acc_t* h_staged = reinterpret_cast<acc_t*>(gather_raw);         // [kGridTileWidth][h_stride]
  acc_t* a_staged = h_staged + kGridTileWidth * layout.h_stride;  // [kChannels][kGridTileHeight][a_row]

  const int KH = static_cast<int>(p.kernel_h), KW = static_cast<int>(p.kernel_w);
  const int64_t n = blockIdx.z;
  const int ty = threadIdx.x / kGridTileWidth, tx = threadIdx.x % kGridTileWidth;
  const int64_t u_y0 = domain.y0 + int64_t(blockIdx.y) * kGridTileHeight;
  const int64_t u_x0 = domain.x0 + int64_t(blockIdx.x) * kGridTileWidth;
  const int64_t hw_out = p.height_out * p.width_out;
  // Output column of thread column d's tap j: u_x0 + d + pad_w - j; product slot k holds column
  // o_x_last - k, so that thread d's tap j is slot 31 - d + j.
  const int64_t o_x_last = u_x0 + kGridTileWidth - 1 + p.pad_w;  // k = 0 (thread 31, tap 0)

  acc_t acc[kChannels];
  EDSC_UNROLL
  for (int cc = 0; cc < kChannels; ++cc) acc[cc] = acc_t(0);
  // Output rows that reach the tile: o_y = u_y + pad_h - i for i in [0, KH).
  const int64_t first_reaching = u_y0 + p.pad_h - (KH - 1), past_reaching = u_y0 + kGridTileHeight + p.pad_h;
  const int64_t r_begin = first_reaching > 0 ? first_reaching : 0;
  const int64_t r_end = past_reaching < p.height_out ? past_reaching : p.height_out;
  for (int64_t r = r_begin; r < r_end; ++r) {
    __syncthreads();  // the previous row is done with the shared memory
    // H: thread column d, tap j <- H_j(r, o_x_last - 31 + d - j); zero past KW or outside the output.
    const PixelView<int64_t> h_row = pixel_view<kChannelsLast>(n, r * p.width_out, int64_t(KW), hw_out);
    for (int e = threadIdx.x; e < kGridTileWidth * layout.taps_padded; e += kGridTileThreads) {
      const int j = e / kGridTileWidth, d = e % kGridTileWidth;  // d fastest: adjacent columns
      const int64_t ox = o_x_last - (kGridTileWidth - 1) + d - j;
      const bool inside = j < KW && ox >= 0 && ox < p.width_out;
      h_staged[d * layout.h_stride + j] =
          inside ? load_param_or(p.horizontal, h_row.base + ox * (kChannelsLast ? KW : 1) + j * h_row.stride, acc_t(1))
                 : acc_t(0);
    }
    // Products: tile row t (its tap row i = u_y0 + t + pad_h - r), slot k <- dL/dout_c V_i at
    // column o_x_last - k; zero where i or the column is out of range.
    const PixelView<int64_t> v_row = pixel_view<kChannelsLast>(n, r * p.width_out, int64_t(KH), hw_out);
    const PixelView<int64_t> go_row = pixel_view<kChannelsLast>(n, r * p.width_out, p.channels, hw_out);
    for (int e = threadIdx.x; e < kGridTileHeight * layout.a_row; e += kGridTileThreads) {
      const int t = e / layout.a_row, k = e % layout.a_row;
      const int64_t ox = o_x_last - k;
      const int64_t i = u_y0 + t + p.pad_h - r;
      const bool inside = i >= 0 && i < KH && ox >= 0 && ox < p.width_out;
      const acc_t wv =
          inside ? load_param_or(p.vertical, v_row.base + ox * (kChannelsLast ? KH : 1) + i * v_row.stride, acc_t(1))
                 : acc_t(0);
      const scalar_t* go = grad_output + go_row.base + ox * (kChannelsLast ? p.channels : 1);
      EDSC_UNROLL
      for (int cc = 0; cc < kChannels; ++cc) {
        a_staged[(cc * kGridTileHeight + t) * layout.a_row + k] =
            inside ? wv * static_cast<acc_t>(go[cc * go_row.stride]) : acc_t(0);
      }
    }
    __syncthreads();
    const int64_t i = u_y0 + ty + p.pad_h - r;
    if (i < 0 || i >= KH) continue;  // the same for the whole warp (one tile row)
    const float4* h_own = reinterpret_cast<const float4*>(h_staged + tx * layout.h_stride);
    const acc_t* a_own = a_staged + ty * layout.a_row + (kGridTileWidth - 1 - tx);
    // Whole groups of 4 taps, then the last few (not the padding: 0 * inf would be NaN).
    const auto add_taps = [&](int j0, int count) {
      const float4 h4 = h_own[j0 / 4];
      const acc_t hv[4] = {h4.x, h4.y, h4.z, h4.w};
      EDSC_UNROLL
      for (int jj = 0; jj < 4; ++jj) {
        if (jj >= count) break;
        EDSC_UNROLL
        for (int cc = 0; cc < kChannels; ++cc) acc[cc] += hv[jj] * a_own[cc * kGridTileHeight * layout.a_row + j0 + jj];
      }
    };
    int j0 = 0;
    for (; j0 + 4 <= KW; j0 += 4) add_taps(j0, 4);
    if (j0 < KW) add_taps(j0, KW - j0);
  }
  const int64_t vy = u_y0 - domain.y0 + ty, vx = u_x0 - domain.x0 + tx;
  if (vy >= domain.height || vx >= domain.width) return;
  const int64_t plane = domain.height * domain.width;
  acc_t* out = grad_virtual + n * p.channels * plane + vy * domain.width + vx;
  EDSC_UNROLL
  for (int cc = 0; cc < kChannels; ++cc) out[cc * plane] = acc[cc];
}

// Virtual index v of dimension `dim` is image index clamp(v - before, 0, size - 1): sums the
// slices that clamp to the first and the last index into them.
Tensor fold_clamped(Tensor g, int64_t dim, int64_t before, int64_t size) {  // by value: stable narrow takes Tensor&
  const auto sum_along = [&](const Tensor& v) { return torch::stable::sum(v, std::vector<int64_t>{dim}, true); };
  if (size == 1) return sum_along(g);
  const int64_t after = g.size(dim) - before - size;
  std::vector<Tensor> parts{sum_along(torch::stable::narrow(g, dim, 0, before + 1))};
  if (size > 2) parts.push_back(torch::stable::narrow(g, dim, before + 1, size - 2));
  parts.push_back(sum_along(torch::stable::narrow(g, dim, before + size - 1, after + 1)));
  return call_aten("aten::cat", "", parts, dim);
}

}  // namespace
}  // namespace edsc_ext
