"""Throughput of ``edsc-interpolate``'s video path (issue #21): x2 of a generated clip, against the
network alone, in one run.

    edsc-video-benchmark                          # 1920x1080, 48 frames, random EDSC_s
    edsc-video-benchmark --half --batch 2 --json video.json
    edsc-video-benchmark --size 640x360 --frames 24 --device cpu --repeat 1

(``python -m edsc_ext.benchmarks.video`` or ``edsc-benchmark --video`` run it too.)

Each figure is new (interpolated) frames per second, the median of ``--repeat`` runs:

- **model only**: the network as the tool runs it (the same engine: batch, precision, CUDA graph
  or compile), on the clip's frames already converted and on the device; the frames it makes stay
  there;
- **tool, no I/O**: the tool's stream (decode thread, uploads, colour conversions, network,
  downloads, encode thread) on the clip's frames decoded beforehand into host memory, into a sink
  that waits for each frame to reach the host and drops it: no decoding, no encoding;
- **tool with I/O**: ``edsc-interpolate --video clip.mp4 -o out.mp4`` proper: the file decoded,
  the output encoded (x264 at the input's CRF and the encoder's default preset unless
  ``--preset``) and written;

and each tool figure's ratio to the model's. The clip: a smooth random texture panning width/320
pixels a frame (6 at 1080p), 24 fps, H.264 (x264, CRF 18), made once per run (``--input`` takes
another video, without scene cuts). Weights are random (seeded) unless ``--weights``; ``--blend``
replaces the network by the mean of the two frames, which leaves the tool's own overhead. Set-up
(CUDA-graph capture, compile, the first calls) is done before the timed runs, on the same engine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from ..apps.common import OneLineParser, UserError, cudnn_autotuning, require
from ..apps.engine import Interpolator, default_device, load_model
from ..apps.frames import to_model
from ..apps.interpolate import Source, interpolate_video, open_source, stream_frames
from ..apps.timing import Schedule
from ..models import EDSC_s
from . import harness

__all__ = ["main", "make_clip", "BlendInterpolator"]


def make_clip(path: Path, width: int, height: int, frames: int, rate: int = 24, seed: int = 0) -> Path:
    """A clip of a smooth random texture (noise at 1/8 of the size, bilinearly upsampled) panning
    width/320 pixels a frame (6 at 1080p): motion the encoder and the network both have work with,
    well below the scene-cut threshold."""
    av = require("av", "the video benchmark")
    gen = torch.Generator().manual_seed(seed)
    step = max(1, width // 320)
    span = width + step * frames
    small = torch.rand(1, 3, height // 8 + 2, span // 8 + 2, generator=gen)
    texture = torch.nn.functional.interpolate(small, size=(height, span), mode="bilinear", align_corners=False)
    texture = (texture[0].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=rate, options={"crf": "18", "preset": "veryfast"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for k in range(frames):
            pixels = np.ascontiguousarray(texture[:, step * k:step * k + width])
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts = k
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path


class BlendInterpolator(Interpolator):
    """The engine with the network replaced by (1 - t) a + t b: the tool's own overhead."""

    def __init__(self, model, **kwargs):
        super().__init__(model, **{**kwargs, "cuda_graph": False})

    def _forward(self, first, second, times):
        self._count("blend")
        t = times.view(-1, 1, 1, 1) if times is not None else 0.5
        return (1 - t) * first + t * second


class NullSink:
    """Takes each frame to the host (waits for its download) and drops it."""

    def __init__(self, layout):
        self.layout, self.frames = layout, 0

    def write(self, item) -> None:
        item[0].get()
        self.frames += 1

    def finish(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _parse_size(text: str):
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT, e.g. 1920x1080, got {text!r}") from None
    if width < 32 or height < 32 or width % 2 or height % 2:
        raise argparse.ArgumentTypeError(f"width and height must be even and at least 32, got {text}")
    return width, height


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog=harness.command_name("edsc-video-benchmark", "edsc_ext.benchmarks.video"),
                           description="Throughput of edsc-interpolate's video path against the network alone.")
    parser.add_argument("--size", type=_parse_size, default=(1920, 1080), help="WIDTHxHEIGHT (default 1920x1080)")
    parser.add_argument("--frames", type=int, default=48, help="frames of the generated clip (default 48)")
    parser.add_argument("--input", type=Path, default=None, help="a video to use instead of the generated clip")
    parser.add_argument("--weights", default=None, help="an EDSC checkpoint (default: a random EDSC_s)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--batch", type=int, default=1, help="new frames per network call (default 1)")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--half", action="store_const", const="fp16", dest="half", default=None,
                           help="float16 autocast, channels_last (CUDA)")
    precision.add_argument("--bf16", action="store_const", const="bf16", dest="half", help="bfloat16 autocast")
    parser.add_argument("--compile", action="store_true", help="torch.compile the network")
    parser.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                        help="CUDA-graph replay (default: on CUDA, as edsc-interpolate)")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="cuDNN timing its algorithms for the frame size (edsc-interpolate --cudnn-benchmark)")
    parser.add_argument("--preset", default=None, help="x264 preset of the output (default: the encoder's, medium)")
    parser.add_argument("--blend", action="store_true",
                        help="replace the network by the mean of the two frames (the tool's own overhead)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement; the median (default 3)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    return parser


def _timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def run(args) -> dict:
    device = torch.device(args.device or default_device())
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {args.device}: no CUDA GPU is available")
    if args.frames < 3:
        raise UserError(f"--frames must be at least 3, got {args.frames}")
    if args.repeat < 1 or args.batch < 1:
        raise UserError("--repeat and --batch must be at least 1")
    av = require("av", "the video benchmark")
    with tempfile.TemporaryDirectory(prefix="edsc-video-benchmark-") as folder:
        folder = Path(folder)
        width, height = args.size
        clip = args.input or make_clip(folder / "clip.mp4", width, height, args.frames)
        src: Source = open_source(clip)
        if args.weights is not None:
            model = load_model(args.weights, device=device)
            weights = str(args.weights)
        else:
            torch.manual_seed(0)
            model = EDSC_s().to(device).eval()
            weights = "EDSC_s, random weights"
        engine_class = BlendInterpolator if args.blend else Interpolator
        engine = engine_class(model, batch=args.batch, half=args.half or False, compile=args.compile,
                              cuda_graph=args.cuda_graph)
        layout = src.layout
        decoded = list(src.frames())  # (time, host array) of every frame, for the runs without I/O
        new_frames = len(decoded) - 1

        # The model's inputs: every frame converted and on the device beforehand.
        on_device = [to_model(torch.from_numpy(a).to(device), layout) for _, a in decoded]
        jobs = [(on_device[i], on_device[i + 1], Fraction(1, 2)) for i in range(new_frames)]

        def model_only():
            engine.interpolate_bgr(jobs)
            harness.synchronize(device)

        def tool_in_memory():
            schedule = Schedule(factor=2, start=src.times[0], tolerance=src.time_base / 2)
            stream_frames(engine, src, NullSink(layout), schedule, frames=lambda: iter(decoded))

        results = {}

        def tool_with_io():
            results["io"] = interpolate_video(model, src, folder / "out.mp4", factor=2, preset=args.preset,
                                              show_progress=False, quiet=True, engine=engine)
            (folder / "out.mp4").unlink()

        # Set-up outside the timed runs: capture or compile, the first calls of every path.
        start = time.perf_counter()
        engine.prepare(src.height, src.width)
        engine.interpolate_bgr(jobs[:engine.batch])
        harness.synchronize(device)
        setup = time.perf_counter() - start
        tool_in_memory()
        engine.paths.clear()
        runs = {"model": [], "memory": [], "io": []}
        for _ in range(args.repeat):  # interleaved, so that a slow spell of a shared machine hits all three
            runs["model"].append(_timed(model_only))
            runs["memory"].append(_timed(tool_in_memory))
            runs["io"].append(_timed(tool_with_io))
    io = results["io"]
    if io.interpolated != new_frames:  # scene cuts in a clip of one's own (--input): fewer network calls
        raise UserError(f"{clip}: {io.interpolated} of {new_frames} frames interpolated ({io.cuts} scene cuts); the "
                        "comparison with the model needs a clip without cuts")
    model_s = statistics.median(runs["model"])
    rows = []
    for key, name in (("model", "model only (frames on the device)"),
                      ("memory", "tool, no I/O (frames in memory, no decoding or encoding)"),
                      ("io", "tool with I/O (file in, encoded file out)")):
        seconds = statistics.median(runs[key])
        rows.append({"run": key, "name": name, "seconds": seconds, "all_seconds": runs[key],
                     "new_frames_per_s": new_frames / seconds,
                     "output_frames_per_s": None if key == "model" else io.frames / seconds,
                     "vs_model": model_s / seconds})
    return {
        "device": harness.device_description(device), "pyav": av.__version__, "python": platform.python_version(),
        "clip": str(args.input) if args.input else f"generated {src.width}x{src.height}, {len(decoded)} frames, 24 fps",
        "width": src.width, "height": src.height, "frames": len(decoded), "new_frames": new_frames,
        "output_frames": io.frames, "weights": weights, "batch": engine.batch, "precision": engine.precision,
        "network": ", ".join(sorted(engine.paths)), "blend": bool(args.blend), "encoding": io.encoding,
        "host_layout": layout.format, "setup_s": setup, "repeat": args.repeat, "rows": rows,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "command": " ".join([harness.command_name("edsc-video-benchmark", "edsc_ext.benchmarks.video"),
                             *sys.argv[1:]]) if sys.argv else "",
    }


def format_report(report: dict) -> str:
    lines = [
        f"edsc-interpolate x2 throughput: {report['clip']} ({report['new_frames']} new frames, "
        f"{report['output_frames']} written), {report['weights']}",
        f"device: {report['device']}, PyAV {report['pyav']}; batch {report['batch']}, {report['precision']}, "
        f"network: {report['network']}{' (blend: no network)' if report['blend'] else ''}; host frames "
        f"{report['host_layout']}; output {report['encoding']}; set-up {report['setup_s']:.2f} s; cuDNN "
        f"autotuning {'on' if report.get('cudnn_benchmark') else 'off'}",
        "",
        f"| run | new frames/s | output frames/s | s (median of {report['repeat']}) | vs model |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in report["rows"]:
        out = "—" if row["output_frames_per_s"] is None else f"{row['output_frames_per_s']:.1f}"
        lines.append(f"| {row['name']} | {row['new_frames_per_s']:.1f} | {out} | {row['seconds']:.3f} | "
                     f"{100 * row['vs_model']:.0f}% |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    try:
        with cudnn_autotuning(args.cudnn_benchmark):
            report = run(args)
    except UserError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
