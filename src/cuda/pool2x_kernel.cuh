// The CUDA kernels of avg_pool2x (the launcher: pool2x_cuda.cu; the tests' CUDA emulation includes them
// too). Each thread writes kVec adjacent output values with one store (16 bytes where kVec *
// sizeof(scalar_t) is 16) from the four input samples of each, summed in opmath_t and rounded once: the
// reads, four times the writes, are the traffic that bounds it.
#pragma once

#include "cuda_host.cuh"
#include "launch.cuh"
#include "pool2x.h"
#include "sampling.h"  // ValueBlock, load_read_only

namespace edsc_ext {
namespace {

// channels_last (N, H, W, C) to (N, H / 2, W / 2, C): a thread writes kVec channels of one output pixel
// and reads each of its four input pixels' kVec channels with one load. blockIdx.y walks the output rows
// of all images (rows = N * (H / 2)), the x dimension a row's pixels times its blocks of channels
// (channel_blocks = C / kVec).
template <typename scalar_t, int kVec>
__global__ void __launch_bounds__(kThreadsPerBlock)
    avg_pool2x_channels_last_cuda_kernel(const scalar_t* __restrict__ input, scalar_t* __restrict__ output,
                                         int32_t rows, int32_t in_h, int32_t in_w, int32_t channel_blocks) {
  using acc_t = opmath_t<scalar_t>;
  using Block = ValueBlock<scalar_t, kVec>;
  const int32_t out_h = in_h / 2, out_w = in_w / 2;
  const int32_t row_items = out_w * channel_blocks;
  const int64_t channels = int64_t(channel_blocks) * kVec;
  for (int32_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const int32_t n = row / out_h, oy = row - n * out_h;
    const scalar_t* top = input + (int64_t(n) * in_h + 2 * oy) * in_w * channels;
    const scalar_t* bottom = top + int64_t(in_w) * channels;
    scalar_t* out_row = output + int64_t(row) * out_w * channels;
    for (int32_t item = blockIdx.x * blockDim.x + threadIdx.x; item < row_items; item += gridDim.x * blockDim.x) {
      const int32_t ox = item / channel_blocks, channel = (item - ox * channel_blocks) * kVec;
      const int64_t left = int64_t(2 * ox) * channels + channel, right = left + channels;
      const Block v00 = *reinterpret_cast<const Block*>(top + left);
      const Block v01 = *reinterpret_cast<const Block*>(top + right);
      const Block v10 = *reinterpret_cast<const Block*>(bottom + left);
      const Block v11 = *reinterpret_cast<const Block*>(bottom + right);
      Block out;
      EDSC_UNROLL
      for (int k = 0; k < kVec; ++k) {
        out.v[k] = static_cast<scalar_t>(avg_pool2x_value(static_cast<acc_t>(v00.v[k]), static_cast<acc_t>(v01.v[k]),
                                                          static_cast<acc_t>(v10.v[k]), static_cast<acc_t>(v11.v[k])));
      }
      *reinterpret_cast<Block*>(out_row + int64_t(ox) * channels + channel) = out;
    }
  }
}

// NCHW (N, C, H, W) to (N, C, H / 2, W / 2): a thread writes kVec adjacent pixels of one output row of one
// plane (kVec divides W / 2); a warp's reads of its two input rows are contiguous. rows = N * C * (H / 2).
template <typename scalar_t, int kVec>
__global__ void __launch_bounds__(kThreadsPerBlock)
    avg_pool2x_nchw_cuda_kernel(const scalar_t* __restrict__ input, scalar_t* __restrict__ output, int32_t rows,
                                int32_t in_h, int32_t in_w) {
  using acc_t = opmath_t<scalar_t>;
  using Block = ValueBlock<scalar_t, kVec>;
  const int32_t out_h = in_h / 2, out_w = in_w / 2;
  const int32_t row_items = out_w / kVec;
  for (int32_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const int32_t plane = row / out_h, oy = row - plane * out_h;
    const scalar_t* top = input + (int64_t(plane) * in_h + 2 * oy) * in_w;
    const scalar_t* bottom = top + in_w;
    scalar_t* out_row = output + int64_t(row) * out_w;
    for (int32_t item = blockIdx.x * blockDim.x + threadIdx.x; item < row_items; item += gridDim.x * blockDim.x) {
      Block out;
      EDSC_UNROLL
      for (int k = 0; k < kVec; ++k) {
        const int32_t x = 2 * (item * kVec + k);
        out.v[k] = static_cast<scalar_t>(avg_pool2x_value(
            static_cast<acc_t>(load_read_only(top + x)), static_cast<acc_t>(load_read_only(top + x + 1)),
            static_cast<acc_t>(load_read_only(bottom + x)), static_cast<acc_t>(load_read_only(bottom + x + 1))));
      }
      *reinterpret_cast<Block*>(out_row + int64_t(item) * kVec) = out;
    }
  }
}

}  // namespace
}  // namespace edsc_ext
