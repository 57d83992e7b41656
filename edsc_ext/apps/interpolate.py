"""``edsc-interpolate``: frame interpolation with an EDSC checkpoint, for an image pair, a folder of
frames or a video file.

Pair of images (EDSC_s gives the midpoint; EDSC_m any ``--time`` in (0, 1))::

    edsc-interpolate --weights EDSC_s.pth first.png second.png -o middle.png
    edsc-interpolate --weights EDSC_m.pth --time 0.25 first.png second.png -o quarter.png

Video (a video file FFmpeg reads, or a folder of frames sorted by name)::

    edsc-interpolate --weights EDSC_s.pth --video clip.mp4 -o clip_x2.mp4             # --factor 2
    edsc-interpolate --weights EDSC_m.pth --video clip.mp4 -o clip_60.mp4 --fps 60
    edsc-interpolate --weights EDSC_s.pth --video frames/ -o frames_x4/ --factor 4

Frames stream through a decode thread, the network (main thread) and an encode thread, joined by
bounded queues; see :mod:`edsc_ext.apps.timing` for where the output frames sit and the scene-cut
measure, :mod:`edsc_ext.apps.engine` for batches and tiles, :mod:`edsc_ext.apps.video` for the
codec, CRF, pixel format and the copied audio. Outputs are written under a temporary name and
renamed at the end; a missing output folder is created (and said so). Bad input is one line on
stderr and exit code 2. Also runnable as ``python -m edsc_ext.apps.interpolate``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ..models import EDSC, MODEL_NAMES, SAMPLINGS
from . import images, video
from .common import (
    OneLineParser,
    Stopped,
    UserError,
    atomic_path,
    cudnn_autotuning,
    describe_os_error,
    ensure_output_folder,
    note,
    progress,
    refuse_input_as_output,
    signals_stop_the_run,
    time_in_unit_interval,
)
from .engine import (
    DEFAULT_MARGIN,
    MAX_BISECTION_DEPTH,
    Interpolator,
    default_device,
    is_dyadic,
    load_model,
)
from .frames import HostFrame, Layout, Transfer, from_model, to_model, yuv_layout_of
from .timing import DEFAULT_SCENE_THRESHOLD, Schedule, luma_thumbnail, parse_rate, scene_score

__all__ = ["main", "build_parser", "load_model", "interpolate_frames", "interpolate_video", "progress", "read_frames",
           "VideoResult", "default_device", "open_source", "Source", "stream_frames", "luma_thumbnail_of"]

PROG = "edsc-interpolate"
QUEUE_SIZE = 4  # frames waiting between the decode thread, the network and the encode thread


# --------------------------------------------------------------------------------------------
# Pairs of frames (the library API).


def interpolate_frames(model: EDSC, first: Tensor, second: Tensor, factor: int = 2,
                       times: Optional[Sequence[float]] = None) -> List[Tensor]:
    """New frames between two RGB frames (3, H, W) in [0, 1], as float tensors on the CPU.

    By default the ``factor - 1`` frames at times k/factor. EDSC_m computes each time directly;
    EDSC_s needs them dyadic (``factor`` a power of two) and bisects. ``times`` overrides the schedule.
    """
    if times is None:
        if factor < 1:
            raise ValueError(f"factor must be >= 1, got {factor}")
        if not model.multiple and factor & (factor - 1):
            raise ValueError(f"EDSC_s can multiply the frame rate by a power of two only, got {factor}")
        times = [Fraction(k, factor) for k in range(1, factor)]
    if not model.multiple and any(not is_dyadic(t) for t in times):
        raise ValueError("EDSC_s interpolates midpoints only (t = 1/2, 1/4, ...): use EDSC_m weights for other times")
    engine = Interpolator(model, cuda_graph=False)  # one call: a capture would cost more than it saves
    return [f.float().cpu() for f in engine.interpolate([(first, second, t) for t in times])]


# --------------------------------------------------------------------------------------------
# Sources: a video file or a folder of frames, as (time, (H, W, 3) array) items.


@dataclass
class Source:
    path: Path
    width: int
    height: int
    times: List[Fraction]  # the frames' times (seconds)
    end: Optional[Fraction]  # when the last frame ends (None: the last frame is the end)
    rate: Fraction
    time_base: Fraction
    info: Optional[video.VideoInfo] = None  # a video file's
    files: List[Path] = field(default_factory=list)  # a folder's

    @property
    def layout(self) -> Layout:
        """How the decode thread hands frames over: a video's own 4:2:0 planes where the device
        converts them (:mod:`edsc_ext.apps.frames`), else RGB (8 bits; 16 for deeper video)."""
        info = self.info
        if info is not None and not info.deep:
            planar = yuv_layout_of(info.frame_format, info.frame_colorspace, info.frame_color_range, self.width,
                                   self.height)
            if planar is not None:
                return planar
        return Layout("rgb48le" if info is not None and info.deep else "rgb24", self.height, self.width)

    def frames(self):
        if self.info is not None:
            return video.decode_frames(self.info, planes=self.layout.format == "yuv420p")
        return ((t, images.read_array(f)) for t, f in zip(self.times, self.files))


def _folder_source(folder: Path, rate: Fraction) -> Source:
    try:
        files = sorted(p for p in folder.iterdir() if p.is_file() and images.is_image_name(p))
    except OSError as e:
        raise UserError(describe_os_error(e, folder)) from None
    if len(files) < 2:
        raise UserError(f"--video {folder}: the folder holds {len(files)} image file(s) "
                        f"({', '.join(images.IMAGE_EXTENSIONS)}); a video needs at least two frames")
    first_size = images.image_size(files[0])
    for f in files[1:]:
        size = images.image_size(f)
        if size != first_size:
            raise UserError(f"frames differ in size: {files[0]} is {first_size[0]}x{first_size[1]}, {f} is "
                            f"{size[0]}x{size[1]}")
    times = [Fraction(k) / rate for k in range(len(files))]
    # Each frame lasts one period, as a video's: N frames last N / rate, and so does the output.
    return Source(path=folder, width=first_size[0], height=first_size[1], times=times, end=Fraction(len(files)) / rate,
                  rate=rate, time_base=1 / rate, files=files)


def open_source(path, input_fps: Optional[Fraction] = None) -> Source:
    """A folder of frames or a video file, checked (readable, two frames or more, one size)."""
    path = Path(path)
    if path.is_dir():
        return _folder_source(path, input_fps or Fraction(25))
    if not path.exists():
        raise UserError(f"--video {path}: no such file or folder")
    if input_fps is not None:
        raise UserError("--input-fps is for a folder of frames (a video file has its own timestamps)")
    info = video.probe(path)
    return Source(path=path, width=info.width, height=info.height, times=info.times, end=info.end, rate=info.rate,
                  time_base=info.time_base, info=info)


def read_frames(source) -> tuple:
    """(iterator of RGB (3, H, W) float tensors, number of frames, frame rate) of a folder of images
    or a video file."""
    src = open_source(source)
    return ((images.array_to_tensor(a) for _, a in src.frames()), len(src.times), float(src.rate))


# --------------------------------------------------------------------------------------------
# Outputs.


def _output_kind(raw: str) -> str:
    """'folder' or 'video' for the -o of video mode; a UserError for anything else."""
    path = Path(raw)
    if raw.endswith(("/", os.sep)) or path.is_dir() or not path.suffix:
        return "folder"
    if video.is_video_name(path):
        return "video"
    if images.is_image_name(path):
        raise UserError(f"-o {raw}: in video mode the output is a video file ({', '.join(video.VIDEO_EXTENSIONS)}) or "
                        "a folder of frames, not one image")
    raise UserError(f"-o {raw}: unknown video extension {path.suffix!r} (use {', '.join(video.VIDEO_EXTENSIONS)}, or "
                    "a folder name ending in /)")


@dataclass
class VideoResult:
    """What :func:`interpolate_video` did."""

    frames: int  # written
    interpolated: int  # of which synthesised
    cuts: int  # scene cuts found (None: detection off)
    width: int
    height: int
    rate: Fraction
    target: Path
    kind: str  # 'video' or 'folder'
    encoding: str = ""
    copied: List[str] = field(default_factory=list)
    tiles: int = 0
    network: str = ""  # what ran: "graph fp16", "eager fp32", ... (Interpolator.paths)
    rotation: int = 0  # the display matrix's turn kept on the output (degrees counter-clockwise)
    turned: int = 0  # degrees the pixels were turned by instead


def _plan(source: Source, factor: Optional[int], fps: Optional[Fraction], tolerance: Fraction,
          snap: Optional[int]) -> tuple:
    """A dry run of the schedule over the source's timestamps: (number of output frames, the
    positions to interpolate at, whether every output time is on the grid of the output rate)."""
    schedule = Schedule(factor=factor, fps=fps, start=source.times[0], tolerance=tolerance, snap_depth=snap)
    rate = fps if fps is not None else source.rate * factor
    count, positions, on_grid = 0, set(), True
    outputs = []
    for i in range(len(source.times) - 1):
        outputs = schedule.between(i, source.times[i], source.times[i + 1])
        count += len(outputs)
        for out in outputs:
            on_grid = on_grid and ((out.time - source.times[0]) * rate).denominator == 1
            if not out.is_copy:
                positions.add(out.position)
    tail = schedule.after_last(len(source.times) - 1, source.times[-1], source.end)
    on_grid = on_grid and all(((out.time - source.times[0]) * rate).denominator == 1 for out in tail)
    return count + len(tail), positions, on_grid


def interpolate_video(model: EDSC, source, target, factor: Optional[int] = None, fps=None, *,
                      input_fps=None, scene_threshold: Optional[float] = DEFAULT_SCENE_THRESHOLD,
                      tile: Optional[int] = None, margin: int = DEFAULT_MARGIN, batch: int = 1, half=False,
                      compile: bool = False, cuda_graph: Optional[bool] = None, codec: Optional[str] = None,
                      crf: Optional[float] = None, pix_fmt: Optional[str] = None, preset: Optional[str] = None,
                      audio: bool = True, show_progress: bool = True, quiet: bool = False,
                      engine: Optional[Interpolator] = None) -> VideoResult:
    """Converts ``source`` (a video file or a folder of frames) into ``target`` (a video file, or a
    folder of numbered PNGs) at ``factor`` times its frame rate, or at ``fps``. Every check (the
    input, the output name, EDSC_s positions) comes before anything is written; the output appears
    under its name only when complete. ``scene_threshold=None`` turns scene detection off.
    ``engine``: an :class:`Interpolator` of ``model`` to use (its CUDA graph, compiled network and
    settings kept from clip to clip) instead of one made from the speed arguments."""
    if factor is not None and fps is not None:
        raise UserError("give --factor or --fps, not both")
    if factor is None and fps is None:
        factor = 2
    fps = parse_rate(str(fps)) if fps is not None and not isinstance(fps, Fraction) else fps
    input_fps = parse_rate(str(input_fps)) if input_fps is not None and not isinstance(input_fps, Fraction) \
        else input_fps
    if factor is not None and factor < 1:
        raise UserError(f"--factor must be >= 1, got {factor}")
    if scene_threshold is not None and not 0 <= scene_threshold <= 100:
        raise UserError(f"--scene-threshold must be a score in [0, 100], got {scene_threshold}")
    target_raw = str(target)
    kind = _output_kind(target_raw)
    target = Path(target)
    src = source if isinstance(source, Source) else open_source(source, input_fps)
    if kind == "video":
        refuse_input_as_output(target_raw, [src.path])
    if kind == "folder" and target.exists():
        if not target.is_dir():
            raise UserError(f"-o {target}: exists and is not a folder")
        if any(target.iterdir()):
            raise UserError(f"-o {target}: the folder exists and is not empty (frames are written into a new or empty "
                            "folder)")

    # Where the output frames sit; EDSC_s must be able to make all of them (checked before any output).
    # A video's times are rounded to its time base; a folder's are exact (half its "tick", a whole
    # frame period, would make every --fps output frame a copy of the nearest input frame).
    tolerance = src.time_base / 2 if src.info is not None else Fraction(0)
    snap = None if model.multiple else MAX_BISECTION_DEPTH
    if not model.multiple and factor is not None and factor & (factor - 1):
        raise UserError(f"EDSC_s only interpolates midpoints: --factor {factor} needs EDSC_m weights (EDSC_s takes "
                        "--factor 2, 4, 8, ...)")
    total, positions, on_grid = _plan(src, factor, fps, tolerance, snap)
    if not model.multiple:
        bad = sorted(p for p in positions if not is_dyadic(p))
        if bad:
            rate_text = f"--fps {_rate_text(fps)} from {_rate_text(src.rate)} fps" if fps is not None \
                else f"--factor {factor}"
            raise UserError(f"EDSC_s only interpolates midpoints (t = 1/2, 1/4, 3/4, ...), but {rate_text} "
                            f"needs frames "
                            f"at t = {float(bad[0]):.4g} (one of {len(bad)} such positions): use EDSC_m weights")
    if engine is None:
        engine = Interpolator(model, batch=batch, tile=tile, margin=margin, half=half, compile=compile,
                              cuda_graph=cuda_graph, quiet=quiet)

    out_rate = fps if fps is not None else src.rate * factor
    # Constant-rate output: the time base 1/rate (containers such as AVI want it); else (variable-rate
    # input with --factor) the input's time base divided by the factor, which holds every time exactly.
    out_base = 1 / out_rate if on_grid else src.time_base / factor
    ensure_output_folder(target, quiet=quiet, prog=PROG)  # the folder the output goes into
    # A display matrix stays on the output where the container stores one; elsewhere (other
    # containers, PNG frames) the pixels are turned as players would show the input.
    turn = 0
    if src.info is not None and src.info.rotation and (kind == "folder" or
                                                       target.suffix.lower() not in video.KEEPS_DISPLAY_MATRIX):
        turn = src.info.rotation
        if src.info.mirrored:
            note(f"{PROG}: the input's display matrix also mirrors the picture; the output is turned by {turn} "
                 "degrees but not mirrored (a .mp4/.mov/.mkv output keeps the matrix as it is)", quiet)
    out_width, out_height = (src.height, src.width) if turn in (90, 270) else (src.width, src.height)
    detect = scene_threshold is not None
    result = VideoResult(frames=0, interpolated=0, cuts=0 if detect else None, width=out_width, height=out_height,
                         rate=out_rate, target=target, kind=kind)

    with atomic_path(target, folder=(kind == "folder")) as tmp:
        if kind == "video":
            sink = video.VideoSink(tmp, target, out_width, out_height, out_rate, out_base, info=src.info, codec=codec,
                                   crf=crf, pix_fmt=pix_fmt, copy_streams=audio, quiet=quiet,
                                   rate_change=out_rate / src.rate, preset=preset, rotate_pixels=bool(turn))
            result.encoding = f"{sink.encoder} {sink.pix_fmt}" + (f" crf {sink.options['crf']}"
                                                                  if "crf" in sink.options else "")
            if "preset" in sink.options:
                result.encoding += f" preset {sink.options['preset']}"
            result.copied = sink.copied_streams
            result.rotation = src.info.rotation if sink.keeps_rotation else 0
        else:
            sink = video.FolderSink(tmp)
        result.turned = turn
        bar = progress(total=total, desc="interpolating", unit="frame", disable=not show_progress or quiet)
        schedule = Schedule(factor=factor, fps=fps, start=src.times[0], tolerance=tolerance, snap_depth=snap)
        try:
            counts = stream_frames(engine, src, sink, schedule, scene_threshold=scene_threshold, turn=turn,
                                   progress_bar=bar)
        except OSError as e:  # a write (FFmpeg's and Pillow's name no file): named by the output asked for
            named = e.filename is not None and not str(e.filename).startswith(str(tmp))
            raise UserError(describe_os_error(e, e.filename if named else target)) from None
        finally:
            bar.close()
    result.frames, result.interpolated, cuts = counts
    result.cuts = cuts if detect else None
    result.tiles = engine.tiles_used
    result.network = ", ".join(engine.paths) or "none"
    return result


def stream_frames(engine: Interpolator, src: Source, sink, schedule: Schedule, *,
                  scene_threshold: Optional[float] = DEFAULT_SCENE_THRESHOLD, turn: int = 0, progress_bar=None,
                  frames=None) -> Tuple[int, int, int]:
    """Streams the frames of ``src`` (or the (time, array) items ``frames()`` makes, laid out as
    ``src`` decodes them) through the decode thread, ``engine`` (this thread) and the encode thread
    into ``sink``, frames placed by ``schedule``; returns (frames written, of them interpolated,
    scene cuts). ``turn``: degrees counter-clockwise to turn the output's pixels by.

    The decode thread does the host's share of each frame: it decodes, copies the frame into
    page-locked memory and makes its scene thumbnail. This thread only queues work on the device
    (upload, conversion, network, conversion back, download), so it never waits for the GPU; the
    encode thread waits for each frame's download before encoding it."""
    transfer = Transfer(engine.device)
    in_layout = src.layout
    # The sink's 4:2:0 layout (of the turned size where the pixels are turned), else RGB for swscale
    # in the encode thread or for the PNG writer.
    out_layout = sink.layout
    if out_layout is None:
        deep = src.info is not None and src.info.deep and not isinstance(sink, video.FolderSink)
        h, w = (src.width, src.height) if turn in (90, 270) else (src.height, src.width)
        out_layout = Layout("rgb48le" if deep else "rgb24", h, w)
    # Input frames that the output repeats go to the encoder untouched when it takes their layout.
    passthrough = in_layout == out_layout and not turn
    detect = scene_threshold is not None
    make_frames = frames if frames is not None else src.frames

    def host_side():  # the decode thread
        for time, array in make_frames():
            layout = in_layout if in_layout.format == "yuv420p" else Layout(
                "rgb48le" if array.dtype == np.uint16 else "rgb24", src.height, src.width)
            if array.shape != layout.shape:
                height, width = (array.shape[0] * 2 // 3, array.shape[1]) if array.ndim == 2 else array.shape[:2]
                raise UserError(f"{src.path}: a frame is {width}x{height}, the first {src.width}x{src.height} (a size "
                                "change mid-stream is not supported)")
            thumb = luma_thumbnail_of(array, layout) if detect else None
            yield time, array, layout, transfer.pin(array), thumb

    engine.prepare(src.height, src.width)  # a CUDA graph is captured before the other threads start
    writer = video.BackgroundWriter(sink, QUEUE_SIZE)
    reader = video.Prefetch(host_side, QUEUE_SIZE)
    written = interpolated = cuts = 0
    pending: list = []  # (frame record or None, time, job index) in output order
    jobs: list = []

    def flush():
        nonlocal written, interpolated
        made = engine.interpolate_bgr(jobs) if jobs else []
        converted, sources = [], []
        for record, _, job in pending:
            if job is not None:
                sources.append(made[job])
            elif not passthrough:
                sources.append(record[1])
        host_frames = []
        if sources:
            batch = torch.stack(sources)
            if turn:
                batch = torch.rot90(batch, turn // 90, dims=(-2, -1))
            host_frames = transfer.download(from_model(batch, out_layout), out_layout)
        converted = iter(host_frames)
        for record, time, job in pending:
            if job is not None or not passthrough:
                host = next(converted)
                interpolated += job is not None
            else:
                host = HostFrame(record[0], out_layout)
            writer.put((host, time))
            written += 1
            if progress_bar is not None:
                progress_bar.update(1)
        pending.clear()
        jobs.clear()

    try:
        previous = None  # (index, time, (array, tensor), thumbnail)
        index = -1
        for index, (time, array, layout, pinned, thumb) in enumerate(reader):
            tensor = to_model(transfer.upload(pinned), layout)
            record = (array, tensor)
            if previous is not None:
                p_index, p_time, p_record, p_thumb = previous
                cut = detect and scene_score(p_thumb, thumb) > scene_threshold
                cuts += cut
                for out in schedule.between(p_index, p_time, time):
                    if out.is_copy or cut:
                        pending.append((p_record, out.time, None))
                    else:
                        jobs.append((p_record[1], tensor, out.position))
                        pending.append((None, out.time, len(jobs) - 1))
                if len(jobs) >= engine.batch or not jobs:
                    flush()
            previous = (index, time, record, thumb)
        if previous is None:
            raise UserError(f"{src.path}: no frames could be decoded")
        for out in schedule.after_last(previous[0], previous[1], src.end):
            pending.append((previous[2], out.time, None))
        flush()
        writer.close()
    except BaseException:
        reader.close()
        writer.abort()
        raise
    reader.close()
    return written, interpolated, cuts


def luma_thumbnail_of(array: np.ndarray, layout: Layout) -> Tensor:
    """The scene measure's thumbnail of a host frame (see :func:`~edsc_ext.apps.timing.luma_thumbnail`):
    of its Y plane where it has one (scaled to [0, 1] from the video's range), else of its RGB."""
    if layout.format == "yuv420p":
        offset, scale = (0.0, 255.0) if layout.full_range else (16.0, 219.0)
        luma = torch.from_numpy(array[:layout.height]).float().sub_(offset).div_(scale).clamp_(0, 1)
        return luma_thumbnail(luma)
    rgb = torch.from_numpy(array.astype(np.int32) if array.dtype == np.uint16 else array)
    return luma_thumbnail(rgb.permute(2, 0, 1).float().div_(65535.0 if array.dtype == np.uint16 else 255.0))


def _rate_text(rate) -> str:
    rate = Fraction(rate)
    return str(rate.numerator) if rate.denominator == 1 else f"{rate.numerator}/{rate.denominator} (~{float(rate):.3f})"


# --------------------------------------------------------------------------------------------
# Command line.


def _positive_int(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _scene_threshold(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 <= value <= 100:  # a score is 0..100; below 0 every pair of frames would be a cut
        raise argparse.ArgumentTypeError(f"must be a score in [0, 100], got {text}")
    return value


def _rate(text: str) -> Fraction:
    import argparse

    try:
        return parse_rate(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> OneLineParser:
    import argparse

    parser = OneLineParser(
        prog=PROG, description="Interpolate frames with EDSC: an image pair, a folder of frames or a video file.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  edsc-interpolate --weights EDSC_s.pth first.png second.png -o middle.png\n"
               "  edsc-interpolate --weights EDSC_m.pth --time 0.25 a.png b.png -o quarter.png\n"
               "  edsc-interpolate --weights EDSC_s.pth --video clip.mp4 -o clip_x2.mp4\n"
               "  edsc-interpolate --weights EDSC_m.pth --video clip.mp4 -o clip_60.mp4 --fps 60\n"
               "  edsc-interpolate --weights EDSC_s.pth --video frames/ -o frames_x4/ --factor 4\n"
               "\nBad input is reported in one line, exit code 2. Needs: pip install tqdm pillow av")
    parser.add_argument("frames", nargs="*", metavar="FRAME", help="the two input images (pair mode)")
    parser.add_argument("-o", "--output", required=True,
                        help="output image (pair mode), or video file / folder of frames (--video); a missing "
                             "folder is created")
    parser.add_argument("--weights", required=True,
                        help="EDSC checkpoint ({'model_state': ...} as released, or a state "
                        "dict)")
    parser.add_argument("--model", choices=MODEL_NAMES, default=None,
                        help="EDSC_s or EDSC_m (default: read off the weights)")
    parser.add_argument("--time", type=time_in_unit_interval, default=None,
                        help="pair mode: time of the new frame in (0, 1) (EDSC_s: 0.5 only; default 0.5)")
    video_group = parser.add_argument_group("video")
    video_group.add_argument("--video", metavar="INPUT", default=None,
                             help="video mode: a video file (anything FFmpeg reads) or a folder of frames")
    rate = video_group.add_mutually_exclusive_group()
    rate.add_argument("--factor", type=_positive_int, default=None,
                      help="multiply the frame rate by N (default 2; EDSC_s: 2, 4, 8, ...)")
    rate.add_argument("--fps", type=_rate, default=None,
                      help="output frame rate, e.g. 60, 59.94, 24000/1001 (other than a power-of-two factor: EDSC_m)")
    video_group.add_argument("--input-fps", type=_rate, default=None,
                             help="frame rate of a folder of frames (default 25)")
    video_group.add_argument("--scene-threshold", type=_scene_threshold, default=DEFAULT_SCENE_THRESHOLD,
                             help="scene-cut score (mean absolute luma difference, in percent, of 64-pixel "
                                  f"thumbnails) above which no frame is synthesised "
                                  f"(default {DEFAULT_SCENE_THRESHOLD:g})")
    video_group.add_argument("--no-scene-detect", action="store_true", help="interpolate across scene cuts too")
    video_group.add_argument("--codec", default=None,
                             help="video encoder (default: the input's, else the container's; e.g. libx264, libx265, "
                                  "libvpx-vp9)")
    video_group.add_argument("--crf", type=float, default=None,
                             help="encoder quality (default: the input's where its encoder recorded it, else the "
                                  "encoder's default)")
    video_group.add_argument("--pix-fmt", default=None, help="pixel format (default: the input's, e.g. yuv420p)")
    video_group.add_argument("--preset", default=None,
                             help="x264/x265 speed preset, e.g. veryfast (default: the encoder's, medium)")
    video_group.add_argument("--no-audio", action="store_true", help="do not copy the audio and subtitle streams")
    speed = parser.add_argument_group("speed and memory")
    speed.add_argument("--tile", type=int, default=None, metavar="SIZE",
                       help="run the network on overlapping SIZE x SIZE tiles (default: whole frames, tiles on CUDA "
                            "out-of-memory)")
    speed.add_argument("--tile-margin", type=int, default=DEFAULT_MARGIN, metavar="PX",
                       help=f"context around each tile (default {DEFAULT_MARGIN})")
    speed.add_argument("--batch", type=_positive_int, default=1, help="new frames per network call (default 1)")
    precision = speed.add_mutually_exclusive_group()
    precision.add_argument("--half", action="store_const", const="fp16", dest="half", default=None,
                           help="the network in float16 under CUDA autocast, channels_last; CUDA only (elsewhere: a "
                                "note, float32)")
    precision.add_argument("--bf16", action="store_const", const="bf16", dest="half",
                           help="as --half, in bfloat16")
    speed.add_argument("--compile", action="store_true",
                       help="torch.compile the network, replayed as CUDA graphs where --cuda-graph is on (a note and "
                            "uncompiled where it cannot: no Triton on CUDA, no compiler)")
    speed.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                       help="replay the network (with --compile: the compiled network) as CUDA graphs, one per frame "
                            "size (default in video mode: on CUDA with whole frames; pair mode: off)")
    speed.add_argument("--cudnn-benchmark", action="store_true",
                       help="let cuDNN time its convolution algorithms on the first frame of each size and keep the "
                            "fastest (torch.backends.cudnn.benchmark): faster with --compile, and the timing can "
                            "take much GPU memory once")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--sampling", choices=SAMPLINGS, default="compat",
                        help="'compat': the original layer (for released weights, default); 'clean': centred taps")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no notes")
    return parser


def _device(name: Optional[str]) -> torch.device:
    try:
        device = torch.device(name or default_device())
    except RuntimeError as e:
        raise UserError(f"--device {name}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no CUDA GPU is available")
    return device


def _run_pair(args) -> None:
    output = Path(args.output)
    if output.is_dir():
        raise UserError(f"-o {output}: is a folder (pair mode writes one image file, e.g. {output / 'middle.png'})")
    images.check_writable_image_name(output)
    first_path, second_path = (Path(f) for f in args.frames)
    refuse_input_as_output(args.output, [first_path, second_path])
    first, second = images.read_image(first_path), images.read_image(second_path)
    if first.shape != second.shape:
        raise UserError(f"the frames differ in size: {first_path} is {first.shape[2]}x{first.shape[1]}, {second_path} "
                        f"is {second.shape[2]}x{second.shape[1]}")
    model = load_model(args.weights, args.model, args.sampling, _device(args.device))
    if not model.multiple and args.time != 0.5:
        raise UserError(f"EDSC_s interpolates the midpoint only (--time 0.5), got --time {args.time}: "
                        f"use EDSC_m weights")
    engine = Interpolator(model, batch=1, tile=args.tile, margin=args.tile_margin, half=args.half or False,
                          compile=args.compile, quiet=args.quiet,
                          cuda_graph=bool(args.cuda_graph))  # one call: a capture costs more than it saves
    (middle,) = engine.interpolate([(first, second, Fraction(args.time) if not model.multiple else args.time)])
    ensure_output_folder(output, quiet=args.quiet, prog=PROG)
    images.write_image(output, middle.float().cpu())
    print(f"wrote {output} ({middle.shape[2]}x{middle.shape[1]}, t={args.time})")


def _run_video(args) -> None:
    if args.frames:
        raise UserError("--video takes no positional frames")
    # The input and the output name first: they are quick to check, the model is not.
    _output_kind(args.output)
    source = open_source(args.video, args.input_fps)
    model = load_model(args.weights, args.model, args.sampling, _device(args.device))
    result = interpolate_video(
        model, source, args.output, factor=args.factor, fps=args.fps, input_fps=args.input_fps,
        scene_threshold=None if args.no_scene_detect else args.scene_threshold, tile=args.tile,
        margin=args.tile_margin, batch=args.batch, half=args.half or False, compile=args.compile,
        cuda_graph=args.cuda_graph, preset=args.preset, codec=args.codec,
        crf=args.crf, pix_fmt=args.pix_fmt, audio=not args.no_audio, show_progress=not args.quiet, quiet=args.quiet)
    cuts = "scene detection off" if result.cuts is None else f"{result.cuts} scene cut(s) found"
    extra = [cuts]
    if result.encoding:
        extra.append(result.encoding)
    if result.copied:
        extra.append("copied " + ", ".join(result.copied))
    if result.tiles:
        extra.append(f"{result.tiles} tiles")
    if result.rotation:
        extra.append(f"display rotation {result.rotation} kept")
    if result.turned:
        extra.append(f"pixels turned by {result.turned} degrees (as the input is shown)")
    if result.network and result.interpolated:
        extra.append(f"network: {result.network}")
    print(f"wrote {result.frames} frames ({result.interpolated} interpolated; {result.width}x{result.height} at "
          f"{_rate_text(result.rate)} fps) to {result.target}: {'; '.join(extra)}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    try:  # usage errors: one line and exit code 2, returned (not raised) like every other error
        args = parser.parse_args(argv)
        if args.video is None and len(args.frames) != 2:
            parser.error("give two input frames (or --video INPUT)")
        if args.video is None and (args.factor is not None or args.fps is not None or args.input_fps is not None):
            parser.error("--factor, --fps and --input-fps are for --video")
        if args.video is not None and args.time is not None:
            parser.error("--time is for pair mode (with --video the times follow from --factor or --fps)")
        if args.time is None:
            args.time = 0.5
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    try:
        with signals_stop_the_run(), cudnn_autotuning(args.cudnn_benchmark):
            if args.video is None:
                _run_pair(args)
            else:
                _run_video(args)
    except (UserError, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"{PROG}: error: {describe_os_error(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted (no output written)", file=sys.stderr)
        return 130
    except Stopped as e:
        print(f"{PROG}: stopped by {e.name} (no output written)", file=sys.stderr)
        return 128 + e.signum
    except Exception as e:  # noqa: BLE001
        av = sys.modules.get("av")
        if av is not None and isinstance(e, av.error.FFmpegError):  # e.g. an encoder refusing its settings
            print(f"{PROG}: error: FFmpeg: {e}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
