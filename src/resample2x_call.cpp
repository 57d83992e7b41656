// The 2x resampling ops' host side shared by both backends (see resample2x_call.h).
#include "resample2x_call.h"

#include <algorithm>
#include <limits>

namespace edsc_ext {
namespace {

// ATen's output format for this input: channels_last where the strides run in channels_last order
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

Resample2xCall prepare_resample2x(const Tensor& input, Resample2x op) {
  const bool pool = op == Resample2x::kAvgPool;
  const char* name = pool ? "avg_pool2x" : "upsample_bilinear2x";
  EDSC_CHECK(input.dim() == 4, name, ": input must be 4-D (N, C, H, W), got shape ", ShapeOf{input});
  const ScalarType dtype = input.scalar_type();
  // The spec's frame dtypes, each of which has its same-dtype pair, which the kernels' dispatch takes.
  EDSC_CHECK(accepts_frame_dtype(dtype), name, ": input must be float64, float32, float16 or bfloat16, got ", dtype);
  Resample2xCall call;
  call.batch = input.size(0);
  call.channels = input.size(1);
  call.height = input.size(2);
  call.width = input.size(3);
  const int64_t least = pool ? 2 : 1;
  EDSC_CHECK(call.height >= least && call.width >= least, name, ": input's height and width must be at least ", least,
             ", got shape ", ShapeOf{input});
  const int64_t out_h = pool ? call.height / 2 : 2 * call.height, out_w = pool ? call.width / 2 : 2 * call.width;
  // The kernels index the output rows of all images and the values of one row with 32-bit integers.
  constexpr int64_t kLimit = std::numeric_limits<int32_t>::max();
  EDSC_CHECK(call.batch * call.channels * std::max(out_h, call.height) <= kLimit &&
                 std::max(out_w, call.width) * call.channels <= kLimit,
             name, ": input of shape ", ShapeOf{input},
             " is too large (at most 2^31 - 1 rows in all, and values in one row)");
  call.format = channels_last_order(input) ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  call.input = contiguous_in(input, call.format);
  const int64_t sizes[4] = {call.batch, call.channels, out_h, out_w};
  call.output = empty_in(input, sizes, call.format);
  call.facts.frame_dtype = call.facts.param_dtype = dtype;
  return call;
}

}  // namespace edsc_ext
