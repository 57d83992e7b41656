// prepare() (src/deform_sepconv_call.h): the host-side checks every backend's call starts with, its
// facts, and the gradients' allocation; and the backend-free ops that describe the op: its spec
// (edsc_ext/spec.h, for Python) and the plan of a call (edsc_ext._plan).
#include "deform_sepconv_call.h"

#include <algorithm>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "backends.h"
#include "cpu/cpu_plan.h"
#include "cuda/cuda_plan.h"

namespace edsc_ext {

namespace {

// ---- The spec's phrases, for the messages here and (through deform_sepconv_spec) in Python

// "a, b or c".
std::string join_or(const std::vector<std::string>& items) {
  std::string text;
  for (size_t k = 0; k < items.size(); ++k) {
    text += (k == 0 ? "" : k + 1 == items.size() ? " or " : ", ") + items[k];
  }
  return text;
}

// The frames' dtypes: "float64, float32, float16 or bfloat16".
std::string frame_dtype_names() {
  std::vector<std::string> names;
  for (const DtypePair& pair : kDtypePairs) {
    if (std::find(names.begin(), names.end(), dtype_name(pair.frame)) == names.end()) {
      names.push_back(dtype_name(pair.frame));
    }
  }
  return join_or(names);
}

// The rule of the pairs: "per-pixel tensors must have the input's dtype, or float16 / bfloat16 with
// a float32 input".
std::string dtype_rule() {
  std::string rule = "per-pixel tensors must have the input's dtype";
  std::vector<SpecScalarType> frames;
  for (const DtypePair& pair : kDtypePairs) {
    if (pair.per_pixel != pair.frame && std::find(frames.begin(), frames.end(), pair.frame) == frames.end()) {
      frames.push_back(pair.frame);
    }
  }
  for (const SpecScalarType frame : frames) {
    std::string per_pixel;
    for (const DtypePair& pair : kDtypePairs) {
      if (pair.frame == frame && pair.per_pixel != frame) {
        per_pixel += (per_pixel.empty() ? "" : " / ") + std::string(dtype_name(pair.per_pixel));
      }
    }
    rule += ", or " + per_pixel + " with a " + dtype_name(frame) + " input";
  }
  return rule;
}

// padding_mode's codes: "0 (zeros), 1 (border) or 2 (edsc)".
std::string padding_mode_codes() {
  std::vector<std::string> codes;
  for (const PaddingModeSpec& mode : kPaddingModes) codes.push_back(message(mode.code, " (", mode.name, ")"));
  return join_or(codes);
}

// ---- prepare's pieces

// `dtype`: the dtype the tensor must have, named by `dtype_source` in the message. in_place: kept as
// it is where the kernels can follow its strides (per_pixel_strides), else made dense. nullopt
// where t is absent (or undefined).
OptionalTensor checked_optional(const OptionalTensor& t, const char* name, const Tensor& input,
                                const torch::stable::Device& device, int64_t channels, int64_t height_out,
                                int64_t width_out, MemoryFormat format, ScalarType dtype, const char* dtype_source,
                                bool in_place = false) {
  if (!t.has_value() || !t->defined()) return std::nullopt;
  const Tensor& v = *t;
  EDSC_CHECK(v.device() == device, name, " is on ", DeviceOf{v}, " but input is on ", DeviceOf{input},
             "; all tensors must be on one device");
  EDSC_CHECK(v.scalar_type() == dtype, name, " has dtype ", v.scalar_type(), " but ", dtype_source, " has dtype ",
             dtype);
  const auto sizes = v.sizes();
  EDSC_CHECK(sizes.size() == 4 && sizes[0] == input.size(0) && sizes[1] == channels && sizes[2] == height_out &&
                 sizes[3] == width_out,
             name, " must have shape (", input.size(0), ", ", channels, ", ", height_out, ", ", width_out, "), got ",
             ShapeOf{v});
  if (in_place && per_pixel_strides(v, format == MemoryFormat::ChannelsLast).has_value()) return v;
  return contiguous_in(v, format);
}

// The largest element offset a tensor's strides reach (0 for an empty one).
int64_t largest_offset(const Tensor& t) {
  if (t.numel() == 0) return 0;
  const auto sizes = t.sizes(), strides = t.strides();
  int64_t offset = 0;
  for (size_t d = 0; d < sizes.size(); ++d) offset += (sizes[d] - 1) * strides[d];
  return offset;
}

bool fits_int32(int64_t v) { return v >= 0 && v <= std::numeric_limits<int32_t>::max(); }

// The largest of 16, 8, 4, 2, 1 that the tensor's start address is a multiple of (16 for a meta
// tensor, which has no address: plans for a described call assume allocator alignment). `meta`:
// the call's tensors are on the meta device (they share one device).
int64_t start_alignment(const Tensor& t, bool meta) {
  const uintptr_t address = meta ? 0 : reinterpret_cast<uintptr_t>(t.const_data_ptr());
  for (const int64_t bytes : {16, 8, 4, 2}) {
    if (address % bytes == 0) return bytes;
  }
  return 1;
}

}  // namespace

std::optional<PerPixelStrides<int64_t>> per_pixel_strides(const Tensor& t, bool channels_last) {
  const auto size = t.sizes(), stride = t.strides();  // one shim call each
  if (size.size() != 4) return std::nullopt;
  const int64_t K = size[1], H = size[2], W = size[3];
  // A dimension of size 1 may have any stride: only the others are checked.
  const auto has = [&](int64_t d, int64_t expected) { return size[d] <= 1 || stride[d] == expected; };
  const int64_t batch = size[0] > 1 ? stride[0] : 0;
  if (channels_last) {
    // (y * W + x) * pixel + k: pixel from x's stride, or y's where W is 1.
    const int64_t pixel = W > 1 ? stride[3] : (H > 1 ? stride[2] : K);
    if (has(1, 1) && has(3, pixel) && has(2, W * pixel)) return PerPixelStrides<int64_t>{batch, pixel};
    return std::nullopt;
  }
  if (has(3, 1) && has(2, W) && has(1, H * W)) return PerPixelStrides<int64_t>{batch, 1};
  return std::nullopt;
}

bool wants_channels_last(const Tensor& input) {
  return input.dim() == 4 && !input.is_contiguous() && is_dense_in(input, MemoryFormat::ChannelsLast);
}

DeformSepconvCall prepare(const DeformSepconvArgs& args) {
  const Tensor& input = args.input;
  EDSC_CHECK(input.dim() == 4, "input must be 4-D (N, C, H, W), got shape ", ShapeOf{input});
  // Each of a stable Tensor's accessors is a call into torch: the input's facts are read once.
  const ScalarType input_dtype = input.scalar_type();
  const auto input_sizes = input.sizes();
  EDSC_CHECK(accepts_frame_dtype(input_dtype), "input must be ", frame_dtype_names(), ", got ", input_dtype);
  EDSC_CHECK(args.kernel_h >= kMinKernelSize && args.kernel_w >= kMinKernelSize,
             "kernel size must be >= ", kMinKernelSize, ", got (", args.kernel_h, ", ", args.kernel_w, ")");
  EDSC_CHECK(args.kernel_w <= kMaxKernelWidth, "kernel width KW=", args.kernel_w, " exceeds the supported maximum ",
             kMaxKernelWidth);
  EDSC_CHECK(args.pad_h >= kMinPadding && args.pad_w >= kMinPadding, "padding must be >= ", kMinPadding, ", got (",
             args.pad_h, ", ", args.pad_w, ")");
  EDSC_CHECK(args.dilation_h >= kMinDilation && args.dilation_w >= kMinDilation, "dilation must be >= ", kMinDilation,
             ", got (", args.dilation_h, ", ", args.dilation_w, ")");
  const PaddingModeSpec* mode = find_padding_mode(args.padding_mode);
  EDSC_CHECK(mode != nullptr, "padding_mode code must be ", padding_mode_codes(), ", got ", args.padding_mode);
  const bool split_offsets = args.offset_dx.has_value() && args.offset_dx->defined();
  EDSC_CHECK(!split_offsets || (args.offset.has_value() && args.offset->defined()),
             "offset_dx is given but offset (the dy of split offsets) is not");

  const bool channels_last = wants_channels_last(input);
  const MemoryFormat format = channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  DeformSepconvCall call{contiguous_in(input, format)};
  CallFacts& f = call.facts;
  f.kernel_h = args.kernel_h;
  f.kernel_w = args.kernel_w;
  f.pad_h = args.pad_h;
  f.pad_w = args.pad_w;
  f.dilation_h = args.dilation_h;
  f.dilation_w = args.dilation_w;
  f.padding = mode->traits;
  f.padding_mode = mode->code;
  f.batch = input_sizes[0];
  f.channels = input_sizes[1];
  f.height_in = input_sizes[2];
  f.width_in = input_sizes[3];
  f.channels_last = channels_last;
  f.frame_dtype = input_dtype;
  f.height_out = f.height_in + 2 * f.pad_h - f.dilation_h * (f.kernel_h - 1);
  f.width_out = f.width_in + 2 * f.pad_w - f.dilation_w * (f.kernel_w - 1);
  EDSC_CHECK(f.height_out >= 0 && f.width_out >= 0, "output size (", f.height_out, ", ", f.width_out,
             ") is negative for input of shape ", ShapeOf{input});
  const int64_t taps = f.kernel_h * f.kernel_w;
  // The per-pixel tensors share the first present one's dtype, which with the input's must be a
  // pair of the spec.
  const char* param_source = "input";
  f.param_dtype = input_dtype;
  const std::pair<const OptionalTensor*, const char*> per_pixel[] = {
      {&args.vertical, "vertical"}, {&args.horizontal, "horizontal"}, {&args.offset, "offset"}, {&args.mask, "mask"}};
  for (const auto& [tensor, name] : per_pixel) {
    if (tensor->has_value() && (*tensor)->defined()) {
      f.param_dtype = (*tensor)->scalar_type();
      param_source = name;
      break;
    }
  }
  EDSC_CHECK(accepts_dtypes(input_dtype, f.param_dtype), param_source, " has dtype ", f.param_dtype,
             " but input has dtype ", input_dtype, "; ", dtype_rule());
  f.element_size = dtype_size(input_dtype);
  f.param_element_size = dtype_size(f.param_dtype);
  // The backward's gradients are dense and share the values' indexing: only a forward reads views.
  const bool in_place = args.grad_output == nullptr;
  const torch::stable::Device device = input.device();
  const auto checked = [&](const OptionalTensor& v, const char* name, int64_t channels) {
    return checked_optional(v, name, input, device, channels, f.height_out, f.width_out, format, f.param_dtype,
                            param_source, in_place);
  };
  call.vertical = checked(args.vertical, "vertical", f.kernel_h);
  call.horizontal = checked(args.horizontal, "horizontal", f.kernel_w);
  call.offset = checked(args.offset, split_offsets ? "offset (dy)" : "offset", (split_offsets ? 1 : 2) * taps);
  call.offset_dx = checked(args.offset_dx, "offset_dx", taps);
  call.mask = checked(args.mask, "mask", taps);
  if (args.grad_output != nullptr) {
    call.grad_output = checked_optional(*args.grad_output, "grad_output", input, device, f.channels, f.height_out,
                                        f.width_out, format, input_dtype, "input");
    EDSC_CHECK(call.grad_output.has_value(), "grad_output must be a defined tensor");
  }
  f.has_vertical = call.vertical.has_value();
  f.has_horizontal = call.horizontal.has_value();
  f.has_offset = call.offset.has_value();
  f.has_mask = call.mask.has_value();
  f.split_offsets = call.offset_dx.has_value();

  // 32-bit indices when every element offset (and every coordinate term) fits.
  const int64_t output_numel = f.batch * f.channels * f.height_out * f.width_out;
  const int64_t per_pixel_numel = f.batch * 2 * taps * f.height_out * f.width_out;
  int64_t per_pixel_reach = 0;
  for (const OptionalTensor* v : {&call.vertical, &call.horizontal, &call.offset, &call.mask, &call.offset_dx}) {
    if (v->has_value()) {
      per_pixel_reach = std::max(per_pixel_reach, largest_offset(**v));
      f.dense_per_pixel = f.dense_per_pixel && is_dense_in(**v, format);
    }
  }
  f.use_32bit_indexing = fits_int32(input.numel()) && fits_int32(output_numel) && fits_int32(per_pixel_numel) &&
                         fits_int32(per_pixel_reach) &&
                         fits_int32(f.batch * std::max(f.kernel_h, f.kernel_w) * f.height_out * f.width_out) &&
                         fits_int32(4 * std::max(f.pad_h, f.pad_w)) &&
                         fits_int32(4 * std::max(f.dilation_h * f.kernel_h, f.dilation_w * f.kernel_w));

  const bool meta = device.type() == torch::headeronly::DeviceType::Meta;
  for (const OptionalTensor* v : {&call.vertical, &call.horizontal, &call.offset, &call.mask, &call.offset_dx}) {
    if (v->has_value()) f.per_pixel_alignment = std::min(f.per_pixel_alignment, start_alignment(**v, meta));
  }
  f.input_alignment = start_alignment(call.input, meta);
  if (call.grad_output.has_value()) f.grad_output_alignment = start_alignment(*call.grad_output, meta);
  f.offset_pairs_aligned =
      !f.has_offset || f.split_offsets || start_alignment(*call.offset, meta) % (2 * f.element_size) == 0;
  // A gradient is computed where it is asked for and has elements (allocate_grads).
  f.grads[0] = args.output_mask[0] && call.input.numel() > 0;
  const OptionalTensor* with_grads[4] = {&call.vertical, &call.horizontal, &call.offset, &call.mask};
  for (int k = 1; k < 5; ++k) {
    f.grads[k] = args.output_mask[k] && with_grads[k - 1]->has_value() && (*with_grads[k - 1])->numel() > 0;
  }
  f.deterministic = args.deterministic;
  return call;
}

std::array<bool, 5> output_mask_array(const std::vector<bool>& mask) {
  EDSC_CHECK(mask.size() == 5, "output_mask must have 5 values, got ", mask.size());
  return {mask[0], mask[1], mask[2], mask[3], mask[4]};
}

DeformSepconvGrads allocate_grads(const DeformSepconvCall& call, const std::array<bool, 5>& output_mask) {
  const bool has_channels = call.facts.channels > 0;
  const MemoryFormat format = call.facts.memory_format();
  const auto grad = [&](int k, const Tensor* source) {
    if (!output_mask[k == kOffsetDxGrad ? 3 : k] || source == nullptr) {
      return empty_in(call.input, {0}, MemoryFormat::Contiguous);
    }
    Tensor g = empty_in(*source, source->sizes(), format);
    // The input gradient is accumulated into. The kernels overwrite every element of the
    // per-pixel ones, except with no channels (the CUDA backward then launches nothing), so
    // those skip a zero-fill pass, a full write of 2K + 3K^2 values a pixel.
    if (k == 0 || !has_channels) fill_zeros(g);
    return g;
  };
  const auto ptr = [](const OptionalTensor& v) { return v.has_value() ? &*v : nullptr; };
  // Made in place (a default-constructed stable Tensor would allocate a handle only to drop it).
  return {grad(0, &call.input),      grad(1, ptr(call.vertical)), grad(2, ptr(call.horizontal)),
          grad(3, ptr(call.offset)), grad(4, ptr(call.mask)),     grad(kOffsetDxGrad, ptr(call.offset_dx))};
}

// ---- The backend-free ops

namespace {

const char* json_bool(bool value) { return value ? "true" : "false"; }

}  // namespace

std::string deform_sepconv_spec() {
  std::ostringstream out;
  out << "{\"padding_modes\": [";
  for (const PaddingModeSpec& mode : kPaddingModes) {
    const PaddingTraits& t = mode.traits;
    out << (&mode == kPaddingModes ? "" : ", ") << "{\"name\": " << json_string(mode.name)
        << ", \"code\": " << static_cast<int64_t>(mode.code) << ", \"clamps\": " << json_bool(t.clamps)
        << ", \"doubles_border\": " << json_bool(t.doubles_border) << ", \"shifts_taps\": " << json_bool(t.shifts_taps)
        << ", \"grid_taps\": " << json_bool(t.grid_taps) << ", \"bound_factor\": " << t.bound_factor
        << ", \"description\": " << json_string(mode.description) << "}";
  }
  out << "], \"dtype_pairs\": [";
  for (const DtypePair& pair : kDtypePairs) {
    out << (&pair == kDtypePairs ? "" : ", ") << "[" << json_string(dtype_name(pair.frame)) << ", "
        << json_string(dtype_name(pair.per_pixel)) << "]";
  }
  out << "], \"min_kernel_size\": " << kMinKernelSize << ", \"max_kernel_width\": " << kMaxKernelWidth
      << ", \"min_padding\": " << kMinPadding << ", \"min_dilation\": " << kMinDilation
      << ", \"specialized_kernel\": " << kSpecializedKernel
      << ", \"messages\": {\"frame_dtypes\": " << json_string(frame_dtype_names())
      << ", \"dtype_rule\": " << json_string(dtype_rule())
      << ", \"padding_mode_codes\": " << json_string(padding_mode_codes()) << "}}";
  return out.str();
}

std::vector<std::string> deform_sepconv_plan(const DeformSepconvArgs& args, const std::vector<int64_t>& cpu_facts,
                                             const std::vector<int64_t>& cuda_device) {
  // As the backends' forwards prepare their calls: both read views of per-pixel tensors in place
  // (args has no grad_output); with the gradients that output_mask asks for.
  const CallFacts facts = prepare(args).facts;
  // The backward makes every per-pixel tensor dense (prepare with grad_output).
  CallFacts backward_facts = facts;
  backward_facts.dense_per_pixel = true;
  const KernelPolicy policy = kernel_policy();
  const bool backward = std::find(args.output_mask.begin(), args.output_mask.end(), true) != args.output_mask.end();
  if (!cuda_device.empty()) {
    EDSC_CHECK(cuda_device.size() == 3, "cuda_device must be [major, minor, shared_memory_per_block_optin], got ",
               cuda_device.size(), " values");
    const CudaDeviceFacts device{cuda_device[0], cuda_device[1], cuda_device[2]};
    return {plan_name(plan_cuda_forward(facts, device, policy)),
            backward ? plan_name(plan_cuda_backward(backward_facts, device, policy)) : std::string("none")};
  }
  EDSC_CHECK(cpu_facts.empty() || cpu_facts.size() == 2, "cpu_facts must be [] or [avx2, threads], got ",
             cpu_facts.size(), " values");
  CpuFacts cpu = this_cpu();
  if (!cpu_facts.empty()) cpu = {cpu_facts[0] != 0, cpu_facts[1]};
  return {plan_name(plan_cpu_forward(facts, cpu, policy)),
          backward ? plan_name(plan_cpu_backward(backward_facts, cpu, policy)) : std::string("none")};
}

}  // namespace edsc_ext
