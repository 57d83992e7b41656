"""Times the EDSC networks end to end: inference and a training step of EDSC_s and EDSC_m in
each execution variant, against the original code's composition in float32.

    edsc-model-benchmark                      # the issue's sizes, every default variant
    edsc-model-benchmark --models EDSC_s --variants fused-fp16-cl,graph-fp16-cl
    edsc-model-benchmark --device cpu --quick # a smoke run: tiny sizes, eager variants
    edsc-model-benchmark --recipe             # README's recipe, profiled: families, FLOPs, peak share

(``python -m edsc_ext.benchmarks.networks`` or ``edsc-benchmark --model`` run it too.)

A variant is ``PATH-PRECISION[-cl][-gr|-bd|-ph|-pd|-wd|-wg]``:

- PATH: ``unfused`` (``EDSC(fused=False)``, the original's module-by-module composition: the
  baseline), ``fused`` (the default network), ``compiled`` (``torch.compile`` of the fused network;
  its compile time is the ``setup s`` column), ``compiledgraph`` (``torch.compile`` in mode
  "reduce-overhead": the compiled network replayed as CUDA graphs; CUDA only) or ``graph``
  (:meth:`edsc_ext.models.EDSC.capture`: CUDA-graph replay of the fused eager inference; CUDA only,
  inference only; the capture time is ``setup s``);
- PRECISION: ``fp32``, or ``fp16`` / ``bf16`` under autocast (the frames and the sampling stay float32);
- ``cl``: model and frames in channels_last;
- the fused heads' ``head_layout``: ``gr`` grouped, ``bd`` block_diagonal, ``ph`` per_head, ``pd`` padded,
  ``wd`` wide, ``wg`` wide_grouped; none: "auto" (padded on CUDA for inference and under torch.compile,
  per_head otherwise).

``--profile N`` runs each row again under torch.profiler: its kernel time by family (convolutions forward
and backward, inductor's Triton kernels by what they fused, layout conversions, copies, the op...), its N
longest kernels, the FLOPs of one call as the variant runs them (``network_flops``) and the convolutions'
rate against a dense GEMM timed in the same run. Rows replayed as CUDA graphs are profiled as replays
(the profiler traces the kernels of graph launches); where it saw less than half the measured time, the
same inductor code compiled without graphs is profiled instead, and the row says so. ``--recipe`` is
README's speed recipe at every case (compiled and replayed, channels_last, float16 inference, bfloat16
training step), profiled.

A training step is the forward, an L1 loss against a fixed random target and the backward (gradients
set to None before each step); no optimizer step, which is the same for every variant. Under float16
the loss is multiplied by ``--fp16-loss-scale`` before the backward (a static GradScaler: unscaled, the
small gradients underflow). The deviation is against ``unfused-fp32`` on the same weights and frames:
for inference ``max |out - ref| / max |ref|`` of the output, for training ``||g - g_ref|| / ||g_ref||``
of all parameter gradients together. Weights are random (seeded; the offset heads' last biases a few
pixels, so that the sampling is off the pixel grid, where bilinear sampling has no kinks) unless
``--weights`` gives checkpoints; frames are smooth random images (uniform noise at 1/16 of the size,
bilinearly upsampled).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..apps.common import cudnn_autotuning
from ..models import EDSC, MODEL_NAMES, SAMPLINGS, load_checkpoint
from . import harness

__all__ = ["main", "Variant", "parse_variant", "DEFAULT_VARIANTS"]

PATHS = ("unfused", "fused", "compiled", "compiledgraph", "graph")
PRECISIONS = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
BASELINE = "unfused-fp32"
DEFAULT_VARIANTS = (BASELINE, "fused-fp32", "fused-fp32-cl", "fused-fp16", "fused-fp16-cl", "fused-bf16",
                    "fused-bf16-cl", "fused-fp16-cl-bd", "fused-fp16-cl-ph", "compiled-fp32", "compiled-fp16-cl",
                    "compiled-bf16-cl", "compiledgraph-fp16-cl", "compiledgraph-bf16-cl",
                    "graph-fp32", "graph-fp16-cl")
DEFAULT_SIZES = "4x256x256,1x1088x1920,1x2176x3840"
DEFAULT_TRAIN_SIZES = "16x256x256"
# --quick: a smoke run of every eager path (a compile takes minutes on a CPU; ask for one with --variants).
QUICK_SIZES, QUICK_TRAIN_SIZES = "1x32x32", "2x32x32"
QUICK_VARIANTS = (BASELINE, "fused-fp32", "fused-bf16-cl", "graph-fp32")


HEAD_LAYOUT_FLAGS = {"gr": "grouped", "bd": "block_diagonal", "ph": "per_head", "pd": "padded", "wd": "wide",
                     "wg": "wide_grouped"}
# --recipe: README's speed recipe, compiled and replayed as CUDA graphs in channels_last, float16 autocast
# for inference and bfloat16 for the training step (the precision each of them is recommended in).
RECIPE_VARIANTS = ("compiledgraph-fp16-cl", "compiledgraph-bf16-cl")
RECIPE_PRECISION = {"inference": "fp16", "training": "bf16"}
RECIPE_PROFILE_TOP = 10
RECIPE_SIZES = "1x1088x1920,1x2176x3840"


@dataclass(frozen=True)
class Variant:
    name: str
    path: str
    precision: str
    channels_last: bool = False
    head_layout: str = "auto"

    @property
    def autocast_dtype(self) -> Optional[torch.dtype]:
        return PRECISIONS[self.precision]


def parse_variant(name: str) -> Variant:
    """``PATH-PRECISION[-cl][-gr|-bd|-ph|-pd|-wd|-wg]`` (see the module docstring)."""
    parts = name.strip().split("-")
    flags = parts[2:]
    layouts = [HEAD_LAYOUT_FLAGS[f] for f in flags if f in HEAD_LAYOUT_FLAGS]
    if len(parts) < 2 or parts[0] not in PATHS or parts[1] not in PRECISIONS or len(layouts) > 1 or \
            any(f != "cl" and f not in HEAD_LAYOUT_FLAGS for f in flags) or len(set(flags)) != len(flags):
        raise ValueError(f"variant {name!r}: expected PATH-PRECISION[-cl][-gr|-bd|-ph|-pd|-wd|-wg] with PATH one of "
                         f"{PATHS} and PRECISION one of {tuple(PRECISIONS)}")
    if parts[0] == "unfused" and layouts:
        raise ValueError(f"variant {name!r}: gr, bd, ph, pd, wd and wg are layouts of the fused heads")
    return Variant(name.strip(), parts[0], parts[1], "cl" in flags, layouts[0] if layouts else "auto")


@dataclass(frozen=True)
class Case:
    kind: str  # "inference" or "training"
    n: int
    h: int
    w: int

    @property
    def name(self) -> str:
        return f"{self.kind} {self.n}x3x{self.h}x{self.w}"


def parse_sizes(text: str, kind: str, option: str) -> List[Case]:
    """``NxHxW`` or ``Nx3xHxW`` items, comma-separated; H and W multiples of 32."""
    cases = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            numbers = [int(v) for v in item.lower().split("x")]
        except ValueError:
            numbers = []
        if len(numbers) == 4 and numbers[1] == 3:
            numbers = [numbers[0], numbers[2], numbers[3]]
        if len(numbers) != 3 or min(numbers) < 1 or numbers[1] % 32 or numbers[2] % 32:
            raise ValueError(f"{option}: {item!r} is not NxHxW (or Nx3xHxW) with H and W multiples of 32")
        cases.append(Case(kind, *numbers))
    return cases


@dataclass
class Row:
    model: str
    case: str
    variant: str
    status: str = "ok"  # ok, skipped, error
    ms: Optional[float] = None
    per_s: Optional[float] = None
    peak_mib: Optional[float] = None
    setup_s: Optional[float] = None
    deviation: Optional[float] = None
    note: str = ""
    rounds_ms: List[float] = field(default_factory=list)
    # --profile: the kernels (CPU: the aten operators) of one call by self time, as _profile_kernels gives them.
    kernel_ms: Optional[float] = None
    kernels: List[dict] = field(default_factory=list)
    profile_note: str = ""
    # --profile: FLOPs of one call (training: forward and backward) as the variant runs them (padded
    # channels and folded convolutions included), those of the convolutions, and of the original
    # composition (EDSC(fused=False)); the convolution kernels' rate and its share of the GEMM peak.
    flops: Optional[float] = None
    conv_flops: Optional[float] = None
    model_flops: Optional[float] = None
    conv_ms: Optional[float] = None
    conv_tflops: Optional[float] = None
    peak_tflops: Optional[float] = None
    conv_peak_fraction: Optional[float] = None


def _output_deviation(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |a - e| / max |e|."""
    scale = expected.abs().max().item()
    diff = (actual.detach().float() - expected).abs().max().item()
    return diff / scale if scale > 0 else diff


def _gradient_deviation(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], scale: float) -> float:
    """||a / scale - e|| / ||e|| over all the tensors together."""
    diff = sum(torch.linalg.vector_norm(a.detach().double() / scale - e.double()) ** 2
               for a, e in zip(actual, expected))
    norm = sum(torch.linalg.vector_norm(e.double()) ** 2 for e in expected)
    return (diff / norm).sqrt().item() if norm > 0 else diff.sqrt().item()


def _autocast(device: torch.device, dtype: Optional[torch.dtype]):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


class _Inputs:
    """One case's frames, EDSC_m's time (0.5 per sample) and the training target, float32 on the device."""

    def __init__(self, case: Case, device: torch.device, seed: int):
        generator = torch.Generator().manual_seed(seed)

        def smooth_frame():  # like a photograph, not like noise: sampling errors scale with the frame's gradient
            coarse = torch.rand(case.n, 3, max(2, case.h // 16), max(2, case.w // 16), generator=generator)
            return F.interpolate(coarse, size=(case.h, case.w), mode="bilinear", align_corners=False).to(device)

        self.first, self.second, self.target = smooth_frame(), smooth_frame(), smooth_frame()
        self.time = torch.full((case.n,), 0.5, device=device)

    def formatted(self, channels_last: bool):
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        return tuple(x.contiguous(memory_format=fmt) for x in (self.first, self.second, self.target))


def _prepare(model: EDSC, variant: Variant) -> None:
    model.fused = variant.path != "unfused"
    model.head_layout = variant.head_layout
    model.to(memory_format=torch.channels_last if variant.channels_last else torch.contiguous_format)


def _run_variant(model: EDSC, case: Case, inputs: _Inputs, variant: Variant, reference, args,
                 device: torch.device) -> Row:
    row = Row(model.name, case.name, variant.name)
    if variant.path in ("graph", "compiledgraph") and device.type != "cuda":
        row.status, row.note = "skipped", "CUDA graphs need a CUDA device"
        return row
    if variant.path == "graph" and case.kind == "training":
        row.status, row.note = "skipped", "CUDA-graph replay (EDSC.capture) is inference only"
        return row
    _prepare(model, variant)
    first, second, target = inputs.formatted(variant.channels_last)
    time_arg = inputs.time if model.multiple else None

    def forward(first, second, time=None):
        # Autocast entered inside the callable that is compiled: its dtype is then part of the traced
        # graph. Entered outside, only a global state, torch's compile caches (AOTAutograd's, before
        # pytorch/pytorch#181564) handed the graph compiled under float16 to a later bfloat16 compile.
        with _autocast(device, variant.autocast_dtype):
            return model(first, second, time)

    def compiled_net(mode: str) -> Callable:
        compiled = torch.compile(forward, mode=None if mode == "default" else mode, backend=args.compile_backend,
                                 dynamic=False)
        if mode != "reduce-overhead":
            return compiled

        def replayed(first, second, time=None):
            # A new iteration for the CUDA-graph trees: the last call's outputs may be overwritten.
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(first, second, time)
        return replayed

    net: Callable = forward
    if variant.path in ("compiled", "compiledgraph"):
        torch._dynamo.reset()
        mode = "reduce-overhead" if variant.path == "compiledgraph" else args.compile_mode
        row.note = f"torch.compile mode={mode}, backend={args.compile_backend}"
        net = compiled_net(mode)
    captured = None
    loss_scale = args.fp16_loss_scale if variant.autocast_dtype == torch.float16 else 1.0
    if case.kind == "inference":
        model.eval()
    else:
        model.train()
        if loss_scale != 1.0:
            row.note = "; ".join(filter(None, [row.note, f"loss scale {loss_scale:g}"]))
    params = list(model.parameters())

    def make_step(net: Callable) -> Callable[[], object]:
        if case.kind == "inference":
            def step():
                if captured is not None:
                    return captured(first, second, time_arg, copy=False)
                with torch.no_grad():
                    return net(first, second, time_arg)
        else:
            def step():
                for p in params:
                    p.grad = None
                out = net(first, second, time_arg)
                (F.l1_loss(out.float(), target) * loss_scale).backward()
                return [p.grad for p in params]
        return step

    step = make_step(net)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    setup_start = time.perf_counter()
    if variant.path == "graph":
        captured = model.capture(first, second, time_arg, autocast_dtype=variant.autocast_dtype)
        row.note = "EDSC.capture"
    result = step()  # the compiled variants compile here
    harness.synchronize(device)
    if variant.path in ("compiled", "compiledgraph", "graph"):
        row.setup_s = time.perf_counter() - setup_start
    if case.kind == "inference":
        row.deviation = _output_deviation(result, reference[0])
    else:
        row.deviation = _gradient_deviation(result, reference, loss_scale)
    del result
    row.rounds_ms = harness.time_calls(step, device, max(0, args.warmup - 1), args.rounds)
    row.ms = statistics.median(row.rounds_ms)
    row.per_s = case.n * 1e3 / row.ms
    if device.type == "cuda":
        row.peak_mib = torch.cuda.max_memory_allocated(device) / 2 ** 20
    if args.profile:
        row.kernel_ms, row.kernels = _profile_kernels(step, device, args.profile_calls)
        replayed = variant.path in ("compiledgraph", "graph") and device.type == "cuda"
        if replayed:
            row.profile_note = "CUDA-graph replays, their kernels as the profiler (CUPTI) traced them"
        if variant.path == "compiledgraph" and device.type == "cuda" and not profile_complete(row.kernel_ms, row.ms,
                                                                                              row.kernels):
            # The profiler saw too little of the replayed graphs' kernels: the same inductor code
            # compiled without CUDA graphs (mode "default") shows them all (a second compile).
            graphless = make_step(compiled_net("default"))
            graphless()
            row.kernel_ms, row.kernels = _profile_kernels(graphless, device, args.profile_calls)
            row.profile_note = ("the CUDA-graph replays hid kernels from the profiler: profiled the same inductor "
                                "code compiled without CUDA graphs (mode default)")
        add_flop_rates(row, model, case, variant.head_layout, variant.path in ("compiled", "compiledgraph"),
                       args.peak_tflops.get(variant.precision))
    return row


def profile_complete(kernel_ms: Optional[float], ms: Optional[float], kernels: Sequence[dict]) -> bool:
    """Whether a profile of a CUDA call saw its work: kernels adding up to half its measured time at least,
    convolutions among them (a profile of CUDA-graph replays that the profiler could not trace sees none)."""
    if not kernel_ms or not ms:
        return False
    return kernel_ms >= 0.5 * ms and any(k["kind"] in CONVOLUTION_KINDS for k in kernels)


def _is_convolution(op_name: str) -> bool:
    """Whether a FlopCounterMode key is a convolution: aten's, or the networks' fused ``conv2d_relu``."""
    return "convolution" in op_name or op_name.endswith("conv2d_relu")


def network_flops(model: EDSC, case: Case, head_layout: str = "auto", compiled: bool = False,
                  fused: bool = True) -> Dict[str, float]:
    """FLOPs (two per multiply-add) of one call of a network like ``model`` at ``case``'s size, training:
    forward and backward, as it runs on CUDA with ``head_layout`` ("auto" resolved as on CUDA, compiled
    or not) and ``fused`` (False: the original composition): ``{"total": ..., "convolution": ...}``,
    counted by ``torch.utils.flop_counter.FlopCounterMode`` on meta tensors (no device work). Padded
    channels and folded convolutions count: they are the arithmetic the device does."""
    from torch.utils.flop_counter import FlopCounterMode

    from ..models.networks import auto_head_layout

    training = case.kind == "training"
    layout = head_layout if head_layout != "auto" else auto_head_layout("cuda", training, compiled)
    with torch.device("meta"):
        twin = EDSC(kernel_size=model.kernel_size, multiple=model.multiple, sampling=model.sampling,
                    het_p=model.moduleConv1[2].groups, use_bias=model.use_bias, fused=fused, head_layout=layout)
        first, second, target = (torch.empty(case.n, 3, case.h, case.w) for _ in range(3))
        time_arg = torch.full((case.n,), 0.5) if model.multiple else None
    with FlopCounterMode(display=False) as counter:
        if training:
            F.l1_loss(twin(first, second, time_arg), target).backward()
        else:
            with torch.no_grad():
                twin(first, second, time_arg)
    counts = counter.get_flop_counts().get("Global", {})
    return {"total": float(counter.get_total_flops()),
            "convolution": float(sum(v for op, v in counts.items() if _is_convolution(str(op))))}


def add_flop_rates(row: Row, model: EDSC, case: Case, head_layout: str, compiled: bool,
                   peak_tflops: Optional[float]) -> None:
    """Fills ``row``'s FLOPs, its convolution kernels' time and rate, and that rate's share of
    ``peak_tflops`` (the dense GEMM rate measured in the same run)."""
    executed = network_flops(model, case, head_layout, compiled)
    row.flops, row.conv_flops = executed["total"], executed["convolution"]
    row.model_flops = network_flops(model, case, fused=False)["total"]
    conv_ms = sum(k["ms"] for k in row.kernels if k["kind"] in CONVOLUTION_KINDS)
    if conv_ms > 0:
        row.conv_ms = conv_ms
        row.conv_tflops = row.conv_flops / (conv_ms * 1e-3) / 1e12
        if peak_tflops:
            row.peak_tflops = peak_tflops
            row.conv_peak_fraction = row.conv_tflops / peak_tflops


# What a kernel (or, on the CPU, an operator) is: its family, by the first pattern its lower-cased name
# holds. Inductor's Triton kernels are named after every operator they fused (a ReLU after a convolution
# is "triton_poi_fused_convolution_relu_..."), not after what they compute, so they are told apart by
# their own name parts first: templates ("triton_tem_", convolutions and matrix products under
# max-autotune), upsamplings (inductor writes bilinear upsampling as indexed loads, "_unsafe_index"),
# poolings, and the rest, elementwise work with what it fused. Layout conversions (cuDNN's NCHW <-> NHWC
# transposes and channel padding) come before the convolutions, whose patterns are broad.
TRITON_KINDS = (("convolution (Triton template)", ("triton_tem",)),
                ("Triton: upsampling", ("upsample", "unsafe_index")),
                ("Triton: pooling", ("avg_pool", "max_pool")),
                ("Triton: reductions", ("triton_red", "triton_per")))
KERNEL_KINDS = (("edsc_ext op", ("deform_sepconv",)),
                ("layout conversion", ("nchwtonhwc", "nhwctonchw", "nchw2nhwc", "nhwc2nchw", "addpadding",
                                       "transpose")),
                ("convolution, weight gradient", ("wgrad", "convolution_backward_weight")),
                ("convolution, data gradient", ("dgrad", "convolution_backward_input")),
                ("convolution", ("fprop", "implicit_gemm", "conv", "xmma", "cutlass", "gemm")),
                ("upsampling", ("upsample",)),
                ("pooling", ("pool",)),
                ("copies", ("copy", "memcpy", "cat", "pad")),
                ("memset and fill", ("memset", "fill")),
                ("reductions", ("reduce", "sum")))
# The families whose time is convolution arithmetic (the FLOP rate's denominator).
CONVOLUTION_KINDS = ("convolution", "convolution, weight gradient", "convolution, data gradient",
                     "convolution (Triton template)")


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    if "triton" in lowered:
        for kind, patterns in TRITON_KINDS:
            if any(pattern in lowered for pattern in patterns):
                return kind
        return "Triton: elementwise (fused)"
    for kind, patterns in KERNEL_KINDS:
        if any(pattern in lowered for pattern in patterns):
            return kind
    return "elementwise and other"


def _self_time_us(event, on_device: bool) -> float:
    if not on_device:
        return event.self_cpu_time_total
    # self_device_time_total since torch 2.4's profiler rename; self_cuda_time_total before.
    if hasattr(event, "self_device_time_total"):
        return event.self_device_time_total
    return event.self_cuda_time_total


def _profile_kernels(step: Callable[[], object], device: torch.device, calls: int) -> Tuple[float, List[dict]]:
    """torch.profiler over ``calls`` steps: the kernel time of one call (ms) and its kernels (CUDA) or
    aten operators (CPU, self time), each ``{"name", "kind", "ms", "launches"}`` per call, longest first."""
    from torch.profiler import ProfilerActivity, profile

    on_device = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
    harness.synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(calls):
            step()
        harness.synchronize(device)
    kernels = []
    for event in prof.key_averages():
        if on_device != (event.device_type == torch.autograd.DeviceType.CUDA):
            continue
        if not on_device and not event.key.startswith("aten::"):
            continue
        us = _self_time_us(event, on_device)
        if us > 0:
            kernels.append({"name": event.key, "kind": kernel_kind(event.key), "ms": us / calls / 1e3,
                            "launches": event.count / calls})
    kernels.sort(key=lambda k: -k["ms"])
    return sum(k["ms"] for k in kernels), kernels


def _reference(model: EDSC, case: Case, inputs: _Inputs) -> List[torch.Tensor]:
    """unfused-fp32's output (inference) or parameter gradients (training), float32."""
    _prepare(model, parse_variant(BASELINE))
    time_arg = inputs.time if model.multiple else None
    if case.kind == "inference":
        model.eval()
        with torch.no_grad():
            return [model(inputs.first, inputs.second, time_arg).float()]
    model.train()
    for p in model.parameters():
        p.grad = None
    F.l1_loss(model(inputs.first, inputs.second, time_arg), inputs.target).backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    return grads


OFFSET_HEADS = ("moduleOffset1x", "moduleOffset1y", "moduleOffset2x", "moduleOffset2y")


def random_model(name: str, sampling: str, seed: int) -> EDSC:
    """PyTorch's default initialisation from ``seed``, the offset heads' last biases a few pixels."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = EDSC(multiple=name == "EDSC_m", sampling=sampling)
    with torch.no_grad():
        for head in OFFSET_HEADS:
            bias = getattr(model, head)[-1].bias
            bias.copy_(torch.randn(bias.shape, generator=generator) * 2)
    return model


def _device_line(device: torch.device) -> str:
    line = harness.device_description(device)
    if device.type == "cuda":
        tf32 = "on" if torch.backends.cudnn.allow_tf32 else "off"
        tuning = "on" if torch.backends.cudnn.benchmark else "off"
        line += (f", cuDNN {torch.backends.cudnn.version()}, cuDNN TF32 for float32 convolutions: {tf32}, "
                 f"cuDNN autotuning (torch.backends.cudnn.benchmark): {tuning}")
    return line


def _fmt(value: Optional[float], digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _fmt_deviation(value: Optional[float]) -> str:
    return "n/a" if value is None else ("0" if value == 0 else f"{value:.1e}")


def render(meta: dict, rows: Sequence[Row]) -> str:
    lines = ["# EDSC model benchmark", "",
             f"- device: {meta['device']}",
             f"- command: `{meta['command']}`",
             f"- date: {meta['date']}",
             f"- weights: {meta['weights']}; sampling {meta['sampling']!r}",
             f"- timing: median of {meta['rounds']} rounds after {meta['warmup']} warm-up call(s) "
             f"({'CUDA events' if meta['device_type'] == 'cuda' else 'wall clock'})",
             "- training step: forward, L1 loss, backward (gradients set to None first); no optimizer step",
             "- frames/s: interpolated frames (training: samples) per second; peak MiB: "
             "torch.cuda.max_memory_allocated of the variant (weights and frames included)",
             f"- max rel. dev. against {BASELINE}: inference max |out - ref| / max |ref|; training "
             "||g - g_ref|| / ||g_ref|| of all parameter gradients together (float16: the loss scaled by "
             f"{meta['fp16_loss_scale']:g})",
             "- variants: unfused = the original composition; fused = the default network; compiled = "
             "torch.compile of it (setup s: the first call, compile included); compiledgraph = torch.compile "
             "in mode reduce-overhead (CUDA graphs); graph = EDSC.capture replay "
             "(setup s: warm-up and capture); fp16/bf16 = autocast; cl = channels_last; heads gr = grouped, "
             "bd = block-diagonal, ph = per head, pd = padded, wd = wide, wg = wide grouped, none = auto "
             "(padded on CUDA for inference and under torch.compile, per head otherwise)", "",
             "| model | case | variant | ms | frames/s | peak MiB | setup s | max rel. dev. | note |",
             "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r.status != "ok":
            lines.append(f"| {r.model} | {r.case} | {r.variant} | - | - | - | - | - | {r.status}: {r.note} |")
            continue
        lines.append(f"| {r.model} | {r.case} | {r.variant} | {_fmt(r.ms)} | {_fmt(r.per_s, 1)} | "
                     f"{_fmt(r.peak_mib, 0)} | {_fmt(r.setup_s, 1)} | {_fmt_deviation(r.deviation)} | {r.note} |")
    profiled = [r for r in rows if r.kernels]
    if profiled:
        lines += render_profiles(meta, profiled)
    return "\n".join(lines) + "\n"


def _gflop(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value / 1e9:.4g}"


def kind_totals(kernels: Sequence[dict]) -> Dict[str, float]:
    """Milliseconds per kernel family, longest first."""
    totals: Dict[str, float] = {}
    for k in kernels:
        totals[k["kind"]] = totals.get(k["kind"], 0.0) + k["ms"]
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def render_families(rows: Sequence[Row]) -> List[str]:
    """One line per profiled row: its measured time, kernel time, FLOPs, the convolutions' rate and share of
    the GEMM peak, and its kernel time by family (one column each)."""
    families: Dict[str, float] = {}
    for r in rows:
        for kind, ms in kind_totals(r.kernels).items():
            families[kind] = families.get(kind, 0.0) + ms
    order = sorted(families, key=lambda kind: -families[kind])
    lines = ["| model | case | variant | ms | kernel ms | GFLOP as run | GFLOP original | conv ms | conv TFLOP/s | "
             "% of GEMM peak | " + " | ".join(order) + " |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(order)]
    for r in rows:
        totals = kind_totals(r.kernels)
        share = "n/a" if r.conv_peak_fraction is None else f"{100 * r.conv_peak_fraction:.0f}%"
        lines.append(f"| {r.model} | {r.case} | {r.variant} | {_fmt(r.ms)} | {_fmt(r.kernel_ms)} | "
                     f"{_gflop(r.flops)} | {_gflop(r.model_flops)} | {_fmt(r.conv_ms)} | "
                     f"{'n/a' if r.conv_tflops is None else f'{r.conv_tflops:.3g}'} | "
                     f"{share} | " + " | ".join(f"{totals[kind]:.2f}" if kind in totals else "-" for kind in order)
                     + " |")
    return lines


def render_profiles(meta: dict, rows: Sequence[Row]) -> List[str]:
    """The rows' kernel families side by side, then per profiled row: its kernel time by kind, then its
    longest kernels (--profile N of them)."""
    what = "kernels" if meta["device_type"] == "cuda" else "aten operators (self CPU time)"
    peaks = ", ".join(f"{name} {value:.3g} TFLOP/s" for name, value in meta.get("peak_tflops", {}).items())
    lines = ["", f"## Where the time goes (torch.profiler over {meta['profile_calls']} calls; {what}, per call)", "",
             f"- dense GEMM rate measured in this run (the peak the convolutions are compared with): {peaks or 'n/a'}",
             "- GFLOP as run: two per multiply-add of one call (training: forward and backward), counted by "
             "torch.utils.flop_counter on the network as the variant runs it (padded channels, folded "
             "heterogeneous convolutions); original: the original composition (EDSC(fused=False))",
             "- conv TFLOP/s: the convolutions' FLOPs over the convolution kernels' time", "",
             *render_families(rows)]
    for r in rows:
        lines += ["", f"### {r.model} {r.case} {r.variant}: {r.kernel_ms:.2f} ms of {what} a call "
                      f"({_fmt(r.ms)} ms measured)", ""]
        if r.profile_note:
            lines += [f"Profiled: {r.profile_note}.", ""]
        lines += ["| kind | ms | share | launches |", "|---|---:|---:|---:|"]
        kinds: Dict[str, List[dict]] = {}
        for k in r.kernels:
            kinds.setdefault(k["kind"], []).append(k)
        for kind, members in sorted(kinds.items(), key=lambda item: -sum(k["ms"] for k in item[1])):
            ms = sum(k["ms"] for k in members)
            lines.append(f"| {kind} | {ms:.3f} | {100 * ms / r.kernel_ms:.1f}% | "
                         f"{sum(k['launches'] for k in members):g} |")
        lines += ["", "| kernel | kind | ms | launches |", "|---|---|---:|---:|"]
        for k in r.kernels[:meta["profile_top"]]:
            name = k["name"] if len(k["name"]) <= 110 else k["name"][:107] + "..."
            lines.append(f"| `{name.replace('|', '/')}` | {k['kind']} | {k['ms']:.3f} | {k['launches']:g} |")
    return lines


def command() -> str:
    """This benchmark's command as the user typed it: its console script (pyproject.toml) or ``python -m``."""
    return harness.command_name("edsc-model-benchmark", "edsc_ext.benchmarks.networks")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=command(), description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if available, else cpu)")
    parser.add_argument("--models", default=",".join(MODEL_NAMES), help="comma-separated (default: %(default)s)")
    parser.add_argument("--variants", default=None,
                        help="comma-separated PATH-PRECISION[-cl][-gr|-bd|-ph|-pd] (default: "
                             f"{','.join(DEFAULT_VARIANTS)}; --quick: {','.join(QUICK_VARIANTS)})")
    parser.add_argument("--sizes", default=None, help=f"inference NxHxW list (default: {DEFAULT_SIZES}; "
                                                      f"--quick: {QUICK_SIZES}); '' for none")
    parser.add_argument("--train-sizes", default=None, help=f"training-step NxHxW list (default: "
                                                            f"{DEFAULT_TRAIN_SIZES}; --quick: {QUICK_TRAIN_SIZES}); "
                                                            "'' for none")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run: tiny sizes, the variants {','.join(QUICK_VARIANTS)} unless --variants, "
                             "1 warm-up call and 2 rounds: under a minute on a 2-core CPU (20 s idle), where each "
                             "compiled variant would add minutes of compilation per case")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 10; --quick 2)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 3; --quick 1)")
    parser.add_argument("--compile-mode", default="default",
                        help="torch.compile mode of the compiled variants: default, reduce-overhead, "
                             "max-autotune, max-autotune-no-cudagraphs (default: default; the compiledgraph "
                             "variants always take reduce-overhead)")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    parser.add_argument("--fp16-loss-scale", type=float, default=1024.0,
                        help="float16 training: the loss's factor before the backward (default %(default)g)")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="time with torch.backends.cudnn.benchmark on: cuDNN times its algorithms for each "
                             "new convolution shape and keeps the fastest (what a fixed-size frame loop can use)")
    parser.add_argument("--sampling", default="compat", choices=SAMPLINGS,
                        help="the networks' sampling: compat (the original layer, as the released weights expect) "
                             "or clean (centred taps); default compat")
    parser.add_argument("--weights", action="append", default=[], metavar="CHECKPOINT",
                        help="an EDSC_s or EDSC_m checkpoint to time instead of random weights (repeatable)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random weights and frames (default 0)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="after timing each row, run it under torch.profiler and list where its time goes: "
                             "the kernel time by kind and the N longest kernels (CPU: aten operators)")
    parser.add_argument("--profile-calls", type=int, default=3, help="calls profiled per row (default %(default)s)")
    parser.add_argument("--recipe", action="store_true",
                        help="README's speed recipe at every case (--sizes default "
                             f"{RECIPE_SIZES}): --variants (default "
                             f"{','.join(RECIPE_VARIANTS)}) run where their precision is the recipe's for the "
                             "case (float16 inference, bfloat16 training step), profiled (--profile "
                             f"{RECIPE_PROFILE_TOP} unless given): kernel time by family, FLOPs, the convolutions' "
                             "rate against the GEMM peak measured in the same run")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--markdown", default=None, metavar="PATH", help="also write the table to a file")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress line per measured row on stderr (a full run takes minutes: its compiles)")
    return parser


def _progress_line(row: Row, done: int, total: int) -> str:
    if row.status == "ok":
        result = f"{row.ms:.2f} ms" + (f", set-up {row.setup_s:.1f} s" if row.setup_s is not None else "")
    else:
        result = f"{row.status}: {row.note}"
    return f"model_benchmark [{done}/{total}] {row.model} {row.case} {row.variant}: {result}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        models = [name.strip() for name in args.models.split(",") if name.strip()]
        for name in models:
            if name not in MODEL_NAMES:
                raise ValueError(f"--models: {name!r} is not one of {MODEL_NAMES}")
        default_variants = RECIPE_VARIANTS if args.recipe else QUICK_VARIANTS if args.quick else DEFAULT_VARIANTS
        names = args.variants if args.variants is not None else ",".join(default_variants)
        variants = [parse_variant(v) for v in names.split(",") if v.strip()]
        sizes = args.sizes if args.sizes is not None else (
            RECIPE_SIZES if args.recipe else QUICK_SIZES if args.quick else DEFAULT_SIZES)
        train_sizes = args.train_sizes if args.train_sizes is not None else (
            QUICK_TRAIN_SIZES if args.quick else DEFAULT_TRAIN_SIZES)
        cases = parse_sizes(sizes, "inference", "--sizes") + parse_sizes(train_sizes, "training", "--train-sizes")
    except ValueError as e:
        parser.error(str(e))
    args.rounds = args.rounds if args.rounds is not None else (2 if args.quick else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    if args.rounds < 1 or args.warmup < 1:
        parser.error(f"--rounds and --warmup must be at least 1, got {args.rounds} and {args.warmup}")
    if args.recipe and args.profile == 0:
        args.profile = RECIPE_PROFILE_TOP
    if args.profile < 0 or args.profile_calls < 1:
        parser.error(f"--profile must be at least 0 and --profile-calls at least 1, got {args.profile} and "
                     f"{args.profile_calls}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available")

    with cudnn_autotuning(args.cudnn_benchmark):
        return _run(args, models, variants, cases, device, argv)


def _run(args, models, variants, cases, device, argv) -> int:
    checkpoints: Dict[str, EDSC] = {}
    for path in args.weights:
        loaded = load_checkpoint(path, sampling=args.sampling)
        checkpoints[loaded.name] = loaded
    meta = {"device": _device_line(device), "device_type": device.type,
            "command": shlex.join([*command().split(), *(sys.argv[1:] if argv is None else argv)]),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "weights": ", ".join(args.weights) if args.weights else f"random (seed {args.seed})",
            "sampling": args.sampling, "rounds": args.rounds, "warmup": args.warmup,
            "fp16_loss_scale": args.fp16_loss_scale, "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "profile_top": args.profile, "profile_calls": args.profile_calls, "recipe": args.recipe,
            "torch": torch.__version__}
    runs = [(case, variant) for case in cases for variant in variants
            if not args.recipe or variant.precision == RECIPE_PRECISION[case.kind]]
    args.peak_tflops = {}
    if args.profile:
        for precision in dict.fromkeys(variant.precision for _, variant in runs):
            args.peak_tflops[precision] = harness.matmul_peak_tflops(device, PRECISIONS[precision] or torch.float32)
    meta["peak_tflops"] = args.peak_tflops
    rows: List[Row] = []
    total = len(models) * len(runs)
    for name in models:
        if name in checkpoints:
            model = checkpoints[name]
        else:
            model = random_model(name, args.sampling, args.seed)
        model = model.to(device)
        for index, case in enumerate(cases):
            inputs = _Inputs(case, device, args.seed + index)
            reference = _reference(model, case, inputs)
            for variant in (variant for run_case, variant in runs if run_case is case):
                try:
                    row = _run_variant(model, case, inputs, variant, reference, args, device)
                except Exception as e:  # one failing variant (out of memory, a compile error) leaves the others
                    message = str(e).strip().splitlines()[0] if str(e).strip() else ""
                    row = Row(model.name, case.name, variant.name, status="error",
                              note=f"{type(e).__name__}: {message}"[:200])
                rows.append(row)
                if not args.quiet:
                    print(_progress_line(row, len(rows), total), file=sys.stderr, flush=True)
                harness.free_memory(device)
            del inputs, reference
            harness.free_memory(device)
        _prepare(model, parse_variant("fused-fp32"))
        del model
        harness.free_memory(device)
    table = render(meta, rows)
    print(table, end="")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "cases": [{"name": c.name, **asdict(c)} for c in cases],
                       "variants": [asdict(v) for v in variants], "rows": [asdict(r) for r in rows]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
