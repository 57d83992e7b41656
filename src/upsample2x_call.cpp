// upsample_bilinear2x's host side shared by both backends (see upsample2x_call.h).
#include "upsample2x_call.h"

#include <limits>

namespace edsc_ext {
namespace {

// F.interpolate's output format for this input: channels_last where the strides run in channels_last order
// (ATen's is_channels_last_strides_2d, which suggest_memory_format reads), dense or not (a channel slice).
bool channels_last_order(const Tensor& t) {
  const auto sizes = t.sizes(), strides = t.strides();
  if (strides[1] == 0) return false;
  int64_t least = 0;
  for (const int64_t d : {1, 3, 2, 0}) {
    if (sizes[d] == 0 || strides[d] < least || (d == 0 && least == strides[1])) return false;
    least = strides[d] * (sizes[d] > 1 ? sizes[d] : 1);
  }
  return true;
}

}  // namespace

Upsample2xCall prepare_upsample2x(const Tensor& input) {
  EDSC_CHECK(input.dim() == 4, "upsample_bilinear2x: input must be 4-D (N, C, H, W), got shape ", ShapeOf{input});
  const ScalarType dtype = input.scalar_type();
  // The spec's frame dtypes, each of which has its same-dtype pair, which the kernels' dispatch takes.
  EDSC_CHECK(accepts_frame_dtype(dtype),
             "upsample_bilinear2x: input must be float64, float32, float16 or bfloat16, got ", dtype);
  Upsample2xCall call;
  call.batch = input.size(0);
  call.channels = input.size(1);
  call.height = input.size(2);
  call.width = input.size(3);
  EDSC_CHECK(call.height >= 1 && call.width >= 1,
             "upsample_bilinear2x: input's height and width must be at least 1, got shape ", ShapeOf{input});
  // The kernels index an output row's values and the rows of all images with 32-bit integers.
  constexpr int64_t kLimit = std::numeric_limits<int32_t>::max();
  EDSC_CHECK(call.batch * call.channels * 2 * call.height <= kLimit && 2 * call.width * call.channels <= kLimit,
             "upsample_bilinear2x: input of shape ", ShapeOf{input},
             " is too large (at most 2^31 - 1 output rows in all, and values in one row)");
  call.format = channels_last_order(input) ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  call.input = contiguous_in(input, call.format);
  const int64_t sizes[4] = {call.batch, call.channels, 2 * call.height, 2 * call.width};
  call.output = empty_in(input, sizes, call.format);
  call.facts.frame_dtype = call.facts.param_dtype = dtype;
  return call;
}

}  // namespace edsc_ext
