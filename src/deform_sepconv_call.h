// One deform_sepconv call on the host, from the op's arguments to a kernel's instantiation:
// - DeformSepconvArgs: the op's arguments by the schemas' names (src/registration.cpp unboxes them);
// - prepare(): checks them and returns the call, DeformSepconvCall: its tensors in one memory format
//   and its facts (CallFacts), from which the planners (src/cpu/cpu_plan.h, src/cuda/cuda_plan.h)
//   choose the kernels and the dispatch below instantiates them;
// - dispatch_kernel_types: the one dispatch from a call's facts (and a plan's variant row) to the
//   compile-time KernelTypes a kernel is instantiated for, and make_params, the kernel parameters.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "edsc_ext/spec.h"
#include "kernel_policy.h"
#include "sampling.h"  // DeformSepconvParams, PerPixelStrides
#include "torch_stable.h"

namespace edsc_ext {

// ---- The op's arguments

// deform_sepconv_forward's arguments by name; a backward's (and the plan op's) also grad_output,
// output_mask and deterministic. References to the unboxed arguments, valid during the call.
struct DeformSepconvArgs {
  const Tensor& input;
  const OptionalTensor& vertical;
  const OptionalTensor& horizontal;
  const OptionalTensor& offset;
  const OptionalTensor& mask;
  int64_t kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode;
  // Split offsets: offset holds the dy of every tap, (N, KH*KW, H_out, W_out), and this the dx.
  const OptionalTensor& offset_dx;
  // A backward's: the output's gradient (nullptr in a forward); the gradients asked for (input,
  // vertical, horizontal, offset, mask; offset's asks for offset_dx's too); whether the input
  // gradient must be deterministic (torch.are_deterministic_algorithms_enabled(), which the stable
  // ABI does not expose to C++: edsc_ext/ops.py passes it).
  const Tensor* grad_output = nullptr;
  std::array<bool, 5> output_mask{};
  bool deterministic = false;
};

// ---- The call

// The facts of one prepared call: plain values, so that a plan can be made for any call, also for a
// CUDA device on a machine without one (edsc_ext._plan, tests/test_plans.py).
struct CallFacts {
  // The geometry as given, and the padding mode's traits (edsc_ext/spec.h).
  int64_t kernel_h = 0, kernel_w = 0, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
  PaddingTraits padding{};
  PaddingMode padding_mode = kPaddingZeros;  // the mode's code (the kernels compiled per mode take it)
  int64_t batch = 0, channels = 0, height_in = 0, width_in = 0, height_out = 0, width_out = 0;
  // The frame's dtype (input, output, grad_output) and the per-pixel tensors' (all of vertical,
  // horizontal, offset, mask and offset_dx share one; the frame's when none is given): a pair of
  // edsc_ext/spec.h's kDtypePairs. The sizes in bytes of their elements.
  ScalarType frame_dtype = ScalarType::Undefined, param_dtype = ScalarType::Undefined;
  int64_t element_size = 4, param_element_size = 4;
  // The call's layout: channels_last where the input is (wants_channels_last), else NCHW; the kernels
  // take it as K::kChannelsLast.
  bool channels_last = false;
  bool use_32bit_indexing = true;  // every element offset and coordinate term fits int32_t
  bool has_vertical = false, has_horizontal = false, has_offset = false, has_mask = false;
  // The offsets come as two tensors, dy and dx (DeformSepconvParams::offset_dx): only the kernels
  // that read offsets through GlobalPixelValues take them.
  bool split_offsets = false;
  // Every present per-pixel tensor is dense in the call's layout; else some are views read in place
  // (a forward's), which only kernels taking PerPixelStrides read.
  bool dense_per_pixel = true;
  // The largest of 16, 8, 4, 2, 1 that every present per-pixel tensor's start address is a multiple
  // of; the same of the input, and of grad_output (a backward's; 16 where there is none).
  int64_t per_pixel_alignment = 16, input_alignment = 16, grad_output_alignment = 16;
  bool offset_pairs_aligned = true;  // the offset tensor (when present) starts on a (dy, dx) pair
  // The gradients the backward computes: requested (output_mask) and of a present tensor with
  // elements, in the order input, vertical, horizontal, offset, mask.
  std::array<bool, 5> grads{};
  bool deterministic = false;  // the input gradient in fixed point (CUDA)

  int64_t output_pixels() const { return batch * height_out * width_out; }
  bool input_grad() const { return grads[0]; }
  bool any_per_pixel_grad() const { return grads[1] || grads[2] || grads[3] || grads[4]; }
  bool square_kernel(int64_t k) const { return kernel_h == k && kernel_w == k; }
  // Per-pixel tensors in float16 / bfloat16 with a float32 frame: only the kernels that read them
  // through GlobalPixelValues (src/sampling.h) take such calls.
  bool mixed_precision() const { return param_element_size != element_size; }
  MemoryFormat memory_format() const { return channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous; }
};

// A prepared call: its tensors, checked and in the call's memory format (dense, except the
// per-pixel tensors a forward reads in place as views: facts.dense_per_pixel false), and its facts.
// Absent optional tensors are nullopt (an undefined stable Tensor would be a handle allocated and
// freed on every call); grad_output is there in a backward only.
struct DeformSepconvCall {
  Tensor input;
  OptionalTensor vertical, horizontal, offset, mask, offset_dx, grad_output;
  CallFacts facts;
};

// The arguments `a` with other tensors: the same geometry, padding mode and backward flags.
inline DeformSepconvArgs with_tensors(const DeformSepconvArgs& a, const Tensor& input, const OptionalTensor& vertical,
                                      const OptionalTensor& horizontal, const OptionalTensor& offset,
                                      const OptionalTensor& mask, const OptionalTensor& offset_dx,
                                      const Tensor* grad_output) {
  return {.input = input,
          .vertical = vertical,
          .horizontal = horizontal,
          .offset = offset,
          .mask = mask,
          .kernel_h = a.kernel_h,
          .kernel_w = a.kernel_w,
          .pad_h = a.pad_h,
          .pad_w = a.pad_w,
          .dilation_h = a.dilation_h,
          .dilation_w = a.dilation_w,
          .padding_mode = a.padding_mode,
          .offset_dx = offset_dx,
          .grad_output = grad_output,
          .output_mask = a.output_mask,
          .deterministic = a.deterministic};
}

// The prepared call with another frame (input) and, a backward's, grad_output: the CPU runs its 16-bit
// calls on float32 copies of them (cpu_plan.h: takes_float32_frame). The per-pixel tensors are the
// prepared ones (checked, in the call's layout), so preparing this call copies none of them again.
inline DeformSepconvArgs with_frame(const DeformSepconvArgs& a, const DeformSepconvCall& prepared, const Tensor& input,
                                    const Tensor* grad_output) {
  return with_tensors(a, input, prepared.vertical, prepared.horizontal, prepared.offset, prepared.mask,
                      prepared.offset_dx, grad_output);
}

// Checks what memory safety depends on (edsc_ext/ops.py gives the friendlier messages first) and
// makes every tensor dense in the call's memory format: channels_last where the input is
// (wants_channels_last), NCHW-contiguous otherwise; a tensor already so is not copied. A forward (no
// grad_output) keeps a per-pixel tensor whose strides the kernels can follow (per_pixel_strides: a
// channel slice of a wider tensor, an expanded one) as it is: both backends' forward planners send
// such calls to kernels that take PerPixelStrides. A backward makes them dense, since its gradients
// share the values' indexing.
DeformSepconvCall prepare(const DeformSepconvArgs& args);

// A channels_last input (and not also contiguous) makes the call channels_last: its output and
// gradients come back in channels_last, as PyTorch's own convolutions do. edsc_ext/ops.py's fake
// kernels apply the same rule.
bool wants_channels_last(const Tensor& input);

// The batch and pixel strides (elements) at which the kernels can read a 4-D per-pixel tensor in
// place in the call's layout: element (n, k, y, x) at n * batch + (y * W + x) * pixel + k * HW in
// NCHW (pixel 1), + k in channels_last; nullopt where its strides are of another pattern.
std::optional<PerPixelStrides<int64_t>> per_pixel_strides(const Tensor& t, bool channels_last);

// Calls whose taps sit on the pixel grid (no offsets, no dilation, a non-empty frame, a mode with
// the grid_taps trait): each tap's sample is one input pixel (grid_tap_pixel), which the CPU and
// CUDA grid-tap kernels exploit, unless the policy sends them to the bilinear kernels.
inline bool takes_grid_taps(const CallFacts& c, const KernelPolicy& policy) {
  if (!policy.grid_taps || !c.padding.grid_taps || c.has_offset || c.dilation_h != 1 || c.dilation_w != 1) {
    return false;
  }
  return c.height_in > 0 && c.width_in > 0;
}

// ---- The backward's gradients

// The gradients of input, vertical, horizontal, offset, mask and offset_dx (split offsets).
using DeformSepconvGrads = std::array<Tensor, 6>;
constexpr int kOffsetDxGrad = 5;

// The backward op's bool[5] output_mask (input, vertical, horizontal, offset, mask), checked.
std::array<bool, 5> output_mask_array(const std::vector<bool>& mask);

// Allocates the gradient outputs in the call's memory format: where requested (output_mask[3] asks
// for both offset gradients of split offsets), zero-filled where the kernels accumulate into them
// (the input's); a 0-element tensor where not requested.
DeformSepconvGrads allocate_grads(const DeformSepconvCall& call, const std::array<bool, 5>& output_mask);

// What the backward op returns: DeformSepconvGrads as a tuple.
using DeformSepconvBackwardResult = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
inline DeformSepconvBackwardResult backward_result(DeformSepconvGrads g) {
  return {std::move(g[0]), std::move(g[1]), std::move(g[2]), std::move(g[3]), std::move(g[4]), std::move(g[5])};
}

// ---- The kernel parameters

// The data pointers of a prepared call's tensors, whose dtypes prepare checked (and
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

// The kernel parameters' sizes and geometry from a call's facts (make_params; the tests' CUDA emulation
// builds its parameters from facts and raw pointers with it too).
template <typename scalar_t, typename index_t, typename param_t>
void set_geometry(DeformSepconvParams<scalar_t, index_t, param_t>& p, const CallFacts& f) {
  p.batch = static_cast<index_t>(f.batch);
  p.channels = static_cast<index_t>(f.channels);
  p.height_in = static_cast<index_t>(f.height_in);
  p.width_in = static_cast<index_t>(f.width_in);
  p.height_out = static_cast<index_t>(f.height_out);
  p.width_out = static_cast<index_t>(f.width_out);
  p.kernel_h = static_cast<index_t>(f.kernel_h);
  p.kernel_w = static_cast<index_t>(f.kernel_w);
  // A mode that shifts the taps moves tap 0 by tap_shift: y - pad_h + shift = y - (pad_h - shift).
  p.pad_h = static_cast<index_t>(f.pad_h - tap_shift(f.padding, f.kernel_h));
  p.pad_w = static_cast<index_t>(f.pad_w - tap_shift(f.padding, f.kernel_w));
  p.frame_pad_h = static_cast<index_t>(f.pad_h);
  p.frame_pad_w = static_cast<index_t>(f.pad_w);
  p.dilation_h = static_cast<index_t>(f.dilation_h);
  p.dilation_w = static_cast<index_t>(f.dilation_w);
  p.padding = f.padding;
}

template <typename scalar_t, typename index_t, typename param_t = scalar_t>
DeformSepconvParams<scalar_t, index_t, param_t> make_params(const DeformSepconvCall& call) {
  const CallFacts& f = call.facts;
  DeformSepconvParams<scalar_t, index_t, param_t> p;
  p.input = static_cast<const scalar_t*>(call.input.const_data_ptr());
  p.vertical = data_or_null<param_t>(call.vertical);
  p.horizontal = data_or_null<param_t>(call.horizontal);
  p.offset = data_or_null<param_t>(call.offset);
  p.offset_dx = data_or_null<param_t>(call.offset_dx);
  p.mask = data_or_null<param_t>(call.mask);
  const auto strides = [&](const OptionalTensor& v) {
    if (!v.has_value()) return PerPixelStrides<index_t>{0, 0};
    const PerPixelStrides<int64_t> s = per_pixel_strides(*v, f.channels_last).value();  // prepare checked it
    return PerPixelStrides<index_t>{static_cast<index_t>(s.batch), static_cast<index_t>(s.pixel)};
  };
  p.vertical_strides = strides(call.vertical);
  p.horizontal_strides = strides(call.horizontal);
  p.offset_strides = strides(call.offset);
  p.offset_dx_strides = strides(call.offset_dx);
  p.mask_strides = strides(call.mask);
  set_geometry(p, f);
  return p;
}

template <typename scalar_t>
DeformSepconvParamGrads<scalar_t> make_param_grads(const DeformSepconvGrads& grads) {
  return {mutable_data_or_null<scalar_t>(grads[1]), mutable_data_or_null<scalar_t>(grads[2]),
          mutable_data_or_null<scalar_t>(grads[3]), mutable_data_or_null<scalar_t>(grads[4]),
          mutable_data_or_null<scalar_t>(grads[kOffsetDxGrad])};
}

// ---- The dispatch
//
// dispatch_kernel_types<KernelTypes<>, Axes...>(choice, name, body) calls body(K{}) once, K holding
// the compile-time facts that each axis set from the call (in order: an axis may read those before
// it). The body reads what it needs by name (typename K::scalar_t, K::kChannelsLast, K::variant,
// ...): a fact of an axis it did not ask for is absent, so using it does not compile. A call outside
// the axes' range is an error naming the launcher and the fact.
//
//   dispatch_kernel_types<KernelTypes<>, dispatch_axis::FrameAndParamTypes, dispatch_axis::IndexWidth>(
//       call.facts, "deform_sepconv_forward_cpu", [&](auto k) { using K = decltype(k); ... });

// The compile-time facts an axis sets.
namespace kernel_facts {
template <typename Scalar, typename Param>
struct Dtypes {
  using scalar_t = Scalar;  // the frame's (input, output, grad_output)
  using param_t = Param;    // the per-pixel tensors'
  using acc_t = opmath_t<Scalar>;
};
template <typename Index>
struct IndexType {
  using index_t = Index;
};
template <bool kIsChannelsLast>
struct Layout {
  static constexpr bool kChannelsLast = kIsChannelsLast;
};
template <int kH, int kW>
struct KernelSize {
  static constexpr int kKernelH = kH;  // 0: the run-time size
  static constexpr int kKernelW = kW;
};
template <int kCount>
struct Channels {
  static constexpr int kChannels = kCount;
};
template <bool kPresent>
struct Mask {
  static constexpr bool kMask = kPresent;
};
template <const auto& kTable, size_t kRow>
struct Variant {
  static constexpr auto variant = kTable[kRow];  // a row of a variant table (src/cuda/cuda_plan.h)
};
template <int64_t kMode>
struct Padding {
  static constexpr int64_t kPaddingMode = kMode;  // a PaddingMode, or kRuntimePaddingMode
};
}  // namespace kernel_facts

template <typename... Facts>
struct KernelTypes : Facts... {
  template <typename Fact>
  using With = KernelTypes<Facts..., Fact>;
};

// What the dispatch reads: the call's facts and, for dispatch_axis::Variant, the plan's row.
struct KernelChoice {
  const CallFacts& facts;
  int variant = 0;
  KernelChoice(const CallFacts& f, int row = 0) : facts(f), variant(row) {}  // NOLINT: implicit from the facts
};

// The facts that decide which variants of a family exist for an instantiation (VariantScope).
struct VariantFacts {
  bool kernel_5x5 = false;   // a compile-time kSpecializedKernel x kSpecializedKernel kernel
  bool index_32bit = false;  // 32-bit indices
  bool channels_last = false;
  int64_t element_size = 0;  // the frame's dtype
  bool same_dtypes = true;   // the per-pixel tensors in the frame's dtype (not mixed precision)
};

enum class VariantLayout { kAny, kNchw, kChannelsLast };

// The calls a variant is compiled for: a variant row's scope (src/cuda/cuda_plan.h spells every field).
struct VariantScope {
  bool kernel_5x5;   // only with the compile-time 5x5
  bool index_32bit;  // only with 32-bit indices
  VariantLayout layout;
  int64_t max_element_size;  // of the frame's dtype
  bool same_dtypes;          // not with mixed precision

  constexpr bool admits(const VariantFacts& f) const {
    return (!kernel_5x5 || f.kernel_5x5) && (!index_32bit || f.index_32bit) &&
           (layout == VariantLayout::kAny || (layout == VariantLayout::kChannelsLast) == f.channels_last) &&
           f.element_size <= max_element_size && (!same_dtypes || f.same_dtypes);
  }
};

// Whether every row of a variant table has a name of its own (the plan names the row it runs).
template <typename Row, size_t kRows>
constexpr bool names_are_unique(const Row (&table)[kRows]) {
  const auto same = [](const char* a, const char* b) {
    while (*a != '\0' && *a == *b) ++a, ++b;
    return *a == *b;
  };
  for (size_t i = 0; i < kRows; ++i) {
    for (size_t j = i + 1; j < kRows; ++j) {
      if (same(table[i].name, table[j].name)) return false;
    }
  }
  return true;
}

// At run time, of a call (the planner's check of the row it picks).
inline VariantFacts variant_facts(const CallFacts& c) {
  return {c.square_kernel(kSpecializedKernel), c.use_32bit_indexing, c.channels_last, c.element_size,
          !c.mixed_precision()};
}

namespace dispatch_detail {
template <typename K, typename = void>
struct StaticKernel5x5 : std::false_type {};
template <typename K>
struct StaticKernel5x5<K, std::void_t<decltype(K::kKernelH)>>
    : std::bool_constant<K::kKernelH == kSpecializedKernel && K::kKernelW == kSpecializedKernel> {};
}  // namespace dispatch_detail

// At compile time, of an instantiation's KernelTypes (dtypes, index and layout dispatched; without a
// dispatched kernel size, the run-time one).
template <typename K>
constexpr VariantFacts variant_facts() {
  return {dispatch_detail::StaticKernel5x5<K>::value, std::is_same_v<typename K::index_t, int32_t>, K::kChannelsLast,
          static_cast<int64_t>(sizeof(typename K::scalar_t)),
          std::is_same_v<typename K::scalar_t, typename K::param_t>};
}

// The axes. Each has apply<K>(choice, name, next), which calls next(K') with K' = K and its facts set.
namespace dispatch_axis {

[[noreturn]] inline void no_kernels(const char* name, const CallFacts& facts) {
  if (facts.param_dtype == facts.frame_dtype) {
    throw std::runtime_error(message(name, ": no kernels for dtype ", dtype_name(facts.frame_dtype)));
  }
  throw std::runtime_error(message(name, ": no kernels for a ", dtype_name(facts.frame_dtype), " frame with ",
                                   dtype_name(facts.param_dtype), " per-pixel tensors"));
}

template <SpecScalarType kDtype>
struct CppType;
template <>
struct CppType<SpecScalarType::Double> {
  using type = double;
};
template <>
struct CppType<SpecScalarType::Float> {
  using type = float;
};
template <>
struct CppType<SpecScalarType::Half> {
  using type = Half;
};
template <>
struct CppType<SpecScalarType::BFloat16> {
  using type = BFloat16;
};

// scalar_t and param_t: the pair of edsc_ext/spec.h's kDtypePairs that the call has, among those
// kAdmits admits. A family's planner keeps the other calls away; one that reaches it anyway is an
// error, never a misread pointer.
template <bool (*kAdmits)(const DtypePair&)>
struct DtypePairs {
  template <typename K, typename Next>
  static void apply(const KernelChoice& choice, const char* name, Next&& next) {
    if (!apply_row<K, 0>(choice.facts, next)) no_kernels(name, choice.facts);
  }

 private:
  template <typename K, size_t kRow, typename Next>
  static bool apply_row(const CallFacts& facts, Next& next) {
    if constexpr (kRow < std::size(kDtypePairs)) {
      constexpr DtypePair kPair = kDtypePairs[kRow];
      if constexpr (kAdmits(kPair)) {
        if (facts.frame_dtype == kPair.frame && facts.param_dtype == kPair.per_pixel) {
          using Frame = typename CppType<kPair.frame>::type;
          using PerPixel = typename CppType<kPair.per_pixel>::type;
          next(typename K::template With<kernel_facts::Dtypes<Frame, PerPixel>>{});
          return true;
        }
      }
      return apply_row<K, kRow + 1>(facts, next);
    } else {
      return false;
    }
  }
};
constexpr bool every_pair(const DtypePair&) { return true; }
constexpr bool up_to_4_byte_same_dtypes(const DtypePair& p) {
  return p.frame == p.per_pixel && dtype_size(p.frame) <= 4;
}
constexpr bool two_byte_same_dtypes(const DtypePair& p) { return p.frame == p.per_pixel && dtype_size(p.frame) == 2; }
constexpr bool same_dtypes(const DtypePair& p) { return p.frame == p.per_pixel; }
// Every pair of the spec.
using FrameAndParamTypes = DtypePairs<every_pair>;
// Elements of at most 4 bytes, per-pixel tensors in the frame's dtype (the grid-tap and lane-pair kernels).
using UpTo4ByteTypes = DtypePairs<up_to_4_byte_same_dtypes>;
// The 2-byte types, per-pixel tensors in the frame's dtype (the staged forward).
using TwoByteTypes = DtypePairs<two_byte_same_dtypes>;

// scalar_t (= param_t) for the integer dtypes and those of the spec's same-dtype pairs (vector_add).
struct AllTypes {
  template <typename K, typename Next>
  static void apply(const KernelChoice& choice, const char* name, Next&& next) {
    const auto with = [&](auto value) {
      using T = decltype(value);
      next(typename K::template With<kernel_facts::Dtypes<T, T>>{});
    };
    switch (choice.facts.frame_dtype) {
      case ScalarType::Byte:
        return with(uint8_t{});
      case ScalarType::Char:
        return with(int8_t{});
      case ScalarType::Short:
        return with(int16_t{});
      case ScalarType::Int:
        return with(int32_t{});
      case ScalarType::Long:
        return with(int64_t{});
      default:
        return DtypePairs<same_dtypes>::template apply<K>(choice, name, std::forward<Next>(next));
    }
  }
};

// index_t: int32_t where every offset of the call fits, else int64_t.
struct IndexWidth {
  template <typename K, typename Next>
  static void apply(const KernelChoice& choice, const char*, Next&& next) {
    if (choice.facts.use_32bit_indexing) return next(typename K::template With<kernel_facts::IndexType<int32_t>>{});
    return next(typename K::template With<kernel_facts::IndexType<int64_t>>{});
  }
};

// index_t fixed, whatever the call allows (kernels that take 64-bit indices only, or 32-bit ones
// only, which their planner checked).
template <typename Index>
struct FixedIndex {
  template <typename K, typename Next>
  static void apply(const KernelChoice&, const char*, Next&& next) {
    return next(typename K::template With<kernel_facts::IndexType<Index>>{});
  }
};

// kChannelsLast: the call's layout.
struct Layout {
  template <typename K, typename Next>
  static void apply(const KernelChoice& choice, const char*, Next&& next) {
    if (choice.facts.channels_last) return next(typename K::template With<kernel_facts::Layout<true>>{});
    return next(typename K::template With<kernel_facts::Layout<false>>{});
  }
};

// kKernelH, kKernelW: the spec's compile-time kSpecializedKernel x kSpecializedKernel (EDSC,
// DSepConv, AdaCoF) where the call's kernel is that, 0 (run-time sizes) otherwise.
// kOnlyWith32bitIndex (after IndexWidth): calls with 64-bit indices take the run-time sizes (each
// static variant is another compile of every kernel).
template <bool kOnlyWith32bitIndex = false>
struct KernelSize5x5 {
  template <typename K, typename Next>
  static void apply(const KernelChoice& choice, const char*, Next&& next) {
    constexpr bool kStatic = !kOnlyWith32bitIndex || std::is_same_v<typename K::index_t, int32_t>;
    constexpr int kSize = static_cast<int>(kSpecializedKernel);
    if constexpr (kStatic) {
      if (choice.facts.square_kernel(kSize))
        return next(typename K::template With<kernel_facts::KernelSize<kSize, kSize>>{});
    }
    return next(typename K::template With<kernel_facts::KernelSize<0, 0>>{});
  }
};

// kChannels: the call's channel count as a compile-time constant, 1 to 4 (more take 4: the grid-tap
// kernels, whose planner sends them at most 4).
struct SmallChannels {
  template <typename K, typename Next>
  static void apply(const KernelChoice& choice, const char*, Next&& next) {
    switch (choice.facts.channels) {
      case 1:
        return next(typename K::template With<kernel_facts::Channels<1>>{});
      case 2:
        return next(typename K::template With<kernel_facts::Channels<2>>{});
      case 3:
        return next(typename K::template With<kernel_facts::Channels<3>>{});
      default:
        return next(typename K::template With<kernel_facts::Channels<4>>{});
    }
  }
};

// kMask: whether the call has a mask (a load a tap, which kernels without one leave out).
struct MaskPresence {
  template <typename K, typename Next>
  static void apply(const KernelChoice& choice, const char*, Next&& next) {
    if (choice.facts.has_mask) return next(typename K::template With<kernel_facts::Mask<true>>{});
    return next(typename K::template With<kernel_facts::Mask<false>>{});
  }
};

// variant: the plan's row (choice.variant) of a family's variant table, a table of rows with a
// `name` and a `scope` (VariantScope). Last, after the axes its scope reads (dtypes, index, layout,
// and the kernel size where it asks for the 5x5): the body is instantiated for the rows whose
// scope admits K only, and a plan that names another (the planner checks: find_variant) is an
// error before anything runs.
template <const auto& kTable>
struct Variant {
  template <typename K, typename Next>
  static void apply(const KernelChoice& choice, const char* name, Next&& next) {
    apply_row<K, 0>(choice.variant, name, next);
  }

 private:
  template <typename K, size_t kRow, typename Next>
  static void apply_row(int row, const char* name, Next& next) {
    if constexpr (kRow < std::size(kTable)) {
      if (static_cast<size_t>(row) != kRow) return apply_row<K, kRow + 1>(row, name, next);
      if constexpr (kTable[kRow].scope.admits(variant_facts<K>())) {
        next(typename K::template With<kernel_facts::Variant<kTable, kRow>>{});
      } else {
        throw std::logic_error(
            message(name, ": variant ", kTable[kRow].name, " was planned for a call it is not compiled for"));
      }
    } else {
      throw std::logic_error(message(name, ": a plan names variant row ", row, " of a table of ", std::size(kTable)));
    }
  }
};

// kPaddingMode (after Variant): the call's padding mode where the variant row compiles one kernel per
// mode (its static_padding), else kRuntimePaddingMode (the kernel reads the traits).
struct PaddingModeOfVariant {
  template <typename K, typename Next>
  static void apply(const KernelChoice& choice, const char* name, Next&& next) {
    if constexpr (K::variant.static_padding) {
      apply_mode<K, 0>(choice.facts.padding_mode, name, next);
    } else {
      next(typename K::template With<kernel_facts::Padding<kRuntimePaddingMode>>{});
    }
  }

 private:
  template <typename K, size_t kRow, typename Next>
  static void apply_mode(PaddingMode mode, const char* name, Next& next) {
    if constexpr (kRow < std::size(kPaddingModes)) {
      if (mode != kPaddingModes[kRow].code) return apply_mode<K, kRow + 1>(mode, name, next);
      next(typename K::template With<kernel_facts::Padding<kPaddingModes[kRow].code>>{});
    } else {
      throw std::logic_error(message(name, ": no kernel for padding mode code ", static_cast<int64_t>(mode)));
    }
  }
};

}  // namespace dispatch_axis

namespace dispatch_detail {
template <typename K, typename Body>
void apply_axes(const KernelChoice&, const char*, Body& body) {
  body(K{});
}
template <typename K, typename Axis, typename... Rest, typename Body>
void apply_axes(const KernelChoice& choice, const char* name, Body& body) {
  Axis::template apply<K>(choice, name,
                          [&](auto k) { apply_axes<std::decay_t<decltype(k)>, Rest...>(choice, name, body); });
}
}  // namespace dispatch_detail

// Calls body(K{}) once, with K = Seed and each of Axes set from `choice`. `name` (the launcher's)
// goes into the error for a call no instantiation takes.
template <typename Seed, typename... Axes, typename Body>
void dispatch_kernel_types(const KernelChoice& choice, const char* name, Body&& body) {
  dispatch_detail::apply_axes<Seed, Axes...>(choice, name, body);
}

}  // namespace edsc_ext
