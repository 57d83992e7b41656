// Input gradient of the grid-tap calls (grid_tap_window.cuh: no offsets, no dilation) without a
// mask, gathered instead of scattered. Tap (i, j) of output pixel o reads the input at
// u = o - pad + (i, j) (a "virtual" coordinate: border mode then clamps it into the image), so
// the gradient at u is
//   G_c(u) = sum_{i,j} dL/dout_c(o) V_i(o) H_j(o),  o = u + pad - (i, j) inside the output,
// and the input gradient is G in zeros mode (u inside the image), or G folded onto the image
// border in border mode (each clamped u adds to the edge pixel it clamps to). Each thread owns one
// u of a kGridTileHeight x kGridTileWidth tile and walks the kGridTileHeight + KH - 1 rows of
// output pixels that reach the tile; for each, the block stages H of the row's pixels, arranged
// so that a thread's KW taps are contiguous (16-byte loads), and dL/dout_c(o) V_i(o) for each tile
// row's i. No atomics, one write per element, so it is deterministic too. The bilinear backward
// scattered this with global float atomics, most of sepconv's forward+backward time (BENCHMARKS.md).

#include <vector>

#include "deform_sepconv_grid_taps_input_grad_kernel.cuh"
#include "shared_memory_opt_in.cuh"

namespace edsc_ext {

void launch_gather_input_grad(const DeformSepconvCall& call, const CudaBackwardPlan& plan, const Tensor& grad_input) {
  const CallFacts& f = call.facts;
  EDSC_CHECK(f.channels <= kSmallChannels && !f.has_mask, "gathered input gradient: not planned for this call");
  const GatherLayout layout = plan.gather_layout;
  const VirtualDomain domain = plan.gather_domain;
  const int64_t shared = plan.gather_shared_bytes;
  const int64_t tile_rows = (domain.height + kGridTileHeight - 1) / kGridTileHeight;
  const dim3 grid(static_cast<unsigned int>((domain.width + kGridTileWidth - 1) / kGridTileWidth),
                  static_cast<unsigned int>(tile_rows), static_cast<unsigned int>(f.batch));
  const auto stream = current_cuda_stream(call.input.get_device_index());
  dispatch_kernel_types<KernelTypes<>, dispatch_axis::UpTo4ByteTypes, dispatch_axis::FixedIndex<int64_t>,
                        dispatch_axis::Layout, dispatch_axis::SmallChannels,
                        dispatch_axis::Variant<kGatherInputGradVariants>>(
      {f, plan.gather_variant}, "deform_sepconv_grid_taps_input_grad", [&](auto k) {
        using K = decltype(k);
        using scalar_t = typename K::scalar_t;
        using acc_t = typename K::acc_t;
        Tensor virt = empty_in(call.input, {f.batch, f.channels, domain.height, domain.width}, MemoryFormat::Contiguous,
                               scalar_type_of<acc_t>());
        const auto kernel = deform_sepconv_input_grad_grid_taps_cuda_kernel<K::kChannels, K::kChannelsLast, scalar_t>;
        opt_in_dynamic_shared(kernel, static_cast<size_t>(shared));
        kernel<<<grid, kGridTileThreads, static_cast<size_t>(shared), stream>>>(
            make_params<scalar_t, int64_t>(call), call.grad_output->const_data_ptr<scalar_t>(),
            virt.mutable_data_ptr<acc_t>(), domain, layout);
        EDSC_CUDA_KERNEL_LAUNCH_CHECK();
        // A clamping mode folds the virtual coordinates outside the image onto its border.
        if (f.padding.clamps) {
          virt = fold_clamped(fold_clamped(virt, 2, -domain.y0, f.height_in), 3, -domain.x0, f.width_in);
        }
        Tensor destination = grad_input;
        torch::stable::copy_(destination, virt);
      });
}

}  // namespace edsc_ext
