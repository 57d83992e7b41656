// CUDA forward of deform_sepconv: the host entry point. It takes a device guard from the input and
// launches on that device's current stream, so a tensor on cuda:1 works whatever the current
// device is. plan_cuda_forward (cuda_plan.h) chooses the kernel; each family has its own
// unit (deform_sepconv_forward_{grid_taps,staged,lane_pairs,pixels}_cuda.cu), the per-pixel work of
// the bilinear ones from include/edsc_ext/deform_sepconv_pixel.h.
#include "backends.h"
#include "deform_sepconv_forward_cuda.cuh"
#include "ops.h"

namespace edsc_ext {

CudaDeviceFacts cuda_device_facts(int64_t device_index) {
  const int device = static_cast<int>(device_index);
  return {cuda_device_attribute(cudaDevAttrComputeCapabilityMajor, device),
          cuda_device_attribute(cudaDevAttrComputeCapabilityMinor, device),
          cuda_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device)};
}

Tensor deform_sepconv_forward_cuda(const Tensor& input, const OptionalTensor& vertical,
                                   const OptionalTensor& horizontal, const OptionalTensor& offset,
                                   const OptionalTensor& mask, int64_t kernel_h, int64_t kernel_w, int64_t pad_h,
                                   int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t padding_mode,
                                   const OptionalTensor& offset_dx) {
  const CudaDeviceGuard device_guard(input.get_device_index());
  const DeformSepconvConfig cfg{kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode};
  // Views of per-pixel tensors stay as they are: the planner sends them to the kernel that follows
  // their strides (launch_pixels_forward).
  const DeformSepconvTensors t =
      prepare_deform_sepconv(input, vertical, horizontal, offset, mask, cfg, nullptr, offset_dx);
  Tensor output = empty_in(input, {input.size(0), input.size(1), t.height_out, t.width_out}, t.memory_format());
  const CudaForwardPlan plan =
      plan_cuda_forward(describe_call(t, cfg, {}, false), cuda_device_facts(input.get_device_index()), kernel_policy());
  switch (plan.kernel) {
    case CudaForwardKernel::kEmpty:
      break;
    case CudaForwardKernel::kGridTaps:
      launch_grid_taps_forward(t, cfg, plan, output);
      break;
    case CudaForwardKernel::kStaged:
      launch_staged_forward(t, cfg, plan, output);
      break;
    case CudaForwardKernel::kLanePairs:
      launch_lane_pairs_forward(t, cfg, plan, output);
      break;
    case CudaForwardKernel::kPixels:
      launch_pixels_forward(t, cfg, plan, output);
      break;
  }
  return output;
}

}  // namespace edsc_ext
