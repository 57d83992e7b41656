"""The kernel policy: which kernel families the planners may choose (src/cpu/cpu_plan.h,
src/cuda/cuda_plan.h), and the CPU backward's scratch budget.

    with edsc_ext.kernel_policy(grid_taps=False):
        out = edsc_ext.deform_sepconv(...)   # sepconv calls run the bilinear kernels

The policy is one process-wide value, not per thread: the backward of a call runs on autograd's
own threads, so a per-thread value would not reach it. The compiled op reads it once per call with
one atomic load (include/edsc_ext/kernel_policy.h), so a call always sees one consistent policy and
changing it never races with calls in flight on other threads; ``kernel_policy`` blocks are
serialised by a lock and restore the policy they found. It is read when a kernel is launched: a
CUDA graph replays the kernels chosen at capture, and a torch.compile'd function reads it at run
time, not at compile time. The ``EDSC_EXT_*`` environment variables of older versions set the
initial policy, once, at import (:func:`_from_environment`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import threading
from typing import Iterator, Mapping, Optional

import torch

__all__ = ["KernelPolicy", "kernel_policy", "current_kernel_policy"]


@dataclasses.dataclass(frozen=True)
class KernelPolicy:
    """What the planners may choose. The defaults are the fastest choices; the others exist to test
    and time the kernels they fall back to.

    Attributes:
        grid_taps: calls without offsets or dilation (sepconv) may take the grid-tap kernels, which
            read each tap's pixel directly (CUDA: from each tile's input window in shared memory;
            CPU: row by row). False sends them to the bilinear kernels.
        plain_forward: CUDA: every forward takes the one-thread-per-(pixel, channel block) kernel
            (no grid-tap, staged or lane-pair forward).
        prefetch: CUDA, NCHW 5x5: each warp first prefetches its per-pixel values into L2.
        input_grad_tile: CUDA backward: the input gradient goes through the shared-memory tile;
            False adds every sample with a global atomic (the path otherwise taken only for
            footprints too large for shared memory or tensors that need 64-bit indices).
        warp_staging: CUDA, channels_last 5x5 backward: the per-pixel values are staged through
            shared memory a warp at a time; False reads them in place.
        vector_loads: CUDA, channels_last forward of a multiple of 4 channels in the
            one-thread-per-(pixel, channel block) kernel (many channels, mixed precision): each
            bilinear corner's block of 4 or 8 channels is read with vector loads; False reads them
            one by one.
        channel_lanes: CUDA, channels_last backward of a multiple of 8 channels (float32 and the
            half types; not a deterministic input gradient): adjacent threads share a pixel's
            channels in blocks of 8 read with vector loads, and add the input gradient with vector
            atomics, instead of running on NCHW copies; False runs it on NCHW copies.
        cpu_scratch_mb: CPU backward: megabytes of scratch planes that may be used to split one
            image over threads; beyond it (or at 0) the input gradient takes a slower pass per
            (image, channel block) instead.
        cpu_isa: CPU loops: ``"auto"`` runs them compiled for AVX2 + FMA where torch reports that
            capability (``torch.backends.cpu.get_cpu_capability()`` is AVX2 or AVX512; torch's
            ``ATEN_CPU_CAPABILITY`` lowers it), ``"baseline"`` the plain x86-64 build (results then
            differ in the last bits: FMA rounds once).
    """

    grid_taps: bool = True
    plain_forward: bool = False
    prefetch: bool = True
    input_grad_tile: bool = True
    warp_staging: bool = True
    vector_loads: bool = True
    channel_lanes: bool = True
    cpu_scratch_mb: int = 256
    cpu_isa: str = "auto"

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type in ("bool", bool):
                if not isinstance(value, bool):
                    raise TypeError(f"kernel_policy: {field.name} must be a bool, got {value!r}")
        if isinstance(self.cpu_scratch_mb, bool) or not isinstance(self.cpu_scratch_mb, int) or self.cpu_scratch_mb < 0:
            raise ValueError(f"kernel_policy: cpu_scratch_mb must be an int >= 0, got {self.cpu_scratch_mb!r}")
        if self.cpu_isa not in ("auto", "baseline"):
            raise ValueError(f"kernel_policy: cpu_isa must be 'auto' or 'baseline', got {self.cpu_isa!r}")


_lock = threading.RLock()
_current = KernelPolicy()


def current_kernel_policy() -> KernelPolicy:
    """The policy the next call will run under."""
    return _current


def _op_arguments(policy: KernelPolicy) -> dict:
    """The set_kernel_policy op's arguments, by name: the C++ switches (EDSC_KERNEL_POLICY_SWITCHES in
    include/edsc_ext/kernel_policy.h, which makes the op's schema) are the bool fields here, so
    neither side lists the other's; cpu_isa goes as its bool, cpu_baseline."""
    arguments = {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy) if f.name != "cpu_isa"}
    arguments["cpu_baseline"] = policy.cpu_isa == "baseline"
    return arguments


def _set(policy: KernelPolicy) -> None:
    global _current
    torch.ops.edsc_ext.set_kernel_policy(**_op_arguments(policy))
    _current = policy


@functools.lru_cache(maxsize=None)
def _set_outside_graphs():
    return torch.compiler.disable(_set)


def _install(policy: KernelPolicy) -> None:
    """Sets the policy; under torch.compile as a graph break, never traced into a graph. Deciding so
    needs torch._dynamo, whose import takes seconds: only a process that has loaded it (every one
    that compiles has) pays for it, not ``import edsc_ext``."""
    if "torch._dynamo" in sys.modules:
        _set_outside_graphs()(policy)
    else:
        _set(policy)


@contextlib.contextmanager
def kernel_policy(**changes) -> Iterator[KernelPolicy]:
    """Runs the block under the current policy changed by ``changes`` (keywords of
    :class:`KernelPolicy`), process-wide, and restores the policy it found on exit; yields the
    policy in force. Nested blocks combine. A block holds a lock for its whole duration, so blocks
    entered from several threads run one after another instead of undoing each other's changes;
    op calls on any thread (autograd's included) run under whatever policy is current.

        with edsc_ext.kernel_policy(plain_forward=True, warp_staging=False):
            ...
    """
    unknown = set(changes) - {f.name for f in dataclasses.fields(KernelPolicy)}
    if unknown:
        raise TypeError(f"kernel_policy got unknown keyword(s) {sorted(unknown)}; "
                        f"expected some of {[f.name for f in dataclasses.fields(KernelPolicy)]}")
    with _lock:
        previous = _current
        policy = dataclasses.replace(previous, **changes)
        _install(policy)
        try:
            yield policy
        finally:
            _install(previous)


# The EDSC_EXT_* switches of versions that read them at every call, read here once.
_ENVIRONMENT = {
    "EDSC_EXT_GRID_TAPS": ("grid_taps", lambda v: v != "0"),
    "EDSC_EXT_FORWARD": ("plain_forward", lambda v: v == "plain"),
    "EDSC_EXT_PREFETCH": ("prefetch", lambda v: v != "0"),
    "EDSC_EXT_INPUT_GRAD": ("input_grad_tile", lambda v: v != "global"),
    "EDSC_EXT_WARP_STAGING": ("warp_staging", lambda v: v != "0"),
    "EDSC_EXT_CPU_SCRATCH_MB": ("cpu_scratch_mb", lambda v: max(0, int(v))),
    "EDSC_EXT_CPU_ISA": ("cpu_isa", lambda v: "baseline" if v == "baseline" else "auto"),
}


def _from_environment(environ: Optional[Mapping[str, str]] = None) -> KernelPolicy:
    """The initial policy: the defaults, changed by whichever EDSC_EXT_* switches are set."""
    environ = os.environ if environ is None else environ
    changes = {}
    for variable, (field, parse) in _ENVIRONMENT.items():
        value = environ.get(variable)
        if value is None:
            continue
        try:
            changes[field] = parse(value.strip())
        except ValueError as exc:
            raise ValueError(f"{variable}={value!r}: {exc}") from exc
    return dataclasses.replace(KernelPolicy(), **changes)


def _install_initial() -> None:
    """Called once by ``import edsc_ext``, after the compiled ops are registered."""
    _install(_from_environment())
