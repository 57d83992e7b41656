// CUDA kernels of the op run on the CPU (cuda_emulation.h), for tests/test_cuda_emulation.py: each
// entry takes a call's raw tensors (the frame's and the per-pixel tensors' dtype one of float32,
// bfloat16, float16; the input gradient float32, as the kernels accumulate it) and geometry, launches
// one kernel as its launcher does, and returns 0, or 1 with a message. Python compares the results
// with the CPU op's.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>

#include "cuda/deform_sepconv_backward_bilinear_kernels.cuh"

namespace edsc_ext {
namespace {

// geometry: N, C, H_in, W_in, H_out, W_out, KH, KW, pad_h, pad_w, dilation_h, dilation_w, padding mode code,
// channels_last (0 or 1).
struct Geometry {
  int64_t n, c, h_in, w_in, h_out, w_out, kh, kw, pad_h, pad_w, dil_h, dil_w, mode, channels_last;
};

template <typename scalar_t>
struct Tensors {
  const scalar_t *input, *vertical, *horizontal, *offset, *mask, *grad_output;
  float* grad_input;
  scalar_t *grad_vertical, *grad_horizontal, *grad_offset, *grad_mask;
};

template <typename scalar_t>
CallFacts facts_of(const Geometry& g, const Tensors<scalar_t>& t) {
  CallFacts f;
  f.kernel_h = g.kh;
  f.kernel_w = g.kw;
  f.pad_h = g.pad_h;
  f.pad_w = g.pad_w;
  f.dilation_h = g.dil_h;
  f.dilation_w = g.dil_w;
  const PaddingModeSpec* mode = find_padding_mode(g.mode);
  if (mode == nullptr) throw std::invalid_argument("no such padding mode code");
  f.padding = mode->traits;
  f.batch = g.n;
  f.channels = g.c;
  f.height_in = g.h_in;
  f.width_in = g.w_in;
  f.height_out = g.h_out;
  f.width_out = g.w_out;
  f.frame_dtype = f.param_dtype = scalar_type_of<scalar_t>();
  f.element_size = f.param_element_size = sizeof(scalar_t);
  f.channels_last = g.channels_last != 0;
  f.has_vertical = t.vertical != nullptr;
  f.has_horizontal = t.horizontal != nullptr;
  f.has_offset = t.offset != nullptr;
  f.has_mask = t.mask != nullptr;
  f.grads = {t.grad_input != nullptr, t.grad_vertical != nullptr, t.grad_horizontal != nullptr,
             t.grad_offset != nullptr, t.grad_mask != nullptr};
  return f;
}

// make_params of a CallFacts and raw pointers (dense per-pixel tensors).
template <typename scalar_t>
DeformSepconvParams<scalar_t, int32_t, scalar_t> params_of(const CallFacts& f, const Tensors<scalar_t>& t) {
  DeformSepconvParams<scalar_t, int32_t, scalar_t> p{};
  p.input = t.input;
  p.vertical = t.vertical;
  p.horizontal = t.horizontal;
  p.offset = t.offset;
  p.offset_dx = nullptr;
  p.mask = t.mask;
  set_geometry(p, f);
  return p;
}

// The H200's facts, for the planner.
constexpr CudaDeviceFacts kHopper{.major = 9, .minor = 0, .shared_memory_per_block_optin = 232448};

int fail(const char* what, char* error, int error_len) {
  std::snprintf(error, static_cast<size_t>(error_len), "%s", what);
  return 1;
}

// The backward's bilinear kernel as plan_cuda_backward plans it for an H200 (kernel_policy's defaults,
// and lane_tile as given), where that kernel is the tiled one (float32; without warp staging, which
// needs the frame's dtype at 5x5 in channels_last), the lane tile or the channel lanes: the parameter
// gradients and the input gradient (float32, zero on entry). Writes the plan's name to `plan_out`.
template <typename scalar_t>
int emulated_backward(const Geometry& g, bool lane_tile, const Tensors<scalar_t>& t, char* plan_out, int plan_out_len,
                      char* error, int error_len) {
  const CallFacts f = facts_of(g, t);
  KernelPolicy policy;
  policy.lane_tile = lane_tile;
  const CudaBackwardPlan plan = plan_cuda_backward(f, kHopper, policy);
  std::snprintf(plan_out, static_cast<size_t>(plan_out_len), "%s", plan_name(plan).c_str());
  const auto p = params_of(f, t);
  const DeformSepconvParamGrads<scalar_t> grads{t.grad_vertical, t.grad_horizontal, t.grad_offset, t.grad_mask,
                                                nullptr};
  using Add = GlobalAtomicAdd<float, int32_t>;
  const bool fixed5 = f.square_kernel(kSpecializedKernel);
  if (plan.nchw_copies) return fail("a plan on NCHW copies", error, error_len);
  if (plan.kernel == CudaBackwardKernel::kLaneTile || plan.kernel == CudaBackwardKernel::kChannelLanes) {
    const Add add{t.grad_input, input_grad_layout<true>(p)};
    if (plan.kernel == CudaBackwardKernel::kLaneTile) {
      const int64_t tile_w = kWarpSize >> plan.lanes_log2;
      const int64_t tiles = f.batch * ((f.height_out + kTileH - 1) / kTileH) * ((f.width_out + tile_w - 1) / tile_w);
      const auto run = [&](auto kernel) {
        edsc_emulation::launch(dim3(static_cast<unsigned int>(tiles)), dim3(kTileThreads),
                               static_cast<size_t>(plan.tile_shared_bytes), [&] {
                                 kernel(p, t.grad_output, grads, add, static_cast<int32_t>(plan.footprint.rows),
                                        static_cast<int32_t>(plan.footprint.cols),
                                        static_cast<int32_t>(plan.footprint.channels_per_pass), plan.lanes_log2);
                               });
      };
      if (fixed5) {
        run(deform_sepconv_backward_lane_tile_cuda_kernel<kPixelVectorBlock, 5, 5, 5, scalar_t, Add, scalar_t>);
      } else {
        run(deform_sepconv_backward_lane_tile_cuda_kernel<kPixelVectorBlock, 0, 0, static_cast<int>(kMaxKernelWidth),
                                                          scalar_t, Add, scalar_t>);
      }
    } else {
      const int64_t pixels = f.output_pixels(), threads = pixels << plan.lanes_log2;
      const auto run = [&](auto kernel) {
        edsc_emulation::launch(dim3(static_cast<unsigned int>((threads + kThreadsPerBlock - 1) / kThreadsPerBlock)),
                               dim3(kThreadsPerBlock), 0, [&] {
                                 kernel(p, t.grad_output, grads, add, plan.kernel_input_grad, plan.lanes_log2, pixels);
                               });
      };
      if (fixed5) {
        run(deform_sepconv_backward_channel_lanes_cuda_kernel<kPixelVectorBlock, 5, 5, 5, scalar_t, int32_t, scalar_t>);
      } else {
        run(deform_sepconv_backward_channel_lanes_cuda_kernel<
            kPixelVectorBlock, 0, 0, static_cast<int>(kMaxKernelWidth), scalar_t, int32_t, scalar_t>);
      }
    }
    return 0;
  }
  if (plan.kernel != CudaBackwardKernel::kTiled) return fail("a plan without the tiled kernel", error, error_len);
  if constexpr (!std::is_same_v<scalar_t, float>) {
    return fail("the tiled kernel is emulated in float32", error, error_len);
  } else {
    const BackwardVariant& v = kBackwardVariants[plan.variant];
    if (v.warp_staged) return fail("the warp-staged tile is not emulated", error, error_len);
    const InputGradLayout<int32_t> layout{p.channels, p.height_in, p.width_in,
                                          f.channels_last ? 1 : p.height_in * p.width_in,
                                          f.channels_last ? p.channels : 1};
    const Add add{t.grad_input, layout};
    const int64_t tiles = f.batch * ((f.height_out + kTileH - 1) / kTileH) * ((f.width_out + kTileW - 1) / kTileW);
    const auto rows = static_cast<int32_t>(plan.footprint.rows), cols = static_cast<int32_t>(plan.footprint.cols);
    const auto pass = static_cast<int32_t>(plan.footprint.channels_per_pass);
    const auto run = [&](auto kernel) {
      edsc_emulation::launch(dim3(static_cast<unsigned int>(tiles)), dim3(kTileW, kTileH),
                             static_cast<size_t>(plan.tile_shared_bytes),
                             [&] { kernel(p, t.grad_output, grads, add, rows, cols, pass, plan.prefetch); });
    };
    if (v.exact_rgb && fixed5 && !f.channels_last) {
      run(deform_sepconv_backward_tiled_cuda_kernel<3, 5, 5, 5, false, false, true, float, int32_t, Add, float>);
    } else if (v.channel_block == 4 && !f.channels_last && !fixed5) {
      run(deform_sepconv_backward_tiled_cuda_kernel<4, 0, 0, static_cast<int>(kMaxKernelWidth), false, false, false,
                                                    float, int32_t, Add, float>);
    } else if (v.channel_block == 4 && f.channels_last && !fixed5) {
      run(deform_sepconv_backward_tiled_cuda_kernel<4, 0, 0, static_cast<int>(kMaxKernelWidth), true, false, false,
                                                    float, int32_t, Add, float>);
    } else if (v.channel_block == 4 && !f.channels_last && fixed5) {
      run(deform_sepconv_backward_tiled_cuda_kernel<4, 5, 5, 5, false, false, false, float, int32_t, Add, float>);
    } else {
      return fail("this plan's instantiation is not emulated", error, error_len);
    }
    return 0;
  }
}

}  // namespace
}  // namespace edsc_ext

extern "C" __attribute__((visibility("default"))) int edsc_emulated_backward(
    const int64_t* geometry_values, int dtype, int lane_tile, const void* input, const void* vertical,
    const void* horizontal, const void* offset, const void* mask, const void* grad_output, float* grad_input,
    void* grad_vertical, void* grad_horizontal, void* grad_offset, void* grad_mask, char* plan_out, int plan_out_len,
    char* error, int error_len) {
  using namespace edsc_ext;
  try {
    Geometry g;
    std::copy(geometry_values, geometry_values + 14, &g.n);
    const auto run = [&](auto type) {
      using T = decltype(type);
      const Tensors<T> t{static_cast<const T*>(input),
                         static_cast<const T*>(vertical),
                         static_cast<const T*>(horizontal),
                         static_cast<const T*>(offset),
                         static_cast<const T*>(mask),
                         static_cast<const T*>(grad_output),
                         grad_input,
                         static_cast<T*>(grad_vertical),
                         static_cast<T*>(grad_horizontal),
                         static_cast<T*>(grad_offset),
                         static_cast<T*>(grad_mask)};
      return emulated_backward<T>(g, lane_tile != 0, t, plan_out, plan_out_len, error, error_len);
    };
    switch (dtype) {  // 0 float32, 1 bfloat16, 2 float16
      case 0:
        return run(float{});
      case 1:
        return run(BFloat16{});
      case 2:
        return run(Half{});
      default:
        return fail("dtype code must be 0, 1 or 2", error, error_len);
    }
  } catch (const std::exception& e) {
    return fail(e.what(), error, error_len);
  }
}
