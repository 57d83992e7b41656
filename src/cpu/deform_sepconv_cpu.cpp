// CPU backend of deform_sepconv: at::parallel_for over output pixels, per-pixel work from
// include/edsc_ext/deform_sepconv_pixel.h.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "edsc_ext/ops.h"

namespace edsc_ext {
namespace {

// Channels handled per pass over the taps: sampling weights are computed once per block.
constexpr int kCpuChannelBlock = 8;
// Pixels per parallel task, so tiny images still split and huge ones amortise scheduling.
constexpr int64_t kPixelGrain = 1024;

at::Tensor deform_sepconv_forward_cpu(const at::Tensor& input, const std::optional<at::Tensor>& vertical,
                                      const std::optional<at::Tensor>& horizontal,
                                      const std::optional<at::Tensor>& offset, const std::optional<at::Tensor>& mask,
                                      int64_t kernel_h, int64_t kernel_w, int64_t pad_h, int64_t pad_w,
                                      int64_t dilation_h, int64_t dilation_w, int64_t padding_mode) {
  const DeformSepconvConfig cfg{kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode};
  const DeformSepconvTensors t = prepare_deform_sepconv(input, vertical, horizontal, offset, mask, cfg);
  at::Tensor output = at::empty({input.size(0), input.size(1), t.height_out, t.width_out},
                                input.options().memory_format(t.memory_format()));
  if (output.numel() == 0) return output;

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "deform_sepconv_forward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    EDSC_DISPATCH_INDEX_TYPE(t.use_32bit_indexing, [&] {
      EDSC_DISPATCH_LAYOUT(t.channels_last, [&] {
      EDSC_DISPATCH_KERNEL_SIZE(kernel_h, kernel_w, [&] {
        const auto p = make_params<scalar_t, index_t>(t, cfg);
        scalar_t* out = output.mutable_data_ptr<scalar_t>();
        const int64_t hw = t.height_out * t.width_out;
        at::parallel_for(0, p.batch * hw, kPixelGrain, [&](int64_t begin, int64_t end) {
          for (int64_t k = begin; k < end; ++k) {
            const index_t n = static_cast<index_t>(k / hw);
            const index_t y = static_cast<index_t>((k % hw) / t.width_out);
            const index_t x = static_cast<index_t>(k % t.width_out);
            for (index_t c0 = 0; c0 < p.channels; c0 += kCpuChannelBlock) {
              deform_sepconv_forward_pixel<kCpuChannelBlock, kKernelH, kKernelW, kChannelsLast, scalar_t, acc_t,
                                           index_t>(p, out, n, y, x, c0);
            }
          }
        });
      });
      });
    });
  });
  return output;
}

template <typename acc_t>
struct NoInputGrad {
  template <typename index_t>
  void operator()(index_t, index_t, index_t, acc_t) const {}
};

// Adds into the input gradient of one batch element; each (n, c) plane belongs to one task.
template <typename acc_t, typename index_t>
struct PlaneAdd {
  acc_t* grad;  // grad_input[n]
  index_t width, channel_stride, pixel_stride;
  void operator()(index_t c, index_t y, index_t x, acc_t v) const {
    grad[c * channel_stride + (y * width + x) * pixel_stride] += v;
  }
};

// The CPU backward is deterministic and free of atomics because each input-gradient plane (n, c)
// is written by one task, in pixel order, whatever the number of threads:
// - with at least as many batch elements as threads, one fused pass in parallel over n: a task
//   computes a pixel's parameter gradients and adds into its own grad_input[n], sampling once;
// - otherwise two passes: the parameter gradients in parallel over pixels, then the input
//   gradient in parallel over (n, c) planes, in blocks of channels where there are enough (every
//   sample of output plane (n, c) lands in input plane (n, c) alone), which keeps the cores busy
//   for N = 1 at the cost of sampling again.
// Both add to a plane in the same order, so they give bitwise the same result.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> deform_sepconv_backward_cpu(
    const at::Tensor& grad_output, const at::Tensor& input, const std::optional<at::Tensor>& vertical,
    const std::optional<at::Tensor>& horizontal, const std::optional<at::Tensor>& offset,
    const std::optional<at::Tensor>& mask, int64_t kernel_h, int64_t kernel_w, int64_t pad_h, int64_t pad_w,
    int64_t dilation_h, int64_t dilation_w, int64_t padding_mode, std::array<bool, 5> output_mask) {
  const DeformSepconvConfig cfg{kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode};
  const DeformSepconvTensors t = prepare_deform_sepconv(input, vertical, horizontal, offset, mask, cfg, &grad_output);
  auto grads = allocate_deform_sepconv_grads(t, output_mask);
  const int64_t hw = t.height_out * t.width_out;
  if (input.size(0) == 0 || hw == 0) return {grads[0], grads[1], grads[2], grads[3], grads[4]};

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "deform_sepconv_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    EDSC_DISPATCH_INDEX_TYPE(t.use_32bit_indexing, [&] {
      EDSC_DISPATCH_LAYOUT(t.channels_last, [&] {
      EDSC_DISPATCH_KERNEL_SIZE(kernel_h, kernel_w, [&] {
        const auto p = make_params<scalar_t, index_t>(t, cfg);
        const scalar_t* go = t.grad_output.const_data_ptr<scalar_t>();
        const auto param_grads = make_param_grads<scalar_t>(grads);
        // Half types accumulate the input gradient in a float plane, rounded once at the end.
        at::Tensor acc;
        if (grads[0].numel() > 0) {
          acc = std::is_same_v<acc_t, scalar_t> ? grads[0] : grads[0].to(c10::CppTypeToScalarType<acc_t>::value);
        }
        acc_t* gin = acc.defined() ? acc.mutable_data_ptr<acc_t>() : nullptr;
        const auto planes_of = [&](index_t n) {
          return PlaneAdd<acc_t, index_t>{gin + n * p.channels * p.height_in * p.width_in, p.width_in,
                                          input_channel_stride<kChannelsLast>(p), input_pixel_stride<kChannelsLast>(p)};
        };
        if (gin != nullptr && p.batch >= at::get_num_threads()) {
          at::parallel_for(0, p.batch, 1, [&](int64_t begin, int64_t end) {
            for (int64_t b = begin; b < end; ++b) {
              const index_t n = static_cast<index_t>(b);
              auto add = planes_of(n);
              for (index_t y = 0; y < p.height_out; ++y) {
                for (index_t x = 0; x < p.width_out; ++x) {
                  deform_sepconv_backward_pixel<kCpuChannelBlock, kKernelH, kKernelW, kMaxKernelWidth, kChannelsLast,
                                                scalar_t, acc_t, index_t>(p, go, param_grads, add, index_t(0),
                                                                          p.channels, n, y, x);
                }
              }
            }
          });
        } else {
          if (param_grads.any()) {
            NoInputGrad<acc_t> no_input_grad;
            at::parallel_for(0, p.batch * hw, kPixelGrain, [&](int64_t begin, int64_t end) {
              for (int64_t k = begin; k < end; ++k) {
                const index_t n = static_cast<index_t>(k / hw);
                const index_t y = static_cast<index_t>((k % hw) / t.width_out);
                const index_t x = static_cast<index_t>(k % t.width_out);
                deform_sepconv_backward_pixel<kCpuChannelBlock, kKernelH, kKernelW, kMaxKernelWidth, kChannelsLast,
                                              scalar_t, acc_t, index_t>(p, go, param_grads, no_input_grad,
                                                                        index_t(0), index_t(0), n, y, x);
              }
            });
          }
          // A task per (n, block of channels): blocks of kCpuChannelBlock sample once per block when
          // that still leaves a task per thread, single channels otherwise.
          const auto input_grad_pass = [&](auto channel_block) {
            constexpr int kBlock = decltype(channel_block)::value;
            const DeformSepconvParamGrads<scalar_t> none{nullptr, nullptr, nullptr, nullptr};
            const index_t blocks = (p.channels + kBlock - 1) / kBlock;
            at::parallel_for(0, p.batch * blocks, 1, [&](int64_t begin, int64_t end) {
              for (int64_t task = begin; task < end; ++task) {
                const index_t n = static_cast<index_t>(task / blocks);
                const index_t c0 = static_cast<index_t>(task % blocks) * kBlock;
                const index_t c1 = std::min<index_t>(c0 + kBlock, p.channels);
                auto add = planes_of(n);
                for (index_t y = 0; y < p.height_out; ++y) {
                  for (index_t x = 0; x < p.width_out; ++x) {
                    deform_sepconv_backward_pixel<kBlock, kKernelH, kKernelW, kMaxKernelWidth, kChannelsLast,
                                                  scalar_t, acc_t, index_t>(p, go, none, add, c0, c1, n, y, x);
                  }
                }
              }
            });
          };
          const int64_t channel_blocks = (p.channels + kCpuChannelBlock - 1) / kCpuChannelBlock;
          if (gin != nullptr && p.batch * channel_blocks >= at::get_num_threads()) {
            input_grad_pass(std::integral_constant<int, kCpuChannelBlock>{});
          } else if (gin != nullptr) {
            input_grad_pass(std::integral_constant<int, 1>{});
          }
        }
        if (acc.defined() && !acc.is_same(grads[0])) grads[0].copy_(acc);
      });
      });
    });
  });
  return {grads[0], grads[1], grads[2], grads[3], grads[4]};
}

}  // namespace

TORCH_LIBRARY_IMPL(edsc_ext, CPU, m) {
  m.impl("deform_sepconv_forward", &deform_sepconv_forward_cpu);
  m.impl("deform_sepconv_backward", &deform_sepconv_backward_cpu);
}

}  // namespace edsc_ext
