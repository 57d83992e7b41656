// What deform_sepconv accepts: the padding modes and the kernel-size limits.
#pragma once

#include <cstdint>

namespace edsc_ext {

// The widest horizontal kernel (KW) the ops take: the backward keeps one accumulator per horizontal
// tap; edsc_ext/ops.py has the same bound.
constexpr int64_t kMaxKernelWidth = 128;

// Integer codes of padding_mode; edsc_ext/ops.py (PADDING_MODES) holds the names.
enum PaddingMode : int64_t {
  kPaddingZeros = 0,   // outside pixels are 0
  kPaddingBorder = 1,  // coordinates clamped into the image (replicate padding)
  // The EDSC layer's sampling (edsc_ext/compat.py): border mode, except that a coordinate beyond
  // the frame replicate-padded by the call's padding counts the border pixel twice along that axis.
  // Its tap origin shift (edsc_tap_shift) is applied where the kernel parameters are made.
  kPaddingEdsc = 2,
};

}  // namespace edsc_ext
