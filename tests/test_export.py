"""Deployment on the CPU: torch.export (and save/load in a fresh process), AOTInductor packages run
from Python, and ONNX (edsc_ext.onnx) run by onnxruntime, each against eager PyTorch.

The ONNX tests need the packages onnx, onnxscript and onnxruntime (the ``deploy`` extra) and skip
without them. AOTInductor compiles C++ (a minute per EDSC model on two cores), hence tiny shapes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import edsc_ext
from edsc_ext import compat
from edsc_ext.models import EDSC

from conftest import ALL_PRESENT, PADDING_MODES, present_id

REPO = Path(__file__).resolve().parent.parent
Dim = torch.export.Dim
# Outputs of the ONNX model against PyTorch float32 (the bound).
ONNX_TOL = 1e-4
KERNEL = (3, 2)
DILATIONS = (1, (2, 3))


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
    """Runs ``code`` in a new Python process that imports edsc_ext from this checkout; returns stdout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


# --------------------------------------------------------------------------------------------
# torch.export


@pytest.mark.parametrize("present", [(True,) * 4, (False,) * 4, (True, False, True, False)], ids=present_id)
def test_export_op_module(present):
    model = OpModule(present)
    args = op_inputs(present)
    ep = torch.export.export(model, args, dynamic_shapes=op_dynamic_shapes(args))
    ops = {str(node.target) for node in ep.graph.nodes if node.op == "call_function"}
    assert "edsc_ext.deform_sepconv_forward.default" in ops
    for new in (args, op_inputs(present, n=1, h=9, w=5, seed=1)):
        assert max_error(ep.module()(*new), eager(model, new)) == 0


@pytest.mark.parametrize("sampling", ["compat", "clean"])
@pytest.mark.parametrize("multiple", [False, True], ids=["EDSC_s", "EDSC_m"])
def test_export_edsc(multiple, sampling, tmp_path):
    model = edsc_model(multiple, sampling)
    ep = torch.export.export(model, edsc_inputs(multiple, 2, 64, 64), dynamic_shapes=edsc_dynamic_shapes(multiple))
    runs = [edsc_inputs(multiple, 1, 96, 64, seed=1), edsc_inputs(multiple, 3, 64, 64, seed=2)]
    for args in runs:
        assert max_error(ep.module()(*args), eager(model, args)) < 1e-6
    # Not a multiple of 32: the program's shape guard fails (its exception type varies across torch versions).
    with pytest.raises(Exception):  # noqa: B017
        ep.module()(*edsc_inputs(multiple, 1, 80, 64))
    if sampling == "clean":
        return
    # save/load: a new process that imports edsc_ext (which registers the op) runs the program.
    path, data = tmp_path / "edsc.pt2", tmp_path / "io.pt"
    torch.export.save(ep, path)
    torch.save({"runs": runs}, data)
    run_fresh(f"""
        import torch, edsc_ext
        ep = torch.export.load({str(path)!r})
        data = torch.load({str(data)!r})
        torch.save([ep.module()(*args) for args in data["runs"]], {str(data)!r})
    """)
    loaded = torch.load(data)
    for args, out in zip(runs, loaded):
        assert max_error(out, eager(model, args)) < 1e-6


# --------------------------------------------------------------------------------------------
# AOTInductor (CPU)


def test_aoti_op_module(tmp_path):
    present = (True,) * 4
    model = OpModule(present)
    args = op_inputs(present)
    ep = torch.export.export(model, args, dynamic_shapes=op_dynamic_shapes(args))
    path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "op.pt2"))
    runner = torch._inductor.aoti_load_package(path)
    for new in (args, op_inputs(present, n=1, h=9, w=5, seed=1)):
        assert max_error(runner(*new), eager(model, new)) < 1e-5


@pytest.mark.parametrize("multiple", [False, True], ids=["EDSC_s", "EDSC_m"])
def test_aoti_edsc(multiple, tmp_path):
    model = edsc_model(multiple)
    ep = torch.export.export(model, edsc_inputs(multiple, 2, 64, 64), dynamic_shapes=edsc_dynamic_shapes(multiple))
    path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "edsc.pt2"))
    runs = [edsc_inputs(multiple, 1, 64, 96, seed=1), edsc_inputs(multiple, 2, 96, 64, seed=2)]
    runner = torch._inductor.aoti_load_package(path)
    for args in runs:
        assert max_error(runner(*args), eager(model, args)) < 1e-4
    if multiple:
        return
    # The package in a new process: importing edsc_ext registers the op the package calls.
    data = tmp_path / "io.pt"
    torch.save({"runs": runs}, data)
    run_fresh(f"""
        import torch, edsc_ext
        runner = torch._inductor.aoti_load_package({str(path)!r})
        data = torch.load({str(data)!r})
        torch.save([runner(*args) for args in data["runs"]], {str(data)!r})
    """)
    for args, out in zip(runs, torch.load(data)):
        assert max_error(out, eager(model, args)) < 1e-4


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
    import edsc_ext.onnx
    model = OpModule(present)
    path = tmp_path / "op.onnx"
    edsc_ext.onnx.export(model, op_inputs(present), path)
    types = onnx_op_types(path)
    assert "GridSample" in types and not any("edsc" in t.lower() for t in types), types
    # One file, dynamic batch, height and width.
    for args in (op_inputs(present, seed=3), op_inputs(present, n=1, h=9, w=5, seed=4)):
        assert max_error(ort_run(ort, path, args), eager(model, args)) < ONNX_TOL


def test_onnx_op_non_finite_offset(ort, tmp_path):
    import edsc_ext.onnx
    present = (True,) * 4
    model = OpModule(present)
    args = list(op_inputs(present))
    args[3] = args[3].clone()
    args[3][0, 0, 1, 2] = float("inf")  # the first call's offset: pixel (1, 2) of image 0
    args[3][1, 3, 0, 0] = float("nan")
    path = tmp_path / "op.onnx"
    edsc_ext.onnx.export(model, tuple(args), path)
    outs, expected = ort_run(ort, path, args), eager(model, args)
    for out, exp in zip(outs, expected):
        out = torch.as_tensor(out)
        assert torch.equal(out.isnan(), exp.isnan())
        assert (out - exp).nan_to_num().abs().max() < ONNX_TOL
    assert expected[0][0, :, 1, 2].isnan().all() and expected[0][1, :, 0, 0].isnan().all()


def test_onnx_compat_layer(ort, tmp_path):
    """The EDSC repository's calling convention (replicate-padded frame, border pixels counted twice
    past the frame)."""
    import edsc_ext.onnx
    g = torch.Generator().manual_seed(5)
    k, n, h, w = 5, 2, 7, 9

    def inputs(n, h, w):
        return (torch.rand(n, 3, h + k - 1, w + k - 1, generator=g), torch.randn(n, k, h, w, generator=g),
                torch.randn(n, k, h, w, generator=g), 3 * torch.randn(n, k * k, h, w, generator=g),
                3 * torch.randn(n, k * k, h, w, generator=g), torch.rand(n, k * k, h, w, generator=g))

    model = compat.ModuleDSepconv().eval()
    path = tmp_path / "compat.onnx"
    edsc_ext.onnx.export(model, inputs(n, h, w), path)
    for args in (inputs(n, h, w), inputs(1, 6, 11)):
        assert max_error(ort_run(ort, path, args), eager(model, args)) < ONNX_TOL


@pytest.mark.parametrize("multiple", [False, True], ids=["EDSC_s", "EDSC_m"])
def test_onnx_edsc(ort, multiple, tmp_path):
    import edsc_ext.onnx
    model = edsc_model(multiple)
    path = tmp_path / "edsc.onnx"
    edsc_ext.onnx.export(model, edsc_inputs(multiple, 2, 64, 64), path)
    assert not (tmp_path / "edsc.onnx.data").exists()  # one file
    # Two resolutions (and batch sizes) from the one file.
    for args in (edsc_inputs(multiple, 1, 96, 64, seed=1), edsc_inputs(multiple, 2, 128, 160, seed=2)):
        assert max_error(ort_run(ort, path, args), eager(model, args)) < ONNX_TOL


def test_onnx_translation_table_for_own_exports(ort, tmp_path):
    """translation_table() in a plain torch.onnx.export call."""
    import edsc_ext.onnx
    model = edsc_ext.nn.DeformSepConv2d(3, padding=1, padding_mode="border").eval()
    args = op_inputs((True,) * 4)[:1] + (torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 18, 7, 8))
    path = tmp_path / "own.onnx"
    torch.onnx.export(model, args, str(path), dynamo=True, opset_version=edsc_ext.onnx.OPSET, external_data=False,
                      custom_translation_table=edsc_ext.onnx.translation_table(), verbose=False)
    assert max_error(ort_run(ort, path, args), eager(model, args)) < ONNX_TOL


def test_onnx_rejects_old_opset(ort, tmp_path):
    import edsc_ext.onnx
    with pytest.raises(ValueError, match="opset_version must be >= 20"):
        edsc_ext.onnx.export(OpModule((True,) * 4), op_inputs((True,) * 4), tmp_path / "x.onnx", opset_version=18)
