// The CUDA backward kernels for a float32 frame with float16 per-pixel tensors (mixed precision, as
// autocast makes them; deform_sepconv_backward_launch.cuh).
#include "deform_sepconv_backward_launch.cuh"

namespace edsc_ext {

template void launch_deform_sepconv_backward<float, Half>(const DeformSepconvCall&, const CudaBackwardPlan&,
                                                          const DeformSepconvGrads&, const Tensor&,
                                                          const FixedPointInputGrad&);

}  // namespace edsc_ext
