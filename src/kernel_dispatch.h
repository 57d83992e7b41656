// The one dispatch helper of the host code: dispatch_kernel_types turns a call's run-time facts
// (KernelCall: dtypes, index width, layout, kernel size) into the compile-time KernelTypes a kernel
// is instantiated for, along the axes a launcher names, and calls the launcher's body with it. The
// body reads what it needs from that type by name (typename K::scalar_t, K::kChannelsLast, ...):
// nothing is defined behind its back, and an axis it did not ask for is void or absent, so using it
// does not compile. A call outside the axes' range is an error naming the launcher and the fact.
//
//   dispatch_kernel_types<KernelTypes<>, dispatch_axis::FrameAndParamTypes, dispatch_axis::IndexWidth,
//                         dispatch_axis::Layout>(kernel_call(t, cfg), "deform_sepconv_forward_cpu",
//                         [&](auto k) { using K = std::decay_t<decltype(k)>; ... });
#pragma once

#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "torch_stable.h"

namespace edsc_ext {

// What dispatch_kernel_types reads of a call.
struct KernelCall {
  ScalarType frame_dtype = ScalarType::Undefined;
  ScalarType param_dtype = ScalarType::Undefined;  // the per-pixel tensors' (DeformSepconvTensors::param_dtype)
  bool use_32bit_indexing = false;
  bool channels_last = false;
  int64_t kernel_h = 0, kernel_w = 0;
};

namespace dispatch_detail {
template <typename scalar_t>
struct AccumulatorOf {
  using type = opmath_t<scalar_t>;
};
template <>
struct AccumulatorOf<void> {
  using type = void;
};
// The layout and kernel-size members exist once their axis is dispatched: a body that reads one it
// did not ask for does not compile.
template <int kLayout>
struct LayoutMember {
  static constexpr bool kChannelsLast = kLayout == 1;
};
template <>
struct LayoutMember<-1> {};
template <int kH, int kW>
struct KernelSizeMembers {
  static constexpr int kKernelH = kH;  // 0: the run-time size
  static constexpr int kKernelW = kW;
};
template <>
struct KernelSizeMembers<-1, -1> {};
}  // namespace dispatch_detail

// A kernel instantiation's compile-time facts. Each axis dispatched sets its members; the types of
// the others are void, their constants absent. kKernelH = kKernelW = 0 is the run-time kernel size.
template <typename Scalar = void, typename Param = void, typename Index = void, int kLayout = -1,
          int kStaticKernelH = -1, int kStaticKernelW = -1>
struct KernelTypes : dispatch_detail::LayoutMember<kLayout>,
                     dispatch_detail::KernelSizeMembers<kStaticKernelH, kStaticKernelW> {
  using scalar_t = Scalar;  // the frame's (input, output, grad_output)
  using param_t = Param;    // the per-pixel tensors'
  using acc_t = typename dispatch_detail::AccumulatorOf<Scalar>::type;
  using index_t = Index;

  template <typename S, typename P>
  using WithTypes = KernelTypes<S, P, Index, kLayout, kStaticKernelH, kStaticKernelW>;
  template <typename I>
  using WithIndex = KernelTypes<Scalar, Param, I, kLayout, kStaticKernelH, kStaticKernelW>;
  template <bool kCL>
  using WithLayout = KernelTypes<Scalar, Param, Index, kCL ? 1 : 0, kStaticKernelH, kStaticKernelW>;
  template <int kH, int kW>
  using WithKernelSize = KernelTypes<Scalar, Param, Index, kLayout, kH, kW>;
};

// The axes. Each has apply<K>(call, name, next), which calls next(K') with K' = K and its axis set.
namespace dispatch_axis {

[[noreturn]] inline void no_kernels(const char* name, const KernelCall& call) {
  if (call.param_dtype == call.frame_dtype)
    throw std::runtime_error(message(name, ": no kernels for dtype ", call.frame_dtype));
  throw std::runtime_error(
      message(name, ": no kernels for a ", call.frame_dtype, " frame with ", call.param_dtype, " per-pixel tensors"));
}

// scalar_t and param_t: one of the floating dtypes for both (those of kDouble, kFloat, kHalves: float64,
// float32, float16 and bfloat16), or (kMixed) a float32 frame with float16 / bfloat16 per-pixel
// tensors, the only mixture prepare_deform_sepconv allows. A family's planner keeps the other calls
// away; one that reaches it anyway is an error, never a misread pointer.
template <bool kDouble, bool kFloat, bool kHalves, bool kMixed>
struct FloatingTypes {
  template <typename K, typename Next>
  static void apply(const KernelCall& call, const char* name, Next&& next) {
    const ScalarType frame = call.frame_dtype, param = call.param_dtype;
    if (param == frame) {
      switch (frame) {
        case ScalarType::Double:
          if constexpr (kDouble) return next(typename K::template WithTypes<double, double>{});
          break;
        case ScalarType::Float:
          if constexpr (kFloat) return next(typename K::template WithTypes<float, float>{});
          break;
        case ScalarType::Half:
          if constexpr (kHalves) return next(typename K::template WithTypes<Half, Half>{});
          break;
        case ScalarType::BFloat16:
          if constexpr (kHalves) return next(typename K::template WithTypes<BFloat16, BFloat16>{});
          break;
        default:
          break;
      }
    } else if constexpr (kMixed) {
      if (frame == ScalarType::Float && param == ScalarType::Half) {
        return next(typename K::template WithTypes<float, Half>{});
      }
      if (frame == ScalarType::Float && param == ScalarType::BFloat16) {
        return next(typename K::template WithTypes<float, BFloat16>{});
      }
    }
    no_kernels(name, call);
  }
};
// Every pair prepare_deform_sepconv allows.
using FrameAndParamTypes = FloatingTypes<true, true, true, true>;
// Elements of at most 4 bytes, per-pixel tensors in the frame's dtype (the grid-tap and lane-pair kernels).
using UpTo4ByteTypes = FloatingTypes<false, true, true, false>;
// The 2-byte types, per-pixel tensors in the frame's dtype (the staged forward).
using TwoByteTypes = FloatingTypes<false, false, true, false>;

// scalar_t (= param_t) for the floating and the integer dtypes (vector_add).
struct AllTypes {
  template <typename K, typename Next>
  static void apply(const KernelCall& call, const char* name, Next&& next) {
    switch (call.frame_dtype) {
      case ScalarType::Byte:
        return next(typename K::template WithTypes<uint8_t, uint8_t>{});
      case ScalarType::Char:
        return next(typename K::template WithTypes<int8_t, int8_t>{});
      case ScalarType::Short:
        return next(typename K::template WithTypes<int16_t, int16_t>{});
      case ScalarType::Int:
        return next(typename K::template WithTypes<int32_t, int32_t>{});
      case ScalarType::Long:
        return next(typename K::template WithTypes<int64_t, int64_t>{});
      default:
        return FloatingTypes<true, true, true, false>::template apply<K>(call, name, std::forward<Next>(next));
    }
  }
};

// index_t: int32_t where every offset of the call fits, else int64_t.
struct IndexWidth {
  template <typename K, typename Next>
  static void apply(const KernelCall& call, const char*, Next&& next) {
    if (call.use_32bit_indexing) return next(typename K::template WithIndex<int32_t>{});
    return next(typename K::template WithIndex<int64_t>{});
  }
};

// index_t fixed, whatever the call allows (kernels that take 64-bit indices only, or 32-bit ones
// only, which their planner checked).
template <typename Index>
struct FixedIndex {
  template <typename K, typename Next>
  static void apply(const KernelCall&, const char*, Next&& next) {
    return next(typename K::template WithIndex<Index>{});
  }
};

// kChannelsLast: the call's layout.
struct Layout {
  template <typename K, typename Next>
  static void apply(const KernelCall& call, const char*, Next&& next) {
    if (call.channels_last) return next(typename K::template WithLayout<true>{});
    return next(typename K::template WithLayout<false>{});
  }
};

// kKernelH, kKernelW: a compile-time 5x5 (EDSC, DSepConv, AdaCoF) where the call's kernel is,
// 0 (run-time sizes) otherwise. kOnlyWith32bitIndex (after IndexWidth): calls with 64-bit
// indices take the run-time sizes (each static variant is another compile of every kernel).
template <bool kOnlyWith32bitIndex = false>
struct KernelSize5x5 {
  template <typename K, typename Next>
  static void apply(const KernelCall& call, const char*, Next&& next) {
    constexpr bool kStatic = !kOnlyWith32bitIndex || std::is_same_v<typename K::index_t, int32_t>;
    if constexpr (kStatic) {
      if (call.kernel_h == 5 && call.kernel_w == 5) return next(typename K::template WithKernelSize<5, 5>{});
    }
    return next(typename K::template WithKernelSize<0, 0>{});
  }
};

}  // namespace dispatch_axis

namespace dispatch_detail {
template <typename K, typename Body>
void apply_axes(const KernelCall&, const char*, Body& body) {
  body(K{});
}
template <typename K, typename Axis, typename... Rest, typename Body>
void apply_axes(const KernelCall& call, const char* name, Body& body) {
  Axis::template apply<K>(call, name,
                          [&](auto k) { apply_axes<std::decay_t<decltype(k)>, Rest...>(call, name, body); });
}
}  // namespace dispatch_detail

// Calls body(K{}) once, with K = Seed and each of Axes set from `call` (in order: an axis may read
// those before it). `name` (the launcher's) goes into the error for a call no instantiation takes.
template <typename Seed, typename... Axes, typename Body>
void dispatch_kernel_types(const KernelCall& call, const char* name, Body&& body) {
  dispatch_detail::apply_axes<Seed, Axes...>(call, name, body);
}

}  // namespace edsc_ext
