// The CUDA planners: which kernels a deform_sepconv call runs, forward and backward, and their
// launch parameters, chosen in one place from the call's facts (src/deform_sepconv_call.h: CallFacts),
// the device's (CudaDeviceFacts) and the kernel policy. Plain C++ with no CUDA dependency, compiled
// into every build, so a plan can be made for a described device on a machine without a GPU
// (edsc_ext._plan). The launch code (deform_sepconv_forward_cuda.cu, deform_sepconv_backward_cuda.cu,
// deform_sepconv_backward_launch.cuh) switches over the plan; every limit that decides a plan is
// named here, and the kernels take their tile sizes from here.
#pragma once

#include <cstdint>
#include <string>

#include "deform_sepconv_call.h"  // CallFacts, VariantScope; edsc_ext/spec.h's kSpecializedKernel
#include "kernel_policy.h"
#include "launch.cuh"
#include "sampling.h"  // EDSC_HOST_DEVICE

namespace edsc_ext {

struct CudaDeviceFacts {
  int64_t major = 0, minor = 0;               // compute capability
  int64_t shared_memory_per_block_optin = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
};

// ---- Limits

// edsc_ext/spec.h's kSpecializedKernel (EDSC's 5x5) is the kernel size of the staged and lane-pair
// forwards, the warp-staged backward, the L2 prefetch and the exact-RGB variants.
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
// int32 words an element of the fixed-point tile holds for a frame of element_size bytes: two for float32
// (a quantum finer than float32 atomics lose), one for the half types, whose gradients end in 8 to 11
// significand bits (FixedPointTileAdd).
EDSC_HOST_DEVICE constexpr int fixed_point_tile_words(int64_t element_size) { return element_size == 2 ? 1 : 2; }
// Bytes a tile element takes: a float64 (FloatTileAdd), or the fixed point's words.
EDSC_HOST_DEVICE constexpr int64_t tile_element_bytes(int64_t element_size) {
  return element_size == 8 ? 8 : 4 * fixed_point_tile_words(element_size);
}
// At most (tile pixels x taps) adds reach one element of one channel; the fixed point's low word
// needs that <= 2^16 (FixedPointTileAdd).
constexpr int64_t kFixedPointMaxTaps = (int64_t(1) << 16) / kTileThreads;
// The lane tile (deform_sepconv_backward_lane_tile_cuda_kernel): a block of kTileThreads threads takes
// kTileH rows of kWarpSize >> lanes_log2 pixels, 2^lanes_log2 channel lanes a pixel; its fixed-point
// footprint (margin kTileMargin) takes at most kLaneTileSharedBytes of dynamic shared memory (opted in:
// two blocks a multiprocessor on sm_80 / sm_90), the channels in passes of whole kPixelVectorBlock blocks.
constexpr int64_t kLaneTileSharedBytes = 96 * 1024;
// Its static shared memory: the bound's per-warp sums.
constexpr int64_t kLaneTileStaticBytes = 4 * (kTileThreads / kWarpSize);
// The most channel lanes a pixel the lane tile takes: with 8 lanes its tiles are 4 pixels wide and their
// halo costs more than the global atomics it saves (BENCHMARKS.md, lane tile); more blocks of channels
// than lanes go round the lanes, at most kLaneTileMaxBlocksPerLane a lane (beyond: the channel lanes).
constexpr int kLaneTileMaxLanesLog2 = 2;
constexpr int64_t kLaneTileMaxBlocksPerLane = 2;

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

// ---- Kernel variants: how a plan names the instantiation it runs
//
// Each CUDA kernel family lists its variants in one table: a row has a unique name (the plan's), the
// template arguments of one instantiation as named fields, and the calls it is compiled for (scope,
// a VariantScope). The planner picks the row (a plan's variant; find_variant checks that its scope
// admits the call), the launcher instantiates each row for the call types its scope admits and runs
// the planned one (dispatch_axis::Variant), and plan_name names it: nothing else maps a plan to an
// instantiation. What a call fixes rather than a plan (its dtypes, index width, layout, 5x5 or not,
// up to 4 channels, a mask or none) the dispatch's other axes set.

// Every row and scope spells every field: nvcc's C++17 mode (torch < 2.13 headers) fills a field
// left out before a named one with zero instead of its default member initializer, and a table
// read differently by nvcc (the launchers) and the host compiler (the planner) would run another
// kernel than the plan names.

// The calls a family's rows are compiled for.
inline constexpr VariantScope kAnyScope{.kernel_5x5 = false,
                                        .index_32bit = false,
                                        .layout = VariantLayout::kAny,
                                        .max_element_size = 8,
                                        .same_dtypes = false};
// Blocks of 3 channels: the compile-time 5x5.
inline constexpr VariantScope k5x5Scope{.kernel_5x5 = true,
                                        .index_32bit = false,
                                        .layout = VariantLayout::kAny,
                                        .max_element_size = 8,
                                        .same_dtypes = false};
// The RGB and prefetch variants: 5x5 with 32-bit indices (the prefetch: NCHW).
inline constexpr VariantScope kSpecialized5x5Scope{.kernel_5x5 = true,
                                                   .index_32bit = true,
                                                   .layout = VariantLayout::kAny,
                                                   .max_element_size = 8,
                                                   .same_dtypes = false};
inline constexpr VariantScope kSpecialized5x5NchwScope{.kernel_5x5 = true,
                                                       .index_32bit = true,
                                                       .layout = VariantLayout::kNchw,
                                                       .max_element_size = 8,
                                                       .same_dtypes = false};
// The exact-RGB backward with the padding mode compiled in: NCHW, 5x5, 32-bit indices, a fixed-point tile
// (float32 and the half types).
inline constexpr VariantScope kSpecialized5x5NchwFloatScope{.kernel_5x5 = true,
                                                            .index_32bit = true,
                                                            .layout = VariantLayout::kNchw,
                                                            .max_element_size = 4,
                                                            .same_dtypes = false};
// The exact-RGB forward on a packed copy of the frame: NCHW, 5x5, 32-bit indices, the frame and the
// per-pixel tensors of one half type.
inline constexpr VariantScope kSpecialized5x5NchwHalfScope{.kernel_5x5 = true,
                                                           .index_32bit = true,
                                                           .layout = VariantLayout::kNchw,
                                                           .max_element_size = 2,
                                                           .same_dtypes = true};
// Vector loads of a pixel's channels, and the channel lanes: channels_last, 32-bit indices, float32
// and the half types.
inline constexpr VariantScope kChannelsLastVectorScope{.kernel_5x5 = false,
                                                       .index_32bit = true,
                                                       .layout = VariantLayout::kChannelsLast,
                                                       .max_element_size = 4,
                                                       .same_dtypes = false};
// The grid-tap kernels (grid_tap_window.cuh): float32 and the half types, per-pixel tensors in the
// frame's dtype, 64-bit indices.
inline constexpr VariantScope kGridTapsScope{.kernel_5x5 = false,
                                             .index_32bit = false,
                                             .layout = VariantLayout::kAny,
                                             .max_element_size = 4,
                                             .same_dtypes = true};
// The staged forward: NCHW 5x5, the 2-byte types, 32-bit indices; it copies (dy, dx) pairs of one
// offset tensor in the frame's dtype.
inline constexpr VariantScope kStagedScope{.kernel_5x5 = true,
                                           .index_32bit = true,
                                           .layout = VariantLayout::kNchw,
                                           .max_element_size = kStagedElementSize,
                                           .same_dtypes = true};
// The lane-pair forward and the warp-staged backward tile: channels_last 5x5, 32-bit indices, up to
// 4-byte elements in one dtype (the warp-staged buffers hold the frame's dtype, and their
// fixed-point tile needs a float accumulator).
inline constexpr VariantScope kChannelsLast5x5Scope{.kernel_5x5 = true,
                                                    .index_32bit = true,
                                                    .layout = VariantLayout::kChannelsLast,
                                                    .max_element_size = 4,
                                                    .same_dtypes = true};
// The backward tile: 32-bit indices.
inline constexpr VariantScope kTiledScope{.kernel_5x5 = false,
                                          .index_32bit = true,
                                          .layout = VariantLayout::kAny,
                                          .max_element_size = 8,
                                          .same_dtypes = false};

// Forward, kGridTaps (deform_sepconv_forward_grid_taps_cuda.cu): the channels staged together in
// each tile's input window.
struct GridTapsForwardVariant {
  const char* name;
  int pass_channels;
  VariantScope scope;
};
inline constexpr GridTapsForwardVariant kGridTapsForwardVariants[] = {
    {.name = "grid_taps_pass4", .pass_channels = 4, .scope = kGridTapsScope},
    {.name = "grid_taps_pass3", .pass_channels = 3, .scope = kGridTapsScope},
    {.name = "grid_taps_pass2", .pass_channels = 2, .scope = kGridTapsScope},
    {.name = "grid_taps_pass1", .pass_channels = 1, .scope = kGridTapsScope},
};

// Forward, kStaged (deform_sepconv_forward_staged_cuda.cu).
struct StagedForwardVariant {
  const char* name;
  int chunk_bytes;  // bytes a cp.async copy moves (the per-pixel tensors' alignment allows it)
  VariantScope scope;
};
inline constexpr StagedForwardVariant kStagedForwardVariants[] = {
    {.name = "staged_chunk16", .chunk_bytes = 16, .scope = kStagedScope},
    {.name = "staged_chunk4", .chunk_bytes = 4, .scope = kStagedScope},
};

// Forward, kLanePairs (deform_sepconv_forward_lane_pairs_cuda.cu): up to 4 channels.
struct LanePairsForwardVariant {
  const char* name;
  bool exact_rgb;      // exactly 3 channels, a compile-time constant
  bool staged_values;  // each warp's per-pixel values through shared memory (16-byte aligned copies)
  VariantScope scope;
};
inline constexpr LanePairsForwardVariant kLanePairsForwardVariants[] = {
    {.name = "lane_pairs", .exact_rgb = false, .staged_values = false, .scope = kChannelsLast5x5Scope},
    {.name = "lane_pairs_staged", .exact_rgb = false, .staged_values = true, .scope = kChannelsLast5x5Scope},
    {.name = "lane_pairs_rgb", .exact_rgb = true, .staged_values = false, .scope = kChannelsLast5x5Scope},
    {.name = "lane_pairs_rgb_staged", .exact_rgb = true, .staged_values = true, .scope = kChannelsLast5x5Scope},
};

// Forward, kPixels: one thread per (pixel, channel block) (deform_sepconv_forward_pixels_cuda.cu).
struct PixelsForwardVariant {
  const char* name;
  int channel_block;  // channels a thread; 3: exactly RGB, the channel count a compile-time constant
  bool prefetch;      // each warp prefetches its per-pixel values into L2 first (dense NCHW planes)
  bool vector_loads;  // a bilinear corner's block of channels in vector loads of <= 16 bytes
  // One kernel per padding mode, the mode's traits compiled in (exact blocks only:
  // deform_sepconv_forward_pixel_static_padding); else the traits read at run time.
  bool static_padding;
  // Exact RGB in a half type: the launcher first packs the frame's three planes into one (N, H, W, 4)
  // copy, and each bilinear corner reads its three channels with one 8-byte load (PackedRgbFrame).
  bool packed_frame;
  VariantScope scope;
};
inline constexpr PixelsForwardVariant kPixelsForwardVariants[] = {
    {.name = "pixels",
     .channel_block = kPixelChannelBlock,
     .prefetch = false,
     .vector_loads = false,
     .static_padding = false,
     .packed_frame = false,
     .scope = kAnyScope},
    {.name = "pixels_rgb",
     .channel_block = 3,
     .prefetch = false,
     .vector_loads = false,
     .static_padding = true,
     .packed_frame = false,
     .scope = kSpecialized5x5Scope},
    {.name = "pixels_rgb_prefetch",
     .channel_block = 3,
     .prefetch = true,
     .vector_loads = false,
     .static_padding = true,
     .packed_frame = false,
     .scope = kSpecialized5x5NchwScope},
    {.name = "pixels_prefetch",
     .channel_block = kPixelChannelBlock,
     .prefetch = true,
     .vector_loads = false,
     .static_padding = false,
     .packed_frame = false,
     .scope = kSpecialized5x5NchwScope},
    {.name = "pixels_vectorized",
     .channel_block = kPixelChannelBlock,
     .prefetch = false,
     .vector_loads = true,
     .static_padding = false,
     .packed_frame = false,
     .scope = kChannelsLastVectorScope},
    {.name = "pixels_vectorized8",
     .channel_block = kPixelVectorBlock,
     .prefetch = false,
     .vector_loads = true,
     .static_padding = false,
     .packed_frame = false,
     .scope = kChannelsLastVectorScope},
    {.name = "pixels_rgb_packed",
     .channel_block = 3,
     .prefetch = false,
     .vector_loads = false,
     .static_padding = true,
     .packed_frame = true,
     .scope = kSpecialized5x5NchwHalfScope},
    {.name = "pixels_rgb_packed_prefetch",
     .channel_block = 3,
     .prefetch = true,
     .vector_loads = false,
     .static_padding = true,
     .packed_frame = true,
     .scope = kSpecialized5x5NchwHalfScope},
};

enum class CudaBackwardKernel {
  kNone,    // the grid-tap kernels left nothing (or nothing was asked for)
  kTiled,   // one fused pass over tiles, the input gradient through the shared-memory footprint
  kPixels,  // one thread per output pixel, the input gradient (if any) through global atomics
  // channels_last, many channels: 2^lanes_log2 adjacent threads a pixel, each with blocks of
  // kPixelVectorBlock channels (vector loads), the input gradient through global (vector) atomics
  kChannelLanes,
  // the channel lanes with the input gradient through a fixed-point tile in shared memory, flushed once
  // per tile and pass (policy.lane_tile)
  kLaneTile,
};

// Backward, the bilinear kernels kTiled (deform_sepconv_backward_tiled_cuda_kernel) and kPixels
// (deform_sepconv_backward_cuda_kernel).
struct BackwardVariant {
  const char* name;
  CudaBackwardKernel kernel;
  int channel_block;  // channels a thread handles per step (3 for RGB-like counts with 5x5: no idle lane)
  bool warp_staged;   // kTiled, channels_last 5x5: per-pixel values staged a warp at a time
  bool exact_rgb;     // kTiled: exactly 3 channels in one pass, a compile-time constant
  // kTiled, exact RGB in NCHW, a fixed-point tile: one kernel per padding mode, each pixel through
  // deform_sepconv_backward_rgb_pixel (the mode's traits compiled in, the channels summed first, one tile
  // address a tap; policy.lean_rgb_backward)
  bool static_padding;
  VariantScope scope;
};
inline constexpr BackwardVariant kBackwardVariants[] = {
    {.name = "pixels",
     .kernel = CudaBackwardKernel::kPixels,
     .channel_block = 4,
     .warp_staged = false,
     .exact_rgb = false,
     .static_padding = false,
     .scope = kAnyScope},
    {.name = "pixels_blocks3",
     .kernel = CudaBackwardKernel::kPixels,
     .channel_block = 3,
     .warp_staged = false,
     .exact_rgb = false,
     .static_padding = false,
     .scope = k5x5Scope},
    {.name = "tiled",
     .kernel = CudaBackwardKernel::kTiled,
     .channel_block = 4,
     .warp_staged = false,
     .exact_rgb = false,
     .static_padding = false,
     .scope = kTiledScope},
    {.name = "tiled_blocks3",
     .kernel = CudaBackwardKernel::kTiled,
     .channel_block = 3,
     .warp_staged = false,
     .exact_rgb = false,
     .static_padding = false,
     .scope = kSpecialized5x5Scope},
    {.name = "tiled_rgb",
     .kernel = CudaBackwardKernel::kTiled,
     .channel_block = 3,
     .warp_staged = false,
     .exact_rgb = true,
     .static_padding = false,
     .scope = kSpecialized5x5NchwScope},
    {.name = "tiled_warp_staged",
     .kernel = CudaBackwardKernel::kTiled,
     .channel_block = 4,
     .warp_staged = true,
     .exact_rgb = false,
     .static_padding = false,
     .scope = kChannelsLast5x5Scope},
    {.name = "tiled_warp_staged_blocks3",
     .kernel = CudaBackwardKernel::kTiled,
     .channel_block = 3,
     .warp_staged = true,
     .exact_rgb = false,
     .static_padding = false,
     .scope = kChannelsLast5x5Scope},
    {.name = "tiled_warp_staged_rgb",
     .kernel = CudaBackwardKernel::kTiled,
     .channel_block = 3,
     .warp_staged = true,
     .exact_rgb = true,
     .static_padding = false,
     .scope = kChannelsLast5x5Scope},
    {.name = "tiled_rgb_lean",
     .kernel = CudaBackwardKernel::kTiled,
     .channel_block = 3,
     .warp_staged = false,
     .exact_rgb = true,
     .static_padding = true,
     .scope = kSpecialized5x5NchwFloatScope},
};

// Backward, kChannelLanes (deform_sepconv_backward_bilinear_kernels.cuh): float32 and the half types
// (mixed precision too).
struct ChannelLanesVariant {
  const char* name;
  int channel_block;  // channels a lane takes per step, read with vector loads
  VariantScope scope;
};
inline constexpr ChannelLanesVariant kChannelLanesVariants[] = {
    {.name = "channel_lanes", .channel_block = kPixelVectorBlock, .scope = kChannelsLastVectorScope},
};

// Backward, kLaneTile (deform_sepconv_backward_bilinear_kernels.cuh): the channel lanes' calls, the
// input gradient through the fixed-point tile (so float32 and the half types, deterministic or not).
struct LaneTileVariant {
  const char* name;
  int channel_block;  // channels a lane takes per step, read with vector loads
  VariantScope scope;
};
inline constexpr LaneTileVariant kLaneTileVariants[] = {
    {.name = "lane_tile", .channel_block = kPixelVectorBlock, .scope = kChannelsLastVectorScope},
};

// Backward, the grid-tap kernels: the per-pixel tensors' gradients from each tile's window
// (deform_sepconv_backward_grid_taps_cuda.cu) and the gathered input gradient
// (deform_sepconv_grid_taps_input_grad_cuda.cu). Their channel count (up to 4) and mask are the
// call's, set by the dispatch.
struct GridTapsBackwardVariant {
  const char* name;
  VariantScope scope;
};
inline constexpr GridTapsBackwardVariant kGridTapsParamsVariants[] = {
    {.name = "grid_taps_params", .scope = kGridTapsScope},
};
inline constexpr GridTapsBackwardVariant kGatherInputGradVariants[] = {
    {.name = "gather_input_grad", .scope = kGridTapsScope},
};

static_assert(names_are_unique(kGridTapsForwardVariants) && names_are_unique(kStagedForwardVariants) &&
                  names_are_unique(kLanePairsForwardVariants) && names_are_unique(kPixelsForwardVariants) &&
                  names_are_unique(kBackwardVariants) && names_are_unique(kChannelLanesVariants) &&
                  names_are_unique(kLaneTileVariants),
              "a plan names its variant row: each row's name is its own");

// ---- Plans

enum class CudaForwardKernel {
  kEmpty,      // no output elements: nothing runs
  kGridTaps,   // no offsets or dilation: each tile's input window in shared memory
  kStaged,     // NCHW 5x5, 2-byte types, <= 4 channels but not 3: per-pixel tensors staged by block
  kLanePairs,  // channels_last 5x5, <= 4 channels: two lanes a pixel
  kPixels,     // one thread per (output pixel, block of channels)
};

struct CudaForwardPlan {
  CudaForwardKernel kernel = CudaForwardKernel::kEmpty;
  int variant = 0;      // the row of the kernel's table (kGridTapsForwardVariants, ...)
  GridWindow window{};  // kGridTaps
};

// The most threads the channel lanes give one pixel (a warp: they sum through shuffles).
constexpr int kMaxChannelLanes = kWarpSize;

struct CudaBackwardPlan {
  bool empty = false;  // no output pixels or no channels: the gradients as allocated
  // channels_last with > kSmallChannels channels that the channel lanes do not take: run on NCHW copies
  bool nchw_copies = false;
  bool gather_input_grad = false;  // the input gradient gathered (grid taps, no mask)
  int gather_variant = 0;          // ... its row of kGatherInputGradVariants
  VirtualDomain gather_domain{};
  GatherLayout gather_layout{};
  int64_t gather_shared_bytes = 0;
  bool grid_tap_param_grads = false;  // the per-pixel gradients from the grid-tap window
  int grid_tap_params_variant = 0;    // ... its row of kGridTapsParamsVariants
  GridWindow window{};
  int64_t grid_tap_shared_bytes = 0;
  CudaBackwardKernel kernel = CudaBackwardKernel::kNone;  // the bilinear kernel for the rest
  bool kernel_input_grad = false;                         // ... adds the input gradient
  bool kernel_param_grads = false;                        // ... computes the per-pixel gradients
  bool deterministic = false;                             // ... adds the input gradient as fixed-point integers
  // kTiled, kPixels: the row of kBackwardVariants; kChannelLanes: of kChannelLanesVariants; kLaneTile:
  // of kLaneTileVariants
  int variant = 0;
  TileFootprint footprint{};      // kTiled, kLaneTile
  int64_t tile_shared_bytes = 0;  // kTiled, kLaneTile: dynamic shared memory
  bool prefetch = false;          // kTiled, NCHW 5x5: the L2 prefetch (a kernel argument)
  int lanes_log2 = 0;             // kChannelLanes, kLaneTile: log2 of the threads a pixel
};

CudaForwardPlan plan_cuda_forward(const CallFacts& call, const CudaDeviceFacts& device, const KernelPolicy& policy);
CudaBackwardPlan plan_cuda_backward(const CallFacts& call, const CudaDeviceFacts& device, const KernelPolicy& policy);

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
