// CPU backward of deform_sepconv: parallel over (image, band of output rows), per-pixel work from
// include/edsc_ext/deform_sepconv_pixel.h.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cstdlib>
#include <string>

#include "edsc_ext/ops.h"
#include "cpu_loops.h"

namespace edsc_ext {
namespace {

template <typename acc_t>
struct NoInputGrad {
  template <typename index_t>
  EDSC_CPU_INLINE void operator()(index_t, index_t, index_t, acc_t) const {}
};

// Adds into one batch element's input gradient (or a band's scratch copy of it), owned by one task.
template <typename acc_t, typename index_t>
struct PlaneAdd {
  acc_t* grad;  // grad_input[n]
  index_t width, channel_stride, pixel_stride;
  EDSC_CPU_INLINE void operator()(index_t c, index_t y, index_t x, acc_t v) const {
    grad[c * channel_stride + (y * width + x) * pixel_stride] += v;
  }
};

// The CPU backward is deterministic, free of atomics, and its result does not depend on the number
// of threads, to the last bit: every plane it adds into is owned by one task and filled in pixel
// order, and how the work is split depends on the shape alone (cpu_backward_bands).
// - Usually one fused pass (each sample computed once for the parameter gradients and the input
//   gradient) over tasks of (n, band of output rows): kCpuTasks tasks in all when N < kCpuTasks,
//   one band per image otherwise. Band 0 of image n adds straight into grad_input[n], later bands
//   into scratch planes, summed into it afterwards in band order.
// - When those scratch planes would exceed the scratch budget and no more bands than channels fit,
//   two passes instead: the parameter gradients in parallel over pixels, then the input gradient
//   in parallel over (n, channel) planes (every sample of output plane (n, c) lands in input plane
//   (n, c) alone), which samples again but needs no scratch.
constexpr int64_t kCpuTasks = 16;
// The default scratch budget: N = 1 at 1080p with 3 channels gets 11 bands, 10 scratch planes of
// 25 MB. EDSC_EXT_CPU_SCRATCH_MB overrides it (0 forces the two-pass backward; for tests).
constexpr int64_t kCpuScratchBytes = int64_t(256) << 20;

int64_t cpu_scratch_budget() {
  const char* value = std::getenv("EDSC_EXT_CPU_SCRATCH_MB");
  return value != nullptr ? std::max<int64_t>(0, std::atoll(value)) << 20 : kCpuScratchBytes;
}

// Bands of output rows per image for the fused backward, or 0 for the two-pass one.
int64_t cpu_backward_bands(int64_t batch, int64_t channels, int64_t height_out, int64_t image_bytes) {
  const int64_t wanted = std::min(batch >= kCpuTasks ? 1 : (kCpuTasks + batch - 1) / batch,
                                  std::max<int64_t>(height_out, 1));
  const int64_t fit = std::min(wanted, 1 + cpu_scratch_budget() / std::max<int64_t>(1, batch * image_bytes));
  return (fit == wanted || fit > channels) ? fit : 0;
}

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

  EDSC_DISPATCH_CPU_CALL("deform_sepconv_backward_cpu", t, kernel_h, kernel_w, [&] {
    const auto p = make_params<scalar_t, index_t>(t, cfg);
    const scalar_t* go = t.grad_output.const_data_ptr<scalar_t>();
    const auto param_grads = make_param_grads<scalar_t>(grads);
    // Half types accumulate the input gradient in a float plane, rounded once at the end.
    at::Tensor acc;
    if (grads[0].numel() > 0) {
      acc = std::is_same_v<acc_t, scalar_t> ? grads[0] : grads[0].to(c10::CppTypeToScalarType<acc_t>::value);
    }
    acc_t* gin = acc.defined() ? acc.mutable_data_ptr<acc_t>() : nullptr;
    const bool avx2 = use_avx2();
    // The parameter gradients alone: no adds to share, so parallel over pixels.
    const auto parameter_grad_pass = [&] {
      NoInputGrad<acc_t> no_input_grad;
      for_each_output_pixel<index_t>(avx2, p.batch, t.height_out, t.width_out,
                                     [&](index_t n, index_t y, index_t x) EDSC_CPU_INLINE {
        deform_sepconv_backward_pixel<kCpuChannelBlock, kKernelH, kKernelW, kMaxKernelWidth, kChannelsLast, scalar_t,
                                      acc_t, index_t>(p, go, param_grads, no_input_grad, index_t(0), index_t(0), n,
                                                      y, x);
      });
    };
    if (gin == nullptr) {
      parameter_grad_pass();
    } else {
      const int64_t image = p.channels * p.height_in * p.width_in;  // one grad_input[n], any layout
      const int64_t bands =
          cpu_backward_bands(p.batch, p.channels, t.height_out, image * static_cast<int64_t>(sizeof(acc_t)));
      const auto add_into = [&](acc_t* image_grad) {
        return PlaneAdd<acc_t, index_t>{image_grad, p.width_in, input_channel_stride<kChannelsLast>(p),
                                        input_pixel_stride<kChannelsLast>(p)};
      };
      if (bands > 0) {
        at::Tensor scratch;
        if (bands > 1) scratch = at::zeros({p.batch * (bands - 1) * image}, acc.options());
        acc_t* extra = scratch.defined() ? scratch.mutable_data_ptr<acc_t>() : nullptr;
        at::parallel_for(0, p.batch * bands, 1, [&](int64_t begin, int64_t end) {
          run_for_cpu(avx2, [&]() EDSC_CPU_INLINE {
            for (int64_t task = begin; task < end; ++task) {
              const index_t n = static_cast<index_t>(task / bands);
              const int64_t band = task % bands;
              const auto add =
                  add_into(band == 0 ? gin + n * image : extra + (n * (bands - 1) + band - 1) * image);
              const index_t y_begin = static_cast<index_t>(band * t.height_out / bands);
              const index_t y_end = static_cast<index_t>((band + 1) * t.height_out / bands);
              for (index_t y = y_begin; y < y_end; ++y) {
                for (index_t x = 0; x < p.width_out; ++x) {
                  deform_sepconv_backward_pixel<kCpuChannelBlock, kKernelH, kKernelW, kMaxKernelWidth,
                                                kChannelsLast, scalar_t, acc_t, index_t>(
                      p, go, param_grads, add, index_t(0), p.channels, n, y, x);
                }
              }
            }
          });
        });
        if (extra != nullptr) {
          // grad_input[n] += band 1 + band 2 + ..., in that order for every element.
          at::parallel_for(0, p.batch * image, kPixelGrain * 16, [&](int64_t begin, int64_t end) {
            for (int64_t k = begin; k < end; ++k) {
              const int64_t n = k / image, e = k % image;
              acc_t v = gin[k];
              for (int64_t b = 0; b < bands - 1; ++b) v += extra[(n * (bands - 1) + b) * image + e];
              gin[k] = v;
            }
          });
        }
      } else {
        if (param_grads.any()) parameter_grad_pass();
        // A task per (n, block of channels): blocks of kCpuChannelBlock (one sample for the
        // block) where that still makes a task per thread, single channels otherwise. A
        // channel's adds are the same either way, so the thread count changes no bit.
        const auto input_grad_pass = [&](auto channel_block) {
          constexpr int kBlock = decltype(channel_block)::value;
          const DeformSepconvParamGrads<scalar_t> none{nullptr, nullptr, nullptr, nullptr};
          const index_t blocks = (p.channels + kBlock - 1) / kBlock;
          at::parallel_for(0, p.batch * blocks, 1, [&](int64_t begin, int64_t end) {
            run_for_cpu(avx2, [&]() EDSC_CPU_INLINE {
              for (int64_t task = begin; task < end; ++task) {
                const index_t n = static_cast<index_t>(task / blocks);
                const index_t c0 = static_cast<index_t>(task % blocks) * kBlock;
                const index_t c1 = std::min<index_t>(c0 + kBlock, p.channels);
                const auto add = add_into(gin + n * image);
                for (index_t y = 0; y < p.height_out; ++y) {
                  for (index_t x = 0; x < p.width_out; ++x) {
                    deform_sepconv_backward_pixel<kBlock, kKernelH, kKernelW, kMaxKernelWidth, kChannelsLast,
                                                  scalar_t, acc_t, index_t>(p, go, none, add, c0, c1, n, y, x);
                  }
                }
              }
            });
          });
        };
        if (p.batch * ((p.channels + kCpuChannelBlock - 1) / kCpuChannelBlock) >= at::get_num_threads()) {
          input_grad_pass(std::integral_constant<int, kCpuChannelBlock>{});
        } else {
          input_grad_pass(std::integral_constant<int, 1>{});
        }
      }
    }
    if (acc.defined() && !acc.is_same(grads[0])) grads[0].copy_(acc);
  });
  return {grads[0], grads[1], grads[2], grads[3], grads[4]};
}

}  // namespace

TORCH_LIBRARY_IMPL(edsc_ext, CPU, m) { m.impl("deform_sepconv_backward", &deform_sepconv_backward_cpu); }

}  // namespace edsc_ext
