// The CUDA backward's grid-tap kernel of the per-pixel tensors' gradients (the launcher:
// deform_sepconv_backward_grid_taps_cuda.cu, which says what it does; the tests' CUDA emulation includes it too).
#pragma once

#include "deform_sepconv_backward_cuda.cuh"
#include "grid_tap_window.cuh"

namespace edsc_ext {
namespace {

// Parameter gradients of the grid-tap calls (grid_tap_window.cuh) with up to 4 channels, all in one
// window. Per tap, s = sum_c dL/dout_c * window_c (one shared-memory load and one multiply-add a
// channel), then dV_i += H_j M_t s, dH_j += V_i M_t s and dM_t = V_i H_j s. Each thread owns one
// output pixel; it sums dV of kGridTapChunk rows in registers and dH of the chunk's columns, added
// after each chunk to its own column of KW sums in shared memory. The input gradient is gathered
// (deform_sepconv_grid_taps_input_grad_cuda.cu) where there is no mask, else scattered by the
// bilinear kernels. The bilinear backward spent four global gathers and their bilinear derivatives
// per tap and channel on these gradients.
template <bool kWhole, int kChannels, bool kMask, typename scalar_t, typename acc_t>
__device__ __forceinline__ void accumulate_grid_grad_chunk(const acc_t* first, const GridWindow& window,
                                                           const acc_t (&g)[kChannels], const scalar_t* first_mask,
                                                           scalar_t* first_mask_grad, int64_t mask_row,
                                                           int64_t mask_column, const acc_t (&wv)[kGridTapChunk],
                                                           const acc_t (&wh)[kGridTapChunk], int rows, int cols,
                                                           acc_t (&grad_v)[kGridTapChunk],
                                                           acc_t (&grad_h)[kGridTapChunk]) {
  const int window_size = window.size();
  EDSC_UNROLL
  for (int ii = 0; ii < kGridTapChunk; ++ii) {
    if (!kWhole && ii >= rows) break;
    const acc_t* row = first + ii * window.cols;
    EDSC_UNROLL
    for (int jj = 0; jj < kGridTapChunk; ++jj) {
      if (!kWhole && jj >= cols) break;
      acc_t s = acc_t(0);
      EDSC_UNROLL
      for (int cc = 0; cc < kChannels; ++cc) s += g[cc] * row[cc * window_size + jj];
      if constexpr (kMask) {
        const int64_t at = ii * mask_row + jj * mask_column;
        if (first_mask_grad) first_mask_grad[at] = static_cast<scalar_t>(wv[ii] * wh[jj] * s);
        s *= static_cast<acc_t>(first_mask[at]);
      }
      grad_v[ii] += wh[jj] * s;
      grad_h[jj] += wv[ii] * s;
    }
  }
}

template <int kChannels, bool kChannelsLast, bool kMask, typename scalar_t>
__global__ void __launch_bounds__(kGridTileThreads, 2)  // at most 128 registers: the mask's addresses took 255
    deform_sepconv_backward_grid_taps_cuda_kernel(const DeformSepconvParams<scalar_t, int64_t> p,
                                                  const scalar_t* __restrict__ grad_output,
                                                  const DeformSepconvParamGrads<scalar_t> grads,
                                                  const GridWindow window) {
  using acc_t = opmath_t<scalar_t>;
  EDSC_EXTERN_SHARED(unsigned char, window_raw);
  acc_t* staged = reinterpret_cast<acc_t*>(window_raw);     // [kChannels][window.rows][window.cols]
  acc_t* grad_h_sums = staged + kChannels * window.size();  // [KW][kGridTileThreads], if wanted

  const int64_t n = blockIdx.z;
  const int ty = threadIdx.x / kGridTileWidth, tx = threadIdx.x % kGridTileWidth;
  const int64_t y0 = int64_t(blockIdx.y) * kGridTileHeight, x0 = int64_t(blockIdx.x) * kGridTileWidth;
  const int64_t y = y0 + ty, x = x0 + tx;
  const int KH = static_cast<int>(p.kernel_h), KW = static_cast<int>(p.kernel_w);  // small: the window fits
  stage_grid_window<kChannels, kChannelsLast>(staged, window, p, n, 0, y0, x0);
  if (grads.horizontal) {
    for (int j = 0; j < KW; ++j) grad_h_sums[j * kGridTileThreads + threadIdx.x] = acc_t(0);  // own column
  }
  __syncthreads();
  if (y >= p.height_out || x >= p.width_out) return;

  const int64_t hw_out = p.height_out * p.width_out;
  const int64_t pixel = y * p.width_out + x;
  const PixelView<int64_t> vertical_view = pixel_view<kChannelsLast>(n, pixel, int64_t(KH), hw_out);
  const PixelView<int64_t> horizontal_view = pixel_view<kChannelsLast>(n, pixel, int64_t(KW), hw_out);
  const PixelView<int64_t> mask_view = pixel_view<kChannelsLast>(n, pixel, int64_t(KH) * KW, hw_out);
  const PixelView<int64_t> go_view = pixel_view<kChannelsLast>(n, pixel, p.channels, hw_out);
  acc_t g[kChannels];
  EDSC_UNROLL
  for (int cc = 0; cc < kChannels; ++cc) g[cc] = static_cast<acc_t>(grad_output[go_view.base + cc * go_view.stride]);

  const acc_t* own = staged + ty * window.cols + tx;  // tap (0, 0) of this thread's pixel
  for (int i0 = 0; i0 < KH; i0 += kGridTapChunk) {
    acc_t wv[kGridTapChunk], grad_v[kGridTapChunk];
    load_grid_weights(wv, p.vertical, vertical_view.base + i0 * vertical_view.stride, vertical_view.stride, KH - i0);
    EDSC_UNROLL
    for (int ii = 0; ii < kGridTapChunk; ++ii) grad_v[ii] = acc_t(0);
    for (int j0 = 0; j0 < KW; j0 += kGridTapChunk) {
      acc_t wh[kGridTapChunk], grad_h[kGridTapChunk];
      load_grid_weights(wh, p.horizontal, horizontal_view.base + j0 * horizontal_view.stride, horizontal_view.stride,
                        KW - j0);
      EDSC_UNROLL
      for (int jj = 0; jj < kGridTapChunk; ++jj) grad_h[jj] = acc_t(0);
      const acc_t* first = own + i0 * window.cols + j0;
      const int64_t mask_first = mask_view.base + (int64_t(i0) * KW + j0) * mask_view.stride;
      const scalar_t* first_mask = kMask ? p.mask + mask_first : nullptr;
      scalar_t* first_mask_grad = kMask && grads.mask ? grads.mask + mask_first : nullptr;
      // Whole chunks, the common case, with no bounds tests; the last row and column chunks with.
      if (i0 + kGridTapChunk <= KH && j0 + kGridTapChunk <= KW) {
        accumulate_grid_grad_chunk<true, kChannels, kMask>(first, window, g, first_mask, first_mask_grad,
                                                           KW * mask_view.stride, mask_view.stride, wv, wh,
                                                           kGridTapChunk, kGridTapChunk, grad_v, grad_h);
      } else {
        accumulate_grid_grad_chunk<false, kChannels, kMask>(first, window, g, first_mask, first_mask_grad,
                                                            KW * mask_view.stride, mask_view.stride, wv, wh, KH - i0,
                                                            KW - j0, grad_v, grad_h);
      }
      if (grads.horizontal) {
        EDSC_UNROLL
        for (int jj = 0; jj < kGridTapChunk; ++jj) {
          if (j0 + jj < KW) grad_h_sums[(j0 + jj) * kGridTileThreads + threadIdx.x] += grad_h[jj];
        }
      }
    }
    if (grads.vertical) {
      EDSC_UNROLL
      for (int ii = 0; ii < kGridTapChunk; ++ii) {
        if (i0 + ii < KH) {
          grads.vertical[vertical_view.base + (i0 + ii) * vertical_view.stride] = static_cast<scalar_t>(grad_v[ii]);
        }
      }
    }
  }
  if (grads.horizontal) {
    for (int j = 0; j < KW; ++j) {
      grads.horizontal[horizontal_view.base + j * horizontal_view.stride] =
          static_cast<scalar_t>(grad_h_sums[j * kGridTileThreads + threadIdx.x]);
    }
  }
}

}  // namespace
}  // namespace edsc_ext
