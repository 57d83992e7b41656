// The CUDA planners (cuda_plan.h), plain C++ compiled into every build. The conditions
// below are the kernels' requirements (what they were written and measured for); BENCHMARKS.md has
// the measurements behind the choices. Named *_cuda.cpp: the JIT build names objects by base name.
#include <algorithm>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>

#include "cuda_plan.h"

namespace edsc_ext {
namespace {

// The grid-tap window of a call that can take the grid-tap kernels (no offsets or dilation,
// float32 or a half type, one dtype, N and the tile rows within a grid dimension, one channel's
// window within shared memory), with one channel's bytes; false where it cannot.
bool grid_window(const CallFacts& c, const CudaDeviceFacts& device, const KernelPolicy& policy, GridWindow& window,
                 int64_t& channel_bytes) {
  if (!takes_grid_taps(c, policy) || c.element_size > 4 || c.mixed_precision()) return false;
  if (c.batch > kMaxGridDimYZ || (c.height_out + kGridTileHeight - 1) / kGridTileHeight > kMaxGridDimYZ) return false;
  const int64_t rows = kGridTileHeight + c.kernel_h - 1, cols = kGridTileWidth + c.kernel_w - 1;
  channel_bytes = rows * cols * static_cast<int64_t>(sizeof(float));  // acc_t of the <= 4-byte types
  if (channel_bytes > device.shared_memory_per_block_optin) return false;
  window = {static_cast<int>(rows), static_cast<int>(cols)};  // small: they fit shared memory
  return true;
}

GatherLayout gather_layout(int64_t kernel_w) {
  GatherLayout l;
  l.taps_padded = static_cast<int>((kernel_w + 3) / 4 * 4);
  l.h_stride = l.taps_padded % 8 == 4 ? l.taps_padded : l.taps_padded + 4;
  l.a_row = kGridTileWidth - 1 + l.taps_padded;
  return l;
}

// Tap coordinates span [-pad, out - 1 - pad + K - 1]; a mode that does not clamp needs only the image.
VirtualDomain gather_domain(const CallFacts& c) {
  VirtualDomain domain{0, 0, c.height_in, c.width_in};
  if (c.padding.clamps) {
    const int64_t y1 = std::max(c.height_in - 1, c.height_out - 1 - c.pad_h + c.kernel_h - 1);
    const int64_t x1 = std::max(c.width_in - 1, c.width_out - 1 - c.pad_w + c.kernel_w - 1);
    domain.y0 = std::min<int64_t>(0, -c.pad_h);
    domain.x0 = std::min<int64_t>(0, -c.pad_w);
    domain.height = y1 - domain.y0 + 1;
    domain.width = x1 - domain.x0 + 1;
  }
  return domain;
}

// Along one axis, the input span a tile of `tile` output pixels adds to: the kernel's reach, the
// bilinear corner's +1, and kTileMargin pixels of offsets on each side.
int64_t footprint_span(int64_t tile, int64_t dilation, int64_t kernel) {
  return tile + dilation * (kernel - 1) + 1 + 2 * kTileMargin;
}

// The lane tile's footprint: kTileH rows of kWarpSize >> lanes_log2 pixels, the channels in passes of
// whole kPixelVectorBlock blocks within `budget` bytes (channels_per_pass 0: not even one block fits).
TileFootprint lane_tile_footprint(const CallFacts& c, int lanes_log2, int64_t budget) {
  TileFootprint f;
  f.rows = footprint_span(kTileH, c.dilation_h, c.kernel_h);
  f.cols = footprint_span(kWarpSize >> lanes_log2, c.dilation_w, c.kernel_w);
  const int64_t blocks = budget / (f.rows * f.cols * tile_element_bytes(c.element_size) * kPixelVectorBlock);
  f.channels_per_pass = std::min<int64_t>(c.channels, blocks * kPixelVectorBlock);
  return f;
}

TileFootprint tile_footprint(const CallFacts& c) {
  TileFootprint f;
  f.rows = footprint_span(kTileH, c.dilation_h, c.kernel_h);
  f.cols = footprint_span(kTileW, c.dilation_w, c.kernel_w);
  f.channels_per_pass =
      std::min<int64_t>(c.channels, kTileSharedBytes / (f.rows * f.cols * tile_element_bytes(c.element_size)));
  return f;
}

// The row of `table` that `wanted` picks, which must be compiled for the call: a planner that asks
// for a variant the launcher does not instantiate for it is a bug, caught here (the planner tests
// sweep the calls) rather than by a launcher running another kernel than the plan names.
template <typename Variant, size_t kRows, typename Wanted>
int find_variant(const Variant (&table)[kRows], const CallFacts& c, const Wanted& wanted) {
  for (size_t row = 0; row < kRows; ++row) {
    if (wanted(table[row])) {
      if (!table[row].scope.admits(variant_facts(c))) {
        throw std::logic_error(std::string("edsc_ext CUDA planner: variant ") + table[row].name +
                               " is not compiled for this call");
      }
      return static_cast<int>(row);
    }
  }
  throw std::logic_error("edsc_ext CUDA planner: no variant matches the plan");
}

}  // namespace

CudaForwardPlan plan_cuda_forward(const CallFacts& c, const CudaDeviceFacts& device, const KernelPolicy& policy) {
  CudaForwardPlan plan;
  if (c.batch * c.channels * c.height_out * c.width_out == 0) return plan;
  GridWindow window;
  int64_t channel_bytes = 0;
  // Only the one-thread-per-pixel kernel follows the strides of per-pixel views (dense_per_pixel false).
  if (!policy.plain_forward && c.dense_per_pixel && grid_window(c, device, policy, window, channel_bytes)) {
    // The most channels of 4, 3, 2, 1 that divides the channel count and whose windows fit the budget.
    for (const int pass : {4, 3, 2, 1}) {
      if (c.channels % pass == 0 && pass * channel_bytes <= kGridWindowBudgetBytes) {
        plan.kernel = CudaForwardKernel::kGridTaps;
        plan.variant = find_variant(kGridTapsForwardVariants, c,
                                    [&](const GridTapsForwardVariant& v) { return v.pass_channels == pass; });
        plan.window = window;
        return plan;
      }
    }
  }
  const bool specialized = c.square_kernel(kSpecializedKernel) && c.use_32bit_indexing;
  // RGB takes the exact-RGB one-thread kernel instead, which beats it in these types too.
  // The staged and lane-pair forwards and the warp-staged backward copy (dy, dx) pairs of one
  // offset tensor in the frame's dtype: split offsets and mixed precision take the kernels that
  // read them through GlobalPixelValues, as do per-pixel views.
  const bool copies_pairs = !c.split_offsets && !c.mixed_precision() && c.dense_per_pixel;
  if (specialized && !policy.plain_forward && !c.channels_last && c.element_size == kStagedElementSize &&
      c.channels <= kSmallChannels && c.channels != 3 && device.major >= kStagedMinMajor && copies_pairs) {
    // cp.async needs aligned addresses, and a segment starts at (n * channels + k) * hw + p0 elements.
    const int64_t row_bytes = c.height_out * c.width_out * c.element_size;
    for (const int chunk : {16, 4}) {
      if (row_bytes % chunk == 0 && c.per_pixel_alignment >= chunk) {
        plan.kernel = CudaForwardKernel::kStaged;
        plan.variant = find_variant(kStagedForwardVariants, c,
                                    [&](const StagedForwardVariant& v) { return v.chunk_bytes == chunk; });
        return plan;
      }
    }
  }
  // Not float64: its staged values would not fit 48 KB, and it was not measured unstaged.
  if (specialized && !policy.plain_forward && c.channels_last && c.channels <= kSmallChannels && c.element_size <= 4 &&
      c.offset_pairs_aligned && copies_pairs) {
    plan.kernel = CudaForwardKernel::kLanePairs;
    const bool staged_values = c.per_pixel_alignment >= 16;  // the 16-byte copies' alignment
    plan.variant = find_variant(kLanePairsForwardVariants, c, [&](const LanePairsForwardVariant& v) {
      return v.exact_rgb == (c.channels == 3) && v.staged_values == staged_values;
    });
    return plan;
  }
  plan.kernel = CudaForwardKernel::kPixels;
  const bool exact_rgb = specialized && c.channels == 3;
  // With more channel blocks the warps of different blocks would prefetch the same lines.
  // The prefetch addresses dense planes. The exact-RGB kernel prefetches 2-byte per-pixel values only:
  // with 4-byte ones it was faster without (BENCHMARKS.md, "The forward with the padding mode compiled in").
  const bool prefetch = specialized && !c.channels_last && policy.prefetch && c.channels <= kPixelChannelBlock &&
                        c.dense_per_pixel && (!exact_rgb || c.param_element_size == 2);
  // In channels_last a pixel's channels are adjacent: whole blocks of them, aligned (every block
  // starts a multiple of kPixelChannelBlock elements into the frame), load as one vector of at most
  // 16 bytes; the many-channel forward was bound by the L1 load instructions (BENCHMARKS.md).
  const bool vector_loads = policy.vector_loads && c.channels_last && c.channels % kPixelChannelBlock == 0 &&
                            c.element_size <= 4 && c.use_32bit_indexing &&
                            c.input_alignment >= kPixelChannelBlock * c.element_size;
  // Blocks of 8 load in pieces of at most 16 bytes, each aligned to its size.
  const bool blocks_of_8 = vector_loads && c.channels % kPixelVectorBlock == 0 &&
                           c.input_alignment >= std::min<int64_t>(16, kPixelVectorBlock * c.element_size);
  const int channel_block = exact_rgb ? 3 : blocks_of_8 ? kPixelVectorBlock : kPixelChannelBlock;
  // Exact RGB in NCHW, frame and per-pixel tensors of one half type: the frame packed first, a corner one
  // 8-byte load (its three 2-byte loads bound the kernel: BENCHMARKS.md, "The packed RGB frame").
  const bool packed_frame = exact_rgb && policy.packed_frame && !c.channels_last && c.element_size == 2 &&
                            !c.mixed_precision() && c.use_32bit_indexing;
  plan.variant = find_variant(kPixelsForwardVariants, c, [&](const PixelsForwardVariant& v) {
    return v.channel_block == channel_block && v.prefetch == prefetch && v.vector_loads == vector_loads &&
           v.packed_frame == packed_frame;
  });
  return plan;
}

CudaBackwardPlan plan_cuda_backward(const CallFacts& c, const CudaDeviceFacts& device, const KernelPolicy& policy) {
  if (c.channels_last && c.channels > kSmallChannels) {
    // The channel lanes (policy.channel_lanes): a pixel's channels in whole blocks of
    // kPixelVectorBlock (vector loads of the frame and of grad_output, each piece aligned to its
    // size), float32 or a half type, 32-bit indices, a thread per (pixel, lane) within one grid;
    // float atomics, so not for a deterministic input gradient.
    const int64_t piece = std::min<int64_t>(16, kPixelVectorBlock * c.element_size);
    const int64_t blocks = c.channels / kPixelVectorBlock;
    int lanes_log2 = 0;
    while ((int64_t(1) << lanes_log2) < blocks && (1 << lanes_log2) < kMaxChannelLanes) ++lanes_log2;
    const bool lane_shape = backward_may_take_channel_lanes(c.channels, policy) && c.element_size <= 4 &&
                            c.use_32bit_indexing && c.input_alignment >= piece && c.grad_output_alignment >= piece &&
                            c.output_pixels() > 0;
    // The lane tile (policy.lane_tile), where the input gradient is wanted: fixed point, so deterministic
    // calls too; at most 4 lanes a pixel (kLaneTileMaxLanesLog2), each with at most
    // kLaneTileMaxBlocksPerLane blocks (8 to 64 channels), whole blocks of channels a pass in its
    // shared-memory budget, at most kFixedPointMaxTaps taps, the tiles within one grid.
    const int tile_lanes_log2 = std::min(lanes_log2, kLaneTileMaxLanesLog2);
    const int64_t blocks_per_lane = (blocks + (int64_t(1) << tile_lanes_log2) - 1) >> tile_lanes_log2;
    TileFootprint lane_footprint;
    int64_t lane_tiles = 0;
    if (lane_shape && policy.lane_tile && c.input_grad() && blocks_per_lane <= kLaneTileMaxBlocksPerLane) {
      const int64_t budget =
          std::min(kLaneTileSharedBytes, device.shared_memory_per_block_optin - kLaneTileStaticBytes);
      lane_footprint = lane_tile_footprint(c, tile_lanes_log2, budget);
      const int64_t tile_w = kWarpSize >> tile_lanes_log2;
      lane_tiles = c.batch * ((c.height_out + kTileH - 1) / kTileH) * ((c.width_out + tile_w - 1) / tile_w);
    }
    if (lane_footprint.channels_per_pass >= kPixelVectorBlock && c.kernel_h * c.kernel_w <= kFixedPointMaxTaps &&
        lane_tiles <= std::numeric_limits<int32_t>::max()) {
      CudaBackwardPlan plan;
      plan.kernel = CudaBackwardKernel::kLaneTile;
      plan.kernel_input_grad = true;
      plan.kernel_param_grads = c.any_per_pixel_grad();
      plan.deterministic = c.deterministic;
      plan.lanes_log2 = tile_lanes_log2;
      plan.footprint = lane_footprint;
      plan.tile_shared_bytes = lane_footprint.channels_per_pass * lane_footprint.rows * lane_footprint.cols *
                               tile_element_bytes(c.element_size);
      plan.variant = find_variant(kLaneTileVariants, c,
                                  [](const LaneTileVariant& v) { return v.channel_block == kPixelVectorBlock; });
      return plan;
    }
    const bool lanes = lane_shape && !(c.input_grad() && c.deterministic) &&
                       (c.output_pixels() << lanes_log2) <= kMaxGridDimX * kThreadsPerBlock;
    if (lanes) {
      CudaBackwardPlan plan;
      plan.kernel = CudaBackwardKernel::kChannelLanes;
      plan.kernel_input_grad = c.input_grad();
      plan.kernel_param_grads = c.any_per_pixel_grad();
      plan.lanes_log2 = lanes_log2;
      plan.variant = find_variant(kChannelLanesVariants, c,
                                  [](const ChannelLanesVariant& v) { return v.channel_block == kPixelVectorBlock; });
      if (!plan.kernel_input_grad && !plan.kernel_param_grads) plan.kernel = CudaBackwardKernel::kNone;
      return plan;
    }
    CallFacts nchw = c;
    nchw.channels_last = false;
    CudaBackwardPlan plan = plan_cuda_backward(nchw, device, policy);
    plan.nchw_copies = true;
    return plan;
  }
  CudaBackwardPlan plan;
  if (c.output_pixels() == 0 || c.channels == 0) {
    plan.empty = true;
    return plan;
  }
  GridWindow window;
  int64_t channel_bytes = 0;
  const bool grid = grid_window(c, device, policy, window, channel_bytes);
  const int64_t shared_limit = device.shared_memory_per_block_optin;

  // Without offsets or a mask (sepconv) the input gradient is gathered: deterministic, no atomics.
  if (grid && c.input_grad() && !c.has_mask && c.channels <= kSmallChannels) {
    const GatherLayout layout = gather_layout(c.kernel_w);
    const VirtualDomain domain = gather_domain(c);
    const int64_t shared = int64_t(layout.shared_words(static_cast<int>(c.channels))) * int64_t(sizeof(float));
    if (shared <= shared_limit && (domain.height + kGridTileHeight - 1) / kGridTileHeight <= kMaxGridDimYZ) {
      plan.gather_input_grad = true;
      plan.gather_variant =
          find_variant(kGatherInputGradVariants, c, [](const GridTapsBackwardVariant&) { return true; });
      plan.gather_layout = layout;
      plan.gather_domain = domain;
      plan.gather_shared_bytes = shared;
    }
  }
  // Without offsets the grid-tap kernel computes the per-pixel tensors' gradients, all channels in one window.
  if (grid && c.any_per_pixel_grad() && c.channels <= kSmallChannels) {
    const int64_t shared =
        c.channels * channel_bytes + (c.grads[2] ? c.kernel_w * kGridTileThreads * int64_t(sizeof(float)) : 0);
    if (shared <= shared_limit) {
      plan.grid_tap_param_grads = true;
      plan.grid_tap_params_variant =
          find_variant(kGridTapsParamsVariants, c, [](const GridTapsBackwardVariant&) { return true; });
      plan.window = window;
      plan.grid_tap_shared_bytes = shared;
    }
  }
  plan.kernel_input_grad = c.input_grad() && !plan.gather_input_grad;
  plan.kernel_param_grads = c.any_per_pixel_grad() && !plan.grid_tap_param_grads;
  if (!plan.kernel_input_grad && !plan.kernel_param_grads) return plan;
  plan.deterministic = plan.kernel_input_grad && c.deterministic;
  const bool fixed5 = c.square_kernel(kSpecializedKernel);
  const int channel_block = fixed5 && c.channels % 3 == 0 && c.channels % 4 != 0 ? 3 : 4;

  // The tile needs shared memory for at least one channel, 32-bit indices, at most
  // kFixedPointMaxTaps taps for the fixed point (float32 and the half types), and, when
  // deterministic, a fixed-point tile (float64's float tile depends on the order of its adds).
  const TileFootprint footprint = tile_footprint(c);
  const bool fixed_point_tile = c.element_size <= 4;
  const int64_t tiles = c.batch * ((c.height_out + kTileH - 1) / kTileH) * ((c.width_out + kTileW - 1) / kTileW);
  const bool tiled = plan.kernel_input_grad && policy.input_grad_tile && footprint.channels_per_pass >= 1 &&
                     (!fixed_point_tile || c.kernel_h * c.kernel_w <= kFixedPointMaxTaps) &&
                     (fixed_point_tile || !plan.deterministic) && c.use_32bit_indexing &&
                     tiles <= std::numeric_limits<int32_t>::max();
  if (!tiled) {
    plan.kernel = CudaBackwardKernel::kPixels;
    plan.variant = find_variant(kBackwardVariants, c, [&](const BackwardVariant& v) {
      return v.kernel == CudaBackwardKernel::kPixels && v.channel_block == channel_block;
    });
    return plan;
  }
  plan.kernel = CudaBackwardKernel::kTiled;
  plan.footprint = footprint;
  plan.tile_shared_bytes =
      footprint.channels_per_pass * footprint.rows * footprint.cols * tile_element_bytes(c.element_size);
  const bool rgb = c.channels == 3 && footprint.channels_per_pass >= 3;
  // Static buffers plus the tile can exceed the 48 KB a block gets without opting in, which Hopper
  // and Ampere allow and Turing (64 KB) may not.
  const bool warp_staged = policy.warp_staging && c.channels_last && fixed_point_tile && fixed5 &&
                           c.offset_pairs_aligned && !c.split_offsets && !c.mixed_precision() &&
                           warp_staged_static_bytes(c.element_size) + plan.tile_shared_bytes <= shared_limit;
  const bool exact_rgb = rgb && channel_block == 3 && (warp_staged || (fixed5 && !c.channels_last));
  const bool lean = exact_rgb && !warp_staged && fixed_point_tile && policy.lean_rgb_backward;
  plan.variant = find_variant(kBackwardVariants, c, [&](const BackwardVariant& v) {
    return v.kernel == CudaBackwardKernel::kTiled && v.channel_block == channel_block && v.warp_staged == warp_staged &&
           v.exact_rgb == exact_rgb && v.static_padding == lean;
  });
  plan.prefetch = policy.prefetch && fixed5 && !c.channels_last;
  return plan;
}

std::string plan_name(const CudaForwardPlan& plan) {
  switch (plan.kernel) {
    case CudaForwardKernel::kEmpty:
      return "empty";
    case CudaForwardKernel::kGridTaps:
      return kGridTapsForwardVariants[plan.variant].name;
    case CudaForwardKernel::kStaged:
      return kStagedForwardVariants[plan.variant].name;
    case CudaForwardKernel::kLanePairs:
      return kLanePairsForwardVariants[plan.variant].name;
    case CudaForwardKernel::kPixels:
      return kPixelsForwardVariants[plan.variant].name;
  }
  return "unknown";
}

std::string plan_name(const CudaBackwardPlan& plan) {
  if (plan.empty) return plan.nchw_copies ? "nchw_copies+empty" : "empty";
  std::string name = plan.nchw_copies ? "nchw_copies" : "";
  const auto part = [&](const std::string& p) { name += (name.empty() ? "" : "+") + p; };
  if (plan.grid_tap_param_grads) part(kGridTapsParamsVariants[plan.grid_tap_params_variant].name);
  if (plan.gather_input_grad) part(kGatherInputGradVariants[plan.gather_variant].name);
  switch (plan.kernel) {
    case CudaBackwardKernel::kNone:
      break;
    case CudaBackwardKernel::kTiled:
      part(std::string(kBackwardVariants[plan.variant].name) + (plan.prefetch ? "_prefetch" : ""));
      break;
    case CudaBackwardKernel::kPixels:
      part(kBackwardVariants[plan.variant].name);
      break;
    case CudaBackwardKernel::kChannelLanes:
      part(kChannelLanesVariants[plan.variant].name + std::to_string(1 << plan.lanes_log2));
      break;
    case CudaBackwardKernel::kLaneTile:
      part(kLaneTileVariants[plan.variant].name + std::to_string(1 << plan.lanes_log2));
      break;
  }
  if (plan.kernel != CudaBackwardKernel::kNone && plan.deterministic) part("fixed_point");
  return name.empty() ? "none" : name;
}

}  // namespace edsc_ext
