// The facts about one deform_sepconv call that the planners (src/cpu/cpu_plan.h,
// src/cuda/cuda_plan.h) choose its kernels from: shapes, dtype size, layout, which
// optional tensors are present, alignment, requested gradients, determinism. Plain values, so a
// plan can be made for any call description, also for a CUDA device on a machine without one
// (edsc_ext._plan, tests/test_plans.py).
#pragma once

#include <array>
#include <cstdint>

#include "deform_sepconv_tensors.h"
#include "kernel_policy.h"

namespace edsc_ext {

struct DeformSepconvCall {
  int64_t batch = 0, channels = 0, height_in = 0, width_in = 0, height_out = 0, width_out = 0;
  DeformSepconvConfig cfg{};
  int64_t element_size = 4;  // bytes of the frame's dtype: 8 float64, 4 float32, 2 float16 / bfloat16
  // Bytes of the per-pixel tensors' dtype: element_size, or 2 with a float32 frame (mixed precision).
  int64_t param_element_size = 4;
  bool channels_last = false;
  bool use_32bit_indexing = true;
  bool has_vertical = false, has_horizontal = false, has_offset = false, has_mask = false;
  // The largest of 16, 8, 4, 2, 1 that every present per-pixel tensor's start address is a multiple of.
  int64_t per_pixel_alignment = 16;
  // The same of the input (the frame), and of grad_output (a backward's; 16 where there is none).
  int64_t input_alignment = 16;
  int64_t grad_output_alignment = 16;
  // The offset tensor (when present) starts on a (dy, dx) pair boundary.
  bool offset_pairs_aligned = true;
  // The offsets come as two tensors, dy and dx (DeformSepconvParams::offset_dx): only the kernels
  // that read offsets through GlobalPixelValues take them.
  bool split_offsets = false;
  // Every present per-pixel tensor is dense in the call's layout; else some are views read in place
  // (DeformSepconvTensors::dense_per_pixel), which only kernels taking PerPixelStrides read.
  bool dense_per_pixel = true;
  // The gradients the backward computes: requested (output_mask) and of a present tensor, in the
  // order input, vertical, horizontal, offset, mask.
  std::array<bool, 5> grads{};
  bool deterministic = false;  // torch.use_deterministic_algorithms(True)

  int64_t output_pixels() const { return batch * height_out * width_out; }
  bool input_grad() const { return grads[0]; }
  bool any_per_pixel_grad() const { return grads[1] || grads[2] || grads[3] || grads[4]; }
  bool square_kernel(int64_t k) const { return cfg.kernel_h == k && cfg.kernel_w == k; }
  // Per-pixel tensors in float16 / bfloat16 with a float32 frame: only the kernels that read them
  // through GlobalPixelValues (include/edsc_ext/deform_sepconv_pixel.h) take such calls.
  bool mixed_precision() const { return param_element_size != element_size; }
};

// The facts of a prepared call (prepare_deform_sepconv). `output_mask` as the backward op takes it.
DeformSepconvCall describe_call(const DeformSepconvTensors& t, const DeformSepconvConfig& cfg,
                                const std::array<bool, 5>& output_mask, bool deterministic);

// Calls whose taps sit on the pixel grid (no offsets, no dilation, a non-empty frame): each tap's
// sample is one input pixel (grid_tap_pixel), which the CPU and CUDA grid-tap kernels exploit,
// unless the policy sends them to the bilinear kernels.
// EDSC mode's shifted, doubled border samples are not grid-tap code either.
inline bool takes_grid_taps(const DeformSepconvCall& c, const KernelPolicy& policy) {
  if (!policy.grid_taps || c.has_offset || c.cfg.dilation_h != 1 || c.cfg.dilation_w != 1) return false;
  if (c.cfg.padding_mode == kPaddingEdsc) return false;
  return c.height_in > 0 && c.width_in > 0;
}

}  // namespace edsc_ext
