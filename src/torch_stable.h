// The part of torch the extension's host code uses, all through the LibTorch stable ABI
// (torch/csrc/stable, torch/headeronly): one binary runs with every torch from the floor the build
// targets (TORCH_TARGET_VERSION, set by edsc_ext/_build_support.py: STABLE_ABI_FLOOR) on. Every
// translation unit takes torch through this header, so what the binary needs from torch is here.
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/MemoryFormat.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

// glibc 2.34 moved dlsym (which torch's stable headers and cuda_host.cuh call) into libc under a new
// symbol version; a build on a newer glibc would reference that one and the wheel would not be
// manylinux_2_28. Every glibc still exports the original version: bind to it.
#if defined(__GLIBC__)  // set by the C++ headers above
#if defined(__x86_64__)
__asm__(".symver dlsym,dlsym@GLIBC_2.2.5");
#elif defined(__aarch64__)
__asm__(".symver dlsym,dlsym@GLIBC_2.17");
#endif
#endif

namespace edsc_ext {

using Tensor = torch::stable::Tensor;
using OptionalTensor = std::optional<Tensor>;
using ScalarType = torch::headeronly::ScalarType;
using MemoryFormat = torch::headeronly::MemoryFormat;
using Half = c10::Half;
using BFloat16 = c10::BFloat16;

// The type a kernel accumulates scalar_t in (ATen's opmath_type): float for the 16-bit floats.
template <typename scalar_t>
struct OpMath {
  using type = scalar_t;
};
template <>
struct OpMath<Half> {
  using type = float;
};
template <>
struct OpMath<BFloat16> {
  using type = float;
};
template <typename scalar_t>
using opmath_t = typename OpMath<scalar_t>::type;

template <typename T>
constexpr ScalarType scalar_type_of() {
  return c10::CppTypeToScalarType<T>::value;
}

// A tensor's shape as torch prints it, "[2, 3, 4, 4]", for messages.
struct ShapeOf {
  const Tensor& t;
};
inline std::ostream& operator<<(std::ostream& out, const ShapeOf& s) {
  out << '[';
  for (int64_t d = 0; d < s.t.dim(); ++d) out << (d ? ", " : "") << s.t.size(d);
  return out << ']';
}

// A tensor's device as torch prints it, "cpu" or "cuda:0", for messages.
struct DeviceOf {
  const Tensor& t;
};
inline std::ostream& operator<<(std::ostream& out, const DeviceOf& d) {
  if (d.t.is_cpu()) return out << "cpu";
  if (d.t.is_cuda()) return out << "cuda:" << static_cast<int>(d.t.get_device_index());
  return out << "device type " << static_cast<int>(d.t.device().type());
}

template <typename... Parts>
std::string message(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// `text` as a JSON string (the describing ops return JSON: deform_sepconv_spec, kernel_policy_switches).
inline std::string json_string(const std::string& text) {
  std::string quoted = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

}  // namespace edsc_ext

#define EDSC_EXT_STRINGIFY_(...) #__VA_ARGS__
#define EDSC_EXT_STRINGIFY(...) EDSC_EXT_STRINGIFY_(__VA_ARGS__)

// Throws the message (its parts streamed together) when cond is false. Through the stable ABI
// every C++ exception reaches Python as a RuntimeError (the Python layer raises the ValueError /
// TypeError of a bad argument before calling the ops); the message names the argument, the
// expected and the actual.
#define EDSC_CHECK(cond, ...)                                     \
  do {                                                            \
    if (!(cond)) [[unlikely]]                                     \
      throw std::runtime_error(::edsc_ext::message(__VA_ARGS__)); \
  } while (false)

// Checks a shim call's error code, with torch's message where the headers can fetch it (torch 2.13
// added STABLE_TORCH_ERROR_CODE_CHECK; 2.10-2.12 have only TORCH_ERROR_CODE_CHECK).
#ifdef STABLE_TORCH_ERROR_CODE_CHECK
#define EDSC_SHIM_CHECK(call) STABLE_TORCH_ERROR_CODE_CHECK(call)
#else
#define EDSC_SHIM_CHECK(call) TORCH_ERROR_CODE_CHECK(call)
#endif

namespace edsc_ext {

// Whether t is dense in `format`: NCHW-contiguous, or channels_last as ATen's
// is_contiguous(ChannelsLast) decides it (dimensions of size 1 take any stride).
inline bool is_dense_in(const Tensor& t, MemoryFormat format) {
  if (format != MemoryFormat::ChannelsLast) return t.is_contiguous();
  if (t.dim() != 4) return false;
  const auto sizes = t.sizes(), strides = t.strides();  // one shim call each, not one a dimension
  int64_t expected = 1;
  for (const int64_t d : {1, 3, 2, 0}) {
    if (sizes[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

// t itself when it is dense in `format`, else a dense copy (ATen's Tensor::contiguous; the stable
// op always goes through the dispatcher, which a tensor already in place should not cost).
inline Tensor contiguous_in(const Tensor& t, MemoryFormat format = MemoryFormat::Contiguous) {
  return is_dense_in(t, format) ? t : torch::stable::contiguous(t, format);
}

// Any ATen operator by name, for the few the stable headers do not wrap (their arguments: tensors,
// ints, doubles, bools, dtypes, lists of those; not Scalars). Returns its first output.
template <typename... Args>
Tensor call_aten(const char* name, const char* overload, const Args&... args) {
  std::array<StableIValue, std::max<size_t>(sizeof...(Args), 1)> stack{torch::stable::detail::from(args)...};
  EDSC_SHIM_CHECK(torch_call_dispatcher(name, overload, stack.data(), TORCH_ABI_VERSION));
  return torch::stable::detail::to<Tensor>(stack[0]);
}

// The strides of a dense tensor of `sizes` in `format`, as ATen's empty(..., memory_format) makes
// them (channels_last: get_channels_last_strides_2d; contiguous: sizes of 0 count as 1).
inline std::array<int64_t, 4> dense_strides(torch::headeronly::IntHeaderOnlyArrayRef sizes, MemoryFormat format) {
  std::array<int64_t, 4> strides{};
  if (format == MemoryFormat::ChannelsLast) {
    strides[1] = 1;
    strides[3] = sizes[1];
    strides[2] = strides[3] * sizes[3];
    strides[0] = strides[2] * sizes[2];
    return strides;
  }
  int64_t stride = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= std::max<int64_t>(sizes[d], 1);
  }
  return strides;
}

// A new tensor of `like`'s device in `format` (dense; sizes of at most 4 dimensions, 4 for
// channels_last), of like's dtype unless given. Through the shim's empty_strided, a direct call
// into ATen: torch::stable::empty goes through the boxed dispatcher (an operator looked up by name,
// its arguments boxed), about 1 µs a tensor, which on a small call is most of the op's overhead.
inline Tensor empty_in(const Tensor& like, torch::headeronly::IntHeaderOnlyArrayRef sizes, MemoryFormat format,
                       std::optional<ScalarType> dtype = std::nullopt) {
  EDSC_CHECK(sizes.size() <= 4 && (format != MemoryFormat::ChannelsLast || sizes.size() == 4),
             "empty_in: unsupported sizes for this memory format");
  const std::array<int64_t, 4> strides = dense_strides(sizes, format);
  int32_t dtype_code = 0, device_type = 0, device_index = 0;
  if (dtype.has_value()) {
    dtype_code = torch::stable::detail::to<int32_t>(torch::stable::detail::from(*dtype));
  } else {
    EDSC_SHIM_CHECK(aoti_torch_get_dtype(like.get(), &dtype_code));
  }
  EDSC_SHIM_CHECK(aoti_torch_get_device_type(like.get(), &device_type));
  EDSC_SHIM_CHECK(aoti_torch_get_device_index(like.get(), &device_index));
  AtenTensorHandle handle = nullptr;
  EDSC_SHIM_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(), dtype_code,
                                           device_type, device_index, &handle));
  return Tensor(handle);
}

// A dense copy of t in `format` with dtype `dtype` (the values rounded where it is narrower), through the
// shim's direct copy_.
inline Tensor converted(const Tensor& t, ScalarType dtype, MemoryFormat format) {
  Tensor out = empty_in(t, t.sizes(), format, dtype);
  EDSC_SHIM_CHECK(aoti_torch_copy_(out.get(), t.get(), /*non_blocking=*/0));
  return out;
}

// Fills t with zeros, through the shim's direct call (torch::stable::zero_ goes through the boxed
// dispatcher, see empty_in).
inline void fill_zeros(Tensor& t) { EDSC_SHIM_CHECK(aoti_torch_zero_(t.get())); }

// empty_in, zero-filled.
inline Tensor zeros_in(const Tensor& like, torch::headeronly::IntHeaderOnlyArrayRef sizes, MemoryFormat format,
                       std::optional<ScalarType> dtype = std::nullopt) {
  Tensor t = empty_in(like, sizes, format, dtype);
  fill_zeros(t);
  return t;
}

}  // namespace edsc_ext
