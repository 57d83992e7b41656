// The CPU planners (cpu_plan.h). Named *_cpu.cpp: the JIT build names objects by base name.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cpu_plan.h"
#include "torch_stable.h"

namespace edsc_ext {
namespace {

// Bands of output rows per image for the fused backward, or 0 for the two-pass one: enough tasks
// (kCpuTasks) when the batch is small, as long as their scratch planes fit the budget; where they
// do not, fewer bands still beat the two-pass backward if they outnumber the channels (its tasks).
// The split depends on the shape and budget alone, so the result does not depend on the thread
// count (deform_sepconv_backward_loops_cpu.h).
int64_t cpu_backward_bands(const CallFacts& c, int64_t scratch_bytes) {
  const int64_t image_bytes = c.channels * c.height_in * c.width_in * (c.element_size == 8 ? 8 : 4);  // acc_t
  const int64_t wanted =
      std::min(c.batch >= kCpuTasks ? 1 : (kCpuTasks + c.batch - 1) / c.batch, std::max<int64_t>(c.height_out, 1));
  const int64_t fit = std::min(wanted, 1 + scratch_bytes / std::max<int64_t>(1, c.batch * image_bytes));
  return (fit == wanted || fit > c.channels) ? fit : 0;
}

const char* isa_name(bool avx2) { return avx2 ? "/avx2" : "/baseline"; }
const char* float32_frame_name(bool float32_frame) { return float32_frame ? "+float32_frame" : ""; }

}  // namespace

CpuFacts this_cpu() {
  CpuFacts facts;
#ifdef EDSC_CPU_AVX2
  // torch's capability is fixed for the process (ATen reads it once); so is the CPU's. The stable
  // ABI does not report torch's, so it is derived the way ATen derives it on x86-64: the CPU's, unless
  // ATEN_CPU_CAPABILITY=default asks for the baseline (read once, like ATen does).
  static const bool avx2 = [] {
    const char* requested = std::getenv("ATEN_CPU_CAPABILITY");
    const bool baseline_requested = requested != nullptr && std::strcmp(requested, "default") == 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
           !baseline_requested;
  }();
  facts.avx2 = avx2;
#endif
  facts.threads = static_cast<int64_t>(torch::stable::get_num_threads());
  return facts;
}

bool takes_float32_frame(const CallFacts& call, const KernelPolicy& policy) {
  return policy.cpu_float32_frame && call.element_size == 2 && !call.mixed_precision();
}

CpuForwardPlan plan_cpu_forward(const CallFacts& call, const CpuFacts& cpu, const KernelPolicy& policy) {
  CpuForwardPlan plan;
  plan.avx2 = cpu.avx2 && !policy.cpu_baseline;
  if (call.batch * call.channels * call.height_out * call.width_out == 0) return plan;
  plan.float32_frame = takes_float32_frame(call, policy);
  // The row loops read dense per-pixel tensors; views read in place take the per-pixel loops.
  const bool rows = takes_grid_taps(call, policy) && call.dense_per_pixel;
  plan.kernel = rows ? CpuForwardKernel::kGridTapRows : CpuForwardKernel::kPixels;
  return plan;
}

CpuBackwardPlan plan_cpu_backward(const CallFacts& call, const CpuFacts& cpu, const KernelPolicy& policy) {
  CpuBackwardPlan plan;
  plan.avx2 = cpu.avx2 && !policy.cpu_baseline;
  if (call.batch == 0 || call.height_out * call.width_out == 0) return plan;
  plan.float32_frame = takes_float32_frame(call, policy);
  const bool grid_taps = takes_grid_taps(call, policy);
  // Row-wise samples pay where a pixel has fewer channels than a block (RGB): the per-pixel loop's
  // work there is the per-tap overhead, which the rows overlap across pixels; with whole blocks of
  // channels the per-pixel loop reads a pixel's channels together and is faster (BENCHMARKS.md).
  const bool sample_rows = !grid_taps && policy.cpu_sample_rows && call.channels < kCpuChannelBlock;
  const CpuBackwardKernel rows = grid_taps ? CpuBackwardKernel::kGridTapRows : CpuBackwardKernel::kSampleRows;
  if (!call.input_grad()) {
    plan.kernel = grid_taps || sample_rows ? rows : CpuBackwardKernel::kPixelsParams;
    return plan;
  }
  // The row-wise backwards have no per-channel pass: beyond the scratch budget, one band per image.
  plan.bands =
      std::max<int64_t>(grid_taps || sample_rows ? 1 : 0, cpu_backward_bands(call, policy.cpu_scratch_mb << 20));
  if (grid_taps || sample_rows) {
    plan.kernel = rows;
  } else if (plan.bands > 0) {
    plan.kernel = CpuBackwardKernel::kPixelsFused;
  } else {
    plan.kernel = CpuBackwardKernel::kPixelsTwoPass;
    // Blocks of channels share one sample each, where that still makes a task per thread.
    const int64_t blocks = call.batch * ((call.channels + kCpuChannelBlock - 1) / kCpuChannelBlock);
    plan.input_grad_channel_block = blocks >= cpu.threads ? kCpuChannelBlock : 1;
  }
  return plan;
}

std::string plan_name(const CpuForwardPlan& plan) {
  switch (plan.kernel) {
    case CpuForwardKernel::kEmpty:
      return "empty";
    case CpuForwardKernel::kGridTapRows:
      return std::string("grid_taps_rows") + isa_name(plan.avx2) + float32_frame_name(plan.float32_frame);
    case CpuForwardKernel::kPixels:
      return std::string("pixels") + isa_name(plan.avx2) + float32_frame_name(plan.float32_frame);
  }
  return "unknown";
}

std::string plan_name(const CpuBackwardPlan& plan) {
  const char* kernel = "unknown";
  switch (plan.kernel) {
    case CpuBackwardKernel::kEmpty:
      return "empty";
    case CpuBackwardKernel::kGridTapRows:
      kernel = "grid_taps_rows";
      break;
    case CpuBackwardKernel::kPixelsParams:
      kernel = "pixels_params";
      break;
    case CpuBackwardKernel::kPixelsFused:
      kernel = "pixels_fused";
      break;
    case CpuBackwardKernel::kPixelsTwoPass:
      kernel = "pixels_two_pass";
      break;
    case CpuBackwardKernel::kSampleRows:
      kernel = "sample_rows";
      break;
  }
  return kernel + std::string(isa_name(plan.avx2)) + float32_frame_name(plan.float32_frame);
}

}  // namespace edsc_ext
