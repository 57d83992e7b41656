// CUDA backend of deform_sepconv. Every entry point takes a device guard from the input and
// launches on that device's current stream, so a tensor on cuda:1 works whatever the current
// device is. Per-pixel work comes from include/edsc_ext/deform_sepconv_pixel.h.
//
// Forward: one thread per (n, block of channels, output pixel), x fastest, so the per-pixel
// tensors (85 values a pixel at K=5, the bulk of the bytes) stream through coalesced, read once.
// Backward: one fused pass over 2-D tiles of output pixels. The input gradient, hundreds of adds
// per pixel, is accumulated with shared-memory atomics over the tile's footprint (tile + kernel
// reach + a margin for offsets) and flushed to global memory once; samples that land outside the
// footprint fall back to global atomics, so any offset stays correct.
#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdlib>
#include <string>

#include "edsc_ext/ops.h"
#include "launch.cuh"

namespace edsc_ext {
namespace {

// Output channels a forward thread accumulates in registers; more channels become more threads.
constexpr int kCudaChannelBlock = 4;
// Backward tile: a warp spans 32 consecutive x, so per-pixel loads and stores stay coalesced.
constexpr int kTileW = 32;
constexpr int kTileH = 8;
constexpr int kTileThreads = kTileW * kTileH;
// Offsets up to this many pixels beyond the kernel's reach still land in shared memory.
constexpr int kTileMargin = 3;
// Shared memory for the input-gradient footprint (the default per-block limit, no opt-in).
constexpr int64_t kTileSharedBytes = 48 * 1024;

// kMinBlocks > 1 caps registers so that more warps hide the gathers' latency (an experiment
// selected by EDSC_EXT_FORWARD_MIN_BLOCKS=3 until the benchmark says which wins).
template <int kKernelH, int kKernelW, int kMinBlocks, typename scalar_t, typename index_t>
__global__ void __launch_bounds__(kThreadsPerBlock, kMinBlocks)
    deform_sepconv_forward_cuda_kernel(const DeformSepconvParams<scalar_t, index_t> p, scalar_t* __restrict__ output,
                                       int64_t work_items) {
  using acc_t = at::opmath_type<scalar_t>;
  const index_t hw = p.height_out * p.width_out;
  const index_t channel_blocks = (p.channels + kCudaChannelBlock - 1) / kCudaChannelBlock;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < work_items;
       k += int64_t(blockDim.x) * gridDim.x) {
    const index_t item = static_cast<index_t>(k);  // (n, channel block, y, x), x fastest
    const index_t pixel = item % hw;
    const index_t rest = item / hw;
    const index_t c0 = (rest % channel_blocks) * kCudaChannelBlock;
    const index_t n = rest / channel_blocks;
    deform_sepconv_forward_pixel<kCudaChannelBlock, kKernelH, kKernelW, scalar_t, acc_t, index_t>(
        p, output, n, pixel / p.width_out, pixel % p.width_out, c0);
  }
}

// Global-memory atomics into grad_input[n] (float32 for the half types, rounded once at the end).
template <typename acc_t, typename index_t>
struct GlobalAtomicAdd {
  acc_t* grad;  // grad_input (or grad_input[n] after at_batch), nullptr for no input gradient
  index_t channels, height, width;
  __host__ __device__ GlobalAtomicAdd at_batch(index_t n) const {
    return {grad ? grad + n * channels * height * width : nullptr, channels, height, width};
  }
  __host__ __device__ void operator()(index_t c, index_t y, index_t x, acc_t v) const {
#ifdef __CUDA_ARCH__
    atomicAdd(grad + (c * height + y) * width + x, v);
#endif
  }
};

// Deterministic input gradient (torch.use_deterministic_algorithms): every contribution is rounded
// to a 64-bit fixed-point integer before an integer atomic add, and integer addition does not
// depend on order, so the sum is bitwise reproducible. `scale` (on the device, so nothing
// synchronises and CUDA graphs can capture it) is 2^62 over a bound on any element's total, so
// no sum overflows; a contribution that is not finite or exceeds the bound sets `poisoned`, and
// the result is then NaN rather than silently wrong.
template <typename acc_t, typename index_t>
struct FixedPointAtomicAdd {
  unsigned long long* grad;
  const double* scale;
  int* poisoned;
  index_t channels, height, width;
  __host__ __device__ FixedPointAtomicAdd at_batch(index_t n) const {
    return {grad + n * channels * height * width, scale, poisoned, channels, height, width};
  }
  __host__ __device__ void operator()(index_t c, index_t y, index_t x, acc_t v) const {
#ifdef __CUDA_ARCH__
    const double scaled = static_cast<double>(v) * *scale;
    if (!(fabs(scaled) <= 4.6e18)) {  // also false for NaN
      atomicOr(poisoned, 1);
      return;
    }
    atomicAdd(grad + (c * height + y) * width + x,
              static_cast<unsigned long long>(static_cast<long long>(llrint(scaled))));
#endif
  }
};

// Shared-memory atomics into the tile's footprint [row0, row0 + rows) x [col0, col0 + cols) for
// channels [c0, c0 + channels); anything outside goes to global memory.
template <typename acc_t, typename index_t>
struct TileAtomicAdd {
  acc_t* tile;
  index_t row0, col0, rows, cols, c0;
  GlobalAtomicAdd<acc_t, index_t> fallback;
  __host__ __device__ void operator()(index_t c, index_t y, index_t x, acc_t v) const {
#ifdef __CUDA_ARCH__
    const index_t r = y - row0, q = x - col0;
    if (r >= 0 && r < rows && q >= 0 && q < cols) {
      atomicAdd(tile + ((c - c0) * rows + r) * cols + q, v);
    } else {
      fallback(c, y, x, v);
    }
#endif
  }
};

// Backward with one thread per output pixel: the parameter gradients only, or with the input
// gradient through global atomics (InputGrad: GlobalAtomicAdd, or FixedPointAtomicAdd when
// deterministic).
template <int kKernelH, int kKernelW, int kMaxWidth, typename scalar_t, typename index_t, typename InputGrad>
__global__ void __launch_bounds__(kThreadsPerBlock)
    deform_sepconv_backward_cuda_kernel(const DeformSepconvParams<scalar_t, index_t> p,
                                        const scalar_t* __restrict__ grad_output,
                                        const DeformSepconvParamGrads<scalar_t> param_grads,
                                        const InputGrad input_grad, bool with_input_grad, int64_t work_items) {
  using acc_t = at::opmath_type<scalar_t>;
  const index_t hw = p.height_out * p.width_out;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < work_items;
       k += int64_t(blockDim.x) * gridDim.x) {
    const index_t item = static_cast<index_t>(k);
    const index_t pixel = item % hw;
    const index_t n = item / hw;
    InputGrad add = input_grad.at_batch(n);
    deform_sepconv_backward_pixel<kKernelH, kKernelW, kMaxWidth, scalar_t, acc_t, index_t>(
        p, grad_output, param_grads, add, index_t(0), with_input_grad ? p.channels : index_t(0), n,
        pixel / p.width_out, pixel % p.width_out);
  }
}

// Footprint of a tile's input-gradient contributions, in input coordinates relative to the tile.
struct TileFootprint {
  int64_t rows, cols, channels_per_pass;
};

TileFootprint tile_footprint(const DeformSepconvConfig& cfg, int64_t channels, size_t acc_size) {
  TileFootprint f;
  f.rows = kTileH + cfg.dilation_h * (cfg.kernel_h - 1) + 1 + 2 * kTileMargin;
  f.cols = kTileW + cfg.dilation_w * (cfg.kernel_w - 1) + 1 + 2 * kTileMargin;
  const int64_t per_channel = f.rows * f.cols * static_cast<int64_t>(acc_size);
  f.channels_per_pass = std::min<int64_t>(channels, kTileSharedBytes / per_channel);
  return f;
}

template <int kKernelH, int kKernelW, int kMaxWidth, typename scalar_t, typename index_t>
__global__ void __launch_bounds__(kTileThreads, 2)
    deform_sepconv_backward_tiled_cuda_kernel(const DeformSepconvParams<scalar_t, index_t> p,
                                              const scalar_t* __restrict__ grad_output,
                                              const DeformSepconvParamGrads<scalar_t> param_grads,
                                              at::opmath_type<scalar_t>* __restrict__ grad_input, index_t rows,
                                              index_t cols, index_t channels_per_pass) {
  using acc_t = at::opmath_type<scalar_t>;
  extern __shared__ unsigned char shared_raw[];
  acc_t* tile = reinterpret_cast<acc_t*>(shared_raw);

  const index_t tiles_x = (p.width_out + kTileW - 1) / kTileW;
  const index_t tiles_y = (p.height_out + kTileH - 1) / kTileH;
  const index_t tile_x = static_cast<index_t>(blockIdx.x % tiles_x);
  const index_t tile_y = static_cast<index_t>((blockIdx.x / tiles_x) % tiles_y);
  const index_t n = static_cast<index_t>(blockIdx.x / (int64_t(tiles_x) * tiles_y));
  const index_t y = tile_y * kTileH + static_cast<index_t>(threadIdx.y);
  const index_t x = tile_x * kTileW + static_cast<index_t>(threadIdx.x);
  const bool active = y < p.height_out && x < p.width_out;
  const int tid = threadIdx.y * kTileW + threadIdx.x;

  const index_t row0 = tile_y * kTileH - p.pad_h - kTileMargin;
  const index_t col0 = tile_x * kTileW - p.pad_w - kTileMargin;
  const index_t plane = p.height_in * p.width_in;
  acc_t* grad_n = grad_input + n * p.channels * plane;

  for (index_t c0 = 0; c0 < p.channels; c0 += channels_per_pass) {
    const index_t pass_channels = min(channels_per_pass, p.channels - c0);
    const index_t tile_elems = pass_channels * rows * cols;
    for (index_t e = tid; e < tile_elems; e += kTileThreads) tile[e] = acc_t(0);
    __syncthreads();
    if (active) {
      TileAtomicAdd<acc_t, index_t> add{tile, row0, col0, rows, cols, c0, {grad_n, p.channels, p.height_in, p.width_in}};
      // The parameter gradients need all channels once: on the first pass only.
      const DeformSepconvParamGrads<scalar_t> pass_grads =
          c0 == 0 ? param_grads : DeformSepconvParamGrads<scalar_t>{nullptr, nullptr, nullptr, nullptr};
      deform_sepconv_backward_pixel<kKernelH, kKernelW, kMaxWidth, scalar_t, acc_t, index_t>(
          p, grad_output, pass_grads, add, c0, c0 + pass_channels, n, y, x);
    }
    __syncthreads();
    // Flush: one global atomic per touched footprint element (neighbouring tiles overlap).
    for (index_t e = tid; e < tile_elems; e += kTileThreads) {
      const acc_t v = tile[e];
      if (v != acc_t(0)) {
        const index_t q = e % cols;
        const index_t r = (e / cols) % rows;
        const index_t c = e / (cols * rows);
        atomicAdd(grad_n + ((c0 + c) * p.height_in + row0 + r) * p.width_in + col0 + q, v);
      }
    }
    __syncthreads();
  }
}

// EDSC_EXT_INPUT_GRAD=global skips the shared-memory tile and adds every input-gradient sample
// with a global atomic: for benchmarks and for testing that path, which otherwise only runs for
// footprints too large for shared memory or tensors needing 64-bit indices.
bool force_global_atomics() {
  const char* value = std::getenv("EDSC_EXT_INPUT_GRAD");
  return value != nullptr && std::string(value) == "global";
}

// Workspace of the deterministic input gradient (see FixedPointAtomicAdd).
struct FixedPointInputGrad {
  at::Tensor sums;      // int64, the input's shape
  at::Tensor scale;     // float64 scalar: 2^62 / bound
  at::Tensor bound;     // float64 scalar
  at::Tensor poisoned;  // int32 flag
};

// Bound on the magnitude of any input-gradient element: every contribution is
// dL/dout * V_i * H_j * M_t * (bilinear weight <= 1), so summing max_c |dL/dout| * sum_i |V_i| *
// sum_j |H_j| * max_t |M_t| over all output pixels bounds every element's total. Device-side only.
FixedPointInputGrad prepare_fixed_point_input_grad(const DeformSepconvTensors& t, const DeformSepconvConfig& cfg) {
  const auto f64 = t.input.options().dtype(at::kDouble);
  at::Tensor per_pixel = t.grad_output.abs().amax(1).to(at::kDouble);
  per_pixel = per_pixel * (t.vertical.defined() ? t.vertical.abs().sum(1, false, at::kDouble)
                                                : at::scalar_tensor(double(cfg.kernel_h), f64));
  per_pixel = per_pixel * (t.horizontal.defined() ? t.horizontal.abs().sum(1, false, at::kDouble)
                                                  : at::scalar_tensor(double(cfg.kernel_w), f64));
  if (t.mask.defined()) per_pixel = per_pixel * t.mask.abs().amax(1).to(at::kDouble);
  FixedPointInputGrad w;
  w.bound = per_pixel.sum();
  w.scale = at::where(w.bound > 0, at::scalar_tensor(4.611686018427387904e18, f64) / w.bound,
                      at::scalar_tensor(1.0, f64));
  w.sums = at::zeros(t.input.sizes(), t.input.options().dtype(at::kLong));
  w.poisoned = at::zeros({1}, t.input.options().dtype(at::kInt));
  return w;
}

at::Tensor finish_fixed_point_input_grad(const FixedPointInputGrad& w) {
  const at::Tensor value = w.sums.to(at::kDouble) / w.scale;
  const at::Tensor bad = (w.poisoned > 0).logical_or(w.bound.isfinite().logical_not());
  return at::where(bad, at::scalar_tensor(std::numeric_limits<double>::quiet_NaN(), value.options()), value);
}

int forward_min_blocks() {
  const char* value = std::getenv("EDSC_EXT_FORWARD_MIN_BLOCKS");
  return value != nullptr ? std::atoi(value) : 1;
}

at::Tensor deform_sepconv_forward_cuda(const at::Tensor& input, const std::optional<at::Tensor>& vertical,
                                       const std::optional<at::Tensor>& horizontal,
                                       const std::optional<at::Tensor>& offset, const std::optional<at::Tensor>& mask,
                                       int64_t kernel_h, int64_t kernel_w, int64_t pad_h, int64_t pad_w,
                                       int64_t dilation_h, int64_t dilation_w, int64_t padding_mode) {
  const c10::cuda::CUDAGuard device_guard(input.device());
  const DeformSepconvConfig cfg{kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode};
  const DeformSepconvTensors t = prepare_deform_sepconv(input, vertical, horizontal, offset, mask, cfg);
  at::Tensor output = at::empty({input.size(0), input.size(1), t.height_out, t.width_out}, input.options());
  if (output.numel() == 0) return in_layout_of(input, output);
  const auto stream = c10::cuda::getCurrentCUDAStream(input.device().index());
  const int64_t work_items = input.size(0) * ((input.size(1) + kCudaChannelBlock - 1) / kCudaChannelBlock) *
                             t.height_out * t.width_out;

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "deform_sepconv_forward_cuda", [&] {
    EDSC_DISPATCH_INDEX_TYPE(t.use_32bit_indexing, [&] {
      EDSC_DISPATCH_KERNEL_SIZE(kernel_h, kernel_w, [&] {
        const auto p = make_params<scalar_t, index_t>(t, cfg);
        if (forward_min_blocks() == 3) {
          deform_sepconv_forward_cuda_kernel<kKernelH, kKernelW, 3, scalar_t, index_t>
              <<<blocks_for(work_items), kThreadsPerBlock, 0, stream>>>(p, output.mutable_data_ptr<scalar_t>(),
                                                                        work_items);
        } else {
          deform_sepconv_forward_cuda_kernel<kKernelH, kKernelW, 1, scalar_t, index_t>
              <<<blocks_for(work_items), kThreadsPerBlock, 0, stream>>>(p, output.mutable_data_ptr<scalar_t>(),
                                                                        work_items);
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  });
  return in_layout_of(input, output);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> deform_sepconv_backward_cuda(
    const at::Tensor& grad_output, const at::Tensor& input, const std::optional<at::Tensor>& vertical,
    const std::optional<at::Tensor>& horizontal, const std::optional<at::Tensor>& offset,
    const std::optional<at::Tensor>& mask, int64_t kernel_h, int64_t kernel_w, int64_t pad_h, int64_t pad_w,
    int64_t dilation_h, int64_t dilation_w, int64_t padding_mode, std::array<bool, 5> output_mask) {
  const c10::cuda::CUDAGuard device_guard(input.device());
  const DeformSepconvConfig cfg{kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode};
  const DeformSepconvTensors t = prepare_deform_sepconv(input, vertical, horizontal, offset, mask, cfg, &grad_output);
  auto grads = allocate_deform_sepconv_grads(t, output_mask);
  const int64_t pixels = input.size(0) * t.height_out * t.width_out;
  if (pixels == 0 || input.size(1) == 0) return {in_layout_of(input, grads[0]), grads[1], grads[2], grads[3], grads[4]};
  const auto stream = c10::cuda::getCurrentCUDAStream(input.device().index());

  const bool deterministic = grads[0].numel() > 0 && at::globalContext().deterministicAlgorithms();
  FixedPointInputGrad fixed_point;
  if (deterministic) fixed_point = prepare_fixed_point_input_grad(t, cfg);

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "deform_sepconv_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    at::Tensor grad_input_acc;
    if (grads[0].numel() > 0 && !deterministic) {
      grad_input_acc = std::is_same_v<acc_t, scalar_t>
                           ? grads[0]
                           : at::zeros(input.sizes(), input.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
    }
    acc_t* grad_input = grad_input_acc.defined() ? grad_input_acc.mutable_data_ptr<acc_t>() : nullptr;
    const auto param_grads = make_param_grads<scalar_t>(grads);
    const TileFootprint footprint = tile_footprint(cfg, input.size(1), sizeof(acc_t));
    const bool tiled = grad_input != nullptr && footprint.channels_per_pass >= 1 && !force_global_atomics();

    EDSC_DISPATCH_INDEX_TYPE(t.use_32bit_indexing, [&] {
      EDSC_DISPATCH_KERNEL_SIZE(kernel_h, kernel_w, [&] {
        const auto p = make_params<scalar_t, index_t>(t, cfg);
        const scalar_t* go = t.grad_output.const_data_ptr<scalar_t>();
        // Static kernel sizes hold their accumulators in registers; run-time ones in a local array.
        constexpr int kMaxWidth = kKernelW > 0 ? kKernelW : static_cast<int>(kMaxKernelWidth);
        const int64_t tiles = input.size(0) * ((t.height_out + kTileH - 1) / kTileH) *
                              ((t.width_out + kTileW - 1) / kTileW);
        if constexpr (std::is_same_v<index_t, int32_t>) {
          if (tiled && tiles <= std::numeric_limits<int32_t>::max()) {
            const size_t shared = footprint.channels_per_pass * footprint.rows * footprint.cols * sizeof(acc_t);
            deform_sepconv_backward_tiled_cuda_kernel<kKernelH, kKernelW, kMaxWidth, scalar_t, index_t>
                <<<static_cast<unsigned int>(tiles), dim3(kTileW, kTileH), shared, stream>>>(
                    p, go, param_grads, grad_input, static_cast<index_t>(footprint.rows),
                    static_cast<index_t>(footprint.cols), static_cast<index_t>(footprint.channels_per_pass));
            C10_CUDA_KERNEL_LAUNCH_CHECK();
            return;
          }
        }
        const index_t channels = static_cast<index_t>(input.size(1));
        const index_t height = static_cast<index_t>(input.size(2)), width = static_cast<index_t>(input.size(3));
        if (deterministic) {
          const FixedPointAtomicAdd<acc_t, index_t> add{
              reinterpret_cast<unsigned long long*>(fixed_point.sums.mutable_data_ptr<int64_t>()),
              fixed_point.scale.const_data_ptr<double>(), fixed_point.poisoned.mutable_data_ptr<int>(), channels,
              height, width};
          deform_sepconv_backward_cuda_kernel<kKernelH, kKernelW, kMaxWidth, scalar_t, index_t>
              <<<blocks_for(pixels), kThreadsPerBlock, 0, stream>>>(p, go, param_grads, add, true, pixels);
        } else {
          const GlobalAtomicAdd<acc_t, index_t> add{grad_input, channels, height, width};
          deform_sepconv_backward_cuda_kernel<kKernelH, kKernelW, kMaxWidth, scalar_t, index_t>
              <<<blocks_for(pixels), kThreadsPerBlock, 0, stream>>>(p, go, param_grads, add, grad_input != nullptr,
                                                                    pixels);
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
    if (grad_input_acc.defined() && !grad_input_acc.is_same(grads[0])) grads[0].copy_(grad_input_acc);
  });
  if (deterministic) grads[0].copy_(finish_fixed_point_input_grad(fixed_point));
  return {in_layout_of(input, grads[0]), grads[1], grads[2], grads[3], grads[4]};
}

}  // namespace

TORCH_LIBRARY_IMPL(edsc_ext, CUDA, m) {
  m.impl("deform_sepconv_forward", &deform_sepconv_forward_cuda);
  m.impl("deform_sepconv_backward", &deform_sepconv_backward_cuda);
}

}  // namespace edsc_ext
