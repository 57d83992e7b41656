// The packed copy of an exact-RGB NCHW frame in a half type, which PackedRgbFrame (sampling.h) reads: a
// bilinear corner's three channels in one 8-byte load instead of three 2-byte ones (BENCHMARKS.md, the packed
// RGB frame). Read by the forward's exact-RGB pixels kernel and the backward's lean RGB tile (kPackedFrame).
#pragma once

#include "deform_sepconv_cuda.cuh"

namespace edsc_ext {
namespace {

// The packed copy of an NCHW RGB frame: pixel k of the (N, H, W) pixels gets
// its three channels and a zero fourth; `pixels` = N * H * W, hw = H * W.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreadsPerBlock)
    pack_rgb_frame_cuda_kernel(const scalar_t* __restrict__ frame, PackedRgbPixel<scalar_t>* __restrict__ packed,
                               int32_t hw, int32_t pixels) {
  for (int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; item < pixels;
       item += int64_t(blockDim.x) * gridDim.x) {
    const int32_t k = static_cast<int32_t>(item), n = k / hw;
    const scalar_t* in = frame + (2 * n * hw + k);  // n * 3 * hw + (k - n * hw)
    PackedRgbPixel<scalar_t> pixel;
    pixel.value[0] = in[0];
    pixel.value[1] = in[hw];
    pixel.value[2] = in[2 * hw];
    pixel.value[3] = scalar_t(0);
    packed[k] = pixel;
  }
}

#ifndef EDSC_CUDA_EMULATION
// Packs call.input (exact RGB, NCHW, 32-bit indices) on `stream` into a new (N, H, W, 4) buffer, which
// the returned tensor owns: keep it until the kernels that read it are queued.
template <typename scalar_t, typename Stream>
Tensor pack_rgb_frame(const DeformSepconvCall& call, Stream stream) {
  const CallFacts& f = call.facts;
  Tensor packed = empty_in(call.input, {f.batch, 4, f.height_in, f.width_in}, MemoryFormat::ChannelsLast);
  const int64_t count = f.batch * f.height_in * f.width_in;
  pack_rgb_frame_cuda_kernel<scalar_t><<<blocks_for(count), kThreadsPerBlock, 0, stream>>>(
      static_cast<const scalar_t*>(call.input.const_data_ptr()),
      reinterpret_cast<PackedRgbPixel<scalar_t>*>(packed.mutable_data_ptr<scalar_t>()),
      static_cast<int32_t>(f.height_in * f.width_in), static_cast<int32_t>(count));
  EDSC_CUDA_KERNEL_LAUNCH_CHECK();
  return packed;
}
#endif  // EDSC_CUDA_EMULATION

}  // namespace
}  // namespace edsc_ext
