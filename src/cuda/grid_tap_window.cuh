// The grid-tap kernels' shared pieces: calls without offsets and dilation (sepconv), whose taps
// sit on the pixel grid, so that a tap's sample is one input pixel (grid_tap_pixel) and
// neighbouring output pixels read neighbouring pixels for the same tap. A block of
// kGridTileHeight x kGridTileWidth output pixels copies the input window its taps cover (KH - 1
// more rows, KW - 1 more columns, as acc_t) to shared memory once, and the taps read it there:
// the bilinear kernels made four gathers from global memory per tap and channel, and sepconv's
// 51x51 forward took 45.2 ms (1 x 3 x 1088 x 1920, float32, H200; BENCHMARKS.md). One difference
// from the bilinear formula: a non-finite input pixel no longer leaks into the samples of its
// neighbours (as 0 * inf, with weight 0); README.md says so.
#pragma once

#include "deform_sepconv_cuda.cuh"

namespace edsc_ext {

constexpr int kGridTileWidth = kWarpSize;  // a warp a row of output pixels: conflict-free loads
constexpr int kGridTileHeight = 8;
constexpr int kGridTileThreads = kGridTileWidth * kGridTileHeight;
// Weights a thread holds in registers at a time: kGridTapChunk x kGridTapChunk taps.
constexpr int kGridTapChunk = 8;

// The input window of one channel: kGridTileHeight + KH - 1 rows, kGridTileWidth + KW - 1 columns.
struct GridWindow {
  int rows = 0, cols = 0;
  __host__ __device__ int size() const { return rows * cols; }
};

// Whether a call can take the grid-tap kernels (takes_grid_taps, float32 or a half type, N and the
// tile rows within a grid dimension), and the window (bytes of one channel's in `channel_bytes`).
inline bool grid_taps_apply(const DeformSepconvTensors& t, const DeformSepconvConfig& cfg, GridWindow& window,
                            int64_t& channel_bytes) {
  if (!takes_grid_taps(t, cfg) || t.input.element_size() > 4) return false;
  if (t.input.size(0) > 65535 || (t.height_out + kGridTileHeight - 1) / kGridTileHeight > 65535) return false;
  const int64_t rows = kGridTileHeight + cfg.kernel_h - 1, cols = kGridTileWidth + cfg.kernel_w - 1;
  channel_bytes = rows * cols * static_cast<int64_t>(sizeof(float));  // acc_t of the <= 4-byte types
  if (channel_bytes > at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin) return false;
  window = {static_cast<int>(rows), static_cast<int>(cols)};  // small: they fit shared memory
  return true;
}

inline dim3 grid_taps_grid(const DeformSepconvTensors& t) {
  return dim3(static_cast<unsigned int>((t.width_out + kGridTileWidth - 1) / kGridTileWidth),
              static_cast<unsigned int>((t.height_out + kGridTileHeight - 1) / kGridTileHeight),
              static_cast<unsigned int>(t.input.size(0)));
}

// Opts the kernel in to `shared` bytes of dynamic shared memory where that is past the default 48 KB.
template <typename Kernel>
void allow_grid_taps_shared(Kernel kernel, size_t shared) {
  if (shared > 48 * 1024) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  }
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
    const bool row_inside = grid_tap_pixel(iy, p.height_in, p.padding_mode);
    for (int q = threadIdx.x % kWarpSize; q < window.cols; q += kWarpSize) {
      int64_t ix = x0 - p.pad_w + q;
      const bool inside = row_inside & grid_tap_pixel(ix, p.width_in, p.padding_mode);
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
