// CUDA forward of deform_sepconv: the host entry point. It takes a device guard from the input and
// launches on that device's current stream, so a tensor on cuda:1 works whatever the current
// device is. plan_cuda_forward (cuda_plan.h) chooses the kernel; each family has its own
// unit (deform_sepconv_forward_{grid_taps,staged,lane_pairs,pixels}_cuda.cu), the per-pixel work of
// the bilinear ones from src/sampling.h.
#include "backends.h"
#include "deform_sepconv_forward_cuda.cuh"

namespace edsc_ext {

CudaDeviceFacts cuda_device_facts(int64_t device_index) {
  const int device = static_cast<int>(device_index);
  return {cuda_device_attribute(cudaDevAttrComputeCapabilityMajor, device),
          cuda_device_attribute(cudaDevAttrComputeCapabilityMinor, device),
          cuda_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device)};
}

Tensor deform_sepconv_forward_cuda(const DeformSepconvArgs& args) {
  const CudaDeviceGuard device_guard(args.input.get_device_index());
  // Views of per-pixel tensors stay as they are: the planner sends them to the kernel that follows
  // their strides (launch_pixels_forward).
  const DeformSepconvCall call = prepare(args);
  const CallFacts& f = call.facts;
  Tensor output = empty_in(call.input, {f.batch, f.channels, f.height_out, f.width_out}, f.memory_format());
  const CudaForwardPlan plan = plan_cuda_forward(f, cuda_device_facts(call.input.get_device_index()), kernel_policy());
  switch (plan.kernel) {
    case CudaForwardKernel::kEmpty:
      break;
    case CudaForwardKernel::kGridTaps:
      launch_grid_taps_forward(call, plan, output);
      break;
    case CudaForwardKernel::kStaged:
      launch_staged_forward(call, plan, output);
      break;
    case CudaForwardKernel::kLanePairs:
      launch_lane_pairs_forward(call, plan, output);
      break;
    case CudaForwardKernel::kPixels:
      launch_pixels_forward(call, plan, output);
      break;
  }
  return output;
}

}  // namespace edsc_ext
