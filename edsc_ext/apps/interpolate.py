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

import argparse
import copy
import os
import sys
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

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
    remove_created_folders,
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
from .stages import StageProfile, cpu_cores
from .timing import DEFAULT_SCENE_THRESHOLD, Schedule, area_average, parse_rate, scene_score, thumbnail_size

__all__ = ["main", "build_parser", "load_model", "interpolate_frames", "interpolate_video", "progress", "read_frames",
           "VideoResult", "default_device", "open_source", "Source", "stream_frames", "luma_thumbnail_of",
           "parse_devices", "check_rate", "replicate", "Decoded"]

PROG = "edsc-interpolate"


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
        """How the decode thread hands frames over: a video's own planar YUV where the device
        converts it (:mod:`edsc_ext.apps.frames`: 8 to 12 bits, 4:2:0 to 4:4:4), else RGB (8 bits; 16
        for deeper video)."""
        info = self.info
        if info is not None:
            planar = yuv_layout_of(info.frame_format, info.frame_colorspace, info.frame_color_range, self.width,
                                   self.height)
            if planar is not None:
                return planar
        return Layout("rgb48le" if info is not None and info.deep else "rgb24", self.height, self.width)

    def frames(self):
        """(time, frame) of every frame: an av.VideoFrame as decoded (a video file) or an RGB array
        (a folder of images)."""
        if self.info is not None:
            decoder = video.Decoder(self.info)
            try:
                yield from decoder.frames()
            finally:
                decoder.close()
        else:
            yield from ((t, images.read_array(f)) for t, f in zip(self.times, self.files))


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
    if src.info is not None:
        arrays = (a for _, a in video.decode_frames(src.info))
    else:
        arrays = (a for _, a in src.frames())
    return ((images.array_to_tensor(a) for a in arrays), len(src.times), float(src.rate))


def check_rate(src: Source, factor: Optional[int], fps: Optional[Fraction]) -> None:
    """Refuses a request that makes no new frame: ``--factor 1``, or ``--fps`` equal to a
    constant-rate input's own rate (the output would be the input, re-encoded)."""
    if factor == 1:
        raise UserError("--factor 1 makes no new frames (the output would be the input re-encoded): give --factor 2 "
                        "or more")
    variable = src.info is not None and src.info.variable_rate
    if fps is not None and Fraction(fps) == src.rate and not variable:
        raise UserError(f"--fps {_rate_text(fps)} is the input's own frame rate: no new frames (the output would be "
                        "the input re-encoded)")


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
    devices: List[str] = field(default_factory=list)  # where the network ran
    preset: Optional[str] = None  # the encoder's speed preset, where it has one
    profile: Optional[StageProfile] = None  # where the time went (stages.StageProfile)


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


def replicate(model: EDSC, devices: Sequence) -> List[EDSC]:
    """``model`` and a copy of it on each further device (its own parameters: its own CUDA graph).
    The copies are made from host copies of the tensors, so ``model``'s GPU holds no second one."""
    replicas = [model]
    for device in list(devices)[1:]:
        on_host = {id(t): (torch.nn.Parameter(t.detach().to("cpu", copy=True), requires_grad=t.requires_grad)
                           if isinstance(t, torch.nn.Parameter) else t.detach().to("cpu", copy=True))
                   for t in [*model.parameters(), *model.buffers()]}
        replicas.append(copy.deepcopy(model, on_host).to(device).eval())
    return replicas


def interpolate_video(model: EDSC, source, target, factor: Optional[int] = None, fps=None, *,
                      input_fps=None, scene_threshold: Optional[float] = DEFAULT_SCENE_THRESHOLD,
                      tile: Optional[int] = None, margin: int = DEFAULT_MARGIN, batch: int = 1, half=None,
                      compile: bool = False, cuda_graph: Optional[bool] = None, codec: Optional[str] = None,
                      crf: Optional[float] = None, pix_fmt: Optional[str] = None, preset: Optional[str] = None,
                      audio: bool = True, show_progress: bool = True, quiet: bool = False,
                      engine=None, devices: Optional[Sequence] = None,
                      profile: Optional[StageProfile] = None) -> VideoResult:
    """Converts ``source`` (a video file or a folder of frames) into ``target`` (a video file, or a
    folder of numbered PNGs) at ``factor`` times its frame rate, or at ``fps``. Every check (the
    input, the output name, EDSC_s positions) comes before anything is written; the output appears
    under its name only when complete, and an error or an interruption removes what the run created
    (the partial output and the folders made for it). ``scene_threshold=None`` turns scene detection off.

    ``half``: None (the default) runs the network in float16 on CUDA, float32 elsewhere; False,
    True/"fp16" or "bf16" choose. ``devices``: the network on each of these devices (a copy of
    ``model`` on each but the first, which must be ``model``'s), frame pairs dealt out in turn, the
    output in order. ``preset``: x264/x265's speed preset (None: veryfast where the network runs on
    CUDA, the encoder's own default elsewhere). ``engine``: an :class:`Interpolator` of ``model`` (or
    one per device) to use (its CUDA graph, compiled network and settings kept from clip to clip)
    instead of ones made from the speed arguments. ``profile``: a
    :class:`~edsc_ext.apps.stages.StageProfile` to fill (one is made otherwise; the result holds it)."""
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
    check_rate(src, factor, fps)
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
    engines = _engines(model, engine, devices, batch=batch, tile=tile, margin=margin, half=half, compile=compile,
                       cuda_graph=cuda_graph, quiet=quiet)
    on_cuda = any(e.device.type == "cuda" for e in engines)
    profile = profile if profile is not None else StageProfile()

    out_rate = fps if fps is not None else src.rate * factor
    # Constant-rate output: the time base 1/rate (containers such as AVI want it); else (variable-rate
    # input with --factor) the input's time base divided by the factor, which holds every time exactly.
    out_base = 1 / out_rate if on_grid else src.time_base / factor
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
                         rate=out_rate, target=target, kind=kind, devices=[str(e.device) for e in engines],
                         profile=profile)
    cores = cpu_cores()
    profile.facts.update(cores=cores, devices=result.devices, batch=engines[0].batch,
                         precision=engines[0].precision, input=f"{src.width}x{src.height} {src.layout.format}")

    created = ensure_output_folder(target, quiet=quiet, prog=PROG)  # the folders the output goes into
    try:
        with atomic_path(target, folder=(kind == "folder")) as tmp:
            if kind == "video":
                sink = video.VideoSink(tmp, target, out_width, out_height, out_rate, out_base, info=src.info,
                                       codec=codec, crf=crf, pix_fmt=pix_fmt, copy_streams=audio, quiet=quiet,
                                       rate_change=out_rate / src.rate, preset=preset, rotate_pixels=bool(turn),
                                       default_preset=video.FAST_PRESET if on_cuda else None,
                                       threads=encoder_threads(cores), profile=profile)
                if sink.note:
                    note(f"{PROG}: {sink.note}", quiet)
                result.encoding = " ".join(part for part in (sink.encoder, sink.pix_fmt, sink.quality) if part)
                result.preset = sink.preset
                if sink.preset is not None:
                    result.encoding += f" preset {sink.preset}"
                result.copied = sink.copied_streams
                result.rotation = src.info.rotation if sink.keeps_rotation else 0
                profile.facts.update(encoder=sink.encoder, preset=sink.preset, pix_fmt=sink.pix_fmt,
                                     encoder_threads=encoder_threads(cores))
            else:
                sink = video.FolderSink(tmp, profile)
                profile.facts.update(encoder="png")
            result.turned = turn
            bar = progress(total=total, desc="interpolating", unit="frame", disable=not show_progress or quiet)
            schedule = Schedule(factor=factor, fps=fps, start=src.times[0], tolerance=tolerance, snap_depth=snap)
            try:
                counts = stream_frames(engines, src, sink, schedule, scene_threshold=scene_threshold, turn=turn,
                                       progress_bar=bar, profile=profile, decoder_threads=decoder_threads(cores))
            except OSError as e:  # a write (FFmpeg's and Pillow's name no file): named by the output asked for
                named = e.filename is not None and not str(e.filename).startswith(str(tmp))
                raise UserError(describe_os_error(e, e.filename if named else target)) from None
            finally:
                bar.close()
    except BaseException:
        remove_created_folders(created)
        raise
    result.frames, result.interpolated, cuts = counts
    result.cuts = cuts if detect else None
    result.tiles = sum(e.tiles_used for e in engines)
    paths: Dict[str, int] = {}
    for e in engines:
        for key, count in e.paths.items():
            paths[key] = paths.get(key, 0) + count
    result.network = ", ".join(paths) or "none"
    return result


def _engines(model: EDSC, engine, devices, **settings) -> List[Interpolator]:
    """The engines of a run: those given, else one per device (``model`` on the first; its precision
    by default float16 on CUDA)."""
    if engine is not None:
        engines = list(engine) if isinstance(engine, (list, tuple)) else [engine]
        return engines
    model_device = next(model.parameters()).device
    devices = [torch.device(d) for d in devices] if devices else [model_device]
    devices = [torch.device("cuda", torch.cuda.current_device()) if d.type == "cuda" and d.index is None else d
               for d in devices]
    if devices[0] != model_device:
        raise UserError(f"--device {devices[0]}: the model is on {model_device}")
    half = settings.pop("half")
    if half is None:
        half = "fp16" if devices[0].type == "cuda" else False
    return [Interpolator(replica, half=half, **settings) for replica in replicate(model, devices)]


def decoder_threads(cores: int) -> int:
    """The decoder's threads: a quarter of the cores (at least 2), leaving the rest to the encoder
    and the threads that queue the device's work."""
    return max(2, cores // 4)


def encoder_threads(cores: int) -> int:
    """x264's frame threads: 1.5 a core, as x264 itself picks from the cores it sees (here counted
    as this process may use them: its affinity and a container's CPU quota)."""
    return max(1, cores * 3 // 2)


# Frames waiting between the decode thread and the main thread, and (per device) between the main
# thread and the encode thread: enough for each GPU to have a pair queued while the encoder works.
DECODE_QUEUE = 8
ENCODE_QUEUE = 8


@dataclass
class Decoded:
    """One input frame from the decode thread: its time, its samples in ``layout`` (``array``, a
    view of ``host``, page-locked on CUDA: uploaded as it is), the frame as decoded (a video's
    av.VideoFrame, for the encoder as it is) and its scene thumbnail."""

    time: Fraction
    array: np.ndarray
    layout: Layout
    host: Tensor
    frame: object = None
    thumb: Optional[Tensor] = None


class _Lane:
    """One device's share of the work: its engine (network) and its transfers."""

    def __init__(self, engine: Interpolator, profile: StageProfile):
        self.engine, self.device = engine, engine.device
        self.transfer = Transfer(engine.device, profile)


class _Record:
    """An input frame in the main thread, with its network input on each device that needs it."""

    __slots__ = ("index", "item", "tensors")

    def __init__(self, index: int, item: Decoded):
        self.index, self.item, self.tensors = index, item, {}

    def on(self, lane: _Lane, profile: StageProfile) -> Tensor:
        tensor = self.tensors.get(id(lane))
        if tensor is None:
            with profile.device("upload", lane.device):
                tensor = to_model(lane.transfer.upload(self.item.host), self.item.layout)
            self.tensors[id(lane)] = tensor
        return tensor


def stream_frames(engine, src: Source, sink, schedule: Schedule, *,
                  scene_threshold: Optional[float] = DEFAULT_SCENE_THRESHOLD, turn: int = 0, progress_bar=None,
                  frames=None, profile: Optional[StageProfile] = None,
                  decoder_threads: Optional[int] = None) -> Tuple[int, int, int]:
    """Streams the frames of ``src`` (or the (time, av.VideoFrame or array) items ``frames()``
    makes, laid out as ``src`` decodes them) through the decode thread, the network (this thread
    queues the device work) and the encode thread into ``sink``, frames placed by ``schedule``;
    returns (frames written, of them interpolated, scene cuts). ``engine``: an
    :class:`Interpolator`, or one per device: the groups of pairs (``batch`` new frames) go to them
    in turn, the output stays in order. ``turn``: degrees counter-clockwise to turn the output's
    pixels by. ``profile`` records where the time goes (:mod:`edsc_ext.apps.stages`).

    The decode thread does the host's share of each frame: it decodes, copies the planes into
    page-locked memory and makes the scene thumbnail. This thread only queues work on the devices
    (upload, conversion, network, conversion back, download), so it never waits for a GPU; the
    encode thread waits for each frame's download before encoding it. Input frames the output
    repeats go to the encoder as they were decoded where it takes them (:meth:`VideoSink.takes`)."""
    profile = profile if profile is not None else StageProfile()
    engines = list(engine) if isinstance(engine, (list, tuple)) else [engine]
    lanes = [_Lane(e, profile) for e in engines]
    in_layout = src.layout
    # The sink's planar layout (of the turned size where the pixels are turned), else RGB for swscale
    # in the encode thread or for the PNG writer.
    out_layout = sink.layout
    if out_layout is None:
        deep = src.info is not None and src.info.deep and not isinstance(sink, video.FolderSink)
        h, w = (src.width, src.height) if turn in (90, 270) else (src.height, src.width)
        out_layout = Layout("rgb48le" if deep else "rgb24", h, w)
    takes = getattr(sink, "takes", None)
    # Input frames that the output repeats go to the encoder untouched: as decoded where the sink
    # takes the frame, else as the host array where it has the sink's layout.
    same_layout = in_layout == out_layout and not turn
    detect = scene_threshold is not None
    from_file = frames is None and src.info is not None
    make_frames = frames if frames is not None else (None if from_file else src.frames)

    for e in engines:  # CUDA graphs are captured before the other threads start
        e.prepare(src.height, src.width)
        profile.reference(e.device)
    profile.mark("network ready")
    decoder = video.Decoder(src.info, threads=decoder_threads, profile=profile) if from_file else None

    def host_side():  # the decode thread
        profile.join_group("decode")
        reformatter = None
        items = decoder.frames() if decoder is not None else make_frames()
        try:
            while True:
                start = profile.clock()
                try:
                    time, frame = next(items)
                except StopIteration:
                    return
                if isinstance(frame, np.ndarray):  # a folder's image (RGB, 8 or 16 bits)
                    layout = in_layout if in_layout.planar else Layout(
                        "rgb48le" if frame.dtype == np.uint16 else "rgb24", src.height, src.width)
                    if frame.shape != layout.shape:
                        _size_changed(src, frame.shape[1], frame.shape[0])
                    array = frame
                    host = lanes[0].transfer.pin(array)
                else:
                    layout = in_layout
                    if (frame.width, frame.height) != (src.width, src.height):
                        _size_changed(src, frame.width, frame.height)
                    if reformatter is None:
                        from av.video.reformatter import VideoReformatter

                        reformatter = VideoReformatter()  # one swscale context for the clip
                    host, array = lanes[0].transfer.host_buffer(layout)
                    video.frame_to_host(frame, layout, out=array, reformatter=reformatter)
                thumb = luma_thumbnail_of(array, layout) if detect else None
                profile.add_host("decode", start)
                yield Decoded(time, array, layout, host, None if isinstance(frame, np.ndarray) else frame, thumb)
        finally:
            if decoder is not None:
                decoder.close()
            elif hasattr(items, "close"):
                items.close()

    profile.join_group("main")
    writer = reader = None
    written = interpolated = cuts = 0
    pending: list = []  # (record, time, job index or None) in output order
    jobs: list = []  # (first record, second record, position)
    turn_to = [0]  # the next lane

    def download(lane: _Lane, sources: List[Tensor]) -> List[HostFrame]:
        if not sources:
            return []
        with profile.device("download", lane.device, frames=len(sources)):
            batch = torch.stack(sources)
            if turn:
                batch = torch.rot90(batch, turn // 90, dims=(-2, -1))
            return lane.transfer.download(from_model(batch, out_layout), out_layout)

    def flush():
        nonlocal written, interpolated
        lane = lanes[0]
        made: List[Tensor] = []
        if jobs:
            lane = lanes[turn_to[0]]
            turn_to[0] = (turn_to[0] + 1) % len(lanes)
            inputs = [(a.on(lane, profile), b.on(lane, profile), t) for a, b, t in jobs]
            with profile.device("network", lane.device, frames=len(jobs)):
                made = lane.engine.interpolate_bgr(inputs)
        sources, payloads = [], []
        for record, _, job in pending:
            if job is not None:
                sources.append(made[job])
                payloads.append(None)
            elif takes is not None and record.item.frame is not None and not turn and takes(record.item.frame):
                payloads.append(record.item.frame)  # as decoded
            elif same_layout:
                payloads.append(HostFrame(record.item.array, out_layout, keep=record.item.host))
            else:
                sources.append(record.on(lane, profile))
                payloads.append(None)
        converted = iter(download(lane, sources))
        for (_, time, job), payload in zip(pending, payloads):
            writer.put((payload if payload is not None else next(converted), time))
            interpolated += job is not None
            written += 1
            if progress_bar is not None:
                progress_bar.update(1)
        pending.clear()
        jobs.clear()

    try:
        writer = video.BackgroundWriter(sink, ENCODE_QUEUE * len(lanes), profile=profile)
        profile.begin()
        reader = video.Prefetch(host_side, DECODE_QUEUE, profile=profile)
        previous = None  # the last input frame's record
        for index, item in enumerate(reader):
            profile.mark("first frame read")
            record = _Record(index, item)
            if previous is not None:
                cut = detect and scene_score(previous.item.thumb, item.thumb) > scene_threshold
                cuts += cut
                for out in schedule.between(previous.index, previous.item.time, item.time):
                    if out.is_copy or cut:
                        pending.append((previous, out.time, None))
                    else:
                        jobs.append((previous, record, out.position))
                        pending.append((previous, out.time, len(jobs) - 1))
                if len(jobs) >= lanes[0].engine.batch or not jobs:
                    flush()
            previous = record
        if previous is None:
            raise UserError(f"{src.path}: no frames could be decoded")
        for out in schedule.after_last(previous.index, previous.item.time, src.end):
            pending.append((previous, out.time, None))
        flush()
        writer.close()
        profile.finish()
    except BaseException:
        if reader is not None:
            reader.close()
        elif decoder is not None:
            decoder.close()
        if writer is not None:
            writer.abort()
        raise
    reader.close()
    return written, interpolated, cuts


def _size_changed(src: Source, width: int, height: int) -> None:
    raise UserError(f"{src.path}: a frame is {width}x{height}, the first {src.width}x{src.height} (a size change "
                    "mid-stream is not supported)")


def luma_thumbnail_of(array: np.ndarray, layout: Layout) -> Tensor:
    """The scene measure's thumbnail of a host frame (see :func:`~edsc_ext.apps.timing.luma_thumbnail`):
    of its Y plane where it has one (averaged, then scaled to [0, 1] from the video's range and bit
    depth), else of its RGB."""
    if layout.planar:
        luma = layout.planes(array)[0]
        y_offset, scale = (0.0, float((1 << layout.bits) - 1)) if layout.full_range else \
            (16.0 * (1 << (layout.bits - 8)), 219.0 * (1 << (layout.bits - 8)))
        small = area_average(luma, *thumbnail_size(layout.height, layout.width))
        return torch.from_numpy(np.clip((small - y_offset) / scale, 0, 1).astype(np.float32))
    top = 65535.0 if array.dtype == np.uint16 else 255.0
    small = area_average(array, *thumbnail_size(*array.shape[:2])) / top
    r, g, b = small[..., 0], small[..., 1], small[..., 2]
    return torch.from_numpy((0.299 * r + 0.587 * g + 0.114 * b).astype(np.float32))


def _rate_text(rate) -> str:
    rate = Fraction(rate)
    return str(rate.numerator) if rate.denominator == 1 else f"{rate.numerator}/{rate.denominator} (~{float(rate):.3f})"


# --------------------------------------------------------------------------------------------
# Command line.


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _scene_threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 <= value <= 100:  # a score is 0..100; below 0 every pair of frames would be a cut
        raise argparse.ArgumentTypeError(f"must be a score in [0, 100], got {text}")
    return value


def _rate(text: str) -> Fraction:
    try:
        return parse_rate(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog=PROG, description="Interpolate frames with EDSC: an image pair, a folder of frames or a video file.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  edsc-interpolate --weights EDSC_s.pth first.png second.png -o middle.png\n"
               "  edsc-interpolate --weights EDSC_m.pth --time 0.25 a.png b.png -o quarter.png\n"
               "  edsc-interpolate --weights EDSC_s.pth --video clip.mp4 -o clip_x2.mp4\n"
               "  edsc-interpolate --weights EDSC_m.pth --video clip.mp4 -o clip_60.mp4 --fps 60\n"
               "  edsc-interpolate --weights EDSC_s.pth --video frames/ -o frames_x4/ --factor 4\n"
               "\nBad input is reported in one line, exit code 2. Needs: pip install tqdm pillow \"av>=18\"")
    parser.add_argument("--version", action=_VersionAction, help="print the versions (edsc-ext, torch, PyAV) and exit")
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
    video_group.add_argument("--pix-fmt", default=None,
                             help="pixel format (default: the input's, e.g. yuv420p, where the encoder takes it "
                                  "and, for 4:2:0, the size is even; else yuv444p, with a note)")
    video_group.add_argument("--preset", default=None,
                             help=f"x264/x265 speed preset, e.g. medium (default: {video.FAST_PRESET} where the "
                                  "network runs on CUDA, where x264's own medium cannot keep up with it; the "
                                  "encoder's, medium, on the CPU)")
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
                           help="the network in float16 under CUDA autocast, model and frames channels_last (the "
                                "sampling stays float32; outputs within a few 8-bit levels of float32). Default on "
                                "CUDA; elsewhere float32 (asked for there: a note)")
    precision.add_argument("--bf16", action="store_const", const="bf16", dest="half",
                           help="as --half, in bfloat16")
    precision.add_argument("--float32", "--no-half", action="store_const", const=False, dest="half",
                           help="the network in float32 (the default on the CPU)")
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
    parser.add_argument("--device", default=None,
                        help="torch device, or several separated by commas (video mode: frame pairs dealt out "
                             "to them in turn, e.g. cuda:0,cuda:1; cuda:all for every visible GPU) (default: cuda "
                             "if available, else cpu)")
    parser.add_argument("--profile", action="store_true",
                        help="video mode: print where the time went (decode, upload, network, download, encode, "
                             "mux: time, frames/s, CPU cores busy, the bound) on stderr at the end")
    parser.add_argument("--profile-json", metavar="PATH", default=None,
                        help="video mode: also write that profile and the run's figures to PATH as JSON")
    parser.add_argument("--sampling", choices=SAMPLINGS, default="compat",
                        help="'compat': the original layer (for released weights, default); 'clean': centred taps")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no notes")
    return parser


class _VersionAction(argparse.Action):
    """``--version``: the versions, read when asked for (PyAV is imported then, not by every run)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{PROG} {_version_text()}")
        parser.exit(0)


def _version_text() -> str:
    import edsc_ext

    try:
        import av

        pyav = f", PyAV {av.__version__}"
    except ImportError:
        pyav = ""
    return f"{edsc_ext.__version__} (torch {torch.__version__}{pyav})"


def parse_devices(text: Optional[str]) -> List[torch.device]:
    """``--device``: one torch device, or several separated by commas (``cuda:0,cuda:1``, ``cpu,cpu``);
    ``cuda:all`` is every visible GPU. Default: cuda if available, else cpu."""
    names = [n.strip() for n in (text or default_device()).split(",")]
    devices: List[torch.device] = []
    for name in names:
        if name == "cuda:all":
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if count == 0:
                raise UserError("--device cuda:all: no CUDA GPU is available")
            devices += [torch.device("cuda", i) for i in range(count)]
            continue
        try:
            device = torch.device(name)
        except RuntimeError as e:
            raise UserError(f"--device {name}: {e}") from None
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise UserError(f"--device {name}: no CUDA GPU is available")
            count = torch.cuda.device_count()
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            elif device.index >= count:
                raise UserError(f"--device {name}: only {count} GPU(s) are visible (cuda:0 to cuda:{count - 1})")
        devices.append(device)
    if len({d.type for d in devices}) > 1:
        raise UserError(f"--device {text}: give devices of one kind (all cuda or all cpu)")
    return devices


def _half_of(args, device: torch.device):
    """The precision asked for, or the default: float16 on CUDA, float32 elsewhere."""
    if args.half is not None:
        return args.half
    return "fp16" if device.type == "cuda" else False


def _run_pair(args) -> None:
    output = Path(args.output)
    if output.is_dir():
        raise UserError(f"-o {output}: is a folder (pair mode writes one image file, e.g. {output / 'middle.png'})")
    images.check_writable_image_name(output)
    first_path, second_path = (Path(f) for f in args.frames)
    refuse_input_as_output(args.output, [first_path, second_path])
    devices = parse_devices(args.device)
    if len(devices) > 1:
        raise UserError(f"--device {args.device}: several devices are for --video (a pair is one network call)")
    first, second = images.read_image(first_path), images.read_image(second_path)
    if first.shape != second.shape:
        raise UserError(f"the frames differ in size: {first_path} is {first.shape[2]}x{first.shape[1]}, {second_path} "
                        f"is {second.shape[2]}x{second.shape[1]}")
    model = load_model(args.weights, args.model, args.sampling, devices[0])
    if not model.multiple and args.time != 0.5:
        raise UserError(f"EDSC_s interpolates the midpoint only (--time 0.5), got --time {args.time}: "
                        f"use EDSC_m weights")
    engine = Interpolator(model, batch=1, tile=args.tile, margin=args.tile_margin, half=_half_of(args, devices[0]),
                          compile=args.compile, quiet=args.quiet,
                          cuda_graph=bool(args.cuda_graph))  # one call: a capture costs more than it saves
    (middle,) = engine.interpolate([(first, second, Fraction(args.time) if not model.multiple else args.time)])
    created = ensure_output_folder(output, quiet=args.quiet, prog=PROG)
    try:
        images.write_image(output, middle.float().cpu())
    except BaseException:
        remove_created_folders(created)
        raise
    print(f"wrote {output} ({middle.shape[2]}x{middle.shape[1]}, t={args.time})")


def _run_video(args) -> None:
    if args.frames:
        raise UserError("--video takes no positional frames")
    profile = StageProfile()
    profile.mark("imports done")
    # The input and the output name first: they are quick to check, the model is not.
    _output_kind(args.output)
    source = open_source(args.video, args.input_fps)
    check_rate(source, args.factor if args.fps is None else None, args.fps)
    profile.mark("input probed")
    devices = parse_devices(args.device)
    model = load_model(args.weights, args.model, args.sampling, devices[0])
    profile.mark("model loaded")
    result = interpolate_video(
        model, source, args.output, factor=args.factor, fps=args.fps, input_fps=args.input_fps,
        scene_threshold=None if args.no_scene_detect else args.scene_threshold, tile=args.tile,
        margin=args.tile_margin, batch=args.batch, half=_half_of(args, devices[0]), compile=args.compile,
        cuda_graph=args.cuda_graph, preset=args.preset, codec=args.codec, devices=devices,
        crf=args.crf, pix_fmt=args.pix_fmt, audio=not args.no_audio, show_progress=not args.quiet, quiet=args.quiet,
        profile=profile)
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
        extra.append(f"network: {result.network}" + (f" on {', '.join(result.devices)}" if len(result.devices) > 1
                                                     else ""))
    speed = speed_summary(result)
    if speed:
        extra.append(speed)
    print(f"wrote {result.frames} frames ({result.interpolated} interpolated; {result.width}x{result.height} at "
          f"{_rate_text(result.rate)} fps) to {result.target}: {'; '.join(extra)}")
    if args.profile:
        print(result.profile.table(), file=sys.stderr)
    if args.profile_json:
        write_profile_json(result, args.profile_json)


def speed_summary(result: VideoResult) -> str:
    """The run's rate and what bounded it, in a few words; for an encoder that has presets and bounded
    the run, the preset that would keep up (from :data:`PRESET_SPEED`)."""
    profile = result.profile
    if profile is None or profile.wall <= 0:
        return ""
    text = f"{result.interpolated / profile.wall:.1f} new frames/s"
    bound = profile.bound()
    if bound is None:
        return text
    text += f" (bound: {bound.name}, busy {100 * min(1.0, bound.busy):.0f}%"
    preset = result.preset
    if bound.stage == "encode" and preset in PRESET_SPEED:
        faster = _preset_that_keeps_up(profile, preset, result)
        encoder = profile.facts.get("encoder", "the encoder")
        if faster is None:
            text += f"; {encoder} at preset {preset} is the bound"
        elif faster == preset:
            text += f"; {encoder} at preset {preset} about keeps up with the rest"
        elif faster == "ultrafast+":
            text += f"; {encoder} at preset {preset} is the bound, and --preset ultrafast would not keep up either"
        else:
            text += f"; {encoder} at preset {preset} is the bound: --preset {faster} keeps up"
    return text + ")"


# x264's presets' encoding speed against medium's on the 1080p test clip (python -m edsc_ext.benchmarks.video
# --presets; BENCHMARKS.md, video section: the ratios, not the rates, carry over to other machines).
PRESET_SPEED = {"ultrafast": 6.5, "superfast": 3.1, "veryfast": 2.3, "faster": 1.28, "fast": 1.08, "medium": 1.0,
                "slow": 0.73, "slower": 0.46, "veryslow": 0.24}


def _preset_that_keeps_up(profile: StageProfile, preset: str, result: VideoResult) -> Optional[str]:
    """The slowest preset whose encoding rate (this run's, scaled by :data:`PRESET_SPEED`) keeps up
    with what the other stages could deliver, with a fifth to spare; "ultrafast+" when none does."""
    rows = {row.stage: row for row in profile.rows() if row.stage != "mux"}
    encode = rows.get("encode")
    if encode is None or not encode.frames or encode.seconds <= 0:
        return None
    mux = next((row for row in profile.rows() if row.stage == "mux"), None)
    encode_rate = encode.frames / (encode.seconds + (mux.seconds if mux is not None else 0.0))
    written = max(1, result.frames)
    feeds = []
    for stage, row in rows.items():
        if stage == "encode" or not row.frames or row.seconds <= 0:
            continue
        per_output = written / row.frames  # output frames per frame of this stage
        feeds.append(row.frames / row.seconds * per_output)
    if not feeds:
        return None
    needed = min(feeds) * 1.2 / encode_rate * PRESET_SPEED[preset]
    if needed <= PRESET_SPEED[preset]:
        return preset
    for name in sorted(PRESET_SPEED, key=PRESET_SPEED.get):
        if PRESET_SPEED[name] >= needed:
            return name
    return "ultrafast+"


def write_profile_json(result: VideoResult, path) -> None:
    """The run's figures and its stage profile as JSON (for tools/video_throughput.py and the like)."""
    import json

    summary = result.profile.summary() if result.profile is not None else {}
    data = {"frames": result.frames, "interpolated": result.interpolated, "cuts": result.cuts,
            "width": result.width, "height": result.height, "rate": str(result.rate), "encoding": result.encoding,
            "network": result.network, "devices": result.devices, "preset": result.preset,
            "speed": speed_summary(result), "profile": summary}
    if any(d.startswith("cuda") for d in result.devices):
        data["max_memory_allocated_gb"] = {d: torch.cuda.max_memory_allocated(torch.device(d)) / 1e9
                                           for d in dict.fromkeys(result.devices)}
        data["device_names"] = {d: torch.cuda.get_device_name(torch.device(d)) for d in dict.fromkeys(result.devices)}
    try:
        Path(path).write_text(json.dumps(data, indent=2, default=str) + "\n")
    except OSError as e:
        raise UserError(f"--profile-json {path}: {describe_os_error(e, path).split(': ', 1)[-1]}") from None


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
        if args.video is None and (args.profile or args.profile_json):
            parser.error("--profile and --profile-json are for --video")
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
