"""`edsc-benchmark` (or `python -m edsc_ext.benchmarks.op`): times ``edsc_ext.deform_sepconv`` against its peers
and against the memory-bandwidth floor.

The peers, each first checked equal (forward and every gradient) at a tiny size of the case:

* ``compat``: the EDSC drop-in, :func:`edsc_ext.models.compat.compat_deform_sepconv` (the original layer's
  sampling, ``offset_x``/``offset_y`` as two tensors, as EDSC's heads make them), on the cases of
  EDSC's geometry (odd K, padding K//2, offsets and masks);
* ``deform_conv2d``: :func:`torchvision.ops.deform_conv2d` (when torchvision is importable), which
  computes the op in zeros mode with a depthwise weight of ones and ``mask = V[i] * H[j] * M[t]``,
  that product made inside the timed call;
* ``grid_sample``: :func:`edsc_ext.reference.deform_sepconv_grid_sample`, every tap's samples in one
  :func:`torch.nn.functional.grid_sample` call.

For every case (the table below; ``--device cpu`` picks a scaled-down list), every dtype and both
passes (forward; forward+backward with every gradient) it reports the median time of ``--reps``
runs, the achieved bandwidth (floor bytes / time), the percentage of the floor (floor time / time),
each peer's time as a multiple of edsc_ext's, the speed-up over grid_sample and the peak memory
allocated on top of the inputs. The floor is :func:`floor_bytes` divided by the device copy
bandwidth measured in the same run (:func:`measure_copy_bandwidth`).

==========  ===============  ===========  ====================================================
case        N x C x H x W    K            arguments
==========  ===============  ===========  ====================================================
train       16x3x256x256     5            v, h, offset, mask, padding=2, border
infer       1x3x1088x1920    5            v, h, offset, mask, padding=2, border
batch       8x3x1088x1920    5            v, h, offset, mask, padding=2, border
feat        4x32x256x256     5            v, h, offset, mask, padding=2, border, channels_last
feat64      4x64x256x256     5            v, h, offset, mask, padding=2, border, channels_last
sepconv     1x3x1088x1920    51           v, h (padding=25, border)
adacof      8x3x256x256      5, dil. 2    offset, mask (kernel_size=5, dilation=2, padding=4, zeros)
==========  ===============  ===========  ====================================================

(H x W is the output size; with these paddings the input has the same size. The many-channel
cases run every 4-D tensor in channels_last, their natural layout, and ``--channels-last`` puts every case there.)

Forward rows run under ``torch.no_grad()`` (inference). Forward+backward rows run the forward with
every present tensor requiring grad and then ``torch.autograd.grad`` with a fixed random
grad_output (no ``.grad`` accumulation is timed). Before a case is timed, the baseline is checked
against edsc_ext (forward and all gradients, float32) at a tiny size of the same geometry, so a
wrong baseline is never timed.

Examples::

    edsc-benchmark                                   # all cases, cuda, 4 precisions
    edsc-benchmark --cases train feat --dtypes bfloat16 --json out.json --plot out.png
    edsc-benchmark --device cpu --quick              # smoke test
    edsc-benchmark --model --help                    # the EDSC networks (edsc-model-benchmark)
    edsc-benchmark --video --help                    # the video tool (edsc-video-benchmark)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

import torch

import edsc_ext
from edsc_ext.models.compat import compat_deform_sepconv
from edsc_ext.reference import deform_sepconv_grid_sample

from . import harness
from .harness import GB

__all__ = ["Case", "CASES", "CPU_CASES", "floor_bytes", "gather_traffic", "grid_sample_memory_estimate",
           "deform_conv2d_memory_estimate",
           "measure_copy_bandwidth", "time_fn", "check_peer", "check_baseline", "peer_skip_reason", "run",
           "to_markdown", "main"]

MIB = 2.0 ** 20



class Precision(NamedTuple):
    """The dtypes of a benchmark row: the frame's (input, output, grad_output) and the per-pixel
    tensors' (vertical, horizontal, offset, mask); they differ in the mixed-precision rows, a
    float32 frame with half-type per-pixel tensors as autocast makes them."""

    frame: torch.dtype
    per_pixel: torch.dtype

    @classmethod
    def of(cls, dtype) -> "Precision":
        return dtype if isinstance(dtype, Precision) else cls(dtype, dtype)

    @property
    def name(self) -> str:
        frame = _dtype_name(self.frame)
        return frame if self.per_pixel == self.frame else f"{frame}+{_dtype_name(self.per_pixel)}"


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64, "float32+bfloat16": Precision(torch.float32, torch.bfloat16),
          "float32+float16": Precision(torch.float32, torch.float16)}
DEFAULT_DTYPES = ("float32", "bfloat16", "float16", "float32+bfloat16")
PASSES = ("fwd", "fwd+bwd")
IMPLS = ("edsc_ext", "compat", "deform_conv2d", "grid_sample")
OFFSET_STD = 1.5  # offsets ~ N(0, 1.5^2)
TORCHVISION_MISSING = ("torchvision not importable: pip install torchvision (the bench extra), the build that "
                       "matches your torch")


# ------------------------------------------------------------------------------------------------
# Cases


@dataclass(frozen=True)
class Case:
    """One benchmark case: output size, kernel, geometry and which optional tensors are given."""

    name: str
    n: int
    c: int
    h: int  # output height
    w: int  # output width
    k: int  # KH = KW
    padding: int
    padding_mode: str = "border"
    dilation: int = 1
    separable: bool = True  # vertical and horizontal given
    deformable: bool = True  # offset and mask given
    # Every 4-D tensor in channels_last (the natural layout of many-channel feature maps, whose
    # kernels read a pixel's channels together); a channels_last run puts every case there.
    channels_last: bool = False

    @property
    def h_in(self) -> int:
        return self.h - 2 * self.padding + self.dilation * (self.k - 1)

    @property
    def w_in(self) -> int:
        return self.w - 2 * self.padding + self.dilation * (self.k - 1)

    @property
    def shape(self) -> str:
        return f"{self.n}x{self.c}x{self.h}x{self.w}"

    @property
    def kernel(self) -> str:
        return f"{self.k}" + (f" (dil {self.dilation})" if self.dilation != 1 else "")

    def tensor_numels(self) -> Dict[str, int]:
        """Element counts of the present tensors: input, vertical, horizontal, offset, mask, output."""
        hw, taps = self.h * self.w, self.k * self.k
        sizes = {"input": self.n * self.c * self.h_in * self.w_in}
        if self.separable:
            sizes["vertical"] = self.n * self.k * hw
            sizes["horizontal"] = self.n * self.k * hw
        if self.deformable:
            sizes["offset"] = self.n * 2 * taps * hw
            sizes["mask"] = self.n * taps * hw
        sizes["output"] = self.n * self.c * hw
        return sizes

    def kwargs(self) -> dict:
        kw = dict(padding=self.padding, dilation=self.dilation, padding_mode=self.padding_mode)
        if not self.separable:
            kw["kernel_size"] = self.k
        return kw

    def make_inputs(self, dtype, device, seed: int) -> List[Optional[torch.Tensor]]:
        """(input, vertical, horizontal, offset, mask), absent ones None, with realistic values:
        a frame in [0, 1), separable kernels that sum to 1 (softmax over the taps), offsets
        ~ N(0, 1.5^2), masks in (0, 1). Drawn in float32 on ``device`` and cast to ``dtype`` (a
        torch dtype, or a :class:`Precision`: the frame to its ``frame``, the rest to ``per_pixel``)."""
        precision = Precision.of(dtype)
        gen = torch.Generator(device=device).manual_seed(seed)
        opts = dict(generator=gen, device=device, dtype=torch.float32)
        hw = (self.h, self.w)
        taps = self.k * self.k
        frame = torch.rand(self.n, self.c, self.h_in, self.w_in, **opts)
        v = h = offset = mask = None
        if self.separable:
            v = torch.randn(self.n, self.k, *hw, **opts).softmax(dim=1)
            h = torch.randn(self.n, self.k, *hw, **opts).softmax(dim=1)
        if self.deformable:
            offset = torch.randn(self.n, 2 * taps, *hw, **opts).mul_(OFFSET_STD)
            mask = torch.randn(self.n, taps, *hw, **opts).sigmoid_()
        return [frame.to(precision.frame)] + [None if t is None else t.to(precision.per_pixel)
                                              for t in (v, h, offset, mask)]

    def tiny(self) -> "Case":
        """The same geometry (kernel, dilation, padding, mode, tensors) at a tiny size."""
        return replace(self, n=2, c=min(self.c, 4), h=9, w=11)


def _cases(sizes: Dict[str, tuple]) -> List[Case]:
    edsc = dict(k=5, padding=2, padding_mode="border")
    return [
        Case("train", *sizes["train"], **edsc),
        Case("infer", *sizes["infer"], **edsc),
        Case("batch", *sizes["batch"], **edsc),
        Case("feat", *sizes["feat"], **edsc, channels_last=True),
        Case("feat64", *sizes["feat64"], **edsc, channels_last=True),
        Case("sepconv", *sizes["sepconv"], k=51, padding=25, padding_mode="border", deformable=False),
        Case("adacof", *sizes["adacof"], k=5, padding=4, dilation=2, padding_mode="zeros", separable=False),
    ]


CASES = _cases({"train": (16, 3, 256, 256), "infer": (1, 3, 1088, 1920), "batch": (8, 3, 1088, 1920),
                "feat": (4, 32, 256, 256), "feat64": (4, 64, 256, 256), "sepconv": (1, 3, 1088, 1920),
                "adacof": (8, 3, 256, 256)})
# Scaled down for --device cpu (same kernels and geometry).
CPU_CASES = _cases({"train": (2, 3, 64, 64), "infer": (1, 3, 136, 240), "batch": (2, 3, 136, 240),
                    "feat": (1, 32, 64, 64), "feat64": (1, 64, 64, 64), "sepconv": (1, 3, 34, 60),
                    "adacof": (2, 3, 64, 64)})


# ------------------------------------------------------------------------------------------------
# The floor


def floor_bytes(case: Case, dtype, backward: bool) -> int:
    """Bytes that any implementation must move, at least: every input read once and every output
    written once, at ``dtype``'s element size (a :class:`Precision`: the frame's for input and
    output, the per-pixel tensors' for the rest). Only the tensors the case passes count (sepconv
    has no offset/mask, adacof no vertical/horizontal).

    With ``I`` the input elements (N*C*H_in*W_in), ``O`` the output elements (N*C*H_out*W_out) and
    ``P`` the per-pixel elements (N*(KH + KW + 2*KH*KW + KH*KW)*H_out*W_out for the present
    vertical, horizontal, offset and mask):

    * forward: read input and per-pixel tensors, write the output: ``I + P + O``;
    * forward+backward: the forward, plus the backward reading grad_output (``O``), the input
      (``I``) and the per-pixel tensors (``P``) and writing every gradient (``I + P``):
      ``(I + P + O) + (O + I + P) + (I + P) = 3I + 3P + 2O``.

    Each counted at its element size. Caches, recomputation, atomics and the zero-fill of
    grad_input are not counted: this is a lower bound, not a model of any kernel.
    """
    precision = Precision.of(dtype)
    sizes = case.tensor_numels()
    i, o = sizes["input"], sizes["output"]
    p = sum(v for key, v in sizes.items() if key not in ("input", "output"))
    frame_elements = (3 * i + 2 * o) if backward else (i + o)
    per_pixel_elements = 3 * p if backward else p
    return (frame_elements * _element_size(precision.frame) + per_pixel_elements * _element_size(precision.per_pixel))


def gather_traffic(case: Case, dtype, channels_last: Optional[bool] = None) -> Dict[str, float]:
    """The gather work of the bilinear taps, which the DRAM floor does not see: what any kernel that
    samples every tap must serve from its caches, however well the frame itself stays cached.

    Each of the ``S = N*KH*KW*H_out*W_out`` samples reads two rows of the frame, and in each row two
    neighbouring pixels. A contiguous span of ``L`` bytes starting at a random element boundary
    touches on average ``1 + (L - e) / 32`` 32-byte sectors (``e``: the frame's element size), so:

    * NCHW: a span of ``2e`` a row and channel: ``2 (1 + e/32)`` sector requests a sample and channel,
      ``2 C (1 + e/32) S`` in all (2.25 per sample and channel in float32);
    * channels_last: a pixel's channels are adjacent, a span of ``2Ce`` a row:
      ``2 (1 + (2C - 1) e / 32) S`` in all.

    The backward gathers the same samples again (the per-pixel gradients need them) and adds each
    sample's four corners to the input gradient: ``4 C S`` scattered additions (``atomics``), wherever
    they are accumulated. Returns ``samples``, ``l1_sectors`` (forward) and ``l1_sectors_backward``,
    ``atomics``; ``tools/roofline.py`` holds these against the kernels' measured counters.
    """
    precision = Precision.of(dtype)
    e = _element_size(precision.frame)
    nhwc = case.channels_last if channels_last is None else channels_last
    samples = case.n * case.k * case.k * case.h * case.w
    per_sample = 2 * (1 + (2 * case.c - 1) * e / 32) if nhwc else 2 * case.c * (1 + e / 32)
    sectors = per_sample * samples
    return {"samples": float(samples), "l1_sectors": sectors, "l1_sectors_backward": 2 * sectors,
            "atomics": 4.0 * case.c * samples}


def _element_size(dtype) -> int:
    return torch.empty((), dtype=Precision.of(dtype).frame).element_size()


def grid_sample_memory_estimate(case: Case, dtype: torch.dtype, backward: bool) -> int:
    """Rough peak bytes that :func:`deform_sepconv_grid_sample` allocates beyond its inputs.

    It materialises per-tap tensors of ``T = N*KH*KW*H_out*W_out`` elements: the grid (2T), the
    samples (C*T), the weights (T, transiently 3T), their product with the samples (C*T) and, with
    offsets, the deformed coordinates (2T); the backward adds grad-of-samples (C*T) and
    grad-of-grid (2T) while the forward's saved tensors are alive. Counted that way the forward
    peaks at ``(2C + 3 + 2·offsets) T`` elements and forward+backward at about
    ``(3C + 5 + 2·offsets) T`` (measured on an H200: 11.1 T and 16.2 T for C=3, 70 T and 106 T for
    C=32, with offsets); the estimate adds a margin: ``(2C + 4 + 2·offsets) T`` forward and
    ``(3C + 8 + 2·offsets) T`` forward+backward.
    """
    taps_elems = case.n * case.k * case.k * case.h * case.w
    coords = 2 if case.deformable else 0
    factor = (3 * case.c + 8 + coords) if backward else (2 * case.c + 4 + coords)
    return factor * taps_elems * _element_size(dtype)


# ------------------------------------------------------------------------------------------------
# Timing


def time_fn(fn: Callable[[], object], device, warmup: int = 5, reps: int = 20) -> dict:
    """Runs ``fn`` ``warmup`` times, then ``reps`` timed times (:func:`harness.time_calls`); returns the
    statistics in ms (``median_ms``, ``min_ms``, ``mean_ms``, ``max_ms``, ``reps``, ``times_ms``)."""
    times = harness.time_calls(fn, device, warmup, reps)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "mean_ms": statistics.fmean(times),
            "max_ms": max(times), "reps": len(times), "times_ms": times}


def measure_copy_bandwidth(device, nbytes: Optional[int] = None, warmup: int = 3, reps: int = 20) -> dict:
    """Device copy bandwidth in GB/s (1e9 bytes/s), counting the bytes read plus the bytes written.

    CUDA: ``dst.copy_(src)`` of a large (default 1 GiB, less if memory is short) device buffer.
    CPU: ``src.clone()`` of a large (default 256 MiB) tensor. Median of ``reps`` runs.
    """
    device = torch.device(device)
    if nbytes is None:
        nbytes = 2 ** 30 if device.type == "cuda" else 2 ** 28
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            nbytes = max(2 ** 24, min(nbytes, free // 4))
    numel = nbytes // 4
    src = torch.ones(numel, dtype=torch.float32, device=device)
    if device.type == "cuda":
        dst = torch.empty_like(src)
        timing = time_fn(lambda: dst.copy_(src), device, warmup, reps)
        del dst
    else:
        timing = time_fn(lambda: src.clone(), device, warmup, reps)
    moved = 2 * numel * 4
    return {"gbps": moved / (timing["median_ms"] * 1e-3) / GB, "bytes_moved": moved, "median_ms": timing["median_ms"],
            "method": "dst.copy_(src)" if device.type == "cuda" else "src.clone()"}


# ------------------------------------------------------------------------------------------------
# Baseline check


def _leaves(tensors, requires_grad: bool):
    return [None if t is None else t.detach().requires_grad_(requires_grad) for t in tensors]


def _torchvision_ops():
    try:
        import torchvision.ops
    except Exception:  # not installed, or built for another torch
        return None
    return torchvision.ops


def peer_skip_reason(impl: str, case: Case) -> Optional[str]:
    """Why ``impl`` does not run ``case`` (None where it does)."""
    if impl == "compat" and not (case.separable and case.deformable and case.k % 2 == 1 and case.dilation == 1
                                 and case.padding == case.k // 2):
        return "EDSC's geometry only"
    if impl == "deform_conv2d" and _torchvision_ops() is None:
        return TORCHVISION_MISSING
    return None


def _impl_call(impl: str, case: Case, tensors) -> tuple:
    """(fn, inputs): ``fn(*inputs)`` runs ``impl`` on the case's tensors, and ``inputs`` are what its
    gradients are taken of. Whatever a user of that peer holds already (EDSC's two offset tensors,
    torchvision's weight of ones) is made here, outside the timed call."""
    frame, v, h, offset, mask = tensors
    kwargs = case.kwargs()
    if impl == "edsc_ext":
        present = [t for t in tensors if t is not None]
        return (lambda *ts: edsc_ext.deform_sepconv(*_fill(tensors, ts), **kwargs)), present
    if impl == "grid_sample":
        present = [t for t in tensors if t is not None]
        return (lambda *ts: deform_sepconv_grid_sample(*_fill(tensors, ts), **kwargs)), present
    if impl == "compat":
        # EDSC's two offset tensors in the memory format of the rest (a channels_last run would
        # otherwise time the op's copies of NCHW offsets into the frame's layout).
        nhwc = offset.is_contiguous(memory_format=torch.channels_last) and not offset.is_contiguous()
        fmt = torch.channels_last if nhwc else torch.contiguous_format
        dy = offset[:, 0::2].detach().contiguous(memory_format=fmt).requires_grad_(offset.requires_grad)
        dx = offset[:, 1::2].detach().contiguous(memory_format=fmt).requires_grad_(offset.requires_grad)
        return (lambda f, vv, hh, oy, ox, m: compat_deform_sepconv(f, vv, hh, oy, ox, m, padding=case.padding),
                [frame, v, h, dy, dx, mask])
    if impl == "deform_conv2d":
        ops = _torchvision_ops()
        k, c = case.k, case.c
        weight = torch.ones(c, 1, k, k, device=frame.device, dtype=frame.dtype)
        fixed_offset = None if offset is not None else torch.zeros(
            case.n, 2 * k * k, case.h, case.w, device=frame.device, dtype=frame.dtype)

        def deform_conv2d(*ts):
            f, vv, hh, off, m = _fill(tensors, ts)
            weights = None
            if vv is not None and hh is not None:
                weights = (vv.unsqueeze(2) * hh.unsqueeze(1)).flatten(1, 2)  # V[i] * H[j] at tap i*K + j
            if m is not None:
                weights = m if weights is None else weights * m
            return ops.deform_conv2d(f, off if off is not None else fixed_offset, weight,
                                     padding=(case.padding, case.padding),
                                     dilation=(case.dilation, case.dilation), mask=weights)
        return deform_conv2d, [t for t in tensors if t is not None]
    raise ValueError(f"unknown impl {impl!r}")


def _fill(tensors, present):
    """``tensors`` with its present entries replaced, in order, by ``present``."""
    it = iter(present)
    return [None if t is None else next(it) for t in tensors]


def _reference_call(impl: str, case: Case):
    """What ``impl`` must equal: edsc_ext in the sampling that peer computes."""
    kwargs = case.kwargs()
    if impl == "compat":
        kwargs["padding_mode"] = "edsc"
    elif impl == "deform_conv2d":
        kwargs["padding_mode"] = "zeros"
    return lambda *ts: edsc_ext.deform_sepconv(*ts, **kwargs)


def check_peer(case: Case, device, impl: str = "grid_sample", seed: int = 0) -> float:
    """Asserts that ``impl`` equals edsc_ext (forward and every gradient) for ``case``'s geometry at
    a tiny size, in float32 on ``device`` (against edsc_ext in the sampling the peer computes:
    "edsc" for compat, "zeros" for deform_conv2d); returns the worst abs. error."""
    tiny = case.tiny()
    base = tiny.make_inputs(torch.float32, device, seed)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    grad_out = torch.randn(tiny.n, tiny.c, tiny.h, tiny.w, generator=gen, device=device)
    leaves = [None if t is None else t.clone().requires_grad_() for t in base]
    expected = _reference_call(impl, tiny)(*leaves)
    present = [t for t in leaves if t is not None]
    want = [expected.detach(), *torch.autograd.grad(expected, present, grad_out)]
    fn, inputs = _impl_call(impl, tiny, [None if t is None else t.clone().requires_grad_() for t in base])
    out = fn(*inputs)
    got = [out.detach(), *torch.autograd.grad(out, inputs, grad_out)]
    if impl == "compat":  # its (dy, dx) gradients as one interleaved offset gradient
        got = got[:4] + [torch.stack((got[4], got[5]), dim=2).flatten(1, 2), got[6]]
    names = ["output"] + [name for name, t in zip(("input", "vertical", "horizontal", "offset", "mask"), base)
                          if t is not None]
    worst = 0.0
    for name, ours, theirs in zip(names, want, got):
        scale = max(1.0, ours.abs().max().item())
        tol = 1e-4 if name == "output" else 1e-3
        if not torch.allclose(theirs, ours, rtol=tol, atol=tol * scale):
            diff = (theirs - ours).abs().max().item()
            raise AssertionError(f"peer check failed for case {case.name!r}: {impl}'s {name} differs from "
                                 f"edsc_ext's by up to {diff:.3g} (float32, tiny size {tiny.shape}, {device})")
        worst = max(worst, (theirs - ours).abs().max().item())
    return worst


def check_baseline(case: Case, device, seed: int = 0) -> float:
    """:func:`check_peer` of the grid_sample baseline."""
    return check_peer(case, device, "grid_sample", seed)


# ------------------------------------------------------------------------------------------------
# Running


def _is_oom(exc: BaseException) -> bool:
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom_type is not None and isinstance(exc, oom_type)) or "out of memory" in str(exc).lower()


def _make_fn(impl: str, case: Case, pass_: str, tensors, grad_out) -> Callable[[], object]:
    fn, inputs = _impl_call(impl, case, tensors)
    if pass_ == "fwd":
        def forward():
            with torch.no_grad():
                return fn(*inputs)
        return forward

    def forward_backward():
        out = fn(*inputs)
        return torch.autograd.grad(out, inputs, grad_out)
    return forward_backward


def deform_conv2d_memory_estimate(case: Case, dtype: torch.dtype, backward: bool) -> int:
    """Rough peak bytes of torchvision's deform_conv2d beyond its inputs: its im2col columns (C*K*K
    values a pixel; the backward a second such buffer), the mask product (K*K) and, without offsets,
    the zero offsets it needs (2*K*K)."""
    taps = case.k * case.k
    per_pixel = case.c * taps * (2 if backward else 1) + taps + (0 if case.deformable else 2 * taps)
    return per_pixel * case.n * case.h * case.w * _element_size(dtype)


def _peak_extra_bytes(fn, device: torch.device) -> Optional[int]:
    """Peak allocated bytes during one call of fn, beyond what was allocated before (the inputs)."""
    if device.type != "cuda":
        return None
    harness.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = fn()
    harness.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del result
    return peak - before


class _Progress:
    """tqdm when it is installed, else one line per step on stderr."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.count, self.enabled, self.bar = total, 0, enabled, None
        if enabled and sys.stderr.isatty():  # a log file gets plain lines, not redrawn bars
            try:
                from tqdm.auto import tqdm
                self.bar = tqdm(total=total, file=sys.stderr, unit="run", dynamic_ncols=True)
            except Exception:  # tqdm missing or broken: plain prints
                self.bar = None

    def step(self, label: str) -> None:
        self.count += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_description(label)
            self.bar.update(1)
        else:
            print(f"[{self.count}/{self.total}] {label}", file=sys.stderr, flush=True)

    def write(self, message: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _dtype_name(dtype) -> str:
    if isinstance(dtype, Precision):
        return dtype.name
    return str(dtype).replace("torch.", "")


def run(device="cuda", dtypes: Sequence = DEFAULT_DTYPES, cases: Optional[Sequence] = None,
        warmup: int = 5, reps: int = 20, baseline: bool = True, memory_budget_gb: Optional[float] = None,
        seed: int = 0, progress: bool = True, copy_bandwidth: Optional[dict] = None,
        channels_last: bool = False, impls: Optional[Sequence[str]] = None) -> List[dict]:
    """Times every case x dtype x pass for edsc_ext and its peers (``impls``, default all of
    IMPLS; ``baseline=False``: edsc_ext alone) and returns one dict per row, floor rows included.
    A peer that does not apply to a case (:func:`peer_skip_reason`) gets a row saying why.

    ``cases``: Case objects or names (default: all, at the CPU sizes on a CPU device).
    ``dtypes``: torch dtypes, :class:`Precision` pairs or names of DTYPES. ``memory_budget_gb``: grid_sample runs whose
    :func:`grid_sample_memory_estimate` (deform_conv2d: :func:`deform_conv2d_memory_estimate`)
    exceeds it are skipped (default: 85% of the GPU's memory,
    8 GB on the CPU). ``copy_bandwidth``: the result of :func:`measure_copy_bandwidth` (measured here
    when None). ``channels_last``: every 4-D tensor (frame, per-pixel tensors, output gradient) in
    torch.channels_last memory format instead of contiguous, in every case (else in the cases whose
    ``channels_last`` is set: the many-channel ones).
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    catalogue = CPU_CASES if device.type == "cpu" else CASES
    by_name = {c.name: c for c in catalogue}
    if cases is None:
        selected = list(catalogue)
    else:
        selected = []
        for c in cases:
            if isinstance(c, Case):
                selected.append(c)
            elif c in by_name:
                selected.append(by_name[c])
            else:
                raise ValueError(f"unknown case {c!r}; choose from {sorted(by_name)}")
    dtype_list = [DTYPES[d] if isinstance(d, str) else d for d in dtypes]
    if memory_budget_gb is None:
        memory_budget_gb = (0.85 * torch.cuda.get_device_properties(device).total_memory / GB
                            if device.type == "cuda" else 8.0)

    if device.type == "cuda":
        torch.cuda.set_device(device)  # events, peak-memory stats and the current stream of this device
    if copy_bandwidth is None:
        copy_bandwidth = measure_copy_bandwidth(device, warmup=max(1, min(warmup, 3)), reps=max(3, min(reps, 20)))
    bandwidth = copy_bandwidth["gbps"] * GB  # bytes/s

    if impls is None:
        impls = IMPLS if baseline else IMPLS[:1]
    unknown = [i for i in impls if i not in IMPLS]
    if unknown:
        raise ValueError(f"unknown impls {unknown}; choose from {IMPLS}")
    impls = ["edsc_ext"] + [i for i in impls if i != "edsc_ext"]
    bar = _Progress(len(selected) * len(dtype_list) * len(PASSES) * len(impls), enabled=progress)
    rows: List[dict] = []
    try:
        for case_index, case in enumerate(selected):
            for impl in impls[1:]:
                if peer_skip_reason(impl, case) is None:
                    check_peer(case, device, impl, seed=seed + 1000 + case_index)
            for dtype in dtype_list:
                tensors = case.make_inputs(dtype, device, seed + case_index)
                gen = torch.Generator(device=device).manual_seed(seed + 500 + case_index)
                grad_out = torch.randn(case.n, case.c, case.h, case.w, generator=gen,
                                       device=device).to(Precision.of(dtype).frame)
                case_channels_last = channels_last or case.channels_last
                if case_channels_last:
                    tensors = [None if t is None else t.contiguous(memory_format=torch.channels_last)
                               for t in tensors]
                    grad_out = grad_out.contiguous(memory_format=torch.channels_last)
                input_bytes = sum(t.numel() * t.element_size() for t in tensors if t is not None)
                for pass_ in PASSES:
                    backward = pass_ == "fwd+bwd"
                    leaves = _leaves(tensors, requires_grad=backward)
                    fbytes = floor_bytes(case, dtype, backward)
                    floor_ms = fbytes / bandwidth * 1e3
                    common = dict(case=case.name, shape=case.shape, h_in=case.h_in, w_in=case.w_in, k=case.k,
                                  dilation=case.dilation, padding=case.padding, padding_mode=case.padding_mode,
                                  dtype=_dtype_name(dtype), pass_=pass_, floor_bytes=fbytes, floor_ms=floor_ms,
                                  memory_format="channels_last" if case_channels_last else "contiguous",
                                  input_bytes=input_bytes + (grad_out.numel() * grad_out.element_size()
                                                             if backward else 0))
                    gathers = gather_traffic(case, dtype, case_channels_last)
                    sectors = gathers["l1_sectors_backward" if backward else "l1_sectors"]
                    common["gather_traffic"] = gathers
                    note = f"bytes / copy bandwidth; taps: {sectors / 1e6:.3g} M sector requests"
                    if backward:
                        note += f", {gathers['atomics'] / 1e6:.3g} M input-gradient additions"
                    group = [dict(common, impl="floor", status="ok", ms=floor_ms, gbps=copy_bandwidth["gbps"],
                                  pct_floor=100.0, peak_extra_bytes=None, note=note)]
                    for impl in impls:
                        bar.step(f"{case.name} {_dtype_name(dtype)} {pass_} {impl}")
                        row = dict(common, impl=impl, status="ok", ms=None, gbps=None, pct_floor=None,
                                   peak_extra_bytes=None, note="")
                        group.append(row)
                        reason = peer_skip_reason(impl, case)
                        if reason is not None:
                            row.update(status="n/a", note=reason)
                            continue
                        estimate = {"grid_sample": grid_sample_memory_estimate,
                                    "deform_conv2d": deform_conv2d_memory_estimate}.get(impl)
                        if estimate is not None:
                            estimate = estimate(case, dtype, backward)
                            row["memory_estimate_bytes"] = estimate
                            if estimate > memory_budget_gb * GB:
                                row.update(status="skipped (memory)",
                                           note=f"estimate {estimate / GB:.0f} GB > budget {memory_budget_gb:.0f} GB")
                                continue
                        fn = _make_fn(impl, case, pass_, leaves, grad_out)
                        error = None
                        try:
                            row["peak_extra_bytes"] = _peak_extra_bytes(fn, device)
                            timing = time_fn(fn, device, warmup, reps)
                        except Exception as exc:  # OOM, or a dtype grid_sample lacks: record, go on
                            error = (("oom" if _is_oom(exc) else
                                      "unsupported" if impl != "edsc_ext" else "error"),
                                     f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}")
                        if error is not None:
                            row.update(status=error[0], note=error[1], peak_extra_bytes=None)
                            harness.free_memory(device)
                            continue
                        ms = timing["median_ms"]
                        row.update(ms=ms, gbps=fbytes / (ms * 1e-3) / GB, pct_floor=floor_ms / ms * 100,
                                   min_ms=timing["min_ms"], mean_ms=timing["mean_ms"], max_ms=timing["max_ms"],
                                   reps=timing["reps"], warmup=warmup, times_ms=timing["times_ms"])
                        del fn
                    gs = next((r for r in group if r["impl"] == "grid_sample" and r["ms"]), None)
                    ours = next((r for r in group if r["impl"] == "edsc_ext" and r["ms"]), None)
                    for row in group:
                        row["speedup_vs_grid_sample"] = (gs["ms"] / row["ms"] if gs and row["ms"]
                                                         and row["impl"] != "floor" else None)
                        # A peer's time as a multiple of edsc_ext's.
                        row["x_edsc_ext"] = (row["ms"] / ours["ms"] if ours and row["ms"] and row["impl"] != "floor"
                                             else None)
                    rows.extend(group)
                    del leaves
                del tensors, grad_out
                harness.free_memory(device)
    finally:
        bar.close()
    for row in rows:
        row["pass"] = row.pop("pass_")
    return rows


# ------------------------------------------------------------------------------------------------
# Reporting


def _fmt(value, spec: str, missing: str = "—") -> str:
    return missing if value is None else format(value, spec)


def _fmt_sig(value, missing: str = "—") -> str:
    """3 significant digits without exponent notation: 4512, 45.1, 4.51, 0.451."""
    if value is None:
        return missing
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.{max(0, 2 - int(math.floor(math.log10(abs(value)))))}f}"


def to_markdown(rows: Sequence[dict], header: Sequence[str] = ()) -> str:
    """A markdown table of ``rows`` (as returned by :func:`run`), preceded by ``header`` lines."""
    lines = [f"{h}  " if h else "" for h in header]
    if header:
        lines.append("")
    # Where a run mixes memory formats, the channels_last cases say so next to their shape.
    mixed_formats = len({r.get("memory_format") for r in rows}) > 1
    lines.append("| case | shape (N×C×H×W) | K | dtype | pass | impl | ms | GB/s | % of floor | × edsc_ext | "
                 "speed-up vs grid_sample | peak extra MiB | note |")
    lines.append("| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        ms = _fmt(r.get("ms"), ".3f") if r.get("ms") is not None else r.get("status", "—")
        peak = r.get("peak_extra_bytes")
        peak_text = ("n/a" if r.get("impl") != "floor" and r.get("status") == "ok" else "—") if peak is None \
            else f"{peak / MIB:.1f}"
        speedup = r.get("speedup_vs_grid_sample")
        kernel = f"{r['k']}" + (f" (dil {r['dilation']})" if r.get("dilation", 1) != 1 else "")
        impl = "**floor**" if r["impl"] == "floor" else r["impl"]
        lines.append("| " + " | ".join([
            r["case"], r["shape"] + (", channels_last" if mixed_formats and r.get("memory_format") == "channels_last"
                                     else ""), kernel, r["dtype"], r["pass"], impl, ms, _fmt_sig(r.get("gbps")),
            _fmt_sig(r.get("pct_floor")),
            "—" if r.get("x_edsc_ext") is None or r["impl"] == "edsc_ext" else f"{r['x_edsc_ext']:.2f}×",
            "—" if speedup is None else f"{speedup:.2f}×", peak_text,
            (r.get("note") or "").replace("|", "\\|"),
        ]) + " |")
    return "\n".join(lines) + "\n"


def _header_lines(env: dict, bandwidth: dict, warmup: int, reps: int, options: Sequence[str] = ()) -> List[str]:
    if env["device"].startswith("cuda"):
        dev = (f"**GPU** {env['device_name']} ({env['device']}, {env['device_memory_gb']} GB, "
               f"sm_{env['compute_capability'].replace('.', '')}), driver {env.get('driver') or 'unknown'}")
    else:
        dev = f"**CPU** {env['device_name']} ({env['cpu_threads']} threads)"
    return [
        "# edsc_ext.deform_sepconv benchmark",
        "",
        dev,
        f"**torch** {env['torch']} (CUDA {env['torch_cuda']}), edsc_ext {env['edsc_ext']}, python {env['python']}",
        f"**date** {env['date']}",
        f"**command** `{env['command']}`",
        f"**copy bandwidth** {bandwidth['gbps']:.1f} GB/s ({bandwidth['method']}, read+write bytes); "
        f"timing: median of {reps} runs after {warmup} warm-up runs",
        "floor = bytes that must move (inputs read once, outputs written once; see floor_bytes) / copy bandwidth; "
        "% of floor = floor ms / ms; GB/s = floor bytes / ms; fwd runs under no_grad, fwd+bwd computes all gradients",
        "taps (the floor rows' notes) = the 32-byte sector requests the bilinear samples make of the caches and the "
        "input gradient's scattered additions (gather_traffic), which the DRAM floor does not count; "
        "tools/roofline.py holds them against ncu's counters",
    ] + [f"**{option}**" for option in options]


def plot(rows: Sequence[dict], path: str, metric: str = "pct_floor") -> bool:
    """Bar chart (one panel per pass) of ``metric`` ("pct_floor" or "ms") per case, one bar per
    implementation x dtype. Returns False (with a message) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        print(f"--plot: matplotlib is not available ({exc}); no plot written (pip install matplotlib: the bench "
              "extra)", file=sys.stderr)
        return False
    cases = list(dict.fromkeys(r["case"] for r in rows))
    impl_order = ("floor", *IMPLS)
    dtype_order = list(dict.fromkeys(r["dtype"] for r in rows))
    series = sorted({(r["impl"], r["dtype"]) for r in rows if r["impl"] != "floor" or metric == "ms"},
                    key=lambda s: (impl_order.index(s[0]) if s[0] in impl_order else 9, dtype_order.index(s[1])))
    passes = [p for p in PASSES if any(r["pass"] == p for r in rows)]
    fig, axes = plt.subplots(len(passes), 1, figsize=(max(8, 1.6 * len(cases) * max(1, len(series)) / 3), 4.5 *
                                                      len(passes)), squeeze=False)
    width = 0.8 / max(1, len(series))
    for ax, pass_ in zip(axes[:, 0], passes):
        for s, (impl, dtype) in enumerate(series):
            values = []
            for case in cases:
                match = [r for r in rows if r["case"] == case and r["pass"] == pass_ and r["impl"] == impl
                         and r["dtype"] == dtype]
                values.append(match[0].get(metric) if match and match[0].get(metric) is not None else math.nan)
            xs = [i + (s - (len(series) - 1) / 2) * width for i in range(len(cases))]
            ax.bar(xs, values, width, label=f"{impl} {dtype}")
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels(cases)
        ax.set_yscale("log")
        ax.set_ylabel("% of bandwidth floor" if metric == "pct_floor" else "ms (median)")
        if metric == "pct_floor":
            ax.axhline(100, color="black", linewidth=0.8, linestyle="--")
        ax.set_title(f"deform_sepconv {pass_}")
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ------------------------------------------------------------------------------------------------
# Command line


def _parse_policy(parser: argparse.ArgumentParser, items: Sequence[str]) -> Dict[str, object]:
    """KEY=VALUE items as keywords of edsc_ext.kernel_policy, typed by the KernelPolicy field."""
    fields = {f.name: f for f in dataclasses.fields(edsc_ext.KernelPolicy)}
    policy: Dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            parser.error(f"--policy {item!r}: expected KEY=VALUE with KEY one of {', '.join(fields)}")
        default = getattr(edsc_ext.KernelPolicy(), key)
        if isinstance(default, bool):
            if value.lower() not in ("true", "false"):
                parser.error(f"--policy {item!r}: {key} takes true or false")
            policy[key] = value.lower() == "true"
        elif isinstance(default, int):
            if not value.isdigit():
                parser.error(f"--policy {item!r}: {key} takes an integer >= 0")
            policy[key] = int(value)
        else:
            policy[key] = value
    try:
        edsc_ext.KernelPolicy(**policy)
    except (TypeError, ValueError) as exc:
        parser.error(f"--policy: {exc}")
    return policy


def command() -> str:
    """This benchmark's command as the user typed it: its console script (pyproject.toml) or ``python -m``."""
    return harness.command_name("edsc-benchmark", "edsc_ext.benchmarks.op")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=command(), description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if available, else cpu); "
                                                   "cpu uses scaled-down cases")
    p.add_argument("--dtypes", nargs="+", default=list(DEFAULT_DTYPES), metavar="DTYPE",
                   help="any of " + ", ".join(DTYPES) + " (space or comma separated; FRAME+PER_PIXEL: a frame of "
                        "one dtype with per-pixel tensors of another, mixed precision; default: "
                        + " ".join(DEFAULT_DTYPES) + ")")
    p.add_argument("--cases", nargs="+", default=None, metavar="NAME",
                   help="subset of: " + ", ".join(c.name for c in CASES) + " (default: all)")
    p.add_argument("--reps", type=int, default=None, help="timed runs per row, median reported (default 20)")
    p.add_argument("--warmup", type=int, default=None, help="untimed runs before timing (default 5)")
    p.add_argument("--no-baseline", action="store_true", help="time edsc_ext alone (no peers, no peer checks)")
    p.add_argument("--impls", nargs="+", default=None, metavar="IMPL",
                   help="the peers to time next to edsc_ext: any of " + ", ".join(IMPLS[1:]) + " (default: all)")
    p.add_argument("--memory-budget-gb", type=float, default=None,
                   help="skip grid_sample where its estimated memory exceeds this (default: 85%% of GPU memory, "
                        "8 on the CPU)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the inputs (default 0)")
    p.add_argument("--json", metavar="PATH", help="write every number (and the environment) as JSON")
    p.add_argument("--markdown", metavar="PATH", help="also write the markdown report to PATH")
    p.add_argument("--plot", metavar="PATH", help="PNG bar chart (needs matplotlib)")
    p.add_argument("--plot-metric", choices=("pct_floor", "ms"), default="pct_floor",
                   help="what --plot shows (default: pct_floor)")
    p.add_argument("--quick", action="store_true", help="smoke test: 1 warm-up and 2 timed runs unless given")
    p.add_argument("--no-progress", action="store_true", help="no progress display on stderr")
    p.add_argument("--channels-last", action="store_true",
                   help="every 4-D tensor (frame, per-pixel tensors, output gradient) in channels_last memory format")
    p.add_argument("--deterministic", action="store_true",
                   help="time under torch.use_deterministic_algorithms(True) (the fixed-point input gradient on "
                        "CUDA); implies --no-baseline, since grid_sample's backward has no deterministic CUDA path")
    p.add_argument("--policy", nargs="+", default=[], metavar="KEY=VALUE",
                   help="run under edsc_ext.kernel_policy(KEY=VALUE, ...), e.g. vector_loads=false, to time the "
                        "kernels a switch falls back to (booleans: true/false)")
    return p


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    args.policy = _parse_policy(p, args.policy)
    args.dtypes = [d for item in args.dtypes for d in item.split(",") if d]
    for d in args.dtypes:
        if d not in DTYPES:
            p.error(f"unknown dtype {d!r}; choose from {', '.join(DTYPES)}")
    if args.cases is not None:
        args.cases = [c for item in args.cases for c in item.split(",") if c]
        known = {c.name for c in CASES}
        for c in args.cases:
            if c not in known:
                p.error(f"unknown case {c!r}; choose from {', '.join(sorted(known))}")
    if args.impls is not None:
        args.impls = [i for item in args.impls for i in item.split(",") if i]
        for i in args.impls:
            if i not in IMPLS:
                p.error(f"unknown impl {i!r}; choose from {', '.join(IMPLS[1:])}")
    if args.reps is None:
        args.reps = 2 if args.quick else 20
    if args.warmup is None:
        args.warmup = 1 if args.quick else 5
    if args.reps < 1 or args.warmup < 0:
        p.error("--reps must be >= 1 and --warmup >= 0")
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw[:1] == ["--model"]:
        # The networks end to end, with the arguments that follow.
        from . import networks
        return networks.main(raw[1:])
    if raw[:1] == ["--video"]:
        # The video tool against the network alone.
        from . import video
        return video.main(raw[1:])
    args = _parse(raw)
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("error: --device cuda but no CUDA GPU is available (use --device cpu)", file=sys.stderr)
            return 2
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
        args.no_baseline = True
    env = harness.environment(device, shlex.join([*command().split(), *raw]))
    bandwidth = measure_copy_bandwidth(device, nbytes=(2 ** 26 if args.quick and device.type == "cpu" else None),
                                       warmup=min(args.warmup, 3) or 1, reps=max(3, min(args.reps, 20)))
    with edsc_ext.kernel_policy(**args.policy):
        rows = run(device, dtypes=args.dtypes, cases=args.cases, warmup=args.warmup, reps=args.reps,
                   baseline=not args.no_baseline, memory_budget_gb=args.memory_budget_gb, seed=args.seed,
                   progress=not args.no_progress, copy_bandwidth=bandwidth, channels_last=args.channels_last,
                   impls=None if args.no_baseline or args.impls is None else ["edsc_ext", *args.impls])
    options = ((["deterministic: torch.use_deterministic_algorithms(True)"] if args.deterministic else []) +
               (["memory format: channels_last"] if args.channels_last else []) +
               ([f"kernel policy: {', '.join(f'{k}={v}' for k, v in args.policy.items())}"] if args.policy else []))
    report = to_markdown(rows, _header_lines(env, bandwidth, args.warmup, args.reps, options))
    sys.stdout.write(report)
    sys.stdout.flush()
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "copy_bandwidth": bandwidth, "options": {
                "device": str(device), "dtypes": args.dtypes, "cases": args.cases, "reps": args.reps,
                "warmup": args.warmup, "baseline": not args.no_baseline, "memory_budget_gb": args.memory_budget_gb,
                "seed": args.seed, "deterministic": args.deterministic, "channels_last": args.channels_last,
                "policy": args.policy},
                "cases": [dict(asdict(c), h_in=c.h_in, w_in=c.w_in) for c in
                                              (CPU_CASES if device.type == "cpu" else CASES)
                                              if args.cases is None or c.name in args.cases],
                "rows": rows}, f, indent=1)
    if args.plot:
        plot(rows, args.plot, args.plot_metric)
    failed = [r for r in rows if r["impl"] == "edsc_ext" and r["status"] != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
