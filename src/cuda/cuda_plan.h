// The CUDA planners: which kernels a deform_sepconv call runs, forward and backward, and their
// launch parameters, chosen in one place from the call's facts (include/edsc_ext/deform_sepconv_call.h),
// the device's (CudaDeviceFacts) and the kernel policy. Plain C++ with no CUDA dependency, compiled
// into every build, so a plan can be made for a described device on a machine without a GPU
// (edsc_ext._plan). The launch code (deform_sepconv_forward_cuda.cu, deform_sepconv_backward_cuda.cu,
// deform_sepconv_backward_launch.cuh) switches over the plan; every limit that decides a plan is
// named here, and the kernels take their tile sizes from here.
#pragma once

#include <cstdint>
#include <string>

#include "deform_sepconv_call.h"
#include "kernel_policy.h"
#include "sampling.h"  // EDSC_HOST_DEVICE
#include "launch.cuh"

namespace edsc_ext {

struct CudaDeviceFacts {
  int64_t major = 0, minor = 0;               // compute capability
  int64_t shared_memory_per_block_optin = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
};

// ---- Limits

// The kernel size the specialised kernels are compiled for (EDSC's 5x5): the staged and lane-pair
// forwards, the warp-staged backward, the L2 prefetch and the exact-RGB variants.
constexpr int kSpecializedKernel = 5;
// The channel counts (greyscale to RGBA) of the kernels that keep all channels of a pixel at once:
// the staged and lane-pair forwards, the prefetch, the grid-tap gradients, and the channels_last
// backward's tile in place (above it the backward takes the channel lanes, or runs on NCHW copies:
// deform_sepconv_backward_cuda.cu).
constexpr int64_t kSmallChannels = 4;
// Channels a thread of the one-thread-per-(pixel, channel block) forward takes; with vector loads
// (channels_last) kPixelVectorBlock where the channel count allows, so that each tap's position and
// weights, computed once a thread, serve twice the channels (the many-channel forward was bound by
// those instructions, BENCHMARKS.md).
constexpr int kPixelChannelBlock = 4;
constexpr int kPixelVectorBlock = 8;
// Dynamic shared memory a block gets without opting in.
constexpr int64_t kDefaultSharedBytes = 48 * 1024;
// Grid dimensions y and z (the grid-tap kernels' tile rows and images), and x.
constexpr int64_t kMaxGridDimYZ = 65535;
constexpr int64_t kMaxGridDimX = (int64_t(1) << 31) - 1;

// Grid-tap kernels (grid_tap_window.cuh): tiles of output pixels, a warp a row (conflict-free loads).
constexpr int kGridTileWidth = kWarpSize;
constexpr int kGridTileHeight = 8;
constexpr int kGridTileThreads = kGridTileWidth * kGridTileHeight;
// The most shared memory a grid-tap forward block's windows take (two blocks a multiprocessor on sm_80/sm_90).
constexpr int64_t kGridWindowBudgetBytes = 100 * 1024;

// Staged forward (deform_sepconv_forward_staged_cuda.cu): only the 2-byte types gain from it (float32's
// staged values leave too few warps a multiprocessor), and cp.async needs sm_80.
constexpr int kStagedPixels = 128;
constexpr int64_t kStagedElementSize = 2;
constexpr int64_t kStagedMinMajor = 8;

// Backward tile (deform_sepconv_backward_bilinear_kernels.cuh): a warp spans 32 consecutive x, so per-pixel
// loads and stores stay coalesced; offsets up to kTileMargin pixels beyond the kernel's reach still
// land in the shared-memory footprint of kTileSharedBytes (the default per-block limit, no opt-in).
constexpr int kTileW = 32;
constexpr int kTileH = 8;
constexpr int kTileThreads = kTileW * kTileH;
constexpr int kTileMargin = 3;
constexpr int64_t kTileSharedBytes = 48 * 1024;
// Both tile accumulators take 8 bytes an element: a float64, or the fixed point's two int32 words.
constexpr int64_t kTileElementBytes = 8;
// At most (tile pixels x taps) adds reach one element of one channel; the fixed point's low word
// needs that <= 2^16 (FixedPointTileAdd).
constexpr int64_t kFixedPointMaxTaps = (int64_t(1) << 16) / kTileThreads;

// Static shared memory of the warp-staged backward tile (WarpStagedBuffers<scalar_t, 5> per warp
// and the bound's per-warp sums; deform_sepconv_backward_bilinear_kernels.cuh checks it against the kernel).
constexpr int64_t warp_staged_static_bytes(int64_t element_size) {
  const int64_t k = kSpecializedKernel, row = int64_t(kWarpSize) * k;
  const int64_t per_warp = 2 * row * element_size + 2 * row * 2 * element_size + 2 * row * element_size + 4 * kWarpSize;
  return kTileH * per_warp + 4 * (kTileThreads / kWarpSize);
}

// ---- Launch geometry shared by the planner and the kernels

// The input window of one channel in the grid-tap kernels: kGridTileHeight + KH - 1 rows,
// kGridTileWidth + KW - 1 columns.
struct GridWindow {
  int rows = 0, cols = 0;
  EDSC_HOST_DEVICE int size() const { return rows * cols; }
};

// Footprint of a backward tile's input-gradient contributions, in input coordinates relative to the tile.
struct TileFootprint {
  int64_t rows = 0, cols = 0, channels_per_pass = 0;
};

// The gathered input gradient (deform_sepconv_grid_taps_input_grad_cuda.cu): the virtual
// coordinates it is computed for, rows [y0, y0 + height), columns [x0, x0 + width), which cover the
// image and, in border mode, every tap coordinate.
struct VirtualDomain {
  int64_t y0 = 0, x0 = 0, height = 0, width = 0;
};

// Its shared-memory layout of one row of output pixels: H as [thread column][tap] with a row
// stride that is a multiple of 4 (16-byte loads) and 4 mod 8 words (the 8 lanes of a quarter warp
// then hit distinct banks), and the products as [channel][tile row][k], where a thread's tap j
// reads k = 31 - tx + j (contiguous in j).
struct GatherLayout {
  int taps_padded = 0;  // KW rounded up to a multiple of 4
  int h_stride = 0;     // words from one thread column's taps to the next
  int a_row = 0;        // kGridTileWidth - 1 + taps_padded: products of a tile row
  EDSC_HOST_DEVICE int shared_words(int channels) const {
    return kGridTileWidth * h_stride + channels * kGridTileHeight * a_row;
  }
};

// ---- Plans

// ---- Kernel variants: how a plan names the instantiation it runs
//
// The bilinear kernels (one thread per pixel, forward and backward; the backward tile) are compiled in
// variants: channels a thread, exactly RGB, the L2 prefetch, vector loads, warp staging. Each family
// lists its variants in one table: a row holds the template arguments of one instantiation and the
// calls it is compiled for (VariantScope). The planner picks the row (a plan's `variant`), the
// launcher instantiates each row for the call types its scope admits and runs the planned one, and
// plan_name names it: nothing else maps a plan to an instantiation.

// What decides which variants exist for a call: made at compile time from a launcher's KernelTypes
// (variant_facts<K>() in deform_sepconv_cuda.cuh) and at run time from the call (variant_facts(call)).
struct VariantFacts {
  bool kernel_5x5 = false;   // a compile-time 5x5 kernel (kSpecializedKernel)
  bool index_32bit = false;  // 32-bit indices
  bool channels_last = false;
  int64_t element_size = 0;  // the frame's dtype
  bool same_dtypes = true;   // the per-pixel tensors in the frame's dtype (not mixed precision)
};

enum class VariantLayout { kAny, kNchw, kChannelsLast };

// The calls a variant is compiled for.
struct VariantScope {
  bool kernel_5x5 = false;   // only with the compile-time 5x5
  bool index_32bit = false;  // only with 32-bit indices
  VariantLayout layout = VariantLayout::kAny;
  int64_t max_element_size = 8;
  bool same_dtypes = false;  // not with mixed precision

  constexpr bool admits(const VariantFacts& f) const {
    return (!kernel_5x5 || f.kernel_5x5) && (!index_32bit || f.index_32bit) &&
           (layout == VariantLayout::kAny || (layout == VariantLayout::kChannelsLast) == f.channels_last) &&
           f.element_size <= max_element_size && (!same_dtypes || f.same_dtypes);
  }
};

inline VariantFacts variant_facts(const DeformSepconvCall& c) {
  return {c.square_kernel(kSpecializedKernel), c.use_32bit_indexing, c.channels_last, c.element_size,
          !c.mixed_precision()};
}

// The one-thread-per-(pixel, channel block) forward (deform_sepconv_forward_cuda_kernel).
struct PixelsForwardVariant {
  const char* name;
  int channel_block;  // channels a thread; 3: exactly RGB, the channel count a compile-time constant
  bool prefetch;      // each warp prefetches its per-pixel values into L2 first (dense NCHW planes)
  bool vector_loads;  // a bilinear corner's block of channels in vector loads of <= 16 bytes
  VariantScope scope;
};

// The RGB and prefetch variants: 5x5 with 32-bit indices; vector loads: channels_last, 32-bit
// indices, float32 and the half types.
inline constexpr VariantScope kSpecialized5x5Scope{true, true, VariantLayout::kAny, 8, false};
inline constexpr VariantScope kSpecialized5x5NchwScope{true, true, VariantLayout::kNchw, 8, false};
inline constexpr VariantScope kVectorLoadsScope{false, true, VariantLayout::kChannelsLast, 4, false};
inline constexpr PixelsForwardVariant kPixelsForwardVariants[] = {
    {"pixels", kPixelChannelBlock, false, false, VariantScope{}},
    {"pixels_rgb", 3, false, false, kSpecialized5x5Scope},
    {"pixels_rgb_prefetch", 3, true, false, kSpecialized5x5NchwScope},
    {"pixels_prefetch", kPixelChannelBlock, true, false, kSpecialized5x5NchwScope},
    {"pixels_vectorized", kPixelChannelBlock, false, true, kVectorLoadsScope},
    {"pixels_vectorized8", kPixelVectorBlock, false, true, kVectorLoadsScope},
};

enum class CudaForwardKernel {
  kEmpty,      // no output elements: nothing runs
  kGridTaps,   // no offsets or dilation: each tile's input window in shared memory
  kStaged,     // NCHW 5x5, 2-byte types, <= 4 channels but not 3: per-pixel tensors staged by block
  kLanePairs,  // channels_last 5x5, <= 4 channels: two lanes a pixel
  kPixels,     // one thread per (output pixel, block of channels): a row of kPixelsForwardVariants
};

struct CudaForwardPlan {
  CudaForwardKernel kernel = CudaForwardKernel::kEmpty;
  int pass_channels = 0;       // kGridTaps: channels staged together (4, 3, 2 or 1)
  GridWindow window{};         // kGridTaps
  int chunk_bytes = 0;         // kStaged: bytes a cp.async copy moves (16 or 4)
  bool staged_values = false;  // kLanePairs: each warp's per-pixel values through shared memory
  bool exact_rgb = false;      // kLanePairs: exactly 3 channels, a compile-time constant
  int variant = 0;             // kPixels: the row of kPixelsForwardVariants
};

enum class CudaBackwardKernel {
  kNone,    // the grid-tap kernels left nothing (or nothing was asked for)
  kTiled,   // one fused pass over tiles, the input gradient through the shared-memory footprint
  kPixels,  // one thread per output pixel, the input gradient (if any) through global atomics
  // channels_last, many channels: 2^lanes_log2 adjacent threads a pixel, each with blocks of
  // kPixelVectorBlock channels (vector loads), the input gradient through global (vector) atomics
  kChannelLanes,
};

// The most threads the channel lanes give one pixel (a warp: they sum through shuffles).
constexpr int kMaxChannelLanes = kWarpSize;

// The bilinear backward kernels, kTiled (deform_sepconv_backward_tiled_cuda_kernel) and kPixels
// (deform_sepconv_backward_cuda_kernel).
struct BackwardVariant {
  const char* name;
  CudaBackwardKernel kernel;
  int channel_block;  // channels a thread handles per step (3 for RGB-like counts with 5x5: no idle lane)
  bool warp_staged;   // kTiled, channels_last 5x5: per-pixel values staged a warp at a time
  bool exact_rgb;     // kTiled: exactly 3 channels in one pass, a compile-time constant
  VariantScope scope;
};

// The tile needs 32-bit indices; blocks of 3 the 5x5; the warp-staged buffers hold the frame's dtype,
// and their fixed-point tile needs a float accumulator.
inline constexpr VariantScope kTiledScope{false, true, VariantLayout::kAny, 8, false};
inline constexpr VariantScope kWarpStagedScope{true, true, VariantLayout::kChannelsLast, 4, true};
inline constexpr BackwardVariant kBackwardVariants[] = {
    {"pixels", CudaBackwardKernel::kPixels, 4, false, false, VariantScope{}},
    {"pixels", CudaBackwardKernel::kPixels, 3, false, false, VariantScope{true, false, VariantLayout::kAny, 8, false}},
    {"tiled", CudaBackwardKernel::kTiled, 4, false, false, kTiledScope},
    {"tiled", CudaBackwardKernel::kTiled, 3, false, false, kSpecialized5x5Scope},
    {"tiled_rgb", CudaBackwardKernel::kTiled, 3, false, true, kSpecialized5x5NchwScope},
    {"tiled_warp_staged", CudaBackwardKernel::kTiled, 4, true, false, kWarpStagedScope},
    {"tiled_warp_staged", CudaBackwardKernel::kTiled, 3, true, false, kWarpStagedScope},
    {"tiled_warp_staged_rgb", CudaBackwardKernel::kTiled, 3, true, true, kWarpStagedScope},
};

struct CudaBackwardPlan {
  bool empty = false;  // no output pixels or no channels: the gradients as allocated
  // channels_last with > kSmallChannels channels that the channel lanes do not take: run on NCHW copies
  bool nchw_copies = false;
  bool gather_input_grad = false;  // the input gradient gathered (grid taps, no mask)
  VirtualDomain gather_domain{};
  GatherLayout gather_layout{};
  int64_t gather_shared_bytes = 0;
  bool grid_tap_param_grads = false;  // the per-pixel gradients from the grid-tap window
  GridWindow window{};
  int64_t grid_tap_shared_bytes = 0;
  CudaBackwardKernel kernel = CudaBackwardKernel::kNone;  // the bilinear kernel for the rest
  bool kernel_input_grad = false;                         // ... adds the input gradient
  bool kernel_param_grads = false;                        // ... computes the per-pixel gradients
  bool deterministic = false;                             // ... adds the input gradient as fixed-point integers
  int variant = 0;                                        // kTiled, kPixels: the row of kBackwardVariants
  TileFootprint footprint{};                              // kTiled
  int64_t tile_shared_bytes = 0;                          // kTiled: dynamic shared memory
  bool prefetch = false;                                  // kTiled, NCHW 5x5: the L2 prefetch (a kernel argument)
  int lanes_log2 = 0;                                     // kChannelLanes: log2 of the threads a pixel
};

CudaForwardPlan plan_cuda_forward(const DeformSepconvCall& call, const CudaDeviceFacts& device,
                                  const KernelPolicy& policy);
CudaBackwardPlan plan_cuda_backward(const DeformSepconvCall& call, const CudaDeviceFacts& device,
                                    const KernelPolicy& policy);

// Whether a channels_last backward with this many channels can take the channel lanes at all under
// this policy (the planner's first test): where it cannot, the host copies to NCHW before
// preparing the call, so that no channels_last copy of a per-pixel tensor is made first.
inline bool backward_may_take_channel_lanes(int64_t channels, const KernelPolicy& policy) {
  return policy.channel_lanes && channels % kPixelVectorBlock == 0;
}

// Names for edsc_ext._plan and the tests, e.g. "lane_pairs_rgb_staged", "tiled_warp_staged_rgb".
std::string plan_name(const CudaForwardPlan& plan);
std::string plan_name(const CudaBackwardPlan& plan);

}  // namespace edsc_ext
