// The CUDA backward kernels for bfloat16 (deform_sepconv_backward_launch.cuh).
#include "deform_sepconv_backward_launch.cuh"

namespace edsc_ext {

template void launch_deform_sepconv_backward<c10::BFloat16, c10::BFloat16>(
    const DeformSepconvTensors&, const DeformSepconvConfig&, const CudaBackwardPlan&, const DeformSepconvGradBuffers&,
    const at::TensorBase&, const FixedPointInputGrad&);

}  // namespace edsc_ext
