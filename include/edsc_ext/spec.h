// What deform_sepconv accepts and how each padding mode samples, stated once: the kernels branch on
// these traits (never on a mode's name), the host checks and their messages read these tables, and
// the op edsc_ext::deform_sepconv_spec returns them to Python (edsc_ext.ops.SPEC, whence
// PADDING_MODES, MAX_KERNEL_WIDTH, MIXED_PRECISION, the ONNX export and the Python messages). Part
// of the installed C++ API (edsc_ext/edsc_ext.h takes it): plain constexpr C++ and torch's
// header-only dtypes.
#pragma once

#include <torch/headeronly/core/ScalarType.h>

#include <cstdint>

namespace edsc_ext {

// ---- Padding modes: how a sample outside the image is read

// padding_mode's integer code in the ops' schemas: the row of kPaddingModes.
enum PaddingMode : int64_t {
  kPaddingZeros = 0,
  kPaddingBorder = 1,
  kPaddingEdsc = 2,
};

// What a mode does, as the kernels see it.
struct PaddingTraits {
  // Coordinates are clamped into the image (replicate padding): only pixels inside it are read, and
  // a clamped coordinate has no offset gradient. Otherwise pixels outside the image are 0.
  bool clamps = false;
  // Along an axis, the border pixel counts twice where the coordinate lies outside
  // [-pad, size - 1 + pad), i.e. beyond the frame replicate-padded by the call's padding.
  bool doubles_border = false;
  // Tap 0 sits tap_shift(traits, K) = 1 - (K - 1) / 2 pixels from where a centred kernel's does,
  // along each axis of K taps.
  bool shifts_taps = false;
  // Calls without offsets or dilation may take the grid-tap kernels, which read each tap's pixel
  // as it is or clamped (neither a doubled border nor shifted taps).
  bool grid_taps = false;
  // The largest factor of a sample's weight (a doubled border: 2 along each axis), which bounds the
  // deterministic input gradient.
  int64_t bound_factor = 1;
};

struct PaddingModeSpec {
  const char* name;  // padding_mode in Python
  PaddingMode code;
  PaddingTraits traits;
  const char* description;
};

// Each row spells every field (nvcc's C++17 mode fills a field left out before a named one with
// zero, not its default).
inline constexpr PaddingModeSpec kPaddingModes[] = {
    {.name = "zeros",
     .code = kPaddingZeros,
     .traits = {.clamps = false, .doubles_border = false, .shifts_taps = false, .grid_taps = true, .bound_factor = 1},
     .description = "pixels outside are 0"},
    {.name = "border",
     .code = kPaddingBorder,
     .traits = {.clamps = true, .doubles_border = false, .shifts_taps = false, .grid_taps = true, .bound_factor = 1},
     .description = "coordinates are clamped into the image (replicate padding); the offset gradient is 0 where "
                    "clamped"},
    // The EDSC layer (edsc_ext.models.compat) clamps into the replicate-padded frame and adds both
    // bilinear corners, the same border pixel, at weight 1.
    {.name = "edsc",
     .code = kPaddingEdsc,
     .traits = {.clamps = true, .doubles_border = true, .shifts_taps = true, .grid_taps = false, .bound_factor = 4},
     .description = "the EDSC layer's sampling: border mode with taps moved by s = 1 - (K-1)//2 along each axis, "
                    "and the border pixel counted twice along an axis where the coordinate lies outside "
                    "[-pad, size - 1 + pad)"},
};

// The row of a padding_mode code; nullptr for a code of no mode.
constexpr const PaddingModeSpec* find_padding_mode(int64_t code) {
  for (const PaddingModeSpec& mode : kPaddingModes) {
    if (mode.code == code) return &mode;
  }
  return nullptr;
}

// Where tap 0 sits, relative to a centred kernel's, along an axis of `kernel` taps.
constexpr int64_t tap_shift(const PaddingTraits& traits, int64_t kernel) {
  return traits.shifts_taps ? 1 - (kernel - 1) / 2 : 0;
}

// ---- Dtypes: the frame's (input, output and their gradients) and the per-pixel tensors'
// (vertical, horizontal, offset, mask, offset_dx and their gradients), which share one

using SpecScalarType = torch::headeronly::ScalarType;

struct DtypePair {
  SpecScalarType frame;
  SpecScalarType per_pixel;
};

inline constexpr DtypePair kDtypePairs[] = {
    {.frame = SpecScalarType::Double, .per_pixel = SpecScalarType::Double},
    {.frame = SpecScalarType::Float, .per_pixel = SpecScalarType::Float},
    {.frame = SpecScalarType::Half, .per_pixel = SpecScalarType::Half},
    {.frame = SpecScalarType::BFloat16, .per_pixel = SpecScalarType::BFloat16},
    // Mixed precision, as autocast makes it: half-type per-pixel tensors with a float32 frame, read as
    // they are and computed in float32.
    {.frame = SpecScalarType::Float, .per_pixel = SpecScalarType::Half},
    {.frame = SpecScalarType::Float, .per_pixel = SpecScalarType::BFloat16},
};

constexpr bool accepts_dtypes(SpecScalarType frame, SpecScalarType per_pixel) {
  for (const DtypePair& pair : kDtypePairs) {
    if (pair.frame == frame && pair.per_pixel == per_pixel) return true;
  }
  return false;
}

constexpr bool accepts_frame_dtype(SpecScalarType frame) {
  for (const DtypePair& pair : kDtypePairs) {
    if (pair.frame == frame) return true;
  }
  return false;
}

// The name Python gives a dtype of the pairs (torch.float32: "float32").
constexpr const char* dtype_name(SpecScalarType dtype) {
  switch (dtype) {
    case SpecScalarType::Double:
      return "float64";
    case SpecScalarType::Float:
      return "float32";
    case SpecScalarType::Half:
      return "float16";
    case SpecScalarType::BFloat16:
      return "bfloat16";
    default:
      return "another dtype";
  }
}

// Bytes an element of a dtype of the pairs takes.
constexpr int64_t dtype_size(SpecScalarType dtype) {
  switch (dtype) {
    case SpecScalarType::Double:
      return 8;
    case SpecScalarType::Float:
      return 4;
    case SpecScalarType::Half:
    case SpecScalarType::BFloat16:
      return 2;
    default:
      return 0;
  }
}

// ---- Sizes

inline constexpr int64_t kMinKernelSize = 1;  // KH and KW
// The widest horizontal kernel (KW): the backward keeps one accumulator per horizontal tap.
inline constexpr int64_t kMaxKernelWidth = 128;
inline constexpr int64_t kMinPadding = 0;
inline constexpr int64_t kMinDilation = 1;
// The kernel size (KH = KW) the specialised kernels are compiled for: EDSC's, DSepConv's and AdaCoF's 5x5.
inline constexpr int64_t kSpecializedKernel = 5;

}  // namespace edsc_ext
