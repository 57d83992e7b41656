// CPU kernel of vector_add, the smallest end-to-end example of the build and of dispatch.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

namespace edsc_ext {
namespace {

at::Tensor vector_add_cpu(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK_VALUE(a.sizes() == b.sizes(), "b has shape ", b.sizes(), " but a has shape ", a.sizes());
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "b has dtype ", b.scalar_type(), " but a has dtype ",
                   a.scalar_type());
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  at::Tensor out = at::empty(a.sizes(), a.options().memory_format(at::MemoryFormat::Contiguous));
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "vector_add_cpu", [&] {
    const scalar_t* pa = ac.const_data_ptr<scalar_t>();
    const scalar_t* pb = bc.const_data_ptr<scalar_t>();
    scalar_t* po = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, out.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) po[k] = pa[k] + pb[k];
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(edsc_ext, CPU, m) { m.impl("vector_add", &vector_add_cpu); }

}  // namespace edsc_ext
