"""Throughput of ``edsc-interpolate``'s video path: x2 of a generated clip against the network alone, and
where the time goes (the stage profile), in one run.

    edsc-video-benchmark                          # 1920x1080, 48 frames, EDSC_s
    edsc-video-benchmark --batch 2 --json video.json
    edsc-video-benchmark --size 3840x2160 --model EDSC_m --device cuda:0,cuda:1
    edsc-video-benchmark --size 320x192 --frames 12 --device cpu --repeat 1
    edsc-video-benchmark --presets                # x264's speed at each preset, on the same clip

(``python -m edsc_ext.benchmarks.video`` or ``edsc-benchmark --video`` run it too.)

Each figure is new (interpolated) frames per second, the median of ``--repeat`` runs:

- **model only**: the network as the tool runs it (the same engines: batch, precision, CUDA graph
  or compile, one per device), on the clip's frames already converted and on the device; the frames
  it makes stay there;
- **tool, no I/O**: the tool's stream (decode thread, uploads, colour conversions, network,
  downloads, encode thread) on the clip's frames decoded beforehand into host memory, into a sink
  that waits for each frame to reach the host and drops it: no decoding, no encoding;
- **tool with I/O**: ``edsc-interpolate --video clip.mp4 -o out.mp4`` proper: the file decoded,
  the output encoded (x264 at the input's CRF, at the tool's default preset unless ``--preset``)
  and written, the audio copied;

and each tool figure's ratio to the model's, then the **stage profile** of the last run with I/O
(:mod:`edsc_ext.apps.stages`: per stage its busy time, frames/s, share of the run, CPU cores, and the
bound). The clip (:func:`make_clip`): a panning multi-scale texture with moving blocks and a stereo AAC
track, 24 fps, H.264 (x264 CRF 18), made once per run (``--input`` takes another video, without scene
cuts). The network: ``--init blending`` (the default) is EDSC with every layer computed but heads that
make the mean of the two frames, so that the encoder sees frames like a trained network's (random
weights make noise, which x264 encodes far more slowly); ``random`` seeded random weights;
``--weights`` a checkpoint; ``--blend`` replaces the network by the mean itself, which leaves the
tool's own overhead. Set-up (CUDA-graph capture, compile, the first calls) is done before the timed
runs, on the same engines.
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
from ..apps.engine import Interpolator, load_model
from ..apps.frames import host_tensor, to_model
from ..apps.interpolate import Source, interpolate_video, open_source, parse_devices, replicate, stream_frames
from ..apps.stages import StageProfile
from ..apps.timing import Schedule
from ..apps.video import frame_to_host
from ..models import EDSC, EDSC_m, EDSC_s
from . import harness

__all__ = ["main", "make_clip", "BlendInterpolator", "blending_network"]


# --------------------------------------------------------------------------------------------
# The clip.


def _periodic_noise(rng: np.random.Generator, height: int, width: int, scales: Sequence[int],
                    weights: Sequence[float]) -> np.ndarray:
    """A sum of bilinearly upsampled random grids (cells of ``scale`` pixels), periodic along x with
    period ``width`` (a pan can wrap around), in [0, 1]. float64 numpy on one thread: the same values
    on every machine and under any load (torch's threads split the work where its rounding differs)."""
    out = np.zeros((height, width))
    for scale, weight in zip(scales, weights):
        cells_x = max(2, round(width / scale))
        cells_y = max(2, -(-height // scale) + 1)
        grid = rng.random((cells_y, cells_x))
        grid = np.concatenate([grid, grid[:, :1]], axis=1)  # the first column again at x = width: periodic
        x = np.arange(width) * (cells_x / width)
        rows = np.stack([np.interp(x, np.arange(cells_x + 1), row) for row in grid])  # (cells_y, width)
        y = np.arange(height) * ((cells_y - 1) / max(1, height - 1))
        top = np.minimum(np.floor(y).astype(int), cells_y - 2)
        frac = (y - top)[:, None]
        out += weight * (rows[top] * (1 - frac) + rows[top + 1] * frac)
    out -= out.min()
    return out / max(out.max(), 1e-6)


def make_clip(path: Path, width: int, height: int, frames: int, rate: int = 24, seed: int = 0, audio: bool = False,
              crf: float = 18, preset: str = "veryfast", pix_fmt: str = "yuv420p") -> Path:
    """Writes a deterministic test clip (same arguments, same frames): a multi-scale texture (detail
    from 4 to 256 pixels, coloured) panning about width/240 pixels a frame and bobbing up and down,
    with five solid blocks moving across it at their own speeds: motion the network and the encoder
    both have work with, well below the scene-cut threshold. H.264 (x264 at ``crf``, ``preset``, frame
    threads), 8-bit ``yuv420p`` or 10-bit ``yuv420p10le`` (the texture's finer levels included); with
    ``audio`` a stereo AAC track of tones as long as the video. The frames are written as planes (no
    colour conversion), so a 60 s 1080p clip takes seconds."""
    av = require("av", "the video benchmark")
    deep = pix_fmt == "yuv420p10le"
    if pix_fmt not in ("yuv420p", "yuv420p10le"):
        raise UserError(f"the test clip is yuv420p or yuv420p10le, not {pix_fmt}")
    if width % 2 or height % 2 or width < 16 or height < 16:
        raise UserError(f"the test clip's size must be even and at least 16x16, got {width}x{height}")
    rng = np.random.default_rng(seed)
    step = max(2, width // 240 // 2 * 2)  # pixels a frame, even: the chroma moves by whole pixels
    bob = max(2, height // 60 // 2 * 2)  # vertical swing, even
    texture_w = max(width * 2, 64) // 4 * 4
    texture_h = height + 2 * bob
    unit = 4 if deep else 1  # codes of one 8-bit level
    luma = _periodic_noise(rng, texture_h, texture_w, (256, 64, 16, 4), (0.45, 0.3, 0.15, 0.1))
    chroma = [_periodic_noise(rng, texture_h // 2, texture_w // 2, (128, 32, 8), (0.5, 0.3, 0.2)) for _ in range(2)]
    dtype = np.uint16 if deep else np.uint8
    planes = [np.round(16 * unit + 219 * unit * luma).astype(dtype)]
    planes += [np.clip(np.round(128 * unit + 100 * unit * (c - 0.5)), 16 * unit, 240 * unit).astype(dtype)
               for c in chroma]
    count = 5
    sizes = (rng.uniform(0.06, 0.16, count) * height).astype(int) // 2 * 2 + 2
    start = rng.uniform(0, 1, (count, 2)) * [width, height]
    velocity = rng.uniform(-1, 1, (count, 2)) * width / 200
    colours = rng.integers(30, 226, (count, 3)) * unit
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=rate, options={"crf": f"{crf:g}", "preset": preset})
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        stream.codec_context.thread_type = "AUTO"  # frame threads
        sound = None
        if audio:
            sound = out.add_stream("aac", rate=48000)
            sound.layout = "stereo"
        samples_done = 0
        for k in range(frames):
            frame = av.VideoFrame(width, height, pix_fmt)
            x0 = (k * step) % texture_w
            y0 = bob + int(round(bob * np.sin(2 * np.pi * k / (4 * rate)))) // 2 * 2
            views = []
            for plane, texture, sub in zip(frame.planes, planes, (1, 2, 2)):
                w, h = width // sub, height // sub
                view = np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)[:h, :w * texture.itemsize]
                view = view.view(dtype)
                x, y = x0 // sub, y0 // sub
                first = min(w, texture.shape[1] - x)
                view[:, :first] = texture[y:y + h, x:x + first]
                view[:, first:] = texture[y:y + h, :w - first]
                views.append(view)
            # Blocks bouncing off the edges.
            where = np.abs((start + velocity * k + [width, height]) % (2 * np.array([width, height])) - [width, height])
            for (cx, cy), r, colour in zip(where.astype(int) // 2 * 2, sizes, colours):
                x1, x2, y1, y2 = max(0, cx - r), min(width, cx + r), max(0, cy - r), min(height, cy + r)
                for view, value, sub in zip(views, colour, (1, 2, 2)):
                    view[y1 // sub:y2 // sub, x1 // sub:x2 // sub] = value
            frame.pts = k
            out.mux(stream.encode(frame))
            if sound is not None:
                until = 48000 * (k + 1) // rate
                while samples_done < until:
                    t = (samples_done + np.arange(1024)) / 48000
                    wave = (0.15 * np.sin(2 * np.pi * 220 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 0.25 * t))
                            + 0.1 * np.sin(2 * np.pi * 331 * t))
                    chunk = np.stack([wave, np.roll(wave, 7)]).astype(np.float32)
                    samples = av.AudioFrame.from_ndarray(chunk, format="fltp", layout="stereo")
                    samples.sample_rate, samples.pts = 48000, samples_done
                    out.mux(sound.encode(samples))
                    samples_done += 1024
        out.mux(stream.encode(None))
        if sound is not None:
            out.mux(sound.encode(None))
    return path


# --------------------------------------------------------------------------------------------
# The networks.


def blending_network(multiple: bool = False, sampling: str = "compat", seed: int = 0) -> EDSC:
    """EDSC (EDSC_m with ``multiple``) whose every layer runs as in a trained one but whose heads'
    last convolutions are zero with biases set so that the output is the mean of the two frames:
    kernels of a single centre tap, no offsets, masks of 0.5 and no residual. Its cost is the
    network's; its frames are what an encoder sees from a real interpolation (two frames' mix), not
    the noise of random weights."""
    torch.manual_seed(seed)
    model = (EDSC_m if multiple else EDSC_s)(sampling=sampling).eval()
    k = model.kernel_size
    centre = (k - 1) // 2 + (1 if sampling == "compat" else 0)  # the original's taps start one pixel early
    with torch.no_grad():
        for name, module in model.named_children():
            if not name.startswith(("moduleVertical", "moduleHorizontal", "moduleOffset", "moduleMask", "moduleBias")):
                continue
            last = module[7]
            last.weight.zero_()
            last.bias.zero_()
            if name.startswith(("moduleVertical", "moduleHorizontal")):
                last.bias[centre] = 1.0
    return model


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
        payload = item[0]
        if hasattr(payload, "get"):
            payload.get()
        self.frames += 1

    def finish(self) -> None:
        pass

    def abort(self) -> None:
        pass


# --------------------------------------------------------------------------------------------
# The command.


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
                           description="Throughput of edsc-interpolate's video path against the network alone, "
                                       "and where the time goes (the stage profile).")
    parser.add_argument("--size", type=_parse_size, default=(1920, 1080), help="WIDTHxHEIGHT (default 1920x1080)")
    parser.add_argument("--frames", type=int, default=48, help="frames of the generated clip (default 48)")
    parser.add_argument("--input", type=Path, default=None, help="a video to use instead of the generated clip")
    parser.add_argument("--model", choices=("EDSC_s", "EDSC_m"), default="EDSC_s",
                        help="the network without --weights (default EDSC_s)")
    parser.add_argument("--init", choices=("blending", "random"), default="blending",
                        help="its weights without --weights: heads that blend the two frames, every layer computed "
                             "(default), or random ones")
    parser.add_argument("--weights", default=None, help="an EDSC checkpoint (default: --model with --init)")
    parser.add_argument("--device", default=None,
                        help="torch device, or several separated by commas (cuda:0,cuda:1; cuda:all) (default: "
                             "cuda if available, else cpu)")
    parser.add_argument("--batch", type=int, default=1, help="new frames per network call (default 1)")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--half", action="store_const", const="fp16", dest="half", default=None,
                           help="float16 autocast, channels_last (default on CUDA, as edsc-interpolate)")
    precision.add_argument("--bf16", action="store_const", const="bf16", dest="half", help="bfloat16 autocast")
    precision.add_argument("--float32", action="store_const", const=False, dest="half",
                           help="float32 (the default on the CPU)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the network")
    parser.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                        help="CUDA-graph replay (default: on CUDA, as edsc-interpolate)")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="cuDNN timing its algorithms for the frame size (edsc-interpolate --cudnn-benchmark)")
    parser.add_argument("--preset", default=None,
                        help="x264 preset of the output (default: edsc-interpolate's: veryfast on CUDA, medium on "
                             "the CPU)")
    parser.add_argument("--blend", action="store_true",
                        help="replace the network by the mean of the two frames (the tool's own overhead)")
    parser.add_argument("--presets", action="store_true",
                        help="instead: x264's encoding speed at each preset on the clip's frames (frame threads as "
                             "edsc-interpolate sets them), against medium's")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement; the median (default 3)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    return parser


PRESETS_MEASURED = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")


def preset_speeds(clip: Path, repeat: int, crf: float = 18) -> dict:
    """x264's frames/s at each preset on ``clip``'s decoded frames (in memory, encoded into memory, the
    presets interleaved ``repeat`` times, the median), frame threads as the tool sets them, and the
    output's size."""
    import io

    from ..apps.interpolate import encoder_threads
    from ..apps.stages import cpu_cores

    av = require("av", "the video benchmark")
    with av.open(str(clip)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        decoded = list(container.decode(stream))
        rate = Fraction(stream.average_rate or 24)  # PyAV reads it from the open container only
    threads = encoder_threads(cpu_cores())
    seconds: dict = {p: [] for p in PRESETS_MEASURED}
    sizes = {}
    for _ in range(repeat):
        for preset in PRESETS_MEASURED:
            buffer = io.BytesIO()
            with av.open(buffer, "w", format="matroska") as out:
                video_stream = out.add_stream("libx264", rate=rate, options={"crf": f"{crf:g}", "preset": preset})
                video_stream.width, video_stream.height = decoded[0].width, decoded[0].height
                video_stream.pix_fmt = decoded[0].format.name
                video_stream.codec_context.thread_type = "AUTO"
                video_stream.codec_context.thread_count = threads
                start = time.perf_counter()
                for k, frame in enumerate(decoded):
                    frame.pict_type = 0
                    frame.pts = k
                    out.mux(video_stream.encode(frame))
                out.mux(video_stream.encode(None))
                seconds[preset].append(time.perf_counter() - start)
            sizes[preset] = len(buffer.getvalue())
    medium = statistics.median(seconds["medium"])
    return {"frames": len(decoded), "size": f"{decoded[0].width}x{decoded[0].height}", "threads": threads,
            "rows": [{"preset": p, "frames_per_s": len(decoded) / statistics.median(seconds[p]),
                      "vs_medium": medium / statistics.median(seconds[p]), "bytes": sizes[p],
                      "all_seconds": seconds[p]} for p in PRESETS_MEASURED]}


def format_presets(report: dict) -> str:
    lines = [f"x264 on {report['frames']} frames of the {report['size']} test clip, CRF 18, {report['threads']} "
             "frame threads (median of the runs):", "",
             "| preset | frames/s | speed against medium | size against medium |", "| --- | ---: | ---: | ---: |"]
    medium = next(r["bytes"] for r in report["rows"] if r["preset"] == "medium")
    for row in report["rows"]:
        lines.append(f"| {row['preset']} | {row['frames_per_s']:.1f} | {row['vs_medium']:.2f} | "
                     f"{row['bytes'] / medium:.2f} |")
    return "\n".join(lines)


def _timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def _network(args, device: torch.device):
    if args.weights is not None:
        return load_model(args.weights, device=device), str(args.weights)
    model = blending_network(args.model == "EDSC_m") if args.init == "blending" else None
    if model is None:
        torch.manual_seed(0)
        model = (EDSC_m() if args.model == "EDSC_m" else EDSC_s()).eval()
    return model.to(device), f"{args.model}, {args.init} weights"


def run(args) -> dict:
    devices = parse_devices(args.device)
    if args.frames < 3:
        raise UserError(f"--frames must be at least 3, got {args.frames}")
    if args.repeat < 1 or args.batch < 1:
        raise UserError("--repeat and --batch must be at least 1")
    av = require("av", "the video benchmark")
    with tempfile.TemporaryDirectory(prefix="edsc-video-benchmark-") as folder:
        folder = Path(folder)
        width, height = args.size
        clip = args.input or make_clip(folder / "clip.mp4", width, height, args.frames, audio=True)
        src: Source = open_source(clip)
        model, weights = _network(args, devices[0])
        half = args.half if args.half is not None else ("fp16" if devices[0].type == "cuda" else False)
        engine_class = BlendInterpolator if args.blend else Interpolator
        engines = [engine_class(replica, batch=args.batch, half=half, compile=args.compile,
                                cuda_graph=args.cuda_graph) for replica in replicate(model, devices)]
        layout = src.layout
        decoded = list(src.frames())  # (time, av.VideoFrame) of every frame, for the runs without I/O
        new_frames = len(decoded) - 1

        # The model's inputs: every frame converted and on each device beforehand.
        hosts = [frame_to_host(frame, layout) for _, frame in decoded]
        inputs = {str(e.device): [to_model(host_tensor(h).to(e.device), layout) for h in hosts] for e in engines}

        def model_only():
            for start in range(0, new_frames, args.batch * len(engines)):  # batches dealt out in turn
                for k, e in enumerate(engines):
                    first = start + k * args.batch
                    frames = inputs[str(e.device)]
                    jobs = [(frames[i], frames[i + 1], Fraction(1, 2))
                            for i in range(first, min(first + args.batch, new_frames))]
                    if jobs:
                        e.interpolate_bgr(jobs)
            for device in dict.fromkeys(e.device for e in engines):
                harness.synchronize(device)

        def tool_in_memory():
            schedule = Schedule(factor=2, start=src.times[0], tolerance=src.time_base / 2)
            stream_frames(engines, src, NullSink(layout), schedule, frames=lambda: iter(decoded))

        results = {}

        def tool_with_io():
            results["io"] = interpolate_video(model, src, folder / "out.mp4", factor=2, preset=args.preset,
                                              show_progress=False, quiet=True, engine=engines,
                                              profile=StageProfile())
            (folder / "out.mp4").unlink()

        # Set-up outside the timed runs: capture or compile, the first calls of every path.
        start = time.perf_counter()
        for e in engines:
            e.prepare(src.height, src.width)
        model_only()
        setup = time.perf_counter() - start
        tool_in_memory()
        for e in engines:
            e.paths.clear()
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
    paths = sorted({p for e in engines for p in e.paths})
    return {
        "device": "; ".join(dict.fromkeys(harness.device_description(e.device) for e in engines)),
        "devices": [str(e.device) for e in engines], "pyav": av.__version__, "python": platform.python_version(),
        "clip": str(args.input) if args.input else f"generated {src.width}x{src.height}, {len(decoded)} frames, 24 fps",
        "width": src.width, "height": src.height, "frames": len(decoded), "new_frames": new_frames,
        "output_frames": io.frames, "weights": weights, "batch": engines[0].batch, "precision": engines[0].precision,
        "network": ", ".join(paths), "blend": bool(args.blend), "encoding": io.encoding,
        "host_layout": layout.format, "setup_s": setup, "repeat": args.repeat, "rows": rows,
        "cudnn_benchmark": torch.backends.cudnn.benchmark, "stage_profile": io.profile.summary(),
        "stage_table": io.profile.table(),
        "command": " ".join([harness.command_name("edsc-video-benchmark", "edsc_ext.benchmarks.video"),
                             *sys.argv[1:]]) if sys.argv else "",
    }


def format_report(report: dict) -> str:
    lines = [
        f"edsc-interpolate x2 throughput: {report['clip']} ({report['new_frames']} new frames, "
        f"{report['output_frames']} written), {report['weights']}",
        f"device: {report['device']} ({', '.join(report['devices'])}), PyAV {report['pyav']}; batch "
        f"{report['batch']}, {report['precision']}, network: {report['network']}"
        f"{' (blend: no network)' if report['blend'] else ''}; host frames {report['host_layout']}; output "
        f"{report['encoding']}; set-up {report['setup_s']:.2f} s; cuDNN autotuning "
        f"{'on' if report.get('cudnn_benchmark') else 'off'}",
        "",
        f"| run | new frames/s | output frames/s | s (median of {report['repeat']}) | vs model |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in report["rows"]:
        out = "—" if row["output_frames_per_s"] is None else f"{row['output_frames_per_s']:.1f}"
        lines.append(f"| {row['name']} | {row['new_frames_per_s']:.1f} | {out} | {row['seconds']:.3f} | "
                     f"{100 * row['vs_model']:.0f}% |")
    lines += ["", "Stage profile of the last run with I/O:", "", report["stage_table"]]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    try:
        if args.presets:
            with tempfile.TemporaryDirectory(prefix="edsc-video-benchmark-") as folder:
                clip = args.input or make_clip(Path(folder) / "clip.mp4", *args.size, args.frames)
                report = preset_speeds(clip, args.repeat)
            print(format_presets(report))
        else:
            with cudnn_autotuning(args.cudnn_benchmark):
                report = run(args)
            print(format_report(report))
    except UserError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
