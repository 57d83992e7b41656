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

namespace edsc_ext {

// Whether t is dense in `format`: NCHW-contiguous, or channels_last as ATen's
// is_contiguous(ChannelsLast) decides it (dimensions of size 1 take any stride).
inline bool is_dense_in(const Tensor& t, MemoryFormat format) {
  if (format != MemoryFormat::ChannelsLast) return t.is_contiguous();
  if (t.dim() != 4) return false;
  int64_t expected = 1;
  for (const int64_t d : {1, 3, 2, 0}) {
    if (t.size(d) == 1) continue;
    if (t.stride(d) != expected) return false;
    expected *= t.size(d);
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
  STABLE_TORCH_ERROR_CODE_CHECK(torch_call_dispatcher(name, overload, stack.data(), TORCH_ABI_VERSION));
  return torch::stable::detail::to<Tensor>(stack[0]);
}

// A new tensor of t's device in `format` (dense), of t's dtype unless given.
inline Tensor empty_in(const Tensor& like, torch::headeronly::IntHeaderOnlyArrayRef sizes, MemoryFormat format,
                       std::optional<ScalarType> dtype = std::nullopt) {
  return torch::stable::empty(sizes, dtype.value_or(like.scalar_type()), std::nullopt, like.device(), std::nullopt,
                              format);
}

}  // namespace edsc_ext

#define EDSC_DISPATCH_CASE(enum_name, type, ...) \
  case ::edsc_ext::ScalarType::enum_name: {      \
    using scalar_t = type;                       \
    return __VA_ARGS__();                        \
  }
#define EDSC_DISPATCH_FLOATING_CASES(...)                 \
  EDSC_DISPATCH_CASE(Double, double, __VA_ARGS__)         \
  EDSC_DISPATCH_CASE(Float, float, __VA_ARGS__)           \
  EDSC_DISPATCH_CASE(Half, ::edsc_ext::Half, __VA_ARGS__) \
  EDSC_DISPATCH_CASE(BFloat16, ::edsc_ext::BFloat16, __VA_ARGS__)
#define EDSC_DISPATCH_FAIL(dtype, name) \
  default:                              \
    throw std::runtime_error(::edsc_ext::message(name, ": no kernels for dtype ", dtype));

// Runs `body` (a lambda) with scalar_t the C++ type of one of the four floating dtypes; any other
// dtype is an error naming `name`.
#define EDSC_DISPATCH_FLOATING_TYPES(dtype, name, ...) \
  [&] {                                                \
    switch (dtype) {                                   \
      EDSC_DISPATCH_FLOATING_CASES(__VA_ARGS__)        \
      EDSC_DISPATCH_FAIL(dtype, name)                  \
    }                                                  \
  }()

// The same for the floating and the integer dtypes (vector_add).
#define EDSC_DISPATCH_ALL_TYPES(dtype, name, ...)     \
  [&] {                                               \
    switch (dtype) {                                  \
      EDSC_DISPATCH_FLOATING_CASES(__VA_ARGS__)       \
      EDSC_DISPATCH_CASE(Byte, uint8_t, __VA_ARGS__)  \
      EDSC_DISPATCH_CASE(Char, int8_t, __VA_ARGS__)   \
      EDSC_DISPATCH_CASE(Short, int16_t, __VA_ARGS__) \
      EDSC_DISPATCH_CASE(Int, int32_t, __VA_ARGS__)   \
      EDSC_DISPATCH_CASE(Long, int64_t, __VA_ARGS__)  \
      EDSC_DISPATCH_FAIL(dtype, name)                 \
    }                                                 \
  }()
