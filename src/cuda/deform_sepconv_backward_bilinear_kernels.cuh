// The bilinear kernels of the CUDA backward (the per-pixel work from
// src/sampling.h), compiled once per dtype
// (deform_sepconv_backward_<dtype>_cuda.cu) and chosen by plan_cuda_backward:
// - tiled: one fused pass over 2-D tiles of output pixels. The input gradient, hundreds of adds per
//   pixel, is accumulated with shared-memory atomics over the tile's footprint (tile + kernel reach
//   + a margin for offsets) and flushed to global memory once; samples that land outside the
//   footprint fall back to global atomics, so any offset stays correct. The tile holds fixed-point
//   integers (FixedPointTileAdd): shared-memory float atomics are compare-and-swap loops on
//   sm_70..sm_90, integer ones a single native instruction. Both memory layouts (kChannelsLast)
//   share the tile, only its flush order and the global addresses differ. In channels_last with
//   5x5 kernels each warp (a row of the tile) stages its per-pixel values and their gradients
//   through shared memory (warp_staged_values.cuh); in NCHW with 5x5 kernels each warp first
//   prefetches its per-pixel values into L2 (prefetched_pixel_values.cuh).
// - pixels: one thread per output pixel, the input gradient (if any) through global atomics.
// - channel lanes (channels_last, many channels): adjacent threads share a pixel's channels in
//   blocks read with vector loads, sum their tap sums through shuffles, and add the input gradient
//   with global (vector) atomics: every load and atomic of a warp covers adjacent channels, where
//   the one-thread-per-pixel kernel would touch a cache line per channel.
#pragma once

#include "input_grad_accumulators.cuh"
#include "prefetched_pixel_values.cuh"
#include "warp_staged_values.cuh"

namespace edsc_ext {
namespace {

// Bound on the summed magnitude of one output pixel's input-gradient contributions:
// max_c |dL/dout| * sum_t |V_i H_j M_t| (the bilinear weights of a tap sum to <= 1; a doubled border's
// factor is the padding's bound_factor, which set_fixed_point_scale applies). NaN or inf data make it
// NaN or inf, which disables the tile.
template <int kKernelH, int kKernelW, bool kChannelsLast, typename scalar_t, typename index_t, typename param_t>
__device__ float input_grad_bound(const DeformSepconvParams<scalar_t, index_t, param_t>& p, const scalar_t* grad_output,
                                  index_t n, index_t y, index_t x) {
  const index_t KH = kernel_extent<kKernelH>(p.kernel_h);
  const index_t KW = kernel_extent<kKernelW>(p.kernel_w);
  const index_t hw_out = p.height_out * p.width_out;
  const index_t pixel = y * p.width_out + x;
  const index_t tap_stride = channel_stride<kChannelsLast>(hw_out);
  const param_t* vert = p.vertical ? p.vertical + pixel_view<kChannelsLast>(n, pixel, KH, hw_out).base : nullptr;
  const param_t* horz = p.horizontal ? p.horizontal + pixel_view<kChannelsLast>(n, pixel, KW, hw_out).base : nullptr;
  const param_t* mask = p.mask ? p.mask + pixel_view<kChannelsLast>(n, pixel, KH * KW, hw_out).base : nullptr;
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
          typename index_t, typename InputGrad, typename param_t>
__global__ void __launch_bounds__(kThreadsPerBlock)
    deform_sepconv_backward_cuda_kernel(const DeformSepconvParams<scalar_t, index_t, param_t> p,
                                        const scalar_t* __restrict__ grad_output,
                                        const DeformSepconvParamGrads<param_t> param_grads, const InputGrad input_grad,
                                        bool with_input_grad, int64_t work_items) {
  using acc_t = opmath_t<scalar_t>;
  const index_t hw = p.height_out * p.width_out;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < work_items;
       k += int64_t(blockDim.x) * gridDim.x) {
    const index_t item = static_cast<index_t>(k);
    const index_t pixel = item % hw;
    const index_t n = item / hw;
    InputGrad add = input_grad.at_batch(n);
    deform_sepconv_backward_pixel<kChannelBlock, kKernelH, kKernelW, kMaxWidth, kChannelsLast, scalar_t, acc_t,
                                  index_t>(p, grad_output, param_grads, add, index_t(0),
                                           with_input_grad ? p.channels : index_t(0), n, pixel / p.width_out,
                                           pixel % p.width_out);
  }
}

// The per-pixel values of one channels_last output pixel whose channels 2^lanes_log2 adjacent
// threads of a warp share (kSplitsChannels, deform_sepconv_backward_pixel_with): lane l takes the
// blocks of kBlock channels l, l + lanes, ...; the lanes sum each tap's sums with xor shuffles (so
// every lane holds the same sums, bit for bit) and take turns storing the pixel's gradients. A
// lane of a pixel past the end (`stores` false) computes the last pixel's values for the shuffles
// and stores nothing.
template <int kBlock, typename scalar_t, typename index_t, typename param_t>
struct ChannelLanePixelValues : GlobalPixelValues<true, scalar_t, index_t, param_t> {
  using Base = GlobalPixelValues<true, scalar_t, index_t, param_t>;
  static constexpr bool kSplitsChannels = true;
  int lane, lanes;
  bool stores;

  __device__ ChannelLanePixelValues(const DeformSepconvParams<scalar_t, index_t, param_t>& p, index_t n, index_t pixel,
                                    index_t KH, index_t KW, const DeformSepconvParamGrads<param_t>& grads, int lane_,
                                    int lanes_, bool stores_)
      : Base(p, n, pixel, KH, KW, grads), lane(lane_), lanes(lanes_), stores(stores_) {}

  __device__ index_t first_channel(index_t c_begin) const { return c_begin + index_t(lane) * kBlock; }
  __device__ index_t channel_step() const { return index_t(lanes) * kBlock; }
  template <typename acc_t>
  __device__ void sum_over_threads(acc_t& a, acc_t& b, acc_t& c) const {
    for (int offset = lanes / 2; offset > 0; offset /= 2) {
      a += __shfl_xor_sync(0xffffffffu, a, offset);
      b += __shfl_xor_sync(0xffffffffu, b, offset);
      c += __shfl_xor_sync(0xffffffffu, c, offset);
    }
  }
  __device__ bool stores_tap(index_t k) const { return stores && (static_cast<int>(k) & (lanes - 1)) == lane; }
  __device__ void store_vertical_grad(index_t i, param_t v) const {
    if (stores_tap(i)) Base::store_vertical_grad(i, v);
  }
  __device__ void store_horizontal_grad(index_t j, param_t v) const {
    if (stores_tap(j)) Base::store_horizontal_grad(j, v);
  }
  __device__ void store_mask_grad(index_t j, index_t t, param_t v) const {
    if (stores_tap(t)) Base::store_mask_grad(j, t, v);
  }
  __device__ void store_offset_grad(index_t j, index_t t, param_t dy, param_t dx) const {
    if (stores_tap(t)) Base::store_offset_grad(j, t, dy, dx);
  }
};

// Backward of the channel lanes: thread k works on output pixel k >> lanes_log2 (all of them, no
// grid-stride loop: the planner bounds the grid), its channel blocks as ChannelLanePixelValues
// says; the input gradient (with_input_grad) into acc_t global memory.
template <int kBlock, int kKernelH, int kKernelW, int kMaxWidth, typename scalar_t, typename index_t, typename param_t>
__global__ void __launch_bounds__(kThreadsPerBlock)
    deform_sepconv_backward_channel_lanes_cuda_kernel(const DeformSepconvParams<scalar_t, index_t, param_t> p,
                                                      const scalar_t* __restrict__ grad_output,
                                                      const DeformSepconvParamGrads<param_t> param_grads,
                                                      const GlobalAtomicAdd<opmath_t<scalar_t>, index_t> input_grad,
                                                      bool with_input_grad, int lanes_log2, int64_t pixels) {
  using acc_t = opmath_t<scalar_t>;
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  // A warp wholly past the last pixel has nothing to do (its lanes leave together).
  if (((k & ~int64_t(kWarpSize - 1)) >> lanes_log2) >= pixels) return;
  const int lanes = 1 << lanes_log2;
  const bool active = (k >> lanes_log2) < pixels;
  const index_t item = static_cast<index_t>(active ? k >> lanes_log2 : pixels - 1);
  const index_t hw = p.height_out * p.width_out;
  const index_t pixel = item % hw;
  const index_t n = item / hw;
  ChannelLanePixelValues<kBlock, scalar_t, index_t, param_t> values(p, n, pixel, kernel_extent<kKernelH>(p.kernel_h),
                                                                    kernel_extent<kKernelW>(p.kernel_w), param_grads,
                                                                    static_cast<int>(k & (lanes - 1)), lanes, active);
  GlobalAtomicAdd<acc_t, index_t> add = input_grad.at_batch(n);
  deform_sepconv_backward_pixel_with<kBlock, kKernelH, kKernelW, kMaxWidth, true, scalar_t, acc_t>(
      p, values, grad_output, add, index_t(0), active && with_input_grad ? p.channels : index_t(0), n,
      pixel / p.width_out, pixel % p.width_out);
}

// The backward of one output pixel of an exact-RGB NCHW call (kChannels channels) into the
// fixed-point tile, the padding mode compiled in (kPaddingMode): the lean taps of the forward
// (static_padding_sample: no branch on the mode's traits, a clamping mode's corners read unpredicated),
// the output gradient read once for all taps, each tap's corner values summed over the channels against
// it first (every parameter gradient is linear in them: 12 multiply-adds where the generic pixel code
// forms three bilinear values and derivatives per channel), and each tap's tile elements and fixed-point
// corner weights found once for its channels, and each tap's offsets and mask read while the tap before
// it runs. What deform_sepconv_backward_pixel_with computes, up to rounding; a non-finite position
// poisons its parameter gradients and adds nothing to the input's.
template <int64_t kPaddingMode, int kChannels, int kKernelH, int kKernelW, typename scalar_t, typename index_t,
          typename param_t, typename GlobalAdd, int kWords>
__device__ void deform_sepconv_backward_rgb_pixel(const DeformSepconvParams<scalar_t, index_t, param_t>& p,
                                                  const GlobalPixelValues<false, scalar_t, index_t, param_t>& values,
                                                  const PlanarFrame<kChannels, scalar_t, index_t>& frame,
                                                  const scalar_t* grad_output,
                                                  const FixedPointTileAdd<index_t, GlobalAdd, kWords>& add, index_t n,
                                                  index_t y, index_t x) {
  static_assert(kKernelH > 0 && kKernelW > 0, "a compile-time kernel size");
  constexpr PaddingTraits kPadding = static_padding_traits<kPaddingMode>();
  const index_t hw_out = p.height_out * p.width_out;
  const index_t pixel = y * p.width_out + x;
  float g[kChannels];
  EDSC_UNROLL
  for (int c = 0; c < kChannels; ++c) {
    g[c] = static_cast<float>(grad_output[(n * kChannels + c) * hw_out + pixel]);
  }
  const HorizontalWeights<kKernelW, param_t, float, index_t> horizontal(values.horizontal_values(),
                                                                        values.horizontal_stride());
  float grad_h[kKernelW];
  EDSC_UNROLL
  for (int j = 0; j < kKernelW; ++j) grad_h[j] = 0.0f;
  // Elements from one channel's plane of the tile to the next (one pass holds all kChannels).
  const index_t tile_plane = add.rows * add.cols;
  const int64_t y_base = static_cast<int64_t>(y) - p.pad_h;
  const int64_t x_base = static_cast<int64_t>(x) - p.pad_w;
  // Each tap's offsets and mask are read one tap ahead: they come from L2, and a tap cannot address the
  // frame before its offsets arrive (ncu: read when the tap came, that wait held most warps).
  struct TapValues {
    float dy, dx, mask;
  };
  const auto tap_values = [&](index_t t) {
    const bool offsets = values.has_offset();
    return TapValues{offsets ? values.template offset_value<float>(0, t, 0) : 0.0f,
                     offsets ? values.template offset_value<float>(0, t, 1) : 0.0f,
                     values.template mask_value<float>(0, t)};
  };
  TapValues next = tap_values(0);
  EDSC_NO_UNROLL
  for (index_t i = 0; i < kKernelH; ++i) {
    const float wv = values.template vertical<float>(i);
    const float py0 = static_cast<float>(y_base + static_cast<int64_t>(i) * p.dilation_h);
    float grad_v = 0.0f;
    EDSC_UNROLL
    for (int j = 0; j < kKernelW; ++j) {
      const index_t t = i * kKernelW + j;
      const TapValues tap = next;
      next = tap_values(t + 1 < kKernelH * kKernelW ? t + 1 : t);  // the last tap reads its own again
      const float wh = horizontal(j);
      const float wm = tap.mask;
      const float py = py0 + tap.dy;
      const float px = static_cast<float>(x_base + static_cast<int64_t>(j) * p.dilation_w) + tap.dx;
      const float poison = py * 0.0f + px * 0.0f;  // NaN for a non-finite position, else 0
      const float w = wv * wh * wm;
      float w_scaled = w;  // doubled where a doubled border counts the border pixel twice
      const auto s = static_padding_sample<kPaddingMode>(p, index_t(1), py, px, w_scaled);
      const index_t i00 = s.i00, i01 = i00 + s.right, i10 = i00 + s.down, i11 = i01 + s.down;
      // Which corners lie inside the image (a clamping mode's upper left one always does).
      using unsigned_t = std::make_unsigned_t<index_t>;
      const bool y_lo = kPadding.clamps || static_cast<unsigned_t>(s.y0) < static_cast<unsigned_t>(p.height_in);
      const bool y_hi = static_cast<unsigned_t>(s.y0 + 1) < static_cast<unsigned_t>(p.height_in);
      const bool x_lo = kPadding.clamps || static_cast<unsigned_t>(s.x0) < static_cast<unsigned_t>(p.width_in);
      const bool x_hi = static_cast<unsigned_t>(s.x0 + 1) < static_cast<unsigned_t>(p.width_in);
      // Sums over channels of dL/dout times each corner's value.
      float g00 = 0.0f, g01 = 0.0f, g10 = 0.0f, g11 = 0.0f;
      EDSC_UNROLL
      for (int c = 0; c < kChannels; ++c) {
        const scalar_t* plane = frame.planes[c];
        if constexpr (kPadding.clamps) {
          g00 += g[c] * static_cast<float>(load_read_only(plane + i00));
          g01 += g[c] * static_cast<float>(load_read_only(plane + i01));
          g10 += g[c] * static_cast<float>(load_read_only(plane + i10));
          g11 += g[c] * static_cast<float>(load_read_only(plane + i11));
        } else {
          const auto corner = [&](bool inside, index_t at) {
            return inside ? static_cast<float>(load_read_only(plane + at)) : 0.0f;
          };
          g00 += g[c] * corner(y_lo && x_lo, i00);
          g01 += g[c] * corner(y_lo && x_hi, i01);
          g10 += g[c] * corner(y_hi && x_lo, i10);
          g11 += g[c] * corner(y_hi && x_hi, i11);
        }
      }
      // The sums of dL/dout * S, * dS/dly and * dS/dlx (interpolate, interpolate_dy, interpolate_dx).
      const float top = g00 + s.lx * (g01 - g00), bottom = g10 + s.lx * (g11 - g10);
      const float grad_w = (top + s.ly * (bottom - top)) * s.factor + poison;
      const float grad_ly = (bottom - top) + poison;
      const float grad_lx = (g01 - g00) + s.ly * ((g11 - g10) - (g01 - g00)) + poison;
      grad_v += grad_w * wh * wm;
      grad_h[j] += grad_w * wv * wm;
      if (values.wants_mask_grad()) values.store_mask_grad(j, t, static_cast<param_t>(grad_w * wv * wh));
      if (values.wants_offset_grad()) {
        values.store_offset_grad(j, t, static_cast<param_t>(grad_ly * w_scaled * s.dcoord_y),
                                 static_cast<param_t>(grad_lx * w_scaled * s.dcoord_x));
      }
      if (poison != 0.0f) continue;  // poison is NaN: the input gradient gets nothing
      const float w_lower = w_scaled - w_scaled * s.ly, w_upper = w_scaled * s.ly;
      const float w01 = w_lower * s.lx, w00 = w_lower - w01, w11 = w_upper * s.lx, w10 = w_upper - w11;
      const index_t r = s.y0 - add.row0, q = s.x0 - add.col0;
      if (add.enabled && static_cast<unsigned_t>(r) < static_cast<unsigned_t>(add.rows - 1) &&
          static_cast<unsigned_t>(q) < static_cast<unsigned_t>(add.cols - 1)) {
        // All four corners in the footprint (corners outside the image too, to elements the flush skips).
        int* element = add.tile + r * add.cols + q;
        const float f00 = w00 * add.scale, f01 = w01 * add.scale, f10 = w10 * add.scale, f11 = w11 * add.scale;
        EDSC_UNROLL
        for (int c = 0; c < kChannels; ++c) {
          add.add_scaled_at(element, g[c] * f00);
          add.add_scaled_at(element + 1, g[c] * f01);
          add.add_scaled_at(element + add.cols, g[c] * f10);
          add.add_scaled_at(element + add.cols + 1, g[c] * f11);
          element += tile_plane;
        }
      } else {
        // The global fallback, corners inside the image only.
        EDSC_UNROLL
        for (int c = 0; c < kChannels; ++c) {
          if (y_lo && x_lo) add.fallback(c, s.y0, s.x0, g[c] * w00);
          if (y_lo && x_hi) add.fallback(c, s.y0, s.x0 + 1, g[c] * w01);
          if (y_hi && x_lo) add.fallback(c, s.y0 + 1, s.x0, g[c] * w10);
          if (y_hi && x_hi) add.fallback(c, s.y0 + 1, s.x0 + 1, g[c] * w11);
        }
      }
    }
    if (values.wants_vertical_grad()) values.store_vertical_grad(i, static_cast<param_t>(grad_v));
  }
  if (values.wants_horizontal_grad()) {
    EDSC_UNROLL
    for (int j = 0; j < kKernelW; ++j) values.store_horizontal_grad(j, static_cast<param_t>(grad_h[j]));
  }
}

// Blocks a multiprocessor the tiled backward's register budget is made for (__launch_bounds__): the generic
// kernels', and the lean exact-RGB one's (deform_sepconv_backward_rgb_pixel), which needs fewer registers.
constexpr int kTileMinBlocks = 2;
constexpr int kLeanRgbTileMinBlocks = 3;

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

// A tile adder over shared memory `tile` for the footprint rows x cols from input row row0, column
// col0; adds outside it go to `fallback`.
template <typename TileAdd, typename word_t, typename index_t, typename GlobalAdd>
__device__ void place_tile(TileAdd& add, word_t* tile, index_t row0, index_t col0, index_t rows, index_t cols,
                           const GlobalAdd& fallback) {
  add.tile = tile;
  add.row0 = row0;
  add.col0 = col0;
  add.rows = rows;
  add.cols = cols;
  add.fallback = fallback;
}

// A fixed-point tile's scale from the block's bound on the summed magnitude of its contributions
// (input_grad_bound's sum over the block's pixels) times the padding mode's bound_factor (a doubled
// border weighs a sample up to 2 an axis); returns whether the tile is used (finite, not vanishingly
// small: else every add goes to the fallback).
template <typename index_t, typename GlobalAdd, int kWords>
__device__ bool set_fixed_point_scale(float pixels_bound, const PaddingTraits& padding,
                                      FixedPointTileAdd<index_t, GlobalAdd, kWords>& add) {
  constexpr int kBits = FixedPointTileAdd<index_t, GlobalAdd, kWords>::kBits;
  const float bound = pixels_bound * static_cast<float>(padding.bound_factor);
  int exponent = 0;
  frexpf(bound, &exponent);  // bound < 2^exponent
  // Finite, and not so small that 2^(kBits - exponent) overflows float.
  const bool use_tile = bound == 0.0f || (bound - bound == 0.0f && exponent > kBits - 126);
  add.scale = bound == 0.0f ? 1.0f : ldexpf(1.0f, kBits - exponent);
  add.inv_scale = bound == 0.0f ? 1.0f : ldexpf(1.0f, exponent - kBits);
  add.enabled = use_tile;
  return use_tile;
}

// Flush of a tile's pass: one global add per touched footprint element inside the image (neighbouring
// tiles overlap; elements outside it may hold adds of corners that carry no gradient). Consecutive
// threads take consecutive addresses: x fastest in NCHW, the channel fastest in channels_last.
template <bool kChannelsLast, int kThreads, typename TileAdd, typename index_t>
__device__ void flush_tile(const TileAdd& add, index_t pass_channels, index_t height, index_t width, int tid) {
  const index_t footprint = add.rows * add.cols;
  const index_t tile_elems = pass_channels * footprint;
  for (index_t k = tid; k < tile_elems; k += kThreads) {
    const index_t e = kChannelsLast ? (k % pass_channels) * footprint + k / pass_channels : k;
    const index_t row = add.row0 + (e / add.cols) % add.rows;
    const index_t col = add.col0 + e % add.cols;
    if (row < 0 || row >= height || col < 0 || col >= width) continue;
    const auto v = add.element(e);
    if (v != decltype(v)(0)) add.fallback(add.c0 + e / footprint, row, col, v);
  }
}

// GlobalAdd: GlobalAtomicAdd, or FixedPointAtomicAdd when deterministic (float32 and the half
// types only, whose tile is fixed point and so order-independent). kWarpStaged (channels_last, 5x5,
// fixed point): each warp, a row of the tile, stages its per-pixel values through shared memory
// (warp_staged_values.cuh); its static shared memory is warp_staged_static_bytes (the planner's). kExactBlock: the call
// has exactly kChannelBlock channels and the tile holds them all (one pass); knowing that at compile time removes the
// channel loops' branches. kPaddingMode (exact RGB in NCHW, a fixed-point tile): the call's padding mode compiled in,
// each pixel through deform_sepconv_backward_rgb_pixel; or kRuntimePaddingMode.
template <int kChannelBlock, int kKernelH, int kKernelW, int kMaxWidth, bool kChannelsLast, bool kWarpStaged,
          bool kExactBlock, typename scalar_t, typename index_t, typename GlobalAdd, typename param_t,
          int64_t kPaddingMode = kRuntimePaddingMode>
__global__ void __launch_bounds__(kTileThreads,
                                  kPaddingMode == kRuntimePaddingMode ? kTileMinBlocks : kLeanRgbTileMinBlocks)
    deform_sepconv_backward_tiled_cuda_kernel(const DeformSepconvParams<scalar_t, index_t, param_t> params,
                                              const scalar_t* __restrict__ grad_output,
                                              const DeformSepconvParamGrads<param_t> param_grads,
                                              const GlobalAdd input_grad, index_t rows, index_t cols,
                                              index_t pass_capacity, bool prefetch) {
  decltype(auto) p = with_exact_block<kExactBlock, kChannelBlock>(params);
  const index_t channels_per_pass = kExactBlock ? index_t(kChannelBlock) : pass_capacity;
  using acc_t = opmath_t<scalar_t>;
  constexpr bool kFixedPoint = std::is_same_v<acc_t, float>;
  EDSC_EXTERN_SHARED(unsigned char, shared_raw);
  __shared__ float bound_scratch[kTileThreads / 32];
  using StagedBuffers = WarpStagedBuffers<scalar_t, kWarpStagedKernel>;
  static_assert(sizeof(StagedBuffers) * kTileH + sizeof(bound_scratch) == warp_staged_static_bytes(sizeof(scalar_t)),
                "the planner's warp_staged_static_bytes must be this kernel's static shared memory");
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

  static_assert(kPaddingMode == kRuntimePaddingMode ||
                    (kExactBlock && kChannelBlock == 3 && !kChannelsLast && !kWarpStaged && kFixedPoint),
                "the padding mode compiled in: exact RGB, NCHW, the fixed-point tile");
  constexpr int kWords = kFixedPoint ? fixed_point_tile_words(sizeof(scalar_t)) : 1;
  using TileAdd = std::conditional_t<kFixedPoint, FixedPointTileAdd<index_t, GlobalAdd, kWords>,
                                     FloatTileAdd<acc_t, index_t, GlobalAdd>>;
  using word_t = std::conditional_t<kFixedPoint, int, acc_t>;
  word_t* tile = reinterpret_cast<word_t*>(shared_raw);
  TileAdd add{};
  place_tile(add, tile, tile_y * kTileH - p.pad_h - kTileMargin, tile_x * kTileW - p.pad_w - kTileMargin, rows, cols,
             input_grad.at_batch(n));
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
    use_tile = set_fixed_point_scale(block_sum(part, bound_scratch), p.padding, add);
  }

  for (index_t c0 = 0; c0 < p.channels; c0 += channels_per_pass) {
    const index_t pass_channels = min(channels_per_pass, p.channels - c0);
    if (use_tile) {
      for (index_t e = tid; e < words_per_plane * kWords; e += kTileThreads) tile[e] = word_t(0);
    }
    __syncthreads();
    add.c0 = c0;
    // The parameter gradients need all channels once: on the first pass only.
    const DeformSepconvParamGrads<param_t> pass_grads =
        c0 == 0 ? param_grads : DeformSepconvParamGrads<param_t>{nullptr, nullptr, nullptr, nullptr};
    if constexpr (kWarpStaged) {
      if (c0 > 0) values.restart_without_grads();
      deform_sepconv_backward_pixel_with<kChannelBlock, kKernelH, kKernelW, kMaxWidth, kChannelsLast, scalar_t, acc_t>(
          p, values, grad_output, add, c0, c0 + pass_channels, n, y_in, x_in);
      values.finish();
    } else if (active) {
      if constexpr (kPaddingMode != kRuntimePaddingMode) {
        const GlobalPixelValues<false, scalar_t, index_t, param_t> pixel_values(p, n, y * p.width_out + x, kKernelH,
                                                                                kKernelW, pass_grads);
        deform_sepconv_backward_rgb_pixel<kPaddingMode, kChannelBlock, kKernelH, kKernelW>(
            p, pixel_values, planar_frame<kChannelBlock, false>(p, n), grad_output, add, n, y, x);
      } else {
        deform_sepconv_backward_pixel<kChannelBlock, kKernelH, kKernelW, kMaxWidth, kChannelsLast, scalar_t, acc_t,
                                      index_t>(p, grad_output, pass_grads, add, c0, c0 + pass_channels, n, y, x);
      }
    }
    __syncthreads();
    if (use_tile) flush_tile<kChannelsLast, kTileThreads>(add, pass_channels, p.height_in, p.width_in, tid);
    __syncthreads();
  }
}

// Backward of the channel lanes through a fixed-point tile (channels_last, float32 and the half
// types): the channel lanes' mapping of threads (2^lanes_log2 adjacent threads a pixel, each with
// blocks of kBlock channels), the tiled kernel's input gradient. A block of kTileThreads threads takes
// kTileH rows of (kWarpSize >> lanes_log2) output pixels, a warp a row; the input-gradient adds of its
// pixels go to shared memory over the tile's footprint (FixedPointTileAdd, channel planes of rows x
// cols), in passes of pass_capacity channels (whole blocks), each flushed to global memory once, the
// channel fastest: one global add per footprint element and channel, where the channel lanes make one
// a tap, corner and channel. Adds outside the footprint go to the global adder (GlobalAdd:
// GlobalAtomicAdd, or FixedPointAtomicAdd when deterministic). The per-pixel gradients come with the
// first pass. Lanes of pixels past the end compute a real pixel's values (the shuffles need every lane)
// and add and store nothing.
template <int kBlock, int kKernelH, int kKernelW, int kMaxWidth, typename scalar_t, typename GlobalAdd,
          typename param_t>
__global__ void __launch_bounds__(kTileThreads)
    deform_sepconv_backward_lane_tile_cuda_kernel(const DeformSepconvParams<scalar_t, int32_t, param_t> p,
                                                  const scalar_t* __restrict__ grad_output,
                                                  const DeformSepconvParamGrads<param_t> param_grads,
                                                  const GlobalAdd input_grad, int32_t rows, int32_t cols,
                                                  int32_t pass_capacity, int lanes_log2) {
  using index_t = int32_t;
  using acc_t = opmath_t<scalar_t>;
  static_assert(std::is_same_v<acc_t, float>, "the fixed-point tile holds float32 sums");
  EDSC_EXTERN_SHARED(int, tile);
  __shared__ float bound_scratch[kTileThreads / 32];
  static_assert(sizeof(bound_scratch) == kLaneTileStaticBytes, "the planner's kLaneTileStaticBytes");

  const int tid = threadIdx.x;
  const int lanes = 1 << lanes_log2;
  const int lane = tid & (lanes - 1);
  const index_t tile_w = kWarpSize >> lanes_log2;
  const index_t tiles_x = (p.width_out + tile_w - 1) / tile_w;
  const index_t tiles_y = (p.height_out + kTileH - 1) / kTileH;
  const index_t tile_x = static_cast<index_t>(blockIdx.x % tiles_x);
  const index_t tile_y = static_cast<index_t>((blockIdx.x / tiles_x) % tiles_y);
  const index_t n = static_cast<index_t>(blockIdx.x / (int64_t(tiles_x) * tiles_y));
  const index_t slot = tid >> lanes_log2;  // the pixel's place in the tile
  const index_t y = tile_y * kTileH + slot / tile_w;
  const index_t x = tile_x * tile_w + slot % tile_w;
  const bool active = y < p.height_out && x < p.width_out;
  const index_t y_in = min(y, p.height_out - 1), x_in = min(x, p.width_out - 1);
  const index_t pixel = y_in * p.width_out + x_in;
  const index_t KH = kernel_extent<kKernelH>(p.kernel_h), KW = kernel_extent<kKernelW>(p.kernel_w);

  constexpr int kWords = fixed_point_tile_words(sizeof(scalar_t));
  FixedPointTileAdd<index_t, GlobalAdd, kWords> add{};
  place_tile(add, tile, tile_y * kTileH - p.pad_h - kTileMargin, tile_x * tile_w - p.pad_w - kTileMargin, rows, cols,
             input_grad.at_batch(n));
  const index_t words_per_plane = pass_capacity * rows * cols;
  add.lo_offset = words_per_plane;
  // The bound over the block's pixels, each counted once (by its lane 0).
  const float part =
      active && lane == 0 ? input_grad_bound<kKernelH, kKernelW, true>(p, grad_output, n, y_in, x_in) : 0.0f;
  const bool use_tile = set_fixed_point_scale(block_sum(part, bound_scratch), p.padding, add);

  for (index_t c0 = 0; c0 < p.channels; c0 += pass_capacity) {
    const index_t pass_channels = min(pass_capacity, p.channels - c0);
    if (use_tile) {
      for (index_t e = tid; e < kWords * words_per_plane; e += kTileThreads) tile[e] = 0;
    }
    __syncthreads();
    add.c0 = c0;
    // The parameter gradients need every channel once: on the first pass only.
    const DeformSepconvParamGrads<param_t> pass_grads =
        c0 == 0 ? param_grads : DeformSepconvParamGrads<param_t>{nullptr, nullptr, nullptr, nullptr, nullptr};
    ChannelLanePixelValues<kBlock, scalar_t, index_t, param_t> values(p, n, pixel, KH, KW, pass_grads, lane, lanes,
                                                                      active);
    deform_sepconv_backward_pixel_with<kBlock, kKernelH, kKernelW, kMaxWidth, true, scalar_t, acc_t>(
        p, values, grad_output, add, c0, active ? c0 + pass_channels : c0, n, y_in, x_in);
    __syncthreads();
    if (use_tile) flush_tile<true, kTileThreads>(add, pass_channels, p.height_in, p.width_in, tid);
    __syncthreads();
  }
}

}  // namespace
}  // namespace edsc_ext
