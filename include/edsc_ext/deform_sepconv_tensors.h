// The tensors of one deform_sepconv call and the kernel parameters made from them, in terms of
// at::TensorBase only: the kernels' translation units include this rather than edsc_ext/ops.h,
// since at::Tensor's header (every operator as a method) is most of a CUDA unit's compile time
// (the way ATen's own .cu files use TensorBase). Host code works with edsc_ext/ops.h.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/TensorBase.h>

#include <array>
#include <cstdint>
#include <optional>

#include "edsc_ext/deform_sepconv_pixel.h"

namespace edsc_ext {

// The backward keeps one accumulator per horizontal tap; edsc_ext/ops.py has the same bound.
constexpr int64_t kMaxKernelWidth = 128;

struct DeformSepconvConfig {
  int64_t kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode;
};

// Validated tensors of one call in one memory format (memory_format()): dense, except per-pixel
// tensors that a backend reads in place as views (dense_per_pixel false; see prepare_deform_sepconv).
// Absent optional tensors stay undefined.
struct DeformSepconvTensors {
  // offset_dx defined: split offsets, offset holding dy and offset_dx dx (DeformSepconvParams).
  at::TensorBase input, vertical, horizontal, offset, mask, grad_output, offset_dx;
  int64_t height_out = 0, width_out = 0;
  // The dtype of the per-pixel tensors (vertical, horizontal, offset, mask, offset_dx), which all
  // share one: the input's, or float16 / bfloat16 with a float32 input (mixed precision). The
  // input's when none is given.
  at::ScalarType param_dtype = at::ScalarType::Undefined;
  bool use_32bit_indexing = true;
  bool channels_last = false;   // the call's layout; kernels take it as kChannelsLast (EDSC_DISPATCH_LAYOUT)
  bool dense_per_pixel = true;  // every present per-pixel tensor is dense in memory_format()

  at::MemoryFormat memory_format() const {
    return channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  }
};

// The batch and pixel strides (elements) at which the kernels can read a 4-D per-pixel tensor in
// place in the call's layout: element (n, k, y, x) at n * batch + (y * W + x) * pixel + k * HW in
// NCHW (pixel 1), + k in channels_last; nullopt where its strides are of another pattern.
std::optional<PerPixelStrides<int64_t>> per_pixel_strides(const at::TensorBase& t, bool channels_last);

// The gradients of a call (DeformSepconvGrads, edsc_ext/ops.h) as the kernels' units take them.
using DeformSepconvGradBuffers = std::array<at::TensorBase, 6>;
constexpr int kOffsetDxGrad = 5;

template <typename scalar_t>
const scalar_t* data_or_null(const at::TensorBase& t) {
  return t.defined() ? t.const_data_ptr<scalar_t>() : nullptr;
}

template <typename scalar_t>
scalar_t* mutable_data_or_null(const at::TensorBase& t) {
  return (t.defined() && t.numel() > 0) ? t.mutable_data_ptr<scalar_t>() : nullptr;
}

template <typename scalar_t, typename index_t, typename param_t = scalar_t>
DeformSepconvParams<scalar_t, index_t, param_t> make_params(const DeformSepconvTensors& t,
                                                            const DeformSepconvConfig& cfg) {
  DeformSepconvParams<scalar_t, index_t, param_t> p;
  p.input = t.input.const_data_ptr<scalar_t>();
  p.vertical = data_or_null<param_t>(t.vertical);
  p.horizontal = data_or_null<param_t>(t.horizontal);
  p.offset = data_or_null<param_t>(t.offset);
  p.offset_dx = data_or_null<param_t>(t.offset_dx);
  p.mask = data_or_null<param_t>(t.mask);
  const auto strides = [&](const at::TensorBase& v) {
    if (!v.defined()) return PerPixelStrides<index_t>{0, 0};
    const PerPixelStrides<int64_t> s = per_pixel_strides(v, t.channels_last).value();  // prepare checked it
    return PerPixelStrides<index_t>{static_cast<index_t>(s.batch), static_cast<index_t>(s.pixel)};
  };
  p.vertical_strides = strides(t.vertical);
  p.horizontal_strides = strides(t.horizontal);
  p.offset_strides = strides(t.offset);
  p.offset_dx_strides = strides(t.offset_dx);
  p.mask_strides = strides(t.mask);
  p.batch = static_cast<index_t>(t.input.size(0));
  p.channels = static_cast<index_t>(t.input.size(1));
  p.height_in = static_cast<index_t>(t.input.size(2));
  p.width_in = static_cast<index_t>(t.input.size(3));
  p.height_out = static_cast<index_t>(t.height_out);
  p.width_out = static_cast<index_t>(t.width_out);
  p.kernel_h = static_cast<index_t>(cfg.kernel_h);
  p.kernel_w = static_cast<index_t>(cfg.kernel_w);
  // EDSC mode moves tap 0 by edsc_tap_shift: y - pad_h + shift = y - (pad_h - shift).
  const bool edsc = cfg.padding_mode == kPaddingEdsc;
  p.pad_h = static_cast<index_t>(cfg.pad_h - (edsc ? edsc_tap_shift(cfg.kernel_h) : 0));
  p.pad_w = static_cast<index_t>(cfg.pad_w - (edsc ? edsc_tap_shift(cfg.kernel_w) : 0));
  p.frame_pad_h = static_cast<index_t>(cfg.pad_h);
  p.frame_pad_w = static_cast<index_t>(cfg.pad_w);
  p.dilation_h = static_cast<index_t>(cfg.dilation_h);
  p.dilation_w = static_cast<index_t>(cfg.dilation_w);
  p.padding_mode = cfg.padding_mode;
  return p;
}

// grads: DeformSepconvGrads or DeformSepconvGradBuffers.
template <typename scalar_t, typename Grads>
DeformSepconvParamGrads<scalar_t> make_param_grads(const Grads& grads) {
  return {mutable_data_or_null<scalar_t>(grads[1]), mutable_data_or_null<scalar_t>(grads[2]),
          mutable_data_or_null<scalar_t>(grads[3]), mutable_data_or_null<scalar_t>(grads[4]),
          mutable_data_or_null<scalar_t>(grads[kOffsetDxGrad])};
}

// Runs `body` with scalar_t (the frame's dtype) and param_t (the per-pixel tensors', see
// DeformSepconvTensors::param_dtype) as compile-time types: one type for the four floating dtypes,
// or a float frame with float16 / bfloat16 per-pixel tensors (prepare_deform_sepconv allows no other).
#define EDSC_DISPATCH_FRAME_AND_PARAM_TYPES(frame_dtype, param_dtype, name, ...)                                      \
  [&] {                                                                                                               \
    const at::ScalarType edsc_frame_dtype = (frame_dtype), edsc_param_dtype = (param_dtype);                          \
    if (edsc_param_dtype == edsc_frame_dtype) {                                                                       \
      return AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, edsc_frame_dtype, name, [&] {                  \
        using param_t = scalar_t;                                                                                     \
        return __VA_ARGS__();                                                                                         \
      });                                                                                                             \
    }                                                                                                                 \
    TORCH_CHECK(                                                                                                      \
        edsc_frame_dtype == at::kFloat && (edsc_param_dtype == at::kHalf || edsc_param_dtype == at::kBFloat16), name, \
        ": no kernels for a ", edsc_frame_dtype, " frame with ", edsc_param_dtype, " per-pixel tensors");             \
    using scalar_t = float;                                                                                           \
    if (edsc_param_dtype == at::kHalf) {                                                                              \
      using param_t = at::Half;                                                                                       \
      return __VA_ARGS__();                                                                                           \
    }                                                                                                                 \
    using param_t = at::BFloat16;                                                                                     \
    return __VA_ARGS__();                                                                                             \
  }()

// Runs body.template operator()<index_t>() with 32-bit indices when every offset fits.
#define EDSC_DISPATCH_INDEX_TYPE(use_32bit, ...) \
  [&] {                                          \
    if (use_32bit) {                             \
      using index_t = int32_t;                   \
      return __VA_ARGS__();                      \
    } else {                                     \
      using index_t = int64_t;                   \
      return __VA_ARGS__();                      \
    }                                            \
  }()

}  // namespace edsc_ext
