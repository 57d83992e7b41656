// How the CUDA backward adds input-gradient contributions: straight into global memory (float
// atomics, or 64-bit fixed-point integers when deterministic), or into a tile's shared-memory
// footprint (float64 atomics, or fixed point for float32 and the half types) that is
// flushed to global memory once. Each adder has the interface scatter_corners (sampling.h) takes.
#pragma once

#include "deform_sepconv_cuda.cuh"

namespace edsc_ext {
namespace {

// Where input-gradient element (n, c, y, x) lives, in the call's memory format.
template <typename index_t>
struct InputGradLayout {
  using index_type = index_t;
  index_t channels, height, width, channel_stride, pixel_stride;
  __host__ __device__ index_t batch_offset(index_t n) const { return n * channels * height * width; }
  __host__ __device__ index_t offset(index_t c, index_t y, index_t x) const {
    return c * channel_stride + (y * width + x) * pixel_stride;
  }
};

template <bool kChannelsLast, typename scalar_t, typename index_t, typename param_t>
InputGradLayout<index_t> input_grad_layout(const DeformSepconvParams<scalar_t, index_t, param_t>& p) {
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
#if defined(__CUDA_ARCH__) || defined(EDSC_CUDA_EMULATION)  // device code, or tests/cuda_emulation
    atomicAdd(grad + layout.offset(c, y, x), v);
#endif
  }
};

// scatter_corner_block (sampling.h) for global float atomics, where the device has vector atomics
// (sm_90 and later): each corner's block of adjacent channels (channels_last) with float4 atomics,
// a quarter of the atomic instructions. The caller (the channel lanes) guarantees the block is a
// multiple of 4 channels and 16-byte aligned.
template <int kCount, typename index_t>
__device__ void scatter_corner_block(const BilinearSample<float, index_t>& s, const float (&value)[kCount], index_t c0,
                                     GlobalAtomicAdd<float, index_t>& add) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && __CUDACC_VER_MAJOR__ >= 12
  static_assert(kCount % 4 == 0, "float4 atomics take whole groups of 4 channels");
  const float ly = s.y.frac, lx = s.x.frac;
  const auto corner = [&](bool inside, index_t y, index_t x, float weight) {
    if (!inside) return;
    float4* at = reinterpret_cast<float4*>(add.grad + add.layout.offset(c0, y, x));
    EDSC_UNROLL
    for (int k = 0; k < kCount; k += 4) {
      atomicAdd(at + k / 4,
                make_float4(value[k] * weight, value[k + 1] * weight, value[k + 2] * weight, value[k + 3] * weight));
    }
  };
  corner(s.y.lo_in && s.x.lo_in, s.y.lo, s.x.lo, (1.0f - ly) * (1.0f - lx));
  corner(s.y.lo_in && s.x.hi_in, s.y.lo, s.x.lo + 1, (1.0f - ly) * lx);
  corner(s.y.hi_in && s.x.lo_in, s.y.lo + 1, s.x.lo, ly * (1.0f - lx));
  corner(s.y.hi_in && s.x.hi_in, s.y.lo + 1, s.x.lo + 1, ly * lx);
#else
  scatter_corner_block<kCount, float, index_t, GlobalAtomicAdd<float, index_t> >(s, value, c0, add);
#endif
}

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
#if defined(__CUDA_ARCH__) || defined(EDSC_CUDA_EMULATION)  // device code, or tests/cuda_emulation
    const double scaled = static_cast<double>(v) * *scale;
    if (!(fabs(scaled) <= 4.6e18)) {  // also false for NaN
      atomicOr(poisoned, 1);
      return;
    }
    atomicAdd(grad + layout.offset(c, y, x), static_cast<unsigned long long>(static_cast<long long>(llrint(scaled))));
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
// first bounds the total magnitude S of all its input-gradient contributions (input_grad_bound over
// its pixels, times the padding mode's bound_factor: a doubled border counts a sample up to 4 times);
// every add is then v' = v * 2^kBits / S (a power of two, so exact), rounded to an integer and added
// with native shared-memory integer atomics, so the sum does not depend on the order of the adds and
// the tile is deterministic too. float32 (kWords 2, kBits 37): v' split into two int32 words,
// hi = round(v' / 2^16) and lo = v' - hi * 2^16; with |v'| summing to < 2^37 and at most 2^16 adds an
// element neither word overflows, and the quantum, 2^-37 S, is finer than what float32 atomics lose.
// The half types (kWords 1, kBits 30): one word, round(v'), half the atomics and none of the split;
// |v'| sums to < 2^30 and the roundings of at most 2^16 adds to 2^15, so the word cannot overflow. An
// element of n adds is off by at most n * 2^-31 S, below the rounding of its 8 (bfloat16) or 11
// (float16) significand bits down to |v| ~ n * 2^-22 S or n * 2^-19 S (a tile's typical element is
// ~S / 400; the edsc mode's factor 4 costs two of those bits). A tile whose bound is not finite (NaN
// or inf data) or vanishingly small is disabled: its adds all go to `fallback`.
constexpr int kFixedPointBits = 37;
constexpr int kFixedPointOneWordBits = 30;
// (kFixedPointMaxTaps, cuda_plan.h, keeps the adds per element within 2^16.)

template <typename index_t, typename GlobalAdd, int kTileWords>
struct FixedPointTileAdd {
  static_assert(kTileWords == 1 || kTileWords == 2, "one or two int32 words an element");
  static constexpr int kWords = kTileWords;
  static constexpr int kBits = kWords == 2 ? kFixedPointBits : kFixedPointOneWordBits;
  int* tile;  // the (hi) words; with two words the lo words follow at + lo_offset (two planes, so a
              // warp's adds to consecutive elements hit consecutive banks)
  index_t lo_offset;
  index_t row0, col0, rows, cols, c0;
  float scale, inv_scale;
  bool enabled;
  GlobalAdd fallback;
  __device__ int* element_at(index_t c, index_t r, index_t q) const { return tile + ((c - c0) * rows + r) * cols + q; }
  __device__ void add_at(int* element, float v) const { add_scaled_at(element, v * scale); }
  // The same for v already multiplied by `scale`.
  __device__ void add_scaled_at(int* element, float scaled) const {
    if constexpr (kWords == 1) {
      atomicAdd(element, __float2int_rn(scaled));
    } else {
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
    if constexpr (kWords == 1) {
      return static_cast<float>(tile[e]) * inv_scale;
    } else {
      return fmaf(static_cast<float>(tile[e]), 65536.0f, static_cast<float>(tile[lo_offset + e])) * inv_scale;
    }
  }
};

// scatter_corners for the fixed-point tile (more specialised than the generic one in sampling.h,
// so the backward picks it): when all four corners fall inside the footprint, one address and four
// unconditional adds. Corners outside the image are added too, to footprint elements the flush
// skips, which saves a check per corner.
template <typename index_t, typename GlobalAdd, int kWords>
__device__ void scatter_corners(const BilinearSample<float, index_t>& s, float value, index_t c,
                                FixedPointTileAdd<index_t, GlobalAdd, kWords>& add) {
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

// The rare path out of line: taps whose corners leave the footprint (the kernel's code then fits the
// instruction cache).
template <int kCount, typename index_t, typename GlobalAdd, int kWords>
__device__ __noinline__ void scatter_corner_block_outside(const BilinearSample<float, index_t> s,
                                                          const float (&value)[kCount], index_t c0,
                                                          const FixedPointTileAdd<index_t, GlobalAdd, kWords> add) {
  scatter_corner_block<kCount, float, index_t, const FixedPointTileAdd<index_t, GlobalAdd, kWords> >(s, value, c0, add);
}

// scatter_corner_block for the fixed-point tile (the channel lanes' tile): when all four corners fall
// inside the footprint, their four elements are found once and each channel of the block adds to the
// same four elements of its own plane. As scatter_corners above, corners outside the image are added
// too, to footprint elements the flush skips.
template <int kCount, typename index_t, typename GlobalAdd, int kWords>
__device__ void scatter_corner_block(const BilinearSample<float, index_t>& s, const float (&value)[kCount], index_t c0,
                                     FixedPointTileAdd<index_t, GlobalAdd, kWords>& add) {
  const index_t r = s.y.lo - add.row0, q = s.x.lo - add.col0;
  if (!(add.enabled && r >= 0 && r + 1 < add.rows && q >= 0 && q + 1 < add.cols)) {
    scatter_corner_block_outside(s, value, c0, add);
    return;
  }
  const float ly = s.y.frac, lx = s.x.frac;
  const float w00 = (1.0f - ly) * (1.0f - lx), w01 = (1.0f - ly) * lx, w10 = ly * (1.0f - lx), w11 = ly * lx;
  const index_t plane = add.rows * add.cols;
  int* element = add.element_at(c0, r, q);
  EDSC_UNROLL
  for (int k = 0; k < kCount; ++k) {
    add.add_at(element, value[k] * w00);
    add.add_at(element + 1, value[k] * w01);
    add.add_at(element + add.cols, value[k] * w10);
    add.add_at(element + add.cols + 1, value[k] * w11);
    element += plane;
  }
}

}  // namespace
}  // namespace edsc_ext
