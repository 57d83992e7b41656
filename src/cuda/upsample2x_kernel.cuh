// The CUDA kernels of upsample_bilinear2x (the launcher: upsample2x_cuda.cu; the tests' CUDA emulation
// includes them too). Each thread writes kVec adjacent output values with one store (16 bytes where
// kVec * sizeof(scalar_t) is 16) and reads its four input samples per value, computing in opmath_t
// and rounding once: the writes, four times the reads, are the traffic that bounds it.
#pragma once

#include "cuda_host.cuh"
#include "launch.cuh"
#include "sampling.h"  // ValueBlock, load_read_only
#include "upsample2x.h"

namespace edsc_ext {
namespace {

// channels_last (N, H, W, C) to (N, 2H, 2W, C): a thread writes kVec channels of one output pixel and
// reads each of its four input pixels' kVec channels with one load. blockIdx.y walks the output rows
// of all images (rows = N * 2H), the x dimension a row's pixels times its blocks of channels
// (channel_blocks = C / kVec).
template <typename scalar_t, int kVec>
__global__ void __launch_bounds__(kThreadsPerBlock)
    upsample2x_channels_last_cuda_kernel(const scalar_t* __restrict__ input, scalar_t* __restrict__ output,
                                         int32_t rows, int32_t in_h, int32_t in_w, int32_t channel_blocks,
                                         opmath_t<scalar_t> scale_h, opmath_t<scalar_t> scale_w) {
  using acc_t = opmath_t<scalar_t>;
  using Block = ValueBlock<scalar_t, kVec>;
  const int32_t out_h = 2 * in_h, out_w = 2 * in_w;
  const int32_t row_items = out_w * channel_blocks;
  const int64_t channels = int64_t(channel_blocks) * kVec;
  for (int32_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const int32_t n = row / out_h, oy = row - n * out_h;
    const Upsample2xTap<acc_t> ty = upsample2x_tap(oy, in_h, scale_h);
    const scalar_t* image = input + int64_t(n) * in_h * in_w * channels;
    const scalar_t* row_lo = image + int64_t(ty.lo) * in_w * channels;
    const scalar_t* row_hi = image + int64_t(ty.hi) * in_w * channels;
    scalar_t* out_row = output + int64_t(row) * out_w * channels;
    for (int32_t item = blockIdx.x * blockDim.x + threadIdx.x; item < row_items; item += gridDim.x * blockDim.x) {
      const int32_t ox = item / channel_blocks, channel = (item - ox * channel_blocks) * kVec;
      const Upsample2xTap<acc_t> tx = upsample2x_tap(ox, in_w, scale_w);
      const int64_t lo = int64_t(tx.lo) * channels + channel, hi = int64_t(tx.hi) * channels + channel;
      const Block v00 = *reinterpret_cast<const Block*>(row_lo + lo);
      const Block v01 = *reinterpret_cast<const Block*>(row_lo + hi);
      const Block v10 = *reinterpret_cast<const Block*>(row_hi + lo);
      const Block v11 = *reinterpret_cast<const Block*>(row_hi + hi);
      Block out;
      EDSC_UNROLL
      for (int k = 0; k < kVec; ++k) {
        out.v[k] =
            static_cast<scalar_t>(upsample2x_blend(ty, tx, static_cast<acc_t>(v00.v[k]), static_cast<acc_t>(v01.v[k]),
                                                   static_cast<acc_t>(v10.v[k]), static_cast<acc_t>(v11.v[k])));
      }
      *reinterpret_cast<Block*>(out_row + int64_t(ox) * channels + channel) = out;
    }
  }
}

// NCHW (N, C, H, W) to (N, C, 2H, 2W): a thread writes kVec adjacent pixels of one output row of one
// plane (kVec divides 2W); their input samples are scalar reads, mostly from L1. rows = N * C * 2H.
template <typename scalar_t, int kVec>
__global__ void __launch_bounds__(kThreadsPerBlock)
    upsample2x_nchw_cuda_kernel(const scalar_t* __restrict__ input, scalar_t* __restrict__ output, int32_t rows,
                                int32_t in_h, int32_t in_w, opmath_t<scalar_t> scale_h, opmath_t<scalar_t> scale_w) {
  using acc_t = opmath_t<scalar_t>;
  using Block = ValueBlock<scalar_t, kVec>;
  const int32_t out_h = 2 * in_h, out_w = 2 * in_w;
  const int32_t row_items = out_w / kVec;
  for (int32_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const int32_t plane = row / out_h, oy = row - plane * out_h;
    const Upsample2xTap<acc_t> ty = upsample2x_tap(oy, in_h, scale_h);
    const scalar_t* row_lo = input + (int64_t(plane) * in_h + ty.lo) * in_w;
    const scalar_t* row_hi = input + (int64_t(plane) * in_h + ty.hi) * in_w;
    scalar_t* out_row = output + int64_t(row) * out_w;
    for (int32_t item = blockIdx.x * blockDim.x + threadIdx.x; item < row_items; item += gridDim.x * blockDim.x) {
      Block out;
      EDSC_UNROLL
      for (int k = 0; k < kVec; ++k) {
        const Upsample2xTap<acc_t> tx = upsample2x_tap(item * kVec + k, in_w, scale_w);
        out.v[k] = static_cast<scalar_t>(upsample2x_blend(ty, tx, static_cast<acc_t>(load_read_only(row_lo + tx.lo)),
                                                          static_cast<acc_t>(load_read_only(row_lo + tx.hi)),
                                                          static_cast<acc_t>(load_read_only(row_hi + tx.lo)),
                                                          static_cast<acc_t>(load_read_only(row_hi + tx.hi))));
      }
      *reinterpret_cast<Block*>(out_row + int64_t(item) * kVec) = out;
    }
  }
}

}  // namespace
}  // namespace edsc_ext
