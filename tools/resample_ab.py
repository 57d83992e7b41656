"""The networks' 2x resampling ops against ATen's in one process, at the shapes EDSC_s runs them at 1080p or 4K,
channels_last, with the memory floor (the bytes read and written at the copy bandwidth measured in the same run)
and the whole network's sum (issue #43): ``--op upsample``, edsc_ext.upsample_bilinear2x against F.interpolate
(bilinear 2x, corners aligned; the U-Net's four, the heads' eleven as the padded layout runs them); ``--op pool``,
edsc_ext.avg_pool2x against F.avg_pool2d(x, 2) (the U-Net's five).

    python3 tools/resample_ab.py [--op upsample|pool] [--size 1088x1920] [--dtype float16] [--reps 50] [--json PATH]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

import edsc_ext
from edsc_ext.benchmarks import harness
from edsc_ext.benchmarks.op import measure_copy_bandwidth

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def network_shapes(height: int, width: int):
    """(count, (C, H, W) of the input) of EDSC_s's upsamplings: the decoder's 512/256/128/64-channel ones at
    1/32 to 1/4 of the frame, the heads' (padded layout) from half resolution: four kernel heads and the bias
    head of 8 channels, six offset and mask heads of 32."""
    return [(1, (512, height // 32, width // 32)), (1, (256, height // 16, width // 16)),
            (1, (128, height // 8, width // 8)), (1, (64, height // 4, width // 4)),
            (5, (8, height // 2, width // 2)), (6, (32, height // 2, width // 2))]


def pool_shapes(height: int, width: int):
    """(count, (C, H, W) of the input) of EDSC_s's average poolings: the U-Net's encoder, 32 channels at the frame's
    size to 512 at 1/16 of it."""
    return [(1, (32 << i, height >> i, width >> i)) for i in range(5)]


# op: (ours, ATen's, the network's calls, the floor's bytes in units of the input's)
OPS = {
    "upsample": (edsc_ext.upsample_bilinear2x,
                 lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True), network_shapes, 5),
    "pool": (edsc_ext.avg_pool2x, lambda x: F.avg_pool2d(x, 2), pool_shapes, 1.25),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", default="upsample", choices=list(OPS))
    parser.add_argument("--size", default="1088x1920", help="the frame, HxW (default %(default)s)")
    parser.add_argument("--dtype", default="float16", choices=list(DTYPES))
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--json", default=None, metavar="PATH")
    args = parser.parse_args()
    device = torch.device("cuda")
    dtype = DTYPES[args.dtype]
    height, width = (int(v) for v in args.size.split("x"))
    ours, atens, shapes, floor_units = OPS[args.op]
    bandwidth = measure_copy_bandwidth(device)["gbps"]
    print(f"{harness.device_description(device)}, torch {torch.__version__}, {args.op}, {args.dtype}, "
          f"frame {height}x{width}, "
          f"copy bandwidth {bandwidth:.0f} GB/s")
    print("| input (C, H, W) | calls | floor ms | aten ms | edsc_ext ms | aten / floor | edsc_ext / floor | "
          "edsc_ext / aten | max diff |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows, totals = [], {"floor": 0.0, "aten": 0.0, "edsc_ext": 0.0}
    for count, (c, h, w) in shapes(height, width):
        x = torch.randn(1, c, h, w, device=device).to(dtype).contiguous(memory_format=torch.channels_last)
        ms = {"aten": [], "edsc_ext": []}
        for _ in range(3):  # interleaved rounds: drift hits both alike
            ms["aten"] += harness.time_calls(lambda x=x: atens(x), device, 3, args.reps)
            ms["edsc_ext"] += harness.time_calls(lambda x=x: ours(x), device, 3, args.reps)
        med = {k: statistics.median(v) for k, v in ms.items()}
        # The input read once, the output written once.
        floor = floor_units * x.numel() * x.element_size() / (bandwidth * 1e6)
        diff = (ours(x).float() - atens(x).float()).abs().max().item()
        for key, value in (("floor", floor), *med.items()):
            totals[key] += count * value
        rows.append({"shape": [c, h, w], "calls": count, "floor_ms": floor, **{f"{k}_ms": v for k, v in med.items()},
                     "max_diff": diff})
        print(f"| ({c}, {h}, {w}) | {count} | {floor:.4f} | {med['aten']:.4f} | {med['edsc_ext']:.4f} | "
              f"{med['aten'] / floor:.2f} | {med['edsc_ext'] / floor:.2f} | {med['edsc_ext'] / med['aten']:.3f} | "
              f"{diff:.3g} |")
    calls = sum(count for count, _ in shapes(height, width))
    print(f"| all (network) | {calls} | {totals['floor']:.3f} | {totals['aten']:.3f} | {totals['edsc_ext']:.3f} | "
          f"{totals['aten'] / totals['floor']:.2f} | {totals['edsc_ext'] / totals['floor']:.2f} | "
          f"{totals['edsc_ext'] / totals['aten']:.3f} | |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": harness.device_description(device), "op": args.op, "dtype": args.dtype,
                       "size": args.size, "copy_gbps": bandwidth, "rows": rows, "totals_ms": totals}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
