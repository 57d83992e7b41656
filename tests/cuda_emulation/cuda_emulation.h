// The CUDA kernels' device code run on the CPU, for tests on machines without a GPU: what
// src/cuda/cuda_host.cuh includes in place of the CUDA runtime when EDSC_CUDA_EMULATION is defined
// (tests/test_cuda_emulation.py compiles tests/cuda_emulation/emulated_kernels.cpp so).
//
// A launch runs its blocks one after another; each block's threads are OS threads, so
// __syncthreads, warp shuffles and shared memory behave as on a GPU where a kernel relies on them
// (and a missing barrier shows as a race or a wrong result, as it would there). Not emulated: the
// memory model's weaker orderings, timing, and warps executing in lock step (code that relies on
// it without __syncwarp is a bug on Volta and later GPUs too). Device code meant only for a GPU
// (inline PTX) is guarded by __CUDA_ARCH__, which stays undefined here.
#pragma once

#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
// Statically allocated shared memory: one object for every thread of the (one running) block. The
// dynamically sized kind (extern __shared__) is declared with EDSC_EXTERN_SHARED, which names
// edsc_emulation::dynamic_shared.
#define __shared__ static

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

using cudaStream_t = void*;
using cudaError_t = int;
constexpr cudaError_t cudaSuccess = 0;
constexpr cudaError_t cudaErrorNoKernelImageForDevice = 209;
inline const char* cudaGetErrorString(cudaError_t) { return "emulated"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }

namespace edsc_emulation {

constexpr size_t kSharedGuardBytes = 256;
constexpr unsigned char kSharedFill = 0xcd;

struct Block {
  dim3 grid, block;
  std::unique_ptr<std::barrier<>> all;                 // __syncthreads
  std::vector<std::unique_ptr<std::barrier<>>> warps;  // __syncwarp and the shuffles
  std::vector<unsigned long long> exchange;            // a shuffle's values, one slot a thread
  std::vector<unsigned char> shared;                   // dynamic shared memory
};

inline Block& current() {
  static Block block;
  return block;
}
inline thread_local dim3 thread_index, block_index;

inline unsigned int linear_thread() {
  const Block& b = current();
  return (thread_index.z * b.block.y + thread_index.y) * b.block.x + thread_index.x;
}

// Runs kernel() for every thread of every block of a launch of grid x block threads with
// `shared_bytes` of dynamic shared memory.
template <typename Kernel>
void launch(dim3 grid, dim3 block, size_t shared_bytes, const Kernel& kernel) {
  Block& b = current();
  const unsigned int threads = block.x * block.y * block.z;
  if (threads == 0 || threads > 1024) throw std::invalid_argument("emulated launch: 1 to 1024 threads a block");
  b.grid = grid;
  b.block = block;
  // Not zeroed (a kernel must initialise what it reads), and followed by guard bytes that a write past the
  // planned size would change (checked after each block).
  b.shared.assign(shared_bytes + kSharedGuardBytes, kSharedFill);
  b.exchange.assign(threads, 0);
  for (unsigned int bz = 0; bz < grid.z; ++bz) {
    for (unsigned int by = 0; by < grid.y; ++by) {
      for (unsigned int bx = 0; bx < grid.x; ++bx) {
        b.all = std::make_unique<std::barrier<>>(threads);
        b.warps.clear();
        for (unsigned int w = 0; w < (threads + 31) / 32; ++w) {
          b.warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, threads - w * 32)));
        }
        std::vector<std::thread> pool;
        pool.reserve(threads);
        for (unsigned int t = 0; t < threads; ++t) {
          pool.emplace_back([&, t, bx, by, bz] {
            block_index = dim3(bx, by, bz);
            thread_index = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
            kernel();
            // An exited thread no longer counts at the barriers, as on the GPU.
            b.warps[t / 32]->arrive_and_drop();
            b.all->arrive_and_drop();
          });
        }
        for (std::thread& thread : pool) thread.join();
        for (size_t k = shared_bytes; k < b.shared.size(); ++k) {
          if (b.shared[k] != kSharedFill) {
            throw std::runtime_error("emulated launch: block (" + std::to_string(bx) + ", " + std::to_string(by) +
                                     ") wrote past its " + std::to_string(shared_bytes) +
                                     " bytes of dynamic shared memory");
          }
        }
      }
    }
  }
}

inline void sync_warp() { current().warps[linear_thread() / 32]->arrive_and_wait(); }

template <typename T>
T shuffle_xor(T value, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(unsigned long long), "a shuffle moves at most 8 bytes");
  Block& b = current();
  const unsigned int me = linear_thread();
  unsigned long long word = 0;
  std::memcpy(&word, &value, sizeof(T));
  b.exchange[me] = word;
  sync_warp();
  const unsigned int partner = (me & ~31u) | ((me & 31u) ^ static_cast<unsigned int>(lane_mask));
  word = b.exchange[partner];
  sync_warp();
  T result;
  std::memcpy(&result, &word, sizeof(T));
  return result;
}

}  // namespace edsc_emulation

#define threadIdx (::edsc_emulation::thread_index)
#define blockIdx (::edsc_emulation::block_index)
#define blockDim (::edsc_emulation::current().block)
#define gridDim (::edsc_emulation::current().grid)
#define EDSC_EXTERN_SHARED(type, name) type* name = reinterpret_cast<type*>(::edsc_emulation::current().shared.data())

inline void __syncthreads() { ::edsc_emulation::current().all->arrive_and_wait(); }
inline void __syncwarp(unsigned int = 0xffffffffu) { ::edsc_emulation::sync_warp(); }
template <typename T>
T __shfl_xor_sync(unsigned int, T value, int lane_mask) {
  return ::edsc_emulation::shuffle_xor(value, lane_mask);
}

template <typename T>
T atomicAdd(T* address, T value) {
  return std::atomic_ref<T>(*address).fetch_add(value);
}
inline int atomicOr(int* address, int value) { return std::atomic_ref<int>(*address).fetch_or(value); }

inline int __float_as_int(float v) { return std::bit_cast<int>(v); }
inline float __int_as_float(int v) { return std::bit_cast<float>(v); }
// Round to nearest even, as the GPU's (the default floating-point environment); in range here.
inline int __float2int_rn(float v) { return static_cast<int>(std::nearbyint(v)); }

using std::max;
using std::min;
