// The CPU backward for float64 (deform_sepconv_backward_loops_cpu.h).
#include "deform_sepconv_backward_loops_cpu.h"

namespace edsc_ext {

template void run_deform_sepconv_backward_cpu<double, double>(const DeformSepconvCall&, const CpuBackwardPlan&,
                                                              DeformSepconvGrads&);

}  // namespace edsc_ext
