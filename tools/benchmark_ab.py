"""Two builds of edsc_ext timed by the op benchmark, in alternating processes: before, after, before, after, ...
(clock and thermal drift on a shared machine would otherwise favour one of them), and a table of each row's
best median over the rounds, after / before.

    python3 tools/benchmark_ab.py before=/path/to/old/checkout after=/path/to/new/checkout \\
        --rounds 3 --out DIR -- --no-baseline --cases train infer feat --reps 50

Each LABEL=PATH is put first on PYTHONPATH (an empty PATH: the installed package) and runs
``python -m edsc_ext.benchmarks.op --no-progress --json ...`` with the arguments after ``--``, from a
temporary directory. DIR keeps every run's JSON and the table (ab.md, ab.json). The exit code is 1 when
a run fails; the table then holds the runs that finished.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

Key = Tuple[str, str, str, str]  # case, memory format, dtype, pass


def row_times(report: dict) -> Dict[Key, float]:
    """edsc_ext's median (ms) of each row of one benchmark JSON."""
    return {(r["case"], r.get("memory_format") or "contiguous", r["dtype"], r["pass"]): r["ms"]
            for r in report["rows"] if r["impl"] == "edsc_ext" and r.get("ms") is not None}


def compare(runs: Dict[str, List[Dict[Key, float]]], labels: Sequence[str]) -> dict:
    """Each row's runs per label, their best, and the last label's best over the first's."""
    first, last = labels[0], labels[-1]
    keys = [k for k in (runs[first][0] if runs[first] else {}) if all(any(k in r for r in runs[label])
                                                                       for label in labels)]
    rows = []
    for key in keys:
        times = {label: [r[key] for r in runs[label] if key in r] for label in labels}
        best = {label: min(values) for label, values in times.items()}
        rows.append({"case": key[0], "memory_format": key[1], "dtype": key[2], "pass": key[3], "runs_ms": times,
                     "best_ms": best, "ratio": best[last] / best[first]})
    ratios = [r["ratio"] for r in rows]
    summary = ({"rows": len(ratios), "min": min(ratios), "median": statistics.median(ratios), "max": max(ratios),
                "geometric_mean": math.exp(statistics.fmean(math.log(x) for x in ratios))} if ratios else
               {"rows": 0})
    return {"labels": list(labels), "rows": rows, "summary": summary}


def to_markdown(result: dict) -> str:
    first, last = result["labels"][0], result["labels"][-1]
    lines = [f"| case | format | dtype | pass | {first} ms | {last} ms | {last} / {first} | {first}, runs | "
             f"{last}, runs |", "| --- | --- | --- | --- | ---: | ---: | ---: | --- | --- |"]
    for r in result["rows"]:
        runs = [", ".join(f"{t:.4f}" for t in r["runs_ms"][label]) for label in (first, last)]
        lines.append(f"| {r['case']} | {r['memory_format']} | {r['dtype']} | {r['pass']} | {r['best_ms'][first]:.4f} "
                     f"| {r['best_ms'][last]:.4f} | {r['ratio']:.3f} | {runs[0]} | {runs[1]} |")
    s = result["summary"]
    lines.append("")
    lines.append(f"{s['rows']} rows" + ("" if not s["rows"] else
                                        f"; {last} / {first}: min {s['min']:.3f}, median {s['median']:.3f}, max "
                                        f"{s['max']:.3f}, geometric mean {s['geometric_mean']:.3f}"))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    benchmark_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("builds", nargs=2, metavar="LABEL=PATH", help="the two builds: before, then after")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the runs' JSON and the table")
    args = parser.parse_args(own)
    builds = []
    for item in args.builds:
        label, sep, path = item.partition("=")
        if not sep or not label:
            parser.error(f"{item!r}: expected LABEL=PATH")
        builds.append((label, os.path.abspath(path) if path else ""))
    if builds[0][0] == builds[1][0]:
        parser.error("the two builds need different labels")
    args.out.mkdir(parents=True, exist_ok=True)
    runs: Dict[str, List[Dict[Key, float]]] = {label: [] for label, _ in builds}
    failed = False
    with tempfile.TemporaryDirectory() as cwd:
        for round_ in range(1, args.rounds + 1):
            for label, path in builds:
                env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                if path:
                    env["PYTHONPATH"] = path
                report = args.out / f"{label}-{round_}.json"
                done = subprocess.run([sys.executable, "-m", "edsc_ext.benchmarks.op", "--no-progress", "--json",
                                       str(report), *benchmark_args], cwd=cwd, env=env, capture_output=True,
                                      text=True)
                if done.returncode != 0 or not report.exists():
                    failed = True
                    print(f"round {round_} {label}: exit code {done.returncode}: {done.stderr.strip()[-400:]}",
                          file=sys.stderr)
                    continue
                runs[label].append(row_times(json.loads(report.read_text())))
                print(f"round {round_}/{args.rounds} {label}: {len(runs[label][-1])} rows", file=sys.stderr)
    result = compare(runs, [label for label, _ in builds])
    (args.out / "ab.json").write_text(json.dumps(result, indent=1))
    table = to_markdown(result)
    (args.out / "ab.md").write_text(table)
    sys.stdout.write(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
