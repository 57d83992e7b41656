// The CUDA forward's staged kernel (the launcher: deform_sepconv_forward_staged_cuda.cu, which says what it does; the
// tests' CUDA emulation includes it too).
#pragma once

#include "deform_sepconv_forward_cuda.cuh"

namespace edsc_ext {
namespace {

constexpr int kStagedKernel = kSpecializedKernel;
// Channels a thread samples per step (the planner sends 1, 2 or 4 channels here).
constexpr int kStagedChannelBlock = 4;
// Shared-memory rows of kStagedPixels values: the horizontal kernel, then per row of taps its
// vertical weight, 2K offsets and K mask values.
constexpr int kStagedRowSegments = 1 + 3 * kStagedKernel;
constexpr int kStagedSegments = kStagedKernel + kStagedKernel * kStagedRowSegments;

// Copies `count` consecutive channel planes' segments [p0, p0 + valid) (channel m at
// first + m * hw) into shared rows dst + m * kStagedPixels, in kChunk-byte pieces spread over the
// block; the part of a row past `valid` is zero-filled.
template <int kChunk, typename scalar_t>
__device__ __forceinline__ void stage_segments(scalar_t* dst, const scalar_t* first, int count, int hw, int valid) {
  constexpr int kPerChunk = kChunk / static_cast<int>(sizeof(scalar_t));
  constexpr int kChunksPerRow = kStagedPixels / kPerChunk;
  for (int e = threadIdx.x; e < count * kChunksPerRow; e += kStagedPixels) {
    const int m = e / kChunksPerRow;
    const int begin = (e % kChunksPerRow) * kPerChunk;
    const int elements = min(kPerChunk, max(0, valid - begin));
    copy_async<kChunk>(dst + m * kStagedPixels + begin, first + m * hw + (elements > 0 ? begin : 0),
                       elements * static_cast<int>(sizeof(scalar_t)));
  }
}

template <int kChannelBlock, int kChunk, typename scalar_t>
__global__ void __launch_bounds__(kStagedPixels)
    deform_sepconv_forward_staged_cuda_kernel(const DeformSepconvParams<scalar_t, int32_t> p,
                                              scalar_t* __restrict__ output) {
  using acc_t = opmath_t<scalar_t>;
  constexpr int K = kStagedKernel;
  EDSC_EXTERN_SHARED(unsigned char, staged_raw);
  scalar_t* staged = reinterpret_cast<scalar_t*>(staged_raw);

  const int hw = p.height_out * p.width_out;
  const int blocks_per_image = (hw + kStagedPixels - 1) / kStagedPixels;
  const int n = static_cast<int>(blockIdx.x) / blocks_per_image;
  const int p0 = (static_cast<int>(blockIdx.x) % blocks_per_image) * kStagedPixels;
  const int valid = min(kStagedPixels, hw - p0);

  EDSC_UNROLL
  for (int i = 0; i < K; ++i) {
    if (i == 0 && p.horizontal) stage_segments<kChunk>(staged, p.horizontal + n * K * hw + p0, K, hw, valid);
    scalar_t* row = staged + (K + i * kStagedRowSegments) * kStagedPixels;
    if (p.vertical) stage_segments<kChunk>(row, p.vertical + (n * K + i) * hw + p0, 1, hw, valid);
    if (p.offset) {
      stage_segments<kChunk>(row + kStagedPixels, p.offset + (n * 2 * K * K + 2 * K * i) * hw + p0, 2 * K, hw, valid);
    }
    if (p.mask) {
      stage_segments<kChunk>(row + (1 + 2 * K) * kStagedPixels, p.mask + (n * K * K + K * i) * hw + p0, K, hw, valid);
    }
    copy_async_commit();
  }

  const int t = threadIdx.x;
  const bool active = t < valid;
  const int pixel = p0 + t;
  const int y = pixel / p.width_out, x = pixel % p.width_out;
  const int plane = p.height_in * p.width_in;
  const int64_t y_base = static_cast<int64_t>(y) - p.pad_h;
  const int64_t x_base = static_cast<int64_t>(x) - p.pad_w;
  const auto staged_value = [&](const void* present, int segment, acc_t fallback) {
    return present ? static_cast<acc_t>(staged[segment * kStagedPixels + t]) : fallback;
  };

  for (int c0 = 0; c0 < p.channels; c0 += kChannelBlock) {
    const int block = min(kChannelBlock, p.channels - c0);
    const scalar_t* in = p.input + (n * p.channels + c0) * plane;
    acc_t acc[kChannelBlock];
    EDSC_UNROLL
    for (int cc = 0; cc < kChannelBlock; ++cc) acc[cc] = acc_t(0);
    EDSC_UNROLL
    for (int i = 0; i < K; ++i) {
      copy_async_wait(K - 1 - i);
      __syncthreads();  // the other threads' copies of row i have landed too
      if (!active) continue;
      const int row = K + i * kStagedRowSegments;
      const acc_t wv = staged_value(p.vertical, row, acc_t(1));
      const acc_t py0 = static_cast<acc_t>(y_base + static_cast<int64_t>(i) * p.dilation_h);
      EDSC_UNROLL
      for (int j = 0; j < K; ++j) {
        const acc_t w =
            wv * staged_value(p.horizontal, j, acc_t(1)) * staged_value(p.mask, row + 1 + 2 * K + j, acc_t(1));
        const acc_t py = py0 + staged_value(p.offset, row + 1 + 2 * j, acc_t(0));
        const acc_t px = static_cast<acc_t>(x_base + static_cast<int64_t>(j) * p.dilation_w) +
                         staged_value(p.offset, row + 2 + 2 * j, acc_t(0));
        accumulate_tap<kChannelBlock, /*kChannelsLast=*/false, /*kBranchFree=*/false>(p, in, plane, block, w, py, px,
                                                                                      acc);
      }
    }
    if (active) {
      scalar_t* out = output + (n * p.channels + c0) * hw + pixel;
      EDSC_UNROLL
      for (int cc = 0; cc < kChannelBlock; ++cc) {
        if (cc < block) out[cc * hw] = static_cast<scalar_t>(acc[cc]);
      }
    }
  }
}

}  // namespace
}  // namespace edsc_ext
