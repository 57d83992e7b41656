// The process-wide kernel policy (include/edsc_ext/kernel_policy.h), packed into one atomic word so
// that a call reads all of it at once, without a lock.
#include "edsc_ext/kernel_policy.h"

#include <algorithm>
#include <atomic>

namespace edsc_ext {
namespace {

// Bits 0-7: the switches; bits 32-62: cpu_scratch_mb.
constexpr int kScratchShift = 32;
constexpr int64_t kMaxScratchMb = (int64_t(1) << 31) - 1;

uint64_t pack(const KernelPolicy& p) {
  const uint64_t scratch = static_cast<uint64_t>(std::clamp<int64_t>(p.cpu_scratch_mb, 0, kMaxScratchMb));
  return uint64_t(p.grid_taps) | uint64_t(p.plain_forward) << 1 | uint64_t(p.prefetch) << 2 |
         uint64_t(p.input_grad_tile) << 3 | uint64_t(p.warp_staging) << 4 | uint64_t(p.cpu_baseline) << 5 |
         uint64_t(p.vector_loads) << 6 | uint64_t(p.channel_lanes) << 7 | scratch << kScratchShift;
}

KernelPolicy unpack(uint64_t word) {
  KernelPolicy p;
  p.grid_taps = word & 1;
  p.plain_forward = (word >> 1) & 1;
  p.prefetch = (word >> 2) & 1;
  p.input_grad_tile = (word >> 3) & 1;
  p.warp_staging = (word >> 4) & 1;
  p.cpu_baseline = (word >> 5) & 1;
  p.vector_loads = (word >> 6) & 1;
  p.channel_lanes = (word >> 7) & 1;
  p.cpu_scratch_mb = static_cast<int64_t>(word >> kScratchShift);
  return p;
}

std::atomic<uint64_t>& policy_word() {
  static std::atomic<uint64_t> word{pack(KernelPolicy{})};
  return word;
}

}  // namespace

KernelPolicy kernel_policy() { return unpack(policy_word().load(std::memory_order_acquire)); }

void set_kernel_policy(const KernelPolicy& policy) { policy_word().store(pack(policy), std::memory_order_release); }

}  // namespace edsc_ext
