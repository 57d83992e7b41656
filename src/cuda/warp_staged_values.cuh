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
// go back the same way. The rows are double-buffered and copied asynchronously (cp.async): row
// i + 1 is in flight while the warp computes row i, so the warp waits on memory once per pixel
// rather than once per row. The policy has the interface of GlobalPixelValues
// (src/sampling.h); every lane of the warp must construct it and run the
// pixel code, active or not, since the copies are shared.
#pragma once

#include "deform_sepconv_cuda.cuh"

namespace edsc_ext {

// The kernel size the warp-staged kernels are compiled for (KH = KW).
constexpr int kWarpStagedKernel = kSpecializedKernel;

// A tap's (dy, dx), aligned so that a lane reads both with one shared-memory load and the copies
// move both at once. The planner checks that the offset tensor starts on a pair boundary
// (DeformSepconvCall::offset_pairs_aligned).
template <typename scalar_t>
struct alignas(2 * sizeof(scalar_t)) OffsetPair {
  scalar_t dy, dx;
};

// One warp's shared memory for the values and, in place, their gradients. Lane l's values of a
// row start at l * K, an odd stride, so lanes reading the same tap hit different banks (pairs of
// float32: a stride of K 8-byte words, conflict-free within each half warp, which is how 8-byte
// loads are served). Rows of taps alternate between two buffers: row i in buffer i % 2, row i + 1
// landing in the other. The gradients replace the values in place (a row's offsets and mask
// values; the vertical weight of row i once row i is done; the horizontal kernel, which the pixel
// code holds in registers at a static kernel width, at the end), which keeps 8 warps' buffers in
// the 48 KB of static shared memory a kernel may have.
template <typename scalar_t, int kKernel>
struct WarpStagedBuffers {
  static_assert(kKernel % 2 == 1, "an odd row stride keeps the lanes on different banks");
  scalar_t vertical[kWarpSize * kKernel];
  scalar_t horizontal[kWarpSize * kKernel];
  OffsetPair<scalar_t> offset[2][kWarpSize * kKernel];
  scalar_t mask[2][kWarpSize * kKernel];
  float grad_output_max[kWarpSize];
};

// One element from global to shared memory: asynchronously where cp.async can move it (4, 8 or 16
// bytes), else (a single 2-byte value) with a plain load and store.
template <typename T>
__device__ __forceinline__ void stage_element(T* shared, const T* global) {
  if constexpr (sizeof(T) == 4 || sizeof(T) == 8 || sizeof(T) == 16) {
    copy_async<static_cast<int>(sizeof(T))>(shared, global, static_cast<int>(sizeof(T)));
  } else {
    *shared = *global;
  }
}

// The channels_last per-pixel tensors of output pixels [first, first + count) (index
// n * H_out * W_out + y * W_out + x, consecutive in memory), lane l owning pixel first + l.
template <typename scalar_t, typename index_t, int kKernel>
struct WarpStagedPixelValues {
  using param_type = scalar_t;
  static constexpr bool kSplitsChannels = false;  // a lane's pixel has all its channels
  static constexpr int kTaps = kKernel * kKernel;
  using Pair = OffsetPair<scalar_t>;
  using Buffers = WarpStagedBuffers<scalar_t, kKernel>;
  Buffers& buf;
  const DeformSepconvParams<scalar_t, index_t>& p;
  // Set once (passes after the first turn with_grads off), so the compiler can read the pointers
  // from the kernel's parameters rather than hold them in registers.
  const DeformSepconvParamGrads<scalar_t> grads;
  bool with_grads = true;
  index_t first;
  int count, lane;
  int row = 0;  // the buffer holding the current row of taps

  // Element e = q * K + k of a staged row is value k of the row of pixel first + q. In a tensor
  // with K * K values a pixel (offset pairs, mask) that is element e + (K * K - K) * q past the
  // row's first; in one with K (vertical, horizontal) the pixels' values are one run.
  __device__ static int row_element(int e) { return e + (kTaps - kKernel) * (e / kKernel); }

  // Every lane, in step: stages row i's offsets and mask values into buffer b, one commit group.
  __device__ void stage_row(index_t i, int b) {
    const Pair* offs = p.offset ? reinterpret_cast<const Pair*>(p.offset) + first * kTaps + i * kKernel : nullptr;
    const scalar_t* mask = p.mask ? p.mask + first * kTaps + i * kKernel : nullptr;
    EDSC_UNROLL
    for (int it = 0; it < kKernel; ++it) {
      const int e = it * kWarpSize + lane;
      if (e < count * kKernel) {
        if (offs) stage_element(&buf.offset[b][e], offs + row_element(e));
        if (mask) stage_element(&buf.mask[b][e], mask + row_element(e));
      }
    }
    copy_async_commit();
  }

  // Every lane of the warp, in step: copies the vertical and horizontal kernels (the pixel code
  // reads them first), with the first row of taps already on its way behind them.
  __device__ void stage_pixels() {
    __syncwarp();  // a previous use of the buffers is over
    EDSC_UNROLL
    for (int it = 0; it < kKernel; ++it) {
      const int e = it * kWarpSize + lane;
      if (e < count * kKernel) {
        if (p.vertical) stage_element(&buf.vertical[e], p.vertical + first * kKernel + e);
        if (p.horizontal) stage_element(&buf.horizontal[e], p.horizontal + first * kKernel + e);
      }
    }
    copy_async_commit();
    stage_row(0, 0);
    copy_async_wait(1);  // all but the row: the kernels have landed for this lane ...
    __syncwarp();        // ... and for every lane
  }

  // Every lane of the warp, in step.
  __device__ WarpStagedPixelValues(Buffers& buffers, const DeformSepconvParams<scalar_t, index_t>& params,
                                   const DeformSepconvParamGrads<scalar_t>& param_grads, index_t first_pixel,
                                   int pixels, int lane_index)
      : buf(buffers), p(params), grads(param_grads), first(first_pixel), count(pixels), lane(lane_index) {
    static_assert(kKernel > 0, "a static kernel width: the pixel code then holds the horizontal kernel in registers");
    stage_pixels();
  }

  // Every lane, in step, between passes over the rows of taps: a later pass asks for no gradients
  // and needs the values again, which the first pass's gradients may have replaced.
  __device__ void restart_without_grads() {
    with_grads = false;
    stage_pixels();
  }

  __device__ bool active() const { return lane < count; }

  __device__ void begin_row(index_t i) {
    copy_async_wait(0);  // this lane's copies of row i have landed ...
    __syncwarp();        // ... and every lane's; row i - 1's gradients have been written back
    row = static_cast<int>(i % 2);
    if (i + 1 < kKernel) stage_row(i + 1, 1 - row);
  }

  __device__ void end_row(index_t i) {
    if (!with_grads || (!grads.offset && !grads.mask)) return;
    __syncwarp();  // every lane's gradients of the row are in the buffer
    Pair* offs = grads.offset ? reinterpret_cast<Pair*>(grads.offset) + first * kTaps + i * kKernel : nullptr;
    scalar_t* mask = grads.mask ? grads.mask + first * kTaps + i * kKernel : nullptr;
    EDSC_UNROLL
    for (int it = 0; it < kKernel; ++it) {
      const int e = it * kWarpSize + lane;
      if (e < count * kKernel) {
        if (offs) offs[row_element(e)] = buf.offset[row][e];
        if (mask) mask[row_element(e)] = buf.mask[row][e];
      }
    }
  }

  // Every lane, after the pixel code: writes the vertical and horizontal gradients back.
  __device__ void finish() {
    if (!with_grads || (!grads.vertical && !grads.horizontal)) return;
    __syncwarp();
    EDSC_UNROLL
    for (int it = 0; it < kKernel; ++it) {
      const int e = it * kWarpSize + lane;
      if (e < count * kKernel) {
        if (grads.vertical) grads.vertical[first * kKernel + e] = buf.vertical[e];
        if (grads.horizontal) grads.horizontal[first * kKernel + e] = buf.horizontal[e];
      }
    }
  }

  __device__ const scalar_t* horizontal_values() const {
    return p.horizontal ? buf.horizontal + lane * kKernel : nullptr;
  }
  __device__ index_t horizontal_stride() const { return 1; }
  template <typename acc_t>
  __device__ acc_t vertical(index_t i) const {
    return p.vertical ? static_cast<acc_t>(buf.vertical[lane * kKernel + i]) : acc_t(1);
  }
  template <typename acc_t>
  __device__ acc_t mask_value(index_t j, index_t) const {
    return p.mask ? static_cast<acc_t>(buf.mask[row][lane * kKernel + j]) : acc_t(1);
  }
  __device__ bool has_offset() const { return p.offset != nullptr; }
  template <typename acc_t>
  __device__ acc_t offset_value(index_t j, index_t, int component) const {
    const Pair pair = buf.offset[row][lane * kKernel + j];
    return static_cast<acc_t>(component == 0 ? pair.dy : pair.dx);
  }

  __device__ bool any_grad() const { return with_grads && grads.any(); }
  __device__ bool wants_vertical_grad() const { return with_grads && grads.vertical != nullptr; }
  __device__ bool wants_horizontal_grad() const { return with_grads && grads.horizontal != nullptr; }
  __device__ bool wants_offset_grad() const { return with_grads && grads.offset != nullptr; }
  __device__ bool wants_mask_grad() const { return with_grads && grads.mask != nullptr; }
  // In place (see WarpStagedBuffers), written back by finish().
  __device__ void store_vertical_grad(index_t i, scalar_t v) const { buf.vertical[lane * kKernel + i] = v; }
  __device__ void store_horizontal_grad(index_t j, scalar_t v) const { buf.horizontal[lane * kKernel + j] = v; }
  // In place of the value just read (same lane, same tap), written back by end_row.
  __device__ void store_mask_grad(index_t j, index_t, scalar_t v) const { buf.mask[row][lane * kKernel + j] = v; }
  __device__ void store_offset_grad(index_t j, index_t, scalar_t dy, scalar_t dx) const {
    buf.offset[row][lane * kKernel + j] = Pair{dy, dx};
  }

  // This lane's share of the warp's input_grad_bound (deform_sepconv_backward_bilinear_kernels.cuh): the
  // sum over the warp's pixels of max_c |dL/dout| * sum_t |V_i H_j M_t|, with the mask read in
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
      if (p.mask) w *= fabsf(static_cast<float>(p.mask[first * kTaps + e]));
      sum += w;
    }
    return sum;
  }
};

}  // namespace edsc_ext
