"""`python -m edsc_ext`: versions, build facts, and a self-check of the op on every device.

Exit code 0 when every device passes, 1 otherwise.
"""

import platform
import sys

import torch

import edsc_ext
from edsc_ext import _build_support, reference

# ||out - ref|| / ||ref|| accepted per dtype (the half types accumulate in float32).
SELF_CHECK_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def self_check(device: torch.device, dtype: torch.dtype) -> float:
    """Worst relative error of forward and all five gradients against the float64 reference."""
    gen = torch.Generator().manual_seed(1234)
    n, c, h, w, k, pad = 2, 3, 13, 17, 5, 2
    shapes = [(n, c, h, w), (n, k, h, w), (n, k, h, w), (n, 2 * k * k, h, w), (n, k * k, h, w)]
    base = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    base[3] = base[3] * 2.5  # offsets that reach past the border
    base[4] = base[4].sigmoid()
    grad_out = torch.randn(n, c, h, w, generator=gen, dtype=torch.float64)
    worst = 0.0
    for mode in ("zeros", "border"):
        kwargs = dict(padding=pad, padding_mode=mode)
        ours = [t.to(device=device, dtype=dtype).requires_grad_() for t in base]
        out = edsc_ext.deform_sepconv(*ours, **kwargs)
        grads = torch.autograd.grad(out, ours, grad_out.to(device=device, dtype=dtype))
        # The reference sees the same (rounded) inputs, in float64.
        refs = [t.detach().double().cpu().requires_grad_() for t in ours]
        ref_out = reference.deform_sepconv(*refs, **kwargs)
        ref_grads = torch.autograd.grad(ref_out, refs, grad_out)
        for a, b in zip((out, *grads), (ref_out, *ref_grads)):
            worst = max(worst, _relative_error(a, b))
    return worst


def arch_warnings(info: dict) -> list:
    """One line per visible GPU that this build has neither machine code (SASS) nor PTX for."""
    lines = []
    if not torch.cuda.is_available() or not info["with_cuda"]:
        return lines
    for i in range(torch.cuda.device_count()):
        cap = torch.cuda.get_device_capability(i)
        if not _build_support.arch_runs_on(info["cuda_sass_archs"], info["cuda_ptx_archs"], cap):
            lines.append(
                f"warning: cuda:{i} ({torch.cuda.get_device_name(i)}, compute capability {cap[0]}.{cap[1]}) has no "
                f"kernels in this build (SASS sm {','.join(info['cuda_sass_archs']) or '-'}, PTX "
                f"{','.join(info['cuda_ptx_archs']) or '-'}): rebuild with TORCH_CUDA_ARCH_LIST=\"{cap[0]}.{cap[1]}\" "
                f"(pip install --no-build-isolation ., or EDSC_EXT_JIT=1), or install a wheel built for a newer CUDA")
    return lines


def main() -> int:
    info = edsc_ext.build_info()
    print(f"edsc_ext {edsc_ext.__version__}")
    print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda})")
    print("built with: torch {torch_version}, CUDA {cuda_version}, kernels for sm {sass}, PTX {ptx} (build: {build})".format(
        torch_version=info.get("torch_version"), cuda_version=info["cuda_version"] if info["with_cuda"] else "none",
        sass=",".join(info["cuda_sass_archs"]) or "-", ptx=",".join(info["cuda_ptx_archs"]) or "-",
        build=info.get("build", "?")))
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        if not info["with_cuda"]:
            print("warning: GPUs are visible but this build has no CUDA kernels; rebuild with a CUDA toolkit")
        else:
            devices += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    for line in arch_warnings(info):
        print(line)
    failed = False
    for device in devices:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
        for dtype, tol in SELF_CHECK_TOLERANCE.items():
            try:
                err = self_check(device, dtype)
                ok = err <= tol
                detail = f"max rel. error {err:.2e} (tolerance {tol:.0e})"
            except Exception as exc:  # report and keep checking the other devices
                ok, detail = False, f"{type(exc).__name__}: {exc}"
            failed |= not ok
            print(f"  {'ok  ' if ok else 'FAIL'} {str(device):8s} {str(dtype).replace('torch.', ''):9s} {detail}"
                  f"  [{name}]")
    print("self-check " + ("FAILED" if failed else "passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
