// Launch of the CUDA backward's bilinear kernels (deform_sepconv_backward_bilinear_kernels.cuh)
// as planned (plan_cuda_backward), included by one translation unit per dtype
// (deform_sepconv_backward_<dtype>_cuda.cu).
#pragma once

#include "deform_sepconv_backward_bilinear_kernels.cuh"
#include "deform_sepconv_backward_cuda.cuh"
#include "shared_memory_opt_in.cuh"

namespace edsc_ext {

template <typename scalar_t, typename param_t>
void launch_deform_sepconv_backward(const DeformSepconvTensors& t, const DeformSepconvConfig& cfg,
                                    const CudaBackwardPlan& plan, const DeformSepconvGrads& grads,
                                    const Tensor& grad_input_acc, const FixedPointInputGrad& fixed_point) {
  const Tensor& input = t.input;
  const int64_t pixels = input.size(0) * t.height_out * t.width_out;
  const auto stream = current_cuda_stream(input.get_device_index());
  using acc_t = opmath_t<scalar_t>;
  const bool deterministic = plan.deterministic;
  acc_t* grad_input = grad_input_acc.defined() ? grad_input_acc.mutable_data_ptr<acc_t>() : nullptr;
  const DeformSepconvParamGrads<param_t> param_grads =
      plan.kernel_param_grads ? make_param_grads<param_t>(grads) : DeformSepconvParamGrads<param_t>{};
  constexpr bool kFixedPointTile = std::is_same_v<acc_t, float>;

  if (plan.kernel == CudaBackwardKernel::kChannelLanes) {
    // float32 and the half types, 32-bit indices, whole blocks of kPixelVectorBlock (the planner's).
    if constexpr (std::is_same_v<acc_t, float>) {
      EDSC_CHECK(t.use_32bit_indexing && t.channels_last && input.size(1) % kPixelVectorBlock == 0,
                 "backward: the channel lanes were planned for a call they do not take");
      dispatch_kernel_types<KernelTypes<scalar_t, param_t>, dispatch_axis::FixedIndex<int32_t>,
                            dispatch_axis::KernelSize5x5<>>(
          kernel_call(t, cfg), "deform_sepconv_backward_channel_lanes_cuda", [&](auto k) {
            using K = std::decay_t<decltype(k)>;
            using index_t = typename K::index_t;
            constexpr int kMaxWidth = K::kKernelW > 0 ? K::kKernelW : static_cast<int>(kMaxKernelWidth);
            const auto p = make_params<scalar_t, index_t, param_t>(t, cfg);
            const GlobalAtomicAdd<acc_t, index_t> add{grad_input, input_grad_layout<true>(p)};
            const int64_t threads = pixels << plan.lanes_log2;
            deform_sepconv_backward_channel_lanes_cuda_kernel<kPixelVectorBlock, K::kKernelH, K::kKernelW, kMaxWidth,
                                                              scalar_t, index_t, param_t>
                <<<static_cast<unsigned int>((threads + kThreadsPerBlock - 1) / kThreadsPerBlock), kThreadsPerBlock, 0,
                   stream>>>(p, t.grad_output->const_data_ptr<scalar_t>(), param_grads, add, plan.kernel_input_grad,
                             plan.lanes_log2, pixels);
            EDSC_CUDA_KERNEL_LAUNCH_CHECK();
          });
      return;
    }
    EDSC_CHECK(false, "backward: the channel lanes were planned for float64");
  }

  // The tiled and the one-thread-per-pixel kernels: the plan's row of kBackwardVariants.
  dispatch_kernel_types<KernelTypes<scalar_t, param_t>, dispatch_axis::IndexWidth, dispatch_axis::KernelSize5x5<>,
                        dispatch_axis::Layout>(kernel_call(t, cfg), "deform_sepconv_backward_cuda", [&](auto k) {
    using K = std::decay_t<decltype(k)>;
    using index_t = typename K::index_t;
    const auto p = make_params<scalar_t, index_t, param_t>(t, cfg);
    const scalar_t* go = t.grad_output->const_data_ptr<scalar_t>();
    // Static kernel sizes hold their accumulators in registers; run-time ones in a local array.
    constexpr int kMaxWidth = K::kKernelW > 0 ? K::kKernelW : static_cast<int>(kMaxKernelWidth);
    const InputGradLayout<index_t> layout = input_grad_layout<K::kChannelsLast>(p);
    // Calls `launch` with the input-gradient adder that the plan asks for: fixed-point int64
    // atomics when deterministic, float atomics otherwise.
    const auto with_global_add = [&](auto&& launch) {
      if (deterministic) {
        launch(FixedPointAtomicAdd<acc_t, index_t>{
            reinterpret_cast<unsigned long long*>(fixed_point.sums.mutable_data_ptr<int64_t>()),
            fixed_point.scale.const_data_ptr<double>(), fixed_point.poisoned.mutable_data_ptr<int>(), layout});
      } else {
        launch(GlobalAtomicAdd<acc_t, index_t>{grad_input, layout});
      }
    };
    dispatch_variant_row<kBackwardVariants>(plan.variant, [&](auto variant) {
      using V = std::decay_t<decltype(variant)>;
      if constexpr (!V::row.scope.admits(variant_facts<K>())) {
        variant_not_compiled("deform_sepconv_backward_cuda", V::row.name);
      } else if constexpr (V::row.kernel == CudaBackwardKernel::kTiled) {
        const TileFootprint& footprint = plan.footprint;
        const size_t shared = static_cast<size_t>(plan.tile_shared_bytes);
        const int64_t tiles =
            input.size(0) * ((t.height_out + kTileH - 1) / kTileH) * ((t.width_out + kTileW - 1) / kTileW);
        with_global_add([&](auto add) {
          using Add = std::decay_t<decltype(add)>;
          // float64's tile adds in float64 (no fixed point): the planner keeps it from deterministic calls.
          if constexpr (kFixedPointTile || !std::is_same_v<Add, FixedPointAtomicAdd<acc_t, index_t>>) {
            const auto kernel =
                deform_sepconv_backward_tiled_cuda_kernel<V::row.channel_block, K::kKernelH, K::kKernelW, kMaxWidth,
                                                          K::kChannelsLast, V::row.warp_staged, V::row.exact_rgb,
                                                          scalar_t, index_t, Add, param_t>;
            // The warp-staged buffers' static shared memory plus the tile may need the opt-in.
            if constexpr (V::row.warp_staged) opt_in_dynamic_shared_once(kernel, shared);
            kernel<<<static_cast<unsigned int>(tiles), dim3(kTileW, kTileH), shared, stream>>>(
                p, go, param_grads, add, static_cast<index_t>(footprint.rows), static_cast<index_t>(footprint.cols),
                static_cast<index_t>(footprint.channels_per_pass), plan.prefetch);
            EDSC_CUDA_KERNEL_LAUNCH_CHECK();
          } else {
            variant_not_compiled("deform_sepconv_backward_cuda (float64 fixed-point tile)", V::row.name);
          }
        });
      } else {
        with_global_add([&](auto add) {
          deform_sepconv_backward_cuda_kernel<V::row.channel_block, K::kKernelH, K::kKernelW, kMaxWidth,
                                              K::kChannelsLast, scalar_t, index_t, decltype(add), param_t>
              <<<blocks_for(pixels), kThreadsPerBlock, 0, stream>>>(p, go, param_grads, add, plan.kernel_input_grad,
                                                                    pixels);
          EDSC_CUDA_KERNEL_LAUNCH_CHECK();
        });
      }
    });
  });
}

}  // namespace edsc_ext
