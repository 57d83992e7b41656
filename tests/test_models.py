"""The EDSC networks: checkpoint layout (against the released checkpoints' key tables), loading,
the wiring of the heads into the original layer, EDSC_m's time input, and a short training run."""

from __future__ import annotations

import argparse
import importlib.util
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_close, needs_shared_data, shared_data_path
from edsc_ext import compat
from edsc_ext.apps import images
from edsc_ext.models import EDSC, EDSC_m, EDSC_s, load_checkpoint, pad_to_multiple, save_checkpoint

REPO = Path(__file__).resolve().parent.parent
TABLES = shared_data_path("edsc")
MIDDLEBURY = shared_data_path("middlebury")
needs_tables = needs_shared_data("edsc")
needs_middlebury = needs_shared_data("middlebury")


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
            images.write_array(folder / name, torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8, generator=generator))
    return root


class _RecordedProgress:
    """Stands in for train.py's `progress`: makes its bar (tqdm) and keeps each one."""

    def __init__(self):
        self.bars = []

    def __call__(self, iterable=None, **kwargs):
        from edsc_ext.interpolate import progress

        self.bars.append(progress(iterable, **kwargs))
        return self.bars[-1]


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


@pytest.mark.parametrize("bad", ["data", "resume"])
def test_train_script_bad_path_exits_2_without_a_traceback(tmp_path, bad):
    data = _write_triplet_folders(tmp_path / "data", 1)
    not_a_checkpoint = tmp_path / "notes.pth"
    not_a_checkpoint.write_text("not a checkpoint\n")
    argv = {"data": ["--data", str(tmp_path / "missing")],
            "resume": ["--data", str(data), "--resume", str(not_a_checkpoint)]}[bad]
    result = subprocess.run([sys.executable, str(REPO / "examples" / "train.py"), *argv, "--out", str(tmp_path / "run")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    expected = tmp_path / "missing" if bad == "data" else not_a_checkpoint
    assert result.stderr.strip().splitlines()[-1].startswith(f"train.py: error: --{bad} {expected}: ")
