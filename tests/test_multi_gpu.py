"""More than one GPU: the op runs on the device its tensors live on, whatever the current device,
allocating and launching nothing on any other; under DataParallel, from two threads at once (one
per GPU, each on its own stream), in fresh processes (tensors made directly on cuda:1;
CUDA_VISIBLE_DEVICES remapping), and in DistributedDataParallel training (examples/ddp_train.py
under torchrun), whose gradients must equal those of one process on the concatenated batch.

Every test marked ``multi_gpu`` is skipped with fewer than two GPUs. ``test_ddp_cpu_gloo`` runs
the same DDP comparison on the CPU (backend gloo), so it runs everywhere.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from torch import nn

import edsc_ext
from edsc_ext import reference as R

from conftest import (
    ARG_NAMES,
    GRAD_FACTOR,
    PADDING_MODES,
    assert_close,
    assert_grads_close,
    default_grad_output,
    make_inputs,
    requires_two_gpus,
    subprocess_env,
)
from multi_gpu_helpers import RESULT_MARKER, allocation_count, device_uuid, seed_scenario

F32, F64 = torch.float32, torch.float64
OP = edsc_ext.deform_sepconv
TESTS_DIR = Path(__file__).resolve().parent
EXAMPLE = TESTS_DIR.parent / "examples" / "ddp_train.py"
HELPER = TESTS_DIR / "multi_gpu_helpers.py"

DDP_TIMEOUT_S = 180
HELPER_TIMEOUT_S = 120


def forward_and_grads(fn, case, padding_mode, grad_output=None):
    leaves = case.leaves()
    out = leaves.call(fn, padding_mode=padding_mode)
    if grad_output is None:
        grad_output = default_grad_output(out.shape).to(device=out.device, dtype=out.dtype)
    out.backward(grad_output)
    return out.detach(), leaves.grads()


def reference(case, padding_mode):
    """The float64 CPU reference of a case (from its own, possibly rounded, values)."""
    return forward_and_grads(R.deform_sepconv, case.to(F64, "cpu"), padding_mode)


@contextmanager
def nothing_allocated_on(index: int):
    """Asserts that the block allocates nothing on GPU ``index`` through the caching allocator:
    the number of allocations it ever made, the bytes allocated and the peak (reset first) stay
    as they were. (Creating a CUDA context allocates nothing there, so only allocator stats count.)
    The garbage collector is held off meanwhile so that it frees nothing left by earlier tests."""
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        torch.cuda.synchronize(index)
        torch.cuda.reset_peak_memory_stats(index)
        before_bytes = torch.cuda.memory_allocated(index)
        before_count = allocation_count(index)
        yield
        torch.cuda.synchronize(index)
        after_bytes = torch.cuda.memory_allocated(index)
        peak_bytes = torch.cuda.max_memory_allocated(index)
        after_count = allocation_count(index)
    finally:
        if gc_was_enabled:
            gc.enable()
    assert after_count == before_count, (
        f"{after_count - before_count} allocation(s) were made on cuda:{index}, which holds none of the tensors")
    assert peak_bytes == before_bytes, (
        f"the peak memory on cuda:{index} rose from {before_bytes} to {peak_bytes} bytes during the call")
    assert after_bytes == before_bytes, (
        f"memory allocated on cuda:{index} changed from {before_bytes} to {after_bytes} bytes during the call")


# --------------------------------------------------------------------------------------------
# Tensors on one GPU, current device the other.

DIRECTIONS = [(1, 0), (0, 1)]
DIRECTION_IDS = ["data1-current0", "data0-current1"]


@pytest.mark.cuda
@pytest.mark.multi_gpu
@requires_two_gpus
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("data, current", DIRECTIONS, ids=DIRECTION_IDS)
def test_other_device(gen, data, current, dtype, padding_mode):
    """Forward and all gradients on cuda:<data> while the current device is cuda:<current> equal
    the CPU's; the current device is unchanged, and nothing is allocated on cuda:<current>."""
    data_dev = torch.device("cuda", data)
    case = make_inputs(2, 4, 12, 13, 3, 3, 1, 1, dtype=dtype, device=data_dev, generator=gen)
    expected, expected_grads = reference(case, padding_mode)
    grad_output = default_grad_output(expected.shape).to(device=data_dev, dtype=dtype)
    leaves = case.leaves()
    with torch.cuda.device(current):
        assert torch.cuda.current_device() == current
        with nothing_allocated_on(current):
            out = leaves.call(OP, padding_mode=padding_mode)
            assert torch.cuda.current_device() == current, "the forward changed the current device"
            out.backward(grad_output)
            assert torch.cuda.current_device() == current, "the backward changed the current device"
            doubled = edsc_ext.vector_add(case.input, case.input)
            assert torch.cuda.current_device() == current, "vector_add changed the current device"
            torch.cuda.synchronize(data)
        assert torch.cuda.current_device() == current
    grads = leaves.grads()
    assert out.device == data_dev, f"output on {out.device}, expected {data_dev}"
    for name, g in zip(ARG_NAMES, grads):
        assert g is not None and g.device == data_dev, f"grad of {name} is missing or not on {data_dev}"
    assert_close(out, expected, dtype)
    assert_grads_close(grads, expected_grads, dtype)
    assert doubled.device == data_dev and torch.equal(doubled.cpu(), case.input.cpu() * 2), "vector_add is wrong"


# Synchronisation records (when the profiler records them at all) are not work on a device.
NOT_WORK = ("Synchronize", "Wait Event", "Overhead", "Buffer")


def _is_device_work(event) -> bool:
    """A kernel, copy or memset the profiler saw on a GPU."""
    if str(getattr(event, "device_type", "")).split(".")[-1] != "CUDA":
        return False
    return not any(word.lower() in event.name.lower() for word in NOT_WORK)


@pytest.mark.cuda
@pytest.mark.multi_gpu
@requires_two_gpus
@pytest.mark.parametrize("data, current", DIRECTIONS, ids=DIRECTION_IDS)
def test_other_device_launches_nothing_there(gen, data, current):
    """The profiler sees every kernel, copy and memset of the forward and backward on cuda:<data>
    and none on cuda:<current> (skipped when the profiler records no GPU activity at all)."""
    from torch.profiler import ProfilerActivity, profile

    data_dev = torch.device("cuda", data)
    case = make_inputs(2, 4, 12, 13, 3, 3, 1, 1, dtype=F32, device=data_dev, generator=gen)
    leaves = case.leaves()
    grad_output = default_grad_output((2, 4, 12, 13)).to(device=data_dev, dtype=F32)
    torch.cuda.synchronize(data)
    torch.cuda.synchronize(current)
    # The profiler starts and stops (synchronising the current device) with cuda:<data> current;
    # only the op's calls run with cuda:<current> current.
    with torch.cuda.device(data):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with torch.cuda.device(current):
                out = leaves.call(OP, padding_mode="border")
                out.backward(grad_output)
                assert torch.cuda.current_device() == current, "the op changed the current device"
                torch.cuda.synchronize(data)
    gpu_events = [e for e in prof.events() if _is_device_work(e)]
    ours = [e for e in gpu_events if "deform_sepconv" in e.name]
    if not ours:
        pytest.skip(f"the profiler recorded no deform_sepconv kernel ({len(gpu_events)} GPU events in all; "
                    "CUPTI unavailable?)")
    elsewhere = sorted({f"{e.name[:80]} on cuda:{e.device_index}" for e in gpu_events if e.device_index != data})
    assert not elsewhere, f"GPU work outside cuda:{data}, where all the tensors are: {elsewhere}"
    assert all(e.device_index == data for e in ours)


# --------------------------------------------------------------------------------------------
# The seed's scenario: tensors made with device=torch.device("cuda:1"), no set_device.


@pytest.mark.cuda
@pytest.mark.multi_gpu
@requires_two_gpus
def test_seed_scenario_in_process():
    """vector_add and deform_sepconv on tensors created directly on cuda:1, without
    torch.cuda.set_device: correct results, the current device untouched and (when it is not
    cuda:1) nothing allocated on it."""
    current = torch.cuda.current_device()
    device = torch.device("cuda:1")
    if current != 1:
        with nothing_allocated_on(current):
            errors = seed_scenario(device)
    else:
        errors = seed_scenario(device)
    assert not errors, "\n".join(errors)
    assert torch.cuda.current_device() == current, "the current device changed"


# Set by torchrun for its workers; a test process started by torchrun must not pass them on.
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                      "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def torchrun_free_env(**changes) -> dict:
    """conftest.subprocess_env without torchrun's variables."""
    return {k: v for k, v in subprocess_env(**changes).items() if k not in TORCHRUN_VARIABLES}


class Launched:
    """A subprocess started in its own session, its output (stdout and stderr) in a file, so that a
    hung one (or its children) can never block the reading of its output."""

    def __init__(self, cmd, env, log_path: Path):
        self.cmd, self.log_path = [str(c) for c in cmd], log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(self.cmd, cwd=str(TESTS_DIR.parent), env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def finish(self, timeout: float):
        """(exit code, output); fails the test when it runs past ``timeout`` seconds."""
        try:
            self.proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            # torchrun stops its workers on SIGTERM; whatever survives 30 s is killed with its group.
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        self._log.close()
        output = self.log_path.read_text(errors="replace")
        if timed_out:
            pytest.fail(f"`{' '.join(self.cmd)}` ran past {timeout} s; output:\n{output[-8000:]}")
        return self.proc.returncode, output


def run(cmd, env, log_path: Path, timeout: float):
    return Launched(cmd, env, log_path).finish(timeout)


def run_helper(tmp_path: Path, device: str, **env_changes) -> dict:
    rc, output = run([sys.executable, HELPER, "--device", device], torchrun_free_env(**env_changes),
                     tmp_path / "helper.log", HELPER_TIMEOUT_S)
    lines = [line for line in output.splitlines() if RESULT_MARKER in line]
    assert rc == 0 and lines, f"{HELPER.name} --device {device} failed (exit {rc}); output:\n{output[-8000:]}"
    return json.loads(lines[-1].split(RESULT_MARKER, 1)[1])


@pytest.mark.cuda
@pytest.mark.multi_gpu
@requires_two_gpus
def test_seed_scenario_fresh_process(tmp_path):
    """The same in a fresh process, where nothing has touched cuda:0: the current device stays 0
    and the caching allocator never allocates anything on cuda:0."""
    result = run_helper(tmp_path, "cuda:1")
    assert not result["errors"], "\n".join(result["errors"])
    assert result["device_count"] >= 2, result
    assert result["current_device_before"] == result["current_device_after"] == 0, result
    assert result["other_devices"]["0"] == {"allocations": 0, "max_memory_allocated": 0}, result
    assert result["allocations_on_device"] > 0, f"nothing was allocated on cuda:1 itself: {result}"


@pytest.mark.cuda
@pytest.mark.multi_gpu
@requires_two_gpus
def test_cuda_visible_devices_remapping(tmp_path):
    """A process that sees only the second GPU (CUDA_VISIBLE_DEVICES) runs the op on what it calls
    cuda:0, correctly, and that cuda:0 is the GPU this process calls cuda:1."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in visible.split(",") if e.strip()] if visible else []
    second = entries[1] if len(entries) >= 2 else "1"  # this process's cuda:1, in the parent's numbering
    result = run_helper(tmp_path, "cuda:0", CUDA_VISIBLE_DEVICES=second)
    assert not result["errors"], "\n".join(result["errors"])
    assert result["cuda_visible_devices"] == second, result
    assert result["device_count"] == 1, f"CUDA_VISIBLE_DEVICES={second} should leave one GPU visible: {result}"
    assert result["current_device_before"] == result["current_device_after"] == 0, result
    ours = device_uuid(1)
    if ours is not None and result.get("device_uuid") is not None:
        assert result["device_uuid"] == ours, (
            f"the subprocess's cuda:0 is GPU {result['device_uuid']}, expected this process's cuda:1 ({ours})")


# --------------------------------------------------------------------------------------------
# DataParallel.


class KernelNet(nn.Module):
    """Predicts separable kernels, offsets and a mask from the frame; applies them with DeformSepConv2d.
    ``seen`` collects the device of every forward (DataParallel's replicas share the list)."""

    def __init__(self, seen: list, k: int = 3, hidden: int = 6):
        super().__init__()
        self.seen, self.k = seen, k
        self.features = nn.Conv2d(3, hidden, 3, padding=1)
        self.head = nn.Conv2d(hidden, 2 * k + 3 * k * k, 3, padding=1)
        self.adaptive = edsc_ext.nn.DeformSepConv2d(padding=k // 2, padding_mode="border")

    def forward(self, frame):
        self.seen.append(frame.device)
        k = self.k
        v, h, offset, mask = torch.split(self.head(torch.relu(self.features(frame))), [k, k, 2 * k * k, k * k], dim=1)
        return self.adaptive(frame, v, h, offset, torch.sigmoid(mask))


@pytest.mark.cuda
@pytest.mark.multi_gpu
@requires_two_gpus
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_data_parallel(gen):
    """nn.DataParallel over both GPUs: the output, the frame's gradient and every parameter's
    gradient equal those of the same module on cuda:0 alone (float64)."""
    seen: list = []
    torch.manual_seed(0)
    single = KernelNet(seen).to(device="cuda:0", dtype=F64)
    replicated = copy.deepcopy(single)
    replicated.seen = seen  # deepcopy copied the list; the replicas must append to this one
    frame = torch.rand((4, 3, 16, 17), generator=gen, dtype=F64).to("cuda:0")
    grad_output = default_grad_output((4, 3, 16, 17)).to(device="cuda:0", dtype=F64)

    frame_1 = frame.clone().requires_grad_()
    out_1 = single(frame_1)
    out_1.backward(grad_output)

    seen.clear()
    frame_dp = frame.clone().requires_grad_()
    out_dp = nn.DataParallel(replicated, device_ids=[0, 1], output_device=0)(frame_dp)
    out_dp.backward(grad_output)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    assert {d.index for d in seen} == {0, 1}, f"DataParallel ran the replicas on {seen}, expected cuda:0 and cuda:1"
    assert out_dp.device == torch.device("cuda:0")

    assert_close(out_dp, out_1, F64, what="DataParallel output")
    assert_close(frame_dp.grad, frame_1.grad, F64, factor=GRAD_FACTOR, what="DataParallel grad of the frame")
    for (name, p_1), (name_dp, p_dp) in zip(single.named_parameters(), replicated.named_parameters()):
        assert name == name_dp
        assert p_dp.grad is not None and p_dp.grad.device == torch.device("cuda:0"), f"grad of {name}"
        assert_close(p_dp.grad, p_1.grad, F64, factor=GRAD_FACTOR, what=f"DataParallel grad of {name}")


# --------------------------------------------------------------------------------------------
# Two threads, one per GPU.

SLEEP_CYCLES = 20_000_000  # ~10 ms of GPU time


@pytest.mark.cuda
@pytest.mark.multi_gpu
@requires_two_gpus
@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
def test_two_threads_one_gpu_each(dtype):
    """Two threads, one per GPU, each on its own stream, call the op (forward and backward) a few
    times at once. Each iteration's inputs are written behind a GPU sleep on that stream, so a kernel
    launched on any other stream would read them too early. All results equal the CPU reference."""
    devices = (0, 1)
    scales = (1.0, -0.5, 2.0)  # exact in every dtype, so the reference sees the same inputs
    base = {d: make_inputs(2, 4, 16, 17, 3, 3, 1, 1, dtype=dtype, generator=torch.Generator().manual_seed(100 + d))
            for d in devices}
    expected = {d: [reference(base[d].replace(input=base[d].input * s), PADDING_MODES[i % 2])
                    for i, s in enumerate(scales)] for d in devices}
    barrier = threading.Barrier(len(devices), timeout=60)

    def worker(d):
        try:
            device = torch.device("cuda", d)
            results = []
            with torch.cuda.device(d):
                stream = torch.cuda.Stream(device=device)
                with torch.cuda.stream(stream):
                    case = base[d].to(device=device)
                    barrier.wait()
                    for i, s in enumerate(scales):
                        torch.cuda._sleep(SLEEP_CYCLES)
                        out, grads = forward_and_grads(OP, case.replace(input=case.input * s), PADDING_MODES[i % 2])
                        results.append((out.cpu(), tuple(None if g is None else g.cpu() for g in grads)))
                    assert torch.cuda.current_stream(device) == stream
                stream.synchronize()
            return results
        except BaseException:
            barrier.abort()  # don't leave the other thread waiting
            raise

    with ThreadPoolExecutor(max_workers=len(devices)) as pool:
        futures = {d: pool.submit(worker, d) for d in devices}
        results = {d: f.result(timeout=180) for d, f in futures.items()}

    for d in devices:
        assert len(results[d]) == len(scales)
        for i, ((out, grads), (exp, exp_grads)) in enumerate(zip(results[d], expected[d])):
            try:
                assert_close(out, exp, dtype)
                assert_grads_close(grads, exp_grads, dtype)
            except AssertionError as e:
                raise AssertionError(f"thread on cuda:{d}, iteration {i}: {e}") from e


# --------------------------------------------------------------------------------------------
# DistributedDataParallel: examples/ddp_train.py under torchrun.

# Small enough for two CPU processes in a few seconds; the loss falls about tenfold in 12 steps.
DDP_ARGS = ["--dtype", "float64", "--steps", "12", "--size", "24", "--hidden", "8", "--batch-size", "4", "--seed", "3"]


def check_ddp(tmp_path: Path, device: str, env: dict) -> None:
    """Trains with DDP over two processes (torchrun) and, at the same time, in one process on the
    concatenated batches; the first step's gradients (DDP's averaged ones) and every step's loss
    must agree, and the loss must fall."""
    ddp_grads, one_grads = tmp_path / "ddp_grads.pt", tmp_path / "single_grads.pt"
    ddp_json, one_json = tmp_path / "ddp.json", tmp_path / "single.json"
    common = [EXAMPLE, "--device", device, *DDP_ARGS]
    ddp_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *common,
               "--check-grads", ddp_grads, "--result", ddp_json]
    one_cmd = [sys.executable, *common, "--single-process", "--world-size", "2",
               "--check-grads", one_grads, "--result", one_json]
    single = Launched(one_cmd, env, tmp_path / "single.log")
    ddp = Launched(ddp_cmd, env, tmp_path / "ddp.log")
    ddp_rc, ddp_out = ddp.finish(DDP_TIMEOUT_S)
    one_rc, one_out = single.finish(DDP_TIMEOUT_S)
    assert ddp_rc == 0, f"torchrun ... ddp_train.py failed (exit {ddp_rc}); output:\n{ddp_out[-8000:]}"
    assert one_rc == 0, f"ddp_train.py --single-process failed (exit {one_rc}); output:\n{one_out[-8000:]}"
    assert ddp_grads.is_file() and ddp_json.is_file(), f"the DDP run wrote no results; output:\n{ddp_out[-8000:]}"
    assert one_grads.is_file() and one_json.is_file(), f"the single run wrote no results; output:\n{one_out[-8000:]}"

    ddp_summary, one_summary = json.loads(ddp_json.read_text()), json.loads(one_json.read_text())
    assert ddp_summary["mode"] == "ddp" and ddp_summary["world_size"] == 2, ddp_summary
    assert one_summary["mode"] == "single", one_summary
    expected_device = "cuda:0" if device == "cuda" else "cpu"
    assert ddp_summary["device"] == one_summary["device"] == expected_device, (ddp_summary, one_summary)
    losses, one_losses = ddp_summary["losses"], one_summary["losses"]
    assert len(losses) == len(one_losses) == 12
    assert ddp_summary["loss_fell"] and losses[-1] < 0.5 * losses[0], f"the DDP loss did not fall enough: {losses}"
    assert "loss fell: " in ddp_out, "rank 0 did not report the loss falling"
    assert abs(losses[0] - one_losses[0]) <= 1e-12 * abs(one_losses[0]), (
        f"first-step loss: DDP (mean over ranks) {losses[0]!r} != single process {one_losses[0]!r}")
    for step, (a, b) in enumerate(zip(losses, one_losses), 1):
        assert abs(a - b) <= 1e-5 * abs(b), (
            f"step {step}: DDP loss {a!r} != single-process loss {b!r}\n{losses}\n{one_losses}")

    saved = torch.load(ddp_grads, weights_only=True)
    one = torch.load(one_grads, weights_only=True)
    assert saved["world_size"] == 2 and saved["batch"] == 4 and one["batch"] == 8, (saved.keys(), one.keys())
    assert sorted(saved["grads"]) == sorted(one["grads"]), "the two runs saved different parameters"
    for name in sorted(one["grads"]):
        assert_close(saved["grads"][name], one["grads"][name], F64, factor=GRAD_FACTOR,
                     what=f"DDP gradient of {name} vs one process on the concatenated batch")


@pytest.mark.cuda
@pytest.mark.multi_gpu
@requires_two_gpus
def test_ddp_two_gpus(tmp_path):
    """torchrun --nproc_per_node=2 examples/ddp_train.py on cuda:0 and cuda:1 (NCCL)."""
    check_ddp(tmp_path, "cuda", torchrun_free_env())


@pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                    reason="needs torch.distributed with gloo")
def test_ddp_cpu_gloo(tmp_path):
    """The same on the CPU (two processes, gloo), one thread each; runs without any GPU."""
    check_ddp(tmp_path, "cpu", torchrun_free_env(OMP_NUM_THREADS="1"))
