// The CPU backward for bfloat16 (deform_sepconv_backward_loops_cpu.h).
#include "deform_sepconv_backward_loops_cpu.h"

namespace edsc_ext {

template void run_deform_sepconv_backward_cpu<BFloat16, BFloat16>(const DeformSepconvCall&, const CpuBackwardPlan&,
                                                                  DeformSepconvGrads&);

}  // namespace edsc_ext
