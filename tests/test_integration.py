"""The op inside training code: torch.compile (static and dynamic shapes, forward and backward),
CUDA graphs, autocast, deterministic algorithms, non-default streams and threads
(torch.library.opcheck: test_opcheck.py; memory layouts: test_op_inputs.py and test_op_paths.py).

Tests that take a ``device`` run on the CPU and, where a GPU is present, on CUDA (those cases carry
the ``cuda`` mark and skip cleanly without a GPU); the CUDA-graph and stream tests are CUDA-only, the
thread-count tests CPU-only.
"""

from __future__ import annotations

import threading

import pytest
import torch

import edsc_ext
from edsc_ext import reference as R

from conftest import (
    ARG_NAMES,
    BF16,
    DEVICES,
    F16,
    F32,
    F64,
    GRAD_FACTOR,
    PADDING_MODES,
    TOLERANCES,
    Case,
    assert_close,
    assert_grads_close,
    capture_and_replay,
    default_grad_output,
    forward_and_grads,
    make_inputs,
    plans_of,
    reference_and_grads,
    requires_cuda,
    synchronize,
)

OP = edsc_ext.deform_sepconv
FORWARD = torch.ops.edsc_ext.deform_sepconv_forward
BACKWARD = torch.ops.edsc_ext.deform_sepconv_backward

# ---------------------------------------------------------------------------------------------
# torch.compile


@pytest.fixture
def dynamo():
    """A fresh dynamo (no cached frames, zeroed counters) before and after the test."""
    import torch._dynamo
    import torch._dynamo.utils

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield torch._dynamo
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


class Synthesis(torch.nn.Module):
    """EDSC-style synthesis around the op, with pointwise work before and after it for the compiler
    to fuse, and a second, sepconv-style call (absent offset and mask) on the first one's output."""

    def __init__(self):
        super().__init__()
        self.adaptive = edsc_ext.nn.DeformSepConv2d(padding=1, padding_mode="border")

    def forward(self, frame, vertical, horizontal, offset, mask):
        out = self.adaptive(frame * 1.5, vertical, horizontal, offset * 0.5, torch.sigmoid(mask))
        out = out + 0.1 * out.square()
        return edsc_ext.deform_sepconv(out, vertical, horizontal, padding=1)


# (N, C, H, W) of the two calls; 3x3 kernels, padding 1, so H_out = H. No size equals another
# (or a channel count: KH=3, KH*KW=9, 2*KH*KW=18), so duck sizing does not tie them together.
SHAPE_A = (2, 4, 11, 13)
SHAPE_B = (5, 6, 14, 12)


def _compile_case(shape, device, gen) -> Case:
    return make_inputs(*shape, 3, 3, 1, 1, dtype=F32, device=device, generator=gen, offset_scale=2)


def _run_module(module, case: Case, mark_dynamic: bool = False):
    leaves = case.leaves()
    if mark_dynamic:
        import torch._dynamo

        # Batch, height and width of every tensor, and the input's channels.
        for t in leaves.tensors:
            for dim in (0, 2, 3):
                torch._dynamo.mark_dynamic(t, dim)
        torch._dynamo.mark_dynamic(leaves.input, 1)
    out = module(*leaves.tensors)
    out.backward(default_grad_output(out.shape).to(device=out.device, dtype=out.dtype))
    return out.detach(), leaves.grads()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shapes", ["static", "dynamic", "mark_dynamic"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_matches_eager(dynamo, gen, backend, shapes, device):
    """fullgraph=True (a graph break raises), one frame compiled, forward and all five gradients as
    in eager mode; with dynamic shapes a second call of other sizes (batch, channels, height and
    width) reuses the graph instead of recompiling."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend(backend)
    eager = Synthesis()
    compiled = torch.compile(Synthesis(), backend=counter, fullgraph=True,
                             dynamic={"static": False, "dynamic": True, "mark_dynamic": None}[shapes])
    calls = [SHAPE_A, SHAPE_A] if shapes == "static" else [SHAPE_A, SHAPE_B]
    for shape in calls:
        case = _compile_case(shape, device, gen)
        out, grads = _run_module(compiled, case, mark_dynamic=shapes == "mark_dynamic")
        expected, expected_grads = _run_module(eager, case)
        synchronize(device)
        assert out.shape == expected.shape and out.dtype == F32 and out.device.type == device
        assert_close(out, expected, F32)
        assert_grads_close(grads, expected_grads, F32)
    assert counter.frame_count == 1, f"compiled {counter.frame_count} frames (recompiled)"
    assert counter.op_count > 0
    assert not dynamo.utils.counters["graph_break"], dict(dynamo.utils.counters["graph_break"])


@pytest.mark.parametrize("device", DEVICES)
def test_compile_channels_last(dynamo, gen, device):
    """A compiled call on channels_last tensors gives the eager values and the eager memory format
    (which the fake kernel has to predict)."""
    case = make_inputs(2, 4, 11, 13, 3, 3, 1, 1, dtype=F32, device=device, generator=gen).map(
        lambda t: t.contiguous(memory_format=torch.channels_last))

    def fn(*tensors):
        return OP(*tensors, padding=1, padding_mode="zeros") * 2

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    out, grads = _run_module(compiled, case)
    expected, expected_grads = _run_module(fn, case)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert out.stride() == expected.stride()
    assert_close(out, expected, F32)
    assert_grads_close(grads, expected_grads, F32)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_under_autocast(dynamo, gen, device):
    """AMP + torch.compile: an fp32 frame with fp16 kernels, offsets and mask under autocast
    compiles without a graph break and runs in fp32, as in eager mode."""
    case = make_inputs(2, 4, 11, 13, 3, 3, 1, 1, device=device, generator=gen)
    case = case.replace(**{name: t.to(F32 if name == "input" else F16) for name, t in zip(ARG_NAMES, case.tensors)})
    module = Synthesis()
    compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
    results = []
    for fn in (compiled, module):
        leaves = case.leaves()
        with torch.autocast(device, dtype=F16):
            out = fn(*leaves.tensors)
        out.backward(default_grad_output(out.shape).to(device=out.device, dtype=out.dtype))  # outside, as AMP does
        results.append((out.detach(), leaves.grads()))
    (out, grads), (expected, expected_grads) = results
    assert out.dtype == expected.dtype == F32
    assert [g.dtype for g in grads] == [t.dtype for t in case.tensors]
    assert_close(out, expected, F32)
    for name, g, e in zip(ARG_NAMES, grads, expected_grads):
        assert_close(g, e.double(), g.dtype, what=f"grad of {name}")
    assert not dynamo.utils.counters["graph_break"], dict(dynamo.utils.counters["graph_break"])


# ---------------------------------------------------------------------------------------------
# CUDA graphs


# channels_last takes the warp-staged kernels (5x5, 3 channels), whose backward opts in to more
# than 48 KB of shared memory with a host call (once per device and kernel): capture must still work.
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("mode", ["default", "deterministic"])
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.cuda
@requires_cuda
def test_cuda_graph_forward_backward(gen, request, padding_mode, mode, layout):
    if mode == "deterministic":
        request.getfixturevalue("deterministic")
    config = (2, 5, 24, 26, 3, 3, 1, 1) if layout == "contiguous" else (2, 3, 24, 40, 5, 5, 2, 1)
    first, *new_cases = [make_inputs(*config, dtype=F32, device="cuda", generator=gen) for _ in range(3)]
    if layout == "channels_last":
        first, *new_cases = [c.map(lambda t: t.contiguous(memory_format=torch.channels_last))
                             for c in [first, *new_cases]]
    results = capture_and_replay(first, new_cases, padding_mode)
    for new, (out, grads) in zip(new_cases, results):
        expected, expected_grads = reference_and_grads(new, padding_mode)
        assert_close(out, expected, F32)
        assert_grads_close(grads, expected_grads, F32)
        eager, eager_grads = forward_and_grads(OP, new, padding_mode)
        assert_close(out, eager.double(), F32)
    assert not torch.equal(results[0][0], results[1][0])  # the replays did see the new values


# ---------------------------------------------------------------------------------------------
# Autocast: mixed floating dtypes are promoted to the widest one; gradients in each tensor's own dtype


# (input, vertical, horizontal, offset, mask) dtypes -> the dtype the op computes in and returns.
AUTOCAST_CASES = {
    "f32-frame_f16-rest": ((F32, F16, F16, F16, F16), F32),
    "all-f16": ((F16,) * 5, F16),
    "all-bf16": ((BF16,) * 5, BF16),
    "f32-frame_bf16-rest": ((F32, BF16, BF16, BF16, BF16), F32),
    "f16-frame_bf16-rest": ((F16, BF16, BF16, BF16, BF16), F32),
    "bf16_f16-offset": ((BF16, BF16, BF16, F16, BF16), F32),
    "f16_f32-mask": ((F16, F16, F16, F16, F32), F32),
    "all-f32": ((F32,) * 5, F32),
    "f64-frame_f32-rest": ((F64, F32, F32, F32, F32), F64),
}


def _with_dtypes(case: Case, dtypes) -> Case:
    return case.replace(**{name: (None if t is None else t.to(dtype))
                           for name, t, dtype in zip(ARG_NAMES, case.tensors, dtypes)})


def _grad_tolerance_factor(arg_dtype, compute_dtype) -> float:
    """A gradient is computed in compute_dtype and then rounded to arg_dtype: the coarser counts."""
    worst = max(TOLERANCES[arg_dtype], TOLERANCES[compute_dtype])
    return GRAD_FACTOR * worst / TOLERANCES[arg_dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("autocast_dtype", [F16, BF16], ids=["autocast-f16", "autocast-bf16"])
@pytest.mark.parametrize("combo", list(AUTOCAST_CASES), ids=list(AUTOCAST_CASES))
def test_autocast_promotes_to_widest(gen, combo, autocast_dtype, device):
    dtypes, result_dtype = AUTOCAST_CASES[combo]
    base = make_inputs(2, 3, 7, 8, 3, 3, 1, 1, device=device, generator=gen)
    case = _with_dtypes(base, dtypes)
    leaves = case.leaves()
    with torch.autocast(device, dtype=autocast_dtype):
        out = leaves.call(OP, padding_mode="border")
    assert out.dtype == result_dtype and out.device.type == device
    out.backward(default_grad_output(out.shape).to(device=device, dtype=out.dtype))
    synchronize(device)
    for name, t in zip(ARG_NAMES, leaves.tensors):
        assert t.grad is not None and t.grad.dtype == t.dtype, (
            f"grad of {name}: {None if t.grad is None else t.grad.dtype}, expected {t.dtype}")
    expected, expected_grads = reference_and_grads(case, "border")
    assert_close(out, expected, result_dtype)
    for name, g, e, t in zip(ARG_NAMES, leaves.grads(), expected_grads, case.tensors):
        assert_close(g, e, t.dtype, factor=_grad_tolerance_factor(t.dtype, result_dtype), what=f"grad of {name}")


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_module_and_absent_tensors(gen, device):
    """SepConv style (no offset, no mask) through the module: an fp32 frame with fp16 kernels runs
    in fp32 under autocast and gives the fp16 kernels fp16 gradients."""
    base = make_inputs(2, 3, 9, 10, 5, 5, 2, 1, present=(True, True, False, False), device=device, generator=gen)
    case = _with_dtypes(base, (F32, F16, F16, None, None))
    module = edsc_ext.nn.DeformSepConv2d(padding=2)
    leaves = case.leaves()
    with torch.autocast(device, dtype=F16):
        out = module(*leaves.tensors)
    assert out.dtype == F32
    out.backward(default_grad_output(out.shape).to(device=device, dtype=out.dtype))
    assert [t.grad.dtype for t in leaves.tensors[:3]] == [F32, F16, F16]
    expected, expected_grads = forward_and_grads(R.deform_sepconv, case.to(F64, "cpu"), "zeros", padding=2)
    assert_close(out, expected, F32)
    for name, g, e, t in zip(ARG_NAMES[:3], leaves.grads(), expected_grads, case.tensors):
        assert_close(g, e, t.dtype, factor=_grad_tolerance_factor(t.dtype, F32), what=f"grad of {name}")


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_dtypes_rejected_outside_autocast(gen, device):
    case = make_inputs(1, 2, 5, 5, 3, 3, 1, 1, dtype=F32, device=device, generator=gen)
    mixed = case.replace(mask=case.mask.half())
    with pytest.raises(TypeError, match="mask"):
        mixed.call(OP)
    with torch.autocast(device, dtype=F16, enabled=False):
        with pytest.raises(TypeError, match="mask"):
            mixed.call(OP)
    with pytest.raises(TypeError, match="horizontal"):
        case.replace(horizontal=case.horizontal.to(BF16)).call(OP)


# ---------------------------------------------------------------------------------------------
# Deterministic algorithms


def _assert_bitwise_repeatable(case: Case, padding_mode: str, runs: int = 5):
    results = [forward_and_grads(OP, case, padding_mode) for _ in range(runs)]
    first_out, first_grads = results[0]
    for k, (out, grads) in enumerate(results[1:], start=2):
        assert torch.equal(out, first_out), f"output of run {k} differs from run 1"
        for name, g, g0 in zip(ARG_NAMES, grads, first_grads):
            assert (g is None) == (g0 is None), f"grad of {name}: present in one run only"
            assert g is None or torch.equal(g, g0), f"grad of {name}: run {k} differs from run 1"
    return first_out, first_grads


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_deterministic_cpu(gen, deterministic, padding_mode):
    """The CPU backward is deterministic anyway; the flag must not make it raise or change it."""
    case = make_inputs(2, 6, 40, 44, 3, 3, 1, 1, dtype=F32, generator=gen, offset_scale=1)
    out, grads = _assert_bitwise_repeatable(case, padding_mode)
    expected, expected_grads = reference_and_grads(case, padding_mode)
    assert_close(out, expected, F32)
    assert_grads_close(grads, expected_grads, F32)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("config", [(1, 6, 21, 23, 5, 5, 2, 1), (2, 6, 21, 23, 5, 5, 2, 1), (17, 2, 9, 10, 3, 3, 1, 1)],
                         ids=["n1", "n2", "n17"])
@pytest.mark.parametrize("backward", ["rows", "banded", "two-pass"])
def test_cpu_backward_independent_of_threads(gen, monkeypatch, config, padding_mode, dtype, backward):
    """The CPU backward splits every image into bands of output rows fixed by the shape alone (16
    tasks in all; a single band per image from N = 16 on), each adding into a plane of its own,
    and sums the bands' planes in band order, row by row (sample_rows, these calls' fewer than 8
    channels) or pixel by pixel (kernel_policy(cpu_sample_rows=False)); without room for the bands'
    scratch planes (cpu_scratch_mb=0 here) the pixel-wise backward runs a parameter pass and a pass over
    (n, channel) planes. Every way 1, 3 and 8 threads give the same gradients, to the last bit."""
    policy = {"rows": {}, "banded": dict(cpu_sample_rows=False),
              "two-pass": dict(cpu_scratch_mb=0, cpu_sample_rows=False)}[backward]
    case = make_inputs(*config, dtype=dtype, generator=gen, offset_scale=3)
    threads = torch.get_num_threads()
    results = []
    with edsc_ext.kernel_policy(**policy):
        # From N = 16 on every image is one band, which needs no scratch.
        planned = ("sample_rows" if backward == "rows" else
                   "pixels_fused" if backward == "banded" or config[0] >= 16 else "pixels_two_pass")
        assert plans_of(case, padding_mode).backward.startswith(planned + "/")
        try:
            for count in (1, 3, 8):
                torch.set_num_threads(count)
                results.append(forward_and_grads(OP, case, padding_mode))
        finally:
            torch.set_num_threads(threads)
    first = results[0]
    for other in results[1:]:
        assert torch.equal(first[0], other[0])
        for name, g, g0 in zip(ARG_NAMES, first[1], other[1]):
            assert torch.equal(g, g0), name
    expected, expected_grads = reference_and_grads(case, padding_mode)
    assert_grads_close(first[1], expected_grads, dtype)


# Configurations with many samples landing on the same input pixels (small offsets, big kernels,
# many channels), where float atomics would add in a different order from run to run.
DETERMINISM_CONFIGS = [
    (2, 8, 48, 52, 5, 5, 2, 1),
    (1, 3, 64, 72, 4, 3, (2, 1), 1),
    (1, 2, 6, 40, 1, 20, (0, 10), 1),  # the wide-kernel backward
]


@pytest.mark.parametrize("input_grad_path", ["default", "global"])
@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16], ids=["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("config", DETERMINISM_CONFIGS, ids=["5x5", "4x3", "1x20"])
@pytest.mark.cuda
@requires_cuda
def test_deterministic_cuda_bitwise(gen, deterministic, monkeypatch, config, padding_mode, dtype, input_grad_path):
    """5 runs give bitwise equal outputs and gradients, which still match the float64 reference
    (within float32 tolerance for float32/float64, the dtype's own for the half types); the
    kernel_policy(input_grad_tile=False) must not bypass the deterministic path."""
    case = make_inputs(*config, dtype=dtype, device="cuda", generator=gen, offset_scale=1)
    with edsc_ext.kernel_policy(input_grad_tile=input_grad_path != "global"):
        backward = plans_of(case, padding_mode).backward
        tiled = input_grad_path != "global" and dtype != F64  # float64's float tile is not deterministic
        prefetch = "_prefetch" if tiled and config[4:6] == (5, 5) else ""
        assert backward == ("tiled" if tiled else "pixels") + prefetch + "+fixed_point", backward
        out, grads = _assert_bitwise_repeatable(case, padding_mode)
    tol_dtype = F32 if dtype in (F32, F64) else dtype
    expected, expected_grads = reference_and_grads(case, padding_mode)
    assert_close(out, expected, tol_dtype)
    assert_grads_close(grads, expected_grads, tol_dtype)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.cuda
@requires_cuda
def test_deterministic_cuda_bitwise_without_offset(gen, deterministic, padding_mode, dtype):
    """sepconv (no offsets, no mask): the grid-tap kernels gather the input gradient instead of
    adding it with atomics, and the fixed-point path is skipped; still 5 bitwise equal runs that
    match the reference, border mode's folding of clamped taps onto the edges included."""
    case = make_inputs(1, 3, 40, 44, 13, 13, 6, present=(True, True, False, False), dtype=dtype, device="cuda",
                       generator=gen)
    out, grads = _assert_bitwise_repeatable(case, padding_mode)
    expected, expected_grads = reference_and_grads(case, padding_mode)
    assert_close(out, expected, dtype)
    assert_grads_close(grads, expected_grads, dtype)


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.cuda
@requires_cuda
def test_deterministic_cuda_non_finite_offset(gen, deterministic, padding_mode):
    """A NaN/inf offset makes its output pixel NaN; when those pixels get no gradient, the
    deterministic input gradient is the one of the clean case (as on the default path)."""
    case = make_inputs(2, 5, 16, 17, 3, 3, 1, 1, dtype=F32, device="cuda", generator=gen)
    offset = case.offset.clone()
    offset[1, 9, 3, 2] = float("nan")
    offset[0, 0, 5, 6] = float("inf")
    poisoned = case.replace(offset=offset)
    grad_output = torch.ones((2, 5, 16, 17), dtype=F64)
    grad_output[1, :, 3, 2] = 0
    grad_output[0, :, 5, 6] = 0
    out, grads = forward_and_grads(OP, poisoned, padding_mode, grad_output)
    assert torch.isnan(out[1, :, 3, 2]).all() and torch.isnan(out[0, :, 5, 6]).all()
    _, again = forward_and_grads(OP, poisoned, padding_mode, grad_output)
    assert torch.equal(grads[0], again[0])
    _, expected_grads = reference_and_grads(case, padding_mode, grad_output)
    assert_close(grads[0], expected_grads[0], F32, factor=GRAD_FACTOR, what="grad of input")


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.cuda
@requires_cuda
def test_default_path_correct_without_flag(gen, padding_mode):
    """Without the flag (the fast path) the results are right, and agree with the deterministic path."""
    assert not torch.are_deterministic_algorithms_enabled()
    case = make_inputs(*DETERMINISM_CONFIGS[0], dtype=F32, device="cuda", generator=gen, offset_scale=1)
    out, grads = forward_and_grads(OP, case, padding_mode)
    expected, expected_grads = reference_and_grads(case, padding_mode)
    assert_close(out, expected, F32)
    assert_grads_close(grads, expected_grads, F32)
    torch.use_deterministic_algorithms(True)
    try:
        det_out, det_grads = forward_and_grads(OP, case, padding_mode)
    finally:
        torch.use_deterministic_algorithms(False)
    assert_close(det_out, out.double(), F32)
    assert_grads_close(det_grads, [g.double() for g in grads], F32)


# ---------------------------------------------------------------------------------------------
# Streams


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.cuda
@requires_cuda
def test_side_stream_records_nothing_on_default_stream(gen, padding_mode):
    """Inputs produced on a side stream behind a long sleep, the op (forward and backward) called
    there: right values, and nothing was enqueued on the default stream (it is idle while the side
    stream still works) nor waited for on the host (the side stream is still busy on return)."""
    case = make_inputs(2, 4, 24, 25, 3, 3, 1, 1, dtype=F32, device="cuda", generator=gen)
    grad_output = default_grad_output((2, 4, 24, 25)).to(device="cuda", dtype=F32)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    # Two warm-ups (kernels loaded; the side stream's memory pool grown to hold two calls' tensors,
    # so that the timed call allocates nothing from the driver), then the timed call.
    for sleep in (0, 0, 1_000_000_000):
        with torch.cuda.stream(side):
            assert torch.cuda.current_stream() == side
            if sleep:
                torch.cuda._sleep(sleep)  # about half a second
            on_side = case.map(lambda t: t * 2).leaves()  # written on the side stream, after the sleep
            out = on_side.call(OP, padding_mode=padding_mode)
            out.backward(grad_output)
            assert torch.cuda.current_stream() == side
        if sleep:
            assert torch.cuda.default_stream().query(), "the op enqueued work on the default stream"
            assert not side.query(), "the side stream finished early: something synchronized with the host"
        side.synchronize()
    expected, expected_grads = reference_and_grads(case.map(lambda t: t * 2), padding_mode, grad_output)
    assert_close(out, expected, F32)
    assert_grads_close(on_side.grads(), expected_grads, F32)


# ---------------------------------------------------------------------------------------------
# Threads


THREAD_CONFIGS = [
    (2, 3, 20, 22, 3, 3, 1, 1),
    (1, 5, 17, 30, 5, 5, 2, 1),
]


@pytest.mark.parametrize("device", DEVICES)
def test_two_threads(gen, device):
    """Two threads calling the op at once (on CUDA each on its own stream), several times each,
    on different shapes: every result is right."""
    iterations = 4
    cases = [[make_inputs(*config, dtype=F32, device=device, generator=gen) for _ in range(iterations)]
             for config in THREAD_CONFIGS]
    synchronize(device)
    results = [[None] * iterations for _ in THREAD_CONFIGS]
    errors = []
    barrier = threading.Barrier(len(THREAD_CONFIGS))

    def work(k):
        try:
            stream = torch.cuda.Stream() if device == "cuda" else None
            barrier.wait()
            for i, case in enumerate(cases[k]):
                if stream is None:
                    results[k][i] = forward_and_grads(OP, case, PADDING_MODES[(k + i) % 2])
                else:
                    with torch.cuda.stream(stream):
                        results[k][i] = forward_and_grads(OP, case, PADDING_MODES[(k + i) % 2])
            if stream is not None:
                stream.synchronize()
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(THREAD_CONFIGS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]
    for k in range(len(THREAD_CONFIGS)):
        for i, case in enumerate(cases[k]):
            out, grads = results[k][i]
            expected, expected_grads = reference_and_grads(case, PADDING_MODES[(k + i) % 2])
            assert_close(out, expected, F32, what=f"thread {k} call {i}")
            assert_grads_close(grads, expected_grads, F32)


def test_parallel_and_deterministic(gen):
    """An image large enough to split over CPU threads: correct, bitwise repeatable, and the same
    with one thread as with several."""
    case = make_inputs(2, 6, 40, 44, 3, 3, 1, 1, generator=gen, dtype=F32)
    out, grads = forward_and_grads(OP, case, "zeros")
    expected, expected_grads = reference_and_grads(case, "zeros")
    assert_close(out, expected, F32)
    assert_grads_close(grads, expected_grads, F32)
    again, grads_again = forward_and_grads(OP, case, "zeros")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single, grads_single = forward_and_grads(OP, case, "zeros")
    finally:
        torch.set_num_threads(threads)
    for a, b, c in zip((out,) + grads, (again,) + grads_again, (single,) + grads_single):
        assert torch.equal(a, b) and torch.equal(a, c)
