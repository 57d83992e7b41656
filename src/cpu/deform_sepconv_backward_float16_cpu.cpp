// The CPU backward for float16 (deform_sepconv_backward_loops_cpu.h).
#include "deform_sepconv_backward_loops_cpu.h"

namespace edsc_ext {

template void run_deform_sepconv_backward_cpu<Half, Half>(const DeformSepconvCall&, const CpuBackwardPlan&,
                                                          DeformSepconvGrads&);

}  // namespace edsc_ext
