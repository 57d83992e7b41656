// The process-wide kernel policy (include/edsc_ext/kernel_policy.h), packed into one atomic word so
// that a call reads all of it at once, without a lock.
#include "kernel_policy.h"

#include <algorithm>
#include <atomic>

namespace edsc_ext {
namespace {

// Bits 0-7: the switches, in EDSC_KERNEL_POLICY_SWITCHES' order; bits 32-62: cpu_scratch_mb.
constexpr int kScratchShift = 32;
constexpr int64_t kMaxScratchMb = (int64_t(1) << 31) - 1;

uint64_t pack(const KernelPolicy& p) {
  uint64_t word = static_cast<uint64_t>(std::clamp<int64_t>(p.cpu_scratch_mb, 0, kMaxScratchMb)) << kScratchShift;
  int bit = 0;
#define EDSC_POLICY_PACK(name, default_value) word |= uint64_t(p.name) << bit++;
  EDSC_KERNEL_POLICY_SWITCHES(EDSC_POLICY_PACK)
#undef EDSC_POLICY_PACK
  return word;
}

KernelPolicy unpack(uint64_t word) {
  KernelPolicy p;
  int bit = 0;
#define EDSC_POLICY_UNPACK(name, default_value) p.name = (word >> bit++) & 1;
  EDSC_KERNEL_POLICY_SWITCHES(EDSC_POLICY_UNPACK)
#undef EDSC_POLICY_UNPACK
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
