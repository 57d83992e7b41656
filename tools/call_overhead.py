"""Per-call overhead of the compiled ops on tiny CPU inputs, where the host code (argument checks,
allocation, planning, dispatch) is most of the time: the raw ops torch.ops.edsc_ext.deform_sepconv_forward
and ..._backward, the public edsc_ext.deform_sepconv, and an empty call (batch 0: no kernel runs).

    python3 tools/call_overhead.py [--iters 2000] [--repeats 7] [--threads 1]
    python3 tools/call_overhead.py --compare main= abi=/path/to/checkout [--rounds 3]

Each row is the best and the median, over --repeats, of the mean time a call over --iters calls (µs).
--compare LABEL=PYTHONPATH ... times each build in its own process (from a temporary directory, so
an empty PYTHONPATH imports the installed package), in interleaved rounds A, B, A, B, ..., since
clock and load drift on a small machine would otherwise favour one of them; it reports each row's
best over the rounds.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def cases():
    import torch

    import edsc_ext

    ops = torch.ops.edsc_ext
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.rand(*shape, generator=g)

    # batch 1, 3 channels, 8x8 output, 5x5 taps (12x12 input, no padding).
    k, out = 5, 8
    x = rand(1, 3, out + k - 1, out + k - 1)
    v, h = rand(1, k, out, out), rand(1, k, out, out)
    off, m = rand(1, 2 * k * k, out, out) - 0.5, rand(1, k * k, out, out)
    grad = rand(1, 3, out, out)
    geometry = (k, k, 0, 0, 1, 1, 0)
    mask5 = [True] * 5
    empty = torch.empty(0, 3, out + k - 1, out + k - 1)
    return {
        "forward": lambda: ops.deform_sepconv_forward(x, v, h, off, m, *geometry),
        "forward_no_offset": lambda: ops.deform_sepconv_forward(x, v, h, None, None, *geometry),
        "forward_empty": lambda: ops.deform_sepconv_forward(empty, None, None, None, None, *geometry),
        "backward": lambda: ops.deform_sepconv_backward(grad, x, v, h, off, m, *geometry, mask5),
        "backward_no_offset": lambda: ops.deform_sepconv_backward(grad, x, v, h, None, None, *geometry, mask5),
        "public_forward": lambda: edsc_ext.deform_sepconv(x, v, h, off, m),
    }


def measure(iters, repeats, threads):
    import torch

    torch.set_num_threads(threads)
    results = {}
    with torch.inference_mode():
        for name, call in cases().items():
            for _ in range(max(50, iters // 10)):  # warm-up
                call()
            means = []
            for _ in range(repeats):
                start = time.perf_counter_ns()
                for _ in range(iters):
                    call()
                means.append((time.perf_counter_ns() - start) / iters / 1e3)
            results[name] = {"best": min(means), "median": statistics.median(means)}
    return results


def compare(variants, rounds, args):
    best = {label: {} for label, _ in variants}
    script = os.path.abspath(__file__)
    with tempfile.TemporaryDirectory() as cwd:
        for r in range(rounds):
            for label, path in variants:
                env = dict(os.environ)
                env.pop("PYTHONPATH", None)
                if path:
                    env["PYTHONPATH"] = path
                out = subprocess.run([sys.executable, script, "--json", "--iters", str(args.iters), "--repeats",
                                      str(args.repeats), "--threads", str(args.threads)], cwd=cwd, env=env,
                                     check=True, capture_output=True, text=True).stdout
                for name, row in json.loads(out).items():
                    kept = best[label].get(name)
                    if kept is None or row["best"] < kept["best"]:
                        best[label][name] = row
                print(f"round {r + 1}/{rounds} {label}: " + ", ".join(
                    f"{n} {row['best']:.1f}" for n, row in json.loads(out).items()), file=sys.stderr)
    labels = [label for label, _ in variants]
    names = list(best[labels[0]])
    print(f"{'µs a call (best of rounds; median)':36s}" + "".join(f"{label:>22s}" for label in labels) +
          (f"{labels[1] + ' / ' + labels[0]:>14s}" if len(labels) > 1 else ""))
    for name in names:
        cells = "".join(f"{best[label][name]['best']:12.2f} ({best[label][name]['median']:6.2f})" for label in labels)
        ratio = f"{best[labels[1]][name]['best'] / best[labels[0]][name]['best']:14.3f}" if len(labels) > 1 else ""
        print(f"{name:36s}{cells}{ratio}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--compare", nargs="+", metavar="LABEL=PYTHONPATH")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.compare:
        compare([tuple(v.split("=", 1)) for v in args.compare], args.rounds, args)
        return
    results = measure(args.iters, args.repeats, args.threads)
    if args.json:
        print(json.dumps(results))
        return
    import edsc_ext

    print(f"edsc_ext from {os.path.dirname(edsc_ext.__file__)}")
    for name, row in results.items():
        print(f"{name:24s} best {row['best']:8.2f} µs   median {row['median']:8.2f} µs")


if __name__ == "__main__":
    main()
