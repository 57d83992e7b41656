// The host side of the EDSC networks' 2x resampling ops, shared by their CPU and CUDA kernels:
// upsample_bilinear2x (src/upsample2x.h, src/cpu/upsample2x_cpu.cpp, src/cuda/upsample2x_cuda.cu) and
// avg_pool2x (src/pool2x.h, src/cpu/pool2x_cpu.cpp, src/cuda/pool2x_cuda.cu): the checks, the output's
// memory format and the dense tensors the kernels read and write.
#pragma once

#include <cstdint>

#include "deform_sepconv_call.h"  // CallFacts, the dtype dispatch

namespace edsc_ext {

enum class Resample2x {
  kUpsampleBilinear,  // (N, C, H, W) -> (N, C, 2H, 2W)
  kAvgPool,           // (N, C, H, W) -> (N, C, H / 2, W / 2), rounded down
};

struct Resample2xCall {
  Tensor input;   // dense in `format` (the argument itself, or a dense copy)
  Tensor output;  // dense in `format`
  MemoryFormat format;
  int64_t batch, channels, height, width;  // the input's
  CallFacts facts;                         // of the dtype dispatch, the dtype only
};

// Checks the argument and allocates the output (ops.py checks first, with Python's exception types).
// The output is channels_last where the input's strides run in that order (dense, or a view such as a
// channel slice), as ATen's upsample_bilinear2d and avg_pool2d choose it; otherwise NCHW.
Resample2xCall prepare_resample2x(const Tensor& input, Resample2x op);

Tensor upsample_bilinear2x_cpu(const Tensor& input);
Tensor avg_pool2x_cpu(const Tensor& input);
#ifdef EDSC_EXT_WITH_CUDA
Tensor upsample_bilinear2x_cuda(const Tensor& input);
Tensor avg_pool2x_cuda(const Tensor& input);
#endif

}  // namespace edsc_ext
