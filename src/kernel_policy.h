// The kernel policy: which kernel families the planners (src/cpu/cpu_plan.h, src/cuda/cuda_plan.h)
// may choose, and the CPU backward's scratch budget. Python sets it with edsc_ext.kernel_policy(...)
// (edsc_ext/_policy.py, README "Kernel policy"), by the switches' names, and builds its KernelPolicy
// from kPolicySwitches (the op kernel_policy_switches): each switch's name, default and description
// are written here once. It is one process-wide value, not per thread, because the backward of a call
// runs on autograd's own threads. Each op call reads it once, with one atomic load, so a call sees
// one consistent policy and changing it never races with calls in flight. Nothing here reads the
// environment: edsc_ext/_policy.py turns the EDSC_EXT_* variables into the initial policy, once, at
// import.
#pragma once

#include <cstdint>

namespace edsc_ext {

// The fields' initializers are the defaults.
struct KernelPolicy {
  bool grid_taps = true;
  bool plain_forward = false;
  bool prefetch = true;
  bool packed_frame = true;
  bool input_grad_tile = true;
  bool warp_staging = true;
  bool vector_loads = true;
  bool channel_lanes = true;
  bool lane_tile = true;
  bool lean_rgb_backward = true;
  int64_t cpu_scratch_mb = 256;
  bool cpu_baseline = false;  // the switch cpu_isa: "baseline" (true) or "auto"
  bool cpu_float32_frame = true;
  bool cpu_sample_rows = true;

  bool operator==(const KernelPolicy& other) const;
};

// One switch: the keyword of edsc_ext.kernel_policy, the field it sets, and what it does. Its kind
// is the field's: a flag (a bool); a count (an int64_t in [0, max_count]); a choice between two
// names, choices[0] for the flag's false and choices[1] for its true. A row names the fields of its
// kind; those it leaves out are null (no defaults: nvcc's C++17 mode fills a field left out before
// a named one with zero whatever its default).
struct PolicySwitch {
  const char* name;
  bool KernelPolicy::* flag;
  int64_t KernelPolicy::* count;
  int64_t max_count;
  const char* choices[2];
  const char* description;
};

inline constexpr PolicySwitch kPolicySwitches[] = {
    {.name = "grid_taps",
     .flag = &KernelPolicy::grid_taps,
     .description = "calls without offsets or dilation (sepconv) may take the grid-tap kernels, which read each "
                    "tap's pixel directly (CUDA: from each tile's input window in shared memory; CPU: row by row); "
                    "False sends them to the bilinear kernels"},
    {.name = "plain_forward",
     .flag = &KernelPolicy::plain_forward,
     .description = "CUDA: every forward takes the one-thread-per-(pixel, channel block) kernel (no grid-tap, "
                    "staged or lane-pair forward)"},
    {.name = "prefetch",
     .flag = &KernelPolicy::prefetch,
     .description = "CUDA, NCHW 5x5: each warp first prefetches its per-pixel values into L2 (the exact-RGB "
                    "forward: 2-byte values only, where it measured faster)"},
    {.name = "packed_frame",
     .flag = &KernelPolicy::packed_frame,
     .description = "CUDA, NCHW 5x5 forward of exactly 3 channels in float16 or bfloat16 (frame and per-pixel "
                    "tensors): the frame is first copied into one (N, H, W, 4) buffer, so that each bilinear corner "
                    "reads its three channels with one load; False reads the three planes"},
    {.name = "input_grad_tile",
     .flag = &KernelPolicy::input_grad_tile,
     .description = "CUDA backward: the input gradient goes through the shared-memory tile; False adds every "
                    "sample with a global atomic (the path otherwise taken only for footprints too large for "
                    "shared memory or tensors that need 64-bit indices)"},
    {.name = "warp_staging",
     .flag = &KernelPolicy::warp_staging,
     .description = "CUDA, channels_last 5x5 backward: the per-pixel values are staged through shared memory a "
                    "warp at a time; False reads them in place"},
    {.name = "vector_loads",
     .flag = &KernelPolicy::vector_loads,
     .description = "CUDA, channels_last forward of a multiple of 4 channels in the one-thread-per-(pixel, channel "
                    "block) kernel (many channels, mixed precision): each bilinear corner's block of 4 or 8 "
                    "channels is read with vector loads; False reads them one by one"},
    {.name = "channel_lanes",
     .flag = &KernelPolicy::channel_lanes,
     .description = "CUDA, channels_last backward of a multiple of 8 channels (float32 and the half types; not a "
                    "deterministic input gradient): adjacent threads share a pixel's channels in blocks of 8 read "
                    "with vector loads, and add the input gradient with vector atomics; False runs it on NCHW "
                    "copies"},
    {.name = "lane_tile",
     .flag = &KernelPolicy::lane_tile,
     .description = "CUDA, channels_last backward of 8 to 32 channels that the channel lanes take, with the input "
                    "gradient: the lanes add it into a fixed-point tile in shared memory, flushed to global memory "
                    "once per tile, instead of a global atomic per tap, corner and channel (deterministic calls "
                    "too)"},
    {.name = "lean_rgb_backward",
     .flag = &KernelPolicy::lean_rgb_backward,
     .description = "CUDA, NCHW 5x5 backward of exactly 3 channels through the shared-memory tile (float32 and the "
                    "half types): a kernel per padding mode, the channels' corner values summed against the output "
                    "gradient before the parameter gradients, each tap's tile elements and fixed-point weights found "
                    "once for its three channels; False runs the generic tiled kernel"},
    {.name = "cpu_scratch_mb",
     .count = &KernelPolicy::cpu_scratch_mb,
     .max_count = (int64_t(1) << 31) - 1,
     .description = "CPU backward: megabytes of scratch planes that may be used to split one image over threads; "
                    "beyond it (or at 0) the input gradient takes a slower pass per (image, channel block) instead"},
    {.name = "cpu_isa",
     .flag = &KernelPolicy::cpu_baseline,
     .choices = {"auto", "baseline"},
     .description = "CPU loops: 'auto' runs them compiled for AVX2 + FMA where torch reports that capability "
                    "(torch.backends.cpu.get_cpu_capability() is AVX2 or AVX512; torch's ATEN_CPU_CAPABILITY "
                    "lowers it), 'baseline' the plain x86-64 build (results then differ in the last bits: FMA "
                    "rounds once)"},
    {.name = "cpu_float32_frame",
     .flag = &KernelPolicy::cpu_float32_frame,
     .description = "CPU, calls whose frame and per-pixel tensors are float16 or bfloat16: the loops run on a "
                    "float32 copy of the frame (and of a backward's grad_output), the output and input gradient "
                    "rounded once (the same values); False runs the 16-bit loops, which convert every value they "
                    "read"},
    {.name = "cpu_sample_rows",
     .flag = &KernelPolicy::cpu_sample_rows,
     .description = "CPU backward of calls with offsets or dilation and fewer than 8 channels (RGB): tap by tap "
                    "along each output row (every pixel's sample of a tap, then each channel's reads and adds, "
                    "then the pixels' parameter gradients); False runs it pixel by pixel"},
};

// A switch's value as the ops carry it: a flag 0 or 1, a count itself, a choice its index.
inline int64_t switch_value(const KernelPolicy& policy, const PolicySwitch& s) {
  return s.count != nullptr ? policy.*s.count : int64_t(policy.*s.flag);
}

inline bool KernelPolicy::operator==(const KernelPolicy& other) const {
  for (const PolicySwitch& s : kPolicySwitches) {
    if (switch_value(*this, s) != switch_value(other, s)) return false;
  }
  return true;
}

// The process-wide policy (one atomic load) and its replacement (one atomic store).
KernelPolicy kernel_policy();
void set_kernel_policy(const KernelPolicy& policy);

}  // namespace edsc_ext
