// The math of deform_sepconv, host+device inline code that the CPU and CUDA kernels share: the
// sampling (tap positions, the padding modes' traits from edsc_ext/spec.h, bilinear weights and their
// derivatives), then the per-output-pixel forward and fused backward. Each backend only decides which
// pixels a thread owns and how input-gradient adds are made (plain adds on a plane owned by one CPU
// task, atomics on the GPU).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "edsc_ext/spec.h"  // PaddingTraits, kMaxKernelWidth

#if defined(__CUDACC__) || defined(__HIPCC__)
#define EDSC_HOST_DEVICE __host__ __device__ __forceinline__
#define EDSC_UNROLL _Pragma("unroll")
#define EDSC_NO_UNROLL _Pragma("unroll 1")
#else
// Forced inline on the host too: the CPU backend compiles its loops for several instruction sets
// (src/cpu/cpu_loops.h) and this code must be compiled inside each of them.
#if defined(__GNUC__) || defined(__clang__)
#define EDSC_HOST_DEVICE inline __attribute__((always_inline))
#else
#define EDSC_HOST_DEVICE inline
#endif
#define EDSC_UNROLL
#define EDSC_NO_UNROLL
#endif

namespace edsc_ext {

template <typename acc_t>
EDSC_HOST_DEVICE bool is_finite(acc_t v) {
  // v - v is 0 for finite v and NaN for +-inf and NaN; works for float and double on host and
  // device without relying on std::isfinite under fast-math.
  return (v - v) == (v - v);
}

EDSC_HOST_DEVICE float floor_value(float v) { return floorf(v); }
EDSC_HOST_DEVICE double floor_value(double v) { return floor(v); }

template <typename acc_t>
EDSC_HOST_DEVICE acc_t clamp_value(acc_t v, acc_t lo, acc_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// v clamped to [lo, hi], NaN to lo (fmax and fmin return the operand that is not NaN).
EDSC_HOST_DEVICE float clamp_nan_to_low(float v, float lo, float hi) { return fminf(fmaxf(v, lo), hi); }
EDSC_HOST_DEVICE double clamp_nan_to_low(double v, double lo, double hi) { return fmin(fmax(v, lo), hi); }

// One coordinate axis of a bilinear sample: the lower corner index, the fractional weight of the
// upper corner, which of the two corners lie inside the image, and d(coordinate)/d(offset).
template <typename acc_t, typename index_t>
struct AxisSample {
  index_t lo;    // floor(coordinate); meaningful only where lo_in / hi_in
  acc_t frac;    // coordinate - lo, the weight of corner lo + 1
  bool lo_in;    // 0 <= lo < size
  bool hi_in;    // 0 <= lo + 1 < size
  acc_t dcoord;  // 1, or 0 where a clamping mode clamped the coordinate
  acc_t scale;   // 2 where a doubled border counts the border pixel twice, else 1
};

// Resolves a finite coordinate along an axis of length `size` under a padding mode's traits.
// Not clamping (zeros): the coordinate is first clamped to [-2, size + 1], which leaves every corner
// of a far-away sample outside (value 0, gradient 0) and keeps floor() inside index_t for any finite
// input, 1e30 included. Clamping (border, edsc): clamped to [0, size - 1]; like grid_sample, the
// exact borders count as clamped, so the offset gradient is 0 there. A doubled border (edsc): scale
// 2 where the coordinate lies before -frame_pad or at or past size - 1 + frame_pad, i.e. outside
// [0, padded size - 1) of the frame padded by frame_pad (the EDSC layer clamps there and adds both
// bilinear corners, the same border pixel, at weight 1).
// The traits by value: through a reference into the kernel parameters the CUDA pixel forward's code
// came out longer and slower (BENCHMARKS.md, "The padding traits by value").
template <typename acc_t, typename index_t>
EDSC_HOST_DEVICE AxisSample<acc_t, index_t> sample_axis(acc_t coord, index_t size, const PaddingTraits padding,
                                                        index_t frame_pad = 0) {
  AxisSample<acc_t, index_t> s;
  s.dcoord = acc_t(1);
  s.scale = acc_t(1);
  if (padding.clamps) {
    const acc_t hi = static_cast<acc_t>(size - 1);
    if (coord <= acc_t(0) || coord >= hi) {
      // The doubling lies inside the clamped range (frame_pad >= 0), so samples inside the image,
      // most of them, pay nothing for it.
      if (padding.doubles_border &&
          (coord < static_cast<acc_t>(-frame_pad) || coord >= static_cast<acc_t>(size - 1 + frame_pad))) {
        s.scale = acc_t(2);
      }
      coord = coord <= acc_t(0) ? acc_t(0) : hi;
      s.dcoord = acc_t(0);
    }
  } else {
    coord = clamp_value(coord, acc_t(-2), static_cast<acc_t>(size + 1));
  }
  const acc_t fl = floor_value(coord);
  s.lo = static_cast<index_t>(fl);
  s.frac = coord - fl;
  s.lo_in = s.lo >= 0 && s.lo < size;
  s.hi_in = s.lo + 1 >= 0 && s.lo + 1 < size;
  return s;
}

// A tap without offset sits on the pixel grid: its coordinate along an axis of length `size` is
// an integer, and its sample is that one pixel (fraction 0: the upper corner's weight is 0). Returns
// whether the pixel is read, with `coord` the pixel's index: false outside the image where the mode
// does not clamp (the sample is 0); a clamping mode clamps into the image, as sample_axis does.
// (Only modes with the grid_taps trait reach the grid-tap kernels: takes_grid_taps.)
template <typename index_t>
EDSC_HOST_DEVICE bool grid_tap_pixel(index_t& coord, index_t size, const PaddingTraits& padding) {
  if (padding.clamps) {
    coord = coord < 0 ? index_t(0) : (coord > size - 1 ? size - 1 : coord);
    return true;
  }
  return coord >= 0 && coord < size;
}

// A bilinear sample of one input plane at (py, px): the four corners' flat offsets within the
// plane, validity, and the fractional weights. Pixels of a plane are `pixel_stride` elements apart:
// 1 in NCHW-contiguous memory, C in channels_last.
template <typename acc_t, typename index_t>
struct BilinearSample {
  AxisSample<acc_t, index_t> y, x;
  index_t row_stride, pixel_stride;
  bool finite;  // false for a non-finite position: the sample is NaN and touches no memory

  EDSC_HOST_DEVICE index_t offset_of(index_t dy, index_t dx) const {
    return (y.lo + dy) * row_stride + (x.lo + dx) * pixel_stride;
  }
  // The factor of the bilinear value (and of its derivatives): 1 but where a border is doubled.
  EDSC_HOST_DEVICE acc_t weight_scale() const { return y.scale * x.scale; }
};

template <typename acc_t, typename index_t>
EDSC_HOST_DEVICE BilinearSample<acc_t, index_t> make_bilinear_sample(acc_t py, acc_t px, index_t height, index_t width,
                                                                     const PaddingTraits& padding, index_t pixel_stride,
                                                                     index_t frame_pad_h = 0, index_t frame_pad_w = 0) {
  BilinearSample<acc_t, index_t> s;
  s.row_stride = width * pixel_stride;
  s.pixel_stride = pixel_stride;
  s.finite = is_finite(py) && is_finite(px);
  if (!s.finite) {
    py = acc_t(0);
    px = acc_t(0);
  }
  s.y = sample_axis<acc_t, index_t>(py, height, padding, frame_pad_h);
  s.x = sample_axis<acc_t, index_t>(px, width, padding, frame_pad_w);
  return s;
}

// The four corner values of a sample (0 outside the image).
template <typename acc_t>
struct Corners {
  acc_t v00, v01, v10, v11;  // v<dy><dx>
};

// `plane` points at input[n, c, 0, 0].
template <typename acc_t, typename scalar_t, typename index_t>
EDSC_HOST_DEVICE Corners<acc_t> load_corners(const BilinearSample<acc_t, index_t>& s, const scalar_t* plane) {
  Corners<acc_t> c;
  c.v00 = (s.y.lo_in && s.x.lo_in) ? static_cast<acc_t>(plane[s.offset_of(0, 0)]) : acc_t(0);
  c.v01 = (s.y.lo_in && s.x.hi_in) ? static_cast<acc_t>(plane[s.offset_of(0, 1)]) : acc_t(0);
  c.v10 = (s.y.hi_in && s.x.lo_in) ? static_cast<acc_t>(plane[s.offset_of(1, 0)]) : acc_t(0);
  c.v11 = (s.y.hi_in && s.x.hi_in) ? static_cast<acc_t>(plane[s.offset_of(1, 1)]) : acc_t(0);
  return c;
}

template <typename acc_t, typename index_t>
EDSC_HOST_DEVICE acc_t interpolate(const BilinearSample<acc_t, index_t>& s, const Corners<acc_t>& c) {
  const acc_t ly = s.y.frac, lx = s.x.frac;
  const acc_t top = c.v00 + lx * (c.v01 - c.v00);
  const acc_t bottom = c.v10 + lx * (c.v11 - c.v10);
  return top + ly * (bottom - top);
}

// dS/d(ly) and dS/d(lx) of the bilinear formula (before the border-clamp factor dcoord).
template <typename acc_t, typename index_t>
EDSC_HOST_DEVICE acc_t interpolate_dy(const BilinearSample<acc_t, index_t>& s, const Corners<acc_t>& c) {
  const acc_t lx = s.x.frac;
  return (c.v10 - c.v00) + lx * ((c.v11 - c.v01) - (c.v10 - c.v00));
}

template <typename acc_t, typename index_t>
EDSC_HOST_DEVICE acc_t interpolate_dx(const BilinearSample<acc_t, index_t>& s, const Corners<acc_t>& c) {
  const acc_t ly = s.y.frac;
  return (c.v01 - c.v00) + ly * ((c.v11 - c.v10) - (c.v01 - c.v00));
}

// Scatters `value` (= dL/dS) to the four corners of the sample with the bilinear weights, as
// add(c, row, column, weighted value); only corners inside the image are passed.
template <typename acc_t, typename index_t, typename Add>
EDSC_HOST_DEVICE void scatter_each_corner(const BilinearSample<acc_t, index_t>& s, acc_t value, index_t c, Add& add) {
  const acc_t ly = s.y.frac, lx = s.x.frac;
  const index_t y0 = s.y.lo, x0 = s.x.lo;
  if (s.y.lo_in && s.x.lo_in) add(c, y0, x0, value * (acc_t(1) - ly) * (acc_t(1) - lx));
  if (s.y.lo_in && s.x.hi_in) add(c, y0, x0 + 1, value * (acc_t(1) - ly) * lx);
  if (s.y.hi_in && s.x.lo_in) add(c, y0 + 1, x0, value * ly * (acc_t(1) - lx));
  if (s.y.hi_in && s.x.hi_in) add(c, y0 + 1, x0 + 1, value * ly * lx);
}

// What the backward calls: a backend may overload it for its adder type (the CUDA fixed-point
// tile adds all four corners at once).
template <typename acc_t, typename index_t, typename Add>
EDSC_HOST_DEVICE void scatter_corners(const BilinearSample<acc_t, index_t>& s, acc_t value, index_t c, Add& add) {
  scatter_each_corner(s, value, c, add);
}

// The same for a block of kCount adjacent channels c0 .. c0 + kCount - 1, value[k] = dL/dS of
// channel c0 + k: each corner's weight once for the block. A backend may overload it too (the CUDA
// global float atomics add a corner's block with vector atomics where the device has them).
template <int kCount, typename acc_t, typename index_t, typename Add>
EDSC_HOST_DEVICE void scatter_corner_block(const BilinearSample<acc_t, index_t>& s, const acc_t (&value)[kCount],
                                           index_t c0, Add& add) {
  const acc_t ly = s.y.frac, lx = s.x.frac;
  const index_t y0 = s.y.lo, x0 = s.x.lo;
  const auto corner = [&](bool inside, index_t y, index_t x, acc_t weight) {
    if (!inside) return;
    EDSC_UNROLL
    for (int k = 0; k < kCount; ++k) add(c0 + k, y, x, value[k] * weight);
  };
  corner(s.y.lo_in && s.x.lo_in, y0, x0, (acc_t(1) - ly) * (acc_t(1) - lx));
  corner(s.y.lo_in && s.x.hi_in, y0, x0 + 1, (acc_t(1) - ly) * lx);
  corner(s.y.hi_in && s.x.lo_in, y0 + 1, x0, ly * (acc_t(1) - lx));
  corner(s.y.hi_in && s.x.hi_in, y0 + 1, x0 + 1, ly * lx);
}

// ---- The per-output-pixel work of the forward and the backward

// Where one per-pixel tensor's values are: (n, k, y, x) at n * batch + (y * W + x) * pixel + k *
// (channel stride: H * W in NCHW, 1 in channels_last). Dense tensors have batch = K * H * W and
// pixel = 1 (NCHW) or K (channels_last); views read in place (CallFacts::dense_per_pixel)
// others, e.g. a channel slice of a wider channels_last tensor has pixel = its width in channels.
template <typename index_t>
struct PerPixelStrides {
  index_t batch, pixel;
};

// Raw pointers and sizes of one call. Absent optional tensors are nullptr: the kernels then skip
// their loads and multiplies rather than reading a tensor of ones or zeros. Every 4-D tensor of a
// call (gradients and output included) has one memory layout: NCHW-contiguous, or channels_last
// (NHWC) when the input is, so that channels_last training code pays no layout copies.
// scalar_t is the frame's (input, output, their gradients) dtype, param_t the per-pixel tensors'
// (and their gradients'): the same, or float16 / bfloat16 with a float32 frame (mixed precision,
// as autocast makes them), read as they are and accumulated in acc_t.
template <typename scalar_t, typename index_t, typename param_t = scalar_t>
struct DeformSepconvParams {
  using param_type = param_t;
  const scalar_t* input;      // (N, C, H_in, W_in)
  const param_t* vertical;    // (N, KH, H_out, W_out) or nullptr
  const param_t* horizontal;  // (N, KW, H_out, W_out) or nullptr
  // (N, 2*KH*KW, H_out, W_out), (dy, dx) per tap; or, where offset_dx is given (split offsets),
  // (N, KH*KW, H_out, W_out) holding dy only; nullptr without offsets.
  const param_t* offset;
  const param_t* offset_dx;  // split offsets: (N, KH*KW, H_out, W_out), dx; else nullptr
  const param_t* mask;       // (N, KH*KW, H_out, W_out) or nullptr
  // Their strides (0 for an absent tensor); only GlobalPixelValues<..., kStrided = true> reads
  // them, the other kernels take dense tensors.
  PerPixelStrides<index_t> vertical_strides, horizontal_strides, offset_strides, offset_dx_strides, mask_strides;
  index_t batch, channels, height_in, width_in, height_out, width_out;
  // pad_h/pad_w: where tap 0 sits, y - pad_h (the call's padding, less the mode's tap_shift);
  // frame_pad_h/w: the call's padding, beyond which a doubled border counts border pixels twice.
  index_t kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, frame_pad_h, frame_pad_w;
  PaddingTraits padding;  // the call's padding mode (edsc_ext/spec.h)

  EDSC_HOST_DEVICE bool split_offsets() const { return offset_dx != nullptr; }
};

// The kernels take the layout as a compile-time kChannelsLast (the hosts dispatch on
// CallFacts::channels_last), so NCHW code pays nothing for channels_last support (as a
// run-time value it cost 16 registers and 15% more instructions).
// From channel k to k + 1 of one pixel of a (N, K, H, W) tensor, `pixels` = H * W.
template <bool kChannelsLast, typename index_t>
EDSC_HOST_DEVICE index_t channel_stride(index_t pixels) {
  return kChannelsLast ? index_t(1) : pixels;
}

// input[n, c, y, x] is at n * C * H_in * W_in + c * input_channel_stride + (y * W_in + x) *
// input_pixel_stride.
template <bool kChannelsLast, typename scalar_t, typename index_t, typename param_t>
EDSC_HOST_DEVICE index_t input_channel_stride(const DeformSepconvParams<scalar_t, index_t, param_t>& p) {
  return channel_stride<kChannelsLast>(p.height_in * p.width_in);
}
template <bool kChannelsLast, typename scalar_t, typename index_t, typename param_t>
EDSC_HOST_DEVICE index_t input_pixel_stride(const DeformSepconvParams<scalar_t, index_t, param_t>& p) {
  return kChannelsLast ? p.channels : index_t(1);
}

// Gradient outputs of the per-pixel tensors; nullptr where not requested.
template <typename scalar_t>
struct DeformSepconvParamGrads {
  scalar_t* vertical;
  scalar_t* horizontal;
  scalar_t* offset;  // in the layout of DeformSepconvParams::offset
  scalar_t* mask;
  scalar_t* offset_dx;  // split offsets: the dx gradient (written together with offset's)

  EDSC_HOST_DEVICE bool any() const { return vertical || horizontal || offset || mask; }
};

// Where one pixel's channels of a (N, K, H, W) tensor live: (n, k, y, x) is at base + k * stride.
template <typename index_t>
struct PixelView {
  index_t base;    // element (n, 0, y, x)
  index_t stride;  // H * W in NCHW-contiguous memory, 1 in channels_last
};

// `pixel` = y * W + x, `pixels` = H * W.
template <bool kChannelsLast, typename index_t>
EDSC_HOST_DEVICE PixelView<index_t> pixel_view(index_t n, index_t pixel, index_t channels, index_t pixels) {
  if (kChannelsLast) return {(n * pixels + pixel) * channels, channel_stride<kChannelsLast>(pixels)};
  return {n * channels * pixels + pixel, channel_stride<kChannelsLast>(pixels)};
}

// base[offset], or `fallback` for an absent tensor. Testing the base pointer (not base + offset)
// lets the compiler hoist the test out of the tap loops.
template <typename acc_t, typename scalar_t, typename index_t>
EDSC_HOST_DEVICE acc_t load_param_or(const scalar_t* base, index_t offset, acc_t fallback) {
  return base ? static_cast<acc_t>(base[offset]) : fallback;
}

template <typename acc_t>
EDSC_HOST_DEVICE acc_t quiet_nan() {
  return static_cast<acc_t>(NAN);
}

// Kernel sizes known at compile time (kKernelH/W > 0) let the tap loops unroll and the per-tap
// accumulators live in registers; 0 means "read it from the params".
template <int kKernel, typename index_t>
EDSC_HOST_DEVICE index_t kernel_extent(index_t runtime) {
  return kKernel > 0 ? static_cast<index_t>(kKernel) : runtime;
}

// The horizontal kernel of one pixel: every row of taps uses it, so with a static width it is
// loaded once into registers; with a run-time width each use reloads it (an L1 hit).
template <int kKernelW, typename scalar_t, typename acc_t, typename index_t>
struct HorizontalWeights {
  const scalar_t* ptr;
  index_t stride;
  acc_t cached[kKernelW > 0 ? kKernelW : 1];

  EDSC_HOST_DEVICE HorizontalWeights(const scalar_t* horz, index_t tap_stride) : ptr(horz), stride(tap_stride) {
    if (kKernelW > 0) {
      EDSC_UNROLL
      for (int j = 0; j < (kKernelW > 0 ? kKernelW : 1); ++j) {
        cached[j] = load_param_or(horz, j * tap_stride, acc_t(1));
      }
    }
  }
  EDSC_HOST_DEVICE acc_t operator()(index_t j) const {
    if (kKernelW > 0) return cached[kKernelW > 0 ? j : 0];
    return load_param_or(ptr, j * stride, acc_t(1));
  }
};

// kCount adjacent values (a pixel's block of channels in channels_last memory) as one object, so
// that an aligned block is read with one vector load (on the GPU, kCount * sizeof(scalar_t) <= 16
// bytes) instead of kCount.
template <typename scalar_t, int kCount>
struct alignas(sizeof(scalar_t) * kCount) ValueBlock {
  scalar_t v[kCount];
};

// The values of a vector load: at most 16 bytes (the widest load), at most the block.
template <typename scalar_t, int kCount>
constexpr int kVectorPiece = kCount * sizeof(scalar_t) <= 16 ? kCount : static_cast<int>(16 / sizeof(scalar_t));

// The kCount channels of one corner (0 outside the image) in loads of kVectorPiece values; `at`
// must be aligned to a piece's size.
template <int kCount, typename acc_t, typename scalar_t>
EDSC_HOST_DEVICE void load_corner_block(bool inside, const scalar_t* at, acc_t (&out)[kCount]) {
  constexpr int kPiece = kVectorPiece<scalar_t, kCount>;
  static_assert(kCount % kPiece == 0, "a block is whole pieces");
  if (inside) {
    EDSC_UNROLL
    for (int k0 = 0; k0 < kCount; k0 += kPiece) {
      const ValueBlock<scalar_t, kPiece> piece = *reinterpret_cast<const ValueBlock<scalar_t, kPiece>*>(at + k0);
      EDSC_UNROLL
      for (int k = 0; k < kPiece; ++k) out[k0 + k] = static_cast<acc_t>(piece.v[k]);
    }
  } else {
    EDSC_UNROLL
    for (int k = 0; k < kCount; ++k) out[k] = acc_t(0);
  }
}

// Adds one tap, weight w at input position (py, px), to the accumulators of the block's first
// `block` channels (planes at in + cc * plane, plane = input_channel_stride), and returns whether
// the position was finite. A non-finite one makes every channel's output NaN: by a branch around
// the loads here, or, kBranchFree, at the end (finish_taps) while this samples (0, 0), which keeps
// the taps straight-line code. On the H200 straight-line taps won where the channel count is a
// compile-time constant (RGB) and lost where a run-time channel count leaves a branch per channel
// anyway (BENCHMARKS.md, "Measurements behind the kernel choices").
// kVectorLoads (channels_last; the caller guarantees a whole block, `in` aligned to it): each
// corner's kChannelBlock channels in one load (load_corner_block).
template <int kChannelBlock, bool kChannelsLast, bool kBranchFree, bool kVectorLoads = false, typename scalar_t,
          typename acc_t, typename index_t, typename param_t>
EDSC_HOST_DEVICE bool accumulate_tap(const DeformSepconvParams<scalar_t, index_t, param_t>& p, const scalar_t* in,
                                     index_t plane, int block, acc_t w, acc_t py, acc_t px,
                                     acc_t (&acc)[kChannelBlock]) {
  const auto s = make_bilinear_sample<acc_t, index_t>(
      py, px, p.height_in, p.width_in, p.padding, input_pixel_stride<kChannelsLast>(p), p.frame_pad_h, p.frame_pad_w);
  w *= s.weight_scale();
  if constexpr (!kBranchFree) {
    if (!s.finite) {
      EDSC_UNROLL
      for (int cc = 0; cc < kChannelBlock; ++cc) acc[cc] = quiet_nan<acc_t>();
      return false;
    }
  }
  if constexpr (kVectorLoads) {
    static_assert(kChannelsLast, "vector loads read a pixel's adjacent channels");
    acc_t v00[kChannelBlock], v01[kChannelBlock], v10[kChannelBlock], v11[kChannelBlock];
    load_corner_block(s.y.lo_in && s.x.lo_in, in + s.offset_of(0, 0), v00);
    load_corner_block(s.y.lo_in && s.x.hi_in, in + s.offset_of(0, 1), v01);
    load_corner_block(s.y.hi_in && s.x.lo_in, in + s.offset_of(1, 0), v10);
    load_corner_block(s.y.hi_in && s.x.hi_in, in + s.offset_of(1, 1), v11);
    EDSC_UNROLL
    for (int cc = 0; cc < kChannelBlock; ++cc) {
      acc[cc] += w * interpolate(s, Corners<acc_t>{v00[cc], v01[cc], v10[cc], v11[cc]});
    }
  } else {
    EDSC_UNROLL
    for (int cc = 0; cc < kChannelBlock; ++cc) {
      if (cc < block) acc[cc] += w * interpolate(s, load_corners<acc_t>(s, in + cc * plane));
    }
  }
  return s.finite;
}

// After kBranchFree taps: NaN in every channel unless all positions were finite.
template <int kChannelBlock, typename acc_t>
EDSC_HOST_DEVICE void finish_taps(bool finite, acc_t (&acc)[kChannelBlock]) {
  if (finite) return;
  EDSC_UNROLL
  for (int cc = 0; cc < kChannelBlock; ++cc) acc[cc] = quiet_nan<acc_t>();
}

// Where the pixel code reads one output pixel's per-pixel values (vertical, horizontal, offset,
// mask) and writes their gradients: here, straight from and to global memory. The CUDA
// channels_last kernels pass a policy with the same interface that stages a warp's rows of taps
// in shared memory instead (begin_row / end_row, called by every lane, active or not, in step).
// Taps are named by their row i, column j and index t = i * KW + j.
// kStrided: the tensors' own PerPixelStrides (views read in place); forward only, since the
// gradients are dense and stored at the same bases.
template <bool kChannelsLast, typename scalar_t, typename index_t, typename param_t = scalar_t, bool kStrided = false>
struct GlobalPixelValues {
  using param_type = param_t;
  const param_t *vert, *horz, *offs, *mask;  // the pixel's first value; nullptr for an absent tensor
  const param_t* offs_dx;                    // the pixel's first dx (offs + stride unless split)
  DeformSepconvParamGrads<param_t> grads;    // whole tensors, nullptr where not asked for
  index_t vert_base, horz_base, offs_base, mask_base;
  index_t stride;           // channel k of a per-pixel tensor is at k * stride from the pixel's first
  index_t offs_tap_stride;  // from tap t's dy (or dx) to tap t + 1's: 2 * stride, or stride when split
  bool split_offsets;

  EDSC_HOST_DEVICE GlobalPixelValues(const DeformSepconvParams<scalar_t, index_t, param_t>& p, index_t n, index_t pixel,
                                     index_t KH, index_t KW, const DeformSepconvParamGrads<param_t>& param_grads = {})
      : grads(param_grads) {
    const index_t hw_out = p.height_out * p.width_out;
    stride = channel_stride<kChannelsLast>(hw_out);
    split_offsets = p.split_offsets();
    offs_tap_stride = split_offsets ? stride : 2 * stride;
    index_t offs_dx_base = 0;
    if constexpr (kStrided) {
      const auto base = [&](const PerPixelStrides<index_t>& s) { return n * s.batch + pixel * s.pixel; };
      vert_base = base(p.vertical_strides);
      horz_base = base(p.horizontal_strides);
      offs_base = base(p.offset_strides);
      offs_dx_base = base(p.offset_dx_strides);
      mask_base = base(p.mask_strides);
    } else {
      vert_base = pixel_view<kChannelsLast>(n, pixel, KH, hw_out).base;
      horz_base = pixel_view<kChannelsLast>(n, pixel, KW, hw_out).base;
      offs_base = pixel_view<kChannelsLast>(n, pixel, (split_offsets ? 1 : 2) * KH * KW, hw_out).base;
      offs_dx_base = offs_base;
      mask_base = pixel_view<kChannelsLast>(n, pixel, KH * KW, hw_out).base;
    }
    vert = p.vertical ? p.vertical + vert_base : nullptr;
    horz = p.horizontal ? p.horizontal + horz_base : nullptr;
    offs = p.offset ? p.offset + offs_base : nullptr;
    offs_dx = split_offsets ? p.offset_dx + offs_dx_base : (offs ? offs + stride : nullptr);
    mask = p.mask ? p.mask + mask_base : nullptr;
  }

  // A policy with kSplitsChannels shares one pixel's channels out between several threads
  // (first_channel, channel_step), which sum their tap sums (sum_over_threads) before the
  // parameter gradients are formed; the backward then reads whole channel blocks with vector loads.
  static constexpr bool kSplitsChannels = false;
  EDSC_HOST_DEVICE static constexpr bool active() { return true; }
  EDSC_HOST_DEVICE void begin_row(index_t) {}
  EDSC_HOST_DEVICE void end_row(index_t) {}

  EDSC_HOST_DEVICE const param_t* horizontal_values() const { return horz; }
  EDSC_HOST_DEVICE index_t horizontal_stride() const { return stride; }
  template <typename acc_t>
  EDSC_HOST_DEVICE acc_t vertical(index_t i) const {
    return load_param_or(vert, i * stride, acc_t(1));
  }
  template <typename acc_t>
  EDSC_HOST_DEVICE acc_t mask_value(index_t, index_t t) const {
    return load_param_or(mask, t * stride, acc_t(1));
  }
  EDSC_HOST_DEVICE bool has_offset() const { return offs != nullptr; }
  // Component 0 (dy) or 1 (dx) of tap t's offset.
  template <typename acc_t>
  EDSC_HOST_DEVICE acc_t offset_value(index_t, index_t t, int component) const {
    return static_cast<acc_t>((component == 0 ? offs : offs_dx)[t * offs_tap_stride]);
  }

  EDSC_HOST_DEVICE bool any_grad() const { return grads.any(); }
  EDSC_HOST_DEVICE bool wants_vertical_grad() const { return grads.vertical != nullptr; }
  EDSC_HOST_DEVICE bool wants_horizontal_grad() const { return grads.horizontal != nullptr; }
  EDSC_HOST_DEVICE bool wants_offset_grad() const { return grads.offset != nullptr; }
  EDSC_HOST_DEVICE bool wants_mask_grad() const { return grads.mask != nullptr; }
  EDSC_HOST_DEVICE void store_vertical_grad(index_t i, param_t v) const { grads.vertical[vert_base + i * stride] = v; }
  EDSC_HOST_DEVICE void store_horizontal_grad(index_t j, param_t v) const {
    grads.horizontal[horz_base + j * stride] = v;
  }
  EDSC_HOST_DEVICE void store_mask_grad(index_t, index_t t, param_t v) const { grads.mask[mask_base + t * stride] = v; }
  EDSC_HOST_DEVICE void store_offset_grad(index_t, index_t t, param_t dy, param_t dx) const {
    grads.offset[offs_base + t * offs_tap_stride] = dy;
    if (split_offsets) {
      grads.offset_dx[offs_base + t * offs_tap_stride] = dx;
    } else {
      grads.offset[offs_base + t * offs_tap_stride + stride] = dx;
    }
  }
};

// out[n, c0 : c0 + kChannelBlock, y, x]. The sampling positions and weights of each tap are
// computed once and reused for the block of channels. `values`: see GlobalPixelValues;
// kVectorLoads: see accumulate_tap. (Exactly RGB takes deform_sepconv_forward_pixel_static_padding.)
template <int kChannelBlock, int kKernelH, int kKernelW, bool kChannelsLast, typename scalar_t, typename acc_t,
          typename index_t, typename PixelValues, bool kVectorLoads = false, typename param_t = scalar_t>
EDSC_HOST_DEVICE void deform_sepconv_forward_pixel_with(const DeformSepconvParams<scalar_t, index_t, param_t>& p,
                                                        PixelValues& values, scalar_t* output, index_t n, index_t y,
                                                        index_t x, index_t c0) {
  const index_t KH = kernel_extent<kKernelH>(p.kernel_h);
  const index_t KW = kernel_extent<kKernelW>(p.kernel_w);
  const index_t hw_out = p.height_out * p.width_out;
  const index_t pixel = y * p.width_out + x;
  const index_t plane = input_channel_stride<kChannelsLast>(p);
  const scalar_t* in = p.input + n * p.channels * p.height_in * p.width_in + c0 * plane;
  const int block = static_cast<int>(p.channels - c0 < kChannelBlock ? p.channels - c0 : kChannelBlock);

  acc_t acc[kChannelBlock];
  EDSC_UNROLL
  for (int cc = 0; cc < kChannelBlock; ++cc) acc[cc] = acc_t(0);

  const HorizontalWeights<kKernelW, typename PixelValues::param_type, acc_t, index_t> horizontal(
      values.horizontal_values(), values.horizontal_stride());

  const int64_t y_base = static_cast<int64_t>(y) - p.pad_h;
  const int64_t x_base = static_cast<int64_t>(x) - p.pad_w;
  EDSC_UNROLL
  for (index_t i = 0; i < KH; ++i) {
    values.begin_row(i);
    if (values.active()) {
      const acc_t wv = values.template vertical<acc_t>(i);
      const acc_t py0 = static_cast<acc_t>(y_base + static_cast<int64_t>(i) * p.dilation_h);
      EDSC_UNROLL
      for (index_t j = 0; j < KW; ++j) {
        const index_t t = i * KW + j;
        const acc_t wh = horizontal(j);
        const acc_t w = wv * wh * values.template mask_value<acc_t>(j, t);
        acc_t py = py0;
        acc_t px = static_cast<acc_t>(x_base + static_cast<int64_t>(j) * p.dilation_w);
        if (values.has_offset()) {
          py += values.template offset_value<acc_t>(j, t, 0);
          px += values.template offset_value<acc_t>(j, t, 1);
        }
        accumulate_tap<kChannelBlock, kChannelsLast, /*kBranchFree=*/false, kVectorLoads>(p, in, plane, block, w, py,
                                                                                          px, acc);
      }
    }
    values.end_row(i);
  }
  if (!values.active()) return;
  const PixelView<index_t> out_view = pixel_view<kChannelsLast>(n, pixel, p.channels, hw_out);
  scalar_t* out = output + out_view.base + c0 * out_view.stride;
  EDSC_UNROLL
  for (int cc = 0; cc < kChannelBlock; ++cc) {
    if (cc < block) out[cc * out_view.stride] = static_cast<scalar_t>(acc[cc]);
  }
}

// The same, reading the per-pixel tensors from global memory.
// kStrided: the per-pixel tensors at their own strides (GlobalPixelValues).
template <int kChannelBlock, int kKernelH, int kKernelW, bool kChannelsLast, typename scalar_t, typename acc_t,
          typename index_t, bool kVectorLoads = false, bool kStrided = false, typename param_t = scalar_t>
EDSC_HOST_DEVICE void deform_sepconv_forward_pixel(const DeformSepconvParams<scalar_t, index_t, param_t>& p,
                                                   scalar_t* output, index_t n, index_t y, index_t x, index_t c0) {
  using Values = GlobalPixelValues<kChannelsLast, scalar_t, index_t, param_t, kStrided>;
  Values values(p, n, y * p.width_out + x, kernel_extent<kKernelH>(p.kernel_h), kernel_extent<kKernelW>(p.kernel_w));
  deform_sepconv_forward_pixel_with<kChannelBlock, kKernelH, kKernelW, kChannelsLast, scalar_t, acc_t, index_t, Values,
                                    kVectorLoads>(p, values, output, n, y, x, c0);
}

// ---- The forward with the padding mode a compile-time constant (the CUDA exact-RGB kernels)
//
// The sample of accumulate_tap in fewer instructions, for a padding mode whose traits the kernel
// was compiled for (kPaddingModes[...].code as kPaddingMode): no branch on the traits; the tap's
// weight folded into the four bilinear corner weights (one multiply-add a corner and channel);
// a clamping mode reads its corners at indices clamped into the image (the corner past the last
// row or column has weight 0 there), so its loads need no predicate; and a non-finite position
// adds NaN (position * 0) to a `poison` sum that goes into every channel at the end, instead of a
// branch. Measured against accumulate_tap's kernels in BENCHMARKS.md ("The forward with the padding
// mode compiled in").

// A kernel's kPaddingMode where it reads the mode's traits from the params instead.
constexpr int64_t kRuntimePaddingMode = -1;

// The traits of padding mode `kMode` at compile time.
template <int64_t kMode>
constexpr PaddingTraits static_padding_traits() {
  static_assert(find_padding_mode(kMode) != nullptr, "a padding mode of edsc_ext/spec.h");
  return find_padding_mode(kMode)->traits;
}

// `pointer` unchanged, but opaque to the compiler: a frame plane's base kept in registers, so that
// each corner's address is that base plus the corner's 32-bit index (nvcc otherwise folded the
// batch and channel offsets into every corner's 64-bit address arithmetic).
template <typename T>
EDSC_HOST_DEVICE const T* opaque_pointer(const T* pointer) {
#if defined(__CUDA_ARCH__)
  asm("mov.b64 %0, %0;" : "+l"(pointer));
#endif
  return pointer;
}

// *at through the read-only data path on the GPU (the frame does not change during a kernel).
template <typename scalar_t>
EDSC_HOST_DEVICE scalar_t load_read_only(const scalar_t* at) {
#if defined(__CUDA_ARCH__)
  static_assert(sizeof(scalar_t) == 2 || sizeof(scalar_t) == 4 || sizeof(scalar_t) == 8, "a 2, 4 or 8-byte float");
  using Bits = std::conditional_t<sizeof(scalar_t) == 2, unsigned short,
                                  std::conditional_t<sizeof(scalar_t) == 4, unsigned int, unsigned long long>>;
  const Bits bits = __ldg(reinterpret_cast<const Bits*>(at));
  scalar_t value;
  memcpy(&value, &bits, sizeof(value));
  return value;
#else
  return *at;
#endif
}

// The frame of one image as the taps below read it. PlanarFrame: kChannels planes, planes[c] at
// channel c's first pixel (opaque_pointer), pixels pixel_stride elements apart; a corner's channels
// one load each.
template <int kChannels, typename scalar_t, typename index_t>
struct PlanarFrame {
  static constexpr bool kPacked = false;
  const scalar_t* planes[kChannels];
  index_t pixel_stride;
};

template <int kChannels, bool kChannelsLast, typename scalar_t, typename index_t, typename param_t>
EDSC_HOST_DEVICE PlanarFrame<kChannels, scalar_t, index_t> planar_frame(
    const DeformSepconvParams<scalar_t, index_t, param_t>& p, index_t n) {
  PlanarFrame<kChannels, scalar_t, index_t> frame;
  const index_t plane = input_channel_stride<kChannelsLast>(p);
  const scalar_t* in = p.input + n * index_t(kChannels) * p.height_in * p.width_in;
  EDSC_UNROLL
  for (int c = 0; c < kChannels; ++c) frame.planes[c] = opaque_pointer(in + c * plane);
  frame.pixel_stride = input_pixel_stride<kChannelsLast>(p);
  return frame;
}

// One pixel of a packed RGB frame: its three channels and an unused fourth (zero), so that a corner
// of a 2-byte frame is one aligned 8-byte load instead of three 2-byte ones.
template <typename scalar_t>
struct alignas(4 * sizeof(scalar_t)) PackedRgbPixel {
  scalar_t value[4];
};

// PackedRgbFrame: an image of (H, W) PackedRgbPixels (the launcher's copy of the NCHW frame),
// `pixels` at its first (opaque_pointer).
template <typename scalar_t, typename index_t>
struct PackedRgbFrame {
  static constexpr bool kPacked = true;
  const PackedRgbPixel<scalar_t>* pixels;
  static constexpr index_t pixel_stride = 1;
};

// *at through the read-only data path, one load on the GPU: as uint2, not load_read_only's 64-bit word, whose
// unpacking nvcc compiles to 64-bit shifts (+100 instructions a kernel; BENCHMARKS.md, the packed RGB frame).
template <typename scalar_t>
EDSC_HOST_DEVICE PackedRgbPixel<scalar_t> load_packed_pixel(const PackedRgbPixel<scalar_t>* at) {
#if defined(__CUDA_ARCH__)
  static_assert(sizeof(PackedRgbPixel<scalar_t>) == 8, "a packed pixel of a 2-byte type");
  const uint2 bits = __ldg(reinterpret_cast<const uint2*>(at));
  PackedRgbPixel<scalar_t> pixel;
  memcpy(&pixel, &bits, sizeof(pixel));
  return pixel;
#else
  return *at;
#endif
}

// acc[c] += each corner's channel c times the corner's weight, in the order given (the planes' order:
// the planes' kernels add corners 11, 10, 01, 00, so the packed one gives the same sums bit for bit).
template <typename scalar_t, typename acc_t, int kChannels>
EDSC_HOST_DEVICE void add_packed_corners(const PackedRgbPixel<scalar_t> (&corners)[4], const acc_t (&weights)[4],
                                         acc_t (&acc)[kChannels]) {
  EDSC_UNROLL
  for (int c = 0; c < kChannels; ++c) {
    EDSC_UNROLL
    for (int k = 0; k < 4; ++k) acc[c] += weights[k] * static_cast<acc_t>(corners[k].value[c]);
  }
}

// A tap's bilinear sample with padding mode kPaddingMode compiled in, for the exact-RGB forward
// (accumulate_tap_static_padding) and backward (the CUDA tile's deform_sepconv_backward_rgb_pixel): as
// sample_axis, but a NaN position goes to the lower bound, so every index stays in its range (the
// caller poisons its sums instead), and a clamping mode's corners past the last row or column are the
// last one's (their weight is 0 there), so its loads need no predicate.
template <typename acc_t, typename index_t>
struct StaticPaddingSample {
  acc_t ly, lx;              // the weights of row y0 + 1 and column x0 + 1
  acc_t factor;              // the doubled border's factor of the tap's weight: 1, 2 or 4
  acc_t dcoord_y, dcoord_x;  // d(coordinate)/d(offset): 0 where a clamping mode clamped (the border included)
  index_t y0, x0;            // the upper left corner
  index_t i00;               // its index in a plane: y0 * row_stride + x0 * pixel_stride
  index_t right, down;       // from a corner to the one right of / below it (clamping: 0 past the last)
};

// The sample at (py, px); `w`, the tap's weight, is multiplied by its factor.
template <int64_t kPaddingMode, typename scalar_t, typename acc_t, typename index_t, typename param_t>
EDSC_HOST_DEVICE StaticPaddingSample<acc_t, index_t> static_padding_sample(
    const DeformSepconvParams<scalar_t, index_t, param_t>& p, index_t pixel_stride, acc_t py, acc_t px, acc_t& w) {
  constexpr PaddingTraits kPadding = static_padding_traits<kPaddingMode>();
  StaticPaddingSample<acc_t, index_t> s;
  const acc_t y_last = static_cast<acc_t>(p.height_in - 1), x_last = static_cast<acc_t>(p.width_in - 1);
  s.factor = acc_t(1);
  if constexpr (kPadding.doubles_border) {
    // As sample_axis: outside [-frame_pad, size - 1 + frame_pad) the border pixel counts twice.
    const acc_t pad_y = static_cast<acc_t>(p.frame_pad_h), pad_x = static_cast<acc_t>(p.frame_pad_w);
    const bool doubled_y = py < -pad_y || py >= y_last + pad_y, doubled_x = px < -pad_x || px >= x_last + pad_x;
    if (doubled_y) w *= acc_t(2);
    if (doubled_x) w *= acc_t(2);
    s.factor = (doubled_y ? acc_t(2) : acc_t(1)) * (doubled_x ? acc_t(2) : acc_t(1));
  }
  if constexpr (kPadding.clamps) {
    s.dcoord_y = py > acc_t(0) && py < y_last ? acc_t(1) : acc_t(0);
    s.dcoord_x = px > acc_t(0) && px < x_last ? acc_t(1) : acc_t(0);
    py = clamp_nan_to_low(py, acc_t(0), y_last);
    px = clamp_nan_to_low(px, acc_t(0), x_last);
  } else {
    s.dcoord_y = s.dcoord_x = acc_t(1);
    py = clamp_nan_to_low(py, acc_t(-2), y_last + acc_t(2));
    px = clamp_nan_to_low(px, acc_t(-2), x_last + acc_t(2));
  }
  const acc_t fy = floor_value(py), fx = floor_value(px);
  s.ly = py - fy;
  s.lx = px - fx;
  s.y0 = static_cast<index_t>(fy);
  s.x0 = static_cast<index_t>(fx);
  const index_t row_stride = p.width_in * pixel_stride;
  s.i00 = s.y0 * row_stride + s.x0 * pixel_stride;
  if constexpr (kPadding.clamps) {
    s.right = s.x0 < p.width_in - 1 ? pixel_stride : index_t(0);
    s.down = s.y0 < p.height_in - 1 ? row_stride : index_t(0);
  } else {
    s.right = pixel_stride;
    s.down = row_stride;
  }
  return s;
}

// Adds the tap of weight w at (py, px) to the kChannels accumulators, reading `frame` (PlanarFrame
// or PackedRgbFrame).
template <int64_t kPaddingMode, typename Frame, int kChannels, typename scalar_t, typename acc_t, typename index_t,
          typename param_t>
EDSC_HOST_DEVICE void accumulate_tap_static_padding(const DeformSepconvParams<scalar_t, index_t, param_t>& p,
                                                    const Frame& frame, acc_t w, acc_t py, acc_t px, acc_t& poison,
                                                    acc_t (&acc)[kChannels]) {
  constexpr PaddingTraits kPadding = static_padding_traits<kPaddingMode>();
  static_assert(!Frame::kPacked || kChannels == 3, "a packed frame holds RGB");
  poison += py * acc_t(0);
  poison += px * acc_t(0);
  const auto s = static_padding_sample<kPaddingMode>(p, index_t(frame.pixel_stride), py, px, w);
  const acc_t w_lower = w - w * s.ly, w_upper = w * s.ly;
  const acc_t w01 = w_lower * s.lx, w00 = w_lower - w01, w11 = w_upper * s.lx, w10 = w_upper - w11;
  const index_t i00 = s.i00;
  if constexpr (kPadding.clamps) {
    const index_t i01 = i00 + s.right, i10 = i00 + s.down, i11 = i01 + s.down;
    if constexpr (Frame::kPacked) {
      add_packed_corners({load_packed_pixel(frame.pixels + i11), load_packed_pixel(frame.pixels + i10),
                          load_packed_pixel(frame.pixels + i01), load_packed_pixel(frame.pixels + i00)},
                         {w11, w10, w01, w00}, acc);
    } else {
      EDSC_UNROLL
      for (int c = 0; c < kChannels; ++c) {
        acc[c] += w11 * static_cast<acc_t>(load_read_only(frame.planes[c] + i11));
        acc[c] += w10 * static_cast<acc_t>(load_read_only(frame.planes[c] + i10));
        acc[c] += w01 * static_cast<acc_t>(load_read_only(frame.planes[c] + i01));
        acc[c] += w00 * static_cast<acc_t>(load_read_only(frame.planes[c] + i00));
      }
    }
  } else {
    // Which corners lie inside the image (inline: through a helper's struct nvcc compiled more instructions).
    using unsigned_t = std::make_unsigned_t<index_t>;
    const bool y_lo = static_cast<unsigned_t>(s.y0) < static_cast<unsigned_t>(p.height_in);
    const bool y_hi = static_cast<unsigned_t>(s.y0 + 1) < static_cast<unsigned_t>(p.height_in);
    const bool x_lo = static_cast<unsigned_t>(s.x0) < static_cast<unsigned_t>(p.width_in);
    const bool x_hi = static_cast<unsigned_t>(s.x0 + 1) < static_cast<unsigned_t>(p.width_in);
    if constexpr (Frame::kPacked) {
      const auto corner = [&](bool inside, index_t i) {
        return inside ? load_packed_pixel(frame.pixels + i) : PackedRgbPixel<scalar_t>{};
      };
      add_packed_corners({corner(y_hi && x_hi, i00 + s.down + s.right), corner(y_hi && x_lo, i00 + s.down),
                          corner(y_lo && x_hi, i00 + s.right), corner(y_lo && x_lo, i00)},
                         {w11, w10, w01, w00}, acc);
    } else {
      const auto corner = [&](bool inside, const scalar_t* at) {
        return inside ? static_cast<acc_t>(load_read_only(at)) : acc_t(0);
      };
      EDSC_UNROLL
      for (int c = 0; c < kChannels; ++c) {
        // Pointer arithmetic from the plane's corner i00, as nvcc compiles it best (BENCHMARKS.md, the
        // forward with the padding mode compiled in).
        acc[c] += w11 * corner(y_hi && x_hi, frame.planes[c] + i00 + s.down + s.right);
        acc[c] += w10 * corner(y_hi && x_lo, frame.planes[c] + i00 + s.down);
        acc[c] += w01 * corner(y_lo && x_hi, frame.planes[c] + i00 + s.right);
        acc[c] += w00 * corner(y_lo && x_lo, frame.planes[c] + i00);
      }
    }
  }
}

// The forward of every channel of one output pixel, the call having exactly kChannels channels,
// with the padding mode kPaddingMode (the kernel's), the frame read through `frame` (PlanarFrame or
// PackedRgbFrame, image n's) and the per-pixel values through `values` (GlobalPixelValues).
template <int64_t kPaddingMode, int kChannels, int kKernelH, int kKernelW, bool kChannelsLast, typename scalar_t,
          typename acc_t, typename index_t, typename PixelValues, typename Frame, typename param_t>
EDSC_HOST_DEVICE void deform_sepconv_forward_pixel_static_padding(
    const DeformSepconvParams<scalar_t, index_t, param_t>& p, PixelValues& values, const Frame& frame, scalar_t* output,
    index_t n, index_t y, index_t x) {
  const index_t KH = kernel_extent<kKernelH>(p.kernel_h);
  const index_t KW = kernel_extent<kKernelW>(p.kernel_w);
  const index_t hw_out = p.height_out * p.width_out;

  acc_t acc[kChannels];
  EDSC_UNROLL
  for (int c = 0; c < kChannels; ++c) acc[c] = acc_t(0);
  acc_t poison = acc_t(0);
  const HorizontalWeights<kKernelW, typename PixelValues::param_type, acc_t, index_t> horizontal(
      values.horizontal_values(), values.horizontal_stride());
  const int64_t y_base = static_cast<int64_t>(y) - p.pad_h;
  const int64_t x_base = static_cast<int64_t>(x) - p.pad_w;
  EDSC_UNROLL
  for (index_t i = 0; i < KH; ++i) {
    const acc_t wv = values.template vertical<acc_t>(i);
    const acc_t py0 = static_cast<acc_t>(y_base + static_cast<int64_t>(i) * p.dilation_h);
    EDSC_UNROLL
    for (index_t j = 0; j < KW; ++j) {
      const index_t t = i * KW + j;
      const acc_t w = wv * horizontal(j) * values.template mask_value<acc_t>(j, t);
      acc_t py = py0;
      acc_t px = static_cast<acc_t>(x_base + static_cast<int64_t>(j) * p.dilation_w);
      if (values.has_offset()) {
        py += values.template offset_value<acc_t>(j, t, 0);
        px += values.template offset_value<acc_t>(j, t, 1);
      }
      accumulate_tap_static_padding<kPaddingMode>(p, frame, w, py, px, poison, acc);
    }
  }
  const PixelView<index_t> out_view = pixel_view<kChannelsLast>(n, y * p.width_out + x, p.channels, hw_out);
  scalar_t* out = output + out_view.base;
  EDSC_UNROLL
  for (int c = 0; c < kChannels; ++c) out[c * out_view.stride] = static_cast<scalar_t>(acc[c] + poison);
}

// Backward of one output pixel, recomputing each tap's sample once:
// - when `values` asks for any, the gradients of this pixel's own per-pixel tensors, summed over
//   all channels and written with plain stores (this pixel owns them);
// - for channels [scatter_begin, scatter_end), its contributions to the input gradient, through
//   add_input_grad(c, row, column, value) (plain adds, shared-memory or global atomics).
// kMaxKernelWidth bounds the horizontal-gradient accumulators when KW is not static. Channels go
// kChannelBlock at a time, unrolled, so one tap's corner loads for several channels are in flight
// together. `values`: see GlobalPixelValues.
template <int kChannelBlock, int kKernelH, int kKernelW, int kMaxKernelWidth, bool kChannelsLast, typename scalar_t,
          typename acc_t, typename index_t, typename PixelValues, typename AddInputGrad, typename param_t>
EDSC_HOST_DEVICE void deform_sepconv_backward_pixel_with(const DeformSepconvParams<scalar_t, index_t, param_t>& p,
                                                         PixelValues& values, const scalar_t* grad_output,
                                                         AddInputGrad& add_input_grad, index_t scatter_begin,
                                                         index_t scatter_end, index_t n, index_t y, index_t x) {
  const index_t KH = kernel_extent<kKernelH>(p.kernel_h);
  const index_t KW = kernel_extent<kKernelW>(p.kernel_w);
  const index_t hw_out = p.height_out * p.width_out;
  const index_t pixel = y * p.width_out + x;
  const index_t plane = input_channel_stride<kChannelsLast>(p);
  const PixelView<index_t> go_view = pixel_view<kChannelsLast>(n, pixel, p.channels, hw_out);
  const scalar_t* go = grad_output + go_view.base;
  const scalar_t* in = p.input + n * p.channels * p.height_in * p.width_in;
  const bool param_grads = values.any_grad();
  // Parameter gradients need every channel; the input gradient only the scatter range.
  const index_t c_begin = param_grads ? index_t(0) : scatter_begin;
  const index_t c_end = param_grads ? p.channels : scatter_end;

  using value_t = typename PixelValues::param_type;  // the per-pixel tensors' and their gradients' dtype
  constexpr bool kSplitsChannels = PixelValues::kSplitsChannels;
  const HorizontalWeights<kKernelW, value_t, acc_t, index_t> horizontal(values.horizontal_values(),
                                                                        values.horizontal_stride());
  constexpr int kWidthSlots = kKernelW > 0 ? kKernelW : kMaxKernelWidth;
  acc_t grad_h[kWidthSlots];
  if (values.wants_horizontal_grad()) {
    EDSC_UNROLL
    for (index_t j = 0; j < KW; ++j) grad_h[j] = acc_t(0);
  }

  const int64_t y_base = static_cast<int64_t>(y) - p.pad_h;
  const int64_t x_base = static_cast<int64_t>(x) - p.pad_w;
  // Rows of taps stay a loop (each row unrolled): full unrolling of the fused backward
  // exhausts the register file.
  EDSC_NO_UNROLL
  for (index_t i = 0; i < KH; ++i) {
    values.begin_row(i);
    if (!values.active()) {
      values.end_row(i);
      continue;
    }
    const acc_t wv = values.template vertical<acc_t>(i);
    const acc_t py0 = static_cast<acc_t>(y_base + static_cast<int64_t>(i) * p.dilation_h);
    acc_t grad_v = acc_t(0);
    EDSC_UNROLL
    for (index_t j = 0; j < KW; ++j) {
      const index_t t = i * KW + j;
      const acc_t wh = horizontal(j);
      const acc_t wm = values.template mask_value<acc_t>(j, t);
      const acc_t w = wv * wh * wm;
      acc_t py = py0;
      acc_t px = static_cast<acc_t>(x_base + static_cast<int64_t>(j) * p.dilation_w);
      if (values.has_offset()) {
        py += values.template offset_value<acc_t>(j, t, 0);
        px += values.template offset_value<acc_t>(j, t, 1);
      }
      const auto s =
          make_bilinear_sample<acc_t, index_t>(py, px, p.height_in, p.width_in, p.padding,
                                               input_pixel_stride<kChannelsLast>(p), p.frame_pad_h, p.frame_pad_w);
      // EDSC mode's doubled border samples scale the value and so every derivative of it.
      const acc_t scale = s.weight_scale();
      const acc_t w_scaled = w * scale;

      // Sums over channels of dL/dout * S, dL/dout * dS/dly and dL/dout * dS/dlx.
      acc_t grad_w = acc_t(0), grad_ly = acc_t(0), grad_lx = acc_t(0);
      // A non-finite position poisons every channel's output, so its parameter gradients are NaN
      // too (below), and it scatters nothing: it samples (0, 0) and adds zeros. That keeps the tap
      // free of a branch around the channel loop, as in the forward (accumulate_tap).
      if constexpr (kSplitsChannels) {
        // This thread's whole blocks of channels, each corner's block with vector loads (the
        // caller guarantees channels_last, whole blocks and their alignment).
        static_assert(kChannelsLast, "split channels read a pixel's adjacent channels");
        for (index_t c0 = values.first_channel(c_begin); c0 < c_end; c0 += values.channel_step()) {
          acc_t g[kChannelBlock];
          load_corner_block(true, go + c0, g);
          if (param_grads) {
            acc_t v00[kChannelBlock], v01[kChannelBlock], v10[kChannelBlock], v11[kChannelBlock];
            load_corner_block(s.y.lo_in && s.x.lo_in, in + s.offset_of(0, 0) + c0, v00);
            load_corner_block(s.y.lo_in && s.x.hi_in, in + s.offset_of(0, 1) + c0, v01);
            load_corner_block(s.y.hi_in && s.x.lo_in, in + s.offset_of(1, 0) + c0, v10);
            load_corner_block(s.y.hi_in && s.x.hi_in, in + s.offset_of(1, 1) + c0, v11);
            EDSC_UNROLL
            for (int cc = 0; cc < kChannelBlock; ++cc) {
              const Corners<acc_t> corners{v00[cc], v01[cc], v10[cc], v11[cc]};
              grad_w += g[cc] * interpolate(s, corners);
              grad_ly += g[cc] * interpolate_dy(s, corners);
              grad_lx += g[cc] * interpolate_dx(s, corners);
            }
          }
          if (c0 >= scatter_begin && c0 < scatter_end) {
            acc_t value[kChannelBlock];
            EDSC_UNROLL
            for (int cc = 0; cc < kChannelBlock; ++cc) value[cc] = s.finite ? g[cc] * w_scaled : acc_t(0);
            scatter_corner_block(s, value, c0, add_input_grad);
          }
        }
        if (param_grads) values.sum_over_threads(grad_w, grad_ly, grad_lx);
      }
      for (index_t c0 = c_begin; !kSplitsChannels && c0 < c_end; c0 += kChannelBlock) {
        acc_t g[kChannelBlock];
        Corners<acc_t> corners[kChannelBlock];
        EDSC_UNROLL
        for (int cc = 0; cc < kChannelBlock; ++cc) {
          if (c0 + cc < c_end) g[cc] = static_cast<acc_t>(go[(c0 + cc) * go_view.stride]);
        }
        if (param_grads) {
          EDSC_UNROLL
          for (int cc = 0; cc < kChannelBlock; ++cc) {
            if (c0 + cc < c_end) corners[cc] = load_corners<acc_t>(s, in + (c0 + cc) * plane);
          }
        }
        EDSC_UNROLL
        for (int cc = 0; cc < kChannelBlock; ++cc) {
          const index_t c = c0 + cc;
          if (c >= c_end) continue;
          if (param_grads) {
            grad_w += g[cc] * interpolate(s, corners[cc]);
            grad_ly += g[cc] * interpolate_dy(s, corners[cc]);
            grad_lx += g[cc] * interpolate_dx(s, corners[cc]);
          }
          if (c >= scatter_begin && c < scatter_end) {
            const acc_t value = g[cc] * w_scaled;
            scatter_corners(s, s.finite ? value : acc_t(0), c, add_input_grad);
          }
        }
      }
      if (!s.finite && p.channels > 0) grad_w = grad_ly = grad_lx = quiet_nan<acc_t>();
      if (!param_grads) continue;
      grad_w *= scale;
      grad_ly *= scale;
      grad_lx *= scale;
      if (values.wants_vertical_grad()) grad_v += grad_w * wh * wm;
      if (values.wants_horizontal_grad()) grad_h[j] += grad_w * wv * wm;
      if (values.wants_mask_grad()) values.store_mask_grad(j, t, static_cast<value_t>(grad_w * wv * wh));
      if (values.wants_offset_grad()) {
        values.store_offset_grad(j, t, static_cast<value_t>(grad_ly * w * s.y.dcoord),
                                 static_cast<value_t>(grad_lx * w * s.x.dcoord));
      }
    }
    if (values.wants_vertical_grad()) values.store_vertical_grad(i, static_cast<value_t>(grad_v));
    values.end_row(i);
  }
  if (values.active() && values.wants_horizontal_grad()) {
    EDSC_UNROLL
    for (index_t j = 0; j < KW; ++j) values.store_horizontal_grad(j, static_cast<value_t>(grad_h[j]));
  }
}

// The same, reading and writing global memory; `grads` are the per-pixel tensors' gradient
// outputs (nullptr where not asked for).
template <int kChannelBlock, int kKernelH, int kKernelW, int kMaxKernelWidth, bool kChannelsLast, typename scalar_t,
          typename acc_t, typename index_t, typename AddInputGrad, typename param_t>
EDSC_HOST_DEVICE void deform_sepconv_backward_pixel(const DeformSepconvParams<scalar_t, index_t, param_t>& p,
                                                    const scalar_t* grad_output,
                                                    const DeformSepconvParamGrads<param_t>& grads,
                                                    AddInputGrad& add_input_grad, index_t scatter_begin,
                                                    index_t scatter_end, index_t n, index_t y, index_t x) {
  GlobalPixelValues<kChannelsLast, scalar_t, index_t, param_t> values(
      p, n, y * p.width_out + x, kernel_extent<kKernelH>(p.kernel_h), kernel_extent<kKernelW>(p.kernel_w), grads);
  deform_sepconv_backward_pixel_with<kChannelBlock, kKernelH, kKernelW, kMaxKernelWidth, kChannelsLast, scalar_t,
                                     acc_t>(p, values, grad_output, add_input_grad, scatter_begin, scatter_end, n, y,
                                            x);
}

}  // namespace edsc_ext
