"""Candidate speed-ups of the EDSC networks (issue #43), timed in one run against today's recipe.

    python3 tools/network_variants.py --out DIR                     # the default plan: about 6 min on an H200
    python3 tools/network_variants.py --out DIR --models EDSC_s --cases 1080p --variants compiled:base,compiled:wide
    python3 tools/network_variants.py --out DIR --device cpu --cases tiny --variants eager:base,eager:wide   # smoke

A variant is ``PATH:OPTION[+OPTION...]``. PATH: ``compiled`` (README's recipe, :func:`edsc_ext.models.compile_edsc`:
torch.compile of a function entering autocast, replayed as CUDA graphs), ``graph`` (``EDSC.capture``: the eager
network replayed as a CUDA graph, no compiler: a cheap screen of what changes the kernels) or ``eager``. OPTIONs
(each an explicit argument of the model or of the recipe):

- ``base``: the recipe before issue #43 (padded heads, every option off); ``default``: the model's defaults;
- ``wide`` / ``widegrp`` / ``grouped`` / ``perhead`` / ``padded``: ``EDSC(head_layout=...)``: "wide", "wide_grouped",
  "grouped", "per_head", "padded";
- ``halfup``: ``EDSC(half_upsampling=True)``; ``convrelu``: ``EDSC(conv_relu=True)`` (inference);
  ``cache``: ``EDSC(cache_weights=True)`` (eager inference, graph replays); ``extup`` / ``atenup``:
  ``EDSC(upsampling_kernel="edsc_ext")`` / ``"aten"`` (``default+atenup``: the defaults with ATen's upsampling);
  ``extpool`` / ``atenpool``: ``EDSC(pooling_kernel="edsc_ext")`` / ``"aten"``; ``pertails`` / ``narrowtails`` /
  ``mergedtails``: ``EDSC(head_tails="per_head")`` / ``"merged_narrow"`` / ``"merged"``;
- ``bench``: cuDNN autotuning (``cudnn_benchmark=True`` of compile_edsc / EDSC.capture, the training step's
  backward included); ``freeze``: ``compile_edsc(freezing=True)`` (inference); ``autotune``:
  ``compile_edsc(max_autotune=True)`` (minutes of compile: not in the default plan);
- ``core``: ``wide+halfup+bench``; ``all``: ``core+convrelu+freeze`` (``graph``/``eager``: ``cache`` instead of
  ``freeze``); where an option does not apply (training: convrelu, cache, freeze) it is left out and the row says
  so.

Cases: ``1080p`` (1x3x1088x1920 inference), ``4k`` (1x3x2176x3840), ``train`` (a training step, 16x3x256x256:
forward, L1 loss, backward), ``tiny`` and ``tinytrain`` (1x3x64x64, 2x3x64x64: CPU smoke runs). Inference runs in
float16 autocast and the training step in bfloat16 (README's recipe; ``--inference-dtype``, ``--train-dtype``),
model and frames in channels_last. Each row: the median of ``--rounds`` timed calls after warm-up (CUDA events),
the first call's time (the compile, or warm-up and capture: cold, inductor's caches off unless ``--warm-caches``),
the peak memory (``torch.cuda.max_memory_allocated`` from before the first call), and the deviation from float32
(the original composition, TF32 off): inference max |out - ref| / max |ref|, training ||g - g_ref|| / ||g_ref||
over all parameter gradients; "dev / base" divides it by the base variant's of the same path and case (the tests
allow twice plus rounding). ``--profile`` variants also get their kernel time by family, FLOPs and the convolutions'
share of the fp16/bf16 GEMM rate measured in the same run (edsc_ext.benchmarks.networks); compiled rows (cold)
also say what inductor's generated code runs: Triton launches, extern convolutions, custom ops, the 4-D buffers
that are not channels_last (a layout conversion inside the network) and the kernels that only move data.

Without ``--models``, ``--cases`` and ``--variants`` the default plan runs (PLAN, in priority order; what would
overrun ``--budget-s`` by its estimated time is skipped and listed). Writes DIR/variants.json and DIR/variants.md,
and prints a short table last.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import re
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from edsc_ext.benchmarks import harness
from edsc_ext.benchmarks import networks as bench
from edsc_ext.models import EDSC, MODEL_NAMES, compile_edsc, cudnn_autotuning

PATHS = ("compiled", "graph", "eager")
MODEL_OPTIONS = {"wide": {"head_layout": "wide"}, "widegrp": {"head_layout": "wide_grouped"},
                 "grouped": {"head_layout": "grouped"}, "perhead": {"head_layout": "per_head"},
                 "padded": {"head_layout": "padded"}, "halfup": {"half_upsampling": True},
                 "convrelu": {"conv_relu": True}, "cache": {"cache_weights": True},
                 "extup": {"upsampling_kernel": "edsc_ext"}, "atenup": {"upsampling_kernel": "aten"},
                 "extpool": {"pooling_kernel": "edsc_ext"}, "atenpool": {"pooling_kernel": "aten"},
                 "pertails": {"head_tails": "per_head"}, "narrowtails": {"head_tails": "merged_narrow"},
                 "mergedtails": {"head_tails": "merged"}}
RECIPE_OPTIONS = {"bench": "cudnn_benchmark", "freeze": "freezing", "autotune": "max_autotune"}
# "core": the options that change no kernel's numerics class and run on every path and case; "all": core and
# the inference-only ones (cuDNN's fused convolution + ReLU, freezing or kept weights).
CORE = ("wide", "halfup", "bench")
ALL = {"compiled": CORE + ("convrelu", "freeze"), "graph": CORE + ("convrelu", "cache"),
       "eager": CORE + ("convrelu", "cache")}
INFERENCE_ONLY = ("convrelu", "cache", "freeze")  # no gradients: the model or the compiler leaves them out
CASES = {"1080p": bench.Case("inference", 1, 1088, 1920), "4k": bench.Case("inference", 1, 2176, 3840),
         "train": bench.Case("training", 16, 256, 256), "tiny": bench.Case("inference", 1, 64, 64),
         "tinytrain": bench.Case("training", 2, 64, 64)}
# The targets on the H200 (ms), first-call limits (s) and peak-memory limits (MiB).
TARGET_MS = {"1080p": 6.0, "4k": 22.0, "train": 14.0}
FIRST_CALL_LIMIT_S = {"1080p": 25.0, "train": 52.0}
PEAK_LIMIT_MIB = {"1080p": 3.0e9 / 2 ** 20, "4k": 12e9 / 2 ** 20}
# Estimated seconds of a row (compile, capture, timing) on the H200, for --budget-s.
ESTIMATE_S = {("compiled", "1080p"): 28, ("compiled", "4k"): 32, ("compiled", "train"): 70,
              ("graph", "1080p"): 3, ("graph", "4k"): 6, ("eager", "1080p"): 3, ("eager", "4k"): 6,
              ("eager", "train"): 5}
# The default plan, in priority order: the cheap graph screen of every option at 1080p (which also shows any
# option that fails), today's recipe against "core" and "all" at 1080p, against "all" at 4K, EDSC_m, the
# training step's options, then what separates the options further (dropped first when the budget runs out).
PLAN: Tuple[Tuple[str, str, str], ...] = (
    *(("EDSC_s", "1080p", f"graph:{v}") for v in ("base", "halfup", "cache", "bench", "wide", "widegrp", "grouped",
                                                  "perhead", "convrelu", "all")),
    ("EDSC_s", "1080p", "compiled:base"), ("EDSC_s", "1080p", "compiled:core"), ("EDSC_s", "1080p", "compiled:all"),
    ("EDSC_s", "4k", "compiled:base"), ("EDSC_s", "4k", "compiled:all"),
    ("EDSC_m", "1080p", "compiled:all"), ("EDSC_m", "4k", "compiled:all"),
    ("EDSC_s", "train", "compiled:base"), ("EDSC_s", "train", "compiled:core"),
    ("EDSC_s", "4k", "compiled:core"), ("EDSC_s", "1080p", "compiled:core+convrelu"),
    ("EDSC_s", "1080p", "compiled:wide"),
)
# Profiled where they run: the compiled recipe's before and after, and the screen's base against the grouped
# heads (which measured slower: the profile says where).
PROFILED = ("compiled:base", "compiled:core", "compiled:all", "graph:base", "graph:grouped")
DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Variant:
    name: str
    path: str
    options: Tuple[str, ...]

    def applicable(self, case: bench.Case) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
        """The options that act on ``case``, and those left out (inference-only ones in training)."""
        if case.kind == "inference":
            return self.options, ()
        return (tuple(o for o in self.options if o not in INFERENCE_ONLY),
                tuple(o for o in self.options if o in INFERENCE_ONLY))


def parse_variant(text: str) -> Variant:
    name = text.strip()
    path, _, rest = name.partition(":")
    if path not in PATHS or not rest:
        raise ValueError(f"variant {name!r}: expected PATH:OPTION[+OPTION...] with PATH one of {PATHS}")
    options: List[str] = []
    for option in rest.split("+"):
        if option == "base":
            continue
        if option == "default":
            options.insert(0, option)
            continue
        if option == "all":
            options += ALL[path]
        elif option == "core":
            options += CORE
        elif option in MODEL_OPTIONS or option in RECIPE_OPTIONS:
            options.append(option)
        else:
            raise ValueError(f"variant {name!r}: unknown option {option!r} (known: base, core, all, "
                             f"{', '.join([*MODEL_OPTIONS, *RECIPE_OPTIONS])})")
    layouts = [o for o in options if "head_layout" in MODEL_OPTIONS.get(o, {})]
    if len(set(layouts)) > 1:
        raise ValueError(f"variant {name!r}: more than one head layout ({', '.join(layouts)})")
    if path != "compiled" and any(o in ("freeze", "autotune") for o in options):
        raise ValueError(f"variant {name!r}: freeze and autotune are options of the compiled path")
    return Variant(name, path, tuple(dict.fromkeys(options)))


@dataclass
class Row:
    model: str
    case: str
    variant: str
    status: str = "ok"  # ok, skipped, error
    note: str = ""
    ms: Optional[float] = None
    min_ms: Optional[float] = None
    first_call_s: Optional[float] = None
    peak_mib: Optional[float] = None
    deviation: Optional[float] = None
    deviation_vs_base: Optional[float] = None
    target_ms: Optional[float] = None
    rounds_ms: List[float] = field(default_factory=list)
    profile: Optional[dict] = None
    code: Optional[dict] = None  # compiled rows: what inductor's generated code does (code_stats)


COPY_ONLY_OPS = {"clone", "_to_copy", "copy", "cat", "constant_pad_nd", "slice", "view", "permute", "expand",
                 "select", "unsqueeze", "squeeze", "split", "zeros", "new_zeros", "full", "empty"}


def code_stats(sources: Sequence[str]) -> dict:
    """What inductor's generated code (the sources of ``run_and_get_code``) runs a call: its kernel launches,
    extern convolutions and custom ops, the 4-D buffers it allocates that are not channels_last (a layout
    conversion inside the network shows as one), and its Triton kernels that only move data (clone, cast,
    concatenation, padding)."""
    stats = {"graphs": len(sources), "triton_launches": 0, "convolutions": 0, "custom_ops": 0,
             "buffers_4d": 0, "buffers_not_channels_last": [], "weights_not_channels_last": 0,
             "copy_only_kernels": []}
    buffer = re.compile(r"empty_strided_\w+\(\((\d+), (\d+), (\d+), (\d+)\), \((\d+), (\d+), (\d+), (\d+)\)")
    for source in sources:
        call = source[source.find("def call("):] if "def call(" in source else source
        call = "\n".join(line for line in call.splitlines() if not line.lstrip().startswith("#"))
        stats["triton_launches"] += len(re.findall(r"^\s+(triton_\w+)\.run\(", call, re.M))
        stats["convolutions"] += len(re.findall(r"(extern_kernels\.convolution|aten\.convolution\.default)\(", call))
        stats["custom_ops"] += len(re.findall(r"torch\.ops\.(?!aten\.)\w+\.\w+\.default\(", call))
        for match in buffer.finditer(call):
            n, c, h, w, _, channel_stride, _, _ = map(int, match.groups())
            stats["buffers_4d"] += 1
            if c > 1 and h * w > 1 and channel_stride != 1:
                if (h, w) == (3, 3) and n >= 3:  # a convolution's weight made in the call (folded, padded)
                    stats["weights_not_channels_last"] += 1
                else:
                    stats["buffers_not_channels_last"].append(match.group(0)[match.group(0).index("(") + 1:])
        for name in set(re.findall(r"^\s+(triton_\w+)\.run\(", call, re.M)):
            fused = re.sub(r"^triton_(poi|red|per)_fused_?|_\d+$", "", name)
            ops = [op for op in re.split(r"_(?=[a-z])", fused) if op]
            if ops and set(ops) <= COPY_ONLY_OPS | {"to", "nd", "pad", "constant", "new"}:
                stats["copy_only_kernels"].append(name)
    stats["buffers_not_channels_last"] = stats["buffers_not_channels_last"][:20]
    return stats


def release_compiled() -> None:
    """Drops every compiled graph and the CUDA-graph trees' memory pools, so that the next row's peak memory
    is its own."""
    torch._dynamo.reset()
    try:
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees
    except ImportError:  # a torch without them
        return
    reset_cudagraph_trees()


def _apply(model, options: Sequence[str]) -> None:
    """The model as ``options`` say: "base" is the recipe before issue #43 (padded heads, every option off),
    "default" the model's defaults (the DEFAULT_* constants of edsc_ext.models.networks)."""
    if "default" in options:
        defaults = EDSC()
        model.head_layout, model.half_upsampling, model.conv_relu, model.cache_weights = (
            defaults.head_layout, defaults.half_upsampling, defaults.conv_relu, defaults.cache_weights)
        model.upsampling_kernel, model.pooling_kernel = defaults.upsampling_kernel, defaults.pooling_kernel
        model.head_tails = defaults.head_tails
    else:
        model.head_layout, model.half_upsampling, model.conv_relu, model.cache_weights = "padded", False, False, False
        model.upsampling_kernel = model.pooling_kernel = "aten"
        model.head_tails = "per_head"
    for option in options:
        for key, value in MODEL_OPTIONS.get(option, {}).items():
            setattr(model, key, value)


class References:
    """The float32 original composition's output (inference) or parameter gradients (training) per model
    and case, TF32 off, computed once."""

    def __init__(self, device: torch.device):
        self.device = device
        self.values: Dict[Tuple[str, str], list] = {}

    def get(self, model, case_name: str, inputs) -> list:
        key = (model.name, case_name)
        if key not in self.values:
            saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
            _apply(model, ())
            model.fused = False
            try:
                self.values[key] = bench._reference(model, CASES[case_name], inputs)  # in contiguous format
            finally:
                model.fused = True
                model.to(memory_format=torch.channels_last)
                torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
        return self.values[key]


def run_row(model, case_name: str, variant: Variant, inputs, reference, args, device) -> Row:
    case = CASES[case_name]
    row = Row(model.name, case_name, variant.name, target_ms=TARGET_MS.get(case_name))
    cuda = device.type == "cuda"
    if variant.path == "graph" and not cuda:
        row.status, row.note = "skipped", "CUDA graphs need a CUDA device"
        return row
    if variant.path == "graph" and case.kind == "training":
        row.status, row.note = "skipped", "EDSC.capture is inference only"
        return row
    options, left_out = variant.applicable(case)
    if left_out:
        row.note = f"left out in training: {'+'.join(left_out)}"
    _apply(model, options)
    recipe = {RECIPE_OPTIONS[o]: True for o in options if o in RECIPE_OPTIONS}
    dtype = DTYPES[args.inference_dtype if case.kind == "inference" else args.train_dtype]
    first, second, target = inputs.formatted(channels_last=True)
    time_arg = inputs.time if model.multiple else None
    bench_on = recipe.get("cudnn_benchmark", False)

    def autocast():
        return torch.autocast(device.type, dtype=dtype or torch.float16, enabled=dtype is not None)

    captured = None
    if variant.path == "compiled":
        release_compiled()
        net: Callable = compile_edsc(model, dtype, cuda_graphs=cuda, **recipe)
    else:
        def net(first, second, time=None):
            with autocast():
                return model(first, second, time)

    params = list(model.parameters())
    if case.kind == "inference":
        model.eval()

        def step():
            with cudnn_autotuning(bench_on), torch.no_grad():
                if captured is not None:
                    return captured(first, second, time_arg, copy=False)
                return net(first, second, time_arg)
    else:
        model.train()

        def step():
            with cudnn_autotuning(bench_on):  # the backward's convolutions too
                for p in params:
                    p.grad = None
                F.l1_loss(net(first, second, time_arg).float(), target).backward()
                return [p.grad for p in params]

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    caches = torch._inductor.config.patch(force_disable_caches=True) if not args.warm_caches else \
        contextlib.nullcontext()
    start = time.perf_counter()
    with caches:
        if variant.path == "graph":
            captured = model.capture(first, second, time_arg, autocast_dtype=dtype, cudnn_benchmark=bench_on)
        if variant.path == "compiled" and not args.warm_caches:  # a cold compile generates all its code
            from torch._inductor.utils import run_and_get_code

            result, sources = run_and_get_code(step)
            row.code = code_stats(sources)
        else:
            result = step()
        harness.synchronize(device)
    row.first_call_s = time.perf_counter() - start
    if case.kind == "inference":
        row.deviation = bench._output_deviation(result, reference[0])
    else:
        row.deviation = bench._gradient_deviation(result, reference, 1.0)
    del result
    rounds = args.rounds if case.kind == "inference" else max(1, args.rounds // 2)
    row.rounds_ms = harness.time_calls(step, device, args.warmup, rounds)
    row.ms, row.min_ms = statistics.median(row.rounds_ms), min(row.rounds_ms)
    if cuda:
        row.peak_mib = torch.cuda.max_memory_allocated(device) / 2 ** 20
    if variant.name in args.profile:
        profiled = bench.Row(model.name, case.name, variant.name, ms=row.ms)
        profiled.kernel_ms, profiled.kernels = bench._profile_kernels(step, device, args.profile_calls)
        complete = bench.profile_complete(profiled.kernel_ms, row.ms, profiled.kernels) if cuda else True
        profiled.profile_note = ("CUDA-graph replays, kernels as the profiler traced them" if cuda and
                                 variant.path != "eager" else "")
        if not complete:
            profiled.profile_note += ("; INCOMPLETE: the kernels add up to less than half the measured time "
                                      "(edsc-model-benchmark --recipe profiles without graphs then)")
        layout = next((MODEL_OPTIONS[o]["head_layout"] for o in options if "head_layout" in MODEL_OPTIONS.get(o, {})),
                      "auto")
        bench.add_flop_rates(profiled, model, case, layout, variant.path == "compiled",
                             args.peak_tflops.get(dtype or torch.float32))
        row.profile = asdict(profiled)
    return row


def _fmt(value: Optional[float], digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _dev(value: Optional[float]) -> str:
    return "-" if value is None else ("0" if value == 0 else f"{value:.1e}")


def _checks(row: Row) -> str:
    """The issue's limits this row misses or meets: target time, first call, peak memory."""
    if row.status != "ok":
        return ""
    marks = [] if row.deviation is not None and math.isfinite(row.deviation) else ["OUTPUT NOT FINITE"]
    if row.target_ms is not None:
        marks.append(f"{'meets' if row.ms <= row.target_ms else 'misses'} <= {row.target_ms:g} ms")
    limit = FIRST_CALL_LIMIT_S.get(row.case)
    if limit is not None and row.variant.startswith("compiled") and row.first_call_s > limit:
        marks.append(f"first call over {limit:g} s")
    limit = PEAK_LIMIT_MIB.get(row.case)
    if limit is not None and row.peak_mib is not None and row.peak_mib > limit:
        marks.append(f"peak over {limit / 1024:.1f} GiB")
    return "; ".join(marks)


def short_table(rows: Sequence[Row]) -> List[str]:
    lines = ["| model | case | variant | ms | peak MiB | first call s | rel. dev. | dev / base | check | note |",
             "|---|---|---|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        if r.status != "ok":
            lines.append(f"| {r.model} | {r.case} | {r.variant} | - | - | - | - | - | | {r.status}: {r.note} |")
            continue
        lines.append(f"| {r.model} | {r.case} | {r.variant} | {_fmt(r.ms)} | {_fmt(r.peak_mib, 0)} | "
                     f"{_fmt(r.first_call_s, 1)} | {_dev(r.deviation)} | {_fmt(r.deviation_vs_base, 2)} | "
                     f"{_checks(r)} | {r.note} |")
    return lines


def _precision(name: str) -> str:
    return "in float32" if name == "fp32" else f"under {name} autocast"


def render(meta: dict, rows: Sequence[Row]) -> str:
    lines = ["# EDSC: issue #43's variants", "", f"- device: {meta['device']}", f"- command: `{meta['command']}`",
             f"- date: {meta['date']}; torch {meta['torch']}; random weights (seed {meta['seed']}), sampling compat",
             f"- inference {_precision(meta['inference_dtype'])}, training step {_precision(meta['train_dtype'])}, "
             f"model and frames channels_last; ms: median of the timed rounds ({meta['clock']}); first call: compile "
             f"(or warm-up and capture), inductor's caches {'on' if meta['warm_caches'] else 'off'}; rel. dev.: "
             "against the float32 original composition (TF32 off); dev / base: over the base variant's",
             "- dense GEMM rate in this run: "
             + ", ".join(f"{k} {v:.3g} TFLOP/s" for k, v in meta["peak_tflops"].items()), "",
             *short_table(rows)]
    profiled = [bench.Row(**r.profile) for r in rows if r.profile]
    if profiled:
        lines += ["", "## Where the time goes (profiled variants)", "", *bench.render_families(profiled)]
        for p in profiled:
            lines += ["", f"### {p.model} {p.case} {p.variant}: {_fmt(p.kernel_ms)} ms of kernels a call "
                          f"({_fmt(p.ms)} ms measured){'; ' + p.profile_note if p.profile_note else ''}", "",
                      "| kernel | kind | ms | launches |", "|---|---|---:|---:|"]
            for k in p.kernels[:12]:
                name = k["name"] if len(k["name"]) <= 110 else k["name"][:107] + "..."
                lines.append(f"| `{name.replace('|', '/')}` | {k['kind']} | {k['ms']:.3f} | {k['launches']:g} |")
    coded = [r for r in rows if r.code]
    if coded:
        lines += ["", "## Inductor's generated code (compiled rows: a call's Triton launches, extern convolutions, "
                      "custom ops, 4-D buffers and those not channels_last, data-movement-only kernels)", "",
                  "| model | case | variant | Triton launches | convolutions | custom ops | 4-D buffers | "
                  "activations not channels_last | 3x3 weights not channels_last | copy-only kernels |",
                  "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
        for r in coded:
            c = r.code
            lines.append(f"| {r.model} | {r.case} | {r.variant} | {c['triton_launches']} | {c['convolutions']} | "
                         f"{c['custom_ops']} | {c['buffers_4d']} | {len(c['buffers_not_channels_last'])} | "
                         f"{c['weights_not_channels_last']} | {', '.join(c['copy_only_kernels']) or '-'} |")
    if meta["skipped_for_budget"]:
        lines += ["", "Skipped for the budget (--budget-s): " + ", ".join(meta["skipped_for_budget"])]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 tools/network_variants.py",
                                     description="Candidate speed-ups of the EDSC networks, timed in one run "
                                                 "against today's recipe.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", required=True, help="folder for variants.json and variants.md (created)")
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if available, else cpu)")
    parser.add_argument("--models", default=None,
                        help=f"comma-separated, of {','.join(MODEL_NAMES)} (default: the plan's; with --cases or "
                             "--variants alone: EDSC_s)")
    parser.add_argument("--cases", default=None,
                        help=f"comma-separated, of {','.join(CASES)} (default: the plan's; with --models or "
                             "--variants alone: 1080p)")
    parser.add_argument("--variants", default=None,
                        help="comma-separated PATH:OPTION[+OPTION...] (default: the plan's; with --models or --cases "
                             "alone: compiled:base,compiled:all); every one runs at every model and case given")
    parser.add_argument("--profile", default=",".join(PROFILED),
                        help="variants to profile where they run (default %(default)s; '' for none)")
    parser.add_argument("--profile-calls", type=int, default=3, help="calls profiled per row (default 3)")
    parser.add_argument("--rounds", type=int, default=20, help="timed calls (training: half) (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls after the first (default 3)")
    parser.add_argument("--budget-s", type=float, default=360.0,
                        help="skip rows whose estimated time would overrun this many seconds (default 360)")
    parser.add_argument("--inference-dtype", default=None, choices=list(DTYPES),
                        help="autocast dtype of inference (default fp16 on CUDA, fp32 on the CPU)")
    parser.add_argument("--train-dtype", default=None, choices=list(DTYPES),
                        help="autocast dtype of the training step (default bf16 on CUDA, fp32 on the CPU)")
    parser.add_argument("--warm-caches", action="store_true",
                        help="leave inductor's caches on (the first-call times are then not cold compiles)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and frames (default 0)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available")
    cuda = device.type == "cuda"
    args.inference_dtype = args.inference_dtype or ("fp16" if cuda else "fp32")
    args.train_dtype = args.train_dtype or ("bf16" if cuda else "fp32")
    try:
        if args.models is None and args.cases is None and args.variants is None:
            plan = [(m, c, parse_variant(v)) for m, c, v in PLAN]
        else:
            models = [m.strip() for m in (args.models or "EDSC_s").split(",") if m.strip()]
            cases = [c.strip() for c in (args.cases or "1080p").split(",") if c.strip()]
            variants = [parse_variant(v) for v in (args.variants or "compiled:base,compiled:all").split(",")
                        if v.strip()]
            for m in models:
                if m not in MODEL_NAMES:
                    raise ValueError(f"--models: {m!r} is not one of {MODEL_NAMES}")
            for c in cases:
                if c not in CASES:
                    raise ValueError(f"--cases: {c!r} is not one of {tuple(CASES)}")
            plan = [(m, c, v) for m in models for c in cases for v in variants]
        args.profile = {parse_variant(v).name for v in args.profile.split(",") if v.strip()}
    except ValueError as e:
        parser.error(str(e))
    if args.rounds < 1 or args.warmup < 0 or args.profile_calls < 1:
        parser.error("--rounds and --profile-calls must be at least 1, --warmup at least 0")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    args.peak_tflops = {}
    for dtype in dict.fromkeys(DTYPES[args.inference_dtype if CASES[c].kind == "inference" else args.train_dtype]
                               for _, c, _ in plan):
        args.peak_tflops[dtype or torch.float32] = harness.matmul_peak_tflops(device, dtype or torch.float32)
    meta = {"device": harness.device_description(device), "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": shlex.join(["python3", "tools/network_variants.py", *(sys.argv[1:] if argv is None else argv)]),
            "torch": torch.__version__, "seed": args.seed, "inference_dtype": args.inference_dtype,
            "train_dtype": args.train_dtype, "warm_caches": args.warm_caches,
            "clock": "CUDA events" if cuda else "wall clock",
            "peak_tflops": {str(k).replace("torch.", ""): v for k, v in args.peak_tflops.items()},
            "skipped_for_budget": []}
    models: Dict[str, object] = {}
    inputs: Dict[Tuple[str, str], object] = {}
    references = References(device)
    rows: List[Row] = []
    for index, (model_name, case_name, variant) in enumerate(plan):
        elapsed = time.perf_counter() - started
        estimate = ESTIMATE_S.get((variant.path, case_name), 10) * (10 if "autotune" in variant.options else 1)
        if cuda and elapsed + estimate > args.budget_s:
            meta["skipped_for_budget"].append(f"{model_name} {case_name} {variant.name}")
            rows.append(Row(model_name, case_name, variant.name, status="skipped",
                            note=f"budget: {elapsed:.0f} s spent, about {estimate} s more"))
            continue
        if model_name not in models:
            models[model_name] = bench.random_model(model_name, "compat", args.seed).to(device).to(
                memory_format=torch.channels_last)
        model = models[model_name]
        key = (model_name, case_name)
        if key not in inputs:
            inputs[key] = bench._Inputs(CASES[case_name], device, args.seed + list(CASES).index(case_name))
        try:
            reference = references.get(model, case_name, inputs[key])
            row = run_row(model, case_name, variant, inputs[key], reference, args, device)
        except Exception as e:  # one failing variant (out of memory, a compile error) leaves the others
            message = str(e).strip().splitlines()[0] if str(e).strip() else ""
            row = Row(model_name, case_name, variant.name, status="error", note=f"{type(e).__name__}: {message}"[:240])
        finally:
            _apply(model, ())
            release_compiled()
            harness.free_memory(device)
        rows.append(row)
        print(f"network_variants [{index + 1}/{len(plan)}, {time.perf_counter() - started:.0f} s] {model_name} "
              f"{case_name} {variant.name}: " + (f"{row.ms:.2f} ms, first call {row.first_call_s:.1f} s, rel. dev. "
                                                 f"{_dev(row.deviation)}" if row.status == "ok" else
                                                 f"{row.status}: {row.note}"), file=sys.stderr, flush=True)
    # dev / base: against the base variant of the same path, model and case.
    bases = {(r.model, r.case, r.variant.split(":")[0]): r.deviation for r in rows
             if r.status == "ok" and r.variant.split(":")[1] == "base"}
    for r in rows:
        base = bases.get((r.model, r.case, r.variant.split(":")[0]))
        if r.status == "ok" and base:
            r.deviation_vs_base = r.deviation / base
    order = {name: i for i, name in enumerate(CASES)}
    rows.sort(key=lambda r: (MODEL_NAMES.index(r.model), order[r.case], PATHS.index(r.variant.split(":")[0])))
    meta["wall_s"] = time.perf_counter() - started
    text = render(meta, rows)
    (out / "variants.md").write_text(text)
    (out / "variants.json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1,
                                                  default=str))
    print("\n".join(short_table(rows)))
    print(f"\n{len(rows)} rows in {meta['wall_s']:.0f} s; full results: {out / 'variants.md'}, {out / 'variants.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
