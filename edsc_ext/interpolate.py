"""``edsc-interpolate``: frame interpolation with an EDSC checkpoint, for an image pair or a video.

Pair of images (EDSC_s gives the midpoint; EDSC_m any ``--time`` in (0, 1))::

    edsc-interpolate --model EDSC_s --weights EDSC_s.pth first.png second.png -o middle.png
    edsc-interpolate --model EDSC_m --weights EDSC_m.pth --time 0.25 first.png second.png -o quarter.png

Video (``--factor F`` multiplies the frame rate: F-1 new frames between each pair; EDSC_s needs F a
power of two, reached by repeated midpoints)::

    edsc-interpolate --weights EDSC_s.pth --video frames_dir/ -o out_dir/ --factor 2
    edsc-interpolate --weights EDSC_m.pth --video clip.mp4 -o clip_x4.mp4 --factor 4

A video is a folder of frames (sorted by name; PNG without any extra package) or a video file, which
needs ``imageio`` (with its ffmpeg plugin) or OpenCV. Also runnable as ``python -m edsc_ext.interpolate``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time as _time
from pathlib import Path
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from . import _image
from .models import MODEL_NAMES, SAMPLINGS, EDSC, load_checkpoint

__all__ = ["main", "load_model", "interpolate_frames", "progress", "read_frames", "FrameWriter"]

VIDEO_EXTENSIONS = (".mp4", ".mkv", ".avi", ".mov", ".webm", ".gif", ".m4v")


# --------------------------------------------------------------------------------------------
# Progress bar: tqdm when installed, else a minimal one on stderr.


class _SimpleProgress:
    def __init__(self, iterable=None, total=None, desc="", disable=False, unit="it", **_):
        self.iterable, self.total, self.desc, self.disable, self.unit = iterable, total, desc, disable, unit
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            self.total = len(iterable)
        self.n, self.start, self.postfix, self._last = 0, _time.time(), "", 0.0

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update()
        self.close()

    def set_postfix_str(self, text, refresh=True):
        self.postfix = text

    def update(self, n=1):
        self.n += n
        now = _time.time()
        if not self.disable and (now - self._last > 0.5 or self.n == self.total):
            self._last = now
            rate = self.n / max(now - self.start, 1e-9)
            total = f"/{self.total}" if self.total else ""
            post = f" {self.postfix}" if self.postfix else ""
            sys.stderr.write(f"\r{self.desc}: {self.n}{total} [{rate:.2f} {self.unit}/s]{post}")
            sys.stderr.flush()

    def close(self):
        if not self.disable and self.n:
            sys.stderr.write("\n")
            sys.stderr.flush()
        self.disable = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def progress(iterable=None, **kwargs):
    """``tqdm(iterable, **kwargs)`` if tqdm is installed, else a small stand-in."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _SimpleProgress(iterable, **kwargs)
    return tqdm(iterable, **kwargs)


# --------------------------------------------------------------------------------------------
# Model and frames.


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(weights, model_name: Optional[str] = None, sampling: str = "compat",
               device="cpu") -> EDSC:
    """An EDSC network in eval mode on ``device`` with the checkpoint's weights; checks that the
    weights are those of ``model_name`` ("EDSC_s"/"EDSC_m") when it is given."""
    model = load_checkpoint(weights, sampling=sampling)
    if model_name is not None and model.name != model_name:
        raise ValueError(f"--model {model_name} but the weights in {weights} are those of {model.name}")
    return model.to(device).eval()


def _to_model(rgb: Tensor, device) -> Tensor:
    return rgb.flip(0).to(device)  # RGB -> the original's BGR


def _from_model(bgr: Tensor) -> Tensor:
    return bgr.flip(0).float().cpu()


def interpolate_frames(model: EDSC, first: Tensor, second: Tensor, factor: int = 2,
                       times: Optional[Sequence[float]] = None) -> List[Tensor]:
    """New frames between two RGB frames (3, H, W) in [0, 1].

    By default the ``factor - 1`` frames at times k/factor. EDSC_m computes each time directly;
    EDSC_s needs ``factor`` a power of two and bisects (midpoints of midpoints). ``times`` (EDSC_m
    only) overrides the schedule.
    """
    device = next(model.parameters()).device
    a, b = _to_model(first, device), _to_model(second, device)
    if model.multiple:
        if times is None:
            times = [k / factor for k in range(1, factor)]
        return [_from_model(model.interpolate(a, b, float(t))) for t in times]
    if times is not None and any(t != 0.5 for t in times):
        raise ValueError("EDSC_s interpolates the midpoint only: use EDSC_m weights for other times")
    if factor < 1 or factor & (factor - 1):
        raise ValueError(f"EDSC_s can multiply the frame rate by a power of two only, got {factor}")

    def bisect(x, y, levels):
        if levels == 0:
            return []
        mid = model.interpolate(x, y)
        return bisect(x, mid, levels - 1) + [mid] + bisect(mid, y, levels - 1)

    return [_from_model(f) for f in bisect(a, b, int(math.log2(factor)))]


def _is_video_file(path) -> bool:
    return str(path).lower().endswith(VIDEO_EXTENSIONS)


def _frame_files(folder: Path) -> List[Path]:
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in _image.IMAGE_EXTENSIONS)
    if len(files) < 2:
        raise ValueError(f"{folder} holds {len(files)} image file(s); a video needs at least two frames")
    return files


def read_frames(source) -> tuple:
    """(frame iterator of RGB (3, H, W) float tensors, number of frames or None, fps or None) of a
    folder of images or a video file."""
    source = Path(source)
    if source.is_dir():
        files = _frame_files(source)
        return (_image.read_image(f) for f in files), len(files), None
    if not source.exists():
        raise FileNotFoundError(source)
    return _read_video(source)


def _read_video(path: Path):
    try:
        import imageio.v3 as iio
    except ImportError:
        iio = None
    if iio is not None:
        try:
            fps = iio.immeta(path).get("fps")
        except Exception:  # noqa: BLE001 (metadata is optional)
            fps = None

        def frames_imageio():
            for frame in iio.imiter(path):
                yield torch.from_numpy(frame[..., :3].copy()).permute(2, 0, 1).float().div_(255)

        return frames_imageio(), None, fps
    try:
        import cv2
    except ImportError:
        raise RuntimeError(f"reading the video file {path} needs imageio (pip install imageio[ffmpeg]) or OpenCV; "
                           "or pass a folder of frames") from None
    capture = cv2.VideoCapture(str(path))
    if not capture.isOpened():
        raise RuntimeError(f"OpenCV cannot open {path}")
    count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) or None
    fps = capture.get(cv2.CAP_PROP_FPS) or None

    def frames_cv2():
        try:
            while True:
                ok, frame = capture.read()
                if not ok:
                    return
                yield torch.from_numpy(frame).flip(-1).permute(2, 0, 1).float().div_(255)
        finally:
            capture.release()

    return frames_cv2(), count, fps


class FrameWriter:
    """Writes RGB frames to a folder (numbered PNGs) or to a video file (imageio or OpenCV)."""

    def __init__(self, target, fps: float = 25.0):
        self.target, self.fps, self.count, self._writer = Path(target), fps, 0, None
        self.to_folder = not _is_video_file(target)
        if self.to_folder:
            self.target.mkdir(parents=True, exist_ok=True)

    def write(self, frame: Tensor) -> None:
        if self.to_folder:
            _image.write_image(self.target / f"{self.count:08d}.png", frame)
        else:
            self._write_video(_image.to_uint8(frame))
        self.count += 1

    def _write_video(self, pixels: Tensor) -> None:
        if self._writer is None:
            self._writer = self._open(pixels.shape[1], pixels.shape[0])
        kind, writer = self._writer
        array = pixels.numpy()
        if kind == "imageio":
            writer.append_data(array)
        else:
            writer.write(array[..., ::-1].copy())

    def _open(self, width: int, height: int):
        try:
            import imageio.v2 as imageio
        except ImportError:
            imageio = None
        if imageio is not None:
            return "imageio", imageio.get_writer(str(self.target), fps=self.fps)
        try:
            import cv2
        except ImportError:
            raise RuntimeError(f"writing the video file {self.target} needs imageio (pip install imageio[ffmpeg]) "
                               "or OpenCV; or give a folder as output") from None
        fourcc = cv2.VideoWriter_fourcc(*"mp4v")
        return "cv2", cv2.VideoWriter(str(self.target), fourcc, self.fps, (width, height))

    def close(self) -> None:
        if self._writer is not None:
            kind, writer = self._writer
            writer.close() if kind == "imageio" else writer.release()
            self._writer = None


def interpolate_video(model: EDSC, source, target, factor: int = 2, fps: Optional[float] = None,
                      show_progress: bool = True) -> int:
    """Multiplies the frame rate of ``source`` (folder of frames or video file) by ``factor``
    into ``target`` (folder or video file); returns the number of frames written."""
    frames, count, source_fps = read_frames(source)
    out_fps = fps if fps is not None else (source_fps or 25.0) * factor
    writer = FrameWriter(target, fps=out_fps)
    bar = progress(total=(count - 1) if count else None, desc="interpolating", unit="pair",
                   disable=not show_progress)
    try:
        previous = next(frames, None)
        if previous is None:
            raise ValueError(f"{source} has no frames")
        writer.write(previous)
        for frame in frames:
            if frame.shape != previous.shape:
                raise ValueError(f"frames differ in size: {tuple(previous.shape)} then {tuple(frame.shape)}")
            for new in interpolate_frames(model, previous, frame, factor):
                writer.write(new)
            writer.write(frame)
            previous = frame
            bar.update(1)
    finally:
        bar.close()
        writer.close()
    return writer.count


# --------------------------------------------------------------------------------------------
# Command line.


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edsc-interpolate", description="Interpolate frames with EDSC (an image pair, or a whole video).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  edsc-interpolate --model EDSC_s --weights EDSC_s.pth first.png second.png -o middle.png\n"
               "  edsc-interpolate --model EDSC_m --weights EDSC_m.pth --time 0.25 a.png b.png -o quarter.png\n"
               "  edsc-interpolate --weights EDSC_s.pth --video frames/ -o frames_x2/ --factor 2\n")
    parser.add_argument("frames", nargs="*", metavar="FRAME", help="the two input images (pair mode)")
    parser.add_argument("-o", "--output", required=True,
                        help="output image (pair mode), or output folder / video file (--video)")
    parser.add_argument("--weights", required=True, help="checkpoint ({'model_state': ...} as released, or a state dict)")
    parser.add_argument("--model", choices=MODEL_NAMES, default=None,
                        help="EDSC_s or EDSC_m (default: read off the weights)")
    parser.add_argument("--time", type=float, default=0.5, help="time of the new frame in (0, 1) (EDSC_m; default 0.5)")
    parser.add_argument("--video", metavar="INPUT", default=None,
                        help="video mode: a folder of frames or a video file (imageio/OpenCV)")
    parser.add_argument("--factor", type=int, default=2,
                        help="video mode: frame-rate multiplier (default 2; EDSC_s: a power of two)")
    parser.add_argument("--fps", type=float, default=None, help="video mode: output frame rate for a video file")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--sampling", choices=SAMPLINGS, default="compat",
                        help="'compat': the original layer (for released weights, default); 'clean': centred taps")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    device = args.device or default_device()
    if args.video is None and len(args.frames) != 2:
        parser.error("give two input frames (or --video INPUT)")
    if args.video is not None and args.frames:
        parser.error("--video takes no positional frames")
    if not 0.0 < args.time < 1.0:
        parser.error(f"--time must be in (0, 1), got {args.time}")
    if args.factor < 1:
        parser.error(f"--factor must be >= 1, got {args.factor}")
    try:
        model = load_model(args.weights, args.model, args.sampling, device)
        if args.video is None:
            first, second = (_image.read_image(f) for f in args.frames)
            if first.shape != second.shape:
                raise ValueError(f"the frames differ in size: {tuple(first.shape)} and {tuple(second.shape)}")
            if not model.multiple and args.time != 0.5:
                raise ValueError("EDSC_s interpolates the midpoint only (--time 0.5); use EDSC_m weights")
            (middle,) = interpolate_frames(model, first, second, times=[args.time])
            output = Path(args.output)
            if output.parent and not output.parent.exists():
                output.parent.mkdir(parents=True, exist_ok=True)
            _image.write_image(output, middle)
            print(f"wrote {output} ({middle.shape[2]}x{middle.shape[1]}, t={args.time})")
        else:
            written = interpolate_video(model, args.video, args.output, args.factor, args.fps,
                                        show_progress=not args.quiet)
            print(f"wrote {written} frames to {args.output}")
    except (ValueError, RuntimeError, FileNotFoundError, OSError) as e:
        print(f"edsc-interpolate: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
