"""One forward+backward at a benchmark shape (K=5, border padding), for ncu.

    ncu --clock-control none --launch-skip 2 -k regex:deform_sepconv python3 tools/profile_case.py \
        [float32|bfloat16|float16] [--case train|feat|adacof] [--channels-last] [--policy KEY=VALUE ...]
"""
import argparse

import torch

import edsc_ext
from edsc_ext.benchmarks.op import _parse_policy  # the benchmark's --policy, the same keywords and checks

# N, C, H, W, dilation of the benchmark's cases (edsc_ext/benchmarks/op.py).
CASES = {"train": (16, 3, 256, 256, 1), "feat": (4, 32, 256, 256, 1), "adacof": (8, 3, 256, 256, 2)}

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("dtype", nargs="?", default="float32", choices=["float32", "bfloat16", "float16", "float64"])
parser.add_argument("--case", default="train", choices=sorted(CASES))
parser.add_argument("--channels-last", action="store_true", help="every 4-D tensor in channels_last")
parser.add_argument("--policy", nargs="*", default=[], metavar="KEY=VALUE",
                    help="edsc_ext.kernel_policy keywords, e.g. vector_loads=false (booleans: true/false)")
args = parser.parse_args()
policy = _parse_policy(parser, args.policy)

dtype = getattr(torch, args.dtype)
n, c, h, w, dil = CASES[args.case]
k = 5
device = torch.device("cuda")
frame = torch.rand(n, c, h, w, device=device, dtype=dtype)
vertical = torch.rand(n, k, h, w, device=device, dtype=dtype)
horizontal = torch.rand(n, k, h, w, device=device, dtype=dtype)
offset = (torch.randn(n, 2 * k * k, h, w, device=device) * 1.5).to(dtype)
mask = torch.rand(n, k * k, h, w, device=device, dtype=dtype)
tensors = [frame, vertical, horizontal, offset, mask]
if args.channels_last:
    tensors = [t.contiguous(memory_format=torch.channels_last) for t in tensors]
tensors = [t.requires_grad_() for t in tensors]
with edsc_ext.kernel_policy(**policy):
    for _ in range(2):  # the first pass is warm-up; ncu --launch-skip skips its kernels
        out = edsc_ext.deform_sepconv(*tensors, padding=2 * dil, dilation=dil, padding_mode="border")
        torch.autograd.grad(out, tensors, torch.ones_like(out))
torch.cuda.synchronize()
