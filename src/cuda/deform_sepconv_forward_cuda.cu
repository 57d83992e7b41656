// CUDA forward of deform_sepconv. Every entry point takes a device guard from the input and
// launches on that device's current stream, so a tensor on cuda:1 works whatever the current
// device is. Per-pixel work comes from include/edsc_ext/deform_sepconv_pixel.h.
//
// Forward without offsets or dilation (sepconv), float32 and the half types: the input window of a
// tile of output pixels in shared memory (grid_tap_window.cuh, deform_sepconv_forward_grid_taps_cuda_kernel).
// Forward, 5x5 kernels with up to 4 channels:
// - NCHW with exactly 3 channels (RGB), any floating type: one thread per output pixel, the
//   channel count a compile-time constant, which leaves no branch in a tap (accumulate_tap);
// - NCHW in float16/bfloat16 with 1, 2 or 4 channels: blocks of 128 output pixels stage their
//   per-pixel tensors (85 values a pixel, the bulk of the bytes) in shared memory with asynchronous
//   copies and sample row by row as the copies land (deform_sepconv_forward_staged_cuda_kernel);
// - channels_last, float32 and the half types: two lanes per output pixel, each warp staging its
//   pixels' values through shared memory (deform_sepconv_forward_lane_pairs_cuda_kernel).
// Otherwise one thread per (n, block of 4 channels, output pixel), compiled for each memory
// layout, with consecutive threads on adjacent memory (x fastest in NCHW, the channel block in
// channels_last). In NCHW with 5x5 kernels and one channel block each warp of the one-thread
// kernels first prefetches its per-pixel values into L2 (prefetched_pixel_values.cuh).
// EDSC_EXT_FORWARD=plain forces the one-thread-per-(pixel, channel block) kernel (benchmarks, tests).
#include "deform_sepconv_cuda.cuh"
#include "prefetched_pixel_values.cuh"
#include "grid_tap_window.cuh"
#include "warp_staged_values.cuh"

namespace edsc_ext {
namespace {

// The RGB kernels' register budget in float32 and the half types: 64 registers, for 4 blocks of
// kThreadsPerBlock a multiprocessor (the compiler chose 80, 3 blocks). Measured on the H200
// (BENCHMARKS.md): train float32 forward 0.237 -> 0.230 ms, adacof 0.125 -> 0.120; in bfloat16 it
// also beats the staged kernel (0.268 -> 0.256), so RGB takes this kernel in those types.
constexpr int kRgbBlocksPerMultiprocessor = 4;
template <bool kExactBlock, typename scalar_t>
constexpr int min_blocks_per_multiprocessor() {
  return kExactBlock && sizeof(scalar_t) <= 4 ? kRgbBlocksPerMultiprocessor : 0;
}

// kPrefetch (NCHW, 5x5, one block of channels, 32-bit indices): each warp first prefetches all its
// pixels' per-pixel values into L2 (prefetched_pixel_values.cuh). kExactBlock: the call has exactly
// kChannelBlock channels (RGB); knowing that at compile time removes a branch per channel and tap.
// A minimum of 0 blocks leaves the register budget to the compiler.
template <int kChannelBlock, int kKernelH, int kKernelW, bool kChannelsLast, bool kPrefetch, bool kExactBlock,
          typename scalar_t, typename index_t>
__global__ void __launch_bounds__(kThreadsPerBlock, (min_blocks_per_multiprocessor<kExactBlock, scalar_t>()))
    deform_sepconv_forward_cuda_kernel(const DeformSepconvParams<scalar_t, index_t> params,
                                       scalar_t* __restrict__ output, int64_t work_items) {
  static_assert(!kPrefetch || (!kChannelsLast && kKernelH == kKernelW && kKernelH > 0 && std::is_same_v<index_t, int32_t>),
                "prefetch: NCHW, static square kernels, 32-bit indices");
  decltype(auto) p = with_exact_block<kExactBlock, kChannelBlock>(params);
  using acc_t = at::opmath_type<scalar_t>;
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
    // Straight-line taps where the channel count is a constant (accumulate_tap says why).
    deform_sepconv_forward_pixel<kChannelBlock, kKernelH, kKernelW, kChannelsLast, scalar_t, acc_t, index_t,
                                 /*kBranchFree=*/kExactBlock>(p, output, n, pixel / p.width_out, pixel % p.width_out,
                                                              c0);
  }
}

// channels_last forward with up to 4 channels and 5x5 kernels: two lanes per output pixel, lane q
// taking taps q, q + 2, ..., their partial sums added by one shuffle. A channels_last pixel's
// 2K + 3K^2 = 85 per-pixel values are contiguous, so with one lane per pixel each warp-wide load
// of a tap touches 32 cache lines, and the kernels were bound by L1 and L2 requests rather than
// DRAM. Here the two lanes of a pixel read adjacent taps and, kStaged, each warp first copies its
// 16 pixels' values (a contiguous run of each tensor, 16-byte aligned: the host checks) to shared
// memory with 16-byte asynchronous copies, one wait a warp, and the taps read them there.
// Measured on the H200 (BENCHMARKS.md), train float32 forward: 0.304 ms for the kernel this
// replaced (one lane a pixel, staging a row of taps at a time), 0.297 with two lanes reading global
// memory, 0.272 staged; 0.302 staged with four lanes a pixel (more shuffles and index work).
constexpr int kLanePairKernel = 5;
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
// blocks a multiprocessor (up to 85 registers; the compiler chose 64), measured on the H200: train
// float32 0.273 -> 0.249 ms, adacof 0.150 -> 0.132; the 2-byte types lost with it (train bfloat16
// 0.224 -> 0.239) and keep the compiler's choice.
template <bool kExactBlock, bool kStaged, typename scalar_t>
__global__ void __launch_bounds__(kThreadsPerBlock, sizeof(scalar_t) == 4 ? 3 : 0)
    deform_sepconv_forward_lane_pairs_cuda_kernel(const DeformSepconvParams<scalar_t, int32_t> params,
                                                  scalar_t* __restrict__ output, int64_t pixels) {
  constexpr int K = kLanePairKernel, kTaps = K * K;
  constexpr int kSteps = (kTaps + kLanesPerPixel - 1) / kLanesPerPixel;
  constexpr int kChannelBlock = kExactBlock ? 3 : 4;
  decltype(auto) p = with_exact_block<kExactBlock, kChannelBlock>(params);
  using acc_t = at::opmath_type<scalar_t>;
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
      copy_async_wait(0);  // this lane's copies have landed ...
      __syncwarp();        // ... and every lane's
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

// Whether every present per-pixel tensor starts on a 16-byte boundary, as the staged lane-pair
// kernel's copies need (each warp's run then starts on one too: 16 pixels' values are a multiple
// of 16 bytes).
bool per_pixel_aligned_16(const DeformSepconvTensors& t) {
  for (const at::Tensor* per_pixel : {&t.vertical, &t.horizontal, &t.offset, &t.mask}) {
    if (per_pixel->defined() && reinterpret_cast<uintptr_t>(per_pixel->const_data_ptr()) % 16 != 0) return false;
  }
  return true;
}

template <typename scalar_t, typename index_t>
void launch_lane_pairs_forward(const DeformSepconvParams<scalar_t, index_t>& p, scalar_t* out, int64_t pixels,
                               bool staged, cudaStream_t stream) {
  if constexpr (std::is_same_v<index_t, int32_t> && sizeof(scalar_t) <= 4) {
    const auto launch = [&](auto kernel) {
      kernel<<<blocks_for(pixels * kLanesPerPixel), kThreadsPerBlock, 0, stream>>>(p, out, pixels);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (p.channels == 3) {
      return staged ? launch(deform_sepconv_forward_lane_pairs_cuda_kernel<true, true, scalar_t>)
                    : launch(deform_sepconv_forward_lane_pairs_cuda_kernel<true, false, scalar_t>);
    }
    staged ? launch(deform_sepconv_forward_lane_pairs_cuda_kernel<false, true, scalar_t>)
           : launch(deform_sepconv_forward_lane_pairs_cuda_kernel<false, false, scalar_t>);
  }
}

// Forward with the per-pixel tensors staged in shared memory (5x5 kernels, float32 and the half
// types, sm_80+). They are 2K + 3K^2 = 85 values a pixel, each read once: streaming data and the
// bulk of the bytes. Read on demand, every tap waits on a DRAM round trip for its offsets before
// it can even address the frame, which left the plain kernel latency-bound. Here a block of
// kStagedPixels consecutive output pixels first issues asynchronous copies (cp.async) of all its
// per-pixel values, one commit group per row of taps, then samples row by row as the groups
// land, so later rows' loads overlap the sampling of earlier ones. Each thread owns one pixel and
// loops over the channels, so the values are read from DRAM once whatever C is.
constexpr int kStagedPixels = 128;
constexpr int kStagedKernel = 5;
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
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int K = kStagedKernel;
  extern __shared__ __align__(16) unsigned char staged_raw[];
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
        const acc_t w = wv * staged_value(p.horizontal, j, acc_t(1)) * staged_value(p.mask, row + 1 + 2 * K + j, acc_t(1));
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

// EDSC_EXT_FORWARD=plain: the one-thread-per-(pixel, channel block) kernel for every call
// (benchmarks, tests).
bool plain_forward_forced() {
  const char* mode = std::getenv("EDSC_EXT_FORWARD");
  return mode != nullptr && std::string(mode) == "plain";
}

// Forward of the grid-tap calls (grid_tap_window.cuh): one shared-memory load and one multiply-add
// per tap and channel. Each thread owns one output pixel and holds kGridTapChunk of its vertical
// and horizontal weights at a time in registers; kPassChannels channels share a window.

// The most shared memory a forward block's windows take (two blocks a multiprocessor on sm_80/sm_90).
constexpr int64_t kGridWindowBudgetBytes = 100 * 1024;

// kGridTapChunk x kGridTapChunk taps (rows < `rows`, columns < `cols` unless kWhole) of one output
// pixel, whose tap (i0, j0) is window value `first` of each staged channel: acc[c] += wv[ii] *
// sum_jj wh[jj] * mask * window. The mask's values of row ii start at first_mask + ii * mask_row.
template <bool kWhole, int kPassChannels, bool kMask, typename scalar_t, typename acc_t>
__device__ __forceinline__ void accumulate_grid_chunk(const acc_t* first, const GridWindow& window,
                                                      const scalar_t* first_mask, int64_t mask_row,
                                                      int64_t mask_column, const acc_t (&wv)[kGridTapChunk],
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
  using acc_t = at::opmath_type<scalar_t>;
  extern __shared__ __align__(16) unsigned char window_raw[];
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

// The channels the grid-tap forward stages together: the most of 4, 3, 2, 1 that divides the
// channel count and whose windows fit the budget; 0 where it does not apply.
int grid_taps_pass_channels(const DeformSepconvTensors& t, const DeformSepconvConfig& cfg, GridWindow& window) {
  int64_t channel_bytes = 0;
  if (plain_forward_forced() || !grid_taps_apply(t, cfg, window, channel_bytes)) return 0;
  for (const int pass : {4, 3, 2, 1}) {
    if (t.input.size(1) % pass == 0 && pass * channel_bytes <= kGridWindowBudgetBytes) return pass;
  }
  return 0;
}

template <typename scalar_t>
void launch_grid_taps_forward(const DeformSepconvParams<scalar_t, int64_t>& p, scalar_t* out, int pass_channels,
                              const GridWindow& window, const dim3 grid, bool channels_last, cudaStream_t stream) {
  if constexpr (sizeof(scalar_t) <= 4) {
    const size_t shared = static_cast<size_t>(pass_channels) * window.size() * sizeof(at::opmath_type<scalar_t>);
    const auto launch = [&](auto kernel) {
      allow_grid_taps_shared(kernel, shared);
      kernel<<<grid, kGridTileThreads, shared, stream>>>(p, out, window);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    // A mask is a load a tap; sepconv has none, and then the taps are loads from shared memory only.
    const auto dispatch_mask = [&](auto pass) {
      constexpr int kPass = decltype(pass)::value;
      EDSC_DISPATCH_LAYOUT(channels_last, [&] {
        p.mask ? launch(deform_sepconv_forward_grid_taps_cuda_kernel<kPass, kChannelsLast, true, scalar_t>)
               : launch(deform_sepconv_forward_grid_taps_cuda_kernel<kPass, kChannelsLast, false, scalar_t>);
      });
    };
    switch (pass_channels) {
      case 4: return dispatch_mask(std::integral_constant<int, 4>{});
      case 3: return dispatch_mask(std::integral_constant<int, 3>{});
      case 2: return dispatch_mask(std::integral_constant<int, 2>{});
      default: return dispatch_mask(std::integral_constant<int, 1>{});
    }
  }
}

// The chunk size the staged forward can copy every per-pixel tensor's segments with (16 or 4
// bytes: cp.async needs aligned addresses, and a segment starts at (n * channels + k) * hw + p0
// elements), or 0 where it cannot be used.
int staged_forward_chunk(const DeformSepconvTensors& t, int64_t kernel_h, int64_t kernel_w) {
  // It indexes NCHW-contiguous memory: in channels_last a pixel's values are contiguous already.
  if (kernel_h != kStagedKernel || kernel_w != kStagedKernel || !t.use_32bit_indexing || t.channels_last) return 0;
  // Measured on an H200 (BENCHMARKS.md): it wins for the 2-byte types with up to 4 channels
  // (train bfloat16 0.269 vs 0.306 ms) and loses for float32, whose 43.5 KB of staged values a
  // block leave too few warps per SM (train 0.370 vs 0.320 ms), and for many channels. RGB takes
  // the exact-RGB kernel instead (kRgbBlocksPerMultiprocessor says why).
  if (t.input.element_size() != 2 || t.input.size(1) > 4 || t.input.size(1) == 3) return 0;
  if (at::cuda::getCurrentDeviceProperties()->major < 8) return 0;
  if (plain_forward_forced()) return 0;
  const int64_t row_bytes = t.height_out * t.width_out * t.input.element_size();
  for (const int64_t chunk : {16, 4}) {
    bool aligned = row_bytes % chunk == 0;
    for (const at::Tensor* per_pixel : {&t.vertical, &t.horizontal, &t.offset, &t.mask}) {
      if (per_pixel->defined()) aligned = aligned && reinterpret_cast<uintptr_t>(per_pixel->const_data_ptr()) % chunk == 0;
    }
    if (aligned) return static_cast<int>(chunk);
  }
  return 0;
}

at::Tensor deform_sepconv_forward_cuda(const at::Tensor& input, const std::optional<at::Tensor>& vertical,
                                       const std::optional<at::Tensor>& horizontal,
                                       const std::optional<at::Tensor>& offset, const std::optional<at::Tensor>& mask,
                                       int64_t kernel_h, int64_t kernel_w, int64_t pad_h, int64_t pad_w,
                                       int64_t dilation_h, int64_t dilation_w, int64_t padding_mode) {
  const c10::cuda::CUDAGuard device_guard(input.device());
  const DeformSepconvConfig cfg{kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode};
  const DeformSepconvTensors t = prepare_deform_sepconv(input, vertical, horizontal, offset, mask, cfg);
  at::Tensor output = at::empty({input.size(0), input.size(1), t.height_out, t.width_out},
                                input.options().memory_format(t.memory_format()));
  if (output.numel() == 0) return output;
  const auto stream = c10::cuda::getCurrentCUDAStream(input.device().index());
  const int64_t channels = input.size(1);

  const int staged_chunk = staged_forward_chunk(t, kernel_h, kernel_w);
  GridWindow window{};
  const int grid_pass_channels = grid_taps_pass_channels(t, cfg, window);

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "deform_sepconv_forward_cuda", [&] {
    if (grid_pass_channels != 0) {
      return launch_grid_taps_forward(make_params<scalar_t, int64_t>(t, cfg), output.mutable_data_ptr<scalar_t>(),
                                      grid_pass_channels, window, grid_taps_grid(t), t.channels_last, stream);
    }
    EDSC_DISPATCH_INDEX_TYPE(t.use_32bit_indexing, [&] {
      EDSC_DISPATCH_KERNEL_SIZE(kernel_h, kernel_w, [&] {
        const auto p = make_params<scalar_t, index_t>(t, cfg);
        scalar_t* out = output.mutable_data_ptr<scalar_t>();
        if constexpr (kKernelH == kStagedKernel && kKernelW == kStagedKernel && std::is_same_v<index_t, int32_t> &&
                      sizeof(scalar_t) == 2) {
          if (staged_chunk != 0) {
            const int64_t hw = t.height_out * t.width_out;
            const int64_t blocks = input.size(0) * ((hw + kStagedPixels - 1) / kStagedPixels);
            const size_t shared = kStagedSegments * kStagedPixels * sizeof(scalar_t);
            EDSC_DISPATCH_CHANNEL_BLOCK(channels, [&] {
              if (staged_chunk == 16) {
                deform_sepconv_forward_staged_cuda_kernel<kChannelBlock, 16, scalar_t>
                    <<<static_cast<unsigned int>(blocks), kStagedPixels, shared, stream>>>(p, out);
              } else {
                deform_sepconv_forward_staged_cuda_kernel<kChannelBlock, 4, scalar_t>
                    <<<static_cast<unsigned int>(blocks), kStagedPixels, shared, stream>>>(p, out);
              }
              C10_CUDA_KERNEL_LAUNCH_CHECK();
            });
            return;
          }
        }
        if constexpr (kKernelH == kLanePairKernel && kKernelW == kLanePairKernel) {
          // Not float64: its staged values would not fit 48 KB, and it was not measured unstaged.
          if (t.channels_last && channels <= 4 && t.use_32bit_indexing && input.element_size() <= 4 &&
              offset_pairs_aligned(t.offset) && !plain_forward_forced()) {
            launch_lane_pairs_forward(p, out, input.size(0) * t.height_out * t.width_out, per_pixel_aligned_16(t),
                                      stream);
            return;
          }
        }
        // One thread per (pixel, block of 4 channels).
        constexpr int kPlainBlock = 4;
        const int64_t work_items =
            input.size(0) * ((channels + kPlainBlock - 1) / kPlainBlock) * t.height_out * t.width_out;
        EDSC_DISPATCH_LAYOUT(t.channels_last, [&] {
          const auto launch = [&](auto kernel) {
            kernel<<<blocks_for(work_items), kThreadsPerBlock, 0, stream>>>(p, out, work_items);
            C10_CUDA_KERNEL_LAUNCH_CHECK();
          };
          if constexpr (!kChannelsLast && kKernelH == 5 && kKernelW == 5 && std::is_same_v<index_t, int32_t>) {
            // With more channel blocks the warps of different blocks would prefetch the same lines:
            // feat (32 channels) lost 7% with it.
            const bool prefetch = channels <= kPlainBlock && prefetch_enabled();
            if (channels == 3) {  // RGB: the channel count as a constant
              return prefetch ? launch(deform_sepconv_forward_cuda_kernel<3, kKernelH, kKernelW, kChannelsLast, true,
                                                                          true, scalar_t, index_t>)
                              : launch(deform_sepconv_forward_cuda_kernel<3, kKernelH, kKernelW, kChannelsLast, false,
                                                                          true, scalar_t, index_t>);
            }
            if (prefetch) {
              return launch(deform_sepconv_forward_cuda_kernel<kPlainBlock, kKernelH, kKernelW, kChannelsLast, true,
                                                               false, scalar_t, index_t>);
            }
          }
          launch(deform_sepconv_forward_cuda_kernel<kPlainBlock, kKernelH, kKernelW, kChannelsLast, false, false,
                                                    scalar_t, index_t>);
        });
      });
    });
  });
  return output;
}

}  // namespace

TORCH_LIBRARY_IMPL(edsc_ext, CUDA, m) { m.impl("deform_sepconv_forward", &deform_sepconv_forward_cuda); }

}  // namespace edsc_ext
