"""Writes the video tool's test clip: deterministic moving content with a stereo AAC track.

    python tools/make_test_clip.py clip.mp4                                   # 1920x1080, 60 s, 24 fps
    python tools/make_test_clip.py clip4k.mp4 --size 3840x2160 --seconds 10
    python tools/make_test_clip.py deep.mkv --pix-fmt yuv420p10le --size 640x360 --seconds 2

A panning multi-scale texture with moving blocks, H.264 (x264 CRF 18 at ``--preset``, veryfast by default:
the clip is written in seconds), the same bytes of video for the same arguments
(:func:`edsc_ext.benchmarks.video.make_clip`). ``tools/video_throughput.py`` makes its clips with it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from edsc_ext.apps.common import OneLineParser, UserError
from edsc_ext.benchmarks.video import make_clip


def size(text: str):
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT, e.g. 1920x1080, got {text!r}") from None
    return width, height


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python tools/make_test_clip.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="the clip to write (.mp4, .mkv, ...)")
    parser.add_argument("--size", type=size, default=(1920, 1080), help="WIDTHxHEIGHT (default 1920x1080)")
    parser.add_argument("--seconds", type=float, default=60.0, help="duration (default 60)")
    parser.add_argument("--fps", type=int, default=24, help="frame rate (default 24)")
    parser.add_argument("--crf", type=float, default=18, help="x264 CRF (default 18)")
    parser.add_argument("--preset", default="veryfast", help="x264 preset (default veryfast)")
    parser.add_argument("--pix-fmt", default="yuv420p", choices=("yuv420p", "yuv420p10le"),
                        help="8-bit yuv420p (default) or 10-bit yuv420p10le")
    parser.add_argument("--no-audio", action="store_true", help="no audio track (default: stereo AAC)")
    parser.add_argument("--seed", type=int, default=0, help="the content's seed (default 0)")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    frames = round(args.seconds * args.fps)
    if frames < 2:
        parser.error(f"--seconds {args.seconds:g} at {args.fps} fps is fewer than two frames")
    start = time.perf_counter()
    try:
        make_clip(args.output, *args.size, frames, rate=args.fps, seed=args.seed, audio=not args.no_audio,
                  crf=args.crf, preset=args.preset, pix_fmt=args.pix_fmt)
    except UserError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.output} ({args.size[0]}x{args.size[1]} {args.pix_fmt}, {frames} frames at {args.fps} fps"
          f"{'' if args.no_audio else ', stereo AAC'}) in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
