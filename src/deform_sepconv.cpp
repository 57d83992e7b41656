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

at::Tensor checked_optional(const std::optional<at::Tensor>& t, const char* name, const at::Tensor& input,
                            int64_t channels, int64_t height_out, int64_t width_out, at::MemoryFormat format) {
  if (!t.has_value() || !t->defined()) return at::Tensor();
  const at::Tensor& v = *t;
  TORCH_CHECK_VALUE(v.device() == input.device(), name, " is on ", v.device(), " but input is on ",
                    input.device(), "; all tensors must be on one device");
  TORCH_CHECK_TYPE(v.scalar_type() == input.scalar_type(), name, " has dtype ", v.scalar_type(),
                   " but input has dtype ", input.scalar_type());
  TORCH_CHECK_VALUE(v.dim() == 4 && v.size(0) == input.size(0) && v.size(1) == channels &&
                        v.size(2) == height_out && v.size(3) == width_out,
                    name, " must have shape (", input.size(0), ", ", channels, ", ", height_out, ", ", width_out,
                    "), got ", v.sizes());
  return v.contiguous(format);
}

bool fits_int32(int64_t v) { return v >= 0 && v <= std::numeric_limits<int32_t>::max(); }

}  // namespace

DeformSepconvTensors prepare_deform_sepconv(const at::Tensor& input, const std::optional<at::Tensor>& vertical,
                                            const std::optional<at::Tensor>& horizontal,
                                            const std::optional<at::Tensor>& offset,
                                            const std::optional<at::Tensor>& mask, const DeformSepconvConfig& cfg,
                                            const at::Tensor* grad_output) {
  TORCH_CHECK_VALUE(input.dim() == 4, "input must be 4-D (N, C, H, W), got shape ", input.sizes());
  TORCH_CHECK_TYPE(at::isFloatingType(input.scalar_type()), "input must have a floating dtype, got ",
                   input.scalar_type());
  TORCH_CHECK_VALUE(cfg.kernel_h >= 1 && cfg.kernel_w >= 1, "kernel size must be >= 1, got (", cfg.kernel_h,
                    ", ", cfg.kernel_w, ")");
  TORCH_CHECK_VALUE(cfg.kernel_w <= kMaxKernelWidth, "kernel width KW=", cfg.kernel_w,
                    " exceeds the supported maximum ", kMaxKernelWidth);
  TORCH_CHECK_VALUE(cfg.pad_h >= 0 && cfg.pad_w >= 0, "padding must be >= 0, got (", cfg.pad_h, ", ", cfg.pad_w,
                    ")");
  TORCH_CHECK_VALUE(cfg.dilation_h >= 1 && cfg.dilation_w >= 1, "dilation must be >= 1, got (", cfg.dilation_h,
                    ", ", cfg.dilation_w, ")");
  TORCH_CHECK_VALUE(cfg.padding_mode == kPaddingZeros || cfg.padding_mode == kPaddingBorder,
                    "padding_mode code must be 0 (zeros) or 1 (border), got ", cfg.padding_mode);

  DeformSepconvTensors t;
  t.height_out = input.size(2) + 2 * cfg.pad_h - cfg.dilation_h * (cfg.kernel_h - 1);
  t.width_out = input.size(3) + 2 * cfg.pad_w - cfg.dilation_w * (cfg.kernel_w - 1);
  TORCH_CHECK_VALUE(t.height_out >= 0 && t.width_out >= 0, "output size (", t.height_out, ", ", t.width_out,
                    ") is negative for input of shape ", input.sizes());
  const int64_t taps = cfg.kernel_h * cfg.kernel_w;
  t.channels_last = wants_channels_last(input);
  const at::MemoryFormat format = t.memory_format();
  t.input = input.contiguous(format);
  t.vertical = checked_optional(vertical, "vertical", input, cfg.kernel_h, t.height_out, t.width_out, format);
  t.horizontal = checked_optional(horizontal, "horizontal", input, cfg.kernel_w, t.height_out, t.width_out, format);
  t.offset = checked_optional(offset, "offset", input, 2 * taps, t.height_out, t.width_out, format);
  t.mask = checked_optional(mask, "mask", input, taps, t.height_out, t.width_out, format);
  if (grad_output) {
    t.grad_output =
        checked_optional(*grad_output, "grad_output", input, input.size(1), t.height_out, t.width_out, format);
  }

  // 32-bit indices when every element offset (and every coordinate term) fits.
  const int64_t output_numel = input.size(0) * input.size(1) * t.height_out * t.width_out;
  const int64_t per_pixel_numel = input.size(0) * 2 * taps * t.height_out * t.width_out;
  t.use_32bit_indexing = fits_int32(input.numel()) && fits_int32(output_numel) && fits_int32(per_pixel_numel) &&
                         fits_int32(input.size(0) * std::max(cfg.kernel_h, cfg.kernel_w) * t.height_out * t.width_out) &&
                         fits_int32(4 * std::max(cfg.pad_h, cfg.pad_w)) &&
                         fits_int32(4 * std::max(cfg.dilation_h * cfg.kernel_h, cfg.dilation_w * cfg.kernel_w));
  return t;
}

bool wants_channels_last(const at::Tensor& input) {
  return input.dim() == 4 && !input.is_contiguous() && input.is_contiguous(at::MemoryFormat::ChannelsLast);
}

std::array<at::Tensor, 5> allocate_deform_sepconv_grads(const DeformSepconvTensors& t,
                                                        const std::array<bool, 5>& output_mask) {
  const at::Tensor* sources[5] = {&t.input, &t.vertical, &t.horizontal, &t.offset, &t.mask};
  std::array<at::Tensor, 5> grads;
  for (int k = 0; k < 5; ++k) {
    if (output_mask[k] && sources[k]->defined()) {
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
      "int kernel_h, int kernel_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int padding_mode) "
      "-> Tensor");
  m.def(
      "deform_sepconv_backward(Tensor grad_output, Tensor input, Tensor? vertical, Tensor? horizontal, "
      "Tensor? offset, Tensor? mask, int kernel_h, int kernel_w, int pad_h, int pad_w, int dilation_h, "
      "int dilation_w, int padding_mode, bool[5] output_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("vector_add(Tensor a, Tensor b) -> Tensor");
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
