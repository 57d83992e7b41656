// The CUDA forward's one-thread-per-(pixel, channel block) kernel (the launcher:
// deform_sepconv_forward_pixels_cuda.cu; the tests' CUDA emulation includes it too).
#pragma once

#include "deform_sepconv_cuda.cuh"
#include "prefetched_pixel_values.cuh"

namespace edsc_ext {
namespace {

// The register budget of the 32-bit-index kernels in float32 and the half types: 64 registers, for 4
// blocks of kThreadsPerBlock a multiprocessor. The compiler chose 80 for RGB and 72 for 4-channel
// blocks (3 blocks); the cap costs a few spilled bytes and was faster on the H200 in both
// (BENCHMARKS.md); in bfloat16 RGB it also beats the staged kernel, so RGB takes this kernel there.
constexpr int kBlocksPerMultiprocessor = 4;
// Blocks of 8 channels (vector loads) hold twice the accumulators and corner values: 3 blocks (80
// registers, where the compiler chose 98-105 and 2 blocks; 64 registers spill 160-190 bytes), since
// their gathers wait on latency at 2 blocks (ncu: long-scoreboard stalls).
constexpr int kVectorBlocksPerMultiprocessor = 3;
template <int kChannelBlock, typename scalar_t, typename index_t>
constexpr int min_blocks_per_multiprocessor() {
  if constexpr (!std::is_same_v<index_t, int32_t> || sizeof(scalar_t) > 4) return 0;
  return kChannelBlock <= kPixelChannelBlock ? kBlocksPerMultiprocessor : kVectorBlocksPerMultiprocessor;
}

// kPrefetch (NCHW, 5x5, one block of channels, 32-bit indices): each warp first prefetches all its
// pixels' per-pixel values into L2 (prefetched_pixel_values.cuh). kExactBlock: the call has exactly
// kChannelBlock channels (RGB); knowing that at compile time removes a branch per channel and tap.
// kVectorLoads (channels_last, whole aligned blocks): accumulate_tap's one load a corner.
// kPaddingMode (exact blocks only): the call's padding mode compiled in
// (deform_sepconv_forward_pixel_static_padding), or kRuntimePaddingMode.
// kPackedFrame (exact RGB, NCHW, 2-byte): the frame read from packed_frame, its copy made by
// pack_rgb_frame_cuda_kernel (one load a corner); otherwise packed_frame is unused.
// A minimum of 0 blocks leaves the register budget to the compiler.
template <int kChannelBlock, int kKernelH, int kKernelW, bool kChannelsLast, bool kPrefetch, bool kExactBlock,
          bool kVectorLoads, typename scalar_t, typename index_t, typename param_t,
          int64_t kPaddingMode = kRuntimePaddingMode, bool kPackedFrame = false>
__global__ void __launch_bounds__(kThreadsPerBlock, (min_blocks_per_multiprocessor<kChannelBlock, scalar_t, index_t>()))
    deform_sepconv_forward_cuda_kernel(const DeformSepconvParams<scalar_t, index_t, param_t> params,
                                       scalar_t* __restrict__ output, int64_t work_items,
                                       const PackedRgbPixel<scalar_t>* __restrict__ packed_frame = nullptr) {
  static_assert(
      !kPrefetch || (!kChannelsLast && kKernelH == kKernelW && kKernelH > 0 && std::is_same_v<index_t, int32_t>),
      "prefetch: NCHW, static square kernels, 32-bit indices");
  static_assert(!kVectorLoads || (kChannelsLast && !kExactBlock), "vector loads: channels_last, whole blocks");
  static_assert((kPaddingMode != kRuntimePaddingMode) == kExactBlock,
                "exact blocks, and only they, compile the mode in");
  static_assert(!kPackedFrame || (kExactBlock && kChannelBlock == 3 && !kChannelsLast && sizeof(scalar_t) == 2),
                "a packed frame: exact RGB, NCHW, a 2-byte type");
  decltype(auto) p = with_exact_block<kExactBlock, kChannelBlock>(params);
  using acc_t = opmath_t<scalar_t>;
  const index_t hw = p.height_out * p.width_out;
  const index_t channel_blocks = (p.channels + kChannelBlock - 1) / kChannelBlock;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < work_items;
       k += int64_t(blockDim.x) * gridDim.x) {
    // Consecutive threads take adjacent memory: items are (n, channel block, y, x) with x fastest
    // in NCHW, (n, y, x, channel block) with the block fastest in channels_last, where a warp then
    // gathers whole runs of a corner's channels and shares each pixel's per-pixel loads.
    const index_t item = static_cast<index_t>(k);
    index_t pixel, c0, n;
    if constexpr (kChannelsLast) {
      c0 = (item % channel_blocks) * kChannelBlock;
      pixel = (item / channel_blocks) % hw;
      n = item / channel_blocks / hw;
    } else {
      pixel = item % hw;
      c0 = ((item / hw) % channel_blocks) * kChannelBlock;
      n = item / hw / channel_blocks;
    }
    if constexpr (kPrefetch) {
      // One channel block (the host checks): the warp's items are consecutive global pixels.
      const int lane = threadIdx.x % kWarpSize;
      const int64_t warp_first = k - lane;
      prefetch_warp_planes_l2<kKernelH>(p, static_cast<int32_t>(warp_first),
                                        static_cast<int32_t>(min(warp_first + kWarpSize, work_items) - 1), lane);
    }
    if constexpr (kPaddingMode != kRuntimePaddingMode) {
      GlobalPixelValues<kChannelsLast, scalar_t, index_t, param_t, /*kStrided=*/!kPrefetch> values(
          p, n, pixel, kernel_extent<kKernelH>(p.kernel_h), kernel_extent<kKernelW>(p.kernel_w));
      const index_t y = pixel / p.width_out, x = pixel % p.width_out;
      if constexpr (kPackedFrame) {
        const PackedRgbFrame<scalar_t, index_t> frame{opaque_pointer(packed_frame + n * p.height_in * p.width_in)};
        deform_sepconv_forward_pixel_static_padding<kPaddingMode, kChannelBlock, kKernelH, kKernelW, kChannelsLast,
                                                    scalar_t, acc_t, index_t>(p, values, frame, output, n, y, x);
      } else {
        const auto frame = planar_frame<kChannelBlock, kChannelsLast>(p, n);
        deform_sepconv_forward_pixel_static_padding<kPaddingMode, kChannelBlock, kKernelH, kKernelW, kChannelsLast,
                                                    scalar_t, acc_t, index_t>(p, values, frame, output, n, y, x);
      }
      continue;
    }
    deform_sepconv_forward_pixel<kChannelBlock, kKernelH, kKernelW, kChannelsLast, scalar_t, acc_t, index_t,
                                 kVectorLoads, /*kStrided=*/!kPrefetch>(p, output, n, pixel / p.width_out,
                                                                        pixel % p.width_out, c0);
  }
}

// The packed copy of an NCHW RGB frame that kPackedFrame reads: pixel k of the (N, H, W) pixels gets
// its three channels and a zero fourth; `pixels` = N * H * W, hw = H * W.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreadsPerBlock)
    pack_rgb_frame_cuda_kernel(const scalar_t* __restrict__ frame, PackedRgbPixel<scalar_t>* __restrict__ packed,
                               int32_t hw, int32_t pixels) {
  for (int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; item < pixels;
       item += int64_t(blockDim.x) * gridDim.x) {
    const int32_t k = static_cast<int32_t>(item), n = k / hw;
    const scalar_t* in = frame + (2 * n * hw + k);  // n * 3 * hw + (k - n * hw)
    PackedRgbPixel<scalar_t> pixel;
    pixel.value[0] = in[0];
    pixel.value[1] = in[hw];
    pixel.value[2] = in[2 * hw];
    pixel.value[3] = scalar_t(0);
    packed[k] = pixel;
  }
}

}  // namespace
}  // namespace edsc_ext
