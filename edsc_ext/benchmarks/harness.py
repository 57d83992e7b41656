"""What the benchmarks share: the clock, the memory between measurements, and the machine they ran on.

:func:`time_calls` is the one clock of :mod:`~edsc_ext.benchmarks.op`, :mod:`~edsc_ext.benchmarks.networks`
and :mod:`~edsc_ext.benchmarks.video`: on CUDA each call is bracketed by CUDA events on the device's
current stream (the stream the work runs on), recorded back to back and read after one synchronisation,
so that no host wait between calls is timed; on the CPU by ``time.perf_counter``. :func:`command_name` is
how a benchmark names itself in its help and its reports: the command the user typed.
"""

from __future__ import annotations

import datetime
import gc
import platform
import subprocess
import sys
import time
from typing import Callable, List, Optional

import torch

import edsc_ext

__all__ = ["GB", "command_name", "synchronize", "time_calls", "free_memory", "matmul_peak_tflops", "cpu_name",
           "device_description", "environment"]

GB = 1e9  # bandwidths are in GB/s = 1e9 bytes per second


def command_name(script: str, module: str) -> str:
    """The command that runs a benchmark as the user typed it: ``python -m MODULE`` where the process was
    started that way, else its console script ``script`` (pyproject.toml's ``[project.scripts]``), the name
    an installed package puts on PATH."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return f"python -m {module}" if spec is not None and spec.name == module else script


def synchronize(device: torch.device) -> None:
    """Waits for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], object], device, warmup: int, reps: int) -> List[float]:
    """Runs ``fn`` ``warmup`` times untimed, then ``reps`` (at least 1) timed times; returns each timed
    call's milliseconds."""
    device = torch.device(device)
    for _ in range(max(0, int(warmup))):
        fn()
    reps = max(1, int(reps))
    if device.type != "cuda":
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return times
    with torch.cuda.device(device):
        synchronize(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        synchronize(device)
        return [start.elapsed_time(end) for start, end in events]


def free_memory(device: torch.device) -> None:
    """Returns what the last measurement left (garbage, the CUDA cache) before the next one's peak."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def matmul_peak_tflops(device, dtype: torch.dtype, size: Optional[int] = None, reps: int = 10) -> float:
    """The dense matrix-product rate of this device in ``dtype``, in TFLOP/s: the median of ``reps``
    products of two random ``size`` x ``size`` matrices (default 8192 on CUDA, 1024 on the CPU) after three
    untimed ones; float32 runs as the process set TF32 for cuDNN (the convolutions' setting), so that
    it is the peak the float32 convolutions could reach."""
    device = torch.device(device)
    size = size or (8192 if device.type == "cuda" else 1024)
    generator = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(size, size, device=device, dtype=dtype, generator=generator) for _ in range(2))
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32
    try:
        times = time_calls(lambda: torch.mm(a, b), device, 3, reps)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    ms = sorted(times)[len(times) // 2]
    return 2 * size ** 3 / (ms * 1e-3) / 1e12


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_description(device: torch.device) -> str:
    """One line: the GPU's name, or the CPU's and its threads, with the torch (and CUDA) version."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return f"CPU {cpu_name()}, {torch.get_num_threads()} threads (torch {torch.__version__})"


def _driver_version() -> Optional[str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0].strip()
    except Exception:
        pass
    getter = getattr(torch._C, "_cuda_getDriverVersion", None)  # CUDA driver API version, e.g. 12080
    if getter is not None:
        try:
            v = int(getter())
            return f"CUDA driver API {v // 1000}.{(v % 1000) // 10}"
        except Exception:
            pass
    return None


def environment(device, command: str) -> dict:
    """What the numbers were measured on: device, driver, versions, date, command line."""
    device = torch.device(device)
    env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
           "command": command, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "edsc_ext": edsc_ext.__version__, "python": platform.python_version(), "device": str(device),
           "host": platform.node()}
    try:
        info = edsc_ext.build_info()
        env["edsc_ext_built_with_torch"] = info.get("torch_version")
        env["edsc_ext_cuda_archs"] = info.get("cuda_sass_archs")
    except Exception:
        pass
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device_name=props.name, device_memory_gb=round(props.total_memory / GB, 1),
                   compute_capability=f"{props.major}.{props.minor}", sm_count=props.multi_processor_count,
                   driver=_driver_version())
    else:
        env.update(device_name=cpu_name(), cpu_threads=torch.get_num_threads(), driver=None)
    return env
