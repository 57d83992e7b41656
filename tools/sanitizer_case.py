"""A small CUDA forward+backward over every code path, for compute-sanitizer (memcheck, racecheck).

Offsets reach far outside the image, some are NaN or 1e30, and every dtype and padding mode runs, with
one offset tensor and with split offsets, and float32 frames with half-type per-pixel tensors, so an
out-of-bounds read or write anywhere in the kernels shows up; then upsample_bilinear2x's kernels.

    python3 tools/sanitizer_case.py [--dtypes float32 bfloat16 ...]

--dtypes narrows the frames' dtypes (default all four; float32 frames also run the mixed-precision
calls), e.g. for racecheck, whose shared-memory tracking makes the whole case take minutes.
"""
import argparse

import torch

import edsc_ext

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=list(DTYPES))
    dtypes = [DTYPES[name] for name in parser.parse_args().dtypes]
    for deterministic in (False, True):  # the fixed-point input gradient is a kernel of its own
        torch.use_deterministic_algorithms(deterministic)
        run_every_path(dtypes)
    torch.use_deterministic_algorithms(False)
    device = torch.device("cuda", torch.cuda.device_count() - 1)
    a = torch.randn(1000, device=device)
    assert torch.equal(edsc_ext.vector_add(a, a), a + a)
    run_upsampling(dtypes, device)
    run_pooling(dtypes, device)
    print("sanitizer case done")


def run_resampling(op, sizes, grad_size, seed, dtypes, device) -> None:
    """One 2x resampling op's four kernels: 16-byte and one-value threads, channels_last and NCHW, each of
    ``sizes``, a view one element into its storage (not 16-byte aligned), and the backward on ``grad_size``."""
    gen = torch.Generator().manual_seed(seed)
    for dtype in dtypes:
        for n, c, h, w in sizes:
            x = torch.randn(n, c, h, w, generator=gen).to(device, dtype)
            for fmt in (torch.contiguous_format, torch.channels_last):
                op(x.contiguous(memory_format=fmt))
            flat = torch.randn(x.numel() + 1, generator=gen).to(device, dtype)
            op(flat[1:].view(n, h, w, c).permute(0, 3, 1, 2))
        x = torch.randn(grad_size, generator=gen).to(device, dtype).requires_grad_()
        op(x).sum().backward()


def run_upsampling(dtypes, device) -> None:
    """upsample_bilinear2x's kernels, sizes of one row or column among them."""
    run_resampling(edsc_ext.upsample_bilinear2x, ((2, 16, 5, 8), (1, 3, 1, 7), (1, 8, 9, 1)), (2, 8, 4, 6), 1,
                   dtypes, device)


def run_pooling(dtypes, device) -> None:
    """avg_pool2x's kernels: odd sizes (the last row and column dropped) and the smallest input among them."""
    run_resampling(edsc_ext.avg_pool2x, ((2, 16, 6, 32), (1, 3, 2, 2), (1, 8, 9, 17)), (2, 8, 5, 6), 2, dtypes,
                   device)


def run_every_path(dtypes) -> None:
    device = torch.device("cuda", torch.cuda.device_count() - 1)
    gen = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        for mode in ("zeros", "border", "edsc"):
            for kh, kw, pad, dil in ((5, 5, 2, 1), (3, 4, (1, 2), (2, 1)), (1, 20, (0, 10), 1)):
                n, c, h, w = 2, 5, 11, 13
                ph, pw = (pad, pad) if isinstance(pad, int) else pad
                dh, dw = (dil, dil) if isinstance(dil, int) else dil
                ho, wo = h + 2 * ph - dh * (kh - 1), w + 2 * pw - dw * (kw - 1)
                shapes = [(n, c, h, w), (n, kh, ho, wo), (n, kw, ho, wo), (n, 2 * kh * kw, ho, wo),
                          (n, kh * kw, ho, wo)]
                ts = [torch.randn(s, generator=gen).to(device, dtype) for s in shapes]
                ts[3] *= 6
                ts[3][0, 0, 0, 0] = float("nan")
                ts[3][1, 1, 1, 1] = 1e30
                ts[3][1, 2, 2, 2] = -float("inf")
                ts = [t.requires_grad_() for t in ts]
                out = edsc_ext.deform_sepconv(*ts, padding=pad, dilation=dil, padding_mode=mode)
                out.backward(torch.randn_like(out))
                # Absent optional tensors take other branches.
                out = edsc_ext.deform_sepconv(ts[0], None, ts[2], None, ts[4], kernel_size=(kh, kw), padding=pad,
                                              dilation=dil, padding_mode=mode)
                out.sum().backward()
                # channels_last: every kernel indexes NHWC memory directly.
                cl = [t.detach().contiguous(memory_format=torch.channels_last).requires_grad_() for t in ts]
                out = edsc_ext.deform_sepconv(*cl, padding=pad, dilation=dil, padding_mode=mode)
                out.sum().backward()
                # channels_last with 8 channels: whole blocks of 4, each corner's block read with one
                # vector load (float32 and the half types), the far offsets' corners outside included.
                # (The wider frames below are the first 8, 24 and 32 channels of one repeat of the frame.)
                repeated = torch.cat([cl[0].detach()] * 7, 1)
                wide = repeated[:, :8].contiguous(memory_format=torch.channels_last)
                edsc_ext.deform_sepconv(wide.requires_grad_(), *cl[1:], padding=pad, dilation=dil,
                                        padding_mode=mode).sum().backward()
                # The channel lanes backward (the default policy): 8 channels one lane a pixel (the call
                # above); 24 channels three blocks on four lanes, one idle, the last warp partly past the
                # last pixel; 32 channels on four lanes, every lane busy; and the NCHW copies they replace
                # (channel_lanes=False).
                wider = repeated[:, :24].contiguous(memory_format=torch.channels_last)
                four_lanes = repeated[:, :32].contiguous(memory_format=torch.channels_last)
                for frame, lanes in ((wider, True), (four_lanes, True), (wide.detach(), False)):
                    with edsc_ext.kernel_policy(channel_lanes=lanes):
                        out = edsc_ext.deform_sepconv(frame.requires_grad_(), *cl[1:], padding=pad, dilation=dil,
                                                      padding_mode=mode)
                        out.backward(torch.randn_like(out))
                # The lane tile (kernel_policy(lane_tile=True)): the same 24, 32 and 8 channels, the input
                # gradient through the shared-memory tile.
                for frame in (wider, four_lanes, wide.detach()):
                    with edsc_ext.kernel_policy(lane_tile=True):
                        out = edsc_ext.deform_sepconv(frame.requires_grad_(), *cl[1:], padding=pad, dilation=dil,
                                                      padding_mode=mode)
                        out.backward(torch.randn_like(out))
                # NCHW with 3 channels: one channel block, where the float32 forward prefetches each
                # warp's per-pixel values (11 x 13 outputs: warps straddle the two images).
                rgb = ts[0].detach()[:, :3].contiguous().requires_grad_()
                out = edsc_ext.deform_sepconv(rgb, *ts[1:], padding=pad, dilation=dil, padding_mode=mode)
                out.backward(torch.randn_like(out))
                # channels_last with 3 channels: the exact-RGB lane-pair forward as well (11 x 13
                # outputs leave warps partly filled), with and without the optional tensors.
                rgb = ts[0].detach()[:, :3].contiguous(memory_format=torch.channels_last).requires_grad_()
                out = edsc_ext.deform_sepconv(rgb, *cl[1:], padding=pad, dilation=dil, padding_mode=mode)
                out.backward(torch.randn_like(out))
                out = edsc_ext.deform_sepconv(rgb, None, cl[2], cl[3], None, kernel_size=(kh, kw), padding=pad,
                                              dilation=dil, padding_mode=mode)
                out.sum().backward()
                # No offsets (sepconv; undilated: the grid-tap forward, whose windows overhang the
                # 11 x 13 image), with and without the mask, 5 channels (a pass each) and 3, NCHW and NHWC.
                for frame, rest in ((ts[0], ts), (rgb, cl)):
                    out = edsc_ext.deform_sepconv(frame, rest[1], rest[2], None, rest[4], padding=pad, dilation=dil,
                                                  padding_mode=mode)
                    out.sum().backward()
                    out = edsc_ext.deform_sepconv(frame, rest[1], rest[2], padding=pad, dilation=dil,
                                                  padding_mode=mode)
                    out.sum().backward()
                # Split offsets (dy, dx as two tensors), NCHW and NHWC, 3 and 5 channels.
                for frame, rest in ((ts[0], ts), (rgb, cl), (ts[0].detach()[:, :3].contiguous(), ts)):
                    fmt = torch.channels_last if rest is cl else torch.contiguous_format
                    dy, dx = (rest[3].detach()[:, k::2].contiguous(memory_format=fmt).requires_grad_() for k in (0, 1))
                    out = edsc_ext.deform_sepconv(frame, rest[1], rest[2], (dy, dx), rest[4], padding=pad,
                                                  dilation=dil, padding_mode=mode)
                    out.backward(torch.randn_like(out))
                    if dtype == torch.float32:
                        # Mixed precision: half-type per-pixel tensors (2-byte loads and
                        # gradient stores, the L2 prefetch of 2-byte planes) with this float32 frame.
                        for half in (torch.float16, torch.bfloat16):
                            per_pixel = [t.detach().to(half).requires_grad_() for t in (rest[1], rest[2], dy, dx,
                                                                                          rest[4])]
                            for offset in (tuple(per_pixel[2:4]), None):
                                out = edsc_ext.deform_sepconv(frame, per_pixel[0], per_pixel[1], offset, per_pixel[4],
                                                              padding=pad, dilation=dil, padding_mode=mode)
                                out.backward(torch.randn_like(out))
                # Per-pixel tensors as views, read in place by the forward: channel slices of wider
                # tensors, split offsets as two slices of one tensor, a mask expanded along the batch;
                # NCHW and NHWC, 5 and 3 channels, and half-type views with float32 frames.
                for frame, rest in ((ts[0], ts), (rgb, cl)):
                    fmt = torch.channels_last if rest is cl else torch.contiguous_format
                    for view_dtype in (dtype,) + ((torch.float16, torch.bfloat16) if dtype == torch.float32 else ()):
                        vert, horz, mask = (channel_slice(t, view_dtype, fmt) for t in (rest[1], rest[2], rest[4][:1]))
                        offsets = rest[3].detach()
                        both = channel_slice(torch.cat([offsets[:, 0::2], offsets[:, 1::2]], 1), view_dtype, fmt)
                        dy_dx = (both[:, : kh * kw], both[:, kh * kw :])
                        edsc_ext.deform_sepconv(frame.detach(), vert, horz, dy_dx, mask.expand(rest[4].shape),
                                                padding=pad, dilation=dil, padding_mode=mode)
                        edsc_ext.deform_sepconv(frame.detach(), vert, horz, channel_slice(offsets, view_dtype, fmt),
                                                None, padding=pad, dilation=dil, padding_mode=mode)
    torch.cuda.synchronize(device)


def channel_slice(t: torch.Tensor, dtype: torch.dtype, fmt: torch.memory_format) -> torch.Tensor:
    """t's values in dtype as the first channels of a wider tensor in memory format fmt (a view)."""
    t = t.detach().to(dtype)
    return torch.cat([t, t[:, :3]], 1).contiguous(memory_format=fmt)[:, : t.shape[1]]


if __name__ == "__main__":
    main()
