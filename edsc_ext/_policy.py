"""The kernel policy: which kernel families the planners may choose (src/cpu/cpu_plan.h,
src/cuda/cuda_plan.h), and the CPU backward's scratch budget.

    with edsc_ext.kernel_policy(grid_taps=False):
        out = edsc_ext.deform_sepconv(...)   # sepconv calls run the bilinear kernels

Its switches, their defaults and descriptions are the compiled library's (src/kernel_policy.h, read
once through ``torch.ops.edsc_ext.kernel_policy_switches``): :class:`KernelPolicy` is made from them.
The policy is one process-wide value, not per thread: the backward of a call runs on autograd's
own threads, so a per-thread value would not reach it. The compiled op reads it once per call with
one atomic load (src/kernel_policy.h), so a call always sees one consistent policy and
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
import json
import os
import sys
import textwrap
import threading
from typing import Iterator, List, Mapping, Optional, Sequence, Tuple

import torch

__all__ = ["KernelPolicy", "kernel_policy", "current_kernel_policy", "compiled_kernel_policy"]


# The switches as the compiled library states them (src/kernel_policy.h, kPolicySwitches): name, kind
# (a flag, a count, or a choice between two names), default and description, read once.
_SWITCHES = json.loads(torch.ops.edsc_ext.kernel_policy_switches())
_FIELD_TYPES = {"flag": bool, "count": int, "choice": str}


def _check_values(policy) -> None:
    for switch in _SWITCHES:
        name, value = switch["name"], getattr(policy, switch["name"])
        if switch["kind"] == "flag" and not isinstance(value, bool):
            raise TypeError(f"kernel_policy: {name} must be a bool, got {value!r}")
        if switch["kind"] == "count" and (isinstance(value, bool) or not isinstance(value, int)
                                          or not 0 <= value <= switch["max"]):
            raise ValueError(f"kernel_policy: {name} must be an int >= 0 (at most {switch['max']}), got {value!r}")
        if switch["kind"] == "choice" and value not in switch["choices"]:
            raise ValueError(f"kernel_policy: {name} must be {' or '.join(map(repr, switch['choices']))}, "
                             f"got {value!r}")


def _docstring() -> str:
    attributes = "\n".join(textwrap.fill(f"{switch['name']}: {switch['description']} (default {switch['default']!r}).",
                                          width=100, initial_indent=" " * 8, subsequent_indent=" " * 12,
                                          break_long_words=False, break_on_hyphens=False)
                            for switch in _SWITCHES)
    return ("What the planners may choose. The defaults are the fastest choices; the others exist to test\n"
            "    and time the kernels they fall back to.\n\n    Attributes:\n" + attributes + "\n    ")


KernelPolicy = dataclasses.make_dataclass(
    "KernelPolicy",
    [(switch["name"], _FIELD_TYPES[switch["kind"]], dataclasses.field(default=switch["default"]))
     for switch in _SWITCHES],
    namespace={"__post_init__": _check_values, "__doc__": _docstring(), "__module__": __name__}, frozen=True)


_lock = threading.RLock()
_current = KernelPolicy()


def current_kernel_policy() -> KernelPolicy:
    """The policy the next call will run under."""
    return _current


def _op_values(policy: KernelPolicy) -> Tuple[List[str], List[int]]:
    """The switches' names and values as the set_kernel_policy op takes them (get_kernel_policy returns
    them): a flag 0 or 1, a count itself, a choice its index."""
    values = []
    for switch in _SWITCHES:
        value = getattr(policy, switch["name"])
        values.append(switch["choices"].index(value) if switch["kind"] == "choice" else int(value))
    return [switch["name"] for switch in _SWITCHES], values


def _from_op_values(names: Sequence[str], values: Sequence[int]) -> KernelPolicy:
    """The KernelPolicy of get_kernel_policy's names and values."""
    switches = {switch["name"]: switch for switch in _SWITCHES}
    fields = {}
    for name, value in zip(names, values):
        switch = switches[name]
        if switch["kind"] == "choice":
            fields[name] = switch["choices"][value]
        else:
            fields[name] = bool(value) if switch["kind"] == "flag" else value
    return KernelPolicy(**fields)


def compiled_kernel_policy() -> KernelPolicy:
    """The policy the compiled ops hold (``torch.ops.edsc_ext.get_kernel_policy``): the current one."""
    return _from_op_values(*torch.ops.edsc_ext.get_kernel_policy())


def _set(policy: KernelPolicy) -> None:
    global _current
    torch.ops.edsc_ext.set_kernel_policy(*_op_values(policy))
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
