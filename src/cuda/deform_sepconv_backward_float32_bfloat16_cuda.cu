// The CUDA backward kernels for a float32 frame with bfloat16 per-pixel tensors (mixed precision, as
// autocast makes them; deform_sepconv_backward_launch.cuh).
#include "deform_sepconv_backward_launch.cuh"

namespace edsc_ext {

template void launch_deform_sepconv_backward<float, c10::BFloat16>(const DeformSepconvTensors&,
                                                                   const DeformSepconvConfig&, const CudaBackwardPlan&,
                                                                   const DeformSepconvGradBuffers&,
                                                                   const at::TensorBase&, const FixedPointInputGrad&);

}  // namespace edsc_ext
