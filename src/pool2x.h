// 2x2 average pooling with stride 2, F.avg_pool2d(x, 2): the EDSC networks' downsampling (the U-Net's
// encoder). Host+device code that the CPU and CUDA kernels share: one output value from its four input
// samples, summed as ATen's avg_pool2d sums them (from zero, the upper row first, each row left to right,
// in the accumulation type) and divided by 4 (exact), so that the values are F.avg_pool2d's bit for bit.
#pragma once

#include "sampling.h"  // EDSC_HOST_DEVICE

namespace edsc_ext {

template <typename acc_t>
EDSC_HOST_DEVICE acc_t avg_pool2x_value(acc_t v00, acc_t v01, acc_t v10, acc_t v11) {
  acc_t sum = acc_t(0);
  sum += v00;
  sum += v01;
  sum += v10;
  sum += v11;
  return sum / acc_t(4);
}

}  // namespace edsc_ext
