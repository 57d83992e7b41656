// The grid-tap kernels' shared pieces: calls without offsets and dilation (sepconv), whose taps
// sit on the pixel grid, so that a tap's sample is one input pixel (grid_tap_pixel) and
// neighbouring output pixels read neighbouring pixels for the same tap. A block of
// kGridTileHeight x kGridTileWidth output pixels copies the input window its taps cover (KH - 1
// more rows, KW - 1 more columns, as acc_t) to shared memory once, and the taps read it there:
// the bilinear kernels made four gathers from global memory per tap and channel (BENCHMARKS.md has
// the times before and after). One difference
// from the bilinear formula: a non-finite input pixel no longer leaks into the samples of its
// neighbours (as 0 * inf, with weight 0); README.md says so.
#pragma once

#include "deform_sepconv_cuda.cuh"

namespace edsc_ext {

// Weights a thread holds in registers at a time: kGridTapChunk x kGridTapChunk taps. (The tile
// sizes and the window, GridWindow, are in cuda_plan.h, which plans these kernels.)
constexpr int kGridTapChunk = 8;

inline dim3 grid_taps_grid(const CallFacts& f) {
  return dim3(static_cast<unsigned int>((f.width_out + kGridTileWidth - 1) / kGridTileWidth),
              static_cast<unsigned int>((f.height_out + kGridTileHeight - 1) / kGridTileHeight),
              static_cast<unsigned int>(f.batch));
}

// Every thread of the block: copies channels c0 .. c0 + kPassChannels - 1 of the window of the
// tile whose first output pixel is (y0, x0) into staged[channel][row][column]. Window row r,
// column q is input pixel (y0 - pad_h + r, x0 - pad_w + q): tap (i, j) of output pixel
// (y0 + ty, x0 + tx) reads row ty + i, column tx + j. A warp copies a row at a time, its lanes
// along the row (no division per element).
template <int kPassChannels, bool kChannelsLast, typename scalar_t, typename acc_t>
__device__ __forceinline__ void stage_grid_window(acc_t* staged, const GridWindow& window,
                                                  const DeformSepconvParams<scalar_t, int64_t>& p, int64_t n,
                                                  int64_t c0, int64_t y0, int64_t x0) {
  const int64_t plane = input_channel_stride<kChannelsLast>(p);
  const int64_t pixel_stride = input_pixel_stride<kChannelsLast>(p);
  const scalar_t* in = p.input + n * p.channels * p.height_in * p.width_in + c0 * plane;
  const int window_size = window.size();
  for (int r = threadIdx.x / kWarpSize; r < window.rows; r += kGridTileThreads / kWarpSize) {
    int64_t iy = y0 - p.pad_h + r;
    const bool row_inside = grid_tap_pixel(iy, p.height_in, p.padding);
    for (int q = threadIdx.x % kWarpSize; q < window.cols; q += kWarpSize) {
      int64_t ix = x0 - p.pad_w + q;
      const bool inside = row_inside & grid_tap_pixel(ix, p.width_in, p.padding);
      const scalar_t* pixel = in + (iy * p.width_in + ix) * pixel_stride;
      EDSC_UNROLL
      for (int cc = 0; cc < kPassChannels; ++cc) {
        staged[cc * window_size + r * window.cols + q] = inside ? static_cast<acc_t>(pixel[cc * plane]) : acc_t(0);
      }
    }
  }
}

// Loads kGridTapChunk consecutive values first, first + stride, ... of a per-pixel tensor (1 for an
// absent one), 0 past `valid`.
template <typename scalar_t, typename acc_t>
__device__ __forceinline__ void load_grid_weights(acc_t (&w)[kGridTapChunk], const scalar_t* tensor, int64_t first,
                                                  int64_t stride, int valid) {
  EDSC_UNROLL
  for (int k = 0; k < kGridTapChunk; ++k) {
    w[k] = k < valid ? load_param_or(tensor, first + k * stride, acc_t(1)) : acc_t(0);
  }
}

}  // namespace edsc_ext
