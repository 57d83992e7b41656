// Every op's schema and every registration of its kernels (CPU, CUDA, and the backend-free ops:
// CompositeExplicitAutograd), through the LibTorch stable ABI. Beside the schemas, their one C++
// spelling: the unboxing of each op's arguments into DeformSepconvArgs, by name (forward_args).
#include "backends.h"
#include "resample2x_call.h"

namespace edsc_ext {
namespace {

// The op's arguments by name, as a forward takes them; a backward sets grad_output, output_mask and
// deterministic on the result.
DeformSepconvArgs forward_args(const Tensor& input, const OptionalTensor& vertical, const OptionalTensor& horizontal,
                               const OptionalTensor& offset, const OptionalTensor& mask, int64_t kernel_h,
                               int64_t kernel_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w,
                               int64_t padding_mode, const OptionalTensor& offset_dx) {
  return {.input = input,
          .vertical = vertical,
          .horizontal = horizontal,
          .offset = offset,
          .mask = mask,
          .kernel_h = kernel_h,
          .kernel_w = kernel_w,
          .pad_h = pad_h,
          .pad_w = pad_w,
          .dilation_h = dilation_h,
          .dilation_w = dilation_w,
          .padding_mode = padding_mode,
          .offset_dx = offset_dx};
}

template <Tensor (*kKernel)(const DeformSepconvArgs&)>
Tensor forward(const Tensor& input, const OptionalTensor& vertical, const OptionalTensor& horizontal,
               const OptionalTensor& offset, const OptionalTensor& mask, int64_t kernel_h, int64_t kernel_w,
               int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t padding_mode,
               const OptionalTensor& offset_dx) {
  return kKernel(forward_args(input, vertical, horizontal, offset, mask, kernel_h, kernel_w, pad_h, pad_w, dilation_h,
                              dilation_w, padding_mode, offset_dx));
}

template <DeformSepconvBackwardResult (*kKernel)(const DeformSepconvArgs&)>
DeformSepconvBackwardResult backward(const Tensor& grad_output, const Tensor& input, const OptionalTensor& vertical,
                                     const OptionalTensor& horizontal, const OptionalTensor& offset,
                                     const OptionalTensor& mask, int64_t kernel_h, int64_t kernel_w, int64_t pad_h,
                                     int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t padding_mode,
                                     const std::vector<bool>& output_mask, const OptionalTensor& offset_dx,
                                     bool deterministic) {
  DeformSepconvArgs args = forward_args(input, vertical, horizontal, offset, mask, kernel_h, kernel_w, pad_h, pad_w,
                                        dilation_h, dilation_w, padding_mode, offset_dx);
  args.grad_output = &grad_output;
  args.output_mask = output_mask_array(output_mask);
  args.deterministic = deterministic;
  return kKernel(args);
}

std::vector<std::string> plan(const Tensor& input, const OptionalTensor& vertical, const OptionalTensor& horizontal,
                              const OptionalTensor& offset, const OptionalTensor& mask, int64_t kernel_h,
                              int64_t kernel_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w,
                              int64_t padding_mode, const std::vector<bool>& output_mask,
                              const std::vector<int64_t>& cpu_facts, const std::vector<int64_t>& cuda_device,
                              const OptionalTensor& offset_dx, bool deterministic) {
  DeformSepconvArgs args = forward_args(input, vertical, horizontal, offset, mask, kernel_h, kernel_w, pad_h, pad_w,
                                        dilation_h, dilation_w, padding_mode, offset_dx);
  args.output_mask = output_mask_array(output_mask);
  args.deterministic = deterministic;
  return deform_sepconv_plan(args, cpu_facts, cuda_device);
}

}  // namespace
}  // namespace edsc_ext

// The backward's output_mask asks for its first five returns (grad_offset asks for grad_offset_dx
// too); deterministic: torch.are_deterministic_algorithms_enabled() (the stable ABI does not expose
// it to C++), which edsc_ext/ops.py passes.
STABLE_TORCH_LIBRARY(edsc_ext, m) {
  m.def(
      "deform_sepconv_forward(Tensor input, Tensor? vertical, Tensor? horizontal, Tensor? offset, Tensor? mask, "
      "int kernel_h, int kernel_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int padding_mode, "
      "Tensor? offset_dx=None) -> Tensor");
  m.def(
      "deform_sepconv_backward(Tensor grad_output, Tensor input, Tensor? vertical, Tensor? horizontal, "
      "Tensor? offset, Tensor? mask, int kernel_h, int kernel_w, int pad_h, int pad_w, int dilation_h, "
      "int dilation_w, int padding_mode, bool[5] output_mask, Tensor? offset_dx=None, bool deterministic=False) "
      "-> (Tensor grad_input, Tensor grad_vertical, Tensor grad_horizontal, Tensor grad_offset, Tensor grad_mask, "
      "Tensor grad_offset_dx)");
  m.def("vector_add(Tensor a, Tensor b) -> Tensor");
  m.def("upsample_bilinear2x(Tensor input) -> Tensor");
  m.def("avg_pool2x(Tensor input) -> Tensor");
  // edsc_ext.ops.SPEC, edsc_ext._plan and edsc_ext.kernel_policy (edsc_ext/ops.py, edsc_ext/_policy.py).
  m.def("deform_sepconv_spec() -> str");
  m.def(
      "deform_sepconv_plan(Tensor input, Tensor? vertical, Tensor? horizontal, Tensor? offset, Tensor? mask, "
      "int kernel_h, int kernel_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int padding_mode, "
      "bool[5] output_mask, int[] cpu_facts, int[] cuda_device, Tensor? offset_dx=None, bool deterministic=False) "
      "-> str[]");
  m.def("kernel_policy_switches() -> str");
  m.def("get_kernel_policy() -> (str[] names, int[] values)");
  m.def("set_kernel_policy(str[] names, int[] values) -> ()");
}

// The describing ops run the same on every device (and on meta tensors).
STABLE_TORCH_LIBRARY_IMPL(edsc_ext, CompositeExplicitAutograd, m) {
  m.impl("deform_sepconv_spec", TORCH_BOX(&edsc_ext::deform_sepconv_spec));
  m.impl("deform_sepconv_plan", TORCH_BOX(&edsc_ext::plan));
  m.impl("kernel_policy_switches", TORCH_BOX(&edsc_ext::kernel_policy_switches));
  m.impl("get_kernel_policy", TORCH_BOX(&edsc_ext::get_kernel_policy_op));
  m.impl("set_kernel_policy", TORCH_BOX(&edsc_ext::set_kernel_policy_op));
}

STABLE_TORCH_LIBRARY_IMPL(edsc_ext, CPU, m) {
  m.impl("deform_sepconv_forward", TORCH_BOX(&edsc_ext::forward<&edsc_ext::deform_sepconv_forward_cpu>));
  m.impl("deform_sepconv_backward", TORCH_BOX(&edsc_ext::backward<&edsc_ext::deform_sepconv_backward_cpu>));
  m.impl("vector_add", TORCH_BOX(&edsc_ext::vector_add_cpu));
  m.impl("upsample_bilinear2x", TORCH_BOX(&edsc_ext::upsample_bilinear2x_cpu));
  m.impl("avg_pool2x", TORCH_BOX(&edsc_ext::avg_pool2x_cpu));
}

#ifdef EDSC_EXT_WITH_CUDA
STABLE_TORCH_LIBRARY_IMPL(edsc_ext, CUDA, m) {
  m.impl("deform_sepconv_forward", TORCH_BOX(&edsc_ext::forward<&edsc_ext::deform_sepconv_forward_cuda>));
  m.impl("deform_sepconv_backward", TORCH_BOX(&edsc_ext::backward<&edsc_ext::deform_sepconv_backward_cuda>));
  m.impl("vector_add", TORCH_BOX(&edsc_ext::vector_add_cuda));
  m.impl("upsample_bilinear2x", TORCH_BOX(&edsc_ext::upsample_bilinear2x_cuda));
  m.impl("avg_pool2x", TORCH_BOX(&edsc_ext::avg_pool2x_cuda));
}
#endif
