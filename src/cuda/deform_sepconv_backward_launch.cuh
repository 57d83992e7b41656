// Launch of the CUDA backward's bilinear kernels (deform_sepconv_backward_bilinear_kernels.cuh)
// as planned (plan_cuda_backward), included by one translation unit per dtype
// (deform_sepconv_backward_<dtype>_cuda.cu).
#pragma once

#include "deform_sepconv_backward_bilinear_kernels.cuh"
#include "deform_sepconv_backward_cuda.cuh"
#include "shared_memory_opt_in.cuh"

namespace edsc_ext {

template <typename scalar_t, typename param_t>
void launch_deform_sepconv_backward(const DeformSepconvCall& call, const CudaBackwardPlan& plan,
                                    const DeformSepconvGrads& grads, const Tensor& grad_input_acc,
                                    const FixedPointInputGrad& fixed_point) {
  const CallFacts& f = call.facts;
  const int64_t pixels = f.output_pixels();
  const auto stream = current_cuda_stream(call.input.get_device_index());
  using acc_t = opmath_t<scalar_t>;
  using Seed = KernelTypes<kernel_facts::Dtypes<scalar_t, param_t>>;
  const bool deterministic = plan.deterministic;
  acc_t* grad_input = grad_input_acc.defined() ? grad_input_acc.mutable_data_ptr<acc_t>() : nullptr;
  const DeformSepconvParamGrads<param_t> param_grads =
      plan.kernel_param_grads ? make_param_grads<param_t>(grads) : DeformSepconvParamGrads<param_t>{};
  const scalar_t* go = call.grad_output->const_data_ptr<scalar_t>();
  constexpr bool kFixedPointTile = std::is_same_v<acc_t, float>;
  // Calls `launch` with the input-gradient adder that the plan asks for, for a layout: fixed-point int64
  // atomics when deterministic, float atomics otherwise.
  const auto with_global_add = [&](const auto& layout, auto&& launch) {
    using index_t = typename std::decay_t<decltype(layout)>::index_type;
    if (deterministic) {
      launch(FixedPointAtomicAdd<acc_t, index_t>{
          reinterpret_cast<unsigned long long*>(fixed_point.sums.mutable_data_ptr<int64_t>()),
          fixed_point.scale.const_data_ptr<double>(), fixed_point.poisoned.mutable_data_ptr<int>(), layout});
    } else {
      launch(GlobalAtomicAdd<acc_t, index_t>{grad_input, layout});
    }
  };

  if (plan.kernel == CudaBackwardKernel::kLaneTile) {
    // The channel lanes' calls (the planner's), with the input gradient.
    EDSC_CHECK(f.channels % kPixelVectorBlock == 0 && plan.kernel_input_grad,
               "backward: the lane tile was planned for a call it does not take");
    dispatch_kernel_types<Seed, dispatch_axis::IndexWidth, dispatch_axis::KernelSize5x5<>, dispatch_axis::Layout,
                          dispatch_axis::Variant<kLaneTileVariants>>(
        {f, plan.variant}, "deform_sepconv_backward_lane_tile_cuda", [&](auto k) {
          using K = decltype(k);
          using index_t = typename K::index_t;
          constexpr int kMaxWidth = K::kKernelW > 0 ? K::kKernelW : static_cast<int>(kMaxKernelWidth);
          static_assert(std::is_same_v<index_t, int32_t> && K::kChannelsLast && kFixedPointTile,
                        "the lane tile's scope: 32-bit indices, channels_last, a float32 accumulator");
          const auto p = make_params<scalar_t, index_t, param_t>(call);
          const TileFootprint& footprint = plan.footprint;
          const size_t shared = static_cast<size_t>(plan.tile_shared_bytes);
          const int64_t tile_w = kWarpSize >> plan.lanes_log2;
          const int64_t tiles =
              f.batch * ((f.height_out + kTileH - 1) / kTileH) * ((f.width_out + tile_w - 1) / tile_w);
          with_global_add(input_grad_layout<true>(p), [&](auto add) {
            const auto kernel =
                deform_sepconv_backward_lane_tile_cuda_kernel<K::variant.channel_block, K::kKernelH, K::kKernelW,
                                                              kMaxWidth, scalar_t, decltype(add), param_t>;
            opt_in_dynamic_shared_once(kernel, shared);
            kernel<<<static_cast<unsigned int>(tiles), kTileThreads, shared, stream>>>(
                p, go, param_grads, add, static_cast<int32_t>(footprint.rows), static_cast<int32_t>(footprint.cols),
                static_cast<int32_t>(footprint.channels_per_pass), plan.lanes_log2);
            EDSC_CUDA_KERNEL_LAUNCH_CHECK();
          });
        });
    return;
  }

  if (plan.kernel == CudaBackwardKernel::kChannelLanes) {
    // float32 and the half types, 32-bit indices, whole blocks of the row's channel_block (the planner's).
    EDSC_CHECK(f.channels % kPixelVectorBlock == 0,
               "backward: the channel lanes were planned for a call they do not take");
    dispatch_kernel_types<Seed, dispatch_axis::IndexWidth, dispatch_axis::KernelSize5x5<>, dispatch_axis::Layout,
                          dispatch_axis::Variant<kChannelLanesVariants>>(
        {f, plan.variant}, "deform_sepconv_backward_channel_lanes_cuda", [&](auto k) {
          using K = decltype(k);
          using index_t = typename K::index_t;
          constexpr int kMaxWidth = K::kKernelW > 0 ? K::kKernelW : static_cast<int>(kMaxKernelWidth);
          const auto p = make_params<scalar_t, index_t, param_t>(call);
          const GlobalAtomicAdd<acc_t, index_t> add{grad_input, input_grad_layout<true>(p)};
          const int64_t threads = pixels << plan.lanes_log2;
          deform_sepconv_backward_channel_lanes_cuda_kernel<K::variant.channel_block, K::kKernelH, K::kKernelW,
                                                            kMaxWidth, scalar_t, index_t, param_t>
              <<<static_cast<unsigned int>((threads + kThreadsPerBlock - 1) / kThreadsPerBlock), kThreadsPerBlock, 0,
                 stream>>>(p, go, param_grads, add, plan.kernel_input_grad, plan.lanes_log2, pixels);
          EDSC_CUDA_KERNEL_LAUNCH_CHECK();
        });
    return;
  }

  // The tiled and the one-thread-per-pixel kernels: the plan's row of kBackwardVariants (and, for a row with
  // static_padding, the call's padding mode).
  dispatch_kernel_types<Seed, dispatch_axis::IndexWidth, dispatch_axis::KernelSize5x5<>, dispatch_axis::Layout,
                        dispatch_axis::Variant<kBackwardVariants>, dispatch_axis::PaddingModeOfVariant>(
      {f, plan.variant}, "deform_sepconv_backward_cuda", [&](auto k) {
        using K = decltype(k);
        using index_t = typename K::index_t;
        const auto p = make_params<scalar_t, index_t, param_t>(call);
        // Static kernel sizes hold their accumulators in registers; run-time ones in a local array.
        constexpr int kMaxWidth = K::kKernelW > 0 ? K::kKernelW : static_cast<int>(kMaxKernelWidth);
        const InputGradLayout<index_t> layout = input_grad_layout<K::kChannelsLast>(p);
        if constexpr (K::variant.kernel == CudaBackwardKernel::kTiled) {
          const TileFootprint& footprint = plan.footprint;
          const size_t shared = static_cast<size_t>(plan.tile_shared_bytes);
          const int64_t tiles =
              f.batch * ((f.height_out + kTileH - 1) / kTileH) * ((f.width_out + kTileW - 1) / kTileW);
          with_global_add(layout, [&](auto add) {
            using Add = std::decay_t<decltype(add)>;
            // float64's tile adds in float64 (no fixed point): the planner keeps it from deterministic calls.
            if constexpr (kFixedPointTile || !std::is_same_v<Add, FixedPointAtomicAdd<acc_t, index_t>>) {
              const auto kernel = deform_sepconv_backward_tiled_cuda_kernel<
                  K::variant.channel_block, K::kKernelH, K::kKernelW, kMaxWidth, K::kChannelsLast,
                  K::variant.warp_staged, K::variant.exact_rgb, scalar_t, index_t, Add, param_t, K::kPaddingMode>;
              // The warp-staged buffers' static shared memory plus the tile may need the opt-in.
              if constexpr (K::variant.warp_staged) opt_in_dynamic_shared_once(kernel, shared);
              kernel<<<static_cast<unsigned int>(tiles), dim3(kTileW, kTileH), shared, stream>>>(
                  p, go, param_grads, add, static_cast<index_t>(footprint.rows), static_cast<index_t>(footprint.cols),
                  static_cast<index_t>(footprint.channels_per_pass), plan.prefetch);
              EDSC_CUDA_KERNEL_LAUNCH_CHECK();
            } else {
              throw std::logic_error(message("deform_sepconv_backward_cuda: variant ", K::variant.name,
                                             " was planned for a deterministic float64 call (a float tile)"));
            }
          });
        } else {
          with_global_add(layout, [&](auto add) {
            deform_sepconv_backward_cuda_kernel<K::variant.channel_block, K::kKernelH, K::kKernelW, kMaxWidth,
                                                K::kChannelsLast, scalar_t, index_t, decltype(add), param_t>
                <<<blocks_for(pixels), kThreadsPerBlock, 0, stream>>>(p, go, param_grads, add, plan.kernel_input_grad,
                                                                      pixels);
            EDSC_CUDA_KERNEL_LAUNCH_CHECK();
          });
        }
      });
}

}  // namespace edsc_ext
