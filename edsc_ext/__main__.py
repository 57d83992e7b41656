"""`python -m edsc_ext`: versions, build facts, GPU architecture check, and a self-check of the op.

Run ``python -m edsc_ext --help`` for the options. Exit code 0 when every check passes, 1 when one
fails, 2 for bad arguments.
"""

import argparse
import json
import platform
import sys

import torch

import edsc_ext
from edsc_ext import _build_support, reference

# ||out - ref|| / ||ref|| accepted per dtype (the half types accumulate in float32).
SELF_CHECK_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}
DTYPE_NAMES = {str(d).replace("torch.", ""): d for d in SELF_CHECK_TOLERANCE}


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


def _visible_gpus(info: dict):
    """(capability, description, has machine code, has PTX) of each visible GPU, for a CUDA build."""
    if not torch.cuda.is_available() or not info["with_cuda"]:
        return
    for i in range(torch.cuda.device_count()):
        cap = torch.cuda.get_device_capability(i)
        name = f"cuda:{i} ({torch.cuda.get_device_name(i)}, compute capability {cap[0]}.{cap[1]})"
        yield (cap, name, _build_support.arch_runs_on(info["cuda_sass_archs"], [], cap),
               _build_support.arch_runs_on([], info["cuda_ptx_archs"], cap))


def arch_warnings(info: dict) -> list:
    """One line per visible GPU that this build has neither machine code (SASS) nor PTX for."""
    return [f"warning: {name} has no "
            f"kernels in this build (SASS sm {','.join(info['cuda_sass_archs']) or '-'}, PTX "
            f"{','.join(info['cuda_ptx_archs']) or '-'}): rebuild with TORCH_CUDA_ARCH_LIST=\"{cap[0]}.{cap[1]}\" "
            f"(pip install --no-build-isolation ., or EDSC_EXT_JIT=1), or install a wheel built for a newer CUDA"
            for cap, name, sass, ptx in _visible_gpus(info) if not (sass or ptx)]


def arch_notes(info: dict) -> list:
    """One line per visible GPU that runs this build only through its PTX (no machine code for it)."""
    return [f"note: {name} runs this build's PTX (compute {','.join(info['cuda_ptx_archs'])}), which the driver "
            f"compiles on first use (a slow first call, cached afterwards); TORCH_CUDA_ARCH_LIST=\"{cap[0]}.{cap[1]}\" "
            f"builds machine code for it"
            for cap, name, sass, ptx in _visible_gpus(info) if ptx and not sass]


def parse_devices(names, parser):
    """torch.devices for --device (default: the CPU and every GPU); 'cuda' means every GPU."""
    if not names:
        names = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    devices = []
    for name in names:
        try:
            device = torch.device(name)
        except RuntimeError:
            parser.error(f"--device {name}: not a device (expected cpu, cuda or cuda:N)")
        if device.type not in ("cpu", "cuda"):
            parser.error(f"--device {name}: edsc_ext has kernels for cpu and cuda only")
        if device.type == "cuda":
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if count == 0:
                parser.error(f"--device {name}: no CUDA GPU is visible")
            if device.index is None:
                devices += [torch.device("cuda", i) for i in range(count)]
                continue
            if device.index >= count:
                parser.error(f"--device {name}: only {count} GPU(s) are visible (cuda:0 to cuda:{count - 1})")
        devices.append(device)
    return list(dict.fromkeys(devices))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m edsc_ext",
        description="Prints the versions and build facts of edsc_ext, warns about GPUs this build has no "
                    "kernels for, and checks the op (forward and all five gradients, both padding modes) against "
                    "the float64 reference on each device in each dtype.",
        epilog="Exit code: 0 when every check passes, 1 when one fails, 2 for bad arguments.")
    parser.add_argument("--version", action="version",
                        version=f"edsc_ext {edsc_ext.__version__} (torch {torch.__version__})",
                        help="print the version of edsc_ext (and of torch) and exit")
    parser.add_argument("--device", nargs="+", metavar="DEVICE",
                        help="devices to check: cpu, cuda (every GPU), cuda:N (default: the CPU and every GPU)")
    parser.add_argument("--dtype", nargs="+", choices=list(DTYPE_NAMES), metavar="DTYPE",
                        help=f"dtypes to check: {', '.join(DTYPE_NAMES)} (default: all)")
    parser.add_argument("--no-check", action="store_true", help="only report the versions and build facts")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    devices = [] if args.no_check else parse_devices(args.device, parser)
    dtypes = [DTYPE_NAMES[d] for d in (args.dtype or DTYPE_NAMES)]
    info = edsc_ext.build_info()
    report = {"edsc_ext": edsc_ext.__version__, "python": platform.python_version(), "torch": torch.__version__,
              "torch_cuda": torch.version.cuda, "build_info": info, "warnings": [], "checks": []}
    say = (lambda line: None) if args.json else print
    say(f"edsc_ext {edsc_ext.__version__} ({info.get('binary')})")
    say(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda})")
    say("built for: torch >= {floor} (headers of torch {torch_version}), CUDA {cuda_version}, kernels for sm {sass}, "
        "PTX {ptx} (build: {build})".format(
        floor=info.get("torch_floor"), torch_version=info.get("torch_version"),
        cuda_version=info["cuda_version"] if info["with_cuda"] else "none",
        sass=",".join(info["cuda_sass_archs"]) or "-", ptx=",".join(info["cuda_ptx_archs"]) or "-",
        build=info.get("build", "?")))
    lines = []
    if torch.cuda.is_available() and not info["with_cuda"]:
        lines.append("warning: GPUs are visible but this build has no CUDA kernels; rebuild with a CUDA toolkit")
        devices = [d for d in devices if d.type != "cuda"] if args.device is None else devices
    lines += arch_warnings(info) + arch_notes(info)
    for line in lines:
        say(line)
    report["warnings"] = lines
    failed = False
    for device in devices:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
        for dtype in dtypes:
            tol = SELF_CHECK_TOLERANCE[dtype]
            try:
                err = self_check(device, dtype)
                ok = err <= tol
                detail = f"max rel. error {err:.2e} (tolerance {tol:.0e})"
            except Exception as exc:  # report and keep checking the other devices
                err, ok, detail = None, False, f"{type(exc).__name__}: {exc}"
            failed |= not ok
            dtype_name = str(dtype).replace("torch.", "")
            report["checks"].append({"device": str(device), "device_name": name, "dtype": dtype_name, "ok": ok,
                                     "max_relative_error": err, "tolerance": tol, "detail": detail})
            say(f"  {'ok  ' if ok else 'FAIL'} {str(device):8s} {dtype_name:9s} {detail}  [{name}]")
    if devices:
        say("self-check " + ("FAILED" if failed else "passed"))
    report["passed"] = not failed
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
