"""Train EDSC with edsc_ext on frame triplets (Vimeo-90k layout), checkpoints in the original format.

Single process (GPU if there is one, else CPU)::

    python examples/train.py --data /data/vimeo_triplet --out runs/edsc_s --epochs 20 --amp

Several GPUs of one host (DistributedDataParallel, one process per GPU)::

    torchrun --nproc_per_node=4 examples/train.py --data /data/vimeo_triplet --out runs/edsc_s --amp

EDSC_m (any time t) on Vimeo-90k septuplets: ``--model EDSC_m --data /data/vimeo_septuplet``.

Data: a folder with ``tri_trainlist.txt`` (or ``sep_trainlist.txt``) and ``sequences/<id>/im1.png...``
as Vimeo-90k ships it, or any tree whose leaf folders hold ``im1.png, im2.png, im3.png`` (or the
Middlebury names ``frame10.png, frame10i11.png, frame11.png``). Frames are fed in BGR like the
original (which reads them with OpenCV), so checkpoints are interchangeable with the released ones:
``{'model_state': state_dict, 'epoch', 'step', 'optimizer_state', 'args'}`` in ``OUT/model_last.pth``
(and ``model_epochN.pth``), loadable by ``edsc_ext.models.load_checkpoint``, ``edsc-interpolate`` and
the original code. ``--resume`` continues from one.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from edsc_ext import _image
from edsc_ext.interpolate import progress
from edsc_ext.models import EDSC, MODEL_NAMES, SAMPLINGS, load_checkpoint, save_checkpoint

TRIPLET_NAMES = (("im1.png", "im2.png", "im3.png"), ("frame10.png", "frame10i11.png", "frame11.png"))


class FrameTuples(Dataset):
    """(first, target, second, t) samples from Vimeo-90k-style folders, frames (3, crop, crop) BGR
    in [0, 1]. Augmentation: random crop, flips, and time reversal (first <-> second, t -> 1-t)."""

    def __init__(self, root, crop: int = 256, augment: bool = True, multiple: bool = False):
        self.root, self.crop, self.augment = Path(root), crop, augment
        self.samples = self._find(multiple)
        if not self.samples:
            raise FileNotFoundError(f"no training samples in {root}: expected tri_trainlist.txt / sep_trainlist.txt "
                                    "with sequences/, or folders holding im1.png, im2.png, im3.png")

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
                return samples
        for folder in sorted({p.parent for p in self.root.rglob("*.png")}):
            for first, middle, second in TRIPLET_NAMES:
                if all((folder / f).is_file() for f in (first, middle, second)):
                    samples.append((folder / first, folder / middle, folder / second, 0.5))
                    break
        return samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        first, target, second, t = self.samples[index]
        frames = torch.stack([_image.read_image(p).flip(0) for p in (first, target, second)])  # RGB -> BGR
        h, w = frames.shape[2:]
        crop_h, crop_w = min(self.crop, h) // 32 * 32, min(self.crop, w) // 32 * 32
        if crop_h == 0 or crop_w == 0:
            raise ValueError(f"{first}: frames of {h}x{w} are smaller than 32 pixels")
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Train EDSC on frame triplets with edsc_ext.")
    p.add_argument("--data", required=True, help="training data root (Vimeo-90k layout or triplet folders)")
    p.add_argument("--out", required=True, help="checkpoint folder")
    p.add_argument("--model", choices=MODEL_NAMES, default="EDSC_s")
    p.add_argument("--sampling", choices=SAMPLINGS, default="compat",
                   help="'compat' keeps checkpoints interchangeable with the original code (default)")
    p.add_argument("--kernel-size", type=int, default=5)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--batch-size", type=int, default=8, help="per process")
    p.add_argument("--crop", type=int, default=256, help="training crop size (rounded down to a multiple of 32)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--no-augment", action="store_true")
    p.add_argument("--amp", action="store_true", help="mixed precision (float16 + GradScaler on CUDA, bfloat16 on CPU)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--device", default=None, help="default: this process's GPU under torchrun, cuda, or cpu")
    p.add_argument("--resume", default=None, help="checkpoint to continue from")
    p.add_argument("--seed", type=int, default=0)
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


def main(argv: Optional[Sequence[str]] = None) -> List[float]:
    """Trains; returns the per-step training losses of this process."""
    args = build_parser().parse_args(argv)
    rank, world, device = setup_distributed(args.device)
    torch.manual_seed(args.seed + rank)
    random.seed(args.seed + rank)

    multiple = args.model == "EDSC_m"
    model = EDSC(kernel_size=args.kernel_size, multiple=multiple, sampling=args.sampling)
    optimizer = torch.optim.Adamax(model.parameters(), lr=args.lr)
    start_epoch, step = 0, 0
    if args.resume:
        checkpoint = torch.load(args.resume, map_location="cpu", weights_only=True)
        load_checkpoint(checkpoint, model)
        if "optimizer_state" in checkpoint:
            optimizer.load_state_dict(checkpoint["optimizer_state"])
        start_epoch, step = checkpoint.get("epoch", 0), checkpoint.get("step", 0)
    model.to(device)
    for state in optimizer.state.values():  # optimizer state follows the parameters' device
        for key, value in state.items():
            if torch.is_tensor(value) and key != "step":
                state[key] = value.to(device)
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    if args.compile:
        net = torch.compile(net)

    dataset = FrameTuples(args.data, args.crop, augment=not args.no_augment, multiple=multiple)
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, seed=args.seed) if world > 1 else None
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=sampler is None and not args.no_augment,
                        sampler=sampler, num_workers=args.workers, pin_memory=device.type == "cuda",
                        drop_last=len(dataset) >= args.batch_size * world, persistent_workers=args.workers > 0)

    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp and amp_dtype == torch.float16)
    out_dir = Path(args.out)
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
    saved_args = {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool)) or v is None}

    def save(name, epoch):
        if rank == 0:
            save_checkpoint(model, out_dir / name, epoch=epoch, step=step, optimizer_state=optimizer.state_dict(),
                            args=saved_args)

    losses: List[float] = []
    net.train()
    for epoch in range(start_epoch, args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        bar = progress(loader, desc=f"epoch {epoch + 1}/{args.epochs}", unit="batch",
                       disable=args.quiet or rank != 0)
        for first, target, second, t in bar:
            first, target, second = (x.to(device, non_blocking=True) for x in (first, target, second))
            autocast = torch.autocast(device.type, dtype=amp_dtype) if args.amp else nullcontext()
            with autocast:
                output = net(first, second, t.to(device) if multiple else None)
            loss = F.l1_loss(output.float(), target)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            step += 1
            losses.append(loss.item())
            if hasattr(bar, "set_postfix_str"):
                bar.set_postfix_str(f"loss {losses[-1]:.4f}")
            if args.steps is not None and step >= args.steps:
                break
        if hasattr(bar, "close"):
            bar.close()
        save("model_last.pth", epoch + 1)
        if args.steps is not None and step >= args.steps:
            break
        save(f"model_epoch{epoch + 1}.pth", epoch + 1)
    if world > 1:
        dist.destroy_process_group()
    return losses


if __name__ == "__main__":
    main()
    sys.exit(0)
