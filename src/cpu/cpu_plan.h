// The CPU planners: which loops a deform_sepconv call runs, forward and backward, chosen in one
// place from the call's facts (src/deform_sepconv_call.h: CallFacts), the machine's (CpuFacts)
// and the kernel policy. The launch code (deform_sepconv_{forward,backward}_cpu.cpp) switches over
// the plan; every limit that decides a plan is named here.
#pragma once

#include <cstdint>
#include <string>

#include "deform_sepconv_call.h"
#include "kernel_policy.h"

// The wheels target the x86-64 baseline (SSE2); on x86-64 the loops are also compiled for AVX2 + FMA +
// F16C (cpu_loops.h: run_avx2).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define EDSC_CPU_AVX2 1
#endif

namespace edsc_ext {

// Channels handled per pass over the taps: sampling weights are computed once per block.
constexpr int kCpuChannelBlock = 8;
// The fused backward splits the work into at least this many tasks (bands of output rows) when
// the batch alone gives fewer.
constexpr int64_t kCpuTasks = 16;

struct CpuFacts {
  bool avx2 = false;    // AVX2 + FMA + F16C loops are compiled, and the CPU and torch's capability have them
  int64_t threads = 1;  // torch's thread count (torch.get_num_threads())
};

// This machine's facts: the instruction set (the CPU's, unless ATEN_CPU_CAPABILITY=default asks torch
// for the baseline) and torch's current thread count.
CpuFacts this_cpu();

enum class CpuForwardKernel {
  kEmpty,        // no output elements: nothing runs
  kGridTapRows,  // calls without offsets (takes_grid_taps): whole rows a tap, vectorised along x
  kPixels,       // one output pixel at a time, bilinear samples (src/sampling.h)
};

// 16-bit calls (frame and per-pixel tensors in float16 or bfloat16) run on a float32 copy of the frame
// (and of grad_output), the per-pixel tensors read as they are (the mixed-precision loops; float16 ones
// with F16C's conversions in the AVX2 loops, f16c_half.h), the output and input gradient rounded once:
// the values the 16-bit loops compute (they too accumulate in float and round once), without a
// conversion of the frame per tap read. The plan of that float32 call is made as for any other. The
// policy's cpu_float32_frame=False keeps the 16-bit loops.
bool takes_float32_frame(const CallFacts& call, const KernelPolicy& policy);

struct CpuForwardPlan {
  CpuForwardKernel kernel = CpuForwardKernel::kEmpty;
  bool avx2 = false;           // the loops run compiled for AVX2 + FMA
  bool float32_frame = false;  // takes_float32_frame: the call runs as its float32-frame twin
};

enum class CpuBackwardKernel {
  kEmpty,          // no output pixels: the (zero) gradients as allocated
  kGridTapRows,    // row-wise, fused with the input gradient (bands of rows) when it is wanted
  kPixelsParams,   // per pixel, the per-pixel tensors' gradients only (no input gradient)
  kPixelsFused,    // per pixel, every gradient in one pass over tasks of (image, band of rows)
  kPixelsTwoPass,  // per pixel: the per-pixel gradients, then the input gradient per (image, channels)
  kSampleRows,     // calls with bilinear samples, row-wise a tap at a time, fused as kGridTapRows is
};

struct CpuBackwardPlan {
  CpuBackwardKernel kernel = CpuBackwardKernel::kEmpty;
  bool avx2 = false;
  bool float32_frame = false;  // takes_float32_frame: the call runs as its float32-frame twin
  // kGridTapRows and kSampleRows with the input gradient, kPixelsFused: bands of output rows per image (band 0 adds
  // into grad_input, the others into scratch planes summed afterwards).
  int64_t bands = 0;
  // kPixelsTwoPass: channels per input-gradient task (kCpuChannelBlock, or 1 to make a task per thread).
  int input_grad_channel_block = 0;
};

CpuForwardPlan plan_cpu_forward(const CallFacts& call, const CpuFacts& cpu, const KernelPolicy& policy);
CpuBackwardPlan plan_cpu_backward(const CallFacts& call, const CpuFacts& cpu, const KernelPolicy& policy);

// Names for edsc_ext._plan and the tests, e.g. "grid_taps_rows/avx2".
std::string plan_name(const CpuForwardPlan& plan);
std::string plan_name(const CpuBackwardPlan& plan);

}  // namespace edsc_ext
