// The C++ API of edsc_ext for programs built with LibTorch (CMake: find_package(edsc_ext), target
// edsc_ext::ops): the ops as typed functions, called through torch's dispatcher, so CPU and CUDA
// tensors both work and nothing of the library's internals is needed. The library registers the ops
// when it is loaded (linking edsc_ext::ops does that). The arguments are the Python op's
// (torch.ops.edsc_ext.*; edsc_ext.deform_sepconv documents them): padding_mode one of
// edsc_ext::PaddingMode; what the op accepts (dtypes, sizes, each mode's traits) is edsc_ext/spec.h.
// This header and spec.h are the installed API. No autocast kernel is registered (the stable ABI
// cannot redispatch past one: README "Autocast"): under autocast, pass the dtypes spec.h's
// kDtypePairs lists.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <array>
#include <cstdint>
#include <optional>
#include <tuple>

#include "edsc_ext/spec.h"  // PaddingMode (kPaddingZeros, kPaddingBorder, kPaddingEdsc), kMaxKernelWidth, ...

namespace edsc_ext {

using OptionalAtTensor = std::optional<at::Tensor>;

// Bilinear samples of `input` at each output pixel's taps (offsets when given), weighted by the
// per-pixel separable kernels (vertical (N, KH, H_out, W_out), horizontal (N, KW, ...)) and mask.
inline at::Tensor deform_sepconv_forward(const at::Tensor& input, const OptionalAtTensor& vertical,
                                         const OptionalAtTensor& horizontal, const OptionalAtTensor& offset,
                                         const OptionalAtTensor& mask, int64_t kernel_h, int64_t kernel_w,
                                         int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w,
                                         int64_t padding_mode, const OptionalAtTensor& offset_dx = std::nullopt) {
  // The op's C++ signature is this function's.
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("edsc_ext::deform_sepconv_forward", "")
                             .typed<decltype(deform_sepconv_forward)>();
  return op.call(input, vertical, horizontal, offset, mask, kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w,
                 padding_mode, offset_dx);
}

// The gradients of input, vertical, horizontal, offset, mask and offset_dx that output_mask asks
// for (0-element tensors for the others); deterministic: the CUDA input gradient in fixed point.
using DeformSepconvBackwardAt = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
inline DeformSepconvBackwardAt deform_sepconv_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const OptionalAtTensor& vertical,
    const OptionalAtTensor& horizontal, const OptionalAtTensor& offset, const OptionalAtTensor& mask, int64_t kernel_h,
    int64_t kernel_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t padding_mode,
    std::array<bool, 5> output_mask, const OptionalAtTensor& offset_dx = std::nullopt, bool deterministic = false) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("edsc_ext::deform_sepconv_backward", "")
                             .typed<decltype(deform_sepconv_backward)>();
  return op.call(grad_output, input, vertical, horizontal, offset, mask, kernel_h, kernel_w, pad_h, pad_w, dilation_h,
                 dilation_w, padding_mode, output_mask, offset_dx, deterministic);
}

}  // namespace edsc_ext
