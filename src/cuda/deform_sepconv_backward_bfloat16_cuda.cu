// The CUDA backward kernels for bfloat16 (deform_sepconv_backward_launch.cuh).
#include "deform_sepconv_backward_launch.cuh"

namespace edsc_ext {

template void launch_deform_sepconv_backward<BFloat16, BFloat16>(const DeformSepconvCall&, const CudaBackwardPlan&,
                                                                 const DeformSepconvGrads&, const Tensor&,
                                                                 const FixedPointInputGrad&);

}  // namespace edsc_ext
