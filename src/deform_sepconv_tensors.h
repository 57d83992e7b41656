// The tensors of one deform_sepconv call and the kernel parameters made from them (stable-ABI
// tensors, edsc_ext/torch_stable.h), for the backends' host code and the kernels' units.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "deform_sepconv_pixel.h"
#include "kernel_dispatch.h"
#include "torch_stable.h"

namespace edsc_ext {

struct DeformSepconvConfig {
  int64_t kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode;
};

// Validated tensors of one call in one memory format (memory_format()): dense, except per-pixel
// tensors that a backend reads in place as views (dense_per_pixel false; see prepare_deform_sepconv).
// Absent optional tensors are nullopt (an undefined stable Tensor would be a heap-allocated
// handle, made and freed on every call); grad_output is there in a backward only.
struct DeformSepconvTensors {
  Tensor input;
  // offset_dx present: split offsets, offset holding dy and offset_dx dx (DeformSepconvParams).
  OptionalTensor vertical, horizontal, offset, mask, grad_output, offset_dx;
  int64_t height_out = 0, width_out = 0;
  // The dtype of the per-pixel tensors (vertical, horizontal, offset, mask, offset_dx), which all
  // share one: the input's, or float16 / bfloat16 with a float32 input (mixed precision). The
  // input's when none is given.
  ScalarType param_dtype = ScalarType::Undefined;
  ScalarType frame_dtype = ScalarType::Undefined;  // the input's, read once (a stable accessor is a call into torch)
  bool use_32bit_indexing = true;
  bool channels_last = false;   // the call's layout; kernels take it as KernelTypes::kChannelsLast
  bool dense_per_pixel = true;  // every present per-pixel tensor is dense in memory_format()

  MemoryFormat memory_format() const { return channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous; }
};

// The batch and pixel strides (elements) at which the kernels can read a 4-D per-pixel tensor in
// place in the call's layout: element (n, k, y, x) at n * batch + (y * W + x) * pixel + k * HW in
// NCHW (pixel 1), + k in channels_last; nullopt where its strides are of another pattern.
std::optional<PerPixelStrides<int64_t>> per_pixel_strides(const Tensor& t, bool channels_last);

// The gradients of input, vertical, horizontal, offset, mask and offset_dx (split offsets).
using DeformSepconvGrads = std::array<Tensor, 6>;
constexpr int kOffsetDxGrad = 5;

// The data pointers of a prepared call's tensors, whose dtypes prepare_deform_sepconv checked (and
// dispatch_kernel_types turned into scalar_t / param_t): untyped, since the stable typed accessors
// check the dtype again, each check a few calls into torch.
template <typename scalar_t>
const scalar_t* data_or_null(const OptionalTensor& t) {
  return t.has_value() ? static_cast<const scalar_t*>(t->const_data_ptr()) : nullptr;
}

template <typename scalar_t>
scalar_t* mutable_data_or_null(const Tensor& t) {
  return (t.defined() && t.numel() > 0) ? static_cast<scalar_t*>(t.mutable_data_ptr()) : nullptr;
}

template <typename scalar_t, typename index_t, typename param_t = scalar_t>
DeformSepconvParams<scalar_t, index_t, param_t> make_params(const DeformSepconvTensors& t,
                                                            const DeformSepconvConfig& cfg) {
  DeformSepconvParams<scalar_t, index_t, param_t> p;
  p.input = static_cast<const scalar_t*>(t.input.const_data_ptr());
  p.vertical = data_or_null<param_t>(t.vertical);
  p.horizontal = data_or_null<param_t>(t.horizontal);
  p.offset = data_or_null<param_t>(t.offset);
  p.offset_dx = data_or_null<param_t>(t.offset_dx);
  p.mask = data_or_null<param_t>(t.mask);
  const auto strides = [&](const OptionalTensor& v) {
    if (!v.has_value()) return PerPixelStrides<index_t>{0, 0};
    const PerPixelStrides<int64_t> s = per_pixel_strides(*v, t.channels_last).value();  // prepare checked it
    return PerPixelStrides<index_t>{static_cast<index_t>(s.batch), static_cast<index_t>(s.pixel)};
  };
  p.vertical_strides = strides(t.vertical);
  p.horizontal_strides = strides(t.horizontal);
  p.offset_strides = strides(t.offset);
  p.offset_dx_strides = strides(t.offset_dx);
  p.mask_strides = strides(t.mask);
  const auto sizes = t.input.sizes();
  p.batch = static_cast<index_t>(sizes[0]);
  p.channels = static_cast<index_t>(sizes[1]);
  p.height_in = static_cast<index_t>(sizes[2]);
  p.width_in = static_cast<index_t>(sizes[3]);
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

template <typename scalar_t>
DeformSepconvParamGrads<scalar_t> make_param_grads(const DeformSepconvGrads& grads) {
  return {mutable_data_or_null<scalar_t>(grads[1]), mutable_data_or_null<scalar_t>(grads[2]),
          mutable_data_or_null<scalar_t>(grads[3]), mutable_data_or_null<scalar_t>(grads[4]),
          mutable_data_or_null<scalar_t>(grads[kOffsetDxGrad])};
}

// What dispatch_kernel_types (edsc_ext/kernel_dispatch.h) reads of a prepared call.
inline KernelCall kernel_call(const DeformSepconvTensors& t, const DeformSepconvConfig& cfg) {
  return {t.frame_dtype, t.param_dtype, t.use_32bit_indexing, t.channels_last, cfg.kernel_h, cfg.kernel_w};
}

}  // namespace edsc_ext
