// Shared by the CPU backend's translation units (deform_sepconv_forward_cpu.cpp,
// deform_sepconv_backward_loops_cpu.h): the dispatch of a call to its compiled loop shape, the
// instruction-set switch their parallel loops run under, and the loop constants.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "cpu_plan.h"
#include "deform_sepconv_call.h"
#include "f16c_half.h"

namespace edsc_ext {
namespace {

// The shape axes of the CPU's bilinear loops (after the dtypes): index width, layout, and the static
// 5x5 for 32-bit-index calls only (calls past 2^31 elements are rare on the CPU, and each variant is
// another compile of every kernel).
template <typename Seed, typename Body>
void dispatch_cpu_loop_shape(const CallFacts& facts, const char* name, Body&& body) {
  dispatch_kernel_types<Seed, dispatch_axis::IndexWidth, dispatch_axis::Layout,
                        dispatch_axis::KernelSize5x5</*kOnlyWith32bitIndex=*/true>>(facts, name,
                                                                                    std::forward<Body>(body));
}

// Instruction sets: the wheels target the x86-64 baseline (SSE2), which leaves the sampling math
// without FMA or vector rounding. On x86-64 the loops are also compiled for AVX2 + FMA + F16C (x86
// CPUs since 2013) and run that way where the plan says (cpu_plan.h: the CPU and torch's
// capability have them, the policy does not ask for the baseline), which is faster (BENCHMARKS.md,
// "CPU"). Only run_avx2 is compiled for AVX2, with the loop bodies and the per-pixel code
// force-inlined into it, so no out-of-line AVX2 code can be reached on an older CPU.
#ifdef EDSC_CPU_AVX2
template <typename Body>
__attribute__((target("avx2,fma,f16c"))) void run_avx2(const Body& body) {
  body();
}
#endif
#if defined(__GNUC__) || defined(__clang__)
#define EDSC_CPU_INLINE __attribute__((always_inline))
#else
#define EDSC_CPU_INLINE
#endif

// Per-pixel types whose loops exist for AVX2 only (f16c_half.h).
template <typename param_t>
inline constexpr bool kAvx2Only = false;
#ifdef EDSC_CPU_F16C
template <>
inline constexpr bool kAvx2Only<F16cHalf> = true;
#endif

// Runs body (a lambda marked EDSC_CPU_INLINE) compiled for AVX2 when `avx2`, else as built. Loops over
// per-pixel values of param_t: with kAvx2Only<param_t> the body is compiled for AVX2 only (with_cpu_param_type
// picks such a type only where the plan runs AVX2).
template <typename param_t, typename Body>
void run_for_cpu(bool avx2, const Body& body) {
#ifdef EDSC_CPU_AVX2
  if constexpr (kAvx2Only<param_t>) {
    return run_avx2(body);
  } else {
    if (avx2) return run_avx2(body);
  }
#endif
  if constexpr (!kAvx2Only<param_t>) body();
}

// Calls body(TypeTag<P>{}) with the type the loops of a float32 frame read float16 per-pixel tensors
// as: F16cHalf where they run for AVX2 (hardware conversions), else param_t as it is. (The 16-bit
// loops, cpu_float32_frame=False, convert the frame in software anyway.)
template <typename T>
struct TypeTag {
  using type = T;
};
template <typename scalar_t, typename param_t, typename Body>
void with_cpu_param_type(bool avx2, Body&& body) {
#ifdef EDSC_CPU_F16C
  if constexpr (std::is_same_v<scalar_t, float> && std::is_same_v<param_t, Half>) {
    if (avx2) return body(TypeTag<F16cHalf>{});
  }
#endif
  body(TypeTag<param_t>{});
}

// Pixels per parallel task, so tiny images still split and huge ones amortise scheduling.
constexpr int64_t kPixelGrain = 1024;

// Calls pixel(n, y, x) (a lambda marked EDSC_CPU_INLINE) for each of batch x height x width output
// pixels, in parallel tasks of kPixelGrain pixels run by run_for_cpu.
template <typename index_t, typename param_t, typename Pixel>
void for_each_output_pixel(bool avx2, int64_t batch, int64_t height, int64_t width, const Pixel& pixel) {
  const int64_t hw = height * width;
  torch::stable::parallel_for(0, batch * hw, kPixelGrain, [&](int64_t begin, int64_t end) {
    run_for_cpu<param_t>(avx2, [&]() EDSC_CPU_INLINE {
      for (int64_t k = begin; k < end; ++k) {
        pixel(static_cast<index_t>(k / hw), static_cast<index_t>((k % hw) / width), static_cast<index_t>(k % width));
      }
    });
  });
}

// Row-wise kernels of calls without offsets or dilation (CpuForwardKernel::kGridTapRows): every tap reads one
// input pixel, so a row of output pixels works on whole rows (of the input, the weights, the
// gradients) shifted by the tap, loops along x that the compiler vectorises.

// Per-pixel tensors' value k of pixel x of an output row: view.base + k * view.stride + x * step.
template <bool kChannelsLast, typename index_t>
EDSC_CPU_INLINE inline index_t pixel_step(index_t channels) {
  return kChannelsLast ? channels : index_t(1);
}

// Converts output row (n, y)'s vertical and horizontal weights to acc_t rows (ones when absent):
// v_rows[i * W + x], h_rows[j * W + x].
template <bool kChannelsLast, typename scalar_t, typename acc_t, typename index_t, typename param_t>
EDSC_CPU_INLINE inline void load_grid_weight_rows(const DeformSepconvParams<scalar_t, index_t, param_t>& p, index_t n,
                                                  index_t y, acc_t* v_rows, acc_t* h_rows) {
  const index_t KH = p.kernel_h, KW = p.kernel_w, width = p.width_out, hw_out = p.height_out * width;
  const PixelView<index_t> v_view = pixel_view<kChannelsLast>(n, y * width, KH, hw_out);
  const PixelView<index_t> h_view = pixel_view<kChannelsLast>(n, y * width, KW, hw_out);
  for (index_t i = 0; i < KH; ++i) {
    for (index_t x = 0; x < width; ++x) {
      v_rows[i * width + x] =
          load_param_or(p.vertical, v_view.base + i * v_view.stride + x * pixel_step<kChannelsLast>(KH), acc_t(1));
    }
  }
  for (index_t j = 0; j < KW; ++j) {
    for (index_t x = 0; x < width; ++x) {
      h_rows[j * width + x] =
          load_param_or(p.horizontal, h_view.base + j * h_view.stride + x * pixel_step<kChannelsLast>(KW), acc_t(1));
    }
  }
}

// out[x] += a[x] * b[x] for x in [0, n). The restrict pointers let the compiler vectorise it with no
// run-time aliasing check: written inline, the row loops fell back to scalar code (perf, 2026-12-01).
template <typename T>
EDSC_CPU_INLINE inline void multiply_add_row(T* __restrict out, const T* __restrict a, const T* __restrict b,
                                             int64_t n) {
  for (int64_t x = 0; x < n; ++x) out[x] += a[x] * b[x];
}

// out[x] += a[x] * value for x in [0, n).
template <typename T>
EDSC_CPU_INLINE inline void multiply_add_row(T* __restrict out, const T* __restrict a, T value, int64_t n) {
  for (int64_t x = 0; x < n; ++x) out[x] += a[x] * value;
}

// Tap j of output pixel x reads input column x + shift, shift = j - pad_w: inside the row for x in
// [begin, end); left of it in [0, begin), right in [end, W) (0, or the edge pixel where the padding
// mode clamps).
template <typename index_t>
struct GridTapColumns {
  index_t shift, begin, end;
  EDSC_CPU_INLINE GridTapColumns(index_t j, index_t pad_w, index_t width, index_t width_in) {
    shift = j - pad_w;
    begin = std::min(width, std::max(index_t(0), -shift));
    end = std::max(begin, std::min(width, width_in - shift));
  }
};

}  // namespace
}  // namespace edsc_ext
