// The CPU backward for float32 (deform_sepconv_backward_loops_cpu.h).
#include "deform_sepconv_backward_loops_cpu.h"

namespace edsc_ext {

template void run_deform_sepconv_backward_cpu<float, float>(const DeformSepconvCall&, const CpuBackwardPlan&,
                                                            DeformSepconvGrads&);

}  // namespace edsc_ext
