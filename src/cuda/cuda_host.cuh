// The CUDA host rules every launcher follows, through the stable ABI: a guard on the tensors'
// device, the launch on that device's current stream, every CUDA call and launch checked.
#pragma once

#ifdef EDSC_CUDA_EMULATION
// The kernels' device code compiled for the CPU by the tests (tests/cuda_emulation): the emulation
// in place of the CUDA runtime, and none of the host rules below.
#include "cuda_emulation.h"
#include "torch_stable.h"
#else
// A kernel's dynamically sized shared memory, `name` its first `type` (the emulation defines its own).
#define EDSC_EXTERN_SHARED(type, name) extern __shared__ __align__(16) type name[]

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <torch/csrc/stable/accelerator.h>

#include <cstdint>

#include "torch_stable.h"

namespace edsc_ext {

// Makes the device current for its lifetime (the tensors' device, whatever the current one was).
using CudaDeviceGuard = torch::stable::accelerator::DeviceGuard;

// torch's current stream of the device (what torch.cuda.current_stream() gives), for the launches:
// the stable C shim's aoti_torch_get_current_cuda_stream, which lives in libtorch_cuda. It is looked
// up in the loaded library rather than linked, so that the binary (which links no torch CUDA library
// and the CUDA runtime statically) also loads with a CPU-only torch, whose tensors never reach the
// CUDA kernels.
inline cudaStream_t current_cuda_stream(int32_t device_index) {
  using GetStream = AOTITorchError (*)(int32_t, void**);
  static const GetStream get_stream = [] {
    void* library = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
    return library ? reinterpret_cast<GetStream>(dlsym(library, "aoti_torch_get_current_cuda_stream")) : nullptr;
  }();
  EDSC_CHECK(get_stream != nullptr,
             "torch's CUDA library (libtorch_cuda.so, aoti_torch_get_current_cuda_stream) is not loaded");
  void* stream = nullptr;
  // Checked by hand: the shim's check macro is named differently across torch releases (2.11 vs 2.14).
  EDSC_CHECK(get_stream(device_index, &stream) == AOTI_TORCH_SUCCESS, "torch gave no current CUDA stream for device ",
             device_index);
  return static_cast<cudaStream_t>(stream);
}

// The current CUDA device (cudaGetDevice).
inline int current_cuda_device() {
  int device = 0;
  cudaGetDevice(&device);
  return device;
}

// An attribute (cudaDevAttr*) of a device.
inline int64_t cuda_device_attribute(cudaDeviceAttr attribute, int device) {
  int value = 0;
  cudaDeviceGetAttribute(&value, attribute, device);
  return value;
}

}  // namespace edsc_ext
#endif  // EDSC_CUDA_EMULATION

namespace edsc_ext {

// The message of a failed CUDA call `call`; a GPU this binary has no code for gets one line that
// says which architectures it has (the build's EDSC_EXT_CUDA_SASS / _PTX) and where the fix is.
inline std::string cuda_error_message(cudaError_t error, const char* call) {
  std::string text = message("CUDA error: ", cudaGetErrorString(error), " (", call, ")");
  if (error == cudaErrorNoKernelImageForDevice) {
    text += message("; this edsc-ext binary has kernels for sm ", EDSC_EXT_STRINGIFY(EDSC_EXT_CUDA_SASS), " and PTX ",
                    EDSC_EXT_STRINGIFY(EDSC_EXT_CUDA_PTX),
                    ", none for this GPU: install the wheel of a newer CUDA, or build for it with "
                    "TORCH_CUDA_ARCH_LIST (`python -m edsc_ext` says which)");
  }
  return text;
}

}  // namespace edsc_ext

#define EDSC_CUDA_CHECK(expr)                                                           \
  do {                                                                                  \
    const cudaError_t edsc_cuda_error = (expr);                                         \
    if (edsc_cuda_error != cudaSuccess) [[unlikely]]                                    \
      throw std::runtime_error(::edsc_ext::cuda_error_message(edsc_cuda_error, #expr)); \
  } while (false)

#define EDSC_CUDA_KERNEL_LAUNCH_CHECK() EDSC_CUDA_CHECK(cudaGetLastError())
