"""Video files through PyAV (FFmpeg's libraries), and the threads that stream frames.

- :func:`probe`: what a video file holds, from one demuxing pass over its video packets (no
  decoding): size, codec, pixel format, frame rate, every frame's timestamp, where it ends, the CRF
  its x264/x265 encoder wrote into the stream (if it did), and the audio/subtitle streams.
- :class:`Decoder`: the frames as decoded (av.VideoFrame) in presentation order, opened in one
  thread and read in another; :func:`frame_to_host` lays one out for the device (its planes copied
  into one flat array where the device converts the format, :mod:`edsc_ext.apps.frames`, else RGB
  through one swscale context kept for the whole clip); :func:`decode_frames` does both.
- :class:`VideoSink`: encodes frames into a video file and copies the audio and subtitle packets
  of the input into it untouched (remuxed, interleaved by time through a second demuxer of the
  input, so nothing is buffered), in sync: the frames keep the input's clock. The codec, CRF and
  pixel format follow the input unless set (see :func:`choose_encoding`). Input frames the output
  repeats go to the encoder as they were decoded wherever the output's size and pixel format are the
  input's (:meth:`VideoSink.takes`): with a lossless encode they decode bit-exact, 8-bit and 10-bit.
  A rotated input (a phone's display matrix) keeps its matrix in containers that store one (MP4,
  MOV, M4V, MKV, WebM), so players turn the output as they turn the input; other outputs get turned
  pixels (the caller rotates them, see :attr:`VideoInfo.rotation`).
- :class:`FolderSink`: numbered PNG frames (upright: turned by the caller as the video is shown).
- :class:`Prefetch` and :class:`BackgroundWriter`: a decode thread and an encode thread joined to
  the main thread by bounded queues, so decoding, the network and encoding overlap and memory does
  not grow with the clip's length.
"""

from __future__ import annotations

import queue
import re
import threading
from contextlib import nullcontext
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

import numpy as np

from .common import UserError, describe_os_error, note, require
from .frames import HostFrame, Layout, yuv_layout_of

__all__ = ["VIDEO_EXTENSIONS", "VideoInfo", "probe", "decode_frames", "choose_encoding", "VideoSink", "FolderSink",
           "Prefetch", "BackgroundWriter", "is_video_name"]

# Output containers (any input FFmpeg reads is accepted).
VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".gif", ".ts", ".flv", ".ogv")
# The encoder of each codec (FFmpeg's own ones where it has none better).
ENCODER_OF = {"h264": "libx264", "hevc": "libx265", "vp9": "libvpx-vp9", "vp8": "libvpx", "av1": "libsvtav1"}
# Encoders that take a CRF: (lowest, highest, default).
CRF_RANGE = {"libx264": (0, 51, 23), "libx265": (0, 51, 28), "libvpx-vp9": (0, 63, 31), "libvpx": (4, 63, 10),
             "libsvtav1": (0, 63, 35)}
# Encoders with x264's speed presets (--preset).
PRESETS = {"libx264": ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow",
                       "placebo"),
           "libx265": ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow",
                       "placebo")}
# The options of a lossless encode (asked for as CRF 0): x264's CRF 0 is lossless at 8 bits only, its
# quantiser 0 at every bit depth.
LOSSLESS = {"libx264": {"qp": "0"}, "libx265": {"x265-params": "lossless=1"}, "libvpx-vp9": {"lossless": "1"}}
# The preset of encoders that have presets where none is given and the network runs on CUDA: x264's own
# default (medium) encodes 1080p more slowly than the GPU interpolates it (BENCHMARKS.md, video section).
FAST_PRESET = "veryfast"
# Containers that store a display matrix (written by FFmpeg, read back by it and by players).
KEEPS_DISPLAY_MATRIX = (".mp4", ".m4v", ".mov", ".mkv", ".webm")


def _av():
    return require("av", "reading and writing video files")


def is_video_name(path) -> bool:
    return Path(path).suffix.lower() in VIDEO_EXTENSIONS


@dataclass
class VideoInfo:
    """What :func:`probe` found in a video file."""

    path: Path
    width: int
    height: int
    codec: str
    pix_fmt: str
    rate: Fraction  # the average frame rate
    time_base: Fraction
    times: List[Fraction]  # every frame's presentation time (seconds), sorted
    end: Fraction  # when the last frame ends (its time plus its duration)
    crf: Optional[float] = None  # the CRF x264/x265 wrote into the stream
    bit_rate: Optional[int] = None
    deep: bool = False  # more than 8 bits per sample
    copied: List[Tuple[int, str, str]] = field(default_factory=list)  # (stream index, type, codec name)
    # FFmpeg's colour tags (AVColorSpace, AVColorRange, primaries, transfer): the output keeps them,
    # and its RGB -> YUV conversion uses the input's matrix and range.
    colorspace: int = 2
    color_range: int = 0
    color_primaries: int = 2
    color_trc: int = 2
    # The first decoded frame's: its pixel format and colour tags (what the conversion to RGB reads),
    # and its display matrix (nine ints, FFmpeg's layout) with the counter-clockwise turn, in
    # degrees, that it asks players for (0, 90, 180 or 270; other angles are not turned).
    frame_format: str = "yuv420p"
    frame_colorspace: int = 2
    frame_color_range: int = 0
    display_matrix: Optional[Tuple[int, ...]] = None
    rotation: int = 0
    mirrored: bool = False  # the matrix also flips the picture

    @property
    def duration(self) -> Fraction:
        return self.end - self.times[0]

    @property
    def variable_rate(self) -> bool:
        steps = {b - a for a, b in zip(self.times, self.times[1:])}
        return len(steps) > 1 and (max(steps) - min(steps)) > self.time_base


def _open_input(path: Path):
    av = _av()
    if path.is_dir():
        raise UserError(f"{path}: is a folder (a folder of frames is read as frames, not as a video file)")
    if not path.exists():
        raise UserError(f"{path}: no such file")
    try:
        return av.open(str(path), "r")
    except av.error.InvalidDataError:
        raise UserError(f"{path}: not a video file (FFmpeg cannot read it)") from None
    except OSError as e:
        raise UserError(describe_os_error(e, path)) from None
    except av.error.FFmpegError as e:
        raise UserError(f"{path}: cannot open it as a video ({e})") from None


def probe(path) -> VideoInfo:
    """Reads a video file's layout and timestamps (one demuxing pass, no decoding)."""
    av = _av()
    path = Path(path)
    container = _open_input(path)
    try:
        if not container.streams.video:
            raise UserError(f"{path}: has no video stream")
        stream = container.streams.video[0]
        ctx = stream.codec_context
        time_base = Fraction(stream.time_base) if stream.time_base else Fraction(1, 90000)
        rate = Fraction(stream.average_rate or stream.guessed_rate or 25)
        pts, ends, crf = [], [], None
        try:
            for packet in container.demux(stream):
                if packet.size == 0:
                    continue  # the demuxer's flush packet
                if crf is None and len(pts) < 2:
                    found = re.search(rb"crf=([0-9]+(?:\.[0-9]+)?)", bytes(packet))
                    if found:
                        crf = float(found.group(1))
                if packet.pts is not None:
                    pts.append(packet.pts)
                    ends.append(packet.pts + (packet.duration or 0))
                else:
                    pts.append(None)
        except av.error.FFmpegError as e:
            raise UserError(f"{path}: damaged video ({e})") from None
        if len(pts) < 2:
            raise UserError(f"{path}: has {len(pts)} video frame(s); interpolation needs at least two")
        if any(p is None for p in pts):  # no timestamps (raw streams): the nominal rate
            times = [Fraction(k) / rate for k in range(len(pts))]
            end = times[-1] + 1 / rate
        else:
            times = sorted(Fraction(p) * time_base for p in pts)
            end = max(Fraction(e) * time_base for e in ends)
            if end <= times[-1]:  # no packet durations: the last frame lasts one average period
                end = times[-1] + 1 / rate
        fmt = av.VideoFormat(ctx.pix_fmt) if ctx.pix_fmt else None
        deep = bool(fmt and fmt.components and max(c.bits for c in fmt.components) > 8)
        copied = [(s.index, s.type, s.codec_context.name) for s in container.streams
                  if s.type in ("audio", "subtitle") and s.codec_context is not None]
        first = _first_frame_facts(path)
        return VideoInfo(**first, path=path, width=ctx.width, height=ctx.height, codec=ctx.name,
                         pix_fmt=ctx.pix_fmt or "yuv420p",
                         rate=rate, time_base=time_base, times=times, end=end, crf=crf,
                         bit_rate=stream.bit_rate or ctx.bit_rate or None, deep=deep, copied=copied,
                         colorspace=_tag(ctx, "colorspace", 2), color_range=_tag(ctx, "color_range", 0),
                         color_primaries=_tag(ctx, "color_primaries", 2), color_trc=_tag(ctx, "color_trc", 2))
    finally:
        container.close()


def _first_frame_facts(path: Path) -> dict:
    """The first frame's pixel format, colour tags and display matrix (what only decoding tells)."""
    av = _av()
    container = _open_input(path)
    try:
        frame = next(container.decode(container.streams.video[0]), None)
    except av.error.FFmpegError as e:
        raise UserError(f"{path}: cannot decode its first frame ({e})") from None
    finally:
        container.close()
    if frame is None:
        raise UserError(f"{path}: no frame could be decoded")
    facts = {"frame_format": frame.format.name, "frame_colorspace": _tag(frame, "colorspace", 2),
             "frame_color_range": _tag(frame, "color_range", 0)}
    # Looked up by type: PyAV 19 iterates side_data's keys (a Mapping), PyAV 18 and older its values.
    side = frame.side_data.get(av.sidedata.sidedata.Type.DISPLAYMATRIX)
    if side is not None and len(bytes(side)) >= 36:
        matrix = tuple(int(v) for v in np.frombuffer(bytes(side)[:36], dtype=np.int32))
        turn = round(float(frame.rotation or 0))
        facts["display_matrix"] = matrix
        facts["rotation"] = turn % 360 if turn % 90 == 0 else 0
        facts["mirrored"] = matrix[0] * matrix[4] - matrix[1] * matrix[3] < 0
    return facts


def _tag(ctx, name: str, default: int) -> int:
    try:
        return int(getattr(ctx, name))
    except (AttributeError, TypeError, ValueError):
        return default


class Decoder:
    """The frames of a video file, decoded: opened (file and decoder, with ``threads`` decoder threads,
    FFmpeg's choice when None) in the calling thread, read by :meth:`frames` in any one thread.
    ``profile`` (a :class:`~edsc_ext.apps.stages.StageProfile`) counts the decoder's threads as the
    decode stage's."""

    def __init__(self, info: VideoInfo, threads: Optional[int] = None, profile=None):
        av = _av()
        self.info, self.profile = info, profile
        self.container = _open_input(info.path)
        try:
            self.stream = self.container.streams.video[0]
            ctx = self.stream.codec_context
            ctx.thread_type = "AUTO"  # frame and slice threads
            if threads:
                ctx.thread_count = threads
            opened = profile.threads_of("decode") if profile is not None else nullcontext()
            with opened:
                ctx.open(strict=False)
        except av.error.FFmpegError as e:
            self.container.close()
            raise UserError(f"{info.path}: cannot open its decoder ({e})") from None
        except BaseException:
            self.container.close()
            raise

    def frames(self) -> Iterator[Tuple[Fraction, "object"]]:
        """(time in seconds, av.VideoFrame) of every frame, in presentation order. Frames with a
        timestamp not after the previous one's are skipped; a stream that ends before the last
        timestamp the demuxer listed is an error (not a short output)."""
        av = _av()
        info = self.info
        index, last = 0, None
        try:
            for frame in self.container.decode(self.stream):
                time = (Fraction(frame.pts) * info.time_base if frame.pts is not None
                        else Fraction(index) / info.rate)
                index += 1
                if last is not None and time <= last:
                    continue
                last = time
                yield time, frame
        except av.error.FFmpegError as e:
            raise UserError(f"{info.path}: damaged or truncated video: cannot decode frame {index + 1} of the "
                            f"{len(info.times)} frames the file lists ({e})") from None
        # A damaged stream can end early without an error (FFmpeg's frame threads drop it): the
        # frames must reach the last timestamp the demuxer listed, or the output would be cut short.
        if last is None or last < info.times[-1] - info.time_base / 2:
            reached = "no frame" if last is None else f"{index} frame(s), up to {float(last):.3f} s"
            raise UserError(f"{info.path}: damaged or truncated video: decoding stopped after {reached}, but the "
                            f"file lists {len(info.times)} frames up to {float(info.times[-1]):.3f} s")

    def close(self) -> None:
        if self.profile is not None:
            self.profile.group_end("decode")  # before the decoder's threads end
        self.container.close()


def plane_views(frame, layout: Layout) -> List[np.ndarray]:
    """Views (no copy) of the Y, U and V planes of a planar ``frame`` (an av.VideoFrame in
    ``layout.format``), without the rows' padding; writable."""
    views = []
    dtype = np.dtype(layout.dtype)
    for plane, (h, w) in zip(frame.planes, layout.plane_shapes):
        rows = np.frombuffer(plane, dtype=np.uint8).reshape(-1, plane.line_size)[:h]
        views.append(rows[:, :w * dtype.itemsize].view(dtype))
    return views


def frame_to_host(frame, layout: Layout, out: Optional[np.ndarray] = None, reformatter=None) -> np.ndarray:
    """An av.VideoFrame as ``layout`` lays it out: its planes copied into the flat array ``out`` (made
    when None), or its RGB (swscale, through ``reformatter``: one context for a clip)."""
    if layout.planar:
        if frame.format.name != layout.format:  # a format change mid-stream
            frame = (reformatter.reformat(frame, format=layout.format) if reformatter is not None
                     else frame.reformat(format=layout.format))
        if out is None:
            out = np.empty(layout.shape, dtype=layout.dtype)
        for source, target in zip(plane_views(frame, layout), layout.planes(out)):
            np.copyto(target, source)
        return out
    rgb = (reformatter.reformat(frame, format=layout.format) if reformatter is not None
           else frame.reformat(format=layout.format)).to_ndarray()
    if out is None:
        return rgb
    np.copyto(out, rgb)
    return out


def host_to_frame(av, array: np.ndarray, layout: Layout):
    """A host frame (flat planes, or packed RGB) as a new av.VideoFrame (a copy)."""
    if not layout.planar:
        return av.VideoFrame.from_ndarray(array, format=layout.format)
    frame = av.VideoFrame(layout.width, layout.height, layout.format)
    for source, target in zip(layout.planes(array), plane_views(frame, layout)):
        np.copyto(target, source)
    return frame


def decode_frames(info: VideoInfo, layout: Optional[Layout] = None) -> Iterator[Tuple[Fraction, np.ndarray]]:
    """(time in seconds, array) of every frame, in presentation order, laid out as ``layout`` (default:
    RGB, 8 bits or, for deeper video, 16)."""
    from av.video.reformatter import VideoReformatter

    if layout is None:
        layout = Layout("rgb48le" if info.deep else "rgb24", info.height, info.width)
    decoder = Decoder(info)
    reformatter = VideoReformatter()
    try:
        for time, frame in decoder.frames():
            yield time, frame_to_host(frame, layout, reformatter=reformatter)
    finally:
        decoder.close()


def _encoder(av, name: str):
    try:
        return av.codec.Codec(ENCODER_OF.get(name, name), "w")
    except Exception:  # noqa: BLE001 (UnknownCodecError)
        return None


def choose_encoding(container, target: Path, info: Optional[VideoInfo], codec: Optional[str], crf: Optional[float],
                    pix_fmt: Optional[str], width: int, height: int) -> Tuple[str, str, dict, Optional[str]]:
    """(encoder, pixel format, encoder options, a note for the user or None) for the output ``container``.

    Codec: ``codec`` if given, else the input's when the output container takes it, else the
    container's default (e.g. VP9 for .webm). CRF: ``crf`` if given, else the CRF the input's
    x264/x265 encoder recorded, else the encoder's default (x264: 23, x265: 28, VP9: 31, ...);
    encoders without a CRF get the input's bit rate (scaled by the frame-rate change by the caller).
    Pixel format: ``pix_fmt`` if given, else the input's when the encoder takes it (and, for 4:2:0,
    the size is even; odd sizes get 4:4:4, and the note says so), else the encoder's first.
    ``crf`` 0 is a lossless encode (x264: quantiser 0, lossless at every bit depth, where its CRF 0
    is lossless at 8 bits only; x265 and VP9: their lossless mode)."""
    av = _av()
    supported = container.supported_codecs
    ext = target.suffix.lower()
    if codec is not None:
        encoder = _encoder(av, codec)
        if encoder is None:
            raise UserError(f"--codec {codec}: no such encoder in this FFmpeg (try libx264, libx265, libvpx-vp9, "
                            "mpeg4, ffv1)")
        if encoder.type != "video":
            raise UserError(f"--codec {codec}: not a video encoder")
        if encoder.canonical_name not in supported:
            raise UserError(f"--codec {codec}: a {ext} file cannot hold {encoder.canonical_name} video")
    else:
        encoder = None
        if info is not None and info.codec in supported:
            encoder = _encoder(av, info.codec)
        if encoder is None:
            encoder = _encoder(av, container.default_video_codec)
        if encoder is None:
            raise UserError(f"-o {target}: no video encoder for {ext} files in this FFmpeg (use .mp4 or .mkv)")
    formats = [f.name for f in (encoder.video_formats or [])]
    note = None
    if pix_fmt is not None:
        if formats and pix_fmt not in formats:
            raise UserError(f"--pix-fmt {pix_fmt}: {encoder.name} takes {', '.join(formats[:12])}")
        chosen = pix_fmt
    else:
        odd = width % 2 or height % 2
        candidates = [info.pix_fmt] if info is not None else []
        candidates += ["yuv420p", "yuv444p", "rgb24"]
        usable = [f for f in candidates if not formats or f in formats]
        chosen = next((f for f in usable if not (odd and _subsampled(av, f))), formats[0] if formats else "yuv420p")
        if usable and chosen != usable[0]:
            note = (f"{width}x{height} frames cannot be encoded as {usable[0]} (its chroma needs an even width and "
                    f"height): writing {chosen}, which some players do not play (--pix-fmt to choose another)")
    if _subsampled(av, chosen) and (width % 2 or height % 2):
        raise UserError(f"{width}x{height} frames cannot be encoded as {chosen} (it needs an even width and height): "
                        "give --pix-fmt yuv444p")
    options = {}
    if encoder.name in CRF_RANGE:
        low, high, default = CRF_RANGE[encoder.name]
        if crf is not None and not low <= crf <= high:
            raise UserError(f"--crf {crf:g}: {encoder.name} takes {low}..{high}")
        value = crf if crf is not None else (info.crf if info is not None and info.crf is not None
                                             and encoder.canonical_name == info.codec else default)
        if value == 0 and encoder.name in LOSSLESS:
            options.update(LOSSLESS[encoder.name])
        else:
            options["crf"] = f"{value:g}"
        if encoder.name in ("libvpx-vp9", "libvpx"):
            options["b"] = "0"  # constant quality
    elif crf is not None:
        raise UserError(f"--crf: {encoder.name} has no CRF (use libx264, libx265, libvpx-vp9 or libsvtav1)")
    return encoder.name, chosen, options, note


def _subsampled(av, pix_fmt: str) -> bool:
    """Whether ``pix_fmt`` stores chroma at a lower resolution (4:2:0, 4:2:2, ...)."""
    try:
        fmt = av.VideoFormat(pix_fmt, 4, 4)
    except Exception:  # noqa: BLE001 (an unknown name: the encoder reports it)
        return False
    return any(c.width != 4 or c.height != 4 for c in fmt.components)


def _mux(container, packets) -> None:
    """Writes packets into the output (the one place the video output is written: tests make it fail)."""
    container.mux(packets)


# The encoders that take ``threads`` as their thread count. x265 sizes its frame threads and pools from
# the cores itself, and libavcodec passes a thread count to it as frame threads, which it refuses above 15.
SIZED_THREADS = ("libx264",)


class VideoSink:
    """Encodes frames into a video file at ``path`` (a temporary name: the caller renames it),
    copying the input's audio and subtitle streams in sync. Writes happen in the encode thread
    (:class:`BackgroundWriter`), items ``(frame, time in seconds)``: a frame is a decoded
    av.VideoFrame that goes to the encoder as it is (an input frame the output repeats, where
    :meth:`takes` it), or a :class:`~edsc_ext.apps.frames.HostFrame` in the encoder's own planar
    layout (:attr:`layout`: copied into a frame) or in RGB (through one swscale context).

    The input's display matrix is kept (:attr:`keeps_rotation`) where the container stores one and
    ``rotate_pixels`` is not asked for; ``width`` and ``height`` are those of the frames written
    (turned already where the caller turns the pixels). ``preset``: x264/x265's (None: ``default_preset``,
    else the encoder's own); ``threads``: x264's threads (None: its own choice, 1.5 per core; other
    encoders size their threads themselves); ``profile``: a :class:`~edsc_ext.apps.stages.StageProfile`
    timing the encode and mux stages."""

    def __init__(self, path: Path, target: Path, width: int, height: int, rate: Fraction, time_base: Fraction,
                 info: Optional[VideoInfo] = None, codec: Optional[str] = None, crf: Optional[float] = None,
                 pix_fmt: Optional[str] = None, copy_streams: bool = True, quiet: bool = False,
                 rate_change: Fraction = Fraction(1), preset: Optional[str] = None, rotate_pixels: bool = False,
                 default_preset: Optional[str] = None, threads: Optional[int] = None, profile=None):
        av = _av()
        self.av, self.path, self.target, self.time_base = av, path, target, time_base
        self.width, self.height = width, height
        self.frames = 0
        self.profile = profile
        self.copied_streams: List[str] = []
        fmt = av.format.ContainerFormat(_format_name(av, target), "w") if _format_name(av, target) else None
        try:
            self.container = av.open(str(path), "w", format=fmt.name if fmt else None)
        except Exception as e:  # noqa: BLE001
            raise UserError(f"-o {target}: cannot write a video file of this kind ({e})") from None
        try:
            encoder, pix, options, self.note = choose_encoding(self.container, target, info, codec, crf, pix_fmt,
                                                               width, height)
            if preset is not None:
                if encoder not in PRESETS:
                    raise UserError(f"--preset {preset}: {encoder} has no presets (libx264 and libx265 have)")
                if preset not in PRESETS[encoder]:
                    raise UserError(f"--preset {preset}: {encoder} takes {', '.join(PRESETS[encoder])}")
                options["preset"] = preset
            elif default_preset is not None and encoder in PRESETS:
                options["preset"] = default_preset
            self.stream = self.container.add_stream(encoder, rate=rate, options=options)
            self.stream.width, self.stream.height, self.stream.pix_fmt = width, height, pix
            ctx = self.stream.codec_context
            # Frame threads as well as slices (PyAV's default is slices only): x264 then keeps up
            # with the network at 1080p (BENCHMARKS.md, video section).
            ctx.thread_type = "AUTO"
            if threads and encoder in SIZED_THREADS:
                ctx.thread_count = threads
            self.stream.time_base = time_base
            ctx.time_base = time_base
            if encoder not in CRF_RANGE and info is not None and info.bit_rate and encoder != "gif":
                self.stream.bit_rate = int(info.bit_rate * rate_change)
            self.encoder, self.pix_fmt, self.options = encoder, pix, options
            self._colour = {}
            if info is not None and not self.av.VideoFormat(pix).is_rgb and encoder != "gif":
                for name in ("colorspace", "color_range", "color_primaries", "color_trc"):
                    value = getattr(info, name)
                    if value not in (2, 0) or (name == "color_range" and value):
                        try:
                            setattr(ctx, name, value)
                        except Exception:  # noqa: BLE001 (an older PyAV without that attribute)
                            pass
                if info.colorspace != 2:
                    self._colour["dst_colorspace"] = info.colorspace
                if info.color_range:
                    self._colour["dst_color_range"] = info.color_range
            self.keeps_rotation = bool(info is not None and info.display_matrix is not None and not rotate_pixels
                                       and target.suffix.lower() in KEEPS_DISPLAY_MATRIX)
            if self.keeps_rotation:
                self.stream.set_display_matrix(list(info.display_matrix))
            # The encoder opened now, in this thread: its settings are checked before any work, and
            # the threads it starts (x264's) are known to be the encode stage's.
            opened = profile.threads_of("encode") if profile is not None else nullcontext()
            try:
                with opened:
                    ctx.open(strict=False)
            except av.error.FFmpegError as e:
                raise UserError(f"-o {target}: the encoder {encoder} refuses its settings ({e})") from None
            self._copier = _PacketCopier(av, info, self.container, target, quiet) if (info and copy_streams) else None
            if self._copier is not None:
                self.copied_streams = self._copier.names
        except BaseException:
            self.container.close()
            raise
        from av.video.reformatter import VideoReformatter

        self._reformatter = VideoReformatter()  # one swscale context for the clip
        # The planar layout the device hands frames over in (None: RGB, converted here).
        colorspace = info.colorspace if info is not None else 2
        color_range = info.color_range if info is not None else 0
        self.layout = yuv_layout_of(pix, colorspace, color_range, width, height) if encoder != "gif" else None

    @property
    def preset(self) -> Optional[str]:
        return self.options.get("preset")

    @property
    def quality(self) -> str:
        """The quality setting in words: "crf 18", "lossless", or "" (a bit rate)."""
        if "crf" in self.options:
            return f"crf {self.options['crf']}"
        if any(self.options.get(k) == v for options in LOSSLESS.values() for k, v in options.items()):
            return "lossless"
        return ""

    def takes(self, frame) -> bool:
        """Whether a decoded frame goes to the encoder as it is: its size and pixel format are the output's."""
        return (frame is not None and frame.format.name == self.pix_fmt and frame.width == self.width
                and frame.height == self.height)

    def write(self, item) -> None:
        payload, time = item
        profile = self.profile
        if isinstance(payload, HostFrame):
            if payload.ready is not None and profile is not None:
                waited = profile.clock()
                array = payload.get()
                profile.wait("encode thread for the device", waited)
            else:
                array = payload.get()
            start = profile.clock() if profile is not None else 0.0
            frame = host_to_frame(self.av, array, payload.layout)
            if frame.format.name != self.pix_fmt:
                frame = self._reformatter.reformat(frame, format=self.pix_fmt, **self._colour)
        else:
            start = profile.clock() if profile is not None else 0.0
            frame = payload
            frame.pict_type = 0  # a decoded frame's type would force the encoder's choice
            frame.duration = 0  # counted in the input's time base, not the output's set below
        frame.pts = int(round(time / self.time_base))
        frame.time_base = self.time_base
        packets = self.stream.encode(frame)
        if profile is not None:
            profile.add_host("encode", start)
            profile.mark("first frame to the encoder")
        self._mux_video(packets)
        self.frames += 1

    def _mux_video(self, packets) -> None:
        if not packets:
            return
        start = self.profile.clock() if self.profile is not None else 0.0
        for packet in packets:
            if self._copier is not None and packet.dts is not None:
                self._copier.mux_until(Fraction(packet.dts) * self.time_base)
            _mux(self.container, packet)
        if self.profile is not None:
            self.profile.add_host("mux", start, frames=len(packets))
            self.profile.mark("first packet written")

    def finish(self) -> None:
        start = self.profile.clock() if self.profile is not None else 0.0
        packets = self.stream.encode(None)  # the frames the encoder still holds
        if self.profile is not None:
            self.profile.add_host("encode", start, frames=0)
        self._mux_video(packets)
        if self._copier is not None:
            start = self.profile.clock() if self.profile is not None else 0.0
            self._copier.mux_until(None)
            if self.profile is not None:
                self.profile.add_host("mux", start, frames=0)
        if self.profile is not None:
            self.profile.group_end("encode")  # before the encoder's threads end with the file
        self.container.close()

    def abort(self) -> None:
        try:
            if self._copier is not None:
                self._copier.close()
            self.container.close()
        except Exception:  # noqa: BLE001 (the file is being thrown away)
            pass


def _format_name(av, target: Path) -> Optional[str]:
    # .m4v is MP4 (FFmpeg would pick its 'ipod' variant, which takes fewer codecs).
    return {".m4v": "mp4", ".ogv": "ogg"}.get(target.suffix.lower())


class _PacketCopier:
    """The input's audio and subtitle packets, from a demuxer of their own, muxed unchanged into the
    output as the video's time reaches theirs."""

    def __init__(self, av, info: VideoInfo, output, target: Path, quiet: bool):
        self.input = _open_input(info.path)
        self.output, self.map, self.names = output, {}, []
        supported = output.supported_codecs
        for index, kind, codec in info.copied:
            source = self.input.streams[index]
            if codec not in supported:
                note(f"edsc-interpolate: the {kind} stream {index} ({codec}) cannot go into a {target.suffix} file: "
                     "left out (a .mkv output takes it)", quiet)
                continue
            try:
                self.map[index] = output.add_stream_from_template(source)
            except Exception as e:  # noqa: BLE001
                note(f"edsc-interpolate: the {kind} stream {index} ({codec}) cannot be copied ({e}): left out", quiet)
                continue
            self.names.append(f"{kind} ({codec})")
        streams = [self.input.streams[i] for i in self.map]
        self._packets = self.input.demux(*streams) if streams else iter(())
        self._pending = None

    def mux_until(self, time: Optional[Fraction]) -> None:
        """Muxes the copied packets up to ``time`` (seconds; None: all that are left)."""
        while True:
            packet = self._pending if self._pending is not None else next(self._packets, None)
            self._pending = None
            if packet is None:
                if time is None:
                    self.close()
                return
            if packet.dts is None and packet.pts is None:
                continue  # the demuxer's flush packet
            stamp = packet.dts if packet.dts is not None else packet.pts
            if time is not None and Fraction(stamp) * Fraction(packet.time_base) > time:
                self._pending = packet
                return
            packet.stream = self.map[packet.stream_index]
            _mux(self.output, packet)

    def close(self) -> None:
        self.input.close()


class FolderSink:
    """Writes frames (RGB :class:`~edsc_ext.apps.frames.HostFrame`) as numbered PNGs (00000000.png,
    ...) into a folder; the PNG compression is the encode stage of ``profile``."""

    layout = None  # RGB only
    keeps_rotation = False
    note = None

    def __init__(self, folder: Path, profile=None):
        self.folder, self.frames, self.profile = folder, 0, profile

    def takes(self, frame) -> bool:
        return False  # decoded video frames are converted to RGB

    def write(self, item) -> None:
        from PIL import Image

        host, _ = item
        array = host.get()
        start = self.profile.clock() if self.profile is not None else 0.0
        if array.dtype == np.uint16:
            array = (array.astype(np.float32) / 257.0).round().astype(np.uint8)
        path = self.folder / f"{self.frames:08d}.png"
        with open(path, "wb") as f:
            _save_png(Image.fromarray(array), f)
        if self.profile is not None:
            self.profile.add_host("encode", start)
            self.profile.mark("first frame to the encoder")
        self.frames += 1

    def finish(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _save_png(image, fileobj) -> None:
    image.save(fileobj, format="PNG", compress_level=1)


# --------------------------------------------------------------------------------------------
# Threads.


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


_END = object()


class Prefetch:
    """Runs ``make_iterator()`` in a thread, handing its items over through a queue of at most
    ``maxsize`` items (the decode thread). Errors are raised where the items are taken. With a
    ``profile``, the time the taker waits for items is noted as ``wait_name``."""

    def __init__(self, make_iterator: Callable[[], Iterator], maxsize: int = 4, name: str = "decode",
                 profile=None, wait_name: str = "main thread for decoded frames"):
        self._queue: "queue.Queue" = queue.Queue(maxsize)
        self._stop = threading.Event()
        self.profile, self.wait_name = profile, wait_name
        self._thread = threading.Thread(target=self._run, args=(make_iterator,), name=f"edsc-{name}", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, make_iterator) -> None:
        iterator = None
        try:
            iterator = make_iterator()
            for item in iterator:
                if not self._put(item):
                    return
            self._put(_END)
        except BaseException as e:  # noqa: BLE001 (handed to the main thread)
            self._put(_Failure(e))
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    def __iter__(self):
        while True:
            if self.profile is not None:
                start = self.profile.clock()
                item = self._queue.get()
                self.profile.wait(self.wait_name, start)
            else:
                item = self._queue.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()


class BackgroundWriter:
    """Hands items to ``sink.write`` in a thread (the encode thread), through a queue of at most
    ``maxsize`` items; :meth:`close` waits for the end and calls ``sink.finish()``. An error in the
    thread is raised by the next :meth:`put` or by :meth:`close`. With a ``profile``, the encode
    thread's CPU time counts as the encode stage's and the waits on either side of the queue are noted."""

    def __init__(self, sink, maxsize: int = 4, name: str = "encode", profile=None):
        self.sink = sink
        self.profile = profile
        self._queue: "queue.Queue" = queue.Queue(maxsize)
        self._error: Optional[BaseException] = None
        self._aborted = False
        self._thread = threading.Thread(target=self._run, name=f"edsc-{name}", daemon=True)
        self._thread.start()

    def _take(self):
        if self.profile is None:
            return self._queue.get()
        start = self.profile.clock()
        item = self._queue.get()
        self.profile.wait("encode thread for frames", start)
        return item

    def _run(self) -> None:
        ended = False
        if self.profile is not None:
            self.profile.join_group("encode")
        try:
            while True:
                item = self._take()
                if item is _END:
                    ended = True
                    if not self._aborted:
                        self.sink.finish()
                    return
                if not self._aborted:
                    self.sink.write(item)
        except BaseException as e:  # noqa: BLE001 (raised in the main thread)
            self._error = e
            # Keep taking items until the end, so that the main thread never blocks on a full queue.
            while not ended and self._queue.get() is not _END:
                pass

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def put(self, item) -> None:
        self._check()
        try:
            self._queue.put_nowait(item)
            return
        except queue.Full:
            pass
        start = self.profile.clock() if self.profile is not None else 0.0
        while True:
            try:
                self._queue.put(item, timeout=0.1)
                break
            except queue.Full:
                self._check()
        if self.profile is not None:
            self.profile.wait("main thread for the encoder", start)

    def close(self) -> None:
        """Ends the stream (the sink finishes the file) and raises the thread's error, if any."""
        self._queue.put(_END)
        self._thread.join()
        self._check()

    def abort(self) -> None:
        """Stops after an error elsewhere: the thread skips what is queued, the sink lets go of its file."""
        self._aborted = True
        if self._thread.is_alive():
            self._queue.put(_END)
            self._thread.join()
        self.sink.abort()
