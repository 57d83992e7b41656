"""One forward+backward at the benchmark's `train` shape (16x3x256x256, K=5, border), for ncu.

    ncu --clock-control none --launch-skip 2 -k regex:deform_sepconv python3 tools/profile_case.py
"""
import sys

import torch

import edsc_ext

dtype = getattr(torch, sys.argv[1]) if len(sys.argv) > 1 else torch.float32
n, c, h, w, k = 16, 3, 256, 256, 5
device = torch.device("cuda")
frame = torch.rand(n, c, h, w, device=device, dtype=dtype)
vertical = torch.rand(n, k, h, w, device=device, dtype=dtype)
horizontal = torch.rand(n, k, h, w, device=device, dtype=dtype)
offset = (torch.randn(n, 2 * k * k, h, w, device=device) * 1.5).to(dtype)
mask = torch.rand(n, k * k, h, w, device=device, dtype=dtype)
tensors = [t.requires_grad_() for t in (frame, vertical, horizontal, offset, mask)]
for _ in range(2):  # the first pass is warm-up; ncu --launch-skip skips its kernels
    out = edsc_ext.deform_sepconv(*tensors, padding=2, padding_mode="border")
    torch.autograd.grad(out, tensors, torch.ones_like(out))
torch.cuda.synchronize()
