"""A/B of two kernel policies in one process: forward and forward+backward of benchmark cases under
policy A and policy B, interleaved rounds (so clock and thermal drift hit both alike), each row with
both plans, the medians, B / A, the floor, and how far apart the two runs' outputs and gradients are.

    python3 tools/policy_ab.py --cases feat feat64 --channels-last --a channel_lanes=true \
        --b channel_lanes=false [--dtypes float32 bfloat16 float16 float32+bfloat16] [--json PATH]

The benchmark (edsc-benchmark --policy ...) times one policy a process; this is for
the kernel choices themselves. On the CPU it takes the benchmark's scaled-down cases.
"""
import argparse
import json
import statistics

import torch

import edsc_ext
from edsc_ext.benchmarks import harness
from edsc_ext.benchmarks import op as B


def max_relative_difference(a, b) -> float:
    """The largest |a - b| over max |b|, over a pair of tensor lists (0 for empty ones)."""
    worst = 0.0
    for x, y in zip(a, b):
        x, y = x.detach().double(), y.detach().double()
        scale = y.abs().max().item() if y.numel() else 0.0
        diff = (x - y).abs().max().item() if y.numel() else 0.0
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def compare(case, dtype_name, fmt, policies, device, bandwidth, args):
    """The rows (one per pass) of one case and precision under both policies."""
    dtype = B.DTYPES[dtype_name]
    tensors = [None if t is None else t.contiguous(memory_format=fmt).requires_grad_()
               for t in case.make_inputs(dtype, device, 0)]
    inputs = [t for t in tensors if t is not None]
    grad_out = torch.randn_like(edsc_ext.deform_sepconv(*tensors, **case.kwargs()).detach())

    def forward():
        with torch.no_grad():
            return edsc_ext.deform_sepconv(*tensors, **case.kwargs())

    def forward_backward():
        out = edsc_ext.deform_sepconv(*tensors, **case.kwargs())
        return (out.detach(),) + torch.autograd.grad(out, inputs, grad_out)

    times = {(label, pass_): [] for label in policies for pass_ in B.PASSES}
    plans, results = {}, {}
    for _ in range(max(1, args.rounds)):
        for label, policy in policies.items():
            with edsc_ext.kernel_policy(**policy):
                plans[label] = tuple(edsc_ext._plan(*tensors, **case.kwargs()))
                results[label] = forward_backward()
                for pass_, fn in zip(B.PASSES, (forward, forward_backward)):
                    times[(label, pass_)].append(B.time_fn(fn, device, warmup=3, reps=args.reps)["median_ms"])
    rows = []
    for k, pass_ in enumerate(B.PASSES):
        floor_ms = B.floor_bytes(case, dtype, pass_ != "fwd") / (bandwidth * B.GB) * 1e3
        a, b = (statistics.median(times[(label, pass_)]) for label in policies)
        rows.append({"case": case.name, "shape": case.shape, "dtype": dtype_name, "pass": pass_,
                     "plan_a": plans["A"][k], "plan_b": plans["B"][k], "a_ms": a, "b_ms": b, "b_over_a": b / a,
                     "floor_ms": floor_ms, "a_x_floor": a / floor_ms, "b_x_floor": b / floor_ms,
                     "rounds_a_ms": times[("A", pass_)], "rounds_b_ms": times[("B", pass_)],
                     "max_rel_diff": max_relative_difference(results["A"], results["B"])})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cases", nargs="+", default=["feat", "feat64"], metavar="NAME")
    parser.add_argument("--dtypes", nargs="+", default=list(B.DEFAULT_DTYPES), choices=sorted(B.DTYPES))
    parser.add_argument("--channels-last", action="store_true", help="every 4-D tensor in channels_last")
    parser.add_argument("--a", nargs="*", default=[], metavar="KEY=VALUE", help="policy A (default: the defaults)")
    parser.add_argument("--b", nargs="*", default=[], metavar="KEY=VALUE", help="policy B")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--reps", type=int, default=15, help="timed runs a round (default 15)")
    parser.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    args = parser.parse_args()
    policies = {"A": B._parse_policy(parser, args.a), "B": B._parse_policy(parser, args.b)}
    device = torch.device(args.device)
    catalogue = {c.name: c for c in (B.CASES if device.type == "cuda" else B.CPU_CASES)}
    unknown = [name for name in args.cases if name not in catalogue]
    if unknown:
        parser.error(f"--cases: unknown {unknown}; expected some of {sorted(catalogue)}")
    bandwidth = B.measure_copy_bandwidth(device)["gbps"]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else harness.cpu_name()
    print(f"{name}, torch {torch.__version__}, edsc_ext {edsc_ext.__version__}, copy {bandwidth:.0f} GB/s; "
          f"A = {args.a or 'defaults'}, B = {args.b or 'defaults'}", flush=True)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    rows = []
    for case_name in args.cases:
        for dtype_name in args.dtypes:
            for row in compare(catalogue[case_name], dtype_name, fmt, policies, device, bandwidth, args):
                rows.append(row)
                print(f"{row['case']} {dtype_name} {row['pass']}: A {row['a_ms']:.3f} ms ({row['a_x_floor']:.1f}x "
                      f"floor, {row['plan_a']}), B {row['b_ms']:.3f} ms ({row['b_x_floor']:.1f}x, {row['plan_b']}), "
                      f"B/A {row['b_over_a']:.2f}, outputs and gradients apart by {row['max_rel_diff']:.1e}",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "copy_gbps": bandwidth, "a": args.a, "b": args.b, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
