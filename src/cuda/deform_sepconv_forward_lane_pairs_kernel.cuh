// The CUDA forward's lane-pair kernel (the launcher: deform_sepconv_forward_lane_pairs_cuda.cu, which says what it
// does; the tests' CUDA emulation includes it too).
#pragma once

#include "deform_sepconv_forward_cuda.cuh"
#include "warp_staged_values.cuh"

namespace edsc_ext {
namespace {

constexpr int kLanePairKernel = kSpecializedKernel;
constexpr int kLanesPerPixel = 2;
constexpr int kLanePairPixels = kWarpSize / kLanesPerPixel;  // a warp's pixels

// 16-byte aligned: the cp.async copies write 16 bytes at a time (every member's size is a multiple of 16).
template <typename scalar_t>
struct alignas(16) LanePairStagedValues {
  static constexpr int kTaps = kLanePairKernel * kLanePairKernel;
  scalar_t vertical[kLanePairPixels * kLanePairKernel];
  scalar_t horizontal[kLanePairPixels * kLanePairKernel];
  OffsetPair<scalar_t> offset[kLanePairPixels * kTaps];
  scalar_t mask[kLanePairPixels * kTaps];
};

// Every lane of the warp: copies elements [0, valid) of a run of `total` elements (a multiple of
// 16 bytes, from a 16-byte aligned `src`) to shared memory, zero-filling the rest.
template <typename T>
__device__ __forceinline__ void stage_run_16_bytes(T* dst, const T* src, int total, int valid, int lane) {
  constexpr int kPerChunk = 16 / static_cast<int>(sizeof(T));
  for (int c = lane; c < total / kPerChunk; c += kWarpSize) {
    const int bytes = max(0, min(kPerChunk, valid - c * kPerChunk)) * static_cast<int>(sizeof(T));
    copy_async<16>(dst + c * kPerChunk, bytes > 0 ? src + c * kPerChunk : src, bytes);
  }
}

// kExactBlock: exactly 3 channels (with_exact_block). The register budget: in float32 at least 3
// blocks a multiprocessor (up to 85 registers; the compiler chose 64), faster on the H200
// (BENCHMARKS.md); the 2-byte types were slower with it and keep the compiler's choice.
template <bool kExactBlock, bool kStaged, typename scalar_t>
__global__ void __launch_bounds__(kThreadsPerBlock, sizeof(scalar_t) == 4 ? 3 : 0)
    deform_sepconv_forward_lane_pairs_cuda_kernel(const DeformSepconvParams<scalar_t, int32_t> params,
                                                  scalar_t* __restrict__ output, int64_t pixels) {
  constexpr int K = kLanePairKernel, kTaps = K * K;
  constexpr int kSteps = (kTaps + kLanesPerPixel - 1) / kLanesPerPixel;
  constexpr int kChannelBlock = kExactBlock ? 3 : 4;
  decltype(auto) p = with_exact_block<kExactBlock, kChannelBlock>(params);
  using acc_t = opmath_t<scalar_t>;
  using Staged = LanePairStagedValues<scalar_t>;
  __shared__ std::conditional_t<kStaged, Staged[kThreadsPerBlock / kWarpSize], char[1]> staged_all;
  const int lane = threadIdx.x % kWarpSize, q = lane % kLanesPerPixel, local = lane / kLanesPerPixel;
  const int32_t hw = p.height_out * p.width_out;
  const int32_t channels = p.channels;  // also the input's pixel stride
  const int block = static_cast<int>(min(int32_t(kChannelBlock), channels));
  const int64_t items = pixels * kLanesPerPixel;
  // Uniform per warp: every lane takes part in the copies and the shuffle.
  for (int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x - lane; first < items;
       first += int64_t(blockDim.x) * gridDim.x) {
    const int32_t first_pixel = static_cast<int32_t>(first / kLanesPerPixel);
    const int count = static_cast<int>(min(int64_t(kLanePairPixels), pixels - first_pixel));
    const int32_t g = first_pixel + min(local, count - 1);  // inactive lanes: a real pixel
    const int32_t n = g / hw, pixel = g - n * hw;
    const int32_t y = pixel / p.width_out, x = pixel - y * p.width_out;
    // Where this pixel's values start, nullptr for an absent tensor: in shared memory (kStaged) or
    // in the tensors (channels_last: a pixel's K, 2K^2 and K^2 values are contiguous).
    const scalar_t *vertical, *horizontal, *mask;
    const OffsetPair<scalar_t>* offset;
    const auto* offset_pairs = reinterpret_cast<const OffsetPair<scalar_t>*>(p.offset);
    if constexpr (kStaged) {
      Staged& st = staged_all[threadIdx.x / kWarpSize];
      __syncwarp();  // the warp's previous pixels are done with the buffer
      const int64_t run = first_pixel;
      if (p.vertical) stage_run_16_bytes(st.vertical, p.vertical + run * K, kLanePairPixels * K, count * K, lane);
      if (p.horizontal) {
        stage_run_16_bytes(st.horizontal, p.horizontal + run * K, kLanePairPixels * K, count * K, lane);
      }
      if (p.offset) {
        stage_run_16_bytes(st.offset, offset_pairs + run * kTaps, kLanePairPixels * kTaps, count * kTaps, lane);
      }
      if (p.mask) stage_run_16_bytes(st.mask, p.mask + run * kTaps, kLanePairPixels * kTaps, count * kTaps, lane);
      copy_async_commit();
      copy_async_wait(0);                      // this lane's copies have landed ...
      __syncwarp();                            // ... and every lane's
      const int slot = min(local, count - 1);  // the pixel g
      vertical = p.vertical ? st.vertical + slot * K : nullptr;
      horizontal = p.horizontal ? st.horizontal + slot * K : nullptr;
      offset = p.offset ? st.offset + slot * kTaps : nullptr;
      mask = p.mask ? st.mask + slot * kTaps : nullptr;
    } else {
      vertical = p.vertical ? p.vertical + int64_t(g) * K : nullptr;
      horizontal = p.horizontal ? p.horizontal + int64_t(g) * K : nullptr;
      offset = p.offset ? offset_pairs + int64_t(g) * kTaps : nullptr;
      mask = p.mask ? p.mask + int64_t(g) * kTaps : nullptr;
    }
    const scalar_t* in = p.input + n * channels * p.height_in * p.width_in;
    const int64_t y_base = static_cast<int64_t>(y) - p.pad_h;
    const int64_t x_base = static_cast<int64_t>(x) - p.pad_w;
    acc_t acc[kChannelBlock];
    EDSC_UNROLL
    for (int cc = 0; cc < kChannelBlock; ++cc) acc[cc] = acc_t(0);
    bool finite = true;
    EDSC_UNROLL
    for (int step = 0; step < kSteps; ++step) {
      const int t = q + step * kLanesPerPixel;
      if (t >= kTaps) break;  // the last step: lane 1 has 12 taps, lane 0 13
      const int i = t / K, j = t - i * K;
      // The weight as the one-lane kernels form it: (V_i H_j) M_t.
      const acc_t w = load_param_or(vertical, i, acc_t(1)) * load_param_or(horizontal, j, acc_t(1)) *
                      load_param_or(mask, t, acc_t(1));
      acc_t py = static_cast<acc_t>(y_base + static_cast<int64_t>(i) * p.dilation_h);
      acc_t px = static_cast<acc_t>(x_base + static_cast<int64_t>(j) * p.dilation_w);
      if (offset) {
        const OffsetPair<scalar_t> pair = offset[t];
        py += static_cast<acc_t>(pair.dy);
        px += static_cast<acc_t>(pair.dx);
      }
      finite &= accumulate_tap<kChannelBlock, /*kChannelsLast=*/true, /*kBranchFree=*/kExactBlock>(
          p, in, int32_t(1), block, w, py, px, acc);
    }
    if constexpr (kExactBlock) finish_taps(finite, acc);
    EDSC_UNROLL
    for (int cc = 0; cc < kChannelBlock; ++cc) acc[cc] += __shfl_xor_sync(0xffffffffu, acc[cc], 1);
    if (q == 0 && local < count) {
      scalar_t* out = output + int64_t(g) * channels;
      EDSC_UNROLL
      for (int cc = 0; cc < kChannelBlock; ++cc) {
        if (cc < block) out[cc] = static_cast<scalar_t>(acc[cc]);
      }
    }
  }
}

}  // namespace
}  // namespace edsc_ext
