// Host-side declarations shared by the op registration and the CPU/CUDA backends (the kernels'
// units take edsc_ext/deform_sepconv_tensors.h).
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "deform_sepconv_tensors.h"

namespace edsc_ext {

// Checks what memory safety depends on (the Python layer gives the friendlier messages first)
// and makes every tensor dense in the call's memory format: channels_last when the input is
// (wants_channels_last), NCHW-contiguous otherwise; a tensor already so is not copied.
// A forward (no grad_output) keeps a per-pixel tensor whose strides the kernels can follow
// (per_pixel_strides: a channel slice of a wider tensor, an expanded one) as it is: both backends'
// forward planners send such calls to kernels that take PerPixelStrides. A backward (grad_output
// given, and checked) makes them dense, since its gradients share the values' indexing.
// With offset_dx (split offsets), offset and offset_dx are the dy and dx of every tap, (N, KH*KW, H_out, W_out) each;
// else offset is (N, 2*KH*KW, H_out, W_out).
DeformSepconvTensors prepare_deform_sepconv(const Tensor& input, const OptionalTensor& vertical,
                                            const OptionalTensor& horizontal, const OptionalTensor& offset,
                                            const OptionalTensor& mask, const DeformSepconvConfig& cfg,
                                            const Tensor* grad_output = nullptr,
                                            const OptionalTensor& offset_dx = std::nullopt);

// What the backward op returns: DeformSepconvGrads as a tuple.
using DeformSepconvBackwardResult = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
inline DeformSepconvBackwardResult backward_result(DeformSepconvGrads g) {
  return {std::move(g[0]), std::move(g[1]), std::move(g[2]), std::move(g[3]), std::move(g[4]), std::move(g[5])};
}

// Allocates the gradient outputs in the call's memory format: zero-filled where requested (the
// input gradient is accumulated into), a 0-element tensor where not. output_mask[3] asks for both
// offset gradients of split offsets.
DeformSepconvGrads allocate_deform_sepconv_grads(const DeformSepconvTensors& t, const std::array<bool, 5>& output_mask);

// A channels_last input (and not also contiguous) makes the call channels_last: its output and
// gradients come back in channels_last, as PyTorch's own convolutions do. edsc_ext/ops.py's fake
// kernels apply the same rule.
bool wants_channels_last(const Tensor& input);

// The backward op's bool[5] output_mask (input, vertical, horizontal, offset, mask), checked.
std::array<bool, 5> output_mask_array(const std::vector<bool>& mask);

}  // namespace edsc_ext
