// The CPU backward for a float32 frame with bfloat16 per-pixel tensors (deform_sepconv_backward_loops_cpu.h).
#include "deform_sepconv_backward_loops_cpu.h"

namespace edsc_ext {

template void run_deform_sepconv_backward_cpu<float, BFloat16>(const DeformSepconvCall&, const CpuBackwardPlan&,
                                                               DeformSepconvGrads&);

}  // namespace edsc_ext
