// The CUDA backward kernels for float64 (deform_sepconv_backward_kernels.cuh).
#include "deform_sepconv_backward_kernels.cuh"

namespace edsc_ext {

template void launch_deform_sepconv_backward<double>(const DeformSepconvTensors&, const DeformSepconvConfig&,
                                                   std::array<at::Tensor, 5>&, bool, const FixedPointInputGrad&);

}  // namespace edsc_ext
