// Kernels of the CUDA backward of deform_sepconv and their launch, included by one translation unit
// per dtype (deform_sepconv_backward_<dtype>_cuda.cu). Per-pixel work comes from
// include/edsc_ext/deform_sepconv_pixel.h.
//
// Backward: one fused pass over 2-D tiles of output pixels. The input gradient, hundreds of adds
// per pixel, is accumulated with shared-memory atomics over the tile's footprint (tile + kernel
// reach + a margin for offsets) and flushed to global memory once; samples that land outside the
// footprint fall back to global atomics, so any offset stays correct. The tile holds fixed-point
// integers (see FixedPointTileAdd): shared-memory float atomics are compare-and-swap loops on
// sm_70..sm_90, integer ones a single native instruction. Every kernel is compiled for both memory
// layouts (kChannelsLast); the shared-memory tile is the same for both, only its flush order and
// the global addresses differ. In channels_last with 5x5 kernels each warp (a row of the tile)
// stages its per-pixel values and their gradients through shared memory (warp_staged_values.cuh;
// EDSC_EXT_WARP_STAGING=0 turns that off), and with more than 4 channels the backward runs on
// NCHW copies (deform_sepconv_backward_cuda says why). In NCHW with 5x5 kernels each warp first
// prefetches its per-pixel values into L2 (prefetched_pixel_values.cuh).
#pragma once

#include <map>
#include <mutex>
#include <utility>

#include "deform_sepconv_backward_cuda.cuh"
#include "grid_tap_window.cuh"
#include "prefetched_pixel_values.cuh"
#include "warp_staged_values.cuh"

namespace edsc_ext {
namespace {

// Backward tile: a warp spans 32 consecutive x, so per-pixel loads and stores stay coalesced.
constexpr int kTileW = 32;
constexpr int kTileH = 8;
constexpr int kTileThreads = kTileW * kTileH;
// Offsets up to this many pixels beyond the kernel's reach still land in shared memory.
constexpr int kTileMargin = 3;
// Shared memory for the input-gradient footprint (the default per-block limit, no opt-in).
constexpr int64_t kTileSharedBytes = 48 * 1024;

// Where input-gradient element (n, c, y, x) lives, in the call's memory format.
template <typename index_t>
struct InputGradLayout {
  index_t channels, height, width, channel_stride, pixel_stride;
  __host__ __device__ index_t batch_offset(index_t n) const { return n * channels * height * width; }
  __host__ __device__ index_t offset(index_t c, index_t y, index_t x) const {
    return c * channel_stride + (y * width + x) * pixel_stride;
  }
};

template <bool kChannelsLast, typename scalar_t, typename index_t>
InputGradLayout<index_t> input_grad_layout(const DeformSepconvParams<scalar_t, index_t>& p) {
  return {p.channels, p.height_in, p.width_in, input_channel_stride<kChannelsLast>(p),
          input_pixel_stride<kChannelsLast>(p)};
}

// Global-memory atomics into grad_input[n] (float32 for the half types, rounded once at the end).
template <typename acc_t, typename index_t>
struct GlobalAtomicAdd {
  acc_t* grad;  // grad_input (or grad_input[n] after at_batch), nullptr for no input gradient
  InputGradLayout<index_t> layout;
  __host__ __device__ GlobalAtomicAdd at_batch(index_t n) const {
    return {grad ? grad + layout.batch_offset(n) : nullptr, layout};
  }
  __host__ __device__ void operator()(index_t c, index_t y, index_t x, acc_t v) const {
#ifdef __CUDA_ARCH__
    atomicAdd(grad + layout.offset(c, y, x), v);
#endif
  }
};

// Deterministic input gradient (torch.use_deterministic_algorithms): every contribution is rounded
// to a 64-bit fixed-point integer before an integer atomic add, and integer addition does not
// depend on order, so the sum is bitwise reproducible. `scale` (on the device, so nothing
// synchronises and CUDA graphs can capture it) is 2^62 over a bound on any element's total, so
// no sum overflows; a contribution that is not finite or exceeds the bound sets `poisoned`, and
// the result is then NaN rather than silently wrong.
template <typename acc_t, typename index_t>
struct FixedPointAtomicAdd {
  unsigned long long* grad;
  const double* scale;
  int* poisoned;
  InputGradLayout<index_t> layout;
  __host__ __device__ FixedPointAtomicAdd at_batch(index_t n) const {
    return {grad + layout.batch_offset(n), scale, poisoned, layout};
  }
  __host__ __device__ void operator()(index_t c, index_t y, index_t x, acc_t v) const {
#ifdef __CUDA_ARCH__
    const double scaled = static_cast<double>(v) * *scale;
    if (!(fabs(scaled) <= 4.6e18)) {  // also false for NaN
      atomicOr(poisoned, 1);
      return;
    }
    atomicAdd(grad + layout.offset(c, y, x),
              static_cast<unsigned long long>(static_cast<long long>(llrint(scaled))));
#endif
  }
};

// Float atomics into the tile's footprint [row0, row0 + rows) x [col0, col0 + cols) for channels
// [c0, c0 + channels); anything outside goes to `fallback`. Used for float64, whose 53-bit
// significand the fixed-point tile below cannot hold.
template <typename acc_t, typename index_t, typename GlobalAdd>
struct FloatTileAdd {
  acc_t* tile;
  index_t row0, col0, rows, cols, c0;
  GlobalAdd fallback;
  __device__ void operator()(index_t c, index_t y, index_t x, acc_t v) const {
    const index_t r = y - row0, q = x - col0;
    if (r >= 0 && r < rows && q >= 0 && q < cols) {
      atomicAdd(tile + ((c - c0) * rows + r) * cols + q, v);
    } else {
      fallback(c, y, x, v);
    }
  }
  __device__ acc_t element(index_t e) const { return tile[e]; }
};

// Fixed-point accumulation for float32 and the half types (which compute in float32). Each tile
// first bounds the total magnitude S of all its input-gradient contributions (input_grad_bound);
// every add is then v' = v * 2^kFixedPointBits / S (a power of two, so exact) split into two int32
// words, hi = round(v' / 2^16) and lo = v' - hi * 2^16, each a native shared-memory integer
// atomic. With |v'| summing to < 2^37 and at most 2^16 adds per element neither word overflows;
// the quantum, 2^-37 S, is finer than what float32 atomics lose; and the sum does not depend on
// the order of the adds, so the tile is deterministic too. A tile whose bound is not finite (NaN
// or inf data) or vanishingly small is disabled: its adds all go to `fallback`.
constexpr int kFixedPointBits = 37;
// At most (tile pixels x taps) adds reach one element of one channel; lo needs that <= 2^16.
constexpr int64_t kFixedPointMaxTaps = (int64_t(1) << 16) / kTileThreads;

template <typename index_t, typename GlobalAdd>
struct FixedPointTileAdd {
  int* tile;  // the hi words; the lo words follow at + lo_offset (two planes, so a warp's adds to
              // consecutive elements hit consecutive banks)
  index_t lo_offset;
  index_t row0, col0, rows, cols, c0;
  float scale, inv_scale;
  bool enabled;
  GlobalAdd fallback;
  __device__ int* element_at(index_t c, index_t r, index_t q) const {
    return tile + ((c - c0) * rows + r) * cols + q;
  }
  __device__ void add_at(int* element, float v) const {
    const float scaled = v * scale;
    // Adding 1.5 * 2^39 leaves round(scaled / 2^16) in the low significand bits (|scaled| < 2^38);
    // subtracting it back is exact, and so is the remainder, |rest| <= 2^15.
    constexpr float kHiShift = 824633720832.0f;  // 1.5 * 2^39
    constexpr float kLoShift = 12582912.0f;      // 1.5 * 2^23
    const float shifted = scaled + kHiShift;
    const int hi = __float_as_int(shifted) - __float_as_int(kHiShift);
    const float rest = scaled - (shifted - kHiShift);
    const int lo = __float_as_int(rest + kLoShift) - __float_as_int(kLoShift);
    atomicAdd(element, hi);
    atomicAdd(element + lo_offset, lo);
  }
  __device__ void operator()(index_t c, index_t y, index_t x, float v) const {
    const index_t r = y - row0, q = x - col0;
    if (enabled && r >= 0 && r < rows && q >= 0 && q < cols) {
      add_at(element_at(c, r, q), v);
    } else {
      fallback(c, y, x, v);
    }
  }
  __device__ float element(index_t e) const {
    return fmaf(static_cast<float>(tile[e]), 65536.0f, static_cast<float>(tile[lo_offset + e])) * inv_scale;
  }
};

// scatter_corners for the fixed-point tile (more specialised than the generic one in sampling.h,
// so the backward picks it): when all four corners fall inside the footprint, one address and four
// unconditional adds. Corners outside the image are added too, to footprint elements the flush
// skips, which saves a check per corner.
template <typename index_t, typename GlobalAdd>
__device__ void scatter_corners(const BilinearSample<float, index_t>& s, float value, index_t c,
                                FixedPointTileAdd<index_t, GlobalAdd>& add) {
  const index_t r = s.y.lo - add.row0, q = s.x.lo - add.col0;
  if (!(add.enabled && r >= 0 && r + 1 < add.rows && q >= 0 && q + 1 < add.cols)) {
    scatter_each_corner(s, value, c, add);
    return;
  }
  const float ly = s.y.frac, lx = s.x.frac;
  const float top = value * (1.0f - ly), bottom = value * ly;
  int* element = add.element_at(c, r, q);
  add.add_at(element, top * (1.0f - lx));
  add.add_at(element + 1, top * lx);
  element += add.cols;
  add.add_at(element, bottom * (1.0f - lx));
  add.add_at(element + 1, bottom * lx);
}

// Bound on the summed magnitude of one output pixel's input-gradient contributions:
// max_c |dL/dout| * sum_t |V_i H_j M_t| (each bilinear weight is <= 1). NaN or inf data make it
// NaN or inf, which disables the tile.
template <int kKernelH, int kKernelW, bool kChannelsLast, typename scalar_t, typename index_t>
__device__ float input_grad_bound(const DeformSepconvParams<scalar_t, index_t>& p, const scalar_t* grad_output,
                                  index_t n, index_t y, index_t x) {
  const index_t KH = kernel_extent<kKernelH>(p.kernel_h);
  const index_t KW = kernel_extent<kKernelW>(p.kernel_w);
  const index_t hw_out = p.height_out * p.width_out;
  const index_t pixel = y * p.width_out + x;
  const index_t tap_stride = channel_stride<kChannelsLast>(hw_out);
  const scalar_t* vert = p.vertical ? p.vertical + pixel_view<kChannelsLast>(n, pixel, KH, hw_out).base : nullptr;
  const scalar_t* horz = p.horizontal ? p.horizontal + pixel_view<kChannelsLast>(n, pixel, KW, hw_out).base : nullptr;
  const scalar_t* mask = p.mask ? p.mask + pixel_view<kChannelsLast>(n, pixel, KH * KW, hw_out).base : nullptr;
  float weights = 0.0f;
  EDSC_NO_UNROLL
  for (index_t i = 0; i < KH; ++i) {
    float row = 0.0f;
    EDSC_UNROLL
    for (index_t j = 0; j < KW; ++j) {
      row += fabsf(load_param_or(horz, j * tap_stride, 1.0f) * load_param_or(mask, (i * KW + j) * tap_stride, 1.0f));
    }
    weights += fabsf(load_param_or(vert, i * tap_stride, 1.0f)) * row;
  }
  const PixelView<index_t> go_view = pixel_view<kChannelsLast>(n, pixel, p.channels, hw_out);
  const scalar_t* go = grad_output + go_view.base;
  float largest = 0.0f;
  for (index_t c = 0; c < p.channels; ++c) {
    const float g = fabsf(static_cast<float>(go[c * go_view.stride]));
    largest = (g > largest || g != g) ? g : largest;  // keeps a NaN
  }
  return weights * largest;
}

// Backward with one thread per output pixel: the parameter gradients only, or with the input
// gradient through global atomics (InputGrad: GlobalAtomicAdd, or FixedPointAtomicAdd when
// deterministic).
template <int kChannelBlock, int kKernelH, int kKernelW, int kMaxWidth, bool kChannelsLast, typename scalar_t,
          typename index_t, typename InputGrad>
__global__ void __launch_bounds__(kThreadsPerBlock)
    deform_sepconv_backward_cuda_kernel(const DeformSepconvParams<scalar_t, index_t> p,
                                        const scalar_t* __restrict__ grad_output,
                                        const DeformSepconvParamGrads<scalar_t> param_grads,
                                        const InputGrad input_grad, bool with_input_grad, int64_t work_items) {
  using acc_t = at::opmath_type<scalar_t>;
  const index_t hw = p.height_out * p.width_out;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < work_items;
       k += int64_t(blockDim.x) * gridDim.x) {
    const index_t item = static_cast<index_t>(k);
    const index_t pixel = item % hw;
    const index_t n = item / hw;
    InputGrad add = input_grad.at_batch(n);
    deform_sepconv_backward_pixel<kChannelBlock, kKernelH, kKernelW, kMaxWidth, kChannelsLast, scalar_t, acc_t,
                                  index_t>(
        p, grad_output, param_grads, add, index_t(0), with_input_grad ? p.channels : index_t(0), n,
        pixel / p.width_out, pixel % p.width_out);
  }
}

// Footprint of a tile's input-gradient contributions, in input coordinates relative to the tile.
struct TileFootprint {
  int64_t rows, cols, channels_per_pass;
};

// Both tile accumulators take 8 bytes an element: a float64, or the fixed point's two int32 words.
constexpr int64_t kTileElementBytes = 8;

TileFootprint tile_footprint(const DeformSepconvConfig& cfg, int64_t channels) {
  TileFootprint f;
  f.rows = kTileH + cfg.dilation_h * (cfg.kernel_h - 1) + 1 + 2 * kTileMargin;
  f.cols = kTileW + cfg.dilation_w * (cfg.kernel_w - 1) + 1 + 2 * kTileMargin;
  f.channels_per_pass = std::min<int64_t>(channels, kTileSharedBytes / (f.rows * f.cols * kTileElementBytes));
  return f;
}

// Sum over the block (kTileThreads threads); every thread gets it. NaN and inf propagate.
__device__ float block_sum(float v, float* scratch) {
  EDSC_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  if (tid % 32 == 0) scratch[tid / 32] = v;
  __syncthreads();
  float total = 0.0f;
  EDSC_UNROLL
  for (int w = 0; w < kTileThreads / 32; ++w) total += scratch[w];
  return total;
}

// GlobalAdd: GlobalAtomicAdd, or FixedPointAtomicAdd when deterministic (float32 and the half
// types only, whose tile is fixed point and so order-independent). kWarpStaged (channels_last, 5x5,
// fixed point): each warp, a row of the tile, stages its per-pixel values through shared memory
// (warp_staged_values.cuh). kExactBlock: the call has exactly kChannelBlock channels and the tile
// holds them all (one pass); knowing that at compile time removes the channel loops' branches.
template <int kChannelBlock, int kKernelH, int kKernelW, int kMaxWidth, bool kChannelsLast, bool kWarpStaged,
          bool kExactBlock, typename scalar_t, typename index_t, typename GlobalAdd>
__global__ void __launch_bounds__(kTileThreads, 2)
    deform_sepconv_backward_tiled_cuda_kernel(const DeformSepconvParams<scalar_t, index_t> params,
                                              const scalar_t* __restrict__ grad_output,
                                              const DeformSepconvParamGrads<scalar_t> param_grads,
                                              const GlobalAdd input_grad, index_t rows, index_t cols,
                                              index_t pass_capacity, bool prefetch) {
  decltype(auto) p = with_exact_block<kExactBlock, kChannelBlock>(params);
  const index_t channels_per_pass = kExactBlock ? index_t(kChannelBlock) : pass_capacity;
  using acc_t = at::opmath_type<scalar_t>;
  constexpr bool kFixedPoint = std::is_same_v<acc_t, float>;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  __shared__ float bound_scratch[kTileThreads / 32];
  using StagedBuffers = WarpStagedBuffers<scalar_t, kWarpStagedKernel>;
  __shared__ std::conditional_t<kWarpStaged, StagedBuffers[kTileH], char[1]> staged;

  const index_t tiles_x = (p.width_out + kTileW - 1) / kTileW;
  const index_t tiles_y = (p.height_out + kTileH - 1) / kTileH;
  const index_t tile_x = static_cast<index_t>(blockIdx.x % tiles_x);
  const index_t tile_y = static_cast<index_t>((blockIdx.x / tiles_x) % tiles_y);
  const index_t n = static_cast<index_t>(blockIdx.x / (int64_t(tiles_x) * tiles_y));
  const index_t y = tile_y * kTileH + static_cast<index_t>(threadIdx.y);
  const index_t x = tile_x * kTileW + static_cast<index_t>(threadIdx.x);
  const bool active = y < p.height_out && x < p.width_out;
  const int tid = threadIdx.y * kTileW + threadIdx.x;
  static_assert(!kWarpStaged || (kChannelsLast && kKernelH == kWarpStagedKernel && kKernelW == kWarpStagedKernel &&
                                 kTileW == kWarpSize && std::is_same_v<index_t, int32_t>),
                "warp staging: channels_last, 5x5, a warp per tile row, 32-bit indices");
  // kWarpStaged: this warp's pixels, (n, y, x0 .. x0 + count - 1), consecutive in memory.
  const index_t tile_x0 = tile_x * kTileW;
  const int warp_pixels = y < p.height_out ? static_cast<int>(min(index_t(kTileW), p.width_out - tile_x0)) : 0;
  const index_t warp_first = (n * p.height_out + y) * p.width_out + tile_x0;
  // Inactive lanes run the staged pixel code too (the copies are shared), at a real pixel.
  const index_t y_in = min(y, p.height_out - 1), x_in = min(x, p.width_out - 1);

  using TileAdd = std::conditional_t<kFixedPoint, FixedPointTileAdd<index_t, GlobalAdd>,
                                     FloatTileAdd<acc_t, index_t, GlobalAdd>>;
  using word_t = std::conditional_t<kFixedPoint, int, acc_t>;
  constexpr int kWords = kFixedPoint ? 2 : 1;
  word_t* tile = reinterpret_cast<word_t*>(shared_raw);
  TileAdd add{};
  add.tile = tile;
  add.row0 = tile_y * kTileH - p.pad_h - kTileMargin;
  add.col0 = tile_x * kTileW - p.pad_w - kTileMargin;
  add.rows = rows;
  add.cols = cols;
  add.fallback = input_grad.at_batch(n);
  const index_t words_per_plane = channels_per_pass * rows * cols;
  // kWarpStaged: the warp's staged values, for the bound and every pass.
  struct Unstaged {};
  [[maybe_unused]] auto values = [&] {
    if constexpr (kWarpStaged) {
      return WarpStagedPixelValues<scalar_t, index_t, kWarpStagedKernel>(staged[threadIdx.y], p, param_grads,
                                                                         warp_first, warp_pixels, threadIdx.x);
    } else {
      return Unstaged{};
    }
  }();
  // NCHW 5x5: the warp's per-pixel values into L2 first (prefetched_pixel_values.cuh); the bound
  // pass below reads some of them, the taps the rest.
  if constexpr (!kChannelsLast && !kWarpStaged && kKernelH == 5 && kKernelW == 5 && std::is_same_v<index_t, int32_t>) {
    if (prefetch && warp_pixels > 0) {
      prefetch_warp_planes_l2<kKernelH>(p, warp_first, warp_first + warp_pixels - 1, threadIdx.x);
    }
  }
  bool use_tile = true;
  if constexpr (kFixedPoint) {
    add.lo_offset = words_per_plane;
    float part = 0.0f;
    if constexpr (kWarpStaged) {
      part = values.input_grad_bound(grad_output);
    } else {
      part = active ? input_grad_bound<kKernelH, kKernelW, kChannelsLast>(p, grad_output, n, y, x) : 0.0f;
    }
    const float bound = block_sum(part, bound_scratch);
    int exponent = 0;
    frexpf(bound, &exponent);  // bound < 2^exponent
    // Finite, and not so small that 2^(kFixedPointBits - exponent) overflows float.
    use_tile = bound == 0.0f || (bound - bound == 0.0f && exponent > kFixedPointBits - 126);
    add.scale = bound == 0.0f ? 1.0f : ldexpf(1.0f, kFixedPointBits - exponent);
    add.inv_scale = bound == 0.0f ? 1.0f : ldexpf(1.0f, exponent - kFixedPointBits);
    add.enabled = use_tile;
  }

  for (index_t c0 = 0; c0 < p.channels; c0 += channels_per_pass) {
    const index_t pass_channels = min(channels_per_pass, p.channels - c0);
    const index_t tile_elems = pass_channels * rows * cols;
    if (use_tile) {
      for (index_t e = tid; e < words_per_plane * kWords; e += kTileThreads) tile[e] = word_t(0);
    }
    __syncthreads();
    add.c0 = c0;
    // The parameter gradients need all channels once: on the first pass only.
    const DeformSepconvParamGrads<scalar_t> pass_grads =
        c0 == 0 ? param_grads : DeformSepconvParamGrads<scalar_t>{nullptr, nullptr, nullptr, nullptr};
    if constexpr (kWarpStaged) {
      if (c0 > 0) values.restart_without_grads();
      deform_sepconv_backward_pixel_with<kChannelBlock, kKernelH, kKernelW, kMaxWidth, kChannelsLast, scalar_t,
                                         acc_t>(p, values, grad_output, add, c0, c0 + pass_channels, n, y_in, x_in);
      values.finish();
    } else if (active) {
      deform_sepconv_backward_pixel<kChannelBlock, kKernelH, kKernelW, kMaxWidth, kChannelsLast, scalar_t, acc_t,
                                    index_t>(p, grad_output, pass_grads, add, c0, c0 + pass_channels, n, y, x);
    }
    __syncthreads();
    // Flush: one global add per touched footprint element inside the image (neighbouring tiles
    // overlap; elements outside it may hold adds of corners that carry no gradient). Consecutive
    // threads take consecutive addresses: x fastest in NCHW, the channel fastest in channels_last.
    if (use_tile) {
      const index_t footprint = rows * cols;
      for (index_t k = tid; k < tile_elems; k += kTileThreads) {
        const index_t e = kChannelsLast ? (k % pass_channels) * footprint + k / pass_channels : k;
        const index_t row = add.row0 + (e / cols) % rows;
        const index_t col = add.col0 + e % cols;
        if (row < 0 || row >= p.height_in || col < 0 || col >= p.width_in) continue;
        const acc_t v = add.element(e);
        if (v != acc_t(0)) add.fallback(c0 + e / footprint, row, col, v);
      }
    }
    __syncthreads();
  }
}

// EDSC_EXT_INPUT_GRAD=global skips the shared-memory tile and adds every input-gradient sample
// with a global atomic: for benchmarks and for testing that path, which otherwise only runs for
// footprints too large for shared memory or tensors needing 64-bit indices.
bool force_global_atomics() {
  const char* value = std::getenv("EDSC_EXT_INPUT_GRAD");
  return value != nullptr && std::string(value) == "global";
}

// Whether `kernel` (a warp-staged tile) can run with `dynamic` bytes of dynamic shared memory on
// the current device: its static buffers plus the tile can exceed the 48 KB a block gets without
// opting in (86 KB in float32), which Hopper and Ampere allow and Turing (64 KB) may not. Opts in
// where needed, once per device, kernel and size: cudaFuncSetAttribute can hold the host until
// pending copies finish, and this way a CUDA-graph capture after the usual warm-up makes no such
// call. EDSC_EXT_WARP_STAGING=0 disables staging (benchmarks, tests).
template <typename Kernel>
bool warp_staging_fits(Kernel kernel, size_t dynamic) {
  const char* mode = std::getenv("EDSC_EXT_WARP_STAGING");
  if (mode != nullptr && std::string(mode) == "0") return false;
  static std::mutex mutex;
  // Per (device, kernel): its static shared memory, and the dynamic size it is opted in to.
  static std::map<std::pair<int, const void*>, std::pair<size_t, size_t>> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(static_cast<int>(c10::cuda::current_device()), reinterpret_cast<const void*>(kernel));
  auto found = known.find(key);
  if (found == known.end()) {
    cudaFuncAttributes attributes{};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    found = known.emplace(key, std::make_pair(attributes.sharedSizeBytes, size_t(48 * 1024) - attributes.sharedSizeBytes))
                .first;
  }
  auto& [static_bytes, opted_in] = found->second;
  if (static_bytes + dynamic > at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin) return false;
  if (dynamic > opted_in) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dynamic)));
    opted_in = dynamic;
  }
  return true;
}

// Parameter gradients of the grid-tap calls (grid_tap_window.cuh) with up to 4 channels, all in one
// window. Per tap, s = sum_c dL/dout_c * window_c (one shared-memory load and one multiply-add a
// channel), then dV_i += H_j M_t s, dH_j += V_i M_t s and dM_t = V_i H_j s. Each thread owns one
// output pixel; it sums dV of kGridTapChunk rows in registers and dH of the chunk's columns, added
// after each chunk to its own column of KW sums in shared memory. The input gradient is left to the
// bilinear kernels (launch_deform_sepconv_backward). Before this, sepconv's 51x51 backward spent
// four global gathers and their bilinear derivatives per tap and channel.
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
  using acc_t = at::opmath_type<scalar_t>;
  extern __shared__ __align__(16) unsigned char window_raw[];
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

// Launches the grid-tap parameter-gradient kernel where it applies (no offsets, no dilation, up to
// 4 channels, float32 or a half type, the window and dH sums within shared memory) and returns
// whether it did.
template <typename scalar_t>
bool launch_grid_taps_param_grads(const DeformSepconvTensors& t, const DeformSepconvConfig& cfg,
                                  const DeformSepconvParamGrads<scalar_t>& grads, cudaStream_t stream) {
  if constexpr (sizeof(scalar_t) > 4) {
    return false;
  } else {
    using acc_t = at::opmath_type<scalar_t>;
    const int64_t channels = t.input.size(1);
    GridWindow window;
    int64_t channel_bytes = 0;
    if (!grads.any() || channels > 4 || !grid_taps_apply(t, cfg, window, channel_bytes)) return false;
    const int64_t shared = channels * channel_bytes +
                           (grads.horizontal ? cfg.kernel_w * kGridTileThreads * static_cast<int64_t>(sizeof(acc_t)) : 0);
    if (shared > at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin) return false;
    const auto p = make_params<scalar_t, int64_t>(t, cfg);
    const scalar_t* go = t.grad_output.const_data_ptr<scalar_t>();
    const auto launch = [&](auto kernel) {
      allow_grid_taps_shared(kernel, static_cast<size_t>(shared));
      kernel<<<grid_taps_grid(t), kGridTileThreads, static_cast<size_t>(shared), stream>>>(p, go, grads, window);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    const auto with_channels = [&](auto channel_count) {
      constexpr int kChannels = decltype(channel_count)::value;
      EDSC_DISPATCH_LAYOUT(t.channels_last, [&] {
        t.mask.defined() ? launch(deform_sepconv_backward_grid_taps_cuda_kernel<kChannels, kChannelsLast, true, scalar_t>)
                         : launch(deform_sepconv_backward_grid_taps_cuda_kernel<kChannels, kChannelsLast, false, scalar_t>);
      });
    };
    switch (channels) {
      case 1: with_channels(std::integral_constant<int, 1>{}); break;
      case 2: with_channels(std::integral_constant<int, 2>{}); break;
      case 3: with_channels(std::integral_constant<int, 3>{}); break;
      default: with_channels(std::integral_constant<int, 4>{}); break;
    }
    return true;
  }
}

}  // namespace

template <typename scalar_t>
void launch_deform_sepconv_backward(const DeformSepconvTensors& t, const DeformSepconvConfig& cfg,
                                    std::array<at::Tensor, 5>& grads, bool deterministic,
                                    const FixedPointInputGrad& fixed_point) {
  const at::Tensor& input = t.input;
  const int64_t kernel_h = cfg.kernel_h, kernel_w = cfg.kernel_w;
  const int64_t pixels = input.size(0) * t.height_out * t.width_out;
  const int64_t channels = input.size(1);
  const auto stream = c10::cuda::getCurrentCUDAStream(input.device().index());
  using acc_t = at::opmath_type<scalar_t>;
  at::Tensor grad_input_acc;
  if (grads[0].numel() > 0 && !deterministic) {
    grad_input_acc = std::is_same_v<acc_t, scalar_t>
                         ? grads[0]
                         : at::empty(input.sizes(), input.options()
                                                        .dtype(c10::CppTypeToScalarType<acc_t>::value)
                                                        .memory_format(t.memory_format()))
                               .zero_();
  }
  acc_t* grad_input = grad_input_acc.defined() ? grad_input_acc.mutable_data_ptr<acc_t>() : nullptr;
  auto param_grads = make_param_grads<scalar_t>(grads);
  // Without offsets (sepconv) the grid-tap kernel computes the per-pixel tensors' gradients; the
  // kernels below then only scatter the input gradient, if it is asked for.
  if (launch_grid_taps_param_grads(t, cfg, param_grads, stream)) param_grads = {};
  if (grads[0].numel() == 0 && !param_grads.any()) return;  // nothing left (or asked for)
  const TileFootprint footprint = tile_footprint(cfg, channels);
  const bool prefetch = prefetch_enabled();
  // The tile needs shared memory for at least one channel, 32-bit indices (below), at most
  // kFixedPointMaxTaps taps for the fixed point, and, when deterministic, a fixed-point tile.
  constexpr bool kFixedPointTile = std::is_same_v<acc_t, float>;
  const bool tiled = grads[0].numel() > 0 && footprint.channels_per_pass >= 1 && !force_global_atomics() &&
                     (!kFixedPointTile || kernel_h * kernel_w <= kFixedPointMaxTaps) &&
                     (kFixedPointTile || !deterministic);

  EDSC_DISPATCH_INDEX_TYPE(t.use_32bit_indexing, [&] {
    EDSC_DISPATCH_KERNEL_SIZE(kernel_h, kernel_w, [&] {
      EDSC_DISPATCH_CHANNEL_BLOCK(channels, [&] {
      EDSC_DISPATCH_LAYOUT(t.channels_last, [&] {
        const auto p = make_params<scalar_t, index_t>(t, cfg);
        const scalar_t* go = t.grad_output.const_data_ptr<scalar_t>();
        // Static kernel sizes hold their accumulators in registers; run-time ones in a local array.
        constexpr int kMaxWidth = kKernelW > 0 ? kKernelW : static_cast<int>(kMaxKernelWidth);
        const InputGradLayout<index_t> layout = input_grad_layout<kChannelsLast>(p);
        // Launches `kernel` (tiled or one thread per pixel) with the input-gradient adder that the
        // mode asks for: fixed-point int64 atomics when deterministic, float atomics otherwise.
        const auto with_global_add = [&](auto&& launch) {
          if (deterministic) {
            launch(FixedPointAtomicAdd<acc_t, index_t>{
                reinterpret_cast<unsigned long long*>(fixed_point.sums.mutable_data_ptr<int64_t>()),
                fixed_point.scale.const_data_ptr<double>(), fixed_point.poisoned.mutable_data_ptr<int>(), layout});
          } else {
            launch(GlobalAtomicAdd<acc_t, index_t>{grad_input, layout});
          }
        };
        const int64_t tiles = input.size(0) * ((t.height_out + kTileH - 1) / kTileH) *
                              ((t.width_out + kTileW - 1) / kTileW);
        if constexpr (std::is_same_v<index_t, int32_t>) {
          if (tiled && tiles <= std::numeric_limits<int32_t>::max()) {
            const size_t shared = footprint.channels_per_pass * footprint.rows * footprint.cols * kTileElementBytes;
            with_global_add([&](auto add) {
              if constexpr (kFixedPointTile || !std::is_same_v<decltype(add), FixedPointAtomicAdd<acc_t, index_t>>) {
                const auto launch = [&](auto kernel) {
                  kernel<<<static_cast<unsigned int>(tiles), dim3(kTileW, kTileH), shared, stream>>>(
                      p, go, param_grads, add, static_cast<index_t>(footprint.rows),
                      static_cast<index_t>(footprint.cols), static_cast<index_t>(footprint.channels_per_pass),
                      prefetch);
                  C10_CUDA_KERNEL_LAUNCH_CHECK();
                };
                constexpr bool kCanStage =
                    kChannelsLast && kFixedPointTile && kKernelH == kWarpStagedKernel && kKernelW == kWarpStagedKernel;
                // RGB with 5x5 kernels in one pass: the channel count as a constant.
                [[maybe_unused]] const bool rgb = channels == 3 && footprint.channels_per_pass >= 3;
                if constexpr (kCanStage) {
                  const bool pairs = offset_pairs_aligned(t.offset) && offset_pairs_aligned(grads[3]);
                  if constexpr (kChannelBlock == 3) {
                    const auto kernel = deform_sepconv_backward_tiled_cuda_kernel<kChannelBlock, kKernelH, kKernelW,
                                                                                  kMaxWidth, kChannelsLast, true, true,
                                                                                  scalar_t, index_t, decltype(add)>;
                    if (rgb && pairs && warp_staging_fits(kernel, shared)) return launch(kernel);
                  }
                  const auto kernel = deform_sepconv_backward_tiled_cuda_kernel<kChannelBlock, kKernelH, kKernelW,
                                                                                kMaxWidth, kChannelsLast, true, false,
                                                                                scalar_t, index_t, decltype(add)>;
                  if (pairs && warp_staging_fits(kernel, shared)) return launch(kernel);
                }
                if constexpr (!kChannelsLast && kChannelBlock == 3 && kKernelH == 5 && kKernelW == 5) {
                  if (rgb) {
                    return launch(deform_sepconv_backward_tiled_cuda_kernel<kChannelBlock, kKernelH, kKernelW,
                                                                            kMaxWidth, kChannelsLast, false, true,
                                                                            scalar_t, index_t, decltype(add)>);
                  }
                }
                launch(deform_sepconv_backward_tiled_cuda_kernel<kChannelBlock, kKernelH, kKernelW, kMaxWidth,
                                                                 kChannelsLast, false, false, scalar_t, index_t,
                                                                 decltype(add)>);
              }
            });
            return;
          }
        }
        with_global_add([&](auto add) {
          deform_sepconv_backward_cuda_kernel<kChannelBlock, kKernelH, kKernelW, kMaxWidth, kChannelsLast, scalar_t,
                                              index_t><<<blocks_for(pixels), kThreadsPerBlock, 0, stream>>>(p, go, param_grads, add, grads[0].numel() > 0,
                                                                    pixels);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
      });
      });
    });
  });
  if (grad_input_acc.defined() && !grad_input_acc.is_same(grads[0])) grads[0].copy_(grad_input_acc);
}

}  // namespace edsc_ext
