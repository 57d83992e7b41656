"""A small network that uses edsc_ext, trained with DistributedDataParallel on synthetic data.

The task is warping: each target is its frame shifted by a known sub-pixel flow, and the network
(two convolutions predicting per-pixel separable kernels, offsets and a mask, then
``edsc_ext.nn.DeformSepConv2d``) learns to produce it. The data is deterministic: the batch of step
``s`` on rank ``r`` depends only on ``(--seed, s, r)``, so a run can be reproduced, and compared.

Two GPUs (NCCL; one process per GPU, each on cuda:LOCAL_RANK)::

    torchrun --standalone --nproc_per_node=2 examples/ddp_train.py --steps 30

Two CPU processes (gloo)::

    torchrun --standalone --nproc_per_node=2 examples/ddp_train.py --device cpu --steps 30

Rank 0 prints the loss of every step (averaged over the ranks, i.e. the loss of the whole global
batch) and whether it fell; the exit code is 1 when it did not.

Checking DDP's gradients: ``--check-grads PATH`` saves rank 0's parameter gradients of the first
step (after DDP averaged them over the ranks) to PATH (``torch.save``, float64 on the CPU; training
then continues for ``--steps``, so ``--steps 1`` stops there). ``--single-process`` runs the same
training in one process on the concatenated batches of ``--world-size`` ranks; since the loss is
a mean, its gradients must equal DDP's::

    torchrun --standalone --nproc_per_node=2 examples/ddp_train.py --dtype float64 --steps 1 --check-grads ddp.pt
    python examples/ddp_train.py --single-process --world-size 2 --dtype float64 --steps 1 --check-grads one.pt
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from datetime import timedelta
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import edsc_ext

DTYPES = {"float32": torch.float32, "float64": torch.float64}


class WarpNet(nn.Module):
    """Predicts, from the frame, per-pixel vertical and horizontal kernels (softmax over the taps),
    per-tap offsets and a mask, and applies them to the frame with ``DeformSepConv2d``."""

    def __init__(self, kernel_size: int = 3, hidden: int = 16):
        super().__init__()
        k = kernel_size
        self.kernel_size = k
        self.features = nn.Sequential(
            nn.Conv2d(3, hidden, 3, padding=1), nn.ReLU(),
            nn.Conv2d(hidden, hidden, 3, padding=1), nn.ReLU(),
        )
        self.vertical = nn.Conv2d(hidden, k, 3, padding=1)
        self.horizontal = nn.Conv2d(hidden, k, 3, padding=1)
        self.offset = nn.Conv2d(hidden, 2 * k * k, 3, padding=1)
        self.mask = nn.Conv2d(hidden, k * k, 3, padding=1)
        self.adaptive = edsc_ext.nn.DeformSepConv2d(padding=k // 2, padding_mode="border")

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        f = self.features(frame)
        vertical = torch.softmax(self.vertical(f), dim=1)
        horizontal = torch.softmax(self.horizontal(f), dim=1)
        offset = self.offset(f)
        mask = 2 * torch.sigmoid(self.mask(f))
        return self.adaptive(frame, vertical, horizontal, offset, mask)


def shift(frame: torch.Tensor, dy: float, dx: float) -> torch.Tensor:
    """target[y, x] = frame sampled bilinearly at (y + dy, x + dx), replicate padding."""
    n, _, h, w = frame.shape
    ys = torch.arange(h, dtype=frame.dtype) + dy
    xs = torch.arange(w, dtype=frame.dtype) + dx
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    grid = torch.stack([2 * gx / max(w - 1, 1) - 1, 2 * gy / max(h - 1, 1) - 1], dim=-1)
    grid = grid.unsqueeze(0).expand(n, h, w, 2)
    return F.grid_sample(frame, grid, mode="bilinear", padding_mode="border", align_corners=True)


def make_batch(seed: int, step: int, rank: int, batch: int, size: int, flow: Tuple[float, float]):
    """(frames, targets) of one rank at one step, float64 on the CPU: smooth random images (bilinear
    upsampling of coarse noise) and the same images shifted by ``flow``."""
    g = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1_009 + rank) % (2**63))
    coarse = torch.rand(batch, 3, size // 4 + 1, size // 4 + 1, generator=g, dtype=torch.float64)
    frames = F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=True)
    return frames, shift(frames, *flow)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Train a tiny warping network that uses edsc_ext, with DDP.")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None,
                   help="cuda (cuda:LOCAL_RANK, backend nccl) or cpu (backend gloo); default: cuda if available")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=4, help="per rank")
    p.add_argument("--size", type=int, default=32, help="image height and width")
    p.add_argument("--kernel-size", type=int, default=3)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--flow", type=float, nargs=2, default=(0.4, -0.7), metavar=("DY", "DX"),
                   help="the known sub-pixel shift of the targets")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--check-grads", metavar="PATH", default=None,
                   help="save rank 0's parameter gradients of the first step to PATH")
    p.add_argument("--single-process", action="store_true",
                   help="one process, on the concatenated batches of --world-size ranks")
    p.add_argument("--world-size", type=int, default=2, help="ranks emulated by --single-process")
    p.add_argument("--result", metavar="PATH", default=None, help="write rank 0's summary (JSON) to PATH")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a collective gives up")
    return p


def setup(args) -> Tuple[int, int, torch.device, bool]:
    """(rank, world size, device, distributed); initialises the process group under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.single_process and world > 1:
        raise SystemExit("--single-process runs in one process: start it with python, not torchrun")
    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda, but CUDA is not available (use --device cpu)")
        if local_rank >= torch.cuda.device_count():
            raise SystemExit(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPU(s) are visible")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)  # NCCL's device for this process
    else:
        device = torch.device("cpu")
    distributed = world > 1
    if distributed:
        timeout = timedelta(seconds=args.timeout)
        if device.type == "cuda":
            dist.init_process_group("nccl", timeout=timeout, device_id=device)
        else:
            dist.init_process_group("gloo", timeout=timeout)
        assert dist.get_world_size() == world and dist.get_rank() == rank, "torchrun's environment disagrees"
    return rank, world, device, distributed


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.size < 4 or args.world_size < 1:
        raise SystemExit("--steps, --batch-size, --world-size must be >= 1 and --size >= 4")
    rank, world, device, distributed = setup(args)
    dtype = DTYPES[args.dtype]
    # In single-process mode, this process does the work of ranks 0..world_size-1 at once.
    ranks = list(range(args.world_size)) if args.single_process else [rank]

    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = WarpNet(args.kernel_size, args.hidden).to(device=device, dtype=dtype)
    net: nn.Module = model
    if distributed:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    log = print if rank == 0 else (lambda *a, **k: None)
    mode = "single" if args.single_process else ("ddp" if distributed else "plain")
    log(f"ddp_train: mode={mode} world_size={world} device={device} dtype={args.dtype} "
        f"backend={dist.get_backend() if distributed else None} edsc_ext={edsc_ext.__version__}", flush=True)

    losses: List[float] = []
    for step in range(args.steps):
        batches = [make_batch(args.seed, step, r, args.batch_size, args.size, tuple(args.flow)) for r in ranks]
        frames = torch.cat([b[0] for b in batches]).to(device=device, dtype=dtype)
        targets = torch.cat([b[1] for b in batches]).to(device=device, dtype=dtype)

        optimizer.zero_grad(set_to_none=True)
        output = net(frames)
        loss = F.mse_loss(output, targets)  # a mean: DDP's averaging over ranks = the mean of the global batch
        loss.backward()

        global_loss = loss.detach().clone()
        if distributed:
            dist.all_reduce(global_loss)
            global_loss /= world
        losses.append(global_loss.item())
        if step == 0 and args.check_grads and rank == 0:
            grads = {}
            for name, p in model.named_parameters():
                assert p.grad is not None, f"parameter {name} got no gradient"
                grads[name] = p.grad.detach().to("cpu", torch.float64).clone()
            torch.save({"grads": grads, "loss": losses[0], "mode": mode, "world_size": world,
                        "batch": len(ranks) * args.batch_size, "dtype": args.dtype, "device": str(device)},
                       args.check_grads)
            log(f"saved the first step's gradients to {args.check_grads}", flush=True)
        optimizer.step()
        log(f"step {step + 1:3d}/{args.steps}  loss {losses[-1]:.6e}", flush=True)

    fell = len(losses) >= 2 and losses[-1] < losses[0]
    summary = {"mode": mode, "world_size": world, "device": str(device), "dtype": args.dtype,
               "steps": args.steps, "losses": losses, "first_loss": losses[0], "final_loss": losses[-1],
               "loss_fell": fell}
    if rank == 0:
        if len(losses) >= 2:
            print(f"loss {'fell' if fell else 'did NOT fall'}: {losses[0]:.6e} -> {losses[-1]:.6e}", flush=True)
        print("RESULT " + json.dumps(summary), flush=True)
        if args.result:
            with open(args.result, "w") as f:
                json.dump(summary, f)
    if distributed:
        # DDP's reducer holds the process group: release it first, so that destroy_process_group
        # drops the group's last reference and its worker threads end here, while the interpreter
        # is whole, rather than at exit (a gloo rank once aborted there, in CI, after its last step).
        del net
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
    # Every rank has the same (all-reduced) losses, so every rank takes the same exit code.
    if len(losses) >= 2 and not fell:
        print(f"rank {rank}: the loss did not fall", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
