"""The video tool's throughput table in one command: test clips, whole-process runs of edsc-interpolate,
each run's stage profile, and the network alone for scale.

    python tools/video_throughput.py --out DIR                    # one GPU: the issue's table (~3 minutes on an H200)
    python tools/video_throughput.py --out DIR --multi-gpu        # 4K EDSC_m x2 on cuda:0 against cuda:0,cuda:1
    python tools/video_throughput.py --out DIR --device cpu --quick --configs default   # a smoke run
    python tools/video_throughput.py --out DIR --multi-gpu --device cpu --pair cpu,cpu --quick   # its smoke run

Each run is ``python -m edsc_ext.apps.interpolate ... --quiet --profile-json`` in a process of its own,
timed from before the process starts to its exit ("whole process": start-up, model load, CUDA-graph
capture, decoding, the network, encoding, the copied audio); "streaming" is the same new frames over the
profile's wall time (first frame read to last packet written); "start-up" is the time from the process's
start to the first frame handed to the encoder (and, after the encoder's lookahead, to the first packet
in the file). The network is EDSC with heads that blend the two frames (every layer computed:
:func:`edsc_ext.benchmarks.video.blending_network`), so the encoder sees frames like a trained network's.
Clips (:func:`edsc_ext.benchmarks.video.make_clip`, kept in DIR and reused): 1920x1080, 60 s at 24 fps
with stereo AAC; the same 20 s long for the presets x264 cannot keep up with; 3840x2160, 10 s (20 s for
--multi-gpu). Prints markdown tables (and writes DIR/throughput.json); each target of issue #44 is
checked where the run was made on CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import edsc_ext
from edsc_ext.benchmarks.video import blending_network, make_clip
from edsc_ext.models import save_checkpoint

# (name, clip key, extra flags, target new frames/s in the whole process, or None)
CONFIGS = [
    ("default", "1080p", [], 40.0),
    ("half-veryfast", "1080p", ["--half", "--preset", "veryfast"], 60.0),
    ("medium", "1080p-20s", ["--preset", "medium"], None),
    ("float32", "1080p-20s", ["--float32"], None),
    ("4k-half", "4k", ["--half"], 20.0),
    ("batch2", "1080p-20s", ["--batch", "2"], None),
]
START_UP_TARGET = 4.0  # seconds from the process's start to the first frame written, without --compile


def clip_specs(quick: bool, multi_gpu: bool) -> Dict[str, tuple]:
    """key -> (file name, width, height, seconds, audio)."""
    if quick:
        return {"1080p": ("quick_48x32_1s.mp4", 48, 32, 1, True),
                "1080p-20s": ("quick_32x32_0.5s.mp4", 32, 32, 0.5, True),
                "4k": ("quick_32x32_0.5s.mp4", 32, 32, 0.5, True)}
    return {"1080p": ("clip_1920x1080_60s.mp4", 1920, 1080, 60, True),
            "1080p-20s": ("clip_1920x1080_20s.mp4", 1920, 1080, 20, True),
            "4k": ("clip_3840x2160_20s.mp4" if multi_gpu else "clip_3840x2160_10s.mp4", 3840, 2160,
                   20 if multi_gpu else 10, True)}


def ensure_clip(folder: Path, spec: tuple) -> Path:
    name, width, height, seconds, audio = spec
    path = folder / name
    if not path.exists():
        start = time.perf_counter()
        partial = path.with_name(f".{path.stem}.partial{path.suffix}")
        make_clip(partial, width, height, round(seconds * 24), rate=24, audio=audio)
        partial.replace(path)
        print(f"made {path.name} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return path


def child_environment() -> dict:
    """The children import the edsc_ext this script imported."""
    env = dict(os.environ)
    root = str(Path(edsc_ext.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_tool(folder: Path, name: str, clip: Path, weights: Path, flags: List[str], device: str,
             timeout: float) -> dict:
    out = folder / f"out_{name}.mp4"
    report = folder / f"profile_{name}.json"
    for path in (out, report):
        if path.exists():
            path.unlink()
    command = [sys.executable, "-m", "edsc_ext.apps.interpolate", "--weights", str(weights), "--video", str(clip),
               "-o", str(out), "--device", device, "--quiet", "--profile-json", str(report), *flags]
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=child_environment())
    wall = time.time() - started
    if done.returncode != 0:
        raise RuntimeError(f"{name}: exit code {done.returncode}: {done.stderr.strip()[-2000:]}")
    data = json.loads(report.read_text())
    marks = data["profile"].get("marks_wall_time", {})
    data.update(name=name, command=" ".join(command), flags=" ".join(flags), whole_process_s=wall,
                stdout=done.stdout.strip(),
                startup_to_encoder_s=(marks["first frame to the encoder"] - started
                                      if "first frame to the encoder" in marks else None),
                startup_to_file_s=(marks["first packet written"] - started if "first packet written" in marks
                                   else None))
    out.unlink()
    return data


def run_benchmark(size: str, model: str, device: str, frames: int, timeout: float, extra: List[str]) -> dict:
    """The in-process benchmark: the network alone, the tool without I/O and with I/O."""
    with _temporary_json() as path:
        command = [sys.executable, "-m", "edsc_ext.benchmarks.video", "--size", size, "--model", model, "--frames",
                   str(frames), "--device", device, "--repeat", "1", "--json", str(path), *extra]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=child_environment())
        if done.returncode != 0:
            raise RuntimeError(f"benchmark: exit code {done.returncode}: {done.stderr.strip()[-2000:]}")
        report = json.loads(path.read_text())
    report["command"] = " ".join(command)
    return report


class _temporary_json:
    def __enter__(self) -> Path:
        import tempfile

        handle, name = tempfile.mkstemp(suffix=".json")
        os.close(handle)
        self.path = Path(name)
        return self.path

    def __exit__(self, *exc) -> None:
        self.path.unlink(missing_ok=True)


def rate_row(data: dict, target: Optional[float], on_cuda: bool) -> str:
    new = data["interpolated"]
    whole = new / data["whole_process_s"]
    streaming = new / data["profile"]["wall_s"] if data["profile"]["wall_s"] else float("nan")
    start = data["startup_to_encoder_s"]
    verdict = "-"
    if on_cuda:
        checks = []
        if target is not None:
            checks.append(whole >= target)
        if start is not None:
            checks.append(start <= START_UP_TARGET)
        verdict = "yes" if all(checks) else "NO"
    return (f"| {data['name']} | `{data['flags'] or '(none)'}` | {data['width']}x{data['height']} | {new} | "
            f"{data['whole_process_s']:.1f} | {whole:.1f} | {streaming:.1f} | "
            f"{_seconds(start)} / {_seconds(data['startup_to_file_s'])} | {data['profile']['bound']} | "
            f"{data['encoding']} | {'-' if target is None else f'>= {target:g}'} | {verdict} |")


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def stage_table(data: dict) -> str:
    lines = [f"Stage profile, {data['name']} ({data['speed']}):", "",
             "| stage | time (s) | frames | frames/s | busy | CPU cores |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in data["profile"]["rows"]:
        rate = "-" if row["frames_per_s"] is None else f"{row['frames_per_s']:.1f}"
        cores = row["note"] or ("-" if row["cpu_cores"] is None else f"{row['cpu_cores']:.2f}")
        lines.append(f"| {row['name']} | {row['seconds']:.2f} | {row['frames']} | {rate} | {100 * row['busy']:.0f}% "
                     f"| {cores} |")
    profile = data["profile"]
    cores = profile["cpu_cores"]
    overlap = profile["overlap_with_network"]
    lines += ["", f"wall {profile['wall_s']:.2f} s, bound: {profile['bound']}; CPU cores busy: "
              f"{_cores(cores.get('process'))} in all, main thread {_cores(cores.get('main'))}; while the network ran "
              f"decode was busy {_percent(overlap.get('decode'))} and encode {_percent(overlap.get('encode'))}; "
              f"waits: " + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(profile["waits_s"].items())) +
              "; waiting for a free core: " + ", ".join(f"{k} {v:.2f} s" for k, v in
                                                        profile["run_queue_wait_s"].items() if v is not None)]
    startup = {k: v for k, v in profile.get("startup_s", {}).items() if v is not None}
    if startup:
        lines.append("from the process's start: " + ", ".join(f"{k} {v:.2f} s" for k, v in startup.items()))
    if data.get("max_memory_allocated_gb"):
        lines.append("peak GPU memory: " + ", ".join(f"{d} {v:.2f} GB" for d, v in
                                                   data["max_memory_allocated_gb"].items()))
    return "\n".join(lines)


def _cores(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def _percent(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python tools/video_throughput.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the clips, weights and reports")
    parser.add_argument("--device", default="cuda", help="the device of the one-device runs (default cuda)")
    parser.add_argument("--configs", default=None,
                        help=f"runs to make, separated by commas, of {', '.join(c[0] for c in CONFIGS)} (default: all)")
    parser.add_argument("--multi-gpu", action="store_true",
                        help="instead: 4K EDSC_m x2 on one device (--device; cuda: cuda:0) against --pair")
    parser.add_argument("--pair", default="cuda:0,cuda:1",
                        help="the devices --multi-gpu compares one against (default cuda:0,cuda:1)")
    parser.add_argument("--quick", action="store_true", help="tiny clips (a smoke run of the script, e.g. on the CPU)")
    parser.add_argument("--no-benchmark", action="store_true", help="skip the in-process network-alone benchmark")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one run may take (default 300)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    folder = args.out
    folder.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    specs = clip_specs(args.quick, args.multi_gpu)
    weights = {}
    for model in ("EDSC_s", "EDSC_m"):
        weights[model] = folder / f"{model}_blending.pth"
        if not weights[model].exists():
            save_checkpoint(blending_network(model == "EDSC_m"), weights[model])
    results: Dict[str, object] = {"edsc_ext": edsc_ext.__version__, "runs": [], "python": sys.version.split()[0]}
    lines: List[str] = []
    header = ["| run | flags | size | new frames | whole process (s) | new frames/s, whole process | "
              "new frames/s, streaming | start-up: to the encoder / to the file (s) | bound | output | target | met |",
              "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | --- |"]
    if args.multi_gpu:
        clip = ensure_clip(folder, specs["4k"])
        runs = []
        one_device = "cuda:0" if args.device == "cuda" else args.device
        for name, device in (("4k-EDSC_m-1gpu", one_device), ("4k-EDSC_m-2gpu", args.pair)):
            data = run_tool(folder, name, clip, weights["EDSC_m"], ["--preset", "ultrafast"], device, args.timeout)
            runs.append(data)
            results["runs"].append(data)
        one, two = runs
        lines += [f"EDSC_m x2 of the {specs['4k'][1]}x{specs['4k'][2]} clip, --preset ultrafast (the network bounds): "
                  f"{one_device} against {args.pair}", ""]
        lines += header + [rate_row(d, None, False) for d in runs]
        streaming = [d["interpolated"] / d["profile"]["wall_s"] for d in runs]
        whole = [d["interpolated"] / d["whole_process_s"] for d in runs]
        lines += ["", f"speedup, two GPUs against one: {streaming[1] / streaming[0]:.2f}x streaming, "
                      f"{whole[1] / whole[0]:.2f}x whole process (target >= 1.7x)"]
        lines += ["", stage_table(one), "", stage_table(two)]
        if not args.no_benchmark:
            for device in (one_device, args.pair):
                size = f"{specs['4k'][1]}x{specs['4k'][2]}"
                bench = run_benchmark(size, "EDSC_m", device, 24, args.timeout, ["--preset", "ultrafast"])
                results.setdefault("benchmarks", []).append(bench)
                lines += ["", f"`{bench['command'].split(' -m ', 1)[1]}`", ""]
                lines += [f"| {row['name']} | {row['new_frames_per_s']:.1f} new frames/s |" for row in bench["rows"]]
    else:
        chosen = [c for c in CONFIGS if args.configs is None or c[0] in args.configs.split(",")]
        if not chosen:
            print(f"--configs {args.configs}: none of {', '.join(c[0] for c in CONFIGS)}", file=sys.stderr)
            return 2
        rows = []
        on_cuda = args.device.startswith("cuda")
        for name, key, flags, target in chosen:
            clip = ensure_clip(folder, specs[key])
            data = run_tool(folder, name, clip, weights["EDSC_s"], flags, args.device, args.timeout)
            results["runs"].append(data)
            rows.append(rate_row(data, target, on_cuda))
        lines += [f"edsc-interpolate x2 with EDSC_s (blending heads) on {args.device}, whole process per run", ""]
        lines += header + rows
        for data in results["runs"]:
            lines += ["", f"closing line of {data['name']}: {data['stdout']}", "", stage_table(data)]
        if not args.no_benchmark:
            size = "48x32" if args.quick else "1920x1080"
            presets = subprocess.run([sys.executable, "-m", "edsc_ext.benchmarks.video", "--presets", "--size", size,
                                      "--frames", "12" if args.quick else "48", "--repeat", "1"],
                                     capture_output=True, text=True, timeout=args.timeout, env=child_environment())
            lines += ["", presets.stdout.strip() if presets.returncode == 0 else
                      f"(x264 presets: exit code {presets.returncode}: {presets.stderr.strip()[-500:]})"]
            bench = run_benchmark(size, "EDSC_s", args.device, 12 if args.quick else 48, args.timeout, [])
            results["benchmark"] = bench
            lines += ["", f"`{bench['command'].split(' -m ', 1)[1]}` (in one process, after set-up):", ""]
            lines += [f"| {row['name']} | {row['new_frames_per_s']:.1f} new frames/s | {100 * row['vs_model']:.0f}% |"
                      for row in bench["rows"]]
    lines += ["", f"(this script: {time.perf_counter() - began:.0f} s)"]
    text = "\n".join(lines)
    print(text)
    (folder / "throughput.md").write_text(text + "\n")
    (folder / "throughput.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
