// Shared by the CPU backend's translation units (deform_sepconv_forward_cpu.cpp,
// deform_sepconv_backward_cpu.cpp): the instruction-set switch their parallel loops run under,
// and the loop constants.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

namespace edsc_ext {
namespace {


// Instruction sets: the wheels target the x86-64 baseline (SSE2), which leaves the sampling math
// without FMA or vector rounding. On x86-64 the loops are also compiled for AVX2 + FMA (x86 CPUs
// since 2013) and run that way where the CPU has them: 1.2-1.4x faster forward on a 2-core EPYC.
// Only run_avx2 is compiled for AVX2, with the loop bodies and the per-pixel code force-inlined
// into it, so no out-of-line AVX2 code can be reached on an older CPU. EDSC_EXT_CPU_ISA=baseline
// forces the baseline build (tests; results then differ in the last bits, FMA rounds once).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define EDSC_CPU_AVX2 1
template <typename Body>
__attribute__((target("avx2,fma"))) void run_avx2(const Body& body) {
  body();
}
#endif
#if defined(__GNUC__) || defined(__clang__)
#define EDSC_CPU_INLINE __attribute__((always_inline))
#else
#define EDSC_CPU_INLINE
#endif

bool use_avx2() {
#ifdef EDSC_CPU_AVX2
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const char* isa = std::getenv("EDSC_EXT_CPU_ISA");
  return supported && !(isa != nullptr && std::string(isa) == "baseline");
#else
  return false;
#endif
}

// Runs body (a lambda marked EDSC_CPU_INLINE) compiled for AVX2 + FMA when `avx2`, else as built.
template <typename Body>
void run_for_cpu(bool avx2, const Body& body) {
#ifdef EDSC_CPU_AVX2
  if (avx2) return run_avx2(body);
#endif
  body();
}

// Channels handled per pass over the taps: sampling weights are computed once per block.
constexpr int kCpuChannelBlock = 8;
// Pixels per parallel task, so tiny images still split and huge ones amortise scheduling.
constexpr int64_t kPixelGrain = 1024;

}  // namespace
}  // namespace edsc_ext
