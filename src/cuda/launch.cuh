// Launch geometry shared by the CUDA kernels: 1-D grids with grid-stride loops.
#pragma once

#include <algorithm>
#include <cstdint>

namespace edsc_ext {

constexpr int kThreadsPerBlock = 256;
constexpr int kWarpSize = 32;
// Grid-stride loops cover the rest; this many blocks already fill any current GPU many times.
constexpr int64_t kMaxBlocks = int64_t(1) << 20;

inline unsigned int blocks_for(int64_t work_items) {
  return static_cast<unsigned int>(
      std::max<int64_t>(1, std::min(kMaxBlocks, (work_items + kThreadsPerBlock - 1) / kThreadsPerBlock)));
}

}  // namespace edsc_ext
