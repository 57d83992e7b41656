// The CUDA backward kernels for float16 (deform_sepconv_backward_launch.cuh).
#include "deform_sepconv_backward_launch.cuh"

namespace edsc_ext {

template void launch_deform_sepconv_backward<Half, Half>(const DeformSepconvCall&, const CudaBackwardPlan&,
                                                         const DeformSepconvGrads&, const Tensor&,
                                                         const FixedPointInputGrad&);

}  // namespace edsc_ext
