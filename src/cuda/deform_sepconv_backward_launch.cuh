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
                                    const CudaBackwardPlan& plan, const DeformSepconvGradBuffers& grads,
                                    const at::TensorBase& grad_input_acc, const FixedPointInputGrad& fixed_point) {
  const at::TensorBase& input = t.input;
  const int64_t pixels = input.size(0) * t.height_out * t.width_out;
  const auto stream = c10::cuda::getCurrentCUDAStream(input.device().index());
  using acc_t = at::opmath_type<scalar_t>;
  const bool deterministic = plan.deterministic;
  acc_t* grad_input = grad_input_acc.defined() ? grad_input_acc.mutable_data_ptr<acc_t>() : nullptr;
  const DeformSepconvParamGrads<param_t> param_grads =
      plan.kernel_param_grads ? make_param_grads<param_t>(grads) : DeformSepconvParamGrads<param_t>{};
  constexpr bool kFixedPointTile = std::is_same_v<acc_t, float>;

  if (plan.kernel == CudaBackwardKernel::kChannelLanes) {
    // float32 and the half types, 32-bit indices, whole blocks of kPixelVectorBlock (the planner's).
    if constexpr (std::is_same_v<acc_t, float>) {
      using index_t = int32_t;
      TORCH_INTERNAL_ASSERT(t.use_32bit_indexing && t.channels_last && input.size(1) % kPixelVectorBlock == 0,
                            "backward: the channel lanes were planned for a call they do not take");
      EDSC_DISPATCH_KERNEL_SIZE(cfg.kernel_h, cfg.kernel_w, [&] {
        constexpr int kMaxWidth = kKernelW > 0 ? kKernelW : static_cast<int>(kMaxKernelWidth);
        const auto p = make_params<scalar_t, index_t, param_t>(t, cfg);
        const GlobalAtomicAdd<acc_t, index_t> add{grad_input, input_grad_layout<true>(p)};
        const int64_t threads = pixels << plan.lanes_log2;
        deform_sepconv_backward_channel_lanes_cuda_kernel<kPixelVectorBlock, kKernelH, kKernelW, kMaxWidth, scalar_t,
                                                          index_t, param_t>
            <<<static_cast<unsigned int>((threads + kThreadsPerBlock - 1) / kThreadsPerBlock), kThreadsPerBlock, 0,
               stream>>>(p, t.grad_output.const_data_ptr<scalar_t>(), param_grads, add, plan.kernel_input_grad,
                         plan.lanes_log2, pixels);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
      return;
    }
    TORCH_INTERNAL_ASSERT(false, "backward: the channel lanes were planned for float64");
  }

  EDSC_DISPATCH_INDEX_TYPE(t.use_32bit_indexing, [&] {
    EDSC_DISPATCH_KERNEL_SIZE(cfg.kernel_h, cfg.kernel_w, [&] {
      EDSC_DISPATCH_CHANNEL_BLOCK(plan.channel_block, [&] {
        EDSC_DISPATCH_LAYOUT(t.channels_last, [&] {
          const auto p = make_params<scalar_t, index_t, param_t>(t, cfg);
          const scalar_t* go = t.grad_output.const_data_ptr<scalar_t>();
          // Static kernel sizes hold their accumulators in registers; run-time ones in a local array.
          constexpr int kMaxWidth = kKernelW > 0 ? kKernelW : static_cast<int>(kMaxKernelWidth);
          const InputGradLayout<index_t> layout = input_grad_layout<kChannelsLast>(p);
          // Launches `kernel` (tiled or one thread per pixel) with the input-gradient adder that the
          // plan asks for: fixed-point int64 atomics when deterministic, float atomics otherwise.
          const auto with_global_add = [&](auto&& launch) {
            if (deterministic) {
              launch(FixedPointAtomicAdd<acc_t, index_t>{
                  reinterpret_cast<unsigned long long*>(fixed_point.sums.mutable_data_ptr<int64_t>()),
                  fixed_point.scale.const_data_ptr<double>(), fixed_point.poisoned.mutable_data_ptr<int>(), layout});
            } else {
              launch(GlobalAtomicAdd<acc_t, index_t>{grad_input, layout});
            }
          };
          if constexpr (std::is_same_v<index_t, int32_t>) {
            if (plan.kernel == CudaBackwardKernel::kTiled) {
              const TileFootprint& footprint = plan.footprint;
              const size_t shared = static_cast<size_t>(plan.tile_shared_bytes);
              const int64_t tiles =
                  input.size(0) * ((t.height_out + kTileH - 1) / kTileH) * ((t.width_out + kTileW - 1) / kTileW);
              with_global_add([&](auto add) {
                if constexpr (kFixedPointTile || !std::is_same_v<decltype(add), FixedPointAtomicAdd<acc_t, index_t>>) {
                  const auto launch = [&](auto kernel) {
                    kernel<<<static_cast<unsigned int>(tiles), dim3(kTileW, kTileH), shared, stream>>>(
                        p, go, param_grads, add, static_cast<index_t>(footprint.rows),
                        static_cast<index_t>(footprint.cols), static_cast<index_t>(footprint.channels_per_pass),
                        plan.prefetch);
                    C10_CUDA_KERNEL_LAUNCH_CHECK();
                  };
                  // The staged buffers hold the frame's dtype (the planner keeps mixed precision away).
                  constexpr bool kCanStage = kChannelsLast && kFixedPointTile && kKernelH == kWarpStagedKernel &&
                                             kKernelW == kWarpStagedKernel && std::is_same_v<param_t, scalar_t>;
                  if constexpr (kCanStage) {
                    if (plan.warp_staged) {
                      if constexpr (kChannelBlock == 3) {
                        if (plan.exact_rgb) {
                          const auto kernel =
                              deform_sepconv_backward_tiled_cuda_kernel<kChannelBlock, kKernelH, kKernelW, kMaxWidth,
                                                                        kChannelsLast, true, true, scalar_t, index_t,
                                                                        decltype(add), param_t>;
                          opt_in_dynamic_shared_once(kernel, shared);
                          return launch(kernel);
                        }
                      }
                      const auto kernel =
                          deform_sepconv_backward_tiled_cuda_kernel<kChannelBlock, kKernelH, kKernelW, kMaxWidth,
                                                                    kChannelsLast, true, false, scalar_t, index_t,
                                                                    decltype(add), param_t>;
                      opt_in_dynamic_shared_once(kernel, shared);
                      return launch(kernel);
                    }
                  }
                  if constexpr (!kChannelsLast && kChannelBlock == 3 && kKernelH == kSpecializedKernel &&
                                kKernelW == kSpecializedKernel) {
                    if (plan.exact_rgb) {
                      return launch(
                          deform_sepconv_backward_tiled_cuda_kernel<kChannelBlock, kKernelH, kKernelW, kMaxWidth,
                                                                    kChannelsLast, false, true, scalar_t, index_t,
                                                                    decltype(add), param_t>);
                    }
                  }
                  launch(deform_sepconv_backward_tiled_cuda_kernel<kChannelBlock, kKernelH, kKernelW, kMaxWidth,
                                                                   kChannelsLast, false, false, scalar_t, index_t,
                                                                   decltype(add), param_t>);
                }
              });
              return;
            }
          }
          TORCH_INTERNAL_ASSERT(plan.kernel == CudaBackwardKernel::kPixels,
                                "backward: the plan's kernel is not compiled ",
                                "for this call (tiled with 64-bit indices)");
          with_global_add([&](auto add) {
            deform_sepconv_backward_cuda_kernel<kChannelBlock, kKernelH, kKernelW, kMaxWidth, kChannelsLast, scalar_t,
                                                index_t, decltype(add), param_t>
                <<<blocks_for(pixels), kThreadsPerBlock, 0, stream>>>(p, go, param_grads, add, plan.kernel_input_grad,
                                                                      pixels);
            C10_CUDA_KERNEL_LAUNCH_CHECK();
          });
        });
      });
    });
  });
}

}  // namespace edsc_ext
