"""Helpers of tests/test_multi_gpu.py, and the script it runs in fresh processes.

As a module: :func:`seed_scenario` (the op and vector_add on tensors created directly on a device,
with no ``torch.cuda.set_device``, checked against the CPU), :func:`device_uuid`.

As a script (``python tests/multi_gpu_helpers.py --device cuda:1``): runs :func:`seed_scenario` in
a fresh process, checks that nothing was ever allocated on any other visible GPU and that the
current device did not change, and prints one line ``MULTI_GPU_RESULT {json}`` whose ``errors``
list is empty when everything held. The exit code is 0 whenever that line is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import edsc_ext  # noqa: E402
from edsc_ext import reference as R  # noqa: E402

from conftest import ARG_NAMES, PADDING_MODES, Case, assert_close, assert_grads_close, default_grad_output  # noqa: E402

RESULT_MARKER = "MULTI_GPU_RESULT "


def device_uuid(index: int) -> Optional[str]:
    """The UUID of visible GPU ``index`` as a string, or None where torch does not say."""
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return None if " at 0x" in text else text  # a default repr would differ between processes


def allocation_count(index: int) -> int:
    """How many allocations the caching allocator ever made on GPU ``index``."""
    return int(torch.cuda.memory_stats(index).get("allocation.all.allocated", 0))


def case_created_on(device: torch.device, dtype: torch.dtype, seed: int = 1234) -> Case:
    """A deform_sepconv call whose tensors are created with ``device=device`` (on the device's own
    generator), offsets kept off the integer grid (fractional parts in [0.1, 0.9])."""
    g = torch.Generator(device=device).manual_seed(seed)
    N, C, H, W, K, pad = 2, 3, 9, 10, 3, 1
    ho, wo = H + 2 * pad - (K - 1), W + 2 * pad - (K - 1)

    def randn(*shape):
        return torch.randn(shape, device=device, dtype=dtype, generator=g)

    off_shape = (N, 2 * K * K, ho, wo)
    offset = (torch.randint(-2, 3, off_shape, device=device, generator=g).to(dtype)
              + 0.1 + 0.8 * torch.rand(off_shape, device=device, dtype=dtype, generator=g))
    mask = torch.rand((N, K * K, ho, wo), device=device, dtype=dtype, generator=g)
    return Case(randn(N, C, H, W), randn(N, K, ho, wo), randn(N, K, ho, wo), offset, mask,
                kwargs=dict(kernel_size=(K, K), padding=pad, dilation=1))


def forward_and_grads(fn, case: Case, padding_mode: str):
    """Output and the five gradients of one call, with the fixed grad_output of conftest."""
    leaves = case.leaves()
    out = leaves.call(fn, padding_mode=padding_mode)
    out.backward(default_grad_output(out.shape).to(device=out.device, dtype=out.dtype))
    return out.detach(), leaves.grads()


def seed_scenario(device: torch.device) -> List[str]:
    """vector_add and deform_sepconv (forward and every gradient, float32 and float64, both padding
    modes) on tensors created with ``device=device``, no set_device; the results must be on
    ``device`` and match the CPU (exactly for vector_add, within conftest's tolerances for
    deform_sepconv against the float64 reference). Returns the failures (empty: all good)."""
    errors: List[str] = []

    def check(label, fn):
        try:
            fn()
        except AssertionError as e:
            errors.append(f"{label} on {device}: {e}")

    for dtype in (torch.float32, torch.float64):
        for n in (5, (1 << 20) + 7):
            g = torch.Generator(device=device).manual_seed(n)
            a = torch.rand(n, device=device, dtype=dtype, generator=g)
            b = torch.rand(n, device=device, dtype=dtype, generator=g)

            def vector_add_ok(a=a, b=b):
                c = edsc_ext.vector_add(a, b)
                assert c.device == device, f"result on {c.device}, expected {device}"
                assert torch.equal(c.cpu(), a.cpu() + b.cpu()), "result differs from a + b on the CPU"

            check(f"vector_add({dtype}, n={n})", vector_add_ok)

        case = case_created_on(device, dtype)
        for mode in PADDING_MODES:
            def op_ok(case=case, mode=mode, dtype=dtype):
                out, grads = forward_and_grads(edsc_ext.deform_sepconv, case, mode)
                assert out.device == device, f"output on {out.device}, expected {device}"
                for name, g in zip(ARG_NAMES, grads):
                    assert g is not None and g.device == device, f"grad of {name} missing or not on {device}"
                expected, expected_grads = forward_and_grads(R.deform_sepconv, case.to(torch.float64, "cpu"), mode)
                assert_close(out, expected, dtype)
                assert_grads_close(grads, expected_grads, dtype)

            check(f"deform_sepconv({dtype}, padding_mode={mode!r})", op_ok)
    return errors


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", required=True, help="e.g. cuda:1")
    args = p.parse_args(argv)
    report = {"errors": [], "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        device = torch.device(args.device)
        assert device.type == "cuda" and device.index is not None, f"--device must be cuda:N, got {args.device}"
        report["device_count"] = torch.cuda.device_count()
        before = torch.cuda.current_device()
        report["current_device_before"] = before
        report["errors"] += seed_scenario(device)
        torch.cuda.synchronize(device)
        after = torch.cuda.current_device()
        report["current_device_after"] = after
        if after != before:
            report["errors"].append(f"the current device changed from {before} to {after}")
        report["device_uuid"] = device_uuid(device.index)
        others = {}
        for index in range(torch.cuda.device_count()):
            if index != device.index:
                others[index] = {"allocations": allocation_count(index),
                                 "max_memory_allocated": torch.cuda.max_memory_allocated(index)}
                if others[index]["allocations"] or others[index]["max_memory_allocated"]:
                    report["errors"].append(f"memory was allocated on cuda:{index} (the work was on {device}): "
                                            f"{others[index]}")
        report["other_devices"] = others
        report["allocations_on_device"] = allocation_count(device.index)
    except Exception:  # noqa: BLE001 - reported to the test, which fails with it
        report["errors"].append(traceback.format_exc())
    print(RESULT_MARKER + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
