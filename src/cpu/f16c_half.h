// float16 per-pixel values read and written with the F16C instructions in the AVX2 loops.
// c10::Half converts in software unless the whole unit is built with F16C (__F16C__), which the
// wheels' x86-64 baseline is not, and run_avx2's target attribute does not change that. F16cHalf
// holds the same 16 bits; its conversions are _Float16's, which the compiler emits as
// vcvtph2ps / vcvtps2ph inside a function compiled for F16C (run_avx2) and, anywhere else, as calls
// to libgcc's __extendhfsf2 / __truncsfhf2, which older systems' libgcc lacks: so kernels
// instantiated with F16cHalf run only inside run_avx2 (cpu_loops.h: run_for_cpu), and a test checks
// that the library references neither function.
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu_plan.h"  // EDSC_CPU_AVX2

#if defined(EDSC_CPU_AVX2) && defined(__FLT16_MAX__)
#define EDSC_CPU_F16C 1
#endif

namespace edsc_ext {

#ifdef EDSC_CPU_F16C
struct F16cHalf {
  uint16_t bits;

  F16cHalf() = default;
  __attribute__((always_inline)) F16cHalf(float v) {  // NOLINT: converts as c10::Half does
    const _Float16 h = static_cast<_Float16>(v);      // round to nearest even, as c10::Half
    std::memcpy(&bits, &h, sizeof(bits));
  }
  __attribute__((always_inline)) operator float() const {  // NOLINT
    _Float16 h;
    std::memcpy(&h, &bits, sizeof(bits));
    return static_cast<float>(h);
  }
};
static_assert(sizeof(F16cHalf) == 2 && alignof(F16cHalf) == 2, "F16cHalf reads c10::Half's memory");
#endif

}  // namespace edsc_ext
