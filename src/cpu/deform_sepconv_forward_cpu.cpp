// CPU forward of deform_sepconv: at::parallel_for over output pixels, per-pixel work from
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
        const bool avx2 = use_avx2();
        at::parallel_for(0, p.batch * hw, kPixelGrain, [&](int64_t begin, int64_t end) {
          run_for_cpu(avx2, [&]() EDSC_CPU_INLINE {
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
  });
  return output;
}

}  // namespace

TORCH_LIBRARY_IMPL(edsc_ext, CPU, m) { m.impl("deform_sepconv_forward", &deform_sepconv_forward_cpu); }

}  // namespace edsc_ext
