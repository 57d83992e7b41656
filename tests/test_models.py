"""The EDSC networks: checkpoint layout (against the released checkpoints' key tables), loading,
the wiring of the heads into the original layer, EDSC_m's time input, and a short training run."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_close
from edsc_ext import _image, compat
from edsc_ext.models import EDSC, EDSC_m, EDSC_s, load_checkpoint, pad_to_multiple, save_checkpoint

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
TABLES = SHARED / "edsc"
MIDDLEBURY = SHARED / "middlebury"
needs_tables = pytest.mark.skipif(not TABLES.is_dir(), reason=f"{TABLES} is absent")
needs_middlebury = pytest.mark.skipif(not MIDDLEBURY.is_dir(), reason=f"{MIDDLEBURY} is absent")


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
        from edsc_ext.interpolate import load_model
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


def _load_train_script():
    spec = importlib.util.spec_from_file_location("edsc_train_example", REPO / "examples" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_middlebury
def test_short_training_run_on_middlebury_crops_lowers_the_loss(tmp_path):
    # Two Middlebury triplets, centre-cropped to 32x32, in their own folder layout.
    data = tmp_path / "data"
    for name in ("RubberWhale", "Venus"):
        (data / name).mkdir(parents=True)
        for f in ("frame10.png", "frame10i11.png", "frame11.png"):
            image = _image.read_png(MIDDLEBURY / name / f)
            h, w = image.shape[:2]
            _image.write_png(data / name / f, image[h // 2 - 16:h // 2 + 16, w // 2 - 16:w // 2 + 16].contiguous())
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
