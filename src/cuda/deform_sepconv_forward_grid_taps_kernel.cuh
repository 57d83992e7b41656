// The CUDA forward's grid-tap kernel (the launcher: deform_sepconv_forward_grid_taps_cuda.cu, which says what it does;
// the tests' CUDA emulation includes it too).
#pragma once

#include "deform_sepconv_forward_cuda.cuh"
#include "grid_tap_window.cuh"

namespace edsc_ext {
namespace {

// kGridTapChunk x kGridTapChunk taps (rows < `rows`, columns < `cols` unless kWhole) of one output
// pixel, whose tap (i0, j0) is window value `first` of each staged channel: acc[c] += wv[ii] *
// sum_jj wh[jj] * mask * window. The mask's values of row ii start at first_mask + ii * mask_row.
template <bool kWhole, int kPassChannels, bool kMask, typename scalar_t, typename acc_t>
__device__ __forceinline__ void accumulate_grid_chunk(const acc_t* first, const GridWindow& window,
                                                      const scalar_t* first_mask, int64_t mask_row, int64_t mask_column,
                                                      const acc_t (&wv)[kGridTapChunk],
                                                      const acc_t (&wh)[kGridTapChunk], int64_t rows, int64_t cols,
                                                      acc_t (&acc)[kPassChannels]) {
  const int window_size = window.size();
  EDSC_UNROLL
  for (int ii = 0; ii < kGridTapChunk; ++ii) {
    if (!kWhole && ii >= rows) break;
    const acc_t* row = first + ii * window.cols;
    acc_t sum[kPassChannels];
    EDSC_UNROLL
    for (int cc = 0; cc < kPassChannels; ++cc) sum[cc] = acc_t(0);
    EDSC_UNROLL
    for (int jj = 0; jj < kGridTapChunk; ++jj) {
      if (!kWhole && jj >= cols) break;
      acc_t w = wh[jj];
      if constexpr (kMask) w *= static_cast<acc_t>(first_mask[ii * mask_row + jj * mask_column]);
      EDSC_UNROLL
      for (int cc = 0; cc < kPassChannels; ++cc) sum[cc] += w * row[cc * window_size + jj];
    }
    EDSC_UNROLL
    for (int cc = 0; cc < kPassChannels; ++cc) acc[cc] += wv[ii] * sum[cc];
  }
}

template <int kPassChannels, bool kChannelsLast, bool kMask, typename scalar_t>
__global__ void __launch_bounds__(kGridTileThreads)
    deform_sepconv_forward_grid_taps_cuda_kernel(const DeformSepconvParams<scalar_t, int64_t> p,
                                                 scalar_t* __restrict__ output, const GridWindow window) {
  using acc_t = opmath_t<scalar_t>;
  EDSC_EXTERN_SHARED(unsigned char, window_raw);
  acc_t* staged = reinterpret_cast<acc_t*>(window_raw);  // [kPassChannels][window.rows][window.cols]
  const int window_size = window.size();

  const int64_t n = blockIdx.z;
  const int ty = threadIdx.x / kGridTileWidth, tx = threadIdx.x % kGridTileWidth;
  const int64_t y0 = int64_t(blockIdx.y) * kGridTileHeight, x0 = int64_t(blockIdx.x) * kGridTileWidth;
  const int64_t y = y0 + ty, x = x0 + tx;
  const bool active = y < p.height_out && x < p.width_out;
  const int KH = static_cast<int>(p.kernel_h), KW = static_cast<int>(p.kernel_w);  // small: the window fits
  const int64_t hw_out = p.height_out * p.width_out;
  const int64_t pixel = active ? y * p.width_out + x : 0;
  const PixelView<int64_t> vertical_view = pixel_view<kChannelsLast>(n, pixel, int64_t(KH), hw_out);
  const PixelView<int64_t> horizontal_view = pixel_view<kChannelsLast>(n, pixel, int64_t(KW), hw_out);
  const PixelView<int64_t> mask_view = pixel_view<kChannelsLast>(n, pixel, int64_t(KH) * KW, hw_out);
  const PixelView<int64_t> out_view = pixel_view<kChannelsLast>(n, pixel, p.channels, hw_out);

  for (int64_t c0 = 0; c0 < p.channels; c0 += kPassChannels) {
    __syncthreads();  // the previous pass is done reading the window
    stage_grid_window<kPassChannels, kChannelsLast>(staged, window, p, n, c0, y0, x0);
    __syncthreads();
    if (!active) continue;

    acc_t acc[kPassChannels];
    EDSC_UNROLL
    for (int cc = 0; cc < kPassChannels; ++cc) acc[cc] = acc_t(0);
    const acc_t* own = staged + ty * window.cols + tx;  // tap (0, 0) of this thread's pixel
    const scalar_t* own_mask = kMask ? p.mask + mask_view.base : nullptr;
    for (int i0 = 0; i0 < KH; i0 += kGridTapChunk) {
      acc_t wv[kGridTapChunk];
      load_grid_weights(wv, p.vertical, vertical_view.base + i0 * vertical_view.stride, vertical_view.stride, KH - i0);
      for (int j0 = 0; j0 < KW; j0 += kGridTapChunk) {
        acc_t wh[kGridTapChunk];
        load_grid_weights(wh, p.horizontal, horizontal_view.base + j0 * horizontal_view.stride, horizontal_view.stride,
                          KW - j0);
        const acc_t* first = own + i0 * window.cols + j0;
        const scalar_t* first_mask = kMask ? own_mask + (int64_t(i0) * KW + j0) * mask_view.stride : nullptr;
        // Whole chunks, the common case, with no bounds tests; the last row and column chunks with.
        if (i0 + kGridTapChunk <= KH && j0 + kGridTapChunk <= KW) {
          accumulate_grid_chunk<true, kPassChannels, kMask>(first, window, first_mask, KW * mask_view.stride,
                                                            mask_view.stride, wv, wh, kGridTapChunk, kGridTapChunk,
                                                            acc);
        } else {
          accumulate_grid_chunk<false, kPassChannels, kMask>(first, window, first_mask, KW * mask_view.stride,
                                                             mask_view.stride, wv, wh, KH - i0, KW - j0, acc);
        }
      }
    }
    scalar_t* out = output + out_view.base + c0 * out_view.stride;
    EDSC_UNROLL
    for (int cc = 0; cc < kPassChannels; ++cc) out[cc * out_view.stride] = static_cast<scalar_t>(acc[cc]);
  }
}

}  // namespace
}  // namespace edsc_ext
