// CPU kernel of vector_add, the smallest end-to-end example of the build and of dispatch.
#include "backends.h"

namespace edsc_ext {

void check_vector_add(const Tensor& a, const Tensor& b) {
  EDSC_CHECK(a.device() == b.device(), "b is on ", DeviceOf{b}, " but a is on ", DeviceOf{a});
  EDSC_CHECK(a.dim() == b.dim() && std::equal(a.sizes().begin(), a.sizes().end(), b.sizes().begin()), "b has shape ",
             ShapeOf{b}, " but a has shape ", ShapeOf{a});
  EDSC_CHECK(a.scalar_type() == b.scalar_type(), "b has dtype ", b.scalar_type(), " but a has dtype ", a.scalar_type());
}

Tensor vector_add_cpu(const Tensor& a, const Tensor& b) {
  check_vector_add(a, b);
  const Tensor ac = contiguous_in(a), bc = contiguous_in(b);
  Tensor out = empty_in(a, a.sizes(), MemoryFormat::Contiguous);
  CallFacts facts;  // of the dispatch, the dtype only
  facts.frame_dtype = facts.param_dtype = a.scalar_type();
  dispatch_kernel_types<KernelTypes<>, dispatch_axis::AllTypes>(facts, "vector_add_cpu", [&](auto k) {
    using scalar_t = typename decltype(k)::scalar_t;
    const scalar_t* pa = ac.const_data_ptr<scalar_t>();
    const scalar_t* pb = bc.const_data_ptr<scalar_t>();
    scalar_t* po = out.mutable_data_ptr<scalar_t>();
    torch::stable::parallel_for(0, out.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) po[k] = pa[k] + pb[k];
    });
  });
  return out;
}

}  // namespace edsc_ext
