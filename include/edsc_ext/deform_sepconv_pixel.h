// The per-output-pixel work of deform_sepconv, forward and backward, shared by the CPU and CUDA
// kernels: each backend only decides which pixels a thread owns and how input-gradient adds are
// made (plain adds on a plane owned by one CPU task, atomics on the GPU).
#pragma once

#include <cmath>

#include "edsc_ext/sampling.h"

namespace edsc_ext {

// Raw pointers and sizes of one call. Absent optional tensors are nullptr: the kernels then skip
// their loads and multiplies rather than reading a tensor of ones or zeros.
template <typename scalar_t, typename index_t>
struct DeformSepconvParams {
  const scalar_t* input;       // (N, C, H_in, W_in)
  const scalar_t* vertical;    // (N, KH, H_out, W_out) or nullptr
  const scalar_t* horizontal;  // (N, KW, H_out, W_out) or nullptr
  const scalar_t* offset;      // (N, 2*KH*KW, H_out, W_out) or nullptr; (dy, dx) per tap
  const scalar_t* mask;        // (N, KH*KW, H_out, W_out) or nullptr
  index_t batch, channels, height_in, width_in, height_out, width_out;
  index_t kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w;
  int64_t padding_mode;
};

// Gradient outputs of the per-pixel tensors; nullptr where not requested.
template <typename scalar_t>
struct DeformSepconvParamGrads {
  scalar_t* vertical;
  scalar_t* horizontal;
  scalar_t* offset;
  scalar_t* mask;

  EDSC_HOST_DEVICE bool any() const { return vertical || horizontal || offset || mask; }
};

// Where one output pixel's per-pixel tensors live: (n, k, y, x) is at base + k * stride.
template <typename scalar_t, typename index_t>
struct PixelView {
  index_t base;    // n * K * H_out * W_out + y * W_out + x, for a tensor with K channels
  index_t stride;  // H_out * W_out
};

template <typename acc_t, typename scalar_t>
EDSC_HOST_DEVICE acc_t load_or(const scalar_t* ptr, acc_t fallback) {
  return ptr ? static_cast<acc_t>(*ptr) : fallback;
}

template <typename acc_t>
EDSC_HOST_DEVICE acc_t quiet_nan() {
  return static_cast<acc_t>(NAN);
}

// out[n, c0 : c0 + kChannelBlock, y, x]. The sampling positions and weights of each tap are
// computed once and reused for the block of channels.
template <int kChannelBlock, typename scalar_t, typename acc_t, typename index_t>
EDSC_HOST_DEVICE void deform_sepconv_forward_pixel(const DeformSepconvParams<scalar_t, index_t>& p,
                                                   scalar_t* output, index_t n, index_t y, index_t x,
                                                   index_t c0) {
  const index_t hw_out = p.height_out * p.width_out;
  const index_t pixel = y * p.width_out + x;
  const index_t taps = p.kernel_h * p.kernel_w;
  const index_t plane = p.height_in * p.width_in;
  const scalar_t* vert = p.vertical ? p.vertical + n * p.kernel_h * hw_out + pixel : nullptr;
  const scalar_t* horz = p.horizontal ? p.horizontal + n * p.kernel_w * hw_out + pixel : nullptr;
  const scalar_t* offs = p.offset ? p.offset + n * 2 * taps * hw_out + pixel : nullptr;
  const scalar_t* mask = p.mask ? p.mask + n * taps * hw_out + pixel : nullptr;
  const scalar_t* in = p.input + (n * p.channels + c0) * plane;
  const int block = static_cast<int>(p.channels - c0 < kChannelBlock ? p.channels - c0 : kChannelBlock);

  acc_t acc[kChannelBlock];
EDSC_UNROLL
  for (int cc = 0; cc < kChannelBlock; ++cc) acc[cc] = acc_t(0);

  const int64_t y_base = static_cast<int64_t>(y) - p.pad_h;
  const int64_t x_base = static_cast<int64_t>(x) - p.pad_w;
  for (index_t i = 0; i < p.kernel_h; ++i) {
    const acc_t wv = load_or<acc_t>(vert ? vert + i * hw_out : nullptr, acc_t(1));
    const acc_t py0 = static_cast<acc_t>(y_base + static_cast<int64_t>(i) * p.dilation_h);
    for (index_t j = 0; j < p.kernel_w; ++j) {
      const index_t t = i * p.kernel_w + j;
      acc_t w = wv;
      if (horz) w *= static_cast<acc_t>(horz[j * hw_out]);
      if (mask) w *= static_cast<acc_t>(mask[t * hw_out]);
      acc_t py = py0;
      acc_t px = static_cast<acc_t>(x_base + static_cast<int64_t>(j) * p.dilation_w);
      if (offs) {
        py += static_cast<acc_t>(offs[2 * t * hw_out]);
        px += static_cast<acc_t>(offs[(2 * t + 1) * hw_out]);
      }
      const auto s = make_bilinear_sample<acc_t, index_t>(py, px, p.height_in, p.width_in, p.padding_mode);
      if (!s.finite) {
EDSC_UNROLL
        for (int cc = 0; cc < kChannelBlock; ++cc) acc[cc] = quiet_nan<acc_t>();
        continue;
      }
EDSC_UNROLL
      for (int cc = 0; cc < kChannelBlock; ++cc) {
        if (cc < block) acc[cc] += w * interpolate(s, load_corners<acc_t>(s, in + cc * plane));
      }
    }
  }
  scalar_t* out = output + (n * p.channels + c0) * hw_out + pixel;
EDSC_UNROLL
  for (int cc = 0; cc < kChannelBlock; ++cc) {
    if (cc < block) out[cc * hw_out] = static_cast<scalar_t>(acc[cc]);
  }
}

// Backward of one output pixel over channels [c_begin, c_end): the gradients of its own per-pixel
// parameters (written with plain stores, this pixel owns them; only when the channel range is all
// channels) and, through add_input_grad(flat input index, value), its contributions to the input
// gradient. kMaxKernelWidth bounds the per-thread accumulators of the horizontal-kernel gradient.
template <int kMaxKernelWidth, typename scalar_t, typename acc_t, typename index_t, typename AddInputGrad>
EDSC_HOST_DEVICE void deform_sepconv_backward_pixel(const DeformSepconvParams<scalar_t, index_t>& p,
                                                    const scalar_t* grad_output,
                                                    const DeformSepconvParamGrads<scalar_t>& grads,
                                                    bool input_grad, AddInputGrad& add_input_grad, index_t n,
                                                    index_t y, index_t x, index_t c_begin, index_t c_end) {
  const index_t hw_out = p.height_out * p.width_out;
  const index_t pixel = y * p.width_out + x;
  const index_t taps = p.kernel_h * p.kernel_w;
  const index_t plane = p.height_in * p.width_in;
  const index_t vert_base = n * p.kernel_h * hw_out + pixel;
  const index_t horz_base = n * p.kernel_w * hw_out + pixel;
  const index_t offs_base = n * 2 * taps * hw_out + pixel;
  const index_t mask_base = n * taps * hw_out + pixel;
  const scalar_t* vert = p.vertical ? p.vertical + vert_base : nullptr;
  const scalar_t* horz = p.horizontal ? p.horizontal + horz_base : nullptr;
  const scalar_t* offs = p.offset ? p.offset + offs_base : nullptr;
  const scalar_t* mask = p.mask ? p.mask + mask_base : nullptr;
  const scalar_t* go = grad_output + n * p.channels * hw_out + pixel;
  const index_t in_base = n * p.channels * plane;
  const bool param_grads = grads.any();

  acc_t grad_h[kMaxKernelWidth];
  if (grads.horizontal) {
    for (index_t j = 0; j < p.kernel_w; ++j) grad_h[j] = acc_t(0);
  }

  const int64_t y_base = static_cast<int64_t>(y) - p.pad_h;
  const int64_t x_base = static_cast<int64_t>(x) - p.pad_w;
  for (index_t i = 0; i < p.kernel_h; ++i) {
    const acc_t wv = load_or<acc_t>(vert ? vert + i * hw_out : nullptr, acc_t(1));
    const acc_t py0 = static_cast<acc_t>(y_base + static_cast<int64_t>(i) * p.dilation_h);
    acc_t grad_v = acc_t(0);
    for (index_t j = 0; j < p.kernel_w; ++j) {
      const index_t t = i * p.kernel_w + j;
      const acc_t wh = load_or<acc_t>(horz ? horz + j * hw_out : nullptr, acc_t(1));
      const acc_t wm = load_or<acc_t>(mask ? mask + t * hw_out : nullptr, acc_t(1));
      const acc_t w = wv * wh * wm;
      acc_t py = py0;
      acc_t px = static_cast<acc_t>(x_base + static_cast<int64_t>(j) * p.dilation_w);
      if (offs) {
        py += static_cast<acc_t>(offs[2 * t * hw_out]);
        px += static_cast<acc_t>(offs[(2 * t + 1) * hw_out]);
      }
      const auto s = make_bilinear_sample<acc_t, index_t>(py, px, p.height_in, p.width_in, p.padding_mode);

      // Sums over channels of dL/dout * S, dL/dout * dS/dly and dL/dout * dS/dlx.
      acc_t grad_w = acc_t(0), grad_ly = acc_t(0), grad_lx = acc_t(0);
      if (!s.finite) {
        // A NaN sample poisons every channel's output, so its parameter gradients are NaN too.
        if (c_end > c_begin) grad_w = grad_ly = grad_lx = quiet_nan<acc_t>();
      } else {
        for (index_t c = c_begin; c < c_end; ++c) {
          const acc_t g = static_cast<acc_t>(go[c * hw_out]);
          if (param_grads) {
            const auto corners = load_corners<acc_t>(s, p.input + in_base + c * plane);
            grad_w += g * interpolate(s, corners);
            grad_ly += g * interpolate_dy(s, corners);
            grad_lx += g * interpolate_dx(s, corners);
          }
          if (input_grad) {
            scatter_corners(s, g * w, in_base + c * plane, add_input_grad);
          }
        }
      }
      if (!param_grads) continue;
      if (grads.vertical) grad_v += grad_w * wh * wm;
      if (grads.horizontal) grad_h[j] += grad_w * wv * wm;
      if (grads.mask) grads.mask[mask_base + t * hw_out] = static_cast<scalar_t>(grad_w * wv * wh);
      if (grads.offset) {
        grads.offset[offs_base + 2 * t * hw_out] = static_cast<scalar_t>(grad_ly * w * s.y.dcoord);
        grads.offset[offs_base + (2 * t + 1) * hw_out] = static_cast<scalar_t>(grad_lx * w * s.x.dcoord);
      }
    }
    if (grads.vertical) grads.vertical[vert_base + i * hw_out] = static_cast<scalar_t>(grad_v);
  }
  if (grads.horizontal) {
    for (index_t j = 0; j < p.kernel_w; ++j) grads.horizontal[horz_base + j * hw_out] = static_cast<scalar_t>(grad_h[j]);
  }
}

}  // namespace edsc_ext
