// CPU forward of deform_sepconv: at::parallel_for over output pixels, per-pixel work from
// include/edsc_ext/deform_sepconv_pixel.h.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
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

  EDSC_DISPATCH_CPU_CALL("deform_sepconv_forward_cpu", t, kernel_h, kernel_w, [&] {
    const auto p = make_params<scalar_t, index_t>(t, cfg);
    scalar_t* out = output.mutable_data_ptr<scalar_t>();
    for_each_output_pixel<index_t>(use_avx2(), p.batch, t.height_out, t.width_out,
                                   [&](index_t n, index_t y, index_t x) EDSC_CPU_INLINE {
      for (index_t c0 = 0; c0 < p.channels; c0 += kCpuChannelBlock) {
        deform_sepconv_forward_pixel<kCpuChannelBlock, kKernelH, kKernelW, kChannelsLast, scalar_t, acc_t, index_t>(
            p, out, n, y, x, c0);
      }
    });
  });
  return output;
}

}  // namespace

TORCH_LIBRARY_IMPL(edsc_ext, CPU, m) { m.impl("deform_sepconv_forward", &deform_sepconv_forward_cpu); }

}  // namespace edsc_ext
