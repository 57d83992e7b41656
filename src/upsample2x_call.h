// upsample_bilinear2x's host side, shared by its CPU and CUDA kernels (src/cpu/upsample2x_cpu.cpp,
// src/cuda/upsample2x_cuda.cu): the checks, the output's memory format and the dense tensors the
// kernels read and write. The math is src/upsample2x.h.
#pragma once

#include <cstdint>

#include "deform_sepconv_call.h"  // CallFacts, the dtype dispatch

namespace edsc_ext {

struct Upsample2xCall {
  Tensor input;   // dense in `format` (the argument itself, or a dense copy)
  Tensor output;  // (N, C, 2H, 2W), dense in `format`
  MemoryFormat format;
  int64_t batch, channels, height, width;  // the input's
  CallFacts facts;                         // of the dtype dispatch, the dtype only
};

// Checks the argument and allocates the output (ops.py checks first, with Python's exception types).
// The output is channels_last where the input is (dense, or a view in channels_last order such as a
// channel slice), as F.interpolate's; otherwise NCHW.
Upsample2xCall prepare_upsample2x(const Tensor& input);

Tensor upsample_bilinear2x_cpu(const Tensor& input);
#ifdef EDSC_EXT_WITH_CUDA
Tensor upsample_bilinear2x_cuda(const Tensor& input);
#endif

}  // namespace edsc_ext
