"""The EDSC networks: checkpoint layout (against the released checkpoints' key tables), loading,
the wiring of the heads into the original layer, EDSC_m's time input, the fused path against the
original composition (values and gradients), the model benchmark's CPU smoke run, and a short
training run."""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from edsc_ext.apps import images
from edsc_ext.benchmarks import networks as model_benchmark
from edsc_ext.models import compat
from edsc_ext.models import networks as models_module
from edsc_ext.models.networks import (
    EDSC,
    FRAME_HEADS,
    HEAD_LAYOUTS,
    HEAD_TAILS,
    EDSC_m,
    EDSC_s,
    HetConv2d,
    auto_head_layout,
    block_diagonal,
    compile_edsc,
    load_checkpoint,
    pad_to_multiple,
    save_checkpoint,
)

from conftest import (
    assert_close,
    needs_packages,
    needs_shared_data,
    rel_error,
    requires_cuda,
    shared_data_path,
    subprocess_env,
)

REPO = Path(__file__).resolve().parent.parent
TABLES = shared_data_path("edsc")
MIDDLEBURY = shared_data_path("middlebury")
needs_tables = needs_shared_data("edsc")
needs_middlebury = needs_shared_data("middlebury")
# Optional packages: image files through Pillow; examples/train.py's progress bar through tqdm.
needs_pillow = needs_packages("PIL")
needs_training_packages = needs_packages("PIL", "tqdm")


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return {"EDSC_s": EDSC_s(), "EDSC_m": EDSC_m()}


def read_table(path: Path):
    lines = path.read_text().splitlines()
    assert lines[0].split("\t") == ["key", "shape"]
    return [(key, shape) for key, shape in (line.split("\t") for line in lines[1:] if line)]


@needs_tables
@pytest.mark.parametrize("name", ["EDSC_s", "EDSC_m"])
def test_state_dict_keys_and_shapes_equal_the_released_checkpoints(models, name):
    expected = read_table(TABLES / f"{name}_state_dict.tsv")
    actual = [(key, str(tuple(value.shape))) for key, value in models[name].state_dict().items()]
    assert [k for k, _ in actual] == [k for k, _ in expected]
    assert actual == expected


def test_checkpoint_in_the_original_format_loads(models, tmp_path):
    for name, model in models.items():
        # As the original code saves it: a plain dict with the state under 'model_state'.
        path = tmp_path / f"{name}.pth"
        torch.save({"model_state": model.state_dict(), "epoch": 3}, path)
        loaded = load_checkpoint(path)
        assert loaded.name == name and loaded.kernel_size == 5 and loaded.sampling == "compat"
        for (k, a), (k2, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
            assert k == k2 and torch.equal(a, b)
    # DistributedDataParallel / torch.compile prefixes are stripped; save_checkpoint writes the format.
    model = models["EDSC_s"]
    prefixed = {"model_state": {f"module.{k}": v for k, v in model.state_dict().items()}}
    assert torch.equal(load_checkpoint(prefixed).moduleBias[7].weight, model.moduleBias[7].weight)
    wrapper = torch.nn.Module()
    wrapper.module = model  # as DistributedDataParallel holds it
    save_checkpoint(wrapper, tmp_path / "saved.pth", epoch=1)
    raw = torch.load(tmp_path / "saved.pth", weights_only=True)
    assert set(raw) == {"model_state", "epoch"} and list(raw["model_state"]) == list(model.state_dict())
    with pytest.raises(ValueError, match="EDSC_m"):
        from edsc_ext.apps.engine import load_model
        load_model(tmp_path / "saved.pth", "EDSC_m")
    with pytest.raises(RuntimeError):  # a wrong variant into an existing model: shapes differ
        load_checkpoint(tmp_path / "saved.pth", EDSC_m())


def test_forward_is_the_original_wiring(models, gen):
    """The network's output equals the original's formula assembled by hand from its heads:
    FunctionDSepconv on the replicate-padded frames (offset_x = the Offset*x head) plus the bias."""
    model = models["EDSC_s"]
    first, second = (torch.rand(1, 3, 32, 64, generator=gen) for _ in range(2))
    with torch.no_grad():
        out = model(first, second)
        c = model.features(first, second)
        pad = lambda f: F.pad(f, (2, 2, 2, 2), mode="replicate")  # noqa: E731
        expected = (compat.FunctionDSepconv(pad(first), model.moduleVertical1(c), model.moduleHorizontal1(c),
                                            model.moduleOffset1x(c), model.moduleOffset1y(c), model.moduleMask1(c))
                    + compat.FunctionDSepconv(pad(second), model.moduleVertical2(c), model.moduleHorizontal2(c),
                                              model.moduleOffset2x(c), model.moduleOffset2y(c), model.moduleMask2(c))
                    + model.moduleBias(c))
    assert out.shape == (1, 3, 32, 64)
    assert_close(out, expected, torch.float32, factor=10)
    # The clean sampling is a different (centred, no doubling) function of the same heads.
    clean = EDSC(sampling="clean")
    clean.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert not torch.allclose(clean(first, second), out)
    with pytest.raises(ValueError, match="multiples of 32"):
        model(first[..., :30], second[..., :30])
    with pytest.raises(ValueError, match="midpoint"):
        model(first, second, 0.25)


def test_edsc_m_time(models, gen):
    model = models["EDSC_m"]
    first, second = (torch.rand(2, 3, 32, 32, generator=gen) for _ in range(2))
    with torch.no_grad():
        half = model(first, second)
        assert torch.equal(half, model(first, second, 0.5))
        assert torch.equal(half, model(first, second, torch.tensor([0.5, 0.5])))
        per_sample = model(first, second, torch.tensor([0.25, 0.75]))
        assert_close(per_sample[:1], model(first[:1], second[:1], 0.25), torch.float32, factor=10)
        assert not torch.allclose(per_sample[1], half[1])
        # Swapping the frames and t -> 1 - t swaps which heads see which frame: a different function
        # (the heads are separate), but the shapes and finiteness hold.
        assert torch.isfinite(model(second, first, 0.75)).all()


def test_interpolate_pads_and_crops(models, gen):
    model = models["EDSC_s"]
    first, second = (torch.rand(3, 37, 50, generator=gen) for _ in range(2))
    out = model.interpolate(first, second)
    assert out.shape == (3, 37, 50) and out.min() >= 0 and out.max() <= 1
    (padded,), size = pad_to_multiple((first.unsqueeze(0),))
    assert padded.shape[-2:] == (64, 64) and size == (37, 50)


def test_torch_compile_traces_the_network(models, gen):
    model = models["EDSC_m"]
    first, second = (torch.rand(1, 3, 32, 32, generator=gen) for _ in range(2))
    t = torch.tensor([0.3])
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        assert_close(compiled(first, second, t), model(first, second, t), torch.float32)


@pytest.mark.parametrize("layout", ["padded", "grouped"])
def test_torch_compile_traces_cudas_fused_forms_without_a_graph_break(gen, layout):
    # The head layouts of CUDA ("auto" runs padded there, per_head on the CPU), traced on the CPU.
    model = EDSC_m(head_layout=layout)
    combine = torch.rand(2, 64, 16, 16, generator=gen)
    t = torch.tensor([0.3, 0.6])
    compiled = torch.compile(model.fused_heads, backend="eager", fullgraph=True)
    with torch.no_grad():
        for a, b in zip(torch.utils._pytree.tree_leaves(compiled(combine, t)),
                        torch.utils._pytree.tree_leaves(model.unfused_heads(combine, t))):
            assert_close(a, b, torch.float32)
        het = model.moduleConv2[0]  # and the folded HetConv2d, CUDA's form
        x = torch.rand(2, 32, 16, 16, generator=gen)
        assert_close(torch.compile(het.forward_folded, backend="eager", fullgraph=True)(x), het.forward_unfused(x),
                     torch.float32)


# --------------------------------------------------------------------------------------------
# The fused path (HetConv2d folded, the heads as few convolutions) against the original composition.

OFFSET_HEADS = ("moduleOffset1x", "moduleOffset1y", "moduleOffset2x", "moduleOffset2y")


def random_edsc(gen: torch.Generator, multiple: bool, dtype=torch.float64, head_layout: str = "grouped",
                **kwargs) -> EDSC:
    """An EDSC with fresh weights from ``gen`` (PyTorch's default scale, 1/sqrt(fan_in)) whose offset
    heads predict a few pixels, so that the sampling moves off the grid. The heads are grouped unless
    asked otherwise: on the CPU, "auto" would run them one by one (the unfused heads)."""
    model = EDSC(multiple=multiple, head_layout=head_layout, **kwargs).to(dtype)
    with torch.no_grad():
        for name, param in model.named_parameters():
            fan_in = param.shape[1] * param[0, 0].numel() if param.dim() > 1 else None
            if fan_in is None:  # a bias: the fan-in of its weight
                fan_in = model.get_parameter(name[:-len("bias")] + "weight")[0].numel()
            bound = fan_in ** -0.5
            param.copy_((torch.rand(param.shape, generator=gen, dtype=torch.float64) * 2 - 1) * bound)
        for name in OFFSET_HEADS:
            bias = getattr(model, name)[-1].bias
            bias.copy_(torch.randn(bias.shape, generator=gen, dtype=torch.float64) * 2)
    return model


def frames(gen: torch.Generator, n: int, h: int, w: int, dtype=torch.float64):
    return tuple(torch.rand(n, 3, h, w, generator=gen, dtype=torch.float64).to(dtype) for _ in range(2))


def run(model: EDSC, fused: bool, *args):
    model.fused = fused
    return model(*args)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("size", [(1, 5), (7, 6), (16, 24)], ids=str)
def test_upsampling_by_slices_equals_interpolate_in_values_and_gradients(gen, size, channels_last):
    """The compiled training path's upsampling (shifted slices and weighted sums, no scatter in its
    backward) is F.interpolate's bilinear 2x with aligned corners, float64, sides down to 1."""
    x = torch.randn(2, 3, *size, dtype=torch.float64, generator=gen)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    expected = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
    out = models_module._upsample_axis_by_slices(models_module._upsample_axis_by_slices(x, 2), 3)
    assert out.shape == expected.shape
    assert_close(out, expected, what="upsampled")
    grad = torch.randn(expected.shape, dtype=torch.float64, generator=gen)
    assert_close(torch.autograd.grad(out, x, grad)[0], torch.autograd.grad(expected, x, grad)[0], what="gradient")
    # Outside a CUDA compile, the module runs the native operator itself.
    assert torch.equal(models_module.Upsample2x()(x), expected)


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
def test_exporting_is_told_apart_from_compiling(strict):
    """upsample2x takes the slices only when compiling and not exporting. Before torch 2.13, dynamo folded
    torch.compiler.is_exporting() to True under every torch.compile, so compiled CUDA training lost the
    slices (the H200's compiled-training test found atomic adds again); the check must say False there."""

    class Pick(torch.nn.Module):
        def forward(self, x):
            return x + 1 if models_module._is_exporting() else x - 1

    x = torch.zeros(2)
    assert not models_module._is_exporting()
    assert torch.compile(Pick(), fullgraph=True, backend="eager")(x).tolist() == [-1, -1]
    assert torch.export.export(Pick(), (x,), strict=strict).module()(x).tolist() == [1, 1]
    assert not models_module._is_exporting()


def test_block_diagonal_places_each_groups_weight_on_the_diagonal(gen):
    weight = torch.randn(6, 2, 3, 3, generator=gen)  # 3 groups of 2 -> 2 channels each
    dense = block_diagonal(weight, 3)
    assert dense.shape == (6, 6, 3, 3)
    for g in range(3):
        for h in range(3):
            block = dense[2 * g:2 * g + 2, 2 * h:2 * h + 2]
            assert torch.equal(block, weight[2 * g:2 * g + 2] if g == h else torch.zeros_like(block))
    x = torch.randn(2, 6, 8, 8, generator=gen, dtype=torch.float64)
    assert_close(F.conv2d(x, dense.double(), padding=1), F.conv2d(x, weight.double(), padding=1, groups=3))
    with pytest.raises(ValueError, match="divisible by groups=4"):
        block_diagonal(weight, 4)


@pytest.mark.parametrize("p", [4, 2])
def test_hetconv_folded_equals_the_three_convolutions(gen, p):
    het = HetConv2d(16, 24, p).double()
    with torch.no_grad():
        for param in het.parameters():
            param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float64))
    x = torch.randn(2, 16, 9, 11, generator=gen, dtype=torch.float64, requires_grad=True)
    grad_out = torch.randn(2, 24, 9, 11, generator=gen, dtype=torch.float64)

    def values_and_grads(forward):
        out = forward(x)
        grads = torch.autograd.grad(out, [x, *het.parameters()], grad_out)
        return out, grads

    expected, expected_grads = values_and_grads(het.forward_unfused)
    weight, bias = het.folded_weight()
    assert weight.shape == (24, 16, 3, 3) and bias.shape == (24,)
    for forward in (het.forward_folded, het.forward_grouped_and_1x1, het):
        out, grads = values_and_grads(forward)
        assert rel_error(out, expected) < 1e-13
        for (name, _), grad, expected_grad in zip([("input", x), *het.named_parameters()], grads, expected_grads):
            assert rel_error(grad, expected_grad) < 1e-13, name
    het.fused = False
    assert torch.equal(het(x), het.forward_unfused(x))
    with pytest.raises(ValueError, match="padding kernel_size // 2"):
        HetConv2d(16, 16, 4, kernel_size=3, padding=0)


@pytest.mark.parametrize("layout", ["grouped", "block_diagonal", "padded", "wide", "wide_grouped"])
@pytest.mark.parametrize("multiple", [False, True], ids=["EDSC_s", "EDSC_m"])
def test_fused_heads_and_output_equal_the_unfused_float64(gen, multiple, layout):
    model = random_edsc(gen, multiple, head_layout=layout)
    first, second = frames(gen, 2 if multiple else 1, 32, 64)
    time = torch.tensor([0.3, 0.8], dtype=torch.float64) if multiple else None
    with torch.no_grad():
        combine = model.features(first, second)
        fused, unfused = model.fused_heads(combine, time), model.unfused_heads(combine, time)
        for frame in (0, 1):
            for name, a, b in zip(FRAME_HEADS[frame], fused[frame], unfused[frame]):
                assert a.shape == b.shape and rel_error(a, b) < 1e-12, name
        assert rel_error(fused[2], unfused[2]) < 1e-12
        expected = run(model, False, first, second, time)
        out = run(model, True, first, second, time)
    assert rel_error(out, expected) < 1e-12
    # The offsets move the taps by pixels, so the comparison covers off-grid sampling.
    assert unfused[0][2].abs().mean() > 0.5


@pytest.mark.parametrize("multiple", [False, True], ids=["EDSC_s", "EDSC_m"])
def test_fused_output_equals_the_unfused_float32(gen, multiple):
    model = random_edsc(gen, multiple, dtype=torch.float32)
    first, second = frames(gen, 1, 64, 96, torch.float32)
    time = 0.25 if multiple else None
    with torch.no_grad():
        reference = EDSC(multiple=multiple).double()
        reference.load_state_dict(model.state_dict())  # the same weights in float64
        expected = run(reference, False, first.double(), second.double(), time)
        for fused, layout in ((False, "grouped"), (True, "grouped"), (True, "block_diagonal"), (True, "padded"),
                              (True, "wide"), (True, "wide_grouped"), (True, "auto")):
            model.head_layout = layout
            assert_close(run(model, fused, first, second, time), expected, torch.float32, factor=10,
                         what=f"fused={fused}, head_layout={layout}")


def test_auto_head_layout_runs_the_heads_one_by_one_on_the_cpu(gen):
    model = random_edsc(gen, multiple=True, dtype=torch.float32, head_layout="auto")
    assert set(HEAD_LAYOUTS) == {"auto", "grouped", "block_diagonal", "per_head", "padded", "wide", "wide_grouped"}
    combine = torch.rand(1, 64, 16, 16, generator=gen)
    with torch.no_grad():
        fused, unfused = model.fused_heads(combine, 0.3), model.unfused_heads(combine, 0.3)
    for a, b in zip([*fused[0], *fused[1], fused[2]], [*unfused[0], *unfused[1], unfused[2]]):
        assert torch.equal(a, b)


def test_auto_head_layout_pads_for_cuda_inference_and_compiled_training_only():
    # The CUDA layouts are the DEFAULT_* constants (a measured choice: "padded", or one of the wide ones).
    assert models_module.DEFAULT_CUDA_INFERENCE_HEAD_LAYOUT in ("padded", "wide", "wide_grouped")
    assert models_module.DEFAULT_CUDA_COMPILED_TRAINING_HEAD_LAYOUT in ("padded", "wide", "wide_grouped")
    assert auto_head_layout("cuda", grad_enabled=False) == models_module.DEFAULT_CUDA_INFERENCE_HEAD_LAYOUT
    assert auto_head_layout("cuda", grad_enabled=True) == "per_head"
    assert auto_head_layout("cuda", grad_enabled=True, compiling=True) == \
        models_module.DEFAULT_CUDA_COMPILED_TRAINING_HEAD_LAYOUT
    assert auto_head_layout("cpu", grad_enabled=False) == "per_head"
    assert auto_head_layout("cpu", grad_enabled=True, compiling=True) == "per_head"
    # What EDSC._layout passes as ``compiling``: True while torch.compile traces, False in eager.
    seen = []

    def probe(x):
        seen.append(models_module._is_compiling())
        return x + 1

    torch.compile(probe, backend="eager", fullgraph=True)(torch.zeros(2))
    assert seen == [True] and models_module._is_compiling() is False
    model = EDSC_s()
    assert model._layout(torch.empty(0)) == "per_head"
    model.head_layout = "padded"
    assert model._layout(torch.empty(0)) == "padded"


def _recorded_conv_channels(model, *args):
    """(in, out) channels of every convolution the model's forward runs."""
    channels = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.convolution.default:
                channels.append((args[0].shape[1], args[1].shape[0]))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Recorder():
        model(*args)
    return channels


@pytest.mark.parametrize("layout", ["padded", "wide", "wide_grouped"])
@pytest.mark.parametrize("multiple", [False, True], ids=["EDSC_s", "EDSC_m"])
def test_padded_layout_runs_channel_counts_in_multiples_of_8(gen, multiple, layout):
    # conv_relu off: its fused calls are one custom op each, which the recorder does not see as convolutions.
    model = random_edsc(gen, multiple, dtype=torch.float32, head_layout=layout, conv_relu=False)
    first, second = (f.contiguous(memory_format=torch.channels_last) for f in frames(gen, 1, 32, 32, torch.float32))
    time = 0.3 if multiple else None
    channels = _recorded_conv_channels(model, first, second, time)
    assert len(channels) > 11 * 4 and all(c % 8 == 0 for pair in channels for c in pair), channels
    assert channels[0] == (8, 32)  # the trunk's first convolution: 6 frame channels and 2 zero ones
    if layout != "padded":  # the eleven heads' first layers as one convolution: EDSC_m's 66 inputs padded to 72
        assert (72 if multiple else 64, 11 * 64) in channels
        assert ((11 * 64, 11 * 32) in channels) == (layout == "wide_grouped")
    # The other layouts run the original's counts: 6 inputs, 5, 25 and 3 outputs, EDSC_m's 65 inputs.
    for fused, layout in ((True, "per_head"), (False, "padded")):
        model.fused, model.head_layout = fused, layout
        assert _recorded_conv_channels(model, first, second, time)[0] == (6, 32)
    model.fused, model.head_layout = True, layout
    with torch.no_grad():
        expected = run(model, False, first, second, time)
        assert_close(run(model, True, first, second, time), expected, torch.float32, factor=10)
        combine = model.features(first, second)
        padded, unfused = model.fused_heads(combine, time), model.unfused_heads(combine, time)
    for a, b in zip([*padded[0], *padded[1], padded[2]], [*unfused[0], *unfused[1], unfused[2]]):
        assert a.shape == b.shape
        assert_close(a, b, torch.float32)


def _recorded_convs(model, *args, grad: bool = False):
    """(weight shape, groups) of every convolution the model's forward runs, and its output."""
    convs = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.convolution.default:
                convs.append((tuple(args[1].shape), args[8]))
            return func(*args, **(kwargs or {}))

    with torch.set_grad_enabled(grad), Recorder():
        out = model(*args)
    return convs, out


@pytest.mark.parametrize("tails", ["merged_narrow", "merged"])
@pytest.mark.parametrize("layout", ["padded", "wide_grouped"])
@pytest.mark.parametrize("multiple", [False, True], ids=["EDSC_s", "EDSC_m"])
def test_merged_head_tails_are_one_convolution_a_width_with_the_per_head_values(gen, multiple, layout, tails):
    """head_tails: the narrow heads' (four kernel heads and the bias head, 8 padded channels) last convolutions
    run as one dense block-diagonal convolution, with "merged" the six 32-channel heads' as one grouped one; no
    per-head tail of a merged width runs; the heads' outputs and the network's are the per-head ones (float64),
    and so are the gradients of every parameter and frame."""
    model = random_edsc(gen, multiple, head_layout=layout, conv_relu=False)
    first, second = frames(gen, 2, 32, 64)
    time = torch.tensor([0.3, 0.7], dtype=torch.float64) if multiple else None
    per_head_convs, expected = _recorded_convs(model, first, second, time)
    model.head_tails = tails
    convs, out = _recorded_convs(model, first, second, time)
    assert rel_error(out, expected) < 1e-12
    assert ((40, 40, 3, 3), 1) in convs and ((8, 8, 3, 3), 1) not in convs, convs
    assert (((6 * 32, 32, 3, 3), 6) in convs) == (tails == "merged"), convs
    # The wide heads' third layers (32 -> 25 padded to 32) stay; their last layers go with "merged".
    assert convs.count(((32, 32, 3, 3), 1)) == per_head_convs.count(((32, 32, 3, 3), 1)) - 6 * (tails == "merged")
    # Every other convolution is the per-head layout's: 5 narrow tails become 1, with "merged" 6 wide ones too.
    assert len(convs) == len(per_head_convs) - 4 - 5 * (tails == "merged")
    with torch.no_grad():
        combine = model.features(first, second)
        merged, unfused = model.fused_heads(combine, time), model.unfused_heads(combine, time)
    for a, b in zip([*merged[0], *merged[1], merged[2]], [*unfused[0], *unfused[1], unfused[2]]):
        assert a.shape == b.shape and rel_error(a, b) < 1e-12

    def grads():
        inputs = [first.clone().requires_grad_(), second.clone().requires_grad_()]
        loss = F.l1_loss(model(*inputs, time), torch.zeros_like(first))
        return torch.autograd.grad(loss, [*inputs, *model.parameters()])

    actual = grads()
    model.head_tails = "per_head"
    for name, a, b in zip(["first", "second", *(n for n, _ in model.named_parameters())], actual, grads()):
        assert rel_error(a, b) < 1e-11, name


def test_head_tails_is_validated_and_changes_no_state():
    model = EDSC_s()
    assert model.head_tails == models_module.DEFAULT_HEAD_TAILS and set(HEAD_TAILS) == {
        "per_head", "merged_narrow", "merged"}
    keys = list(model.state_dict())
    model.head_tails = "merged"
    assert list(model.state_dict()) == keys and "head_tails='merged'" in repr(model)
    with pytest.raises(ValueError, match=r"head_tails must be one of \('per_head', 'merged_narrow', 'merged'\), "
                                         r"got 'all'"):
        EDSC(head_tails="all")
    with pytest.raises(ValueError, match="head_tails must be one of"):
        model.head_tails = "merged_wide"
    assert model.head_tails == "merged"


class _HostOperands(TorchDispatchMode):
    """Records every operation whose tensors are on both the host and a CUDA device."""

    def __init__(self):
        super().__init__()
        self.found = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        devices = {a.device.type for a in leaves if isinstance(a, torch.Tensor)}
        if {"cpu", "cuda"} <= devices:
            self.found.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.filterwarnings("ignore:CUDA is not available")
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("layout, tails", [("auto", "per_head"), ("padded", "per_head"), ("wide", "per_head"),
                                           ("wide_grouped", "per_head"), ("padded", "merged_narrow"),
                                           ("padded", "merged")])
@pytest.mark.parametrize("multiple", [False, True], ids=["EDSC_s", "EDSC_m"])
def test_cuda_inference_moves_nothing_from_the_host(multiple, layout, tails, autocast):
    """What EDSC.capture records (CUDA inference, weights made on every call without cache_weights) has no
    operation with a host tensor beside device ones: a CUDA-graph capture refuses the host-to-device copy it
    makes (an item assignment of a number did, and the tool fell back to eager). Fake CUDA tensors: no GPU needed."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), torch.device("cuda"):
        model = EDSC(multiple=multiple, head_layout=layout, head_tails=tails).eval()
        first, second = (torch.rand(1, 3, 64, 64).contiguous(memory_format=torch.channels_last) for _ in range(2))
        time = torch.full((1,), 0.3) if multiple else None
        recorder = _HostOperands()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16, enabled=autocast), recorder:
            out = model(first, second, time)
    assert out.shape == (1, 3, 64, 64) and out.device.type == "cuda"
    assert recorder.found == []


@pytest.mark.parametrize("layout", ["grouped", "padded", "wide", "wide_grouped"])
@pytest.mark.parametrize("multiple", [False, True], ids=["EDSC_s", "EDSC_m"])
def test_fused_gradients_of_every_parameter_equal_the_unfused(gen, multiple, layout):
    model = random_edsc(gen, multiple, head_layout=layout)
    first, second = frames(gen, 2, 32, 32)
    target = torch.rand(2, 3, 32, 32, generator=gen, dtype=torch.float64)
    time = torch.tensor([0.25, 0.6], dtype=torch.float64) if multiple else None
    names = [name for name, _ in model.named_parameters()]

    def grads(fused: bool):
        inputs = [first.clone().requires_grad_(), second.clone().requires_grad_()]
        loss = F.l1_loss(run(model, fused, *inputs, time), target)
        return torch.autograd.grad(loss, [*inputs, *model.parameters()], allow_unused=True)

    expected, actual = grads(False), grads(True)
    for name, a, b in zip(["first", "second", *names], actual, expected):
        assert b is not None and a is not None, name
        assert rel_error(a, b) < 1e-11, name
        if multiple and name.endswith(".0.weight") and "Bias" not in name:  # the time column on its own
            assert rel_error(a[:, -1], b[:, -1]) < 1e-11, name
    # Every head and every stage gets a gradient (none is left out of the fused graph).
    assert all(b.abs().sum() > 0 for b in expected[2:])


# --------------------------------------------------------------------------------------------
# Issue #43's speed options (each an explicit argument, off by default): the cuDNN convolution + ReLU
# fusion, the weight cache, the half-precision upsampling and the compiled recipe, against the original
# composition.

def _fused_op_calls(model, *args, grad: bool = False):
    """How many times the forward calls the fused convolution + ReLU op, and its output."""
    calls = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "conv2d_relu" in str(func):
                calls.append(func)
            return func(*args, **(kwargs or {}))

    with torch.set_grad_enabled(grad), Recorder():
        out = model(*args)
    return len(calls), out


@pytest.mark.parametrize("layout, fused_calls", [("padded", 34), ("wide", 23), ("wide_grouped", 13)])
@pytest.mark.parametrize("multiple", [False, True], ids=["EDSC_s", "EDSC_m"])
def test_conv_relu_runs_each_convolution_and_its_relu_as_one_call_in_inference(gen, multiple, layout, fused_calls):
    """conv_relu=True: every convolution followed by a ReLU is one call of the fused op (the trunk's first
    convolution; the heads' first three layers, but the wide layouts' first layer, whose ReLU runs per
    head, and the grouped second layer; on CUDA the 30 heterogeneous convolutions too, folded, which the
    CPU runs as two convolutions), in float64 the unfused network's values; with gradients, or unfused,
    the op never runs (it has no backward)."""
    model = random_edsc(gen, multiple, head_layout=layout, conv_relu=True)
    first, second = frames(gen, 1, 32, 64)
    time = torch.tensor([0.3], dtype=torch.float64) if multiple else None
    calls, out = _fused_op_calls(model, first, second, time)
    assert calls == fused_calls
    with torch.no_grad():
        assert rel_error(out, run(model, False, first, second, time)) < 1e-12
    model.fused = True
    assert _fused_op_calls(model, first, second, time, grad=True)[0] == 0
    model.fused = False
    assert _fused_op_calls(model, first, second, time)[0] == 0


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last], ids=["nchw", "cl"])
@pytest.mark.parametrize("shape, groups", [((2, 8, 5, 7), 1), ((1, 16, 1, 1), 2), ((1, 8, 4, 6), 4)])
def test_conv2d_relu_op_is_relu_of_conv2d_in_the_inputs_memory_format(gen, memory_format, shape, groups):
    """The fused op's real and fake kernels agree (torch.library.opcheck: schema, fake tensor, AOT
    dispatch), in both memory formats and with size-1 spatial dimensions (whose strides are ambiguous)."""
    x = torch.randn(shape, generator=gen, dtype=torch.float64).contiguous(memory_format=memory_format)
    weight = torch.randn(12, shape[1] // groups, 3, 3, generator=gen, dtype=torch.float64)
    bias = torch.randn(12, generator=gen, dtype=torch.float64)
    torch.library.opcheck(models_module._conv2d_relu_op, (x, weight, bias, 1, groups))
    out = models_module.conv2d_relu(x, weight, bias, 1, groups)
    assert_close(out, F.relu(F.conv2d(x, weight, bias, padding=1, groups=groups)))
    fake = models_module._conv2d_relu_fake(x, weight, bias, 1, groups)
    assert out.shape == fake.shape and out.stride() == fake.stride()
    # Under autocast the op runs in autocast's dtype, as F.conv2d would.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert models_module.conv2d_relu(x.float(), weight.float(), bias.float(), 1, groups).dtype == torch.bfloat16


def _counting(monkeypatch, name: str) -> list:
    calls = []
    real = getattr(models_module, name)
    monkeypatch.setattr(models_module, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_cache_weights_keeps_the_fused_weights_while_the_parameters_are_unchanged(gen, monkeypatch):
    model = random_edsc(gen, multiple=True, dtype=torch.float32, head_layout="wide", cache_weights=True).eval()
    reference = EDSC_m(fused=False).eval()
    first, second = frames(gen, 1, 32, 64, torch.float32)
    folds = _counting(monkeypatch, "block_diagonal")  # 30 HetConv2d fold their 1x1 terms with it
    pads = _counting(monkeypatch, "_zero_channels")  # not a weight: made on every call

    def check():
        reference.load_state_dict(model.state_dict())
        with torch.no_grad():
            assert rel_error(model(first, second, 0.3), reference(first, second, 0.3)) < 1e-5

    with torch.no_grad():
        model(first, second, 0.3)
        assert len(folds) == 30
        model(first, second, 0.3)
        assert len(folds) == 30 and len(pads) == 2 * 2  # the weights were kept; the frames' zeros were not
    check()
    # An in-place update bumps the parameter's version: its module's weights are made again, once.
    with torch.no_grad():
        model.moduleConv3[2].conv1x1.weight.mul_(2)
        model.moduleMask1[0].bias.add_(0.5)  # a head's first layer: the wide weight
    check()
    assert len(folds) == 31
    # An optimizer step too (under gradients nothing is kept: every call folds).
    model.train()
    F.l1_loss(model(first, second, 0.3), first).backward()
    assert len(folds) == 61
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    model.eval()
    check()
    # Writes through .data bypass the version counter: kept weights stay until clear_weight_cache (a
    # parameter that only enters a derived weight: one kept as it is shares its storage).
    with torch.no_grad():
        before = model(first, second, 0.3)
        model.moduleConv2[0].conv1x1_.weight.data.mul_(3)
        assert torch.equal(model(first, second, 0.3), before)
    model.clear_weight_cache()
    check()
    # Kept in autocast's dtype: a bfloat16 call keeps bfloat16 weights (in place of the float32 ones).
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(first, second, 0.3)
    kept = model.moduleConv2[0].__dict__["_weight_cache"]["grouped_and_1x1"][1]
    assert all(w.dtype == torch.bfloat16 for w in kept)
    model.cache_weights = False
    assert all("_weight_cache" not in m.__dict__ for m in model.modules())
    folds.clear()
    with torch.no_grad():
        model(first, second, 0.3)
        model(first, second, 0.3)
    assert len(folds) == 60


def test_half_upsampling_is_an_attribute_of_every_upsampling_with_unchanged_values(gen):
    """half_upsampling reaches every Upsample2x (the trunk's four, the heads' eleven); the values are
    the same (CPU autocast keeps the half type anyway; CUDA's float32 result is rounded once, as the
    next convolution's cast would: tested on the GPU)."""
    assert EDSC_s().half_upsampling is models_module.DEFAULT_HALF_UPSAMPLING
    model = random_edsc(gen, multiple=False, dtype=torch.float32, head_layout="padded", half_upsampling=False)
    upsamplings = [m for m in model.modules() if isinstance(m, models_module.Upsample2x)]
    assert len(upsamplings) == 15 and not any(m.keep_half for m in upsamplings)
    first, second = frames(gen, 1, 32, 32, torch.float32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        before = model(first, second)
        model.half_upsampling = True
        assert all(m.keep_half for m in upsamplings) and "half_upsampling=True" in repr(model)
        assert torch.equal(model(first, second), before)
    x = torch.randn(1, 4, 5, 6, generator=gen).bfloat16()
    assert torch.equal(models_module.upsample2x(x, half=True), models_module.upsample2x(x))


def test_compile_edsc_traces_every_option_in_one_graph(gen):
    """The compiled recipe with every option, traced whole (fullgraph: a graph break raises) through
    AOTAutograd (the fused op's fake kernel included), inference and a training step, against eager;
    cudnn_benchmark is on inside the calls only."""
    model = random_edsc(gen, multiple=True, dtype=torch.float32, head_layout="wide", conv_relu=True,
                        half_upsampling=True, cache_weights=True)
    first, second = frames(gen, 2, 32, 32, torch.float32)
    time = torch.tensor([0.3, 0.6])
    tuning = torch.backends.cudnn.benchmark
    compiled = compile_edsc(model, None, cuda_graphs=False, cudnn_benchmark=True, fullgraph=True, backend="aot_eager")
    assert compiled.options == {"triton.cudagraphs": False} and compiled.cudnn_benchmark
    with torch.no_grad():
        assert rel_error(compiled(first, second, time), run(model, False, first, second, time)) < 1e-5
    assert torch.backends.cudnn.benchmark == tuning
    model.fused = True
    target = torch.rand(2, 3, 32, 32, generator=gen)
    names = [name for name, _ in model.named_parameters()]

    def gradients(net):
        return torch.autograd.grad(F.l1_loss(net(first, second, time), target), list(model.parameters()))

    for name, a, b in zip(names, gradients(compiled), gradients(model)):
        assert rel_error(a, b) < 1e-4, name
    options = compile_edsc(model, torch.bfloat16, freezing=True, max_autotune=True).options
    assert options == {"triton.cudagraphs": True, "freezing": True, "max_autotune": True}
    with pytest.raises(ValueError, match="autocast_dtype must be"):
        compile_edsc(model, torch.float64)


def test_network_flops_are_the_issues_figures():
    """FLOPs counted on meta tensors: EDSC_s at 1088x1920 as CUDA runs it (padded heads, folded
    convolutions; conv2d_relu counted as the convolution it is) is the issue's 1718 GFLOP, the wide layout the
    same arithmetic, the original composition
    1135; a training step is its forward and backward, all in the convolutions."""
    case = model_benchmark.Case("inference", 1, 1088, 1920)
    edsc_s = EDSC_s()
    padded = model_benchmark.network_flops(edsc_s, case)
    assert round(padded["total"] / 1e9) == 1718 and padded["convolution"] == padded["total"]
    assert model_benchmark.network_flops(edsc_s, case, "wide") == padded
    assert round(model_benchmark.network_flops(edsc_s, case, fused=False)["total"] / 1e9) == 1135
    assert round(model_benchmark.network_flops(EDSC_m(), case, "padded")["total"] / 1e9) == 1766
    # EDSC_m's wide layout gives the bias head the 72 channels the others read (64 when padded): +0.3%.
    assert round(model_benchmark.network_flops(EDSC_m(), case, "wide")["total"] / 1e9) == 1771
    train = model_benchmark.network_flops(edsc_s, model_benchmark.Case("training", 16, 256, 256), compiled=True)
    forward = model_benchmark.network_flops(edsc_s, model_benchmark.Case("inference", 16, 256, 256), "padded")
    assert 2.5 * forward["total"] < train["total"] < 3.1 * forward["total"]


def test_models_import_without_the_flop_counter_and_register_its_formula_when_it_comes():
    """Importing the models leaves torch.utils.flop_counter (and the Triton it loads) unimported, for the
    video tool's start-up; a FlopCounterMode made after it still counts the fused conv2d_relu as its
    convolution's 2 * N * C_out * H * W * C_in * KH * KW FLOPs."""
    script = """
import sys
import torch
import edsc_ext.models
assert "torch.utils.flop_counter" not in sys.modules
assert "triton" not in sys.modules
from torch.utils.flop_counter import FlopCounterMode
from edsc_ext.models.networks import conv2d_relu
x, w, b = torch.randn(2, 4, 6, 7), torch.randn(5, 4, 3, 3), torch.randn(5)
with FlopCounterMode(display=False) as counter:
    out = conv2d_relu(x, w, b, 1)
assert counter.get_total_flops() == 2 * 2 * 5 * 6 * 7 * 4 * 3 * 3, counter.get_total_flops()
assert torch.equal(out, torch.relu(torch.nn.functional.conv2d(x, w, b, padding=1)))
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_the_networks_first_pass_imports_no_dynamo():
    """A network's first inference pass (the video tool's start-up) leaves torch._dynamo unimported: its
    import (sympy and the rest) cost seconds of the tool's first frame on a cold disk when the fused
    conv2d_relu op was a torch.library.custom_op, whose kernel wrapper imports Dynamo on its first call.
    Once Dynamo is imported, torch.compile still keeps out of the op's kernel (one graph, the op in it)."""
    script = """
import sys
import torch
from edsc_ext.models import EDSC_s
model = EDSC_s().eval()
first, second = torch.rand(1, 3, 32, 64), torch.rand(1, 3, 32, 64)
with torch.no_grad():
    out = model(first, second)
assert "torch._dynamo" not in sys.modules, "the first pass imported torch._dynamo"
from torch._dynamo.testing import CompileCounter
counter = CompileCounter()
with torch.no_grad():
    compiled = torch.compile(model, backend=counter, fullgraph=True)(first, second)
assert counter.frame_count == 1 and torch.equal(compiled, out), (counter.frame_count, (compiled - out).abs().max())
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_model_benchmark_recipe_reports_families_flops_and_the_gemm_peak(tmp_path, capsys):
    """--recipe: each case in the recipe's precision (float16 inference, bfloat16 training; here the
    eager fused network, which the CPU can run: the compiled-and-replayed recipe needs CUDA), profiled:
    kernel time by family, the FLOPs as run and of the original composition, the convolutions' rate and its
    share of the GEMM rate measured in the same run, all positive and finite."""
    path = tmp_path / "recipe.json"
    rc = model_benchmark.main(["--device", "cpu", "--models", "EDSC_s", "--recipe", "--variants",
                               "fused-fp16-cl,fused-bf16-cl", "--sizes", "1x32x32", "--train-sizes", "2x32x32",
                               "--warmup", "1", "--rounds", "1", "--profile-calls", "1", "--json", str(path),
                               "--quiet"])
    assert rc == 0
    data = json.loads(path.read_text())
    assert data["meta"]["recipe"] and set(data["meta"]["peak_tflops"]) == {"fp16", "bf16"}
    assert all(math.isfinite(v) and v > 0 for v in data["meta"]["peak_tflops"].values())
    rows = data["rows"]
    assert [(r["case"], r["variant"]) for r in rows] == [("inference 1x3x32x32", "fused-fp16-cl"),
                                                         ("training 2x3x32x32", "fused-bf16-cl")]
    for r in rows:
        assert r["status"] == "ok" and r["kernels"], r
        for key in ("flops", "conv_flops", "model_flops", "conv_ms", "conv_tflops", "peak_tflops",
                    "conv_peak_fraction", "kernel_ms"):
            assert r[key] is not None and math.isfinite(r[key]) and r[key] > 0, (key, r[key])
        assert r["model_flops"] < r["flops"]  # folded (CPU: the CUDA form counted) and padded: more arithmetic
        assert math.isclose(r["conv_ms"], sum(k["ms"] for k in r["kernels"] if k["kind"] == "convolution"))
    out = capsys.readouterr().out
    assert "dense GEMM rate measured in this run" in out
    header = next(line for line in out.splitlines() if line.startswith("| model | case | variant | ms | kernel ms"))
    for column in ("GFLOP as run", "GFLOP original", "conv TFLOP/s", "% of GEMM peak", "convolution"):
        assert f"| {column} |" in header, header
    families = [line for line in out.splitlines() if line.startswith("| EDSC_s | inference 1x3x32x32 | fused-fp16")]
    assert len(families) == 2  # the main table's row and the families table's


def _network_variants():
    spec = importlib.util.spec_from_file_location("network_variants", REPO / "tools" / "network_variants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_network_variants_cpu_smoke_run(tmp_path, capsys):
    """tools/network_variants.py on the CPU (tiny frames, eager paths; CUDA graphs skipped): every row
    measured, float32 within rounding of the original composition, the options applied (the wide heads
    run one 704-channel convolution), the profiled variant with its families and FLOPs, JSON and markdown
    written, the short table printed last."""
    tool = _network_variants()
    rc = tool.main(["--out", str(tmp_path), "--device", "cpu", "--cases", "tiny,tinytrain", "--variants",
                    "eager:base,eager:all,graph:base", "--profile", "eager:all", "--rounds", "1", "--warmup", "0",
                    "--profile-calls", "1"])
    assert rc == 0
    data = json.loads((tmp_path / "variants.json").read_text())
    rows = {(r["case"], r["variant"]): r for r in data["rows"]}
    assert len(rows) == 6
    for case in ("tiny", "tinytrain"):
        assert rows[(case, "graph:base")]["status"] == "skipped"
        for variant in ("eager:base", "eager:all"):
            r = rows[(case, variant)]
            assert r["status"] == "ok" and r["ms"] > 0 and r["first_call_s"] > 0, r
            assert r["deviation"] < 1e-4 and math.isfinite(r["deviation_vs_base"]), r
    assert rows[("tinytrain", "eager:all")]["note"] == "left out in training: convrelu+cache"
    profile = rows[("tiny", "eager:all")]["profile"]
    assert profile["kernels"] and profile["flops"] > 0 and profile["conv_tflops"] > 0
    assert rows[("tiny", "eager:base")]["profile"] is None
    text = (tmp_path / "variants.md").read_text()
    assert "## Where the time goes (profiled variants)" in text and "| GFLOP as run |" in text
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| model | case | variant | ms |") and out[-1].startswith("6 rows in")
    variant = tool.parse_variant("compiled:all")
    assert variant.options == ("wide", "halfup", "bench", "convrelu", "freeze")
    assert tool.parse_variant("graph:core+cache").options == ("wide", "halfup", "bench", "cache")
    assert variant.applicable(tool.CASES["train"]) == (("wide", "halfup", "bench"), ("convrelu", "freeze"))
    # What the compiled rows report of inductor's code: here on a hand-written excerpt of it.
    stats = tool.code_stats(["def call(args):\n"
                             "    # buf9 = empty_strided_cuda((1, 8, 4, 4), (128, 16, 4, 1), torch.float16)\n"
                             "    buf1 = empty_strided_cuda((1, 64, 54, 96), (331776, 5184, 96, 1), torch.float16)\n"
                             "    buf4 = empty_strided_cuda((1, 64, 54, 96), (331776, 1, 6144, 64), torch.float16)\n"
                             "    buf5 = empty_strided_cuda((32, 64, 3, 3), (576, 9, 3, 1), torch.float16)\n"
                             "    triton_poi_fused_clone_3.run(buf0, buf1, 100, stream=stream0)\n"
                             "    triton_poi_fused__to_copy_convolution_relu_4.run(buf1, buf4, 100, stream=stream0)\n"
                             "    buf2 = extern_kernels.convolution(buf4, arg1, stride=(1, 1))\n"
                             "    buf3 = torch.ops.edsc_ext_models.conv2d_relu.default(buf2, arg3, arg4, 1, 1)\n"])
    assert stats == {"graphs": 1, "triton_launches": 2, "convolutions": 1, "custom_ops": 1, "buffers_4d": 3,
                     "buffers_not_channels_last": ["(1, 64, 54, 96), (331776, 5184, 96, 1)"],
                     "weights_not_channels_last": 1, "copy_only_kernels": ["triton_poi_fused_clone_3"]}
    for bad, message in (("graph:freeze", "options of the compiled path"), ("compiled:wide+grouped", "head layout"),
                         ("compiled:fast", "unknown option"), ("jit:base", "PATH:OPTION")):
        with pytest.raises(ValueError, match=message):
            tool.parse_variant(bad)


def test_fused_model_keeps_the_original_state_and_follows_its_updates(gen, tmp_path):
    model = random_edsc(gen, multiple=True, dtype=torch.float32)  # checkpoints load into float32 models
    # The fused path keeps no state of its own: the same keys, shapes and tensors as the unfused.
    assert model.fused
    unfused = EDSC_m(fused=False)
    assert [(k, v.shape) for k, v in model.state_dict().items()] == \
           [(k, v.shape) for k, v in unfused.state_dict().items()]
    save_checkpoint(model, tmp_path / "m.pth")
    loaded = load_checkpoint(tmp_path / "m.pth")
    assert loaded.fused and all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                                  loaded.state_dict().values()))
    unfused.load_state_dict(torch.load(tmp_path / "m.pth", weights_only=True)["model_state"])
    loaded, unfused = loaded.double(), unfused.double()  # compare in float64
    first, second = frames(gen, 1, 32, 64)
    with torch.no_grad():
        assert rel_error(loaded(first, second, 0.4), unfused(first, second, 0.4)) < 1e-12
    # An optimizer step on the fused path moves the original parameters, and the next call reads them.
    optimizer = torch.optim.SGD(loaded.parameters(), lr=0.1)
    F.l1_loss(loaded(first, second, 0.4), first).backward()
    optimizer.step()
    assert not torch.equal(loaded.moduleOffset2x[4].weight, unfused.moduleOffset2x[4].weight)
    with torch.no_grad():
        after = loaded(first, second, 0.4)
        unfused.load_state_dict(loaded.state_dict())
        assert rel_error(after, unfused(first, second, 0.4)) < 1e-12
        # No cached weights: edits that bypass the version counter (.data) show at once too.
        loaded.eval()
        loaded.moduleConv3[2].conv1x1.weight.data.mul_(2)
        loaded.moduleMask1[7].bias.data.add_(1)
        unfused.load_state_dict(loaded.state_dict())
        assert rel_error(loaded(first, second, 0.4), unfused(first, second, 0.4)) < 1e-12


@needs_tables
@pytest.mark.parametrize("name", ["EDSC_s", "EDSC_m"])
def test_fused_and_unfused_state_dicts_are_the_released_layout(name):
    expected = read_table(TABLES / f"{name}_state_dict.tsv")
    for fused in (True, False):
        for layout in HEAD_LAYOUTS:
            model = EDSC(multiple=name == "EDSC_m", fused=fused, head_layout=layout)
            assert [(k, str(tuple(v.shape))) for k, v in model.state_dict().items()] == expected


def test_fused_switch_reaches_every_hetconv_and_is_validated():
    model = EDSC_s(fused=False)
    hetconvs = [m for m in model.modules() if isinstance(m, HetConv2d)]
    assert len(hetconvs) == 30 and not any(m.fused for m in hetconvs)
    model.fused = True
    assert all(m.fused for m in hetconvs) and "fused=True" in repr(model)
    with pytest.raises(ValueError, match="head_layout must be one of"):
        EDSC(head_layout="wider")
    with pytest.raises(ValueError, match="capture needs frames on a CUDA device, got first on cpu"):
        model.capture(torch.rand(1, 3, 32, 32), torch.rand(1, 3, 32, 32))


def test_edsc_m_per_sample_time_fused(gen):
    model = random_edsc(gen, multiple=True)
    first, second = frames(gen, 3, 32, 32)
    times = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    with torch.no_grad():
        batch = run(model, True, first, second, times)
        assert rel_error(batch, run(model, False, first, second, times)) < 1e-12
        for i, t in enumerate(times.tolist()):
            assert rel_error(batch[i:i + 1], run(model, True, first[i:i + 1], second[i:i + 1], t)) < 1e-12
        # A per-pixel time map (the heads' half resolution) goes through the fused first layer too.
        ramp = torch.linspace(0.1, 0.9, 16, dtype=torch.float64).expand(3, 1, 16, 16)
        assert rel_error(run(model, True, first, second, ramp), run(model, False, first, second, ramp)) < 1e-12
        assert not torch.allclose(batch[0], batch[2])


def test_interpolate_frames_not_multiples_of_32_fused_equals_unfused(gen):
    for multiple in (False, True):
        model = random_edsc(gen, multiple)
        first, second = frames(gen, 1, 45, 70)
        time = 0.3 if multiple else None
        model.fused = True
        fused = model.interpolate(first[0], second[0], time)  # (3, H, W) frames
        model.fused = False
        unfused = model.interpolate(first, second, time)
        assert fused.shape == (3, 45, 70) and fused.min() >= 0 and fused.max() <= 1
        assert unfused.shape == (1, 3, 45, 70) and rel_error(fused, unfused[0]) < 1e-12


@requires_cuda
@pytest.mark.parametrize("autocast_dtype", [None, torch.float16, torch.bfloat16])
def test_capture_replays_the_eager_network(gen, strict_float32, autocast_dtype):
    # float32 at 1e-5 needs cuDNN without TF32: the capture's warm-up and eager may pick different algorithms.
    model = random_edsc(gen, multiple=True, dtype=torch.float32).cuda().eval()
    first, second = (f.cuda() for f in frames(gen, 2, 64, 96, torch.float32))
    times = torch.tensor([0.3, 0.7], device="cuda")
    captured = model.capture(first, second, times, autocast_dtype=autocast_dtype)
    with torch.no_grad(), torch.autocast("cuda", dtype=autocast_dtype or torch.float16,
                                         enabled=autocast_dtype is not None):
        expected = model(first, second, times)
    tol = {None: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}[autocast_dtype]
    assert rel_error(captured(first, second, times), expected) < tol
    # New inputs and an in-place weight update are both seen by the replay.
    new_first, new_second = (f.cuda() for f in frames(gen, 2, 64, 96, torch.float32))
    with torch.no_grad():
        model.moduleBias[7].bias.add_(0.5)
        model.moduleConv2[0].conv1x1.weight.mul_(1.5)
        expected = model(new_first, new_second, torch.tensor([0.6, 0.2], device="cuda"))
    if autocast_dtype is None:
        assert rel_error(captured(new_first, new_second, [0.6, 0.2]), expected) < tol
    with pytest.raises(ValueError, match="captured shape"):
        captured(first[:1], second[:1], times)


# --------------------------------------------------------------------------------------------
# CUDA: the fused network in every precision and head layout, its gradients, torch.compile, and
# half precision on real frames. float32 runs without TF32 (strict_float32), so that it compares to
# float32 rounding; the half types compare through the float64 network: the fused path may not add
# error to what the precision itself costs the original composition.

CUDA_PRECISIONS = [None, torch.float16, torch.bfloat16]
CUDA_PRECISION_IDS = ["fp32", "fp16", "bf16"]


@pytest.fixture
def strict_float32():
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def cuda_autocast(dtype):
    return torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None)


def float64_twin(model: EDSC) -> EDSC:
    """The unfused float64 network with ``model``'s weights, on its device."""
    twin = EDSC(multiple=model.multiple, fused=False, sampling=model.sampling).double()
    twin.load_state_dict(model.state_dict())
    return twin.to(next(model.parameters()).device)


def cuda_case(gen, multiple: bool, n: int, h: int, w: int, channels_last: bool = False):
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    first, second = (f.cuda().contiguous(memory_format=fmt) for f in frames(gen, n, h, w, torch.float32))
    time = torch.tensor([0.3, 0.7][:n], device="cuda") if multiple else None
    return first, second, time


def as_double(*args):
    return [None if a is None else a.double() for a in args]


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
@pytest.mark.parametrize("autocast_dtype", CUDA_PRECISIONS, ids=CUDA_PRECISION_IDS)
@pytest.mark.parametrize("multiple", [False, True], ids=["EDSC_s", "EDSC_m"])
def test_cuda_fused_inference_equals_the_unfused_in_every_precision(gen, strict_float32, multiple, autocast_dtype,
                                                                   channels_last):
    model = random_edsc(gen, multiple, dtype=torch.float32, head_layout="auto").cuda().eval()
    args = cuda_case(gen, multiple, 2 if multiple else 1, 64, 96, channels_last)
    with torch.no_grad():
        expected = float64_twin(model)(*as_double(*args))
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        with cuda_autocast(autocast_dtype):
            unfused_error = rel_error(run(model, False, *args), expected)
            errors = {}
            for layout in HEAD_LAYOUTS:  # "auto" is "padded" here: CUDA inference
                model.head_layout = layout
                out = run(model, True, *args)
                assert out.dtype == torch.float32 and out.shape == expected.shape, layout
                errors[layout] = rel_error(out, expected)
    if autocast_dtype is None:
        assert unfused_error < 1e-5 and max(errors.values()) < 1e-5, (unfused_error, errors)
    else:
        assert unfused_error < {torch.float16: 2e-2, torch.bfloat16: 1e-1}[autocast_dtype], unfused_error
        assert max(errors.values()) <= 2 * unfused_error + 1e-5, (unfused_error, errors)


def _all_gradients(model: EDSC, fused: bool, args, target, autocast_dtype=None, scale: float = 1.0):
    model.fused = fused
    with cuda_autocast(autocast_dtype):
        loss = F.mse_loss(model(*args), target.to(args[0].dtype)) * scale
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return torch.cat([g.reshape(-1).double() for g in grads]) / scale


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("autocast_dtype", CUDA_PRECISIONS, ids=CUDA_PRECISION_IDS)
@pytest.mark.parametrize("layout", ["auto", "grouped", "padded"])
@pytest.mark.parametrize("multiple", [False, True], ids=["EDSC_s", "EDSC_m"])
def test_cuda_fused_gradients_equal_the_unfused_in_every_precision(gen, strict_float32, multiple, layout,
                                                                  autocast_dtype):
    """Training on CUDA ("auto" is per_head there): the gradient of every parameter, all together,
    against the float64 network's; float16 with the loss scaled as a GradScaler would."""
    model = random_edsc(gen, multiple, dtype=torch.float32, head_layout=layout).cuda()
    args = cuda_case(gen, multiple, 2, 64, 64)
    target = torch.rand(2, 3, 64, 64, generator=gen).cuda()
    twin = float64_twin(model)
    expected = _all_gradients(twin, False, as_double(*args), target)
    scale = 1024.0 if autocast_dtype is torch.float16 else 1.0
    unfused = _all_gradients(model, False, args, target, autocast_dtype, scale)
    fused = _all_gradients(model, True, args, target, autocast_dtype, scale)
    unfused_error, fused_error = rel_error(unfused, expected), rel_error(fused, expected)
    if autocast_dtype is None:
        assert unfused_error < 1e-4 and fused_error < 1e-4, (unfused_error, fused_error)
    else:
        assert unfused_error < {torch.float16: 5e-2, torch.bfloat16: 2e-1}[autocast_dtype], unfused_error
        assert fused_error <= 2 * unfused_error + 1e-4, (unfused_error, fused_error)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("autocast_dtype", [None, torch.float16], ids=["fp32", "fp16-cl"])
def test_cuda_compiled_inference_has_no_graph_break_and_matches_eager(gen, strict_float32, autocast_dtype):
    """torch.compile (inductor, mode "default") of the whole network, fullgraph=True: a graph break
    raises. Its error against the float64 network is at most the eager one's, twice, plus rounding."""
    torch._dynamo.reset()
    channels_last = autocast_dtype is not None
    model = random_edsc(gen, False, dtype=torch.float32, head_layout="auto").cuda().eval()
    args = cuda_case(gen, False, 1, 64, 96, channels_last)
    with torch.no_grad():
        expected = float64_twin(model)(*as_double(*args))
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        compiled = torch.compile(model, fullgraph=True)
        with cuda_autocast(autocast_dtype):
            eager_error = rel_error(model(*args), expected)
            compiled_error = rel_error(compiled(*args), expected)
            # A second pair of the same shape runs the compiled code again (no recompile needed).
            again = cuda_case(gen, False, 1, 64, 96, channels_last)
            assert rel_error(compiled(*again), model(*again)) <= 2 * eager_error + 1e-5
    assert compiled_error <= 2 * eager_error + 1e-5, (eager_error, compiled_error)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16], ids=["fp32", "bf16-cl"])
def test_cuda_compiled_training_step_matches_eager_and_scatters_nothing(gen, strict_float32, autocast_dtype):
    """A compiled training step (forward, loss, backward through the padded heads, the upsamplings
    and the op) gives every parameter the eager gradient, and no kernel inductor writes adds
    atomically: the upsamplings' backward is the slices' (upsample2x), not a scatter."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    channels_last = autocast_dtype is not None
    model = random_edsc(gen, False, dtype=torch.float32, head_layout="auto").cuda()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    args = cuda_case(gen, False, 2, 64, 64, channels_last)
    target = torch.rand(2, 3, 64, 64, generator=gen).cuda()

    def forward(*inputs):
        with cuda_autocast(autocast_dtype):
            return model(*inputs)

    compiled = torch.compile(forward, fullgraph=True)

    def gradients(net):
        loss = F.mse_loss(net(*args).float(), target)
        return torch.cat([g.reshape(-1).double() for g in torch.autograd.grad(loss, list(model.parameters()))])

    expected = gradients(forward)
    with torch._inductor.config.patch(force_disable_caches=True):  # a cache hit generates no code to read
        actual, code = run_and_get_code(gradients, compiled)
    assert code and not any("tl.atomic_add(" in source for source in code)
    if autocast_dtype is None:
        assert rel_error(actual, expected) < 1e-4
    else:  # both against the float64 gradients: compiled may not add error to what bfloat16 costs eager
        exact = _all_gradients(float64_twin(model), False, as_double(*args), target)
        eager_error = rel_error(expected, exact)
        assert eager_error < 2e-1 and rel_error(actual, exact) <= 2 * eager_error + 1e-4, eager_error


@requires_cuda
@pytest.mark.cuda
def test_cuda_compiled_per_autocast_dtype_runs_its_own_graph(gen):
    """README's way to compile under autocast (autocast entered inside the compiled function): a
    float16 compile, then a bfloat16 one in the same process, each gives its own eager output
    (torch's compile caches once handed the float16 graph to the bfloat16 compile)."""
    from torch.profiler import ProfilerActivity, profile

    model = random_edsc(gen, False, dtype=torch.float32, head_layout="auto").cuda().eval()
    model = model.to(memory_format=torch.channels_last)
    args = cuda_case(gen, False, 1, 64, 96, channels_last=True)
    with torch.no_grad():
        exact = float64_twin(model)(*as_double(*args))
    for dtype, name, other in ((torch.float16, "f16f16", "bf16"), (torch.bfloat16, "bf16bf16", "f16f16")):
        torch._dynamo.reset()

        def forward(*inputs, dtype=dtype):
            with torch.autocast("cuda", dtype=dtype):
                return model(*inputs)

        compiled = torch.compile(forward, fullgraph=True)
        with torch.no_grad():
            eager_error = rel_error(forward(*args), exact)
            compiled(*args)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                out = compiled(*args)
                torch.cuda.synchronize()
        # cuDNN names its kernels by their dtypes: the convolutions ran in the dtype asked for.
        convolutions = [e.key for e in prof.key_averages() if "implicit_gemm" in e.key or "fprop" in e.key]
        assert convolutions and any(name in k for k in convolutions), (dtype, convolutions)
        assert not any(other in k for k in convolutions), (dtype, convolutions)
        assert rel_error(out, exact) <= 2 * eager_error + 1e-5, (dtype, eager_error)


@needs_pillow
@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("autocast_dtype", CUDA_PRECISIONS, ids=CUDA_PRECISION_IDS)
@pytest.mark.parametrize("multiple", [False, True], ids=["EDSC_s", "EDSC_m"])
def test_cuda_speed_options_keep_the_precisions_error(gen, strict_float32, multiple, autocast_dtype):
    """Issue #43's model options on CUDA (cuDNN's fused convolution + ReLU, the wide heads, half-precision
    upsampling, kept weights), eager and replayed by EDSC.capture with cuDNN autotuning: against the float64
    network, at most twice the original composition's error in the same precision, plus rounding."""
    model = random_edsc(gen, multiple, dtype=torch.float32, head_layout="auto").cuda().eval()
    args = cuda_case(gen, multiple, 2 if multiple else 1, 64, 96, channels_last=True)
    with torch.no_grad():
        expected = float64_twin(model)(*as_double(*args))
        model = model.to(memory_format=torch.channels_last)
        with cuda_autocast(autocast_dtype):
            unfused_error = rel_error(run(model, False, *args), expected)
            errors = {}
            for layout, tails in (("padded", "per_head"), ("wide", "per_head"), ("wide_grouped", "per_head"),
                                  ("padded", "merged_narrow"), ("padded", "merged")):
                model.fused, model.head_layout, model.head_tails = True, layout, tails
                model.conv_relu = model.half_upsampling = model.cache_weights = True
                errors[f"{layout} {tails}"] = rel_error(model(*args), expected)
                errors[f"{layout} {tails} again"] = rel_error(model(*args), expected)  # the kept weights
        # On CUDA the 30 heterogeneous convolutions fuse their ReLU too.
        model.head_layout, model.head_tails = "padded", "per_head"
        assert _fused_op_calls(model, *args)[0] == 64
        model.head_tails = "merged"  # the tails have no ReLU: the same fused calls
        assert _fused_op_calls(model, *args)[0] == 64
    captured = model.capture(*args, autocast_dtype=autocast_dtype, cudnn_benchmark=True)
    errors["captured merged"] = rel_error(captured(*args), expected)
    bound = 2 * unfused_error + 1e-5 if autocast_dtype is not None else 1e-5
    assert max(errors.values()) <= bound, (unfused_error, errors)
    # The upsampling keeps the half type, with the values of float32 rounded once.
    x = torch.randn(1, 8, 17, 24, generator=gen).cuda().half().contiguous(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.float16):
        kept, wide = models_module.upsample2x(x, half=True), models_module.upsample2x(x)
    assert kept.dtype == torch.float16 and wide.dtype == torch.float32 and torch.equal(kept, wide.half())


@requires_cuda
@pytest.mark.cuda
def test_cuda_conv2d_relu_op_equals_convolution_then_relu(gen):
    """cuDNN's fused convolution, bias and ReLU against the two operators, in channels_last half and in
    float32 (TF32 as the process has it), grouped too."""
    for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 2e-2), (torch.float32, 2e-3)):
        for groups in (1, 4):
            x = torch.randn(2, 32, 40, 56, generator=gen).cuda().to(dtype).contiguous(memory_format=torch.channels_last)
            weight = torch.randn(64, 32 // groups, 3, 3, generator=gen).cuda().to(dtype) / 10
            bias = torch.randn(64, generator=gen).cuda().to(dtype)
            # torch.cudnn_convolution_relu runs cuDNN's conv + 0 * z + bias -> ReLU with z its own, uninitialised
            # output: leave NaN where that output will be allocated, so that a kernel reading z would show.
            poison = torch.full((2, 64, 40, 56), float("nan"), dtype=dtype, device="cuda")
            del poison
            out = models_module.conv2d_relu(x, weight, bias, 1, groups)
            assert torch.isfinite(out).all(), (dtype, groups)
            expected = F.relu(F.conv2d(x.double(), weight.double(), bias.double(), padding=1, groups=groups))
            assert out.dtype == dtype and out.is_contiguous(memory_format=torch.channels_last)
            assert rel_error(out, expected) < tol, (dtype, groups)


@requires_cuda
@pytest.mark.cuda
def test_cuda_compile_edsc_with_every_option_matches_eager(gen, strict_float32):
    """The compiled recipe (float16, CUDA graphs) with every option (wide heads, fused convolution +
    ReLU, half upsampling, cuDNN autotuning, inductor's freezing) against eager float16; then a bfloat16
    training step's gradients (the options that apply) against eager bfloat16, both through the float64
    network."""
    torch._dynamo.reset()
    model = random_edsc(gen, False, dtype=torch.float32, head_layout="wide", conv_relu=True,
                        half_upsampling=True).cuda().eval().to(memory_format=torch.channels_last)
    args = cuda_case(gen, False, 1, 64, 96, channels_last=True)
    with torch.no_grad():
        exact = float64_twin(model)(*as_double(*args))
        with cuda_autocast(torch.float16):
            eager_error = rel_error(model(*args), exact)
        compiled = compile_edsc(model, torch.float16, cudnn_benchmark=True, freezing=True)
        for _ in range(3):  # compile, record, replay
            out = compiled(*args).clone()
    assert rel_error(out, exact) <= 2 * eager_error + 1e-5, eager_error
    torch._dynamo.reset()
    model.train()
    target = torch.rand(1, 3, 64, 96, generator=gen).cuda()
    compiled = compile_edsc(model, torch.bfloat16, cudnn_benchmark=True)

    def gradients(net):
        loss = F.mse_loss(net(*args).float(), target)
        return torch.cat([g.reshape(-1).double() for g in torch.autograd.grad(loss, list(model.parameters()))])

    exact = _all_gradients(float64_twin(model), False, as_double(*args), target)
    eager_error = rel_error(gradients(lambda *a: _bf16(model, *a)), exact)
    for _ in range(3):
        actual = gradients(compiled)
    assert eager_error < 2e-1 and rel_error(actual, exact) <= 2 * eager_error + 1e-4, eager_error


def _bf16(model, *args):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return model(*args)


@requires_cuda
@pytest.mark.cuda
@needs_middlebury
@pytest.mark.parametrize("multiple", [False, True], ids=["EDSC_s", "EDSC_m"])
def test_cuda_float16_inference_on_middlebury_is_within_2e_3_of_float32(gen, strict_float32, multiple):
    """README's half-precision way (float16 autocast, model and frames channels_last) on real frames:
    the twelve Middlebury pairs through EDSC.interpolate (pad to 32, crop, clamp), random weights
    (the released ones are not here); relative error against float32 at most 2e-3 on every pair."""
    model = random_edsc(gen, multiple, dtype=torch.float32, head_layout="auto").cuda().eval()
    half = copy.deepcopy(model).to(memory_format=torch.channels_last)
    errors = {}
    for sequence in sorted(p.name for p in MIDDLEBURY.iterdir() if (p / "frame10.png").exists()):
        first, second = (images.read_image(MIDDLEBURY / sequence / f).cuda() for f in ("frame10.png", "frame11.png"))
        time = 0.5 if multiple else None
        with torch.no_grad():
            expected = model.interpolate(first, second, time)
            with torch.autocast("cuda", dtype=torch.float16):
                out = half.interpolate(*(f.unsqueeze(0).contiguous(memory_format=torch.channels_last)
                                         for f in (first, second)), time)[0]
        errors[sequence] = rel_error(out, expected)
    assert len(errors) == 12 and max(errors.values()) <= 2e-3, errors


def test_model_benchmark_kernel_kinds():
    kind = model_benchmark.kernel_kind
    assert kind("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x32x32") == "convolution"
    assert kind("sm80_xmma_wgrad_implicit_gemm_indexed_bf16bf16") == "convolution, weight gradient"
    assert kind("cutlass_tensorop_f16_s16816dgrad_optimized_f16_256x64") == "convolution, data gradient"
    assert kind("void edsc_ext::deform_sepconv_backward_cuda_kernel<3, 5, 5, 5, true, float>") == "edsc_ext op"
    # inductor's kernels are inductor's, whatever operators their names list: by their own name parts
    assert kind("triton_poi_fused__to_copy_convolution_relu_41") == "Triton: elementwise (fused)"
    assert kind("triton_poi_fused_clamp_deform_sepconv_forward_mul_sigmoid_7") == "Triton: elementwise (fused)"
    assert kind("triton_poi_fused__to_copy__unsafe_index_add_arange_clamp_mul_relu_sub_39") == "Triton: upsampling"
    assert kind("triton_poi_fused_add_avg_pool2d_relu_4") == "Triton: pooling"
    assert kind("triton_red_fused_sum_3") == "Triton: reductions"
    assert kind("triton_tem_fused_convolution_0") == "convolution (Triton template)"
    assert kind("void nhwcAddPaddingKernel<__half, __half, float, true>") == "layout conversion"
    assert kind("void cudnn::ops::nchwToNhwcKernel<__half, __half, float, false, true>") == "layout conversion"
    assert kind("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float>") == "copies"
    assert kind("aten::upsample_bilinear2d_backward") == "upsampling"
    assert kind("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>") == "elementwise and other"
    assert set(model_benchmark.CONVOLUTION_KINDS) <= {k for k, _ in model_benchmark.KERNEL_KINDS} | {
        k for k, _ in model_benchmark.TRITON_KINDS}


def test_model_benchmark_cpu_quick_table(tmp_path, capsys):
    path = tmp_path / "models.json"
    variants = ["unfused-fp32", "fused-fp32-gr", "fused-bf16-cl", "graph-fp32", "compiledgraph-fp16-cl"]
    tuning = torch.backends.cudnn.benchmark
    rc = model_benchmark.main(["--device", "cpu", "--models", "EDSC_m", "--variants", ",".join(variants),
                               "--sizes", "1x32x32", "--train-sizes", "2x32x32", "--warmup", "1", "--rounds", "1",
                               "--cudnn-benchmark", "--profile", "4", "--profile-calls", "2", "--json", str(path)])
    assert rc == 0
    assert torch.backends.cudnn.benchmark == tuning  # on for the run only
    data = json.loads(path.read_text())
    assert data["meta"]["cudnn_benchmark"] is True
    rows = data["rows"]
    cases = [case["name"] for case in data["cases"]]
    assert cases == ["inference 1x3x32x32", "training 2x3x32x32"]
    assert [(r["model"], r["case"], r["variant"]) for r in rows] == [
        ("EDSC_m", case, variant) for case in cases for variant in variants]
    for r in rows:
        if r["variant"] in ("graph-fp32", "compiledgraph-fp16-cl"):
            assert r["status"] == "skipped" and "CUDA" in r["note"], r
            continue
        assert r["status"] == "ok", r
        assert len(r["rounds_ms"]) == 1 and r["ms"] > 0 and r["per_s"] > 0 and r["peak_mib"] is None, r
        # --profile: the CPU's aten operators by self time, longest first, the convolutions among them.
        kernels = r["kernels"]
        assert kernels and all(k["name"].startswith("aten::") and k["ms"] > 0 for k in kernels), r
        assert [k["ms"] for k in kernels] == sorted((k["ms"] for k in kernels), reverse=True)
        assert any(k["kind"] == "convolution" for k in kernels) and math.isclose(
            r["kernel_ms"], sum(k["ms"] for k in kernels)), kernels[:5]
        assert math.isfinite(r["deviation"]) and r["deviation"] >= 0, r
        if "fp32" in r["variant"]:  # the same function in float32: rounding apart
            assert r["deviation"] < 1e-4, r
    assert all(r["deviation"] == 0 for r in rows if r["variant"] == "unfused-fp32")
    for bad in ("fused", "fused-fp8", "unfused-fp32-bd", "fused-fp16-bd-ph"):
        with pytest.raises(ValueError, match="variant"):
            model_benchmark.parse_variant(bad)
    captured = capsys.readouterr()
    out = captured.out
    assert "| model | case | variant |" in out and "edsc-model-benchmark" in out
    for variant in variants:
        assert f"| {variant} |" in out
    profiled = [r for r in rows if r["status"] == "ok"]
    assert "## Where the time goes (torch.profiler over 2 calls; aten operators" in out
    assert out.count("| kind | ms | share | launches |") == len(profiled)
    assert out.count("| kernel | kind | ms | launches |") == len(profiled)
    sections = out.split("\n### ")[1:]
    assert len(sections) == len(profiled)
    for r, section in zip(profiled, sections):
        assert section.startswith(f"EDSC_m {r['case']} {r['variant']}: {r['kernel_ms']:.2f} ms of aten operators")
        listed = [line for line in section.splitlines() if line.startswith("| `")]
        assert listed == [f"| `{k['name']}` | {k['kind']} | {k['ms']:.3f} | {k['launches']:g} |"
                          for k in r["kernels"][:4]]
    # One progress line per row on stderr, in order, as each is measured.
    progress = captured.err.splitlines()
    assert [line.split(": ")[0] for line in progress] == [
        f"model_benchmark [{i}/{len(rows)}] EDSC_m {r['case']} {r['variant']}" for i, r in enumerate(rows, 1)]
    assert all(line.endswith(" ms") or "skipped: " in line for line in progress), progress


def _load_train_script():
    spec = importlib.util.spec_from_file_location("edsc_train_example", REPO / "examples" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_training_packages
@needs_middlebury
def test_short_training_run_on_middlebury_crops_lowers_the_loss(tmp_path):
    # Two Middlebury triplets, centre-cropped to 32x32, in their own folder layout.
    data = tmp_path / "data"
    for name in ("RubberWhale", "Venus"):
        (data / name).mkdir(parents=True)
        for f in ("frame10.png", "frame10i11.png", "frame11.png"):
            image = images.read_array(MIDDLEBURY / name / f)
            h, w = image.shape[:2]
            images.write_array(data / name / f, image[h // 2 - 16:h // 2 + 16, w // 2 - 16:w // 2 + 16])
    train = _load_train_script()
    out = tmp_path / "run"
    losses = train.main(["--data", str(data), "--out", str(out), "--crop", "32", "--batch-size", "2",
                         "--steps", "15", "--epochs", "100", "--no-augment", "--workers", "0", "--device", "cpu",
                         "--quiet", "--lr", "5e-4"])
    assert len(losses) == 15
    first, last = losses[0], sum(losses[-3:]) / 3
    assert last < 0.75 * first, f"loss did not drop: {losses}"
    checkpoint = torch.load(out / "model_last.pth", weights_only=True)
    assert {"model_state", "epoch", "step", "optimizer_state", "args"} <= set(checkpoint)
    assert load_checkpoint(checkpoint).name == "EDSC_s"
    # Resuming continues the step count.
    more = train.main(["--data", str(data), "--out", str(out), "--crop", "32", "--batch-size", "2", "--steps", "16",
                       "--epochs", "100", "--no-augment", "--workers", "0", "--device", "cpu", "--quiet",
                       "--resume", str(out / "model_last.pth")])
    assert len(more) == 1
    shutil.rmtree(out)


# --------------------------------------------------------------------------------------------
# examples/train.py: step count, progress bar, checkpoints, and bad input. Synthetic 32x32 triplets.

TRAIN_FAST = ["--crop", "32", "--workers", "0", "--device", "cpu", "--no-augment"]


def _write_triplet_folders(root: Path, count: int, names=("im1.png", "im2.png", "im3.png")) -> Path:
    generator = torch.Generator().manual_seed(count)
    for index in range(count):
        folder = root / f"clip{index}"
        folder.mkdir(parents=True)
        for name in names:
            pixels = torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8, generator=generator)
            images.write_array(folder / name, pixels)
    return root


class _RecordedProgress:
    """Stands in for train.py's `progress`: makes its bar (tqdm) and keeps each one."""

    def __init__(self):
        self.bars = []

    def __call__(self, iterable=None, **kwargs):
        from edsc_ext.apps.common import progress

        self.bars.append(progress(iterable, **kwargs))
        return self.bars[-1]


@needs_training_packages
def test_train_steps_runs_exactly_that_many_steps_over_several_epochs(tmp_path, capsys):
    train = _load_train_script()
    train.progress = recorded = _RecordedProgress()
    data, out = _write_triplet_folders(tmp_path / "data", 2), tmp_path / "run"
    # One batch per epoch: 3 steps take 3 epochs, with --epochs left at its default of 1.
    losses = train.main(["--data", str(data), "--out", str(out), "--batch-size", "2", "--steps", "3", *TRAIN_FAST])
    assert len(losses) == 3
    checkpoint = torch.load(out / "model_last.pth", weights_only=True)
    assert set(checkpoint) == {"model_state", "epoch", "step", "optimizer_state", "args"}
    assert (checkpoint["step"], checkpoint["epoch"]) == (3, 3)
    # One bar over all steps, and it shows the last one.
    assert len(recorded.bars) == 1
    bar = recorded.bars[0]
    assert bar.n == bar.total == 3
    assert "loss" in bar.postfix
    captured = capsys.readouterr()
    assert "3/3" in captured.err
    assert f"checkpoints go to {out / 'model_last.pth'}" in captured.out
    assert str(out / "model_best.pth") in captured.out


@needs_training_packages
def test_train_seed_decides_the_initial_weights_and_the_losses(tmp_path):
    """Two runs with one --seed train alike, loss for loss; another seed starts elsewhere. The network was
    built before the seed was set, so its initial weights came from whatever the process had drawn."""
    train = _load_train_script()
    data = _write_triplet_folders(tmp_path / "data", 2)

    def run(seed, out):
        torch.manual_seed(int.from_bytes(os.urandom(4), "little"))  # the process's own state must not matter
        losses = train.main(["--data", str(data), "--out", str(tmp_path / out), "--batch-size", "2", "--steps", "1",
                             "--seed", str(seed), *TRAIN_FAST])
        return losses, torch.load(tmp_path / out / "model_last.pth", weights_only=True)["model_state"]

    (first, weights), (again, weights_again), (other, _) = run(3, "a"), run(3, "b"), run(4, "c")
    assert first == again and first != other
    assert all(torch.equal(weights[k], weights_again[k]) for k in weights)


@needs_training_packages
def test_train_compile_compiles_the_forward_with_autocast_inside(tmp_path, monkeypatch):
    """--compile compiles a function that enters --amp's autocast itself (the dtype is then part of the
    compiled graph), and every step runs through it under autocast."""
    train = _load_train_script()
    seen = []
    network_forward = EDSC.forward

    def recorded_forward(self, *args):
        seen.append(("network", torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return network_forward(self, *args)

    def fake_compile(fn, **kwargs):
        def compiled(*args):
            seen.append(("compiled", torch.is_autocast_enabled("cpu")))
            return fn(*args)
        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(EDSC, "forward", recorded_forward)
    data, out = _write_triplet_folders(tmp_path / "data", 2), tmp_path / "run"
    losses = train.main(["--data", str(data), "--out", str(out), "--batch-size", "2", "--steps", "2", "--compile",
                         "--amp", *TRAIN_FAST])
    # Called outside autocast, the compiled function enters it (bfloat16 on the CPU) around the network.
    assert len(losses) == 2 and seen == [("compiled", False), ("network", True, torch.bfloat16)] * 2


@needs_training_packages
def test_train_keeps_only_the_last_and_the_best_checkpoint(tmp_path):
    train = _load_train_script()
    data, out = _write_triplet_folders(tmp_path / "data", 2), tmp_path / "run"
    val = _write_triplet_folders(tmp_path / "val", 1, names=("frame10.png", "frame10i11.png", "frame11.png"))
    train.main(["--data", str(data), "--val", str(val), "--out", str(out), "--batch-size", "2", "--epochs", "2",
                "--quiet", *TRAIN_FAST])
    assert sorted(p.name for p in out.iterdir()) == ["model_best.pth", "model_last.pth"]
    last = torch.load(out / "model_last.pth", weights_only=True)
    best = torch.load(out / "model_best.pth", weights_only=True)
    assert (last["step"], last["epoch"]) == (2, 2)
    assert best["step"] == best["epoch"] in (1, 2)
    assert load_checkpoint(best).name == "EDSC_s"


@needs_training_packages
def test_train_epochs_bar_counts_epochs_times_batches(tmp_path):
    train = _load_train_script()
    train.progress = recorded = _RecordedProgress()
    data = _write_triplet_folders(tmp_path / "data", 2)
    losses = train.main(["--data", str(data), "--out", str(tmp_path / "run"), "--batch-size", "1", "--epochs", "2",
                         "--quiet", *TRAIN_FAST])
    assert len(losses) == 4
    (bar,) = recorded.bars
    assert bar.disable and bar.n == bar.total == 4


def test_train_checkpoint_writes_are_atomic(tmp_path, monkeypatch):
    train = _load_train_script()
    path = tmp_path / "model_last.pth"
    path.write_bytes(b"the previous checkpoint")

    def crash_midway(model, target, **extra):
        Path(target).write_bytes(b"trunc")
        raise RuntimeError("disk full")

    monkeypatch.setattr(train, "save_checkpoint", crash_midway)
    with pytest.raises(RuntimeError, match="disk full"):
        train.save_atomically(EDSC_s(), path, epoch=1, step=1)
    assert path.read_bytes() == b"the previous checkpoint"
    assert [p.name for p in tmp_path.iterdir()] == ["model_last.pth"]


def test_train_workers_default_to_the_usable_cores_at_most_8(monkeypatch):
    train = _load_train_script()
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert train.default_workers() == min(8, cores)
    assert train.build_parser().parse_args(["--data", "d", "--out", "o"]).workers == min(8, cores)


def _bad_train_inputs(tmp: Path):
    """(arguments, what the error line must say) for each kind of bad input."""
    data = _write_triplet_folders(tmp / "data", 1)
    a_file = tmp / "a_file.txt"
    a_file.write_text("hello\n")
    no_samples = tmp / "no_samples"
    (no_samples / "clip").mkdir(parents=True)
    images.write_array(no_samples / "clip" / "photo.png", torch.zeros(32, 32, 3, dtype=torch.uint8))
    vimeo = tmp / "vimeo"  # the listed sequence lacks im2.png and im3.png
    (vimeo / "sequences" / "00001" / "0001").mkdir(parents=True)
    (vimeo / "tri_trainlist.txt").write_text("00001/0001\n")
    shutil.copy(data / "clip0" / "im1.png", vimeo / "sequences" / "00001" / "0001" / "im1.png")
    tensor_file = tmp / "tensor.pth"
    torch.save(torch.randn(4), tensor_file)
    foreign_pickle = tmp / "foreign.pth"
    foreign_pickle.write_bytes(pickle.dumps(argparse.Namespace(model_state={})))
    edsc_m_checkpoint = tmp / "edsc_m.pth"
    save_checkpoint(EDSC_m(), edsc_m_checkpoint)
    train = ["--data", str(data), "--out", str(tmp / "run")]
    return [
        (["--data", str(tmp / "missing"), "--out", str(tmp / "run")], [f"--data {tmp / 'missing'}: no such folder"]),
        (["--data", str(a_file), "--out", str(tmp / "run")], [f"--data {a_file}: not a folder"]),
        (["--data", str(no_samples), "--out", str(tmp / "run")],
         [f"--data {no_samples}: no samples", "tri_trainlist.txt", "sequences/<id>/im1.png", "sep_trainlist.txt",
          "im1.png, im2.png, im3.png", "frame10.png, frame10i11.png, frame11.png"]),
        (["--data", str(vimeo), "--out", str(tmp / "run")],
         [f"--data {vimeo}", "sequences/00001/0001/im2.png", "missing"]),
        ([*train, "--val", str(tmp / "missing")], [f"--val {tmp / 'missing'}: no such folder"]),
        ([*train, "--val", str(no_samples)], [f"--val {no_samples}: no samples"]),
        ([*train, "--resume", str(tmp / "missing.pth")], [f"--resume {tmp / 'missing.pth'}: no such file"]),
        ([*train, "--resume", str(data)], [f"--resume {data}: not a file"]),
        ([*train, "--resume", str(a_file)], [f"--resume {a_file}: not a checkpoint"]),
        ([*train, "--resume", str(tensor_file)], [f"--resume {tensor_file}: not a checkpoint"]),
        ([*train, "--resume", str(foreign_pickle)], [f"--resume {foreign_pickle}: not a checkpoint"]),
        ([*train, "--resume", str(edsc_m_checkpoint)], [f"--resume {edsc_m_checkpoint}", "EDSC_m"]),
        (["--data", str(data), "--out", str(a_file)], [f"--out {a_file}: exists and is not a folder"]),
        (["--data", str(data), "--out", str(a_file / "run")], [f"--out {a_file / 'run'}: cannot create"]),
        ([*train, "--steps", "0"], ["--steps", "at least 1"]),
        ([*train, "--batch-size", "0"], ["--batch-size", "at least 1"]),
        ([*train, "--epochs", "-1"], ["--epochs", "at least 1"]),
        ([*train, "--crop", "0"], ["--crop", "at least 32"]),
    ]


@needs_pillow
def test_train_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys):
    train = _load_train_script()
    cases = _bad_train_inputs(tmp_path)
    for argv, expected in cases:
        with pytest.raises(SystemExit) as exit_info:
            train.main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2, argv
        assert err.startswith("train.py: error: ") and err.count("\n") == 1, (argv, err)
        for text in expected:
            assert text in err, (argv, err)
    assert not (tmp_path / "run").exists()  # bad input leaves nothing behind


@needs_pillow
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write anywhere")
def test_train_unwritable_out_is_one_line(tmp_path, capsys):
    train = _load_train_script()
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    data = _write_triplet_folders(tmp_path / "data", 1)
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--data", str(data), "--out", str(locked / "run")])
    assert exit_info.value.code == 2
    assert f"--out {locked / 'run'}: cannot create" in capsys.readouterr().err


@needs_pillow
@pytest.mark.parametrize("bad", ["data", "resume"])
def test_train_script_bad_path_exits_2_without_a_traceback(tmp_path, bad):
    data = _write_triplet_folders(tmp_path / "data", 1)
    not_a_checkpoint = tmp_path / "notes.pth"
    not_a_checkpoint.write_text("not a checkpoint\n")
    argv = {"data": ["--data", str(tmp_path / "missing")],
            "resume": ["--data", str(data), "--resume", str(not_a_checkpoint)]}[bad]
    command = [sys.executable, str(REPO / "examples" / "train.py"), *argv, "--out", str(tmp_path / "run")]
    # The script imports the edsc_ext these tests imported, installed or not.
    result = subprocess.run(command, cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    expected = tmp_path / "missing" if bad == "data" else not_a_checkpoint
    assert result.stderr.strip().splitlines()[-1].startswith(f"train.py: error: --{bad} {expected}: ")


# ---------------------------------------------------------------------------------------------
# What a new user of the API hit (issue #45, item 7): errors a person understands.


def write_non_checkpoint(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind.replace(' ', '_')}.pth"
    if kind == "text":
        path.write_text("hello, this is not a checkpoint\n")
    elif kind == "random bytes":
        path.write_bytes(bytes(torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(1),
                                             dtype=torch.uint8).tolist()))
    elif kind == "tensor":
        torch.save(torch.randn(4), path)
    elif kind == "dict of other keys":
        torch.save({"weight": torch.zeros(2), "epoch": 3}, path)
    elif kind == "model_state not a dict":
        torch.save({"model_state": torch.zeros(2)}, path)
    elif kind == "foreign pickle":
        path.write_bytes(pickle.dumps(argparse.Namespace(model_state={})))
    return path


NOT_CHECKPOINTS = ["text", "random bytes", "tensor", "dict of other keys", "model_state not a dict", "foreign pickle"]


@pytest.mark.parametrize("kind", NOT_CHECKPOINTS)
def test_load_checkpoint_of_a_non_checkpoint_says_so_naming_the_file(tmp_path, kind):
    """One line naming the file and what is wrong (was: KeyError: 101 for a text file); the same check
    as edsc-interpolate's, whose message is ``--weights FILE:`` and the same problem."""
    from edsc_ext.apps.common import UserError
    from edsc_ext.apps.engine import load_model

    path = write_non_checkpoint(tmp_path, kind)
    with pytest.raises(ValueError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not ") and "EDSC checkpoint (" in message, message
    assert "\n" not in message and len(message) < 240, message
    with pytest.raises(UserError) as tool:
        load_model(path)
    assert str(tool.value) == f"--weights {message}"


def test_load_checkpoint_of_a_dict_that_is_not_one_names_the_argument():
    with pytest.raises(ValueError, match=r"^checkpoint: not an EDSC checkpoint \(no 'moduleVertical1\.0\.weight'"):
        load_checkpoint({"weight": torch.zeros(2)})


BAD_TIMES = {"1.5": 1.5, "-3": -3, "nan": float("nan"), "0": 0.0, "1": 1, "inf": float("inf"),
             "tensor-1.5": torch.tensor([0.5, 1.5]), "tensor-nan": torch.tensor(float("nan")),
             "tensor-neg": torch.tensor([[-0.25]]), "list-1.5": [0.5, 1.5], "tuple-nan": (float("nan"),)}


@pytest.mark.parametrize("time", BAD_TIMES.values(), ids=BAD_TIMES.keys())
def test_edsc_m_refuses_a_time_outside_0_1(models, gen, time):
    model = models["EDSC_m"]
    first, second = (torch.rand(2, 3, 32, 32, generator=gen) for _ in range(2))
    shown = repr(float(time)) if not isinstance(time, (torch.Tensor, list, tuple)) else None
    for call in (model.interpolate, model):
        with pytest.raises(ValueError, match=r"^time must be in \(0, 1\)") as info:
            call(first, second, time)
        message = str(info.value)
        assert "got" in message and (shown is None or f"got {shown}" in message), message


def test_edsc_m_takes_times_inside_0_1(models, gen):
    model = models["EDSC_m"]
    first, second = (torch.rand(2, 3, 32, 32, generator=gen) for _ in range(2))
    for time in (1e-6, 0.25, 1 - 1e-6, torch.tensor([0.1, 0.9]), torch.tensor(0.5, dtype=torch.float64), [0.1, 0.9]):
        assert torch.isfinite(model.interpolate(first, second, time)).all()


@pytest.mark.parametrize("shape", [(1, 1, 32, 32), (2, 4, 32, 32), (1, 32, 32)], ids=str)
def test_frames_of_another_channel_count_meet_the_models_shape_check(models, gen, shape):
    """Not a raw convolution error: the check names the (N, 3, H, W) BGR frames and the actual shape."""
    model = models["EDSC_s"]
    first, second = (torch.rand(shape, generator=gen) for _ in range(2))
    batched = shape if len(shape) == 4 else (1, *shape)
    with pytest.raises(ValueError, match=r"\(N, 3, H, W\) BGR") as info:
        model.interpolate(first, second)
    assert str(tuple(batched)) in str(info.value)
    if len(shape) == 4:
        with pytest.raises(ValueError, match=r"\(N, 3, H, W\) BGR"):
            model(first, second)


def test_load_state_dict_of_a_whole_checkpoint_says_what_to_do(models, tmp_path):
    """save_checkpoint wraps the weights in {'model_state': ...}: a plain load_state_dict(torch.load(path))
    is told to use load_checkpoint or ['model_state'] (with strict=False it would load nothing, silently)."""
    path = tmp_path / "m.pth"
    save_checkpoint(models["EDSC_m"], path, epoch=2)
    model = EDSC_m()
    checkpoint = torch.load(path, weights_only=True)
    for strict in (True, False):
        with pytest.raises(ValueError, match=r"load_checkpoint") as info:
            model.load_state_dict(checkpoint, strict=strict)
        assert "['model_state']" in str(info.value)
    model.load_state_dict(checkpoint["model_state"])
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), models["EDSC_m"].state_dict().values()))
    assert "load_state_dict" in save_checkpoint.__doc__ and "load_checkpoint" in save_checkpoint.__doc__
