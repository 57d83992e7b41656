"""Times the EDSC networks end to end: inference and a training step of EDSC_s and EDSC_m in
each execution variant, against the original code's composition in float32.

    edsc-model-benchmark                      # the issue's sizes, every default variant
    edsc-model-benchmark --models EDSC_s --variants fused-fp16-cl,graph-fp16-cl
    edsc-model-benchmark --device cpu --quick # a smoke run: tiny sizes, eager variants

(``python -m edsc_ext.benchmarks.networks`` or ``edsc-benchmark --model`` run it too.)

A variant is ``PATH-PRECISION[-cl][-gr|-bd|-ph|-pd]``:

- PATH: ``unfused`` (``EDSC(fused=False)``, the original's module-by-module composition: the
  baseline), ``fused`` (the default network), ``compiled`` (``torch.compile`` of the fused network;
  its compile time is the ``setup s`` column), ``compiledgraph`` (``torch.compile`` in mode
  "reduce-overhead": the compiled network replayed as CUDA graphs; CUDA only) or ``graph``
  (:meth:`edsc_ext.models.EDSC.capture`: CUDA-graph replay of the fused eager inference; CUDA only,
  inference only; the capture time is ``setup s``);
- PRECISION: ``fp32``, or ``fp16`` / ``bf16`` under autocast (the frames and the sampling stay float32);
- ``cl``: model and frames in channels_last;
- the fused heads' ``head_layout``: ``gr`` grouped, ``bd`` block_diagonal, ``ph`` per_head, ``pd`` padded;
  none: "auto" (padded on CUDA for inference and under torch.compile, per_head otherwise).

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


HEAD_LAYOUT_FLAGS = {"gr": "grouped", "bd": "block_diagonal", "ph": "per_head", "pd": "padded"}


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
    """``PATH-PRECISION[-cl][-gr|-bd|-ph|-pd]`` (see the module docstring)."""
    parts = name.strip().split("-")
    flags = parts[2:]
    layouts = [HEAD_LAYOUT_FLAGS[f] for f in flags if f in HEAD_LAYOUT_FLAGS]
    if len(parts) < 2 or parts[0] not in PATHS or parts[1] not in PRECISIONS or len(layouts) > 1 or \
            any(f != "cl" and f not in HEAD_LAYOUT_FLAGS for f in flags) or len(set(flags)) != len(flags):
        raise ValueError(f"variant {name!r}: expected PATH-PRECISION[-cl][-gr|-bd|-ph|-pd] with PATH one of {PATHS} "
                         f"and PRECISION one of {tuple(PRECISIONS)}")
    if parts[0] == "unfused" and layouts:
        raise ValueError(f"variant {name!r}: gr, bd, ph and pd are layouts of the fused heads")
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

    net: Callable = forward
    if variant.path in ("compiled", "compiledgraph"):
        torch._dynamo.reset()
        mode = "reduce-overhead" if variant.path == "compiledgraph" else args.compile_mode
        compiled = torch.compile(forward, mode=None if mode == "default" else mode, backend=args.compile_backend,
                                 dynamic=False)
        row.note = f"torch.compile mode={mode}, backend={args.compile_backend}"
        net = compiled
        if variant.path == "compiledgraph":
            def net(first, second, time=None):
                # A new iteration for the CUDA-graph trees: the last call's outputs may be overwritten.
                torch.compiler.cudagraph_mark_step_begin()
                return compiled(first, second, time)
    captured = None
    if case.kind == "inference":
        model.eval()

        def step():
            if captured is not None:
                return captured(first, second, time_arg, copy=False)
            with torch.no_grad():
                return net(first, second, time_arg)
    else:
        model.train()
        params = list(model.parameters())
        loss_scale = args.fp16_loss_scale if variant.autocast_dtype == torch.float16 else 1.0
        if loss_scale != 1.0:
            row.note = "; ".join(filter(None, [row.note, f"loss scale {loss_scale:g}"]))

        def step():
            for p in params:
                p.grad = None
            out = net(first, second, time_arg)
            (F.l1_loss(out.float(), target) * loss_scale).backward()
            return [p.grad for p in params]
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
    return row


# What a kernel (or, on the CPU, an operator) is, by the first pattern its lower-cased name holds.
# Triton's come first: inductor names them after every operator they fused (a ReLU after a
# convolution is "triton_poi_fused_convolution_relu_..."), not after what they compute.
KERNEL_KINDS = (("Triton (inductor)", ("triton",)),
                ("edsc_ext op", ("deform_sepconv",)),
                ("convolution, weight gradient", ("wgrad", "convolution_backward_weight")),
                ("convolution, data gradient", ("dgrad", "convolution_backward_input")),
                ("convolution", ("fprop", "implicit_gemm", "conv", "xmma", "cutlass", "gemm")),
                ("upsampling", ("upsample",)),
                ("pooling", ("pool",)),
                ("layout and copies", ("copy", "nchwtonhwc", "nhwctonchw", "transpose", "cat", "pad")),
                ("reductions", ("reduce", "sum")))


def kernel_kind(name: str) -> str:
    lowered = name.lower()
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
             "bd = block-diagonal, ph = per head, pd = padded, none = auto (padded on CUDA for inference and "
             "under torch.compile, per head otherwise)", "",
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


def render_profiles(meta: dict, rows: Sequence[Row]) -> List[str]:
    """Per profiled row: its kernel time by kind, then its longest kernels (--profile N of them)."""
    what = "kernels" if meta["device_type"] == "cuda" else "aten operators (self CPU time)"
    lines = ["", f"## Where the time goes (torch.profiler over {meta['profile_calls']} calls; {what}, per call)"]
    for r in rows:
        lines += ["", f"### {r.model} {r.case} {r.variant}: {r.kernel_ms:.2f} ms of {what} a call "
                      f"({_fmt(r.ms)} ms measured)", "",
                  "| kind | ms | share | launches |", "|---|---:|---:|---:|"]
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
        names = args.variants if args.variants is not None else ",".join(QUICK_VARIANTS if args.quick else
                                                                          DEFAULT_VARIANTS)
        variants = [parse_variant(v) for v in names.split(",") if v.strip()]
        sizes = args.sizes if args.sizes is not None else (QUICK_SIZES if args.quick else DEFAULT_SIZES)
        train_sizes = args.train_sizes if args.train_sizes is not None else (
            QUICK_TRAIN_SIZES if args.quick else DEFAULT_TRAIN_SIZES)
        cases = parse_sizes(sizes, "inference", "--sizes") + parse_sizes(train_sizes, "training", "--train-sizes")
    except ValueError as e:
        parser.error(str(e))
    args.rounds = args.rounds if args.rounds is not None else (2 if args.quick else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    if args.rounds < 1 or args.warmup < 1:
        parser.error(f"--rounds and --warmup must be at least 1, got {args.rounds} and {args.warmup}")
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
            "profile_top": args.profile, "profile_calls": args.profile_calls,
            "torch": torch.__version__}
    rows: List[Row] = []
    total = len(models) * len(cases) * len(variants)
    for name in models:
        if name in checkpoints:
            model = checkpoints[name]
        else:
            model = random_model(name, args.sampling, args.seed)
        model = model.to(device)
        for index, case in enumerate(cases):
            inputs = _Inputs(case, device, args.seed + index)
            reference = _reference(model, case, inputs)
            for variant in variants:
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
