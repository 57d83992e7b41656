// The CUDA backward kernels for bfloat16 (deform_sepconv_backward_kernels.cuh).
#include "deform_sepconv_backward_kernels.cuh"

namespace edsc_ext {

template void launch_deform_sepconv_backward<c10::BFloat16>(const DeformSepconvTensors&, const DeformSepconvConfig&,
                                                   std::array<at::Tensor, 5>&, bool, const FixedPointInputGrad&);

}  // namespace edsc_ext
