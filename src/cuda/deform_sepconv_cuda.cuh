// Shared by the CUDA translation units of deform_sepconv (forward, backward): headers and the
// channel-block dispatch.
#pragma once

#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include "edsc_ext/ops.h"
#include "launch.cuh"

namespace edsc_ext {

// Channels a thread handles per step in the staged forward and the backward (their corner loads in
// flight together). Three for RGB-like inputs with the common 5x5 kernel, so no lane of the block
// is idle; four otherwise.
template <int kKernelH, int kKernelW, typename Body>
void dispatch_channel_block(int64_t channels, const Body& body) {
  if constexpr (kKernelH == 5 && kKernelW == 5) {
    if (channels % 3 == 0 && channels % 4 != 0) return body(std::integral_constant<int, 3>{});
  }
  return body(std::integral_constant<int, 4>{});
}
#define EDSC_DISPATCH_CHANNEL_BLOCK(channels, ...)                                       \
  dispatch_channel_block<kKernelH, kKernelW>(channels, [&](auto channel_block) {         \
    constexpr int kChannelBlock = decltype(channel_block)::value;                        \
    return __VA_ARGS__();                                                                \
  })

}  // namespace edsc_ext
