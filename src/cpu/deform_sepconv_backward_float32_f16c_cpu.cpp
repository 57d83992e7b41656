// The CPU backward for a float32 frame with float16 per-pixel tensors, as the AVX2 loops read them
// (F16cHalf, f16c_half.h; deform_sepconv_backward_loops_cpu.h).
#include "deform_sepconv_backward_loops_cpu.h"

namespace edsc_ext {

#ifdef EDSC_CPU_F16C
template void run_deform_sepconv_backward_cpu<float, F16cHalf>(const DeformSepconvCall&, const CpuBackwardPlan&,
                                                               DeformSepconvGrads&);
#endif

}  // namespace edsc_ext
