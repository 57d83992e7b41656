// Per-pixel values of channels_last calls, staged through shared memory a warp at a time.
//
// In channels_last a pixel's 2K + 3K^2 per-pixel values (85 at K=5) are contiguous, so when each
// lane owns one output pixel, a warp-wide load of "tap t of every lane's pixel" touches 32
// different cache lines (one per lane, 340 bytes apart in float32), and each line is reused
// across the taps only if it stays in L1. Measured on the H200 (train float32, ncu): the plain
// kernels then move 3-5x the L2 sectors of the NCHW ones, and L2 throughput, not DRAM, bounds
// them. A warp's 32 consecutive pixels are one contiguous run of every per-pixel tensor, so here
// the warp copies each row of taps of that run to shared memory with consecutive lanes on
// consecutive addresses, the pixel code reads its values from there, and the gradients it writes
// go back the same way. The policy has the interface of GlobalPixelValues
// (include/edsc_ext/deform_sepconv_pixel.h); every lane of the warp must construct it and run the
// pixel code, active or not, since the copies are shared.
#pragma once

#include "deform_sepconv_cuda.cuh"

namespace edsc_ext {

constexpr int kWarpSize = 32;
// The kernel size the warp-staged kernels are compiled for (KH = KW).
constexpr int kWarpStagedKernel = 5;

// One warp's shared memory for the values (the forward). Rows of a lane are padded to an odd
// length where they would be even, so that lanes reading the same tap hit different banks.
template <typename scalar_t, int kKernel>
struct WarpStagedRows {
  static constexpr int kOffsetRow = 2 * kKernel + 1;  // the row's 2K offsets, padded
  scalar_t vertical[kWarpSize * kKernel];
  scalar_t horizontal[kWarpSize * kKernel];
  scalar_t offset[kWarpSize * kOffsetRow];  // the current row; its gradients replace it in place
  scalar_t mask[kWarpSize * kKernel];       // likewise
};

// ... and for the values and their gradients (the backward).
template <typename scalar_t, int kKernel>
struct WarpStagedBuffers : WarpStagedRows<scalar_t, kKernel> {
  scalar_t grad_vertical[kWarpSize * kKernel];
  scalar_t grad_horizontal[kWarpSize * kKernel];
  float grad_output_max[kWarpSize];
};

// The channels_last per-pixel tensors of output pixels [first, first + count) (index
// n * H_out * W_out + y * W_out + x, consecutive in memory), lane l owning pixel first + l.
template <typename scalar_t, typename index_t, int kKernel, typename Buffers = WarpStagedBuffers<scalar_t, kKernel>>
struct WarpStagedPixelValues {
  static constexpr int kTaps = kKernel * kKernel;
  Buffers& buf;
  const DeformSepconvParams<scalar_t, index_t>& p;
  DeformSepconvParamGrads<scalar_t> grads;
  index_t first;
  int count, lane;

  // Copies values [begin, begin + per_pixel) of each pixel of a (N, channels, H, W) channels_last
  // tensor into rows of `row` elements (or back, for `to_global`).
  template <bool kToGlobal, typename Global>
  __device__ void copy(Global* global, index_t channels, index_t begin, int per_pixel, scalar_t* shared,
                       int row) const {
    const int elements = count * per_pixel;
    for (int e = lane; e < elements; e += kWarpSize) {
      const int q = e / per_pixel, k = e - q * per_pixel;
      const index_t g = (first + q) * channels + begin + k;
      if constexpr (kToGlobal) {
        global[g] = shared[q * row + k];
      } else {
        shared[q * row + k] = global[g];
      }
    }
  }

  // Every lane of the warp, in step: stages the vertical and horizontal kernels.
  __device__ WarpStagedPixelValues(Buffers& buffers, const DeformSepconvParams<scalar_t, index_t>& params,
                                   const DeformSepconvParamGrads<scalar_t>& param_grads, index_t first_pixel,
                                   int pixels, int lane_index)
      : buf(buffers), p(params), grads(param_grads), first(first_pixel), count(pixels), lane(lane_index) {
    __syncwarp();  // a previous use of the buffers is over
    if (p.vertical) copy<false>(p.vertical, kKernel, 0, kKernel, buf.vertical, kKernel);
    if (p.horizontal) copy<false>(p.horizontal, kKernel, 0, kKernel, buf.horizontal, kKernel);
    __syncwarp();
  }

  __device__ bool active() const { return lane < count; }

  __device__ void begin_row(index_t i) {
    __syncwarp();  // the previous row's values have been read and its gradients written back
    if (p.offset) copy<false>(p.offset, 2 * kTaps, 2 * kKernel * i, 2 * kKernel, buf.offset, Buffers::kOffsetRow);
    if (p.mask) copy<false>(p.mask, kTaps, kKernel * i, kKernel, buf.mask, kKernel);
    __syncwarp();
  }

  __device__ void end_row(index_t i) {
    if (!grads.offset && !grads.mask) return;
    __syncwarp();
    if (grads.offset) {
      copy<true>(grads.offset, 2 * kTaps, 2 * kKernel * i, 2 * kKernel, buf.offset, Buffers::kOffsetRow);
    }
    if (grads.mask) copy<true>(grads.mask, kTaps, kKernel * i, kKernel, buf.mask, kKernel);
  }

  // Every lane, after the pixel code: writes the vertical and horizontal gradients back.
  __device__ void finish() {
    if (!grads.vertical && !grads.horizontal) return;
    __syncwarp();
    if (grads.vertical) copy<true>(grads.vertical, kKernel, 0, kKernel, buf.grad_vertical, kKernel);
    if (grads.horizontal) copy<true>(grads.horizontal, kKernel, 0, kKernel, buf.grad_horizontal, kKernel);
  }

  __device__ const scalar_t* horizontal_values() const { return p.horizontal ? buf.horizontal + lane * kKernel : nullptr; }
  __device__ index_t horizontal_stride() const { return 1; }
  template <typename acc_t>
  __device__ acc_t vertical(index_t i) const {
    return p.vertical ? static_cast<acc_t>(buf.vertical[lane * kKernel + i]) : acc_t(1);
  }
  template <typename acc_t>
  __device__ acc_t mask_value(index_t j, index_t) const {
    return p.mask ? static_cast<acc_t>(buf.mask[lane * kKernel + j]) : acc_t(1);
  }
  __device__ bool has_offset() const { return p.offset != nullptr; }
  template <typename acc_t>
  __device__ acc_t offset_value(index_t j, index_t, int component) const {
    return static_cast<acc_t>(buf.offset[lane * Buffers::kOffsetRow + 2 * j + component]);
  }

  __device__ bool any_grad() const { return grads.any(); }
  __device__ bool wants_vertical_grad() const { return grads.vertical != nullptr; }
  __device__ bool wants_horizontal_grad() const { return grads.horizontal != nullptr; }
  __device__ bool wants_offset_grad() const { return grads.offset != nullptr; }
  __device__ bool wants_mask_grad() const { return grads.mask != nullptr; }
  __device__ void store_vertical_grad(index_t i, scalar_t v) const { buf.grad_vertical[lane * kKernel + i] = v; }
  __device__ void store_horizontal_grad(index_t j, scalar_t v) const { buf.grad_horizontal[lane * kKernel + j] = v; }
  // In place of the value just read (same lane, same tap), written back by end_row.
  __device__ void store_mask_grad(index_t j, index_t, scalar_t v) const { buf.mask[lane * kKernel + j] = v; }
  __device__ void store_offset_grad(index_t j, index_t, scalar_t dy, scalar_t dx) const {
    buf.offset[lane * Buffers::kOffsetRow + 2 * j] = dy;
    buf.offset[lane * Buffers::kOffsetRow + 2 * j + 1] = dx;
  }

  // This lane's share of the warp's input_grad_bound (deform_sepconv_backward_cuda.cu): the sum
  // over the warp's pixels of max_c |dL/dout| * sum_t |V_i H_j M_t|, with the mask read in
  // consecutive runs. `grad_output` is the whole (N, H_out, W_out, C) tensor. Every lane, in step,
  // after construction.
  __device__ float input_grad_bound(const scalar_t* grad_output) {
    float largest = 0.0f;
    if (active()) {
      const scalar_t* go = grad_output + (first + lane) * p.channels;
      for (index_t c = 0; c < p.channels; ++c) {
        const float g = fabsf(static_cast<float>(go[c]));
        largest = (g > largest || g != g) ? g : largest;  // keeps a NaN
      }
    }
    buf.grad_output_max[lane] = largest;
    __syncwarp();
    float sum = 0.0f;
    const int elements = count * kTaps;
    for (int e = lane; e < elements; e += kWarpSize) {
      const int q = e / kTaps, t = e - q * kTaps, i = t / kKernel, j = t - i * kKernel;
      float w = buf.grad_output_max[q];
      if (p.vertical) w *= fabsf(static_cast<float>(buf.vertical[q * kKernel + i]));
      if (p.horizontal) w *= fabsf(static_cast<float>(buf.horizontal[q * kKernel + j]));
      if (p.mask) w *= fabsf(static_cast<float>(p.mask[(first + q) * kTaps + t]));
      sum += w;
    }
    return sum;
  }
};

}  // namespace edsc_ext
