// Sampling math of deform_sepconv: tap positions, padding modes, bilinear weights and their
// derivatives. Host+device inline code, the single source of truth for the CPU and CUDA kernels.
#pragma once

#include <cmath>
#include <cstdint>

#include "edsc_ext/spec.h"  // PaddingMode, kMaxKernelWidth

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

// The EDSC layer's first tap sits at 1 - (K-1)//2 relative to the output pixel in the padded
// frame, one pixel before a centred kernel's at K=5.
EDSC_HOST_DEVICE int64_t edsc_tap_shift(int64_t kernel) { return 1 - (kernel - 1) / 2; }

// Whether a mode clamps coordinates into the image (and so reads only pixels inside it).
EDSC_HOST_DEVICE bool clamps_coordinates(int64_t padding_mode) { return padding_mode != kPaddingZeros; }

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

// One coordinate axis of a bilinear sample: the lower corner index, the fractional weight of the
// upper corner, which of the two corners lie inside the image, and d(coordinate)/d(offset).
template <typename acc_t, typename index_t>
struct AxisSample {
  index_t lo;    // floor(coordinate); meaningful only where lo_in / hi_in
  acc_t frac;    // coordinate - lo, the weight of corner lo + 1
  bool lo_in;    // 0 <= lo < size
  bool hi_in;    // 0 <= lo + 1 < size
  acc_t dcoord;  // 1, or 0 where the border mode clamped the coordinate
  acc_t scale;   // 2 where the EDSC mode counts the border pixel twice, else 1
};

// Resolves a finite coordinate along an axis of length `size` under `padding_mode`.
// Zeros mode: the coordinate is first clamped to [-2, size + 1], which leaves every corner of a
// far-away sample outside (value 0, gradient 0) and keeps floor() inside index_t for any finite
// input, 1e30 included. Border mode: clamped to [0, size - 1]; like grid_sample, the exact borders
// count as clamped, so the offset gradient is 0 there. EDSC mode: as border mode, with scale 2 where
// the coordinate lies before -frame_pad or at or past size - 1 + frame_pad, i.e. outside
// [0, padded size - 1) of the frame padded by frame_pad (the original clamps there and adds both
// bilinear corners, the same border pixel, at weight 1).
template <typename acc_t, typename index_t>
EDSC_HOST_DEVICE AxisSample<acc_t, index_t> sample_axis(acc_t coord, index_t size, int64_t padding_mode,
                                                        index_t frame_pad = 0) {
  AxisSample<acc_t, index_t> s;
  s.dcoord = acc_t(1);
  s.scale = acc_t(1);
  if (clamps_coordinates(padding_mode)) {
    const acc_t hi = static_cast<acc_t>(size - 1);
    if (coord <= acc_t(0) || coord >= hi) {
      // EDSC mode's doubling lies inside the clamped range (frame_pad >= 0), so samples inside
      // the image, most of them, pay nothing for it.
      if (padding_mode == kPaddingEdsc &&
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
// whether the pixel is read, with `coord` the pixel's index: false outside the image in zeros mode
// (the sample is 0); border mode clamps into the image, as sample_axis does.
// (The grid-tap kernels do not take EDSC mode: takes_grid_taps.)
template <typename index_t>
EDSC_HOST_DEVICE bool grid_tap_pixel(index_t& coord, index_t size, int64_t padding_mode) {
  if (padding_mode == kPaddingBorder) {
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
  // The factor of the bilinear value (and of its derivatives): 1 but in EDSC mode.
  EDSC_HOST_DEVICE acc_t weight_scale() const { return y.scale * x.scale; }
};

template <typename acc_t, typename index_t>
EDSC_HOST_DEVICE BilinearSample<acc_t, index_t> make_bilinear_sample(acc_t py, acc_t px, index_t height, index_t width,
                                                                     int64_t padding_mode, index_t pixel_stride,
                                                                     index_t frame_pad_h = 0, index_t frame_pad_w = 0) {
  BilinearSample<acc_t, index_t> s;
  s.row_stride = width * pixel_stride;
  s.pixel_stride = pixel_stride;
  s.finite = is_finite(py) && is_finite(px);
  if (!s.finite) {
    py = acc_t(0);
    px = acc_t(0);
  }
  s.y = sample_axis<acc_t, index_t>(py, height, padding_mode, frame_pad_h);
  s.x = sample_axis<acc_t, index_t>(px, width, padding_mode, frame_pad_w);
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

}  // namespace edsc_ext
