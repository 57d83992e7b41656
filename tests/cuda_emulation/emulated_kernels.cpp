// CUDA kernels of the op run on the CPU (cuda_emulation.h), for tests/test_cuda_emulation.py: each
// entry takes a call's raw tensors (the frame's and the per-pixel tensors' dtype one of float32,
// bfloat16, float16; the input gradient float32, as the kernels accumulate it) and geometry, launches
// one kernel as its launcher does, and returns 0, or 1 with a message. Python compares the results
// with the CPU op's.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <vector>

#include "cuda/deform_sepconv_backward_bilinear_kernels.cuh"
#include "cuda/deform_sepconv_backward_grid_taps_kernel.cuh"
#include "cuda/deform_sepconv_forward_grid_taps_kernel.cuh"
#include "cuda/deform_sepconv_forward_lane_pairs_kernel.cuh"
#include "cuda/deform_sepconv_forward_pixels_kernel.cuh"
#include "cuda/deform_sepconv_forward_staged_kernel.cuh"
#include "cuda/deform_sepconv_grid_taps_input_grad_kernel.cuh"
#include "cuda/pool2x_kernel.cuh"
#include "cuda/upsample2x_kernel.cuh"

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
  f.padding_mode = mode->code;
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
template <typename scalar_t, typename index_t = int32_t>
DeformSepconvParams<scalar_t, index_t, scalar_t> params_of(const CallFacts& f, const Tensors<scalar_t>& t) {
  DeformSepconvParams<scalar_t, index_t, scalar_t> p{};
  p.input = t.input;
  p.vertical = t.vertical;
  p.horizontal = t.horizontal;
  p.offset = t.offset;
  p.offset_dx = nullptr;
  p.mask = t.mask;
  set_geometry(p, f);
  // Dense per-pixel tensors' strides, which the forward's strided reads take: per image K * H * W, per
  // pixel 1 (NCHW) or K (channels_last).
  const auto dense = [&](const scalar_t* v, int64_t k) {
    const int64_t hw = f.height_out * f.width_out;
    return v == nullptr
               ? PerPixelStrides<index_t>{0, 0}
               : PerPixelStrides<index_t>{static_cast<index_t>(k * hw), static_cast<index_t>(f.channels_last ? k : 1)};
  };
  p.vertical_strides = dense(t.vertical, f.kernel_h);
  p.horizontal_strides = dense(t.horizontal, f.kernel_w);
  p.offset_strides = dense(t.offset, 2 * f.kernel_h * f.kernel_w);
  p.offset_dx_strides = dense(nullptr, 0);
  p.mask_strides = dense(t.mask, f.kernel_h * f.kernel_w);
  return p;
}

// The H200's facts, for the planner.
constexpr CudaDeviceFacts kHopper{.major = 9, .minor = 0, .shared_memory_per_block_optin = 232448};

int fail(const char* what, char* error, int error_len) {
  std::snprintf(error, static_cast<size_t>(error_len), "%s", what);
  return 1;
}

// The backward launchers' dispatch: a dtype pair (Seed), then index width, 5x5, layout and a row of kTable.
template <const auto& kTable, typename Seed, typename Body>
void dispatch_with_variant(const CallFacts& f, int variant, Body&& body) {
  dispatch_kernel_types<Seed, dispatch_axis::IndexWidth, dispatch_axis::KernelSize5x5<>, dispatch_axis::Layout,
                        dispatch_axis::Variant<kTable>>({f, variant}, "emulated", std::forward<Body>(body));
}

// The backward's bilinear kernel as plan_cuda_backward plans it for an H200 (kernel_policy's defaults,
// and lane_tile and input_grad_tile as given; not the grid-tap kernels, which a test's offsets never
// take, nor NCHW copies): the tiled kernel (warp-staged or not), the one-thread-per-pixel kernel, the
// channel lanes or the lane tile, instantiated through the launchers' dispatch, with the parameter
// gradients and the input gradient (float32, zero on entry). Writes the plan's name to `plan_out`.
template <typename scalar_t>
int emulated_backward(const Geometry& g, const KernelPolicy& policy, const Tensors<scalar_t>& t, char* plan_out,
                      int plan_out_len, char* error, int error_len) {
  const CallFacts f = facts_of(g, t);
  const CudaBackwardPlan plan = plan_cuda_backward(f, kHopper, policy);
  std::snprintf(plan_out, static_cast<size_t>(plan_out_len), "%s", plan_name(plan).c_str());
  if (plan.nchw_copies) return fail("a plan on NCHW copies", error, error_len);
  const DeformSepconvParamGrads<scalar_t> grads{t.grad_vertical, t.grad_horizontal, t.grad_offset, t.grad_mask,
                                                nullptr};
  using Seed = KernelTypes<kernel_facts::Dtypes<scalar_t, scalar_t>>;
  // Calls without offsets: the grid-tap kernels (launch_grid_taps_param_grads, launch_gather_input_grad).
  if (plan.grid_tap_param_grads) {
    dispatch_kernel_types<Seed, dispatch_axis::FixedIndex<int64_t>, dispatch_axis::Layout, dispatch_axis::SmallChannels,
                          dispatch_axis::MaskPresence, dispatch_axis::Variant<kGridTapsParamsVariants>>(
        {f, plan.grid_tap_params_variant}, "emulated", [&](auto k) {
          using K = decltype(k);
          const auto kernel =
              deform_sepconv_backward_grid_taps_cuda_kernel<K::kChannels, K::kChannelsLast, K::kMask, scalar_t>;
          const auto p = params_of<scalar_t, int64_t>(f, t);
          edsc_emulation::launch(grid_taps_grid(f), dim3(kGridTileThreads),
                                 static_cast<size_t>(plan.grid_tap_shared_bytes),
                                 [&] { kernel(p, t.grad_output, grads, plan.window); });
        });
  }
  if (plan.gather_input_grad) {
    // The launcher gathers into a float32 NCHW plane of the virtual domain, then folds a clamping mode's
    // border onto the image with torch: emulated where the domain is the image (zeros) and NCHW.
    if (f.padding.clamps || f.channels_last) return fail("a gather with a fold or a layout copy", error, error_len);
    const VirtualDomain domain = plan.gather_domain;
    const dim3 grid(static_cast<unsigned int>((domain.width + kGridTileWidth - 1) / kGridTileWidth),
                    static_cast<unsigned int>((domain.height + kGridTileHeight - 1) / kGridTileHeight),
                    static_cast<unsigned int>(f.batch));
    dispatch_kernel_types<Seed, dispatch_axis::FixedIndex<int64_t>, dispatch_axis::Layout, dispatch_axis::SmallChannels,
                          dispatch_axis::Variant<kGatherInputGradVariants>>(
        {f, plan.gather_variant}, "emulated", [&](auto k) {
          using K = decltype(k);
          const auto kernel = deform_sepconv_input_grad_grid_taps_cuda_kernel<K::kChannels, K::kChannelsLast, scalar_t>;
          const auto p = params_of<scalar_t, int64_t>(f, t);
          edsc_emulation::launch(grid, dim3(kGridTileThreads), static_cast<size_t>(plan.gather_shared_bytes),
                                 [&] { kernel(p, t.grad_output, t.grad_input, domain, plan.gather_layout); });
        });
  }
  if (plan.kernel == CudaBackwardKernel::kNone) return 0;
  // The bilinear kernel computes the per-pixel gradients the grid-tap kernel did not.
  const DeformSepconvParamGrads<scalar_t> kernel_grads =
      plan.kernel_param_grads ? grads : DeformSepconvParamGrads<scalar_t>{nullptr, nullptr, nullptr, nullptr, nullptr};
  const auto shared = static_cast<size_t>(plan.tile_shared_bytes);
  const auto rows = static_cast<int32_t>(plan.footprint.rows), cols = static_cast<int32_t>(plan.footprint.cols);
  const auto pass = static_cast<int32_t>(plan.footprint.channels_per_pass);
  const auto tiles_of = [&](int64_t tile_w) {
    return static_cast<unsigned int>(f.batch * ((f.height_out + kTileH - 1) / kTileH) *
                                     ((f.width_out + tile_w - 1) / tile_w));
  };
  if (plan.kernel == CudaBackwardKernel::kLaneTile || plan.kernel == CudaBackwardKernel::kChannelLanes) {
    const auto p = params_of(f, t);
    const GlobalAtomicAdd<float, int32_t> add{t.grad_input, input_grad_layout<true>(p)};
    if (plan.kernel == CudaBackwardKernel::kLaneTile) {
      dispatch_with_variant<kLaneTileVariants, Seed>(f, plan.variant, [&](auto k) {
        using K = decltype(k);
        constexpr int kMaxWidth = K::kKernelW > 0 ? K::kKernelW : static_cast<int>(kMaxKernelWidth);
        const auto kernel =
            deform_sepconv_backward_lane_tile_cuda_kernel<K::variant.channel_block, K::kKernelH, K::kKernelW, kMaxWidth,
                                                          scalar_t, std::decay_t<decltype(add)>, scalar_t>;
        edsc_emulation::launch(dim3(tiles_of(kWarpSize >> plan.lanes_log2)), dim3(kTileThreads), shared,
                               [&] { kernel(p, t.grad_output, kernel_grads, add, rows, cols, pass, plan.lanes_log2); });
      });
    } else {
      const int64_t pixels = f.output_pixels(), threads = pixels << plan.lanes_log2;
      dispatch_with_variant<kChannelLanesVariants, Seed>(f, plan.variant, [&](auto k) {
        using K = decltype(k);
        constexpr int kMaxWidth = K::kKernelW > 0 ? K::kKernelW : static_cast<int>(kMaxKernelWidth);
        const auto kernel =
            deform_sepconv_backward_channel_lanes_cuda_kernel<K::variant.channel_block, K::kKernelH, K::kKernelW,
                                                              kMaxWidth, scalar_t, int32_t, scalar_t>;
        edsc_emulation::launch(
            dim3(static_cast<unsigned int>((threads + kThreadsPerBlock - 1) / kThreadsPerBlock)),
            dim3(kThreadsPerBlock), 0,
            [&] { kernel(p, t.grad_output, kernel_grads, add, plan.kernel_input_grad, plan.lanes_log2, pixels); });
      });
    }
    return 0;
  }
  if (plan.kernel != CudaBackwardKernel::kTiled && plan.kernel != CudaBackwardKernel::kPixels) {
    return fail("a plan without a bilinear kernel", error, error_len);
  }
  dispatch_kernel_types<Seed, dispatch_axis::IndexWidth, dispatch_axis::KernelSize5x5<>, dispatch_axis::Layout,
                        dispatch_axis::Variant<kBackwardVariants>, dispatch_axis::PaddingModeOfVariant>(
      {f, plan.variant}, "emulated", [&](auto k) {
        using K = decltype(k);
        using index_t = typename K::index_t;
        constexpr int kMaxWidth = K::kKernelW > 0 ? K::kKernelW : static_cast<int>(kMaxKernelWidth);
        const auto p = params_of<scalar_t, index_t>(f, t);
        const GlobalAtomicAdd<float, index_t> add{t.grad_input, input_grad_layout<K::kChannelsLast>(p)};
        if constexpr (K::variant.kernel == CudaBackwardKernel::kTiled) {
          const auto kernel = deform_sepconv_backward_tiled_cuda_kernel<
              K::variant.channel_block, K::kKernelH, K::kKernelW, kMaxWidth, K::kChannelsLast, K::variant.warp_staged,
              K::variant.exact_rgb, scalar_t, index_t, std::decay_t<decltype(add)>, scalar_t, K::kPaddingMode>;
          edsc_emulation::launch(dim3(tiles_of(kTileW)), dim3(kTileW, kTileH), shared, [&] {
            kernel(p, t.grad_output, kernel_grads, add, static_cast<index_t>(rows), static_cast<index_t>(cols),
                   static_cast<index_t>(pass), plan.prefetch);
          });
        } else {
          const int64_t pixels = f.output_pixels();
          const auto kernel = deform_sepconv_backward_cuda_kernel<K::variant.channel_block, K::kKernelH, K::kKernelW,
                                                                  kMaxWidth, K::kChannelsLast, scalar_t, index_t,
                                                                  std::decay_t<decltype(add)>, scalar_t>;
          edsc_emulation::launch(dim3(blocks_for(pixels)), dim3(kThreadsPerBlock), 0,
                                 [&] { kernel(p, t.grad_output, kernel_grads, add, plan.kernel_input_grad, pixels); });
        }
      });
  return 0;
}

// The forward as plan_cuda_forward plans it for an H200 (kernel_policy's defaults, or plain_forward, or
// packed_frame or prefetch off):
// the grid-tap, staged, lane-pair or pixels kernel, instantiated through the launchers' dispatch.
template <typename scalar_t>
int emulated_forward(const Geometry& g, const Tensors<scalar_t>& t, bool plain, bool packed_frame, bool prefetch,
                     scalar_t* output, char* plan_out, int plan_out_len, char* error, int error_len) {
  const CallFacts f = facts_of(g, t);
  KernelPolicy policy;
  policy.plain_forward = plain;
  policy.packed_frame = packed_frame;
  policy.prefetch = prefetch;
  const CudaForwardPlan plan = plan_cuda_forward(f, kHopper, policy);
  std::snprintf(plan_out, static_cast<size_t>(plan_out_len), "%s", plan_name(plan).c_str());
  using Seed = KernelTypes<kernel_facts::Dtypes<scalar_t, scalar_t>>;
  switch (plan.kernel) {
    case CudaForwardKernel::kEmpty:
      return 0;
    case CudaForwardKernel::kGridTaps:
      dispatch_kernel_types<Seed, dispatch_axis::FixedIndex<int64_t>, dispatch_axis::Layout,
                            dispatch_axis::MaskPresence, dispatch_axis::Variant<kGridTapsForwardVariants>>(
          {f, plan.variant}, "emulated_forward", [&](auto k) {
            using K = decltype(k);
            constexpr int kPass = K::variant.pass_channels;
            const size_t shared = static_cast<size_t>(kPass) * plan.window.size() * sizeof(typename K::acc_t);
            const auto kernel =
                deform_sepconv_forward_grid_taps_cuda_kernel<kPass, K::kChannelsLast, K::kMask, scalar_t>;
            const auto p = params_of<scalar_t, int64_t>(f, t);
            edsc_emulation::launch(grid_taps_grid(f), dim3(kGridTileThreads), shared,
                                   [&] { kernel(p, output, plan.window); });
          });
      return 0;
    case CudaForwardKernel::kStaged:
      if constexpr (sizeof(scalar_t) == 2) {
        const int64_t hw = f.height_out * f.width_out;
        const auto blocks = static_cast<unsigned int>(f.batch * ((hw + kStagedPixels - 1) / kStagedPixels));
        dispatch_with_variant<kStagedForwardVariants, Seed>(f, plan.variant, [&](auto k) {
          using K = decltype(k);
          const auto kernel =
              deform_sepconv_forward_staged_cuda_kernel<kStagedChannelBlock, K::variant.chunk_bytes, scalar_t>;
          const auto p = params_of<scalar_t, int32_t>(f, t);
          edsc_emulation::launch(dim3(blocks), dim3(kStagedPixels), kStagedSegments * kStagedPixels * sizeof(scalar_t),
                                 [&] { kernel(p, output); });
        });
        return 0;
      } else {
        return fail("a staged plan for a 4-byte type", error, error_len);
      }
    case CudaForwardKernel::kLanePairs: {
      const int64_t pixels = f.output_pixels();
      dispatch_with_variant<kLanePairsForwardVariants, Seed>(f, plan.variant, [&](auto k) {
        using K = decltype(k);
        constexpr LanePairsForwardVariant v = K::variant;
        const auto kernel = deform_sepconv_forward_lane_pairs_cuda_kernel<v.exact_rgb, v.staged_values, scalar_t>;
        const auto p = params_of<scalar_t, int32_t>(f, t);
        edsc_emulation::launch(dim3(blocks_for(pixels * kLanesPerPixel)), dim3(kThreadsPerBlock), 0,
                               [&] { kernel(p, output, pixels); });
      });
      return 0;
    }
    case CudaForwardKernel::kPixels: {
      const int channel_block = kPixelsForwardVariants[plan.variant].channel_block;
      const int64_t work_items =
          f.batch * ((f.channels + channel_block - 1) / channel_block) * f.height_out * f.width_out;
      dispatch_kernel_types<Seed, dispatch_axis::IndexWidth, dispatch_axis::KernelSize5x5<>, dispatch_axis::Layout,
                            dispatch_axis::Variant<kPixelsForwardVariants>, dispatch_axis::PaddingModeOfVariant>(
          {f, plan.variant}, "emulated", [&](auto k) {
            using K = decltype(k);
            constexpr PixelsForwardVariant v = K::variant;
            const auto p = params_of<scalar_t, typename K::index_t>(f, t);
            std::vector<PackedRgbPixel<scalar_t>> packed;
            if constexpr (v.packed_frame) {
              // As the launcher: the frame packed first.
              const int64_t count = f.batch * f.height_in * f.width_in;
              packed.resize(static_cast<size_t>(count));
              edsc_emulation::launch(dim3(blocks_for(count)), dim3(kThreadsPerBlock), 0, [&] {
                pack_rgb_frame_cuda_kernel<scalar_t>(t.input, packed.data(),
                                                     static_cast<int32_t>(f.height_in * f.width_in),
                                                     static_cast<int32_t>(count));
              });
            }
            const auto kernel =
                deform_sepconv_forward_cuda_kernel<v.channel_block, K::kKernelH, K::kKernelW, K::kChannelsLast,
                                                   v.prefetch, v.channel_block == 3, v.vector_loads, scalar_t,
                                                   typename K::index_t, scalar_t, K::kPaddingMode, v.packed_frame>;
            edsc_emulation::launch(dim3(blocks_for(work_items)), dim3(kThreadsPerBlock), 0,
                                   [&] { kernel(p, output, work_items, packed.data()); });
          });
      return 0;
    }
  }
  return fail("no such forward kernel", error, error_len);
}

// Calls run(T{}) for the dtype code (0 float32, 1 bfloat16, 2 float16) and returns what it returns; 1
// with a message for another code or an exception.
template <typename Run>
int with_dtype(int dtype, const Run& run, char* error, int error_len) {
  try {
    switch (dtype) {
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

Geometry geometry_of(const int64_t* values) {
  Geometry g;
  std::copy(values, values + 14, &g.n);
  return g;
}

}  // namespace
}  // namespace edsc_ext

extern "C" __attribute__((visibility("default"))) int edsc_emulated_backward(
    const int64_t* geometry_values, int dtype, int lane_tile, int input_grad_tile, int lean_rgb_backward,
    const void* input, const void* vertical, const void* horizontal, const void* offset, const void* mask,
    const void* grad_output, float* grad_input, void* grad_vertical, void* grad_horizontal, void* grad_offset,
    void* grad_mask, char* plan_out, int plan_out_len, char* error, int error_len) {
  using namespace edsc_ext;
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
    KernelPolicy policy;
    policy.lane_tile = lane_tile != 0;
    policy.input_grad_tile = input_grad_tile != 0;
    policy.lean_rgb_backward = lean_rgb_backward != 0;
    return emulated_backward<T>(geometry_of(geometry_values), policy, t, plan_out, plan_out_len, error, error_len);
  };
  return with_dtype(dtype, run, error, error_len);
}

extern "C" __attribute__((visibility("default"))) int edsc_emulated_forward(
    const int64_t* geometry_values, int dtype, int plain, int packed_frame, int prefetch, const void* input,
    const void* vertical, const void* horizontal, const void* offset, const void* mask, void* output, char* plan_out,
    int plan_out_len, char* error, int error_len) {
  using namespace edsc_ext;
  const auto run = [&](auto type) {
    using T = decltype(type);
    Tensors<T> t{};
    t.input = static_cast<const T*>(input);
    t.vertical = static_cast<const T*>(vertical);
    t.horizontal = static_cast<const T*>(horizontal);
    t.offset = static_cast<const T*>(offset);
    t.mask = static_cast<const T*>(mask);
    return emulated_forward<T>(geometry_of(geometry_values), t, plain != 0, packed_frame != 0, prefetch != 0,
                               static_cast<T*>(output), plan_out, plan_out_len, error, error_len);
  };
  return with_dtype(dtype, run, error, error_len);
}

// The 2x resampling ops' kernels on a dense (N, C, H, W) input in NCHW or channels_last (sizes: N, C, H, W), into
// its dense output, with the launcher's grid: `op` 0 is upsample_bilinear2x's (src/cuda/upsample2x_kernel.cuh, the
// output (N, C, 2H, 2W)), 1 avg_pool2x's (src/cuda/pool2x_kernel.cuh, (N, C, H / 2, W / 2)); `vector` takes the
// 16-byte kernel (channels_last: C a multiple of its values; NCHW: the output's W a multiple), else one value a
// thread.
extern "C" __attribute__((visibility("default"))) int edsc_emulated_resample2x(int op, const int64_t* sizes,
                                                                               int channels_last, int vector, int dtype,
                                                                               const void* input, void* output,
                                                                               char* error, int error_len) {
  using namespace edsc_ext;
  const auto run = [&](auto type) {
    using T = decltype(type);
    using acc_t = opmath_t<T>;
    constexpr int kVec = 16 / sizeof(T);
    const bool pool = op == 1;
    const auto n = static_cast<int32_t>(sizes[0]), c = static_cast<int32_t>(sizes[1]);
    const auto h = static_cast<int32_t>(sizes[2]), w = static_cast<int32_t>(sizes[3]);
    const int32_t out_h = pool ? h / 2 : 2 * h, out_w = pool ? w / 2 : 2 * w;
    const T* in = static_cast<const T*>(input);
    T* out = static_cast<T*>(output);
    const acc_t scale_h = upsample2x_scale<acc_t>(h), scale_w = upsample2x_scale<acc_t>(w);
    const auto grid = [](int64_t rows, int64_t row_items) {
      return dim3(static_cast<unsigned int>((row_items + kThreadsPerBlock - 1) / kThreadsPerBlock),
                  static_cast<unsigned int>(rows));
    };
    if (channels_last) {
      const int32_t rows = n * out_h;
      if (vector && c % kVec != 0) return fail("vector: C must be a multiple of 16 bytes' values", error, error_len);
      const int32_t blocks = vector ? c / kVec : c;
      edsc_emulation::launch(grid(rows, out_w * blocks), dim3(kThreadsPerBlock), 0, [&] {
        if (pool && vector) avg_pool2x_channels_last_cuda_kernel<T, kVec>(in, out, rows, h, w, blocks);
        if (pool && !vector) avg_pool2x_channels_last_cuda_kernel<T, 1>(in, out, rows, h, w, blocks);
        if (!pool && vector)
          upsample2x_channels_last_cuda_kernel<T, kVec>(in, out, rows, h, w, blocks, scale_h, scale_w);
        if (!pool && !vector) upsample2x_channels_last_cuda_kernel<T, 1>(in, out, rows, h, w, blocks, scale_h, scale_w);
      });
    } else {
      const int32_t rows = n * c * out_h;
      if (vector && out_w % kVec != 0) {
        return fail("vector: the output's W must be a multiple of 16 bytes' values", error, error_len);
      }
      edsc_emulation::launch(grid(rows, vector ? out_w / kVec : out_w), dim3(kThreadsPerBlock), 0, [&] {
        if (pool && vector) avg_pool2x_nchw_cuda_kernel<T, kVec>(in, out, rows, h, w);
        if (pool && !vector) avg_pool2x_nchw_cuda_kernel<T, 1>(in, out, rows, h, w);
        if (!pool && vector) upsample2x_nchw_cuda_kernel<T, kVec>(in, out, rows, h, w, scale_h, scale_w);
        if (!pool && !vector) upsample2x_nchw_cuda_kernel<T, 1>(in, out, rows, h, w, scale_h, scale_w);
      });
    }
    return 0;
  };
  return with_dtype(dtype, run, error, error_len);
}

// The emulation's own check: a block of 64 threads sums its lanes' ids with xor shuffles (each warp
// must get 0 + 1 + ... + 31 in every lane) and writes 4 bytes a thread of 256 bytes of dynamic shared
// memory, or, with `overflow`, thread 0 also writes one byte past them, which the launch must report.
extern "C" __attribute__((visibility("default"))) int edsc_emulation_check(int overflow, char* error, int error_len) {
  using namespace edsc_ext;
  try {
    std::atomic<int> wrong{0};
    edsc_emulation::launch(dim3(2), dim3(64), 256, [&] {
      EDSC_EXTERN_SHARED(unsigned char, bytes);
      int sum = static_cast<int>(threadIdx.x % 32);
      for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      if (sum != 496) wrong.fetch_add(1);
      for (int k = 0; k < 4; ++k) bytes[threadIdx.x * 4 + k] = static_cast<unsigned char>(k);
      __syncthreads();
      if (overflow && threadIdx.x == 0) bytes[256] = 0;
    });
    if (wrong.load() != 0) return fail("the shuffles summed wrongly", error, error_len);
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what(), error, error_len);
  }
}
