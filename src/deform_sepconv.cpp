// The op schemas and every registration of a kernel (CPU, CUDA and the backend-free plan and
// policy ops), through the LibTorch stable ABI; and the host-side checks shared by every backend.
#include <algorithm>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "backends.h"
#include "cpu/cpu_plan.h"
#include "cuda/cuda_plan.h"
#include "deform_sepconv_call.h"
#include "kernel_policy.h"
#include "ops.h"
#include "torch_stable.h"

namespace edsc_ext {

namespace {

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

int64_t dtype_size(ScalarType dtype) {
  switch (dtype) {
    case ScalarType::Double:
      return 8;
    case ScalarType::Float:
      return 4;
    default:
      return 2;  // float16, bfloat16 (prepare_deform_sepconv allows no other)
  }
}

bool is_floating(ScalarType dtype) {
  return dtype == ScalarType::Double || dtype == ScalarType::Float || dtype == ScalarType::Half ||
         dtype == ScalarType::BFloat16;
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

// edsc_ext._plan: the names of the forward and backward plans of a call, for the CPU (cpu_facts:
// empty for this machine, else [avx2, threads]) or for a CUDA device (cuda_device: [major, minor,
// shared_memory_per_block_optin]), under the current policy and determinism setting.
std::vector<std::string> deform_sepconv_plan(const Tensor& input, const OptionalTensor& vertical,
                                             const OptionalTensor& horizontal, const OptionalTensor& offset,
                                             const OptionalTensor& mask, int64_t kernel_h, int64_t kernel_w,
                                             int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w,
                                             int64_t padding_mode, const std::vector<bool>& output_mask_list,
                                             const std::vector<int64_t>& cpu_facts,
                                             const std::vector<int64_t>& cuda_device, const OptionalTensor& offset_dx,
                                             bool deterministic) {
  const DeformSepconvConfig cfg{kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode};
  const std::array<bool, 5> output_mask = output_mask_array(output_mask_list);
  // As the backends' forwards prepare their calls: both read views of per-pixel tensors in place.
  const DeformSepconvTensors t =
      prepare_deform_sepconv(input, vertical, horizontal, offset, mask, cfg, nullptr, offset_dx);
  const DeformSepconvCall call = describe_call(t, cfg, output_mask, deterministic);
  // The backward makes every per-pixel tensor dense (prepare_deform_sepconv with grad_output).
  DeformSepconvCall backward_call = call;
  backward_call.dense_per_pixel = true;
  const KernelPolicy policy = kernel_policy();
  const bool backward = std::find(output_mask.begin(), output_mask.end(), true) != output_mask.end();
  if (!cuda_device.empty()) {
    EDSC_CHECK(cuda_device.size() == 3, "cuda_device must be [major, minor, shared_memory_per_block_optin], got ",
               cuda_device.size(), " values");
    const CudaDeviceFacts device{cuda_device[0], cuda_device[1], cuda_device[2]};
    return {plan_name(plan_cuda_forward(call, device, policy)),
            backward ? plan_name(plan_cuda_backward(backward_call, device, policy)) : std::string("none")};
  }
  EDSC_CHECK(cpu_facts.empty() || cpu_facts.size() == 2, "cpu_facts must be [] or [avx2, threads], got ",
             cpu_facts.size(), " values");
  CpuFacts cpu = this_cpu();
  if (!cpu_facts.empty()) cpu = {cpu_facts[0] != 0, cpu_facts[1]};
  return {plan_name(plan_cpu_forward(call, cpu, policy)),
          backward ? plan_name(plan_cpu_backward(backward_call, cpu, policy)) : std::string("none")};
}

#define EDSC_POLICY_PARAM(name, default_value) bool name,
void set_kernel_policy_op(EDSC_KERNEL_POLICY_SWITCHES(EDSC_POLICY_PARAM) int64_t cpu_scratch_mb) {
#undef EDSC_POLICY_PARAM
  EDSC_CHECK(cpu_scratch_mb >= 0, "cpu_scratch_mb must be >= 0, got ", cpu_scratch_mb);
  KernelPolicy policy;
#define EDSC_POLICY_ASSIGN(name, default_value) policy.name = name;
  EDSC_KERNEL_POLICY_SWITCHES(EDSC_POLICY_ASSIGN)
#undef EDSC_POLICY_ASSIGN
  policy.cpu_scratch_mb = cpu_scratch_mb;
  set_kernel_policy(policy);
}

#define EDSC_POLICY_TYPE(name, default_value) bool,
using KernelPolicyTuple = std::tuple<EDSC_KERNEL_POLICY_SWITCHES(EDSC_POLICY_TYPE) int64_t>;
#undef EDSC_POLICY_TYPE

KernelPolicyTuple get_kernel_policy_op() {
  const KernelPolicy p = kernel_policy();
#define EDSC_POLICY_VALUE(name, default_value) p.name,
  return {EDSC_KERNEL_POLICY_SWITCHES(EDSC_POLICY_VALUE) p.cpu_scratch_mb};
#undef EDSC_POLICY_VALUE
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

DeformSepconvTensors prepare_deform_sepconv(const Tensor& input, const OptionalTensor& vertical,
                                            const OptionalTensor& horizontal, const OptionalTensor& offset,
                                            const OptionalTensor& mask, const DeformSepconvConfig& cfg,
                                            const Tensor* grad_output, const OptionalTensor& offset_dx) {
  EDSC_CHECK(input.dim() == 4, "input must be 4-D (N, C, H, W), got shape ", ShapeOf{input});
  // Each of a stable Tensor's accessors is a call into torch: the input's facts are read once.
  const ScalarType input_dtype = input.scalar_type();
  const auto input_sizes = input.sizes();
  EDSC_CHECK(is_floating(input_dtype), "input must be float64, float32, float16 or bfloat16, got ", input_dtype);
  EDSC_CHECK(cfg.kernel_h >= 1 && cfg.kernel_w >= 1, "kernel size must be >= 1, got (", cfg.kernel_h, ", ",
             cfg.kernel_w, ")");
  EDSC_CHECK(cfg.kernel_w <= kMaxKernelWidth, "kernel width KW=", cfg.kernel_w, " exceeds the supported maximum ",
             kMaxKernelWidth);
  EDSC_CHECK(cfg.pad_h >= 0 && cfg.pad_w >= 0, "padding must be >= 0, got (", cfg.pad_h, ", ", cfg.pad_w, ")");
  EDSC_CHECK(cfg.dilation_h >= 1 && cfg.dilation_w >= 1, "dilation must be >= 1, got (", cfg.dilation_h, ", ",
             cfg.dilation_w, ")");
  EDSC_CHECK(
      cfg.padding_mode == kPaddingZeros || cfg.padding_mode == kPaddingBorder || cfg.padding_mode == kPaddingEdsc,
      "padding_mode code must be 0 (zeros), 1 (border) or 2 (edsc), got ", cfg.padding_mode);
  const bool split_offsets = offset_dx.has_value() && offset_dx->defined();
  EDSC_CHECK(!split_offsets || (offset.has_value() && offset->defined()),
             "offset_dx is given but offset (the dy of split offsets) is not");

  const bool channels_last = wants_channels_last(input);
  const MemoryFormat format = channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  DeformSepconvTensors t{contiguous_in(input, format)};
  t.channels_last = channels_last;
  t.frame_dtype = input_dtype;
  t.height_out = input_sizes[2] + 2 * cfg.pad_h - cfg.dilation_h * (cfg.kernel_h - 1);
  t.width_out = input_sizes[3] + 2 * cfg.pad_w - cfg.dilation_w * (cfg.kernel_w - 1);
  EDSC_CHECK(t.height_out >= 0 && t.width_out >= 0, "output size (", t.height_out, ", ", t.width_out,
             ") is negative for input of shape ", ShapeOf{input});
  const int64_t taps = cfg.kernel_h * cfg.kernel_w;
  // The per-pixel tensors share the first present one's dtype: the input's, or float16 / bfloat16
  // with a float32 input (mixed precision).
  const char* param_source = "input";
  t.param_dtype = input_dtype;
  const std::pair<const OptionalTensor*, const char*> per_pixel[] = {
      {&vertical, "vertical"}, {&horizontal, "horizontal"}, {&offset, "offset"}, {&mask, "mask"}};
  for (const auto& [tensor, name] : per_pixel) {
    if (tensor->has_value() && (*tensor)->defined()) {
      t.param_dtype = (*tensor)->scalar_type();
      param_source = name;
      break;
    }
  }
  const bool mixed = t.param_dtype != input_dtype;
  EDSC_CHECK(!mixed || (input_dtype == ScalarType::Float &&
                        (t.param_dtype == ScalarType::Half || t.param_dtype == ScalarType::BFloat16)),
             param_source, " has dtype ", t.param_dtype, " but input has dtype ", input_dtype,
             "; per-pixel tensors must have the input's dtype, or float16 / bfloat16 with a float32 input");
  // The backward's gradients are dense and share the values' indexing: only a forward reads views.
  const bool in_place = grad_output == nullptr;
  const torch::stable::Device device = input.device();
  const auto checked = [&](const OptionalTensor& v, const char* name, int64_t channels) {
    return checked_optional(v, name, input, device, channels, t.height_out, t.width_out, format, t.param_dtype,
                            param_source, in_place);
  };
  t.vertical = checked(vertical, "vertical", cfg.kernel_h);
  t.horizontal = checked(horizontal, "horizontal", cfg.kernel_w);
  t.offset = checked(offset, split_offsets ? "offset (dy)" : "offset", (split_offsets ? 1 : 2) * taps);
  t.offset_dx = checked(offset_dx, "offset_dx", taps);
  t.mask = checked(mask, "mask", taps);
  if (grad_output) {
    t.grad_output = checked_optional(*grad_output, "grad_output", input, device, input_sizes[1], t.height_out,
                                     t.width_out, format, input_dtype, "input");
    EDSC_CHECK(t.grad_output.has_value(), "grad_output must be a defined tensor");
  }

  // 32-bit indices when every element offset (and every coordinate term) fits.
  const int64_t output_numel = input_sizes[0] * input_sizes[1] * t.height_out * t.width_out;
  const int64_t per_pixel_numel = input_sizes[0] * 2 * taps * t.height_out * t.width_out;
  int64_t per_pixel_reach = 0;
  for (const OptionalTensor* v : {&t.vertical, &t.horizontal, &t.offset, &t.mask, &t.offset_dx}) {
    if (v->has_value()) {
      per_pixel_reach = std::max(per_pixel_reach, largest_offset(**v));
      t.dense_per_pixel = t.dense_per_pixel && is_dense_in(**v, format);
    }
  }
  t.use_32bit_indexing =
      fits_int32(input.numel()) && fits_int32(output_numel) && fits_int32(per_pixel_numel) &&
      fits_int32(per_pixel_reach) &&
      fits_int32(input_sizes[0] * std::max(cfg.kernel_h, cfg.kernel_w) * t.height_out * t.width_out) &&
      fits_int32(4 * std::max(cfg.pad_h, cfg.pad_w)) &&
      fits_int32(4 * std::max(cfg.dilation_h * cfg.kernel_h, cfg.dilation_w * cfg.kernel_w));
  return t;
}

DeformSepconvCall describe_call(const DeformSepconvTensors& t, const DeformSepconvConfig& cfg,
                                const std::array<bool, 5>& output_mask, bool deterministic) {
  DeformSepconvCall c;
  const auto sizes = t.input.sizes();
  c.batch = sizes[0];
  c.channels = sizes[1];
  c.height_in = sizes[2];
  c.width_in = sizes[3];
  c.height_out = t.height_out;
  c.width_out = t.width_out;
  c.cfg = cfg;
  c.element_size = dtype_size(t.frame_dtype);
  c.param_element_size = dtype_size(t.param_dtype);
  c.channels_last = t.channels_last;
  c.use_32bit_indexing = t.use_32bit_indexing;
  c.has_vertical = t.vertical.has_value();
  c.has_horizontal = t.horizontal.has_value();
  c.has_offset = t.offset.has_value();
  c.has_mask = t.mask.has_value();
  c.split_offsets = t.offset_dx.has_value();
  c.dense_per_pixel = t.dense_per_pixel;
  const bool meta = t.input.device().type() == torch::headeronly::DeviceType::Meta;
  for (const OptionalTensor* per_pixel : {&t.vertical, &t.horizontal, &t.offset, &t.mask, &t.offset_dx}) {
    if (per_pixel->has_value()) {
      c.per_pixel_alignment = std::min(c.per_pixel_alignment, start_alignment(**per_pixel, meta));
    }
  }
  c.input_alignment = start_alignment(t.input, meta);
  if (t.grad_output.has_value()) c.grad_output_alignment = start_alignment(*t.grad_output, meta);
  c.offset_pairs_aligned =
      !c.has_offset || c.split_offsets || start_alignment(*t.offset, meta) % (2 * c.element_size) == 0;
  // A gradient is computed where it is asked for and has elements (allocate_deform_sepconv_grads).
  c.grads[0] = output_mask[0] && t.input.numel() > 0;
  const OptionalTensor* per_pixel[4] = {&t.vertical, &t.horizontal, &t.offset, &t.mask};
  for (int k = 1; k < 5; ++k)
    c.grads[k] = output_mask[k] && per_pixel[k - 1]->has_value() && (*per_pixel[k - 1])->numel() > 0;
  c.deterministic = deterministic;
  return c;
}

bool wants_channels_last(const Tensor& input) {
  return input.dim() == 4 && !input.is_contiguous() && is_dense_in(input, MemoryFormat::ChannelsLast);
}

std::array<bool, 5> output_mask_array(const std::vector<bool>& mask) {
  EDSC_CHECK(mask.size() == 5, "output_mask must have 5 values, got ", mask.size());
  return {mask[0], mask[1], mask[2], mask[3], mask[4]};
}

DeformSepconvGrads allocate_deform_sepconv_grads(const DeformSepconvTensors& t,
                                                 const std::array<bool, 5>& output_mask) {
  const bool has_channels = t.input.size(1) > 0;
  const auto grad = [&](int k, const Tensor* source) {
    if (!output_mask[k == kOffsetDxGrad ? 3 : k] || source == nullptr)
      return empty_in(t.input, {0}, MemoryFormat::Contiguous);
    Tensor g = empty_in(*source, source->sizes(), t.memory_format());
    // The input gradient is accumulated into. The kernels overwrite every element of the
    // per-pixel ones, except with no channels (the CUDA backward then launches nothing), so
    // those skip a zero-fill pass, a full write of 2K + 3K^2 values a pixel.
    if (k == 0 || !has_channels) fill_zeros(g);
    return g;
  };
  const auto ptr = [](const OptionalTensor& v) { return v.has_value() ? &*v : nullptr; };
  // Made in place (a default-constructed stable Tensor would allocate a handle only to drop it).
  return {grad(0, &t.input),      grad(1, ptr(t.vertical)), grad(2, ptr(t.horizontal)),
          grad(3, ptr(t.offset)), grad(4, ptr(t.mask)),     grad(kOffsetDxGrad, ptr(t.offset_dx))};
}

}  // namespace edsc_ext

// The schemas. deterministic: torch.are_deterministic_algorithms_enabled() (the stable ABI does not
// expose it to C++), passed by edsc_ext/ops.py where it matters (the CUDA backward's input gradient).
STABLE_TORCH_LIBRARY(edsc_ext, m) {
  m.def(
      "deform_sepconv_forward(Tensor input, Tensor? vertical, Tensor? horizontal, Tensor? offset, Tensor? mask, "
      "int kernel_h, int kernel_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int padding_mode, "
      "Tensor? offset_dx=None) -> Tensor");
  m.def(
      "deform_sepconv_backward(Tensor grad_output, Tensor input, Tensor? vertical, Tensor? horizontal, "
      "Tensor? offset, Tensor? mask, int kernel_h, int kernel_w, int pad_h, int pad_w, int dilation_h, "
      "int dilation_w, int padding_mode, bool[5] output_mask, Tensor? offset_dx=None, bool deterministic=False) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("vector_add(Tensor a, Tensor b) -> Tensor");
  // edsc_ext._plan and edsc_ext.kernel_policy (edsc_ext/ops.py, edsc_ext/_policy.py).
  m.def(
      "deform_sepconv_plan(Tensor input, Tensor? vertical, Tensor? horizontal, Tensor? offset, Tensor? mask, "
      "int kernel_h, int kernel_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int padding_mode, "
      "bool[5] output_mask, int[] cpu_facts, int[] cuda_device, Tensor? offset_dx=None, bool deterministic=False) "
      "-> str[]");
#define EDSC_POLICY_SCHEMA_ARG(name, default_value) "bool " #name ", "
#define EDSC_POLICY_SCHEMA_TYPE(name, default_value) "bool, "
  m.def("set_kernel_policy(" EDSC_KERNEL_POLICY_SWITCHES(EDSC_POLICY_SCHEMA_ARG) "int cpu_scratch_mb) -> ()");
  m.def("get_kernel_policy() -> (" EDSC_KERNEL_POLICY_SWITCHES(EDSC_POLICY_SCHEMA_TYPE) "int)");
#undef EDSC_POLICY_SCHEMA_ARG
#undef EDSC_POLICY_SCHEMA_TYPE
}

// The plan and policy ops run the same on every device (and on meta tensors).
STABLE_TORCH_LIBRARY_IMPL(edsc_ext, CompositeExplicitAutograd, m) {
  m.impl("deform_sepconv_plan", TORCH_BOX(&edsc_ext::deform_sepconv_plan));
  m.impl("set_kernel_policy", TORCH_BOX(&edsc_ext::set_kernel_policy_op));
  m.impl("get_kernel_policy", TORCH_BOX(&edsc_ext::get_kernel_policy_op));
}

STABLE_TORCH_LIBRARY_IMPL(edsc_ext, CPU, m) {
  m.impl("deform_sepconv_forward", TORCH_BOX(&edsc_ext::deform_sepconv_forward_cpu));
  m.impl("deform_sepconv_backward", TORCH_BOX(&edsc_ext::deform_sepconv_backward_cpu));
  m.impl("vector_add", TORCH_BOX(&edsc_ext::vector_add_cpu));
}

#ifdef EDSC_EXT_WITH_CUDA
STABLE_TORCH_LIBRARY_IMPL(edsc_ext, CUDA, m) {
  m.impl("deform_sepconv_forward", TORCH_BOX(&edsc_ext::deform_sepconv_forward_cuda));
  m.impl("deform_sepconv_backward", TORCH_BOX(&edsc_ext::deform_sepconv_backward_cuda));
  m.impl("vector_add", TORCH_BOX(&edsc_ext::vector_add_cuda));
}
#endif
