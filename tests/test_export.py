"""Deployment on the CPU and (with a GPU) on CUDA: torch.export (and save/load in a fresh process),
AOTInductor packages run from Python and from the C++ program edsc_ext_aoti_run (the CMake build's), and
ONNX (edsc_ext.models.onnx) run by onnxruntime, each against eager PyTorch.

Each model is exported once and compiled once per device (module-scoped fixtures): AOTInductor compiles
C++, about a minute per EDSC model on two cores. The ONNX tests need the packages onnx, onnxscript and
onnxruntime (the ``deploy`` extra) and skip without them. The C++ runner tests need edsc_ext_aoti_run built
against this torch, named by $EDSC_EXT_AOTI_RUNNER; they skip without it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest
import torch

import edsc_ext
from edsc_ext.models import EDSC, compat, networks

from conftest import ALL_PRESENT, PADDING_MODES, present_id, requires_cuda, subprocess_env

REPO = Path(__file__).resolve().parent.parent
Dim = torch.export.Dim
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
# Exported program against eager: the same kernels run; EDSC's program computes a few of the network's
# float32 operations in another order.
EXPORT_TOL = 1e-6
# AOTInductor against eager: Inductor fuses and reorders the network's float32 arithmetic.
AOTI_TOL = 1e-4
# Outputs of the ONNX model against PyTorch float32 (the bound).
ONNX_TOL = 1e-4
RUNNER_ENV = "EDSC_EXT_AOTI_RUNNER"
KERNEL = (3, 2)
DILATIONS = (1, (2, 3))


@pytest.fixture(scope="module", autouse=True)
def float32_convolutions():
    """CUDA convolutions in float32 instead of cuDNN's default TF32, eager and compiled alike, so that the
    tolerances above measure compilation, not TF32's 10-bit mantissa."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = saved


def to(args: tuple, device: str) -> tuple:
    return tuple(a.to(device) for a in args)


class OpModule(torch.nn.Module):
    """deform_sepconv calls of both padding modes and two dilations, with the tensors of ``present``
    given (forward takes, per dilation, the present ones of vertical, horizontal, offset, mask)."""

    def __init__(self, present):
        super().__init__()
        self.present = tuple(present)
        self.layers = torch.nn.ModuleList(
            edsc_ext.nn.DeformSepConv2d(KERNEL, padding=(2, 1), dilation=d, padding_mode=mode)
            for mode in PADDING_MODES for d in DILATIONS)
        self.eval()

    def forward(self, input, *tensors):
        per_call = sum(self.present)
        outs = []
        for k, layer in enumerate(self.layers):
            given = iter(tensors[(k % len(DILATIONS)) * per_call:][:per_call])
            outs.append(layer(input, *(next(given) if p else None for p in self.present)))
        return tuple(outs)


def op_inputs(present, n=2, c=3, h=7, w=8, seed=0):
    """Input and, per dilation, the present tensors; offsets of a few pixels, so that many taps fall
    outside the frame (where the padding modes differ)."""
    g = torch.Generator().manual_seed(seed)
    kh, kw = KERNEL
    args = [torch.randn(n, c, h, w, generator=g)]
    for d in DILATIONS:
        dh, dw = (d, d) if isinstance(d, int) else d
        ho, wo = h + 4 - dh * (kh - 1), w + 2 - dw * (kw - 1)
        shapes = ((kh,), (kw,), (2 * kh * kw,), (kh * kw,))
        for (ch,), p, scale in zip(shapes, present, (1, 1, 3, 1)):
            if p:
                args.append(torch.randn(n, ch, ho, wo, generator=g) * scale)
    return tuple(args)


def op_dynamic_shapes(args):
    """Every dimension but the channels dynamic (Dim.AUTO: export finds which sizes are equal), in the
    structure of OpModule.forward(input, *tensors)."""
    spatial = {0: Dim.AUTO, 2: Dim.AUTO, 3: Dim.AUTO}
    return (spatial, (spatial,) * (len(args) - 1)) if len(args) > 1 else (spatial,)


def edsc_model(multiple: bool, sampling: str = "compat") -> EDSC:
    """A randomly initialised EDSC whose offset heads predict a few pixels (random ones predict ~0)."""
    torch.manual_seed(1)
    model = EDSC(multiple=multiple, sampling=sampling).eval()
    with torch.no_grad():
        for name in ("moduleOffset1x", "moduleOffset1y", "moduleOffset2x", "moduleOffset2y"):
            getattr(model, name)[-1].bias.normal_(0, 3)
    return model


def edsc_inputs(multiple: bool, n: int, h: int, w: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    args = (torch.rand(n, 3, h, w, generator=g), torch.rand(n, 3, h, w, generator=g))
    return args + ((torch.rand(n, generator=g) * 0.8 + 0.1,) if multiple else ())


def edsc_dynamic_shapes(multiple: bool):
    batch, height, width = Dim("batch", min=1, max=64), Dim("h", min=2, max=128) * 32, Dim("w", min=2, max=128) * 32
    frame = {0: batch, 2: height, 3: width}
    return (frame, frame) + (({0: batch},) if multiple else ())


def eager(model, args):
    with torch.no_grad():
        return model(*args)


def max_error(actual, expected) -> float:
    if isinstance(expected, torch.Tensor):
        expected = (expected,)
    if not isinstance(actual, (tuple, list)):
        actual = (actual,)
    assert len(actual) == len(expected)
    errors = []
    for a, e in zip(actual, expected):
        a = torch.as_tensor(a)
        assert a.shape == e.shape
        errors.append((a - e).abs().max().item() if e.numel() else 0.0)
    return max(errors)


def run_fresh(code: str) -> str:
    """Runs ``code`` in a new Python process that imports edsc_ext from this checkout, with float32 CUDA
    convolutions as here (float32_convolutions); returns stdout."""
    env = subprocess_env(REPO)
    code = "import torch\ntorch.backends.cudnn.allow_tf32 = False\n" + textwrap.dedent(code)
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


# --------------------------------------------------------------------------------------------
# The deployed models, each exported and compiled once per device and shared by the tests below


@dataclass
class Deployed:
    """A model on a device, its ExportedProgram (from an example of batch 2) and the inputs the deployed forms
    are compared on (other batch sizes and sizes than the example's), with eager's outputs for them."""

    model: torch.nn.Module
    program: torch.export.ExportedProgram
    runs: list
    expected: list


def export_model(name: str, device: str, sampling: str = "compat") -> Deployed:
    """``name``: "op" (OpModule with every tensor given) or "EDSC_s" / "EDSC_m"."""
    if name == "op":
        present = (True,) * 4
        model = OpModule(present)
        example = op_inputs(present)
        dynamic_shapes = op_dynamic_shapes(example)
        runs = [op_inputs(present, seed=1), op_inputs(present, n=1, h=9, w=5, seed=2)]
    else:
        multiple = name == "EDSC_m"
        model = edsc_model(multiple, sampling).to(device)
        example = edsc_inputs(multiple, 2, 64, 64)
        dynamic_shapes = edsc_dynamic_shapes(multiple)
        runs = [edsc_inputs(multiple, 1, 64, 96, seed=1), edsc_inputs(multiple, 3, 96, 64, seed=2)]
    example, runs = to(example, device), [to(args, device) for args in runs]
    program = torch.export.export(model, example, dynamic_shapes=dynamic_shapes)
    return Deployed(model, program, runs, [eager(model, args) for args in runs])


@pytest.fixture(scope="module")
def exported():
    """exported(name, device, sampling="compat") -> Deployed, exported once per test module."""
    cache = {}

    def get(name, device, sampling="compat"):
        if (name, device, sampling) not in cache:
            cache[name, device, sampling] = export_model(name, device, sampling)
        return cache[name, device, sampling]

    return get


def links_libstdcxx_dynamically(cxx: str, folder: Path) -> Optional[bool]:
    """Whether the C++ compiler ``cxx`` links a shared library against libstdc++.so, as torch's own
    libraries are (None: it cannot build one, or readelf is missing to tell)."""
    source, library = folder / "probe.cpp", folder / "probe.so"
    source.write_text("#include <string>\nstd::string edsc_ext_probe(int v) { return std::to_string(v); }\n")
    try:
        built = subprocess.run([cxx, "-shared", "-fPIC", str(source), "-o", str(library)], capture_output=True)
        if built.returncode != 0:
            return None
        dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return "libstdc++.so" in dynamic.stdout


def inductor_cxx() -> str:
    """The C++ compiler AOTInductor builds packages with ($CXX, else g++)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
        return get_cpp_compiler()
    except (ImportError, RuntimeError):
        return torch._inductor.config.cpp.cxx[-1]


@pytest.fixture(scope="module")
def aoti_compiler(tmp_path_factory) -> str:
    """The C++ compiler for the AOTInductor packages: inductor's own choice unless it links libstdc++
    statically into shared libraries (seen on a machine whose default g++ does): a package built so carries
    a second copy of the library, and aoti_load_package crashed with a segmentation fault. Then the first
    of /usr/bin/g++ and /usr/bin/c++ that links it dynamically; with none, the AOTInductor tests skip."""
    folder = tmp_path_factory.mktemp("cxx-probe")
    default = inductor_cxx()
    if links_libstdcxx_dynamically(default, folder) is not False:
        return default
    for candidate in ("/usr/bin/g++", "/usr/bin/c++"):
        if os.path.exists(candidate) and links_libstdcxx_dynamically(candidate, folder):
            return candidate
    pytest.skip(f"the C++ compiler {default} links libstdc++ statically into shared libraries, and an "
                "AOTInductor package built so crashes when loaded; set CXX to a compiler that links it "
                "dynamically (README, Deployment)")


def test_aoti_compiler_probe_tells_static_libstdcxx(tmp_path):
    """The probe behind aoti_compiler: g++ links libstdc++ dynamically; the same g++ told to link it
    statically (as the compiler that crashed the packages did by default) is refused."""
    if shutil.which("g++") is None or shutil.which("readelf") is None:
        pytest.skip("needs g++ and readelf")
    assert links_libstdcxx_dynamically("g++", tmp_path) is True
    static = tmp_path / "static-g++"
    static.write_text('#!/bin/sh\nexec g++ -static-libstdc++ "$@"\n')
    static.chmod(0o755)
    assert links_libstdcxx_dynamically(str(static), tmp_path) is False
    assert links_libstdcxx_dynamically(str(tmp_path / "no-such-compiler"), tmp_path) is None


@pytest.fixture(scope="module")
def aoti_package(exported, aoti_compiler, tmp_path_factory):
    """aoti_package(name, device) -> path of the AOTInductor package of exported(name, device), compiled once
    per test module (a minute per EDSC on two cores) with ``aoti_compiler``."""
    folder, cache = tmp_path_factory.mktemp("aoti"), {}

    def get(name, device):
        if (name, device) not in cache:
            with torch._inductor.config.patch({"cpp.cxx": (None, aoti_compiler)}):
                cache[name, device] = torch._inductor.aoti_compile_and_package(
                    exported(name, device).program, package_path=str(folder / f"{name}_{device}.pt2"))
        return cache[name, device]

    return get


# --------------------------------------------------------------------------------------------
# torch.export


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("present", [(True,) * 4, (False,) * 4, (True, False, True, False)], ids=present_id)
def test_export_op_module(present, device):
    model = OpModule(present)
    args = to(op_inputs(present), device)
    ep = torch.export.export(model, args, dynamic_shapes=op_dynamic_shapes(args))
    ops = {str(node.target) for node in ep.graph.nodes if node.op == "call_function"}
    assert "edsc_ext.deform_sepconv_forward.default" in ops
    for new in (args, to(op_inputs(present, n=1, h=9, w=5, seed=1), device)):
        assert max_error(ep.module()(*new), eager(model, new)) == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sampling", ["compat", "clean"])
@pytest.mark.parametrize("name", ["EDSC_s", "EDSC_m"])
def test_export_edsc(name, sampling, device, exported):
    deployed = exported(name, device, sampling)
    for args, expected in zip(deployed.runs, deployed.expected):
        assert max_error(deployed.program.module()(*args), expected) < EXPORT_TOL
    # Not a multiple of 32: the program's shape guard fails (its exception type varies across torch versions).
    with pytest.raises(Exception):  # noqa: B017
        deployed.program.module()(*to(edsc_inputs(name == "EDSC_m", 1, 80, 64), device))


@pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="fake CUDA tensors need a torch built with CUDA")
@pytest.mark.parametrize("name", ["EDSC_s", "EDSC_m"])
def test_export_edsc_cuda_configuration_without_gpu(name, monkeypatch):
    """The networks' CUDA configuration, exported with fake CUDA tensors: no GPU needed, so CI sees the
    CUDA-only branches (padded heads, folded HetConv2d, the compiled upsampling's choice). The program must
    keep batch, height and width dynamic as on the CPU: it is called, still on fake tensors, with other
    sizes than the example's, where a specialised program's shape guard fails."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    padded_heads = []
    real_body = networks._padded_head_body
    monkeypatch.setattr(networks, "_padded_head_body", lambda *a, **k: padded_heads.append(1) or real_body(*a, **k))
    multiple = name == "EDSC_m"

    def frames(n, h, w):
        return (torch.rand(n, 3, h, w), torch.rand(n, 3, h, w)) + ((torch.rand(n),) if multiple else ())

    with FakeTensorMode(), torch.device("cuda"):
        model = edsc_model(multiple)
        example = frames(2, 64, 64)
        assert example[0].device.type == "cuda"
        program = torch.export.export(model, example, dynamic_shapes=edsc_dynamic_shapes(multiple))
        # The CUDA path ran: padded heads (the CPU runs the per-head ones), 5 heads per frame and the bias head.
        assert len(padded_heads) == 11
        module = program.module()
        for n, h, w in ((1, 64, 96), (3, 96, 64), (2, 128, 160)):
            out = module(*frames(n, h, w))
            assert out.shape == (n, 3, h, w) and out.device.type == "cuda"


@pytest.mark.parametrize("device", DEVICES)
def test_export_save_load_fresh_process(device, exported, tmp_path):
    """torch.export.save, then torch.export.load and run in a new process that imports edsc_ext (which
    registers the op): the op module and both EDSC variants, in one process."""
    names = ("op", "EDSC_s", "EDSC_m")
    for name in names:
        torch.export.save(exported(name, device).program, tmp_path / f"{name}.pt2")
    data = tmp_path / "io.pt"
    torch.save({name: exported(name, device).runs for name in names}, data)
    run_fresh(f"""
        import torch, edsc_ext
        runs = torch.load({str(data)!r})
        outputs = {{}}
        for name, inputs in runs.items():
            module = torch.export.load({str(tmp_path)!r} + f"/{{name}}.pt2").module()
            outputs[name] = [module(*args) for args in inputs]
        torch.save(outputs, {str(data)!r})
    """)
    outputs = torch.load(data)
    for name in names:
        for out, expected in zip(outputs[name], exported(name, device).expected):
            assert max_error(out, expected) <= (0 if name == "op" else EXPORT_TOL), name


# --------------------------------------------------------------------------------------------
# AOTInductor: from Python, in a fresh process, and from the C++ program edsc_ext_aoti_run


# The AOTInductor tests compile one EDSC, EDSC_m: EDSC_s's network plus the time input (a 1-D tensor sharing the
# frames' dynamic batch), so its package exercises everything EDSC_s's would; each compile costs a minute or more.
AOTI_MODELS = ["op", "EDSC_m"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", AOTI_MODELS)
def test_aoti(name, device, exported, aoti_package, tmp_path):
    """The package run here, then in a new process, where importing edsc_ext registers the op it calls: one
    test, so that one compile (a minute or more each) serves both."""
    package = aoti_package(name, device)
    runner = torch._inductor.aoti_load_package(package)
    deployed = exported(name, device)
    for args, expected in zip(deployed.runs, deployed.expected):
        error = max_error(runner(*args), expected)
        print(f"{name} on {device}: max |AOTInductor - eager| = {error:.3g}")
        assert error < AOTI_TOL
    data = tmp_path / "io.pt"
    torch.save(deployed.runs, data)
    run_fresh(f"""
        import torch, edsc_ext
        runner = torch._inductor.aoti_load_package({str(package)!r})
        torch.save([runner(*args) for args in torch.load({str(data)!r})], {str(data)!r})
    """)
    outputs = torch.load(data)
    assert len(outputs) == len(deployed.expected)
    for out, expected in zip(outputs, deployed.expected):
        assert max_error(out, expected) < AOTI_TOL, f"{name} on {device}, in a new process"


@dataclass
class AotiRunner:
    path: Path
    with_cuda: bool  # whether its ops library has the CUDA kernels

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.path), *map(str, args)], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def aoti_runner():
    """The CMake build's edsc_ext_aoti_run, named by $EDSC_EXT_AOTI_RUNNER (.ci/run sets it). Named but missing,
    or built against another torch, it fails the tests: whoever set the variable meant them to run."""
    given = os.environ.get(RUNNER_ENV)
    if not given:
        pytest.skip(f"{RUNNER_ENV} is not set: build the CMake path (README, 'CMake') against this torch and set "
                    f"{RUNNER_ENV}=<build folder>/edsc_ext_aoti_run")
    path = Path(given)
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"{RUNNER_ENV}={given}: no executable there")
    version = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0, version.stderr
    match = re.search(r"\(libtorch (\d+\.\d+)\.\d+", version.stdout)
    assert match, version.stdout
    running = ".".join(torch.__version__.split(".")[:2])
    if match.group(1) != running:
        # A package's compiled code calls into the libtorch of the torch that compiled it.
        pytest.fail(f"{path} is built against libtorch {match.group(1)} and this Python runs torch {running}: "
                    "build it against this torch (CMAKE_PREFIX_PATH from torch.utils.cmake_prefix_path)")
    return AotiRunner(path, with_cuda="CUDA kernels in the ops library: yes" in version.stdout)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", AOTI_MODELS)
def test_aoti_cpp_runner(name, device, exported, aoti_package, aoti_runner, tmp_path):
    """edsc_ext_aoti_run (C++, no Python) runs the package on inputs saved by torch.save. On the CPU its outputs
    are compared with eager; on CUDA the program keeps libtorch's default of TF32 cuDNN convolutions, so there
    they are compared with the same package run here with TF32 allowed too (test_aoti compares that with eager)."""
    if device == "cuda" and not aoti_runner.with_cuda:
        pytest.skip(f"{aoti_runner.path}'s ops library has no CUDA kernels (CMake with -DEDSC_EXT_CUDA=ON)")
    package, deployed = aoti_package(name, device), exported(name, device)
    expected, reference = deployed.expected, "eager"
    if device == "cuda":
        in_python = torch._inductor.aoti_load_package(package)
        torch.backends.cudnn.allow_tf32 = True
        try:
            expected, reference = [in_python(*args) for args in deployed.runs], "the package in Python, TF32"
        finally:
            torch.backends.cudnn.allow_tf32 = False
    for k, (args, want) in enumerate(zip(deployed.runs, expected)):
        inputs, outputs = tmp_path / f"inputs{k}.pt", tmp_path / f"outputs{k}.pt"
        torch.save([a.cpu() for a in args], inputs)
        result = aoti_runner(package, inputs, outputs)
        assert result.returncode == 0, result.stderr
        assert f"on {device}" in result.stdout, result.stdout
        error = max_error(torch.load(outputs), to(want if isinstance(want, (tuple, list)) else (want,), "cpu"))
        print(f"{name} on {device}: max |edsc_ext_aoti_run - {reference}| = {error:.3g}")
        assert error < AOTI_TOL


def test_aoti_cpp_runner_cli(aoti_runner, tmp_path):
    """No Python in the program; bad arguments and files: one line on stderr, exit code 2."""
    if sys.platform.startswith("linux"):
        libraries = subprocess.run(["ldd", str(aoti_runner.path)], capture_output=True, text=True).stdout
        assert "libedsc_ext_ops" in libraries and "libtorch" in libraries, libraries
        assert "libpython" not in libraries, libraries
    not_tensors = tmp_path / "not_tensors.pt"
    torch.save({"first": 1}, not_tensors)
    package = tmp_path / "model.pt2"  # never read: every case fails before the package is opened
    package.write_bytes(b"")
    cases = {
        (): "usage: edsc_ext_aoti_run PACKAGE.pt2 INPUTS.pt OUTPUTS.pt",
        (tmp_path / "absent.pt2", not_tensors, tmp_path / "out.pt"): f"cannot read {tmp_path / 'absent.pt2'}",
        (package, tmp_path / "absent.pt", tmp_path / "out.pt"): f"cannot read {tmp_path / 'absent.pt'}",
        (package, not_tensors, tmp_path / "out.pt"): "holds no list of tensors",
        (package, package, tmp_path / "out.pt"): "is no torch.save file of tensors",
    }
    for args, message in cases.items():
        result = aoti_runner(*args)
        assert result.returncode == 2, (args, result)
        assert result.stderr.count("\n") == 1 and message in result.stderr, (args, result.stderr)
    torch.save([torch.ones(1)], tmp_path / "x.pt")
    result = aoti_runner(package, tmp_path / "x.pt", tmp_path / "no" / "out.pt")
    assert result.returncode == 2 and f"no folder {tmp_path / 'no'}" in result.stderr, result


# --------------------------------------------------------------------------------------------
# ONNX, run by onnxruntime


@pytest.fixture(scope="module")
def ort():
    pytest.importorskip("onnx", reason="the ONNX tests need the package onnx (pip install onnx)")
    pytest.importorskip("onnxscript", reason="the ONNX tests need the package onnxscript (pip install onnxscript)")
    return pytest.importorskip("onnxruntime", reason="the ONNX tests need the package onnxruntime "
                                                     "(pip install onnxruntime)")


def ort_run(ort, path, args):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = session.get_inputs()
    assert len(inputs) == len(args)
    return session.run(None, {i.name: a.numpy() for i, a in zip(inputs, args)})


def onnx_op_types(path) -> set:
    import onnx
    return {node.op_type for node in onnx.load(str(path)).graph.node}


@pytest.mark.parametrize("present", ALL_PRESENT, ids=present_id)
def test_onnx_op(ort, present, tmp_path):
    import edsc_ext.models.onnx
    model = OpModule(present)
    path = tmp_path / "op.onnx"
    edsc_ext.models.onnx.export(model, op_inputs(present), path)
    types = onnx_op_types(path)
    assert "GridSample" in types and not any("edsc" in t.lower() for t in types), types
    # One file, dynamic batch, height and width.
    for args in (op_inputs(present, seed=3), op_inputs(present, n=1, h=9, w=5, seed=4)):
        assert max_error(ort_run(ort, path, args), eager(model, args)) < ONNX_TOL


def test_onnx_op_non_finite_offset(ort, tmp_path):
    import edsc_ext.models.onnx
    present = (True,) * 4
    model = OpModule(present)
    args = list(op_inputs(present))
    args[3] = args[3].clone()
    args[3][0, 0, 1, 2] = float("inf")  # the first call's offset: pixel (1, 2) of image 0
    args[3][1, 3, 0, 0] = float("nan")
    path = tmp_path / "op.onnx"
    edsc_ext.models.onnx.export(model, tuple(args), path)
    outs, expected = ort_run(ort, path, args), eager(model, args)
    for out, exp in zip(outs, expected):
        out = torch.as_tensor(out)
        assert torch.equal(out.isnan(), exp.isnan())
        assert (out - exp).nan_to_num().abs().max() < ONNX_TOL
    assert expected[0][0, :, 1, 2].isnan().all() and expected[0][1, :, 0, 0].isnan().all()


def test_onnx_compat_layer(ort, tmp_path):
    """The EDSC repository's calling convention (replicate-padded frame, border pixels counted twice
    past the frame)."""
    import edsc_ext.models.onnx
    g = torch.Generator().manual_seed(5)
    k, n, h, w = 5, 2, 7, 9

    def inputs(n, h, w):
        return (torch.rand(n, 3, h + k - 1, w + k - 1, generator=g), torch.randn(n, k, h, w, generator=g),
                torch.randn(n, k, h, w, generator=g), 3 * torch.randn(n, k * k, h, w, generator=g),
                3 * torch.randn(n, k * k, h, w, generator=g), torch.rand(n, k * k, h, w, generator=g))

    model = compat.ModuleDSepconv().eval()
    path = tmp_path / "compat.onnx"
    edsc_ext.models.onnx.export(model, inputs(n, h, w), path)
    for args in (inputs(n, h, w), inputs(1, 6, 11)):
        assert max_error(ort_run(ort, path, args), eager(model, args)) < ONNX_TOL


@pytest.mark.parametrize("multiple", [False, True], ids=["EDSC_s", "EDSC_m"])
def test_onnx_edsc(ort, multiple, tmp_path):
    import edsc_ext.models.onnx
    model = edsc_model(multiple)
    path = tmp_path / "edsc.onnx"
    edsc_ext.models.onnx.export(model, edsc_inputs(multiple, 2, 64, 64), path)
    assert not (tmp_path / "edsc.onnx.data").exists()  # one file
    # Two resolutions (and batch sizes) from the one file.
    for args in (edsc_inputs(multiple, 1, 96, 64, seed=1), edsc_inputs(multiple, 2, 128, 160, seed=2)):
        assert max_error(ort_run(ort, path, args), eager(model, args)) < ONNX_TOL


def test_onnx_translation_table_for_own_exports(ort, tmp_path):
    """translation_table() in a plain torch.onnx.export call."""
    import edsc_ext.models.onnx
    model = edsc_ext.nn.DeformSepConv2d(3, padding=1, padding_mode="border").eval()
    args = op_inputs((True,) * 4)[:1] + (torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 18, 7, 8))
    path = tmp_path / "own.onnx"
    torch.onnx.export(model, args, str(path), dynamo=True, opset_version=edsc_ext.models.onnx.OPSET,
                      external_data=False, custom_translation_table=edsc_ext.models.onnx.translation_table(),
                      verbose=False)
    assert max_error(ort_run(ort, path, args), eager(model, args)) < ONNX_TOL


def test_onnx_rejects_old_opset(ort, tmp_path):
    import edsc_ext.models.onnx
    with pytest.raises(ValueError, match="opset_version must be >= 20"):
        edsc_ext.models.onnx.export(OpModule((True,) * 4), op_inputs((True,) * 4), tmp_path / "x.onnx",
                                    opset_version=18)
