"""PSNR and SSIM of an EDSC checkpoint on the Middlebury interpolation frames, as a table.

    python -m edsc_ext.apps.evaluate --weights EDSC_s.pth --data middlebury/ [--device cuda]

``--data`` is a folder of sequence folders (Beanbags/, Venus/, ...), each holding ``frame10.png``,
``frame11.png`` and the true middle frame ``frame10i11.png``: Middlebury's "other" color frames
(other-color-twoframes) with their interpolation ground truth (other-gt-interp), from
https://vision.middlebury.edu/flow/data/, merged per sequence. The interpolated frame is rounded to
8 bits (as it would be saved) before scoring. PSNR is over all RGB values (peak 1); SSIM is the usual
Gaussian-window SSIM (11x11, sigma 1.5, K1=0.01, K2=0.03 on the 0..255 scale), averaged over the image
and the three channels.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..models import MODEL_NAMES, SAMPLINGS
from .common import OneLineParser, UserError, describe_os_error, progress, time_in_unit_interval
from .engine import default_device, load_model
from .images import read_image
from .interpolate import interpolate_frames

__all__ = ["psnr", "ssim", "find_middlebury", "evaluate", "format_table", "main"]

FIRST, SECOND, TRUTH = "frame10.png", "frame11.png", "frame10i11.png"


def psnr(output: Tensor, target: Tensor) -> float:
    """PSNR in dB of images in [0, 1] (peak 1)."""
    mse = (output.double() - target.double()).square().mean().item()
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> Tensor:
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-x.square() / (2 * sigma * sigma))
    return g / g.sum()


def ssim(output: Tensor, target: Tensor, window: int = 11, sigma: float = 1.5) -> float:
    """Mean SSIM (Wang et al. 2004) of (C, H, W) images in [0, 1], per channel on the 0..255 scale
    with a Gaussian window, over the valid (unpadded) region, averaged over channels."""
    x = output.double().unsqueeze(1) * 255  # (C, 1, H, W): channels as a batch
    y = target.double().unsqueeze(1) * 255
    g = _gaussian_window(window, sigma)

    def blur(t):
        t = F.conv2d(t, g.view(1, 1, -1, 1))
        return F.conv2d(t, g.view(1, 1, 1, -1))

    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mx, my = blur(x), blur(y)
    sxx = blur(x * x) - mx * mx
    syy = blur(y * y) - my * my
    sxy = blur(x * y) - mx * my
    value = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
    return value.mean().item()


def find_middlebury(data: str) -> Path:
    """The Middlebury folder ``data``, which must exist."""
    path = Path(data)
    if not path.is_dir():
        raise FileNotFoundError(f"--data {data}: no such folder (expected a folder of sequence folders holding "
                                f"{FIRST}, {SECOND} and {TRUTH})")
    return path


def sequences_in(root: Path, names: Optional[Sequence[str]] = None) -> List[Path]:
    found = sorted(p for p in root.iterdir() if all((p / f).is_file() for f in (FIRST, SECOND, TRUTH)))
    if names:
        by_name = {p.name: p for p in found}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise ValueError(f"no sequence(s) {missing} in {root}; there are {sorted(by_name)}")
        found = [by_name[n] for n in names]
    if not found:
        raise FileNotFoundError(f"no sequence folders with {FIRST}, {SECOND} and {TRUTH} in {root}")
    return found


def _center_crop(image: Tensor, size: Optional[int]) -> Tensor:
    if not size:
        return image
    h, w = image.shape[1:]
    top, left = max(0, (h - size) // 2), max(0, (w - size) // 2)
    return image[:, top:top + size, left:left + size]


@torch.no_grad()
def evaluate(model, root: Path, names: Optional[Sequence[str]] = None, time: float = 0.5,
             crop: Optional[int] = None, show_progress: bool = True) -> List[dict]:
    """One row {sequence, psnr, ssim} per sequence."""
    rows = []
    folders = sequences_in(Path(root), names)
    for folder in progress(folders, desc="evaluating", unit="seq", disable=not show_progress):
        first, second, truth = (_center_crop(read_image(folder / f), crop) for f in (FIRST, SECOND, TRUTH))
        (middle,) = interpolate_frames(model, first, second, times=[time])
        middle = middle.mul(255).round().div(255)  # as saved to an 8-bit image
        rows.append({"sequence": folder.name, "psnr": psnr(middle, truth), "ssim": ssim(middle, truth)})
    return rows


def format_table(rows: List[dict]) -> str:
    width = max([len("sequence"), len("mean")] + [len(r["sequence"]) for r in rows])
    lines = [f"| {'sequence':<{width}} | PSNR (dB) |  SSIM  |", f"|{'-' * (width + 2)}|----------:|-------:|"]
    for r in rows:
        lines.append(f"| {r['sequence']:<{width}} | {r['psnr']:9.2f} | {r['ssim']:.4f} |")
    if rows:
        mean_psnr = sum(r["psnr"] for r in rows) / len(rows)
        mean_ssim = sum(r["ssim"] for r in rows) / len(rows)
        lines.append(f"| {'mean':<{width}} | {mean_psnr:9.2f} | {mean_ssim:.4f} |")
    return "\n".join(lines)


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m edsc_ext.apps.evaluate",
                           description="PSNR/SSIM of an EDSC checkpoint on the Middlebury frames.")
    parser.add_argument("--weights", required=True, help="checkpoint ({'model_state': ...} as released)")
    parser.add_argument("--model", choices=MODEL_NAMES, default=None, help="default: read off the weights")
    parser.add_argument("--data", required=True, metavar="DIR",
                        help=f"a folder of sequence folders, each holding {FIRST}, {SECOND} and {TRUTH} "
                             "(Middlebury's other-color-twoframes and other-gt-interp, merged)")
    parser.add_argument("--sequences", default=None, help="comma-separated subset, e.g. Beanbags,Venus")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--sampling", choices=SAMPLINGS, default="compat",
                        help="the network's sampling: compat (the original layer, as the released weights expect) "
                             "or clean (centred taps, for networks trained that way); default compat")
    parser.add_argument("--time", type=time_in_unit_interval, default=0.5,
                        help="time to interpolate, in (0, 1) (EDSC_s: 0.5 only; default 0.5; the truth is the "
                             "midpoint)")
    parser.add_argument("--crop", type=int, default=None, help="score a centred SIZExSIZE crop only (quick checks)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # usage errors: one line, exit code 2, returned like the others
        return e.code if isinstance(e.code, int) else 2
    try:
        root = find_middlebury(args.data)
        model = load_model(args.weights, args.model, args.sampling, args.device or default_device())
        if not model.multiple and args.time != 0.5:
            raise UserError(f"EDSC_s interpolates the midpoint only (--time 0.5), got --time {args.time}: use EDSC_m "
                            "weights")
        names = [n for n in args.sequences.split(",") if n] if args.sequences else None
        rows = evaluate(model, root, names, time=args.time, crop=args.crop, show_progress=not args.quiet)
    except (UserError, ValueError, FileNotFoundError) as e:
        print(f"evaluate: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"evaluate: error: {describe_os_error(e)}", file=sys.stderr)
        return 2
    print(f"{model.name} ({args.weights}) on {root}:")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
