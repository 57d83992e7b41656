"""Shared fixtures and helpers of the edsc_ext tests.

Test modules import the helpers with ``from conftest import ...`` (this folder is put on sys.path
below, so that works under any pytest import mode).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
import zlib
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Optional, Sequence

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Under pytest-xdist (-n N) every worker would start one CPU thread per core for torch's CPU ops
# (the float64 references), N times oversubscribing the machine; give each its share instead.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

# The project's shared test data (middlebury/, edsc/, video/; see its README): ../shared/data beside the
# checkout by default, else where EDSC_EXT_TEST_DATA or `pytest --test-data PATH` points.
DEFAULT_TEST_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def pytest_addoption(parser):
    parser.addoption("--test-data", default=None, metavar="PATH",
                     help="folder of the shared test data (middlebury/, edsc/, video/); default: $EDSC_EXT_TEST_DATA, "
                          "else ../shared/data beside the checkout")


def pytest_configure(config):
    value = config.getoption("--test-data", default=None)
    if value:  # before the test modules are imported, which read it through shared_data_path()
        os.environ["EDSC_EXT_TEST_DATA"] = os.path.abspath(value)


def shared_data_path(*parts: str) -> Path:
    """A path inside the shared test data folder."""
    return Path(os.environ.get("EDSC_EXT_TEST_DATA") or DEFAULT_TEST_DATA).joinpath(*parts)


def needs_shared_data(*parts: str):
    """Skips a test when shared_data_path(*parts) is absent, saying how to point the tests at the data."""
    path = shared_data_path(*parts)
    return pytest.mark.skipif(not path.exists(), reason=(
        f"{path} is absent: point EDSC_EXT_TEST_DATA or `pytest --test-data PATH` at the shared test data folder"))


# The test extra's optional packages (pyproject.toml), by import name, with the name pip installs.
OPTIONAL_PACKAGES = {"av": "av", "PIL": "pillow", "tqdm": "tqdm", "onnx": "onnx", "onnxscript": "onnxscript",
                     "onnxruntime": "onnxruntime", "skimage": "scikit-image"}


def install_name(module: str) -> str:
    """What pip installs for the import name ``module``, quoted with its minimum version where it has one."""
    from edsc_ext.apps.common import MINIMUM_VERSIONS

    name = OPTIONAL_PACKAGES.get(module, module)
    return f'"{name}>={MINIMUM_VERSIONS[module]}"' if module in MINIMUM_VERSIONS else name


def missing_packages(*modules: str) -> list:
    """Those of the import names ``modules`` that are not installed, or older than the apps need
    (edsc_ext.apps.common.MINIMUM_VERSIONS: such a package counts as missing, so its tests skip)."""
    from edsc_ext.apps.common import MINIMUM_VERSIONS, version_key

    def usable(module: str) -> bool:
        if importlib.util.find_spec(module) is None:
            return False
        minimum = MINIMUM_VERSIONS.get(module)
        if minimum is None:
            return True
        try:
            installed = importlib.metadata.version(OPTIONAL_PACKAGES.get(module, module))
        except importlib.metadata.PackageNotFoundError:  # importable without metadata: taken as it is
            return True
        return version_key(installed) >= version_key(minimum)

    return [m for m in modules if not usable(m)]


def needs_packages(*modules: str):
    """Skips a test unless the optional packages ``modules`` (import names) are installed; the reason names
    the missing ones and how to install them. tools/optional_packages.py runs the suite without each."""
    missing = missing_packages(*modules)
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}: pip install "
                                                    f"{' '.join(install_name(m) for m in missing)}")


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
requires_two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")

# ---------------------------------------------------------------------------------------------
# Devices: a test takes a ``device`` argument ("cpu" or "cuda") from one of these parametrisations.
# The CUDA cases carry the ``cuda`` mark (`-m cuda` selects them) and skip cleanly without a GPU;
# nothing here touches the GPU at collection time (the device is a string until the test runs).

CUDA = [pytest.mark.cuda, requires_cuda]
# Every device, the same cases on each.
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]

F64, F32, F16, BF16 = torch.float64, torch.float32, torch.float16, torch.bfloat16
DTYPE_IDS = {F64: "f64", F32: "f32", F16: "f16", BF16: "bf16"}


def dtypes(*values: torch.dtype) -> dict:
    """An axis for :func:`cases`: {"f32": torch.float32, ...}."""
    return {DTYPE_IDS[d]: d for d in values}


def named(*values) -> dict:
    """An axis for :func:`cases` whose values are their own ids (strings)."""
    return {str(v): v for v in values}


def cases(*axes: dict) -> dict:
    """The product of axes, each a dict id -> value, as {"id1-id2-...": (value1, value2, ...)}."""
    out = {}
    for combo in product(*(axis.items() for axis in axes)):
        out["-".join(name for name, _ in combo)] = tuple(value for _, value in combo)
    return out


def per_device(cpu: Optional[dict] = None, cuda: Optional[dict] = None) -> list:
    """Parameter sets of a test whose cases differ by device (shapes, dtypes, kernel paths): each
    CPU case as ("cpu", *values) with id "cpu-<id>", each CUDA case as ("cuda", *values) with id
    "cuda-<id>" and the CUDA marks. ``cpu`` and ``cuda`` map ids to tuples of values (see :func:`cases`)."""
    params = [pytest.param("cpu", *values, id=f"cpu-{name}") for name, values in (cpu or {}).items()]
    params += [pytest.param("cuda", *values, id=f"cuda-{name}", marks=CUDA) for name, values in (cuda or {}).items()]
    return params


def synchronize(device) -> None:
    """Waits for the device's work (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@pytest.fixture
def deterministic():
    """Turns torch.use_deterministic_algorithms(True) on for the test and restores the old setting."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)

ARG_NAMES = ("input", "vertical", "horizontal", "offset", "mask")
# Which of (vertical, horizontal, offset, mask) are given: all 16 combinations.
ALL_PRESENT = tuple(product((True, False), repeat=4))


def present_id(present) -> str:
    """A test id for a ``present`` tuple: "vhom" with "-" for each absent tensor."""
    return "".join(letter if given else "-" for letter, given in zip("vhom", present))


PADDING_MODES = ("zeros", "border")
LAYOUTS = ("contiguous", "channels_last")


def memory_format(layout: str):
    """The torch memory format of a layout name ("contiguous" or "channels_last")."""
    return torch.channels_last if layout == "channels_last" else torch.contiguous_format


def channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)

# Relative error ||actual - expected|| / ||expected|| allowed against a float64 reference computed
# from the same (rounded) inputs. Gradients get GRAD_FACTOR times more: they sum more terms.
TOLERANCES = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.float16: 3e-3,
    torch.bfloat16: 2e-2,
}
GRAD_FACTOR = 4.0


def subprocess_env(*paths, **changes) -> dict:
    """The environment for a Python subprocess that must import what this test process imports: the
    folder holding the edsc_ext imported here (the checkout, or an installed wheel) first, then
    ``paths`` (e.g. the checkout, for its tools), then the PYTHONPATH already set (where packages
    such as PyAV may have been installed on their own), and ``changes``."""
    import edsc_ext

    package_parent = str(Path(edsc_ext.__file__).resolve().parent.parent)
    entries = [package_parent, *map(str, paths), os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(e for e in entries if e)), **changes}


def seed_for(nodeid: str) -> int:
    """A stable seed for a test (Python's hash() is salted per process; crc32 is not)."""
    return zlib.crc32(nodeid.encode())


@pytest.fixture
def gen(request) -> torch.Generator:
    """A CPU generator seeded from the test's node id: fresh inputs per test, reproducible on rerun."""
    return torch.Generator().manual_seed(seed_for(request.node.nodeid))


@dataclass
class Case:
    """One deform_sepconv call: the five tensors (absent ones None) and the keyword arguments."""

    input: torch.Tensor
    vertical: Optional[torch.Tensor]
    horizontal: Optional[torch.Tensor]
    offset: Optional[torch.Tensor]
    mask: Optional[torch.Tensor]
    kwargs: dict = field(default_factory=dict)

    @property
    def tensors(self) -> tuple:
        return (self.input, self.vertical, self.horizontal, self.offset, self.mask)

    def replace(self, **changes) -> "Case":
        values = dict(zip(ARG_NAMES, self.tensors), kwargs=dict(self.kwargs))
        values.update(changes)
        return Case(**values)

    def map(self, fn) -> "Case":
        """Applies fn to every present tensor."""
        return self.replace(**{name: (None if t is None else fn(t)) for name, t in zip(ARG_NAMES, self.tensors)})

    def to(self, dtype=None, device=None) -> "Case":
        return self.map(lambda t: t.detach().to(device=device, dtype=dtype))

    def leaves(self, which: Sequence[str] = ARG_NAMES) -> "Case":
        """Fresh detached copies; those named in ``which`` (and present) require grad."""
        return self.replace(**{name: (None if t is None else t.detach().clone().requires_grad_(name in which))
                               for name, t in zip(ARG_NAMES, self.tensors)})

    def call(self, fn, **extra):
        return fn(*self.tensors, **{**self.kwargs, **extra})

    def grads(self) -> tuple:
        return tuple(None if t is None else t.grad for t in self.tensors)


def off_grid_offset(shape, offset_scale: float, generator: torch.Generator, outside: float = 0.0,
                    far: float = 0.0) -> torch.Tensor:
    """Random offsets whose fractional part lies in [0.1, 0.9], so that every sample position
    (an integer base position plus the offset) stays away from the integer grid, where the bilinear
    interpolation has kinks (and, in border mode, away from the clamping borders too).

    Integer parts are uniform in [-offset_scale, offset_scale]; a fraction ``outside`` of the
    values are instead pushed ``far`` (+- a few) away, well past the image border.
    """
    scale = int(round(offset_scale))
    integer = torch.randint(-scale, scale + 1, shape, generator=generator).double()
    frac = 0.1 + 0.8 * torch.rand(shape, generator=generator, dtype=torch.float64)
    if outside > 0 and far > 0:
        pushed = torch.rand(shape, generator=generator) < outside
        sign = torch.where(torch.rand(shape, generator=generator) < 0.5, -1.0, 1.0).double()
        jump = sign * (far + torch.randint(0, 4, shape, generator=generator).double())
        integer = torch.where(pushed, integer + jump, integer)
    return integer + frac


@pytest.fixture
def policy():
    """policy(**changes) sets the kernel policy (edsc_ext.kernel_policy) for the rest of the test."""
    import contextlib

    import edsc_ext

    with contextlib.ExitStack() as stack:
        yield lambda **changes: stack.enter_context(edsc_ext.kernel_policy(**changes))


def plans_of(case: "Case", padding_mode: str = "zeros", which: Sequence[str] = ARG_NAMES, **extra):
    """The kernel plans (edsc_ext._plan) of the call that forward_and_grads(case, padding_mode,
    which=which) makes: the backward plan is that of the gradients of ``which``."""
    import edsc_ext

    leaves = case.leaves(which)
    return edsc_ext._plan(*leaves.tensors, **{**leaves.kwargs, "padding_mode": padding_mode, **extra})


def make_inputs(N: int, C: int, H_in: int, W_in: int, KH: int, KW: int, padding=0, dilation=1,
                present: Sequence[bool] = (True, True, True, True), dtype: torch.dtype = torch.float64,
                device="cpu", offset_scale: float = 2.0, generator: Optional[torch.Generator] = None,
                outside: float = 0.1) -> Case:
    """Random inputs of one deform_sepconv call, made in float64 on the CPU with ``generator`` and
    then cast, so a case is the same on every device.

    ``present`` says which of (vertical, horizontal, offset, mask) are given. Offsets keep sample
    positions off the integer grid (see :func:`off_grid_offset`) and push a fraction ``outside`` of
    them past the image border. ``kwargs`` holds kernel_size, padding and dilation.
    """
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    ph, pw = (padding, padding) if isinstance(padding, int) else padding
    dh, dw = (dilation, dilation) if isinstance(dilation, int) else dilation
    h_out, w_out = H_in + 2 * ph - dh * (KH - 1), W_in + 2 * pw - dw * (KW - 1)
    assert h_out >= 0 and w_out >= 0, "bad test case"

    def randn(*shape):
        return torch.randn(shape, generator=generator, dtype=torch.float64)

    v, h, off, m = present
    inp = randn(N, C, H_in, W_in)
    vertical = randn(N, KH, h_out, w_out) if v else None
    horizontal = randn(N, KW, h_out, w_out) if h else None
    offset = (off_grid_offset((N, 2 * KH * KW, h_out, w_out), offset_scale, generator, outside,
                              far=max(H_in, W_in) + max(ph, pw) + 2) if off else None)
    mask = torch.rand((N, KH * KW, h_out, w_out), generator=generator, dtype=torch.float64) if m else None
    case = Case(inp, vertical, horizontal, offset, mask,
                kwargs=dict(kernel_size=(KH, KW), padding=padding, dilation=dilation))
    return case.to(dtype=dtype, device=device)


def default_grad_output(shape) -> torch.Tensor:
    """A fixed, varied grad_output whose values (multiples of 1/4 in [-3/4, 3/4]) are exact in
    every floating dtype, so the op and the float64 reference see the same one."""
    n = 1
    for s in shape:
        n *= s
    return (((torch.arange(n) % 7) - 3) / 4).to(torch.float64).view(shape)


def cuda_kernel_names(fn, part: str) -> list:
    """The names of the CUDA kernels that ``fn()`` launched and whose name contains ``part``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if part in e.name]


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64 (the absolute error when expected is 0)."""
    a = actual.detach().to("cpu", torch.float64)
    b = expected.detach().to("cpu", torch.float64)
    diff = torch.linalg.vector_norm(a - b).item()
    norm = torch.linalg.vector_norm(b).item()
    return diff / norm if norm > 0 else diff


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype = torch.float64,
                 factor: float = 1.0, what: str = "output") -> None:
    """Checks actual (any dtype/device) against a float64 expected with the tolerance of ``dtype``:
    the same shape and NaN pattern, a relative norm error under TOLERANCES[dtype] * factor, and
    every element within 10x that of the largest |expected| (an allclose that is not fooled by
    values that happen to be near 0)."""
    tol = TOLERANCES[dtype] * factor
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a = actual.detach().to("cpu", torch.float64)
    b = expected.detach().to("cpu", torch.float64)
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    assert torch.equal(nan_a, nan_b), (
        f"{what}: NaN at {nan_a.nonzero()[:5].tolist()} but expected NaN at {nan_b.nonzero()[:5].tolist()}")
    a, b = a[~nan_b], b[~nan_b]
    if b.numel() == 0:
        return
    err = rel_error(a, b)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:.3g} ({dtype})"
    scale = b.abs().max().item()
    worst = (a - b).abs().max().item()
    assert worst <= 10 * tol * max(scale, 1e-30), (
        f"{what}: max abs error {worst:.3g} > {10 * tol:.3g} * max|expected| = {10 * tol * scale:.3g}")


def assert_grads_close(actual: Sequence, expected: Sequence, dtype: torch.dtype = torch.float64,
                       factor: float = GRAD_FACTOR) -> None:
    """Per-argument gradients: None exactly where expected is None, else :func:`assert_close`."""
    for name, a, b in zip(ARG_NAMES, actual, expected):
        if b is None:
            assert a is None, f"grad of {name} should be None"
        else:
            assert a is not None, f"grad of {name} is missing"
            assert_close(a, b, dtype, factor=factor, what=f"grad of {name}")


# ---------------------------------------------------------------------------------------------
# Calls and their float64 references


def forward_and_grads(fn, case: Case, padding_mode: Optional[str] = "border", grad_output=None,
                      which: Sequence[str] = ARG_NAMES, **extra):
    """fn's output (detached) and the gradients of the present tensors named in ``which`` (None for
    the rest), on the case's device. ``padding_mode=None`` leaves it to fn's default; grad_output
    (default :func:`default_grad_output`) is moved to the output's device and dtype."""
    leaves = case.leaves(which)
    if padding_mode is not None:
        extra["padding_mode"] = padding_mode
    out = leaves.call(fn, **extra)
    if grad_output is None:
        grad_output = default_grad_output(out.shape)
    out.backward(grad_output.to(device=out.device, dtype=out.dtype))
    return out.detach(), leaves.grads()


def reference(case: Case, padding_mode: str = "border", **extra) -> torch.Tensor:
    """The float64 CPU reference output of a case (from its own, possibly rounded, values)."""
    from edsc_ext import reference as R

    return case.to(F64, "cpu").call(R.deform_sepconv, padding_mode=padding_mode, **extra)


def reference_and_grads(case: Case, padding_mode: str = "border", grad_output=None,
                        which: Sequence[str] = ARG_NAMES, **extra):
    """The float64 CPU reference of a case and its gradients (from the case's own, possibly rounded, values)."""
    from edsc_ext import reference as R

    return forward_and_grads(R.deform_sepconv, case.to(F64, "cpu"), padding_mode, grad_output, which, **extra)


def assert_matches_reference(case: Case, padding_mode: str, grad_output=None, run: Optional[Case] = None,
                             dtype: torch.dtype = F64) -> None:
    """The op's output and all gradients on ``run`` (default: ``case``) equal the float64
    reference's on ``case``, within the tolerance of ``dtype``."""
    import edsc_ext

    out, grads = forward_and_grads(edsc_ext.deform_sepconv, run if run is not None else case, padding_mode,
                                   grad_output)
    expected, expected_grads = reference_and_grads(case, padding_mode, grad_output)
    assert_close(out, expected, dtype, what=padding_mode)
    assert_grads_close(grads, expected_grads, dtype)


# ---------------------------------------------------------------------------------------------
# Split offsets, mixed precision, dispatched ops, CUDA graphs


def split(offset: torch.Tensor):
    """(dy, dx) of an interleaved (N, 2T, H, W) offset, each dense in the offset's memory format."""
    fmt = torch.channels_last if offset.is_contiguous(memory_format=torch.channels_last) and not \
        offset.is_contiguous() else torch.contiguous_format
    return offset[:, 0::2].contiguous(memory_format=fmt), offset[:, 1::2].contiguous(memory_format=fmt)


def mixed(case: Case, per_pixel_dtype, device="cpu", layout="contiguous", frame_dtype=F32) -> Case:
    """The case with a ``frame_dtype`` frame and ``per_pixel_dtype`` per-pixel tensors on ``device``."""
    fmt = memory_format(layout)
    return case.replace(**{name: None if t is None else t.to(device, frame_dtype if name == "input" else
                                                             per_pixel_dtype).contiguous(memory_format=fmt)
                           for name, t in zip(ARG_NAMES, case.tensors)})


class DispatchedOps(TorchDispatchMode):
    """Records the names of the ops dispatched inside the block (``.names``)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def capture_and_replay(case: Case, new_cases, padding_mode: str):
    """Captures forward + backward of the op on static copies of ``case`` (on CUDA) in one CUDA graph
    (after a warm-up on a side stream, as the CUDA-graph docs ask), then for each new case copies its
    values into the static tensors, replays, and returns the (output, gradients) read back."""
    import edsc_ext
    from edsc_ext.ops import normalize_args

    static = case.leaves()
    out_shape = case.input.shape[:2] + normalize_args(*case.tensors, **case.kwargs).output_size
    grad_output = default_grad_output(out_shape).to(device="cuda", dtype=case.input.dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            for t in static.tensors:
                t.grad = None
            static.call(edsc_ext.deform_sepconv, padding_mode=padding_mode).backward(grad_output)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    for t in static.tensors:
        t.grad = None  # so that backward allocates the gradients from the graph's pool
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = static.call(edsc_ext.deform_sepconv, padding_mode=padding_mode)
        static_out.backward(grad_output)

    results = []
    for new in new_cases:
        with torch.no_grad():
            for t, v in zip(static.tensors, new.tensors):
                t.copy_(v)
        graph.replay()
        torch.cuda.synchronize()
        results.append((static_out.detach().clone(), tuple(t.grad.clone() for t in static.tensors)))
    return results


# --------------------------------------------------------------------------------------------
# The apps' tests (test_interpolate.py, test_video_pipeline.py).


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests: the networks are small there, and one thread avoids contention
    on a shared machine (and is faster). A module asks for it with ``pytestmark``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """Checkpoints of randomly initialised EDSC_s and EDSC_m (seed 0): {name: path}."""
    from edsc_ext.models import EDSC_m, EDSC_s, save_checkpoint

    folder = tmp_path_factory.mktemp("weights")
    torch.manual_seed(0)
    paths = {}
    for name, model in (("EDSC_s", EDSC_s()), ("EDSC_m", EDSC_m())):
        paths[name] = folder / f"{name}.pth"
        save_checkpoint(model, paths[name])
    return paths


@pytest.fixture
def blend_network(monkeypatch):
    """The tool's network replaced by (1 - t) a + t b: for tests of timing and containers, where what the
    network computes does not matter (and a real one would be slow). Returns the list of the first frames'
    shapes, one a call."""
    from edsc_ext.apps import engine

    calls = []

    def blend(self, first, second, times):
        calls.append(tuple(first.shape))
        t = (times if times is not None else torch.full((first.shape[0],), 0.5)).view(-1, 1, 1, 1).to(first)
        return ((1 - t) * first + t * second).clamp(0, 1)

    monkeypatch.setattr(engine.Interpolator, "_network", blend)
    return calls


def run_cli(argv, capsys):
    """(exit code, stdout, stderr) of edsc-interpolate."""
    from edsc_ext.apps import interpolate

    rc = interpolate.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, err, *needles):
    """A CLI's bad input: exit code 2 and one line on stderr, naming each of ``needles``."""
    assert rc == 2, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "error:" in lines[0] and "Traceback" not in err, err
    for needle in needles:
        assert str(needle) in lines[0], (needle, lines[0])
