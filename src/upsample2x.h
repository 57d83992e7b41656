// Bilinear 2x upsampling with the corners aligned, F.interpolate(x, scale_factor=2, mode="bilinear",
// align_corners=True): the EDSC networks' upsampling (the U-Net's decoder and the heads' last layers).
// Host+device code that the CPU and CUDA kernels share: where an output row or column samples its
// input and with which weights, computed as ATen's upsample_bilinear2d computes them (the scale
// (n - 1) / (2n - 1) in the accumulation type, the position truncated), so that the values are
// F.interpolate's up to the order of the floating-point operations.
#pragma once

#include <cstdint>

#include "sampling.h"  // EDSC_HOST_DEVICE

namespace edsc_ext {

// The two input samples of one output index along an axis, and their weights.
template <typename acc_t>
struct Upsample2xTap {
  int32_t lo, hi;  // hi = lo + 1, or lo at the last input sample
  acc_t w_lo, w_hi;
};

// (in_size - 1) / (out_size - 1), 0 for one input sample (ATen's area_pixel_compute_scale).
template <typename acc_t>
inline acc_t upsample2x_scale(int64_t in_size) {
  return in_size > 1 ? static_cast<acc_t>(in_size - 1) / static_cast<acc_t>(2 * in_size - 1) : acc_t(0);
}

template <typename acc_t>
EDSC_HOST_DEVICE Upsample2xTap<acc_t> upsample2x_tap(int32_t out_index, int32_t in_size, acc_t scale) {
  const acc_t position = scale * static_cast<acc_t>(out_index);
  const int32_t lo = static_cast<int32_t>(position);
  const acc_t w_hi = position - static_cast<acc_t>(lo);
  return {lo, lo < in_size - 1 ? lo + 1 : lo, acc_t(1) - w_hi, w_hi};
}

// One output value from the samples at (row lo, col lo), (row lo, col hi), (row hi, col lo), (row hi,
// col hi), combined in ATen's order (each row along x, then the rows).
template <typename acc_t>
EDSC_HOST_DEVICE acc_t upsample2x_blend(const Upsample2xTap<acc_t>& row, const Upsample2xTap<acc_t>& col, acc_t v00,
                                        acc_t v01, acc_t v10, acc_t v11) {
  return row.w_lo * (col.w_lo * v00 + col.w_hi * v01) + row.w_hi * (col.w_lo * v10 + col.w_hi * v11);
}

}  // namespace edsc_ext
