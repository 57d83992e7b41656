// The CUDA backward kernels for float32 (deform_sepconv_backward_kernels.cuh).
#include "deform_sepconv_backward_kernels.cuh"

namespace edsc_ext {

template void launch_deform_sepconv_backward<float>(const DeformSepconvTensors&, const DeformSepconvConfig&,
                                                   std::array<at::Tensor, 5>&, bool, const FixedPointInputGrad&);

}  // namespace edsc_ext
