"""The op's roofline on a CUDA GPU: ncu's counters of every kernel a benchmark row launches, held against
the DRAM floor and the taps' gather traffic (edsc_ext.benchmarks.op.floor_bytes / gather_traffic), and
the bound that holds named per kernel.

    python tools/roofline.py [--cases train infer feat] [--dtypes float32 bfloat16] [--layouts nchw nhwc]
                             [--out DIR]

Each row (case x dtype x layout) runs in a child process under ncu (`--clock-control none`, as the
device notes ask; only the kernels inside the NVTX range "roofline" are profiled, after one warm-up
forward+backward). The child times one forward and one forward+backward; ncu reports each kernel of
the forward+backward. A kernel's bound is the unit with the highest utilisation of its peak among
DRAM, L2, L1/TEX and the SM (instruction issue and pipes); "% of bound" is that utilisation. Metrics
this ncu does not know are dropped (and listed), so the table still comes out on another GPU.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))

# ncu metric -> our column. The first four are the units a kernel can be bound by.
METRICS = {
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "l2_pct",
    "l1tex__throughput.avg.pct_of_peak_sustained_active": "l1_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
    "gpu__time_duration.sum": "time",
    "sm__inst_issued.avg.pct_of_peak_sustained_active": "issue_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
    "l1tex__t_sector_hit_rate.pct": "l1_hit_pct",
    "lts__t_sector_hit_rate.pct": "l2_hit_pct",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": "ld_requests",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": "ld_sectors",
    "l1tex__data_pipe_lsu_wavefronts.sum": "lsu_wavefronts",
    "lts__t_sectors_op_atom.sum": "l2_atom_sectors",
    "lts__t_sectors_op_red.sum": "l2_red_sectors",
    "dram__bytes.sum": "dram_bytes",
    "launch__registers_per_thread": "registers",
}
BOUND_UNITS = {"dram_pct": "DRAM", "l2_pct": "L2", "l1_pct": "L1/TEX", "sm_pct": "SM"}
CASE_NAMES = ("train", "infer", "feat", "feat64", "adacof", "sepconv", "batch")


# ------------------------------------------------------------------------------------------------
# The child: one row's tensors, a warm-up, then the profiled forward+backward inside the NVTX range.


def child(case_name: str, dtype_name: str, layout: str) -> None:
    import torch

    import edsc_ext
    from edsc_ext.benchmarks.op import CASES, DTYPES, Precision

    case = next(c for c in CASES if c.name == case_name)
    dtype = DTYPES[dtype_name]
    device = torch.device("cuda")
    tensors = case.make_inputs(dtype, device, seed=0)
    grad_out = torch.randn(case.n, case.c, case.h, case.w, device=device).to(Precision.of(dtype).frame)
    if layout == "nhwc":
        tensors = [None if t is None else t.contiguous(memory_format=torch.channels_last) for t in tensors]
        grad_out = grad_out.contiguous(memory_format=torch.channels_last)
    leaves = [None if t is None else t.requires_grad_() for t in tensors]
    present = [t for t in leaves if t is not None]

    def step():
        out = edsc_ext.deform_sepconv(*leaves, **case.kwargs())
        return torch.autograd.grad(out, present, grad_out)

    # NVTX push/pop ranges belong to a thread, and autograd runs a CUDA backward on its device thread:
    # without this, ncu saw the forward's kernels only.
    with torch.autograd.set_multithreading_enabled(False):
        step()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("roofline")
        step()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    plans = edsc_ext._plan(*leaves, **case.kwargs())
    print(json.dumps({"plans": list(plans)}), flush=True)


# ------------------------------------------------------------------------------------------------
# The parent: ncu per row, parse, name the bound.


def _number(text: str) -> Optional[float]:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_raw_csv(text: str) -> List[Dict[str, object]]:
    """ncu --csv --page raw: a header row, a units row, then one row per profiled kernel."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    if len(lines) < 2:
        return []
    table = list(csv.reader(io.StringIO("\n".join(lines))))
    header, units, body = table[0], table[1], table[2:]
    kernels = []
    for row in body:
        record: Dict[str, object] = {"kernel": row[header.index("Kernel Name")]}
        for metric, column in METRICS.items():
            if metric in header:
                i = header.index(metric)
                value = _number(row[i])
                if column == "time" and value is not None:  # to ms
                    scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}.get(units[i], 1e-6)
                    value *= scale
                record[column] = value
        kernels.append(record)
    return kernels


def short_kernel_name(name: str) -> str:
    base = re.split(r"[<(]", name, maxsplit=1)[0].strip()
    base = base.split("::")[-1] or name
    return base[:60]


def name_bound(record: Dict[str, object]):
    """(unit, % of its peak) of the most utilised unit among DRAM, L2, L1/TEX and SM."""
    present = {k: record[k] for k in BOUND_UNITS if isinstance(record.get(k), float)}
    if not present:
        return None, None
    key = max(present, key=present.get)
    return BOUND_UNITS[key], present[key]


def run_row(ncu: str, case: str, dtype: str, layout: str, metrics: List[str], log_dir: str) -> dict:
    log = os.path.join(log_dir, f"ncu-{case}-{dtype}-{layout}.csv")
    cmd = [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", "roofline/", "--csv", "--page", "raw",
           "--log-file", log, "--metrics", ",".join(metrics), sys.executable, os.path.abspath(__file__),
           "--child", case, dtype, layout]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    text = open(log).read() if os.path.exists(log) else ""
    errors = [line for line in (proc.stdout + proc.stderr + text).splitlines() if "==ERROR==" in line]
    plans = None
    for line in proc.stdout.splitlines():
        if line.startswith('{"plans"'):
            plans = json.loads(line)["plans"]
    return {"returncode": proc.returncode, "kernels": parse_raw_csv(text), "errors": errors, "plans": plans,
            "stderr_tail": proc.stderr[-2000:]}


def unknown_metrics(errors: List[str], metrics: List[str]) -> List[str]:
    found = []
    for line in errors:
        for metric in metrics:
            if metric in line and metric not in found:
                found.append(metric)
    return found


def _fmt(value, spec=".1f"):
    return "—" if value is None else format(value, spec)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=["train", "infer", "feat"], choices=CASE_NAMES)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--layouts", nargs="+", default=["nchw", "nhwc"], choices=["nchw", "nhwc"],
                        help="memory formats (default both; train and infer rows run NCHW only unless "
                             "--all-layouts)")
    parser.add_argument("--all-layouts", action="store_true", help="every case in every layout given")
    parser.add_argument("--out", default=".", help="folder for roofline.md, roofline.json and ncu's logs")
    parser.add_argument("--ncu", default=shutil.which("ncu") or "ncu")
    parser.add_argument("--child", nargs=3, metavar=("CASE", "DTYPE", "LAYOUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0

    sys.path.insert(0, os.path.dirname(HERE))
    import torch

    from edsc_ext.benchmarks.op import CASES, DTYPES, floor_bytes, gather_traffic, measure_copy_bandwidth

    os.makedirs(args.out, exist_ok=True)
    bandwidth = measure_copy_bandwidth("cuda")["gbps"]
    metrics = list(METRICS)
    dropped: List[str] = []
    results = []
    for case_name in args.cases:
        case = next(c for c in CASES if c.name == case_name)
        layouts = args.layouts if (args.all_layouts or case.c > 4) else ["nhwc" if case.channels_last else "nchw"]
        for dtype in args.dtypes:
            for layout in layouts:
                row = run_row(args.ncu, case_name, dtype, layout, metrics, args.out)
                missing = unknown_metrics(row["errors"], metrics)
                if row["returncode"] != 0 and missing:
                    dropped += missing
                    metrics = [m for m in metrics if m not in missing]
                    row = run_row(args.ncu, case_name, dtype, layout, metrics, args.out)
                gathers = gather_traffic(case, DTYPES[dtype], layout == "nhwc")
                floor_ms = floor_bytes(case, DTYPES[dtype], backward=True) / (bandwidth * 1e9) * 1e3
                row.update(case=case_name, dtype=dtype, layout=layout, gather_traffic=gathers,
                           floor_ms_fwd_bwd=floor_ms)
                for record in row["kernels"]:
                    record["bound"], record["bound_pct"] = name_bound(record)
                results.append(row)
                print(f"{case_name} {dtype} {layout}: {len(row['kernels'])} kernels, rc {row['returncode']}"
                      + (f", {row['errors'][:2]}" if row["errors"] else ""), file=sys.stderr, flush=True)

    lines = [f"# deform_sepconv roofline: {torch.cuda.get_device_name()}, torch {torch.__version__}",
             "", f"copy bandwidth {bandwidth:.0f} GB/s; ncu --clock-control none; one forward+backward per row "
             "(every gradient); bound = the unit (DRAM, L2, L1/TEX, SM) at the highest % of its peak", ""]
    if dropped:
        lines += [f"metrics this ncu does not know (dropped): {', '.join(dropped)}", ""]
    lines.append("| row | plans (fwd / bwd) | kernel | ms | DRAM % | L2 % | L1/TEX % | SM % | issue % | occupancy % | "
                 "L1 hit % | sectors / request | ld sectors M (taps model M) | L2 atomic+red sectors M | regs | "
                 "bound | % of bound |")
    lines.append("| --- | --- | --- |" + " ---: |" * 12 + " --- | ---: |")
    for row in results:
        label = f"{row['case']} {row['dtype']} {row['layout']}"
        plans = " / ".join(row["plans"] or ["?"])
        if not row["kernels"]:
            lines.append(f"| {label} | {plans} | (no kernels: rc {row['returncode']}; "
                         f"{'; '.join(row['errors'][:2]) or row['stderr_tail'][-200:]}) |" + " |" * 14)
            continue
        total = sum(k.get("time") or 0.0 for k in row["kernels"])
        for k in row["kernels"]:
            req, sec = k.get("ld_requests"), k.get("ld_sectors")
            atomics = (k.get("l2_atom_sectors") or 0.0) + (k.get("l2_red_sectors") or 0.0)
            lines.append("| " + " | ".join([
                label, plans, short_kernel_name(str(k["kernel"])), _fmt(k.get("time"), ".3f"),
                _fmt(k.get("dram_pct")), _fmt(k.get("l2_pct")), _fmt(k.get("l1_pct")), _fmt(k.get("sm_pct")),
                _fmt(k.get("issue_pct")), _fmt(k.get("occupancy_pct")), _fmt(k.get("l1_hit_pct")),
                _fmt(sec / req if req and sec else None, ".2f"),
                f"{_fmt(sec / 1e6 if sec else None, '.1f')} ({row['gather_traffic']['l1_sectors'] / 1e6:.1f})",
                _fmt(atomics / 1e6, ".1f"), _fmt(k.get("registers"), ".0f"),
                k.get("bound") or "—", _fmt(k.get("bound_pct"))]) + " |")
        lines.append(f"| {label} | | **sum of kernels** | {total:.3f} | | | | | | | | | | | | DRAM floor "
                     f"{row['floor_ms_fwd_bwd']:.3f} ms | {100 * row['floor_ms_fwd_bwd'] / total:.0f}% |")
    report = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "roofline.md"), "w") as f:
        f.write(report)
    with open(os.path.join(args.out, "roofline.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_gbps": bandwidth,
                   "dropped_metrics": dropped, "rows": results}, f, indent=1)
    sys.stdout.write(report)
    return 0 if all(r["kernels"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
