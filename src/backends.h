// The ops' implementations that src/registration.cpp registers: the CPU and CUDA kernels' entry
// points and the backend-free ops (CompositeExplicitAutograd).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deform_sepconv_call.h"

namespace edsc_ext {

Tensor deform_sepconv_forward_cpu(const DeformSepconvArgs& args);
DeformSepconvBackwardResult deform_sepconv_backward_cpu(const DeformSepconvArgs& args);
Tensor vector_add_cpu(const Tensor& a, const Tensor& b);
// vector_add's argument checks, shared by both backends.
void check_vector_add(const Tensor& a, const Tensor& b);

#ifdef EDSC_EXT_WITH_CUDA
Tensor deform_sepconv_forward_cuda(const DeformSepconvArgs& args);
DeformSepconvBackwardResult deform_sepconv_backward_cuda(const DeformSepconvArgs& args);
Tensor vector_add_cuda(const Tensor& a, const Tensor& b);
#endif

// edsc_ext.ops.SPEC: edsc_ext/spec.h as JSON.
std::string deform_sepconv_spec();
// edsc_ext._plan: the names of the forward and backward plans of a call (args: its output_mask,
// deterministic), for the CPU (cpu_facts: empty for this machine, else [avx2, threads]) or for a CUDA
// device (cuda_device: [major, minor, shared_memory_per_block_optin]), under the current policy.
std::vector<std::string> deform_sepconv_plan(const DeformSepconvArgs& args, const std::vector<int64_t>& cpu_facts,
                                             const std::vector<int64_t>& cuda_device);

// edsc_ext.kernel_policy (src/kernel_policy.h): the switches (name, default, description) as JSON,
// and the current policy's values by name, read and set.
std::string kernel_policy_switches();
std::tuple<std::vector<std::string>, std::vector<int64_t>> get_kernel_policy_op();
void set_kernel_policy_op(const std::vector<std::string>& names, const std::vector<int64_t>& values);

}  // namespace edsc_ext
