"""Train EDSC with edsc_ext on frame triplets (Vimeo-90k layout), checkpoints in the original format.

Single process (GPU if there is one, else CPU)::

    python examples/train.py --data /data/vimeo_triplet --out runs/edsc_s --epochs 20 --amp

Several GPUs of one host (DistributedDataParallel, one process per GPU)::

    torchrun --nproc_per_node=4 examples/train.py --data /data/vimeo_triplet --out runs/edsc_s --amp

EDSC_m (any time t) on Vimeo-90k septuplets: ``--model EDSC_m --data /data/vimeo_septuplet``.

Data (``--data``, and ``--val`` for choosing the best checkpoint): a folder with ``tri_trainlist.txt``
and ``sequences/<id>/im1.png..im3.png`` (or ``sep_trainlist.txt`` and ``im1.png..im7.png``) as
Vimeo-90k ships it, or any tree whose leaf folders hold ``im1.png, im2.png, im3.png`` (or the
Middlebury names ``frame10.png, frame10i11.png, frame11.png``). Frames are fed in BGR like the
original (which reads them with OpenCV), so checkpoints are interchangeable with the released ones.

Length: ``--epochs E`` epochs, or exactly ``--steps N`` optimizer steps in total (however many epochs
that takes; with ``--resume`` the resumed steps count). One progress bar runs over all steps.

Checkpoints, ``{'model_state': state_dict, 'epoch', 'step', 'optimizer_state', 'args'}``, loadable by
``edsc_ext.models.load_checkpoint``, ``edsc-interpolate`` and the original code, at most two in ``--out``:
``model_last.pth`` (after every epoch and at the end) and ``model_best.pth`` (the lowest mean L1 loss
on ``--val`` after an epoch, or without ``--val`` the lowest mean training loss of an epoch). Each is
written to a temporary name and then renamed, so a crash never leaves a truncated checkpoint.
``--resume`` continues from one.

Bad input (a missing folder, a folder with no samples, a file that is not a checkpoint, ...) ends
with one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import random
import sys
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from edsc_ext.apps.common import progress
from edsc_ext.apps.images import read_image
from edsc_ext.models import EDSC, MODEL_NAMES, SAMPLINGS, load_checkpoint, save_checkpoint

TRIPLET_NAMES = (("im1.png", "im2.png", "im3.png"), ("frame10.png", "frame10i11.png", "frame11.png"))
EXPECTED_LAYOUTS = ("Vimeo-90k's tri_trainlist.txt with sequences/<id>/im1.png..im3.png, or sep_trainlist.txt "
                    "with sequences/<id>/im1.png..im7.png, or folders holding im1.png, im2.png, im3.png or "
                    "Middlebury's frame10.png, frame10i11.png, frame11.png")
SIZE_MULTIPLE = 32  # the networks take frames whose sides are multiples of this
MAX_DEFAULT_WORKERS = 8


class InputError(Exception):
    """Bad input from the command line (a path, a file's contents); main() reports it in one line."""


class FrameTuples(Dataset):
    """(first, target, second, t) samples from Vimeo-90k-style folders, frames (3, crop, crop) BGR
    in [0, 1]. Augmentation: random crop, flips, and time reversal (first <-> second, t -> 1-t).

    Raises InputError, naming the folder, when it is missing, holds no samples, or its first sample
    cannot be read."""

    def __init__(self, root, crop: int = 256, augment: bool = True, multiple: bool = False):
        self.root, self.crop, self.augment = Path(root), crop, augment
        self.listing: Optional[str] = None  # tri_trainlist.txt or sep_trainlist.txt, if the data has one
        if not self.root.exists():
            raise InputError(f"{root}: no such folder")
        if not self.root.is_dir():
            raise InputError(f"{root}: not a folder")
        self.samples = self._find(multiple)
        if not self.samples:
            raise InputError(f"{root}: no samples found; expected {EXPECTED_LAYOUTS}")
        self._check_first_sample()

    def _find(self, multiple: bool) -> list:
        samples = []
        for listing, count in (("tri_trainlist.txt", 3), ("sep_trainlist.txt", 7)):
            path = self.root / listing
            if path.is_file():
                for line in path.read_text().split():
                    folder = self.root / "sequences" / line
                    names = [folder / f"im{k}.png" for k in range(1, count + 1)]
                    if count == 3:
                        samples.append((names[0], names[1], names[2], 0.5))
                    elif multiple:  # the end frames, and each inner frame at its time
                        samples += [(names[0], names[k], names[6], k / 6) for k in range(1, 6)]
                    else:  # consecutive triplets
                        samples += [(names[k], names[k + 1], names[k + 2], 0.5) for k in range(5)]
                if not samples:
                    raise InputError(f"{self.root}: {listing} lists no sequences; expected {EXPECTED_LAYOUTS}")
                self.listing = listing
                return samples
        for folder in sorted({p.parent for p in self.root.rglob("*.png")}):
            for first, middle, second in TRIPLET_NAMES:
                if all((folder / f).is_file() for f in (first, middle, second)):
                    samples.append((folder / first, folder / middle, folder / second, 0.5))
                    break
        return samples

    def _check_first_sample(self) -> None:
        # Up front, so that a wrong root or a partly unpacked data set fails here in one line rather
        # than in a DataLoader worker with a traceback.
        for path in self.samples[0][:3]:
            if not path.is_file():
                raise InputError(f"{self.root}: {path.relative_to(self.root)}, of the first sequence in "
                                 f"{self.listing}, is missing")
        try:
            self[0]
        except (ValueError, RuntimeError, OSError) as e:
            raise InputError(f"{self.root}: its first sample cannot be used: {e}") from None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        first, target, second, t = self.samples[index]
        frames = []
        for path in (first, target, second):
            try:
                frames.append(read_image(path).flip(0))  # RGB -> BGR
            except ValueError as e:
                raise ValueError(f"{path}: {e}") from None
        frames = torch.stack(frames)
        h, w = frames.shape[2:]
        crop_h = min(self.crop, h) // SIZE_MULTIPLE * SIZE_MULTIPLE
        crop_w = min(self.crop, w) // SIZE_MULTIPLE * SIZE_MULTIPLE
        if crop_h == 0 or crop_w == 0:
            raise ValueError(f"{first}: frames of {h}x{w} are smaller than {SIZE_MULTIPLE} pixels")
        if self.augment:
            top, left = random.randint(0, h - crop_h), random.randint(0, w - crop_w)
        else:
            top, left = (h - crop_h) // 2, (w - crop_w) // 2
        frames = frames[:, :, top:top + crop_h, left:left + crop_w]
        if self.augment:
            if random.random() < 0.5:
                frames = frames.flip(3)
            if random.random() < 0.5:
                frames = frames.flip(2)
            if random.random() < 0.5:
                frames, t = frames.flip(0), 1 - t
        return frames[0], frames[1], frames[2], torch.tensor(t, dtype=torch.float32)


def default_workers() -> int:
    """Data-loading processes per training process: the usable cores shared by this host's processes
    (torchrun sets LOCAL_WORLD_SIZE), at most MAX_DEFAULT_WORKERS."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, min(MAX_DEFAULT_WORKERS, cores // max(1, processes)))


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


def _odd_positive_int(text: str) -> int:
    value = _int_at_least(1)(text)
    if value % 2 == 0:
        raise argparse.ArgumentTypeError(f"must be odd, got {value}")
    return value


class _OneLineErrorParser(argparse.ArgumentParser):
    """Reports a bad argument in one line (argparse's default adds the usage, several lines)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineErrorParser(prog="train.py", description="Train EDSC on frame triplets with edsc_ext.")
    p.add_argument("--data", required=True, metavar="DIR",
                   help="training data: Vimeo-90k's layout (tri_trainlist.txt or sep_trainlist.txt and sequences/), "
                        "or folders of triplets (im1..im3.png or Middlebury's frame10, frame10i11, frame11.png)")
    p.add_argument("--val", default=None, metavar="DIR",
                   help="validation data, same layouts as --data, scored without augmentation (centre crop, L1) "
                        "after every epoch to choose model_best.pth (with --resume, against the earlier "
                        "model_best.pth); "
                        "default: choose by the epoch's mean training loss, within this run")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="checkpoint folder, created if missing; holds model_last.pth and model_best.pth")
    p.add_argument("--model", choices=MODEL_NAMES, default="EDSC_s",
                   help="EDSC_s (midpoints only) or EDSC_m (any time in (0, 1)); default EDSC_s")
    p.add_argument("--sampling", choices=SAMPLINGS, default="compat",
                   help="'compat' keeps checkpoints interchangeable with the original code (default)")
    p.add_argument("--kernel-size", type=_odd_positive_int, default=5, help="taps per axis, odd (default 5)")
    p.add_argument("--epochs", type=_int_at_least(1), default=1, help="epochs to train (default 1); see --steps")
    p.add_argument("--steps", type=_int_at_least(1), default=None,
                   help="train exactly this many optimizer steps in total, however many epochs that takes "
                        "(overrides --epochs; with --resume the checkpoint's steps count)")
    p.add_argument("--batch-size", type=_int_at_least(1), default=8, help="per process (default 8)")
    p.add_argument("--crop", type=_int_at_least(SIZE_MULTIPLE), default=256,
                   help=f"training crop size, rounded down to a multiple of {SIZE_MULTIPLE} (default 256)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adamax's learning rate (default 1e-3)")
    p.add_argument("--no-augment", action="store_true",
                   help="centre crops in file order: no random crops, flips, time reversal or shuffling")
    p.add_argument("--amp", action="store_true", help="mixed precision (float16 + GradScaler on CUDA, bfloat16 on CPU)")
    p.add_argument("--workers", type=_int_at_least(0), default=default_workers(),
                   help="data-loading processes per training process; default: the usable cores (divided among "
                        f"torchrun's processes on this host), at most {MAX_DEFAULT_WORKERS}; here "
                        f"{default_workers()}")
    p.add_argument("--device", default=None,
                   help="default: this process's GPU under torchrun, else cuda if available, else cpu")
    p.add_argument("--resume", default=None, metavar="CHECKPOINT", help="checkpoint to continue from")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the initial weights, the augmentation and the shuffling (default 0; for the "
                        "augmentation and shuffling each torchrun process adds its rank)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def setup_distributed(device_arg: Optional[str]):
    """(rank, world size, device); initialises the process group under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)  # NCCL's default device for this process
            dist.init_process_group("nccl", device_id=device)
        else:
            device = torch.device("cpu")
            dist.init_process_group("gloo")
        return rank, world, device
    device = torch.device(device_arg or ("cuda" if torch.cuda.is_available() else "cpu"))
    return 0, 1, device


def make_out_dir(out: str) -> Path:
    """--out, created if missing, and checked to be writable (before any training time is spent)."""
    out_dir = Path(out)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--out {out}: exists and is not a folder")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"--out {out}: cannot create it ({e.strerror or e})") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise InputError(f"--out {out}: not writable")
    return out_dir


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def load_resume_checkpoint(path: str, model: EDSC, optimizer: torch.optim.Optimizer):
    """Loads --resume into model and optimizer; returns the checkpoint's (epoch, step)."""
    file = Path(path)
    if not file.exists():
        raise InputError(f"--resume {path}: no such file")
    if not file.is_file():
        raise InputError(f"--resume {path}: not a file")
    try:
        with warnings.catch_warnings():  # e.g. on the pickle protocol of a file that is no checkpoint anyway
            warnings.simplefilter("ignore")
            checkpoint = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights only" in str(e).lower():
            raise InputError(f"--resume {path}: not a checkpoint: it holds pickled objects other than tensors and "
                             "plain containers, which torch.load(weights_only=True) refuses") from None
        raise InputError(f"--resume {path}: not a checkpoint (torch.load cannot read it: {_first_line(e)})") from None
    except Exception as e:  # torch.load's errors depend on what the file holds (text, a truncated zip, ...)
        raise InputError(f"--resume {path}: not a checkpoint (torch.load cannot read it: {_first_line(e)})") from None
    if not isinstance(checkpoint, dict):
        raise InputError(f"--resume {path}: not a checkpoint: it holds a {type(checkpoint).__name__}, not a dict")
    try:
        load_checkpoint(checkpoint, model)
        if "optimizer_state" in checkpoint:
            optimizer.load_state_dict(checkpoint["optimizer_state"])
    except (TypeError, ValueError, RuntimeError, KeyError) as e:
        wanted = f"--model {model.name} --kernel-size {model.kernel_size}"
        try:  # an EDSC checkpoint of another variant: say which
            found = load_checkpoint(checkpoint)
            reason = f"it holds --model {found.name} --kernel-size {found.kernel_size}"
        except (TypeError, ValueError, RuntimeError, KeyError):
            reason = _first_line(e)
        raise InputError(f"--resume {path}: not a checkpoint for {wanted} ({reason})") from None
    return checkpoint.get("epoch", 0), checkpoint.get("step", 0)


def _open_data(flag: str, root: str, crop: int, augment: bool, multiple: bool) -> FrameTuples:
    try:
        return FrameTuples(root, crop, augment=augment, multiple=multiple)
    except InputError as e:
        raise InputError(f"{flag} {e}") from None


def save_atomically(model: EDSC, path: Path, **extra) -> None:
    # A crash while writing leaves at most the temporary file, never a truncated checkpoint at `path`.
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_checkpoint(model, temporary, **extra)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


@torch.no_grad()
def mean_l1_loss(model: EDSC, loader: DataLoader, device: torch.device, multiple: bool, autocast) -> float:
    """The mean L1 loss per sample of model over loader, in eval mode."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for first, target, second, t in loader:
        first, target, second = (x.to(device, non_blocking=True) for x in (first, target, second))
        with autocast():
            output = model(first, second, t.to(device) if multiple else None)
        total += F.l1_loss(output.float(), target, reduction="sum").item() / target[0].numel()
        count += target.shape[0]
    model.train(was_training)
    return total / count


def main(argv: Optional[Sequence[str]] = None) -> List[float]:
    """Trains; returns the per-step training losses of this process. Bad input: one line on stderr and
    SystemExit(2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    multiple = args.model == "EDSC_m"
    # Every process checks its input before the process group starts, so that all of them stop alike;
    # --out last, so that bad input leaves no empty folder behind.
    try:
        dataset = _open_data("--data", args.data, args.crop, augment=not args.no_augment, multiple=multiple)
        val_set = _open_data("--val", args.val, args.crop, augment=False, multiple=multiple) if args.val else None
        # --seed decides the initial weights too (the same on every rank; DDP broadcasts rank 0's anyway).
        torch.manual_seed(args.seed)
        model = EDSC(kernel_size=args.kernel_size, multiple=multiple, sampling=args.sampling)
        optimizer = torch.optim.Adamax(model.parameters(), lr=args.lr)
        start_epoch, step = load_resume_checkpoint(args.resume, model, optimizer) if args.resume else (0, 0)
        out_dir = make_out_dir(args.out)
    except InputError as e:  # the problem in one line, without the usage that parser.error adds
        parser.exit(2, f"{parser.prog}: error: {e}\n")

    rank, world, device = setup_distributed(args.device)
    torch.manual_seed(args.seed + rank)
    random.seed(args.seed + rank)
    model.to(device)
    for state in optimizer.state.values():  # optimizer state follows the parameters' device
        for key, value in state.items():
            if torch.is_tensor(value) and key != "step":
                state[key] = value.to(device)
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)

    sampler = torch.utils.data.distributed.DistributedSampler(dataset, seed=args.seed) if world > 1 else None
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=sampler is None and not args.no_augment,
                        sampler=sampler, num_workers=args.workers, pin_memory=device.type == "cuda",
                        drop_last=len(dataset) >= args.batch_size * world, persistent_workers=args.workers > 0)
    val_loader = None
    if val_set is not None and rank == 0:
        val_loader = DataLoader(val_set, batch_size=args.batch_size, num_workers=args.workers,
                                pin_memory=device.type == "cuda", persistent_workers=args.workers > 0)

    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp and amp_dtype == torch.float16)

    def autocast():
        return torch.autocast(device.type, dtype=amp_dtype) if args.amp else nullcontext()

    def forward(first, second, t):
        # Autocast inside what --compile compiles: the dtype is then part of the compiled graph.
        with autocast():
            return net(first, second, t)

    if args.compile:
        forward = torch.compile(forward)

    # --steps counts all steps, the resumed ones included; --epochs runs whole epochs from the checkpoint's.
    total_steps = args.steps if args.steps is not None else step + max(0, args.epochs - start_epoch) * len(loader)
    best_by = f"lowest mean L1 loss on --val {args.val}" if val_set is not None \
        else "lowest mean training loss of an epoch"
    if rank == 0:
        print(f"train.py: checkpoints go to {out_dir / 'model_last.pth'} (after every epoch and at the end) and "
              f"{out_dir / 'model_best.pth'} ({best_by})", flush=True)
    if step >= total_steps:
        if rank == 0:
            print(f"train.py: nothing to do: {args.resume} is at step {step}, epoch {start_epoch}", flush=True)
        if world > 1:
            dist.destroy_process_group()
        return []
    saved_args = {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool)) or v is None}
    best_loss = math.inf
    best_path = out_dir / "model_best.pth"
    if args.resume and val_loader is not None and best_path.is_file():
        # Resuming into the same --out: the earlier best is replaced only by a better one.
        try:
            earlier_best = load_checkpoint(best_path, sampling=args.sampling).to(device)
        except Exception:  # unreadable or another model's: it is simply replaced
            earlier_best = None
        if earlier_best is not None and earlier_best.multiple == multiple:
            best_loss = mean_l1_loss(earlier_best, val_loader, device, multiple, autocast)

    def save_checkpoints(epoch: int, segment_losses: List[float]) -> None:
        """model_last.pth, and model_best.pth when this epoch (or the run's last, partial one) scores best."""
        nonlocal best_loss
        loss_sum, loss_count = sum(segment_losses), len(segment_losses)
        if world > 1:  # the training loss of all processes
            totals = torch.tensor([loss_sum, loss_count], dtype=torch.float64, device=device)
            dist.all_reduce(totals)
            loss_sum, loss_count = totals.tolist()
        if rank != 0:
            return
        extra = dict(epoch=epoch, step=step, optimizer_state=optimizer.state_dict(), args=saved_args)
        save_atomically(model, out_dir / "model_last.pth", **extra)
        # Only rank 0 scores --val; the others wait for it in the next step's gradient all-reduce.
        score = mean_l1_loss(model, val_loader, device, multiple, autocast) if val_loader is not None \
            else loss_sum / loss_count
        if score < best_loss:
            best_loss = score
            save_atomically(model, best_path, **extra)

    losses: List[float] = []
    net.train()
    bar = progress(total=total_steps - step, desc=f"train from step {step}" if step else "train", unit="step",
                   disable=args.quiet or rank != 0)
    epoch = start_epoch
    try:
        while step < total_steps:
            if sampler is not None:
                sampler.set_epoch(epoch)
            epoch_label = f"{epoch + 1}/{args.epochs}" if args.steps is None else f"{epoch + 1}"
            epoch_losses: List[float] = []
            for first, target, second, t in loader:
                first, target, second = (x.to(device, non_blocking=True) for x in (first, target, second))
                output = forward(first, second, t.to(device) if multiple else None)
                loss = F.l1_loss(output.float(), target)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                step += 1
                epoch_losses.append(loss.item())
                bar.set_postfix_str(f"epoch {epoch_label} loss {epoch_losses[-1]:.4f}", refresh=False)
                bar.update(1)  # after the postfix, so that the last step shows with its loss
                if step >= total_steps:
                    break
            epoch += 1  # counts epochs begun, so a resumed run starts a fresh one
            losses += epoch_losses
            save_checkpoints(epoch, epoch_losses)
    finally:
        bar.close()
    if world > 1:
        dist.destroy_process_group()
    return losses


if __name__ == "__main__":
    main()
    sys.exit(0)
