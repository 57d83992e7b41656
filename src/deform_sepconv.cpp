// Op schemas (TORCH_LIBRARY), the host-side checks shared by every backend, and the pybind11
// module that reports how this binary was built.
// EDSC_EXT_NO_PYTHON (the CMake build): a plain shared library for torch.ops.load_library, no pybind11.
#ifdef EDSC_EXT_NO_PYTHON
#include <ATen/ATen.h>
#else
#include <torch/extension.h>
#endif
#include <torch/library.h>
#include <torch/version.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/deform_sepconv_plan.h"
#include "cuda/deform_sepconv_plan.h"
#include "edsc_ext/deform_sepconv_call.h"
#include "edsc_ext/kernel_policy.h"
#include "edsc_ext/ops.h"

#ifdef EDSC_EXT_WITH_CUDA
#include <cuda.h>  // CUDA_VERSION of the toolkit this binary was built with
#endif

// The build passes the architectures as underscore-separated integers, e.g. 80_90a
// (edsc_ext/_build_support.py: arch_macros).
#define EDSC_EXT_STRINGIFY_(...) #__VA_ARGS__
#define EDSC_EXT_STRINGIFY(...) EDSC_EXT_STRINGIFY_(__VA_ARGS__)

namespace edsc_ext {

namespace {

// `dtype`: the dtype the tensor must have, named by `dtype_source` in the message. in_place: kept as
// it is where the kernels can follow its strides (per_pixel_strides), else made dense.
at::Tensor checked_optional(const std::optional<at::Tensor>& t, const char* name, const at::Tensor& input,
                            int64_t channels, int64_t height_out, int64_t width_out, at::MemoryFormat format,
                            at::ScalarType dtype, const char* dtype_source, bool in_place = false) {
  if (!t.has_value() || !t->defined()) return at::Tensor();
  const at::Tensor& v = *t;
  TORCH_CHECK_VALUE(v.device() == input.device(), name, " is on ", v.device(), " but input is on ", input.device(),
                    "; all tensors must be on one device");
  TORCH_CHECK_TYPE(v.scalar_type() == dtype, name, " has dtype ", v.scalar_type(), " but ", dtype_source, " has dtype ",
                   dtype);
  TORCH_CHECK_VALUE(v.dim() == 4 && v.size(0) == input.size(0) && v.size(1) == channels && v.size(2) == height_out &&
                        v.size(3) == width_out,
                    name, " must have shape (", input.size(0), ", ", channels, ", ", height_out, ", ", width_out,
                    "), got ", v.sizes());
  if (in_place && per_pixel_strides(v, format == at::MemoryFormat::ChannelsLast).has_value()) return v;
  return v.contiguous(format);
}

// The largest element offset a tensor's strides reach (0 for an empty one).
int64_t largest_offset(const at::TensorBase& t) {
  if (t.numel() == 0) return 0;
  int64_t offset = 0;
  for (int64_t d = 0; d < t.dim(); ++d) offset += (t.size(d) - 1) * t.stride(d);
  return offset;
}

bool fits_int32(int64_t v) { return v >= 0 && v <= std::numeric_limits<int32_t>::max(); }

// The largest of 16, 8, 4, 2, 1 that the tensor's start address is a multiple of (16 for a meta
// tensor, which has no address: plans for a described call assume allocator alignment).
int64_t start_alignment(const at::TensorBase& t) {
  const uintptr_t address = t.is_meta() ? 0 : reinterpret_cast<uintptr_t>(t.const_data_ptr());
  for (const int64_t bytes : {16, 8, 4, 2}) {
    if (address % bytes == 0) return bytes;
  }
  return 1;
}

// edsc_ext._plan: the names of the forward and backward plans of a call, for the CPU (cpu_facts:
// empty for this machine, else [avx2, threads]) or for a CUDA device (cuda_device: [major, minor,
// shared_memory_per_block_optin]), under the current policy and determinism setting.
std::vector<std::string> deform_sepconv_plan(const at::Tensor& input, const std::optional<at::Tensor>& vertical,
                                             const std::optional<at::Tensor>& horizontal,
                                             const std::optional<at::Tensor>& offset,
                                             const std::optional<at::Tensor>& mask, int64_t kernel_h, int64_t kernel_w,
                                             int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w,
                                             int64_t padding_mode, std::array<bool, 5> output_mask,
                                             at::IntArrayRef cpu_facts, at::IntArrayRef cuda_device,
                                             const std::optional<at::Tensor>& offset_dx) {
  const DeformSepconvConfig cfg{kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode};
  // As the backends' forwards prepare their calls: both read views of per-pixel tensors in place.
  const DeformSepconvTensors t =
      prepare_deform_sepconv(input, vertical, horizontal, offset, mask, cfg, nullptr, offset_dx);
  const DeformSepconvCall call = describe_call(t, cfg, output_mask, at::globalContext().deterministicAlgorithms());
  // The backward makes every per-pixel tensor dense (prepare_deform_sepconv with grad_output).
  DeformSepconvCall backward_call = call;
  backward_call.dense_per_pixel = true;
  const KernelPolicy policy = kernel_policy();
  const bool backward = std::find(output_mask.begin(), output_mask.end(), true) != output_mask.end();
  if (!cuda_device.empty()) {
    TORCH_CHECK_VALUE(cuda_device.size() == 3,
                      "cuda_device must be [major, minor, shared_memory_per_block_optin], got ", cuda_device);
    const CudaDeviceFacts device{cuda_device[0], cuda_device[1], cuda_device[2]};
    return {plan_name(plan_cuda_forward(call, device, policy)),
            backward ? plan_name(plan_cuda_backward(backward_call, device, policy)) : std::string("none")};
  }
  TORCH_CHECK_VALUE(cpu_facts.empty() || cpu_facts.size() == 2, "cpu_facts must be [] or [avx2, threads], got ",
                    cpu_facts);
  CpuFacts cpu = this_cpu();
  if (!cpu_facts.empty()) cpu = {cpu_facts[0] != 0, cpu_facts[1]};
  return {plan_name(plan_cpu_forward(call, cpu, policy)),
          backward ? plan_name(plan_cpu_backward(backward_call, cpu, policy)) : std::string("none")};
}

void set_kernel_policy_op(bool grid_taps, bool plain_forward, bool prefetch, bool input_grad_tile, bool warp_staging,
                          bool vector_loads, bool channel_lanes, bool cpu_baseline, int64_t cpu_scratch_mb) {
  TORCH_CHECK_VALUE(cpu_scratch_mb >= 0, "cpu_scratch_mb must be >= 0, got ", cpu_scratch_mb);
  set_kernel_policy({grid_taps, plain_forward, prefetch, input_grad_tile, warp_staging, vector_loads, channel_lanes,
                     cpu_baseline, cpu_scratch_mb});
}

std::tuple<bool, bool, bool, bool, bool, bool, bool, bool, int64_t> get_kernel_policy_op() {
  const KernelPolicy p = kernel_policy();
  return {p.grid_taps,    p.plain_forward, p.prefetch,     p.input_grad_tile, p.warp_staging,
          p.vector_loads, p.channel_lanes, p.cpu_baseline, p.cpu_scratch_mb};
}

}  // namespace

std::optional<PerPixelStrides<int64_t>> per_pixel_strides(const at::TensorBase& t, bool channels_last) {
  if (t.dim() != 4) return std::nullopt;
  const int64_t K = t.size(1), H = t.size(2), W = t.size(3);
  // A dimension of size 1 may have any stride: only the others are checked.
  const auto has = [&](int64_t d, int64_t stride) { return t.size(d) <= 1 || t.stride(d) == stride; };
  const int64_t batch = t.size(0) > 1 ? t.stride(0) : 0;
  if (channels_last) {
    // (y * W + x) * pixel + k: pixel from x's stride, or y's where W is 1.
    const int64_t pixel = W > 1 ? t.stride(3) : (H > 1 ? t.stride(2) : K);
    if (has(1, 1) && has(3, pixel) && has(2, W * pixel)) return PerPixelStrides<int64_t>{batch, pixel};
    return std::nullopt;
  }
  if (has(3, 1) && has(2, W) && has(1, H * W)) return PerPixelStrides<int64_t>{batch, 1};
  return std::nullopt;
}

DeformSepconvTensors prepare_deform_sepconv(const at::Tensor& input, const std::optional<at::Tensor>& vertical,
                                            const std::optional<at::Tensor>& horizontal,
                                            const std::optional<at::Tensor>& offset,
                                            const std::optional<at::Tensor>& mask, const DeformSepconvConfig& cfg,
                                            const at::Tensor* grad_output, const std::optional<at::Tensor>& offset_dx) {
  TORCH_CHECK_VALUE(input.dim() == 4, "input must be 4-D (N, C, H, W), got shape ", input.sizes());
  TORCH_CHECK_TYPE(at::isFloatingType(input.scalar_type()), "input must have a floating dtype, got ",
                   input.scalar_type());
  TORCH_CHECK_VALUE(cfg.kernel_h >= 1 && cfg.kernel_w >= 1, "kernel size must be >= 1, got (", cfg.kernel_h, ", ",
                    cfg.kernel_w, ")");
  TORCH_CHECK_VALUE(cfg.kernel_w <= kMaxKernelWidth, "kernel width KW=", cfg.kernel_w,
                    " exceeds the supported maximum ", kMaxKernelWidth);
  TORCH_CHECK_VALUE(cfg.pad_h >= 0 && cfg.pad_w >= 0, "padding must be >= 0, got (", cfg.pad_h, ", ", cfg.pad_w, ")");
  TORCH_CHECK_VALUE(cfg.dilation_h >= 1 && cfg.dilation_w >= 1, "dilation must be >= 1, got (", cfg.dilation_h, ", ",
                    cfg.dilation_w, ")");
  TORCH_CHECK_VALUE(
      cfg.padding_mode == kPaddingZeros || cfg.padding_mode == kPaddingBorder || cfg.padding_mode == kPaddingEdsc,
      "padding_mode code must be 0 (zeros), 1 (border) or 2 (edsc), got ", cfg.padding_mode);
  const bool split_offsets = offset_dx.has_value() && offset_dx->defined();
  TORCH_CHECK_VALUE(!split_offsets || (offset.has_value() && offset->defined()),
                    "offset_dx is given but offset (the dy of split offsets) is not");

  DeformSepconvTensors t;
  t.height_out = input.size(2) + 2 * cfg.pad_h - cfg.dilation_h * (cfg.kernel_h - 1);
  t.width_out = input.size(3) + 2 * cfg.pad_w - cfg.dilation_w * (cfg.kernel_w - 1);
  TORCH_CHECK_VALUE(t.height_out >= 0 && t.width_out >= 0, "output size (", t.height_out, ", ", t.width_out,
                    ") is negative for input of shape ", input.sizes());
  const int64_t taps = cfg.kernel_h * cfg.kernel_w;
  t.channels_last = wants_channels_last(input);
  const at::MemoryFormat format = t.memory_format();
  t.input = input.contiguous(format);
  // The per-pixel tensors share the first present one's dtype: the input's, or float16 / bfloat16
  // with a float32 input (mixed precision).
  const char* param_source = "input";
  t.param_dtype = input.scalar_type();
  const std::pair<const std::optional<at::Tensor>*, const char*> per_pixel[] = {
      {&vertical, "vertical"}, {&horizontal, "horizontal"}, {&offset, "offset"}, {&mask, "mask"}};
  for (const auto& [tensor, name] : per_pixel) {
    if (tensor->has_value() && (*tensor)->defined()) {
      t.param_dtype = (*tensor)->scalar_type();
      param_source = name;
      break;
    }
  }
  const bool mixed = t.param_dtype != input.scalar_type();
  TORCH_CHECK_TYPE(
      !mixed || (input.scalar_type() == at::kFloat && (t.param_dtype == at::kHalf || t.param_dtype == at::kBFloat16)),
      param_source, " has dtype ", t.param_dtype, " but input has dtype ", input.scalar_type(),
      "; per-pixel tensors must have the input's dtype, or float16 / bfloat16 with a float32 input");
  // The backward's gradients are dense and share the values' indexing: only a forward reads views.
  const bool in_place = grad_output == nullptr;
  const auto checked = [&](const std::optional<at::Tensor>& v, const char* name, int64_t channels) {
    return checked_optional(v, name, input, channels, t.height_out, t.width_out, format, t.param_dtype, param_source,
                            in_place);
  };
  t.vertical = checked(vertical, "vertical", cfg.kernel_h);
  t.horizontal = checked(horizontal, "horizontal", cfg.kernel_w);
  t.offset = checked(offset, split_offsets ? "offset (dy)" : "offset", (split_offsets ? 1 : 2) * taps);
  t.offset_dx = checked(offset_dx, "offset_dx", taps);
  t.mask = checked(mask, "mask", taps);
  if (grad_output) {
    t.grad_output = checked_optional(*grad_output, "grad_output", input, input.size(1), t.height_out, t.width_out,
                                     format, input.scalar_type(), "input");
  }

  // 32-bit indices when every element offset (and every coordinate term) fits.
  const int64_t output_numel = input.size(0) * input.size(1) * t.height_out * t.width_out;
  const int64_t per_pixel_numel = input.size(0) * 2 * taps * t.height_out * t.width_out;
  int64_t per_pixel_reach = 0;
  for (const at::TensorBase* v : {&t.vertical, &t.horizontal, &t.offset, &t.mask, &t.offset_dx}) {
    if (v->defined()) {
      per_pixel_reach = std::max(per_pixel_reach, largest_offset(*v));
      t.dense_per_pixel = t.dense_per_pixel && v->is_contiguous(format);
    }
  }
  t.use_32bit_indexing =
      fits_int32(input.numel()) && fits_int32(output_numel) && fits_int32(per_pixel_numel) &&
      fits_int32(per_pixel_reach) &&
      fits_int32(input.size(0) * std::max(cfg.kernel_h, cfg.kernel_w) * t.height_out * t.width_out) &&
      fits_int32(4 * std::max(cfg.pad_h, cfg.pad_w)) &&
      fits_int32(4 * std::max(cfg.dilation_h * cfg.kernel_h, cfg.dilation_w * cfg.kernel_w));
  return t;
}

DeformSepconvCall describe_call(const DeformSepconvTensors& t, const DeformSepconvConfig& cfg,
                                const std::array<bool, 5>& output_mask, bool deterministic) {
  DeformSepconvCall c;
  c.batch = t.input.size(0);
  c.channels = t.input.size(1);
  c.height_in = t.input.size(2);
  c.width_in = t.input.size(3);
  c.height_out = t.height_out;
  c.width_out = t.width_out;
  c.cfg = cfg;
  c.element_size = t.input.element_size();
  c.param_element_size = static_cast<int64_t>(c10::elementSize(t.param_dtype));
  c.channels_last = t.channels_last;
  c.use_32bit_indexing = t.use_32bit_indexing;
  c.has_vertical = t.vertical.defined();
  c.has_horizontal = t.horizontal.defined();
  c.has_offset = t.offset.defined();
  c.has_mask = t.mask.defined();
  c.split_offsets = t.offset_dx.defined();
  c.dense_per_pixel = t.dense_per_pixel;
  for (const at::TensorBase* per_pixel : {&t.vertical, &t.horizontal, &t.offset, &t.mask, &t.offset_dx}) {
    if (per_pixel->defined()) c.per_pixel_alignment = std::min(c.per_pixel_alignment, start_alignment(*per_pixel));
  }
  c.input_alignment = start_alignment(t.input);
  if (t.grad_output.defined()) c.grad_output_alignment = start_alignment(t.grad_output);
  c.offset_pairs_aligned = !c.has_offset || c.split_offsets || start_alignment(t.offset) % (2 * c.element_size) == 0;
  // A gradient is computed where it is asked for and has elements (allocate_deform_sepconv_grads).
  const at::TensorBase* sources[5] = {&t.input, &t.vertical, &t.horizontal, &t.offset, &t.mask};
  for (int k = 0; k < 5; ++k) c.grads[k] = output_mask[k] && sources[k]->defined() && sources[k]->numel() > 0;
  c.deterministic = deterministic;
  return c;
}

bool wants_channels_last(const at::Tensor& input) {
  return input.dim() == 4 && !input.is_contiguous() && input.is_contiguous(at::MemoryFormat::ChannelsLast);
}

DeformSepconvGrads allocate_deform_sepconv_grads(const DeformSepconvTensors& t,
                                                 const std::array<bool, 5>& output_mask) {
  const at::TensorBase* sources[6] = {&t.input, &t.vertical, &t.horizontal, &t.offset, &t.mask, &t.offset_dx};
  DeformSepconvGrads grads;
  for (int k = 0; k < 6; ++k) {
    const bool wanted = output_mask[k == kOffsetDxGrad ? 3 : k];
    if (wanted && sources[k]->defined()) {
      // The input gradient is accumulated into. The kernels overwrite every element of the
      // per-pixel ones, except with no channels (the CUDA backward then launches nothing), so
      // those skip a zero-fill pass, a full write of 2K + 3K^2 values a pixel.
      const bool overwritten = k > 0 && t.input.size(1) > 0;
      // (at::zeros ignores a memory format in its options; at::empty honours it.)
      grads[k] = at::empty(sources[k]->sizes(), sources[k]->options().memory_format(t.memory_format()));
      if (!overwritten) grads[k].zero_();
    } else {
      grads[k] = at::empty({0}, t.input.options());
    }
  }
  return grads;
}

TORCH_LIBRARY(edsc_ext, m) {
  m.def(
      "deform_sepconv_forward(Tensor input, Tensor? vertical, Tensor? horizontal, Tensor? offset, Tensor? mask, "
      "int kernel_h, int kernel_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int padding_mode, "
      "Tensor? offset_dx=None) -> Tensor");
  m.def(
      "deform_sepconv_backward(Tensor grad_output, Tensor input, Tensor? vertical, Tensor? horizontal, "
      "Tensor? offset, Tensor? mask, int kernel_h, int kernel_w, int pad_h, int pad_w, int dilation_h, "
      "int dilation_w, int padding_mode, bool[5] output_mask, Tensor? offset_dx=None) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("vector_add(Tensor a, Tensor b) -> Tensor");
  // edsc_ext._plan and edsc_ext.kernel_policy (edsc_ext/ops.py, edsc_ext/_policy.py).
  m.def(
      "deform_sepconv_plan(Tensor input, Tensor? vertical, Tensor? horizontal, Tensor? offset, Tensor? mask, "
      "int kernel_h, int kernel_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int padding_mode, "
      "bool[5] output_mask, int[] cpu_facts, int[] cuda_device, Tensor? offset_dx=None) -> str[]",
      &deform_sepconv_plan);
  m.def(
      "set_kernel_policy(bool grid_taps, bool plain_forward, bool prefetch, bool input_grad_tile, bool warp_staging, "
      "bool vector_loads, bool channel_lanes, bool cpu_baseline, int cpu_scratch_mb) -> ()",
      &set_kernel_policy_op);
  m.def("get_kernel_policy() -> (bool, bool, bool, bool, bool, bool, bool, bool, int)", &get_kernel_policy_op);
}

}  // namespace edsc_ext

#ifndef EDSC_EXT_NO_PYTHON
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "edsc_ext compiled ops (registered under torch.ops.edsc_ext) and build facts";
  m.def("build_info", [] {
    pybind11::dict info;
    info["torch_version"] = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                            std::to_string(TORCH_VERSION_PATCH);
#ifdef EDSC_EXT_WITH_CUDA
    info["with_cuda"] = true;
    info["cuda_version"] = std::to_string(CUDA_VERSION / 1000) + "." + std::to_string((CUDA_VERSION % 1000) / 10);
    info["cuda_sass_archs"] = std::string(EDSC_EXT_STRINGIFY(EDSC_EXT_CUDA_SASS));
    info["cuda_ptx_archs"] = std::string(EDSC_EXT_STRINGIFY(EDSC_EXT_CUDA_PTX));
#else
    info["with_cuda"] = false;
    info["cuda_version"] = pybind11::none();
    info["cuda_sass_archs"] = std::string();
    info["cuda_ptx_archs"] = std::string();
#endif
    return info;
  });
}
#endif  // EDSC_EXT_NO_PYTHON
