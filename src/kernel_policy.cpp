// The process-wide kernel policy (src/kernel_policy.h), packed into one atomic word so that a call
// reads all of it at once, without a lock; and the ops that read and set it by the switches' names.
#include "kernel_policy.h"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backends.h"

namespace edsc_ext {
namespace {

// The word holds the switches in kPolicySwitches' order from bit 0: a flag 1 bit, a count 31.
constexpr int kCountBits = 31;
constexpr int bits_of(const PolicySwitch& s) { return s.count != nullptr ? kCountBits : 1; }
constexpr int word_bits() {
  int bits = 0;
  for (const PolicySwitch& s : kPolicySwitches) bits += bits_of(s);
  return bits;
}
static_assert(word_bits() <= 64, "the policy's switches must fit one atomic word");

uint64_t pack(const KernelPolicy& p) {
  uint64_t word = 0;
  int bit = 0;
  for (const PolicySwitch& s : kPolicySwitches) {
    const int64_t value = s.count != nullptr ? std::clamp<int64_t>(p.*s.count, 0, s.max_count) : int64_t(p.*s.flag);
    word |= static_cast<uint64_t>(value) << bit;
    bit += bits_of(s);
  }
  return word;
}

KernelPolicy unpack(uint64_t word) {
  KernelPolicy p;
  int bit = 0;
  for (const PolicySwitch& s : kPolicySwitches) {
    const uint64_t value = (word >> bit) & ((uint64_t(1) << bits_of(s)) - 1);
    if (s.count != nullptr) {
      p.*s.count = static_cast<int64_t>(value);
    } else {
      p.*s.flag = value != 0;
    }
    bit += bits_of(s);
  }
  return p;
}

std::atomic<uint64_t>& policy_word() {
  static std::atomic<uint64_t> word{pack(KernelPolicy{})};
  return word;
}

// "a, b, c": the switches' names, for messages.
std::string switch_names() {
  std::string names;
  for (const PolicySwitch& s : kPolicySwitches) names += (names.empty() ? "" : ", ") + std::string(s.name);
  return names;
}

}  // namespace

KernelPolicy kernel_policy() { return unpack(policy_word().load(std::memory_order_acquire)); }

void set_kernel_policy(const KernelPolicy& policy) { policy_word().store(pack(policy), std::memory_order_release); }

std::string kernel_policy_switches() {
  const KernelPolicy defaults;
  std::ostringstream out;
  out << "[";
  for (const PolicySwitch& s : kPolicySwitches) {
    out << (&s == kPolicySwitches ? "" : ", ") << "{\"name\": " << json_string(s.name);
    if (s.count != nullptr) {
      out << ", \"kind\": \"count\", \"default\": " << defaults.*s.count << ", \"max\": " << s.max_count;
    } else if (s.choices[0] != nullptr) {
      out << ", \"kind\": \"choice\", \"choices\": [" << json_string(s.choices[0]) << ", " << json_string(s.choices[1])
          << "], \"default\": " << json_string(s.choices[defaults.*s.flag ? 1 : 0]);
    } else {
      out << ", \"kind\": \"flag\", \"default\": " << (defaults.*s.flag ? "true" : "false");
    }
    out << ", \"description\": " << json_string(s.description) << "}";
  }
  out << "]";
  return out.str();
}

std::tuple<std::vector<std::string>, std::vector<int64_t>> get_kernel_policy_op() {
  const KernelPolicy policy = kernel_policy();
  std::vector<std::string> names;
  std::vector<int64_t> values;
  for (const PolicySwitch& s : kPolicySwitches) {
    names.emplace_back(s.name);
    values.push_back(switch_value(policy, s));
  }
  return {names, values};
}

void set_kernel_policy_op(const std::vector<std::string>& names, const std::vector<int64_t>& values) {
  EDSC_CHECK(names.size() == values.size(), "set_kernel_policy: ", names.size(), " names but ", values.size(),
             " values");
  KernelPolicy policy;  // the defaults, changed by the switches named
  for (size_t k = 0; k < names.size(); ++k) {
    const auto* s = std::find_if(std::begin(kPolicySwitches), std::end(kPolicySwitches),
                                 [&](const PolicySwitch& row) { return names[k] == row.name; });
    EDSC_CHECK(s != std::end(kPolicySwitches), "set_kernel_policy: unknown switch '", names[k], "'; the switches are ",
               switch_names());
    const int64_t value = values[k];
    if (s->count != nullptr) {
      EDSC_CHECK(value >= 0 && value <= s->max_count, "set_kernel_policy: ", s->name, " must be in [0, ", s->max_count,
                 "], got ", value);
      policy.*s->count = value;
    } else {
      EDSC_CHECK(value == 0 || value == 1, "set_kernel_policy: ", s->name, " must be 0 or 1, got ", value);
      policy.*s->flag = value == 1;
    }
  }
  set_kernel_policy(policy);
}

}  // namespace edsc_ext
