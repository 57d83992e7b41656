"""edsc-interpolate and the evaluation: images (Pillow), video files (PyAV) and folders of frames, the
time mapping (--factor, --fps, variable frame rates), scene cuts, tiles, and every kind of bad input
(one line on stderr, exit code 2, nothing half-written).

Clips are made by the tests themselves with PyAV (64x48, with an AAC track and a hard cut); the real
clip ../shared/data/video/car-turn.mp4 is used when present. Networks are random EDSC_s/EDSC_m on the
CPU; tests about timing and containers replace the network by a blend of the two frames (`blend_network`)."""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import pickle
import signal
import stat
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from edsc_ext.apps import (  # (they import PyAV, Pillow, tqdm when used)
    engine,
    evaluate,
    frames,
    images,
    interpolate,
    timing,
    video,
)
from edsc_ext.models import EDSC_m, EDSC_s

from conftest import (
    assert_one_line_error,
    missing_packages,
    needs_packages,
    needs_shared_data,
    rel_error,
    requires_cuda,
    run_cli,
    shared_data_path,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Each test is marked with the optional packages it needs, and runs without the others.
needs_apps = needs_packages("av", "PIL", "tqdm")
if not missing_packages("av"):
    import av
if not missing_packages("PIL"):
    from PIL import Image

MIDDLEBURY = shared_data_path("middlebury")
needs_middlebury = needs_shared_data("middlebury")
CAR_TURN = shared_data_path("video", "car-turn.mp4")
needs_video_data = needs_shared_data("video")


# --------------------------------------------------------------------------------------------
# Clips made with PyAV.


def scene(k: int, w: int, h: int, second: bool) -> np.ndarray:
    """Frame k of one of two shots: smooth moving gradients (motion scores a few percent), the two
    shots of different colours (their difference scores far above the cut threshold)."""
    yy, xx = np.mgrid[0:h, 0:w]
    if not second:
        img = np.stack([(xx * 3 + k * 2) % 256, yy * 4 % 256, np.full_like(xx, 50)], -1)
    else:
        img = np.stack([np.full_like(xx, 235), (250 - yy * 3 - k) % 256, (xx * 2 + 100) % 256], -1)
    return img.astype(np.uint8)


def make_clip(path: Path, frames: int = 16, rate=Fraction(24), w: int = 64, h: int = 48, cut_at=None,
              audio: bool = True, times_ms=None, codec: str = "libx264", rotation: int = 0) -> Path:
    """A clip of ``frames`` frames (``times_ms``: their times in ms, for variable frame rates), with a
    hard cut before frame ``cut_at`` and a stereo AAC track as long as the video; ``rotation``: a
    display matrix turning it by that many degrees counter-clockwise (as a phone writes one)."""
    out = av.open(str(path), "w")
    stream = out.add_stream(codec, rate=rate, options={"crf": "12"} if codec == "libx264" else {})
    stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
    if rotation:
        stream.set_display_rotation(rotation)
    if times_ms is not None:
        stream.codec_context.time_base = Fraction(1, 1000)
        stream.time_base = Fraction(1, 1000)
    sound = out.add_stream("aac", rate=48000) if audio else None
    if sound is not None:
        sound.layout = "stereo"
    for k in range(frames):
        frame = av.VideoFrame.from_ndarray(scene(k, w, h, cut_at is not None and k >= cut_at), format="rgb24")
        frame.pts = k if times_ms is None else times_ms[k]
        out.mux(stream.encode(frame))
    out.mux(stream.encode(None))
    if sound is not None:
        seconds = frames / rate if times_ms is None else Fraction(times_ms[-1] + 40, 1000)
        n = int(48000 * seconds)
        wave = (0.2 * np.sin(2 * np.pi * 440 * np.arange(n) / 48000)).astype(np.float32)
        for i in range(0, n, 1024):
            chunk = np.ascontiguousarray(np.stack([wave[i:i + 1024]] * 2))
            samples = av.AudioFrame.from_ndarray(chunk, format="fltp", layout="stereo")
            samples.sample_rate, samples.pts = 48000, i
            out.mux(sound.encode(samples))
        out.mux(sound.encode(None))
    out.close()
    return path


def read_clip(path: Path, frames: bool = False) -> dict:
    """What a video file holds: video frame times (Fractions), size, codec, pixel format, the decoded
    RGB frames (``frames=True``), and each other stream's type, codec and [start, end) (packets)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        info = {"width": stream.codec_context.width, "height": stream.codec_context.height,
                "codec": stream.codec_context.name, "pix_fmt": stream.codec_context.pix_fmt,
                "types": sorted(s.type for s in container.streams)}
        decoded = list(container.decode(stream))
        info["rotation"] = round(decoded[0].rotation or 0) % 360
        info["times"] = [Fraction(f.pts) * Fraction(stream.time_base) for f in decoded]
        info["time_base"] = Fraction(stream.time_base)
        if frames:
            info["frames"] = [f.to_ndarray(format="rgb24").astype(np.float32) / 255 for f in decoded]
    with av.open(str(path)) as container:
        others = {}
        for s in container.streams:
            if s.type == "video":
                continue
            packets = [p for p in container.demux(s) if p.size]
            tb = Fraction(s.time_base)
            others[s.type] = (s.codec_context.name, Fraction(packets[0].pts) * tb,
                              Fraction(packets[-1].pts + packets[-1].duration) * tb, len(packets))
            container.seek(0)
        info["others"] = others
    return info


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """16 frames at 24 fps, 64x48, AAC audio, a hard cut before frame 8."""
    return make_clip(tmp_path_factory.mktemp("clips") / "cut.mp4", frames=16, cut_at=8)


def leftover_files(folder: Path) -> list:
    return sorted(p.name for p in folder.iterdir())


# --------------------------------------------------------------------------------------------
# Images through Pillow.


@needs_packages("PIL")
def test_read_image_modes_bit_depths_alpha_and_exif(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "rgb.png")
    assert np.array_equal(images.read_array(tmp_path / "rgb.png"), rgb)
    image = images.read_image(tmp_path / "rgb.png")
    assert image.shape == (3, 5, 7) and image.dtype == torch.float32
    # RGBA: alpha dropped, the colour values kept as they are.
    rgba = np.concatenate([rgb, np.full((5, 7, 1), 7, np.uint8)], axis=2)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "rgba.png")
    assert np.array_equal(images.read_array(tmp_path / "rgba.png"), rgb)
    # Grayscale 8 and 16 bits: repeated to three channels, 16 bits kept.
    Image.fromarray(rgb[..., 0]).save(tmp_path / "gray.png")
    assert np.array_equal(images.read_array(tmp_path / "gray.png"), np.repeat(rgb[..., :1], 3, axis=2))
    deep = (np.arange(35, dtype=np.uint16).reshape(5, 7) * 1000 + 3)
    Image.fromarray(deep).save(tmp_path / "gray16.png")
    read16 = images.read_image(tmp_path / "gray16.png")
    assert torch.allclose(read16[1], torch.from_numpy(deep.astype(np.float32) / 65535), atol=1e-7)
    # A palette image with transparency.
    Image.fromarray(rgb).convert("P").save(tmp_path / "palette.png", transparency=0)
    assert images.read_array(tmp_path / "palette.png").shape == (5, 7, 3)
    # EXIF orientation 6 (rotate 90 clockwise to view): the image comes upright, 5x7 -> 7x5.
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(rgb).save(tmp_path / "rotated.jpg", exif=exif, quality=95)
    assert images.image_size(tmp_path / "rotated.jpg") == (5, 7)
    assert images.read_array(tmp_path / "rotated.jpg").shape == (7, 5, 3)
    # 32-bit float images are refused clearly.
    Image.fromarray(np.zeros((4, 4), np.float32), "F").save(tmp_path / "float.tif")
    with pytest.raises(images.UserError if hasattr(images, "UserError") else ValueError, match="floating-point"):
        images.read_array(tmp_path / "float.tif")


@needs_packages("PIL")
def test_write_image_round_trip_and_rounding(tmp_path):
    pixels = torch.rand(3, 9, 11)
    images.write_image(tmp_path / "x.png", pixels)
    back = images.read_image(tmp_path / "x.png")
    assert back.shape == (3, 9, 11) and (back - pixels).abs().max() <= 0.5 / 255 + 1e-6
    assert leftover_files(tmp_path) == ["x.png"]


# --------------------------------------------------------------------------------------------
# Pair mode.


def write_pair(folder: Path, h=37, w=50, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for k in range(2):
        paths.append(folder / f"f{k}.png")
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(paths[-1])
    return paths


@needs_packages("PIL")
def test_cli_pair_writes_an_image_of_the_input_size(tmp_path, weights, capsys):
    first, second = write_pair(tmp_path / "in")
    out = tmp_path / "new" / "middle.png"  # a missing folder is created, and the command says so
    rc, stdout, err = run_cli(["--model", "EDSC_s", "--weights", weights["EDSC_s"], first, second, "-o", out,
                               "--device", "cpu"], capsys)
    assert rc == 0, err
    assert f"created the folder {out.parent}" in err
    assert images.read_array(out).shape == (37, 50, 3)
    # EDSC_m at another time; the variant is read off the weights when --model is left out.
    out_m = tmp_path / "quarter.png"
    rc, _, err = run_cli(["--weights", weights["EDSC_m"], "--time", "0.25", first, second, "-o", out_m,
                          "--device", "cpu"], capsys)
    assert rc == 0, err
    assert images.read_array(out_m).shape == (37, 50, 3)
    # The engine's frame equals the network's own interpolate() (padding to 32 and cropping back).
    model = engine.load_model(weights["EDSC_m"])
    a, b = images.read_image(first), images.read_image(second)
    expected = model.interpolate(a.flip(0)[None], b.flip(0)[None], 0.25)[0].flip(0)
    (ours,) = interpolate.interpolate_frames(model, a, b, times=[0.25])
    assert torch.allclose(ours, expected, atol=1e-6)


@needs_apps
@pytest.mark.parametrize("argv, expected", [
    (["a.png", "b.png", "-o", "m.png"], False),
    (["a.png", "b.png", "-o", "m.png", "--cudnn-benchmark"], True),
    (["--video", "in.mp4", "-o", "out.mp4"], False),
    (["--video", "in.mp4", "-o", "out.mp4", "--cudnn-benchmark"], True),
], ids=["pair", "pair-on", "video", "video-on"])
def test_cli_sets_cudnn_benchmark_for_the_run_only(monkeypatch, argv, expected):
    from edsc_ext.apps import interpolate as cli

    seen = []
    monkeypatch.setattr(cli, "_run_pair", lambda args: seen.append(torch.backends.cudnn.benchmark))
    monkeypatch.setattr(cli, "_run_video", lambda args: seen.append(torch.backends.cudnn.benchmark))
    before = torch.backends.cudnn.benchmark
    assert interpolate.main(argv + ["--weights", "w.pt"]) == 0
    assert seen == [expected]
    assert torch.backends.cudnn.benchmark == before


@needs_packages("PIL")
def test_cli_pair_errors_are_one_line_with_exit_code_2(tmp_path, weights, capsys):
    first, second = write_pair(tmp_path / "in")
    small = write_pair(tmp_path / "small", 20, 24)[0]
    out = tmp_path / "o.png"
    cases = [
        (["--weights", weights["EDSC_s"], "--time", "0.25", first, second, "-o", out], ["EDSC_s", "EDSC_m"]),
        (["--model", "EDSC_m", "--weights", weights["EDSC_s"], first, second, "-o", out], ["EDSC_s"]),
        (["--weights", weights["EDSC_s"], first, small, "-o", out], [first, small, "50x37", "24x20"]),
        (["--weights", weights["EDSC_s"], first, tmp_path / "absent.png", "-o", out], ["absent.png", "no such"]),
        (["--weights", weights["EDSC_s"], first, tmp_path / "in", "-o", out], [tmp_path / "in"]),
        (["--weights", weights["EDSC_s"], first, second, "-o", tmp_path / "o.xyz"], ["o.xyz"]),
        (["--weights", weights["EDSC_s"], "--time", "1.5", first, second, "-o", out], ["--time", "(0, 1)"]),
        (["--weights", weights["EDSC_s"], first, "-o", out], ["two input frames"]),
    ]
    for argv, needles in cases:
        rc, _, err = run_cli(argv + ["--device", "cpu"] if "--device" not in argv else argv, capsys)
        assert_one_line_error(rc, err, *needles)
    assert not out.exists()


def test_an_older_pyav_than_the_apps_need_is_refused_in_one_line(tmp_path, weights, capsys, monkeypatch):
    """A PyAV older than the apps extra's minimum (18: Stream.set_display_matrix) is refused before any work,
    in one line with exit code 2, naming the version found and the one needed, where the run would fail later
    with an AttributeError (PyAV 13 failed 57 tests that way)."""
    import types

    old = types.ModuleType("av")
    old.__version__ = "17.0.1"
    monkeypatch.setitem(sys.modules, "av", old)
    clip = tmp_path / "in.mp4"
    clip.write_bytes(b"\0" * 64)
    out = tmp_path / "x2.mp4"
    rc, _, err = run_cli(["--weights", weights["EDSC_s"], "--video", clip, "-o", out, "--device", "cpu"], capsys)
    assert_one_line_error(rc, err, "'av' 18 or newer", "found 17.0.1", '"av>=18"')
    assert not out.exists()


@needs_packages("PIL")
def test_pair_mode_refuses_an_input_as_the_output_under_any_spelling(tmp_path, weights, capsys, monkeypatch):
    first, second = write_pair(tmp_path / "in")
    (tmp_path / "in" / "link.png").symlink_to(first)
    (tmp_path / "in" / "hard.png").hardlink_to(second)
    originals = {p: p.read_bytes() for p in (first, second)}
    monkeypatch.chdir(tmp_path / "in")
    for frames, output in ((["f0.png", "f1.png"], "f0.png"), (["f0.png", "f1.png"], "./f1.png"),  # noqa: F402 (the module is not used here)
                           (["f0.png", "f1.png"], first), ([first, second], "f1.png"),
                           (["f0.png", "f1.png"], "link.png"), (["f0.png", "f1.png"], "hard.png"),
                           (["link.png", "f1.png"], "../in/f0.png")):
        rc, _, err = run_cli(["--weights", weights["EDSC_s"], *frames, "-o", output, "--device", "cpu"], capsys)
        assert_one_line_error(rc, err, f"-o {output}", "is the input", "choose another name")
    assert {p: p.read_bytes() for p in (first, second)} == originals
    assert leftover_files(tmp_path / "in") == ["f0.png", "f1.png", "hard.png", "link.png"]


def test_time_out_of_range_is_rejected_alike_by_both_commands(weights, capsys):
    rc, _, err = run_cli(["--weights", weights["EDSC_m"], "--time", "1.5", "a.png", "b.png", "-o", "c.png"], capsys)
    assert_one_line_error(rc, err, "argument --time: must be in (0, 1)")
    rc = evaluate.main(["--weights", str(weights["EDSC_m"]), "--time", "1.5"])
    _, err_eval = capsys.readouterr()
    assert_one_line_error(rc, err_eval, "argument --time: must be in (0, 1)")
    assert err.split("error:")[1] == err_eval.split("error:")[1]


def corrupt_png(path: Path, data: bytes) -> Path:
    """A PNG whose IDAT bytes are flipped (the zlib stream is broken)."""
    start = data.index(b"IDAT") + 4
    broken = bytearray(data)
    for i in range(start + 2, min(start + 40, len(data) - 16)):
        broken[i] ^= 0xFF
    path.write_bytes(bytes(broken))
    return path


@needs_packages("PIL")
def test_corrupt_truncated_and_foreign_images_are_named(tmp_path, weights, capsys):
    first, second = write_pair(tmp_path / "in")
    data = second.read_bytes()
    text = tmp_path / "notes.png"
    text.write_text("not an image\n")
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(data[: len(data) // 2])
    for bad in (corrupt_png(tmp_path / "flipped.png", data), truncated, text):
        rc, _, err = run_cli(["--weights", weights["EDSC_s"], first, bad, "-o", tmp_path / "o.png", "--device", "cpu"],
                             capsys)
        assert_one_line_error(rc, err, bad)


@needs_packages("PIL")
def test_full_disk_in_pair_mode_leaves_no_file(tmp_path, weights, capsys, monkeypatch):
    first, second = write_pair(tmp_path / "in")
    out_dir = tmp_path / "out"
    out_dir.mkdir()

    def disk_full(image, fileobj, fmt):
        fileobj.write(b"\x89PNG partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(images, "_save", disk_full)
    rc, _, err = run_cli(["--weights", weights["EDSC_s"], first, second, "-o", out_dir / "m.png", "--device", "cpu"],
                         capsys)
    assert_one_line_error(rc, err, "no space left", "m.png")
    assert leftover_files(out_dir) == []


@needs_packages("PIL")
def test_pair_mode_output_errors_name_what_the_user_gave(tmp_path, weights, capsys, monkeypatch):
    first, second = write_pair(tmp_path / "in")
    folder = tmp_path / "existing"
    folder.mkdir()
    rc, _, err = run_cli(["--weights", weights["EDSC_s"], first, second, "-o", folder, "--device", "cpu"], capsys)
    assert_one_line_error(rc, err, f"-o {folder}", "is a folder")
    # A folder that takes no new files (/proc does not): said so, without the temporary file's name.
    rc, _, err = run_cli(["--weights", weights["EDSC_s"], first, second, "-o", "/proc/mid.png", "--device", "cpu"],
                         capsys)
    assert_one_line_error(rc, err, "/proc/mid.png", "cannot create")
    assert "partial" not in err and "no such file" not in err.lower()
    assert leftover_files(folder) == []


BAD_WEIGHTS = ["text", "tensor", "foreign pickle", "truncated", "other keys", "missing", "folder"]


def bad_weights(tmp: Path, kind: str, good: Path) -> Path:
    path = tmp / f"{kind.replace(' ', '_')}.pth"
    if kind == "text":
        path.write_text("hello, this is not a checkpoint\n")
    elif kind == "tensor":
        torch.save(torch.randn(4), path)
    elif kind == "foreign pickle":
        path.write_bytes(pickle.dumps(argparse.Namespace(model_state={})))
    elif kind == "truncated":
        data = good.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "other keys":
        torch.save({"model_state": {"weight": torch.zeros(2)}}, path)
    elif kind == "folder":
        path.mkdir()
    return path


@needs_packages("PIL")
@pytest.mark.parametrize("kind", BAD_WEIGHTS)
def test_bad_weights_are_one_line_naming_the_file_in_both_commands(tmp_path, weights, capsys, kind):
    path = bad_weights(tmp_path, kind, weights["EDSC_s"])
    first, second = write_pair(tmp_path / "in", 8, 8)
    rc, _, err = run_cli(["--weights", path, first, second, "-o", tmp_path / "o.png", "--device", "cpu"], capsys)
    assert_one_line_error(rc, err, path)
    rc = evaluate.main(["--weights", str(path), "--data", str(tmp_path), "--device", "cpu", "--quiet"])
    _, err = capsys.readouterr()
    # (evaluate looks for its data first: an empty --data folder would be the error; so give it one)
    if "Middlebury" not in err and "sequence" not in err:
        assert_one_line_error(rc, err, path)


@needs_packages("PIL")
def test_weights_errors_say_what_is_wrong_once_and_name_the_key(tmp_path, weights, capsys):
    first, second = write_pair(tmp_path / "in", 8, 8)

    def error_of(path):
        rc, _, err = run_cli(["--weights", path, first, second, "-o", tmp_path / "o.png", "--device", "cpu"], capsys)
        assert_one_line_error(rc, err, path)
        return err

    assert "not a PyTorch file" in error_of(first)  # an image given as the weights
    assert "pickle" not in error_of(first)
    assert error_of(bad_weights(tmp_path, "other keys", weights["EDSC_s"])).count("not an EDSC checkpoint") == 1
    state = torch.load(weights["EDSC_s"], weights_only=True)["model_state"]
    key = [k for k in state if k.endswith(".weight") and state[k].dim() == 4][3]
    shape = tuple(state[key].shape)
    state[key] = torch.zeros(shape[0] + 1, *shape[1:])
    wrong = tmp_path / "wrong_shape.pth"
    torch.save({"model_state": state}, wrong)
    err = error_of(wrong)
    assert key in err and ", ".join(map(str, shape)) in err and str(shape[0] + 1) in err, err


@needs_packages("PIL")
@pytest.mark.parametrize("kind", BAD_WEIGHTS[:4])
def test_evaluate_reports_bad_weights_in_one_line(tmp_path, weights, capsys, kind):
    data = tmp_path / "mb" / "Seq"
    data.mkdir(parents=True)
    for name in ("frame10.png", "frame11.png", "frame10i11.png"):
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(data / name)
    path = bad_weights(tmp_path, kind, weights["EDSC_s"])
    rc = evaluate.main(["--weights", str(path), "--data", str(tmp_path / "mb"), "--device", "cpu", "--quiet"])
    assert_one_line_error(rc, capsys.readouterr().err, path)


def test_cli_module_entry_points_help():
    for module, needle in (("edsc_ext.apps.interpolate", "--video"), ("edsc_ext.apps.evaluate", "--weights")):
        result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and needle in result.stdout, result.stderr


# --------------------------------------------------------------------------------------------
# The engine: EDSC_s bisection, batches, tiles.


def test_edsc_s_bisection_shares_midpoints_and_batches_agree(weights, monkeypatch):
    model = engine.load_model(weights["EDSC_s"])
    gen = torch.Generator().manual_seed(3)
    a, b = torch.rand(3, 32, 40, generator=gen), torch.rand(3, 32, 40, generator=gen)
    calls = []
    original = engine.Interpolator._network

    def counted(self, first, second, times):
        calls.append(first.shape[0])
        return original(self, first, second, times)

    monkeypatch.setattr(engine.Interpolator, "_network", counted)
    quarter = engine.Interpolator(model).interpolate([(a, b, Fraction(k, 4)) for k in (1, 2, 3)])
    assert calls == [1, 1, 1]  # the midpoint once, then the two quarter points
    calls.clear()
    batched = engine.Interpolator(model, batch=4).interpolate([(a, b, Fraction(k, 4)) for k in (1, 2, 3)])
    assert calls == [1, 2]  # one call per level
    for x, y in zip(quarter, batched):
        assert torch.allclose(x, y, atol=1e-5)
    mid = model.interpolate(a.flip(0), b.flip(0)).flip(0)
    assert torch.allclose(quarter[1], mid, atol=1e-6)
    with pytest.raises(ValueError, match="EDSC_m"):
        engine.Interpolator(model).interpolate([(a, b, Fraction(1, 3))])


def test_tile_weights_cover_the_frame_and_fade_out_at_inner_edges():
    for length, tile, overlap, exact in ((192, 64, 32, True), (100, 64, 32, False), (64, 64, 32, True),
                                         (1024, 256, 32, True), (1000, 256, 32, False)):
        spans = engine.tile_spans(length, tile, overlap)
        assert spans[0][0] == 0 and spans[-1][1] == length
        assert all(b[0] - a[0] > 0 and a[1] - b[0] >= overlap for a, b in zip(spans, spans[1:]))
        total = torch.zeros(length, dtype=torch.float64)
        for j, ((start, end), w) in enumerate(zip(spans, engine._axis_weights(spans, length))):
            total[start:end] += w
            if j > 0:
                assert w[0] < 0.05  # fades in from (almost) 0 where the core starts inside the frame
            if j + 1 < len(spans):
                assert w[-1] < 0.05
        assert total.min() > 0.5  # the blend is divided by this sum: every pixel well covered
        if exact:
            assert torch.allclose(total, torch.ones(length, dtype=torch.float64))


def test_tiled_equals_untiled_in_tile_interiors_and_at_seams(weights):
    model = engine.load_model(weights["EDSC_s"])
    gen = torch.Generator().manual_seed(5)
    h, w = 128, 192
    # Smooth content with detail, as frames are.
    base = torch.nn.functional.interpolate(torch.rand(1, 3, h // 8, w // 8, generator=gen), size=(h, w),
                                           mode="bilinear", align_corners=False)[0]
    a = (base + 0.05 * torch.rand(3, h, w, generator=gen)).clamp(0, 1)
    b = torch.roll(a, shifts=(1, 2), dims=(1, 2))
    (whole,) = engine.Interpolator(model).interpolate([(a, b, Fraction(1, 2))])
    tiler = engine.Interpolator(model, tile=64, margin=32, overlap=32)
    (tiled,) = tiler.interpolate([(a, b, Fraction(1, 2))])
    diff = (tiled - whole).abs()
    spans_y, spans_x = engine.tile_spans(h, 64, 32), engine.tile_spans(w, 64, 32)
    seams_x = sorted({s for s, _ in spans_x[1:]} | {e for _, e in spans_x[:-1]})
    for x in seams_x:  # at every seam (the overlaps' edges), and everywhere
        assert diff[..., max(0, x - 2):x + 2].max() <= 1e-3
    assert diff.max() <= 1e-3, diff.max()
    assert len(spans_y) * len(spans_x) == tiler.tiles_used == 15
    # Without a margin the tiles lack context: the check above has teeth.
    (no_margin,) = engine.Interpolator(model, tile=64, margin=0, overlap=32).interpolate([(a, b, Fraction(1, 2))])
    assert (no_margin - whole).abs().max() > 1e-3


def test_out_of_memory_on_a_whole_frame_falls_back_to_tiles(weights, monkeypatch, capsys):
    model = engine.load_model(weights["EDSC_s"])
    original = engine.Interpolator._network

    def small_memory(self, first, second, times):
        if first.shape[-1] * first.shape[-2] > 160 * 160:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return original(self, first, second, times)

    monkeypatch.setattr(engine.Interpolator, "_network", small_memory)
    a, b = torch.rand(3, 96, 300), torch.rand(3, 96, 300)
    tiler = engine.Interpolator(model, margin=16)
    (out,) = tiler.interpolate([(a, b, Fraction(1, 2))])
    assert out.shape == (3, 96, 300) and tiler.tile == 128 and tiler.tiles_used > 1
    assert "out of memory" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# The time mapping.


def test_schedule_positions_for_integer_and_fractional_rate_ratios():
    def plan(times, end, **kw):
        schedule = timing.Schedule(start=times[0], **kw)
        outs = []
        for i in range(len(times) - 1):
            outs += schedule.between(i, times[i], times[i + 1])
        return outs + schedule.after_last(len(times) - 1, times[-1], end)

    # 25 -> 60 fps over 1 s: 60 frames at k/60; input frames where k/60 = i/25 (every 12th).
    times = [Fraction(i, 25) for i in range(25)]
    outs = plan(times, Fraction(1), fps=Fraction(60))
    assert [o.time for o in outs] == [Fraction(k, 60) for k in range(60)]
    # copies: where k/60 = i/25 (i = 0, 5, ..., 20), and after the last input frame (0.96 s) until 1 s
    assert [k for k, o in enumerate(outs) if o.is_copy] == [0, 12, 24, 36, 48, 58, 59]
    assert {o.position for o in outs if not o.is_copy} == {Fraction(j, 12) for j in range(1, 12)}
    # 24000/1001 -> 60: positions are multiples of 1/1001*400 mod 1, never dyadic but at 0.
    ntsc = Fraction(24000, 1001)
    times = [i / ntsc for i in range(12)]
    outs = plan(times, 12 / ntsc, fps=Fraction(60))
    assert len(outs) == 31 == timing.constant_rate_count(12, ntsc, None, Fraction(60), True)
    assert all(o.time == Fraction(k, 60) for k, o in enumerate(outs))
    assert not any(engine.is_dyadic(o.position) for o in outs[1:] if not o.is_copy)
    # --factor 2 on variable-rate timestamps: the midpoints of the intervals.
    times = [Fraction(t, 1000) for t in (0, 40, 100, 120, 200)]
    outs = plan(times, Fraction(240, 1000), factor=2)
    assert [o.time * 1000 for o in outs] == [0, 20, 40, 70, 100, 110, 120, 160, 200, 220]
    # No end (None): the last frame ends the output.
    assert len(plan([Fraction(i, 25) for i in range(3)], None, factor=4)) == 9
    assert timing.parse_rate("23.976") == Fraction(24000, 1001) and timing.parse_rate("60") == 60
    assert timing.parse_rate("24000/1001") == ntsc and timing.parse_rate("12.5") == Fraction(25, 2)


# --------------------------------------------------------------------------------------------
# Video files.


def video_argv(weights, name, source, target, *extra):
    return ["--weights", weights[name], "--video", source, "-o", target, "--device", "cpu", "--quiet", *extra]


@needs_packages("av", "tqdm")
@pytest.mark.parametrize("factor", [2, 4])
def test_factor_frame_counts_timestamps_audio_and_cut(tmp_path, weights, clip, capsys, factor):
    out = tmp_path / f"x{factor}.mp4"
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", clip, out, "--factor", factor), capsys)
    assert rc == 0, err
    assert "1 scene cut(s)" in stdout
    src, got = read_clip(clip, frames=True), read_clip(out, frames=True)
    assert (got["width"], got["height"], got["codec"], got["pix_fmt"]) == (64, 48, "h264", "yuv420p")
    assert len(got["times"]) == 16 * factor
    assert got["times"] == [Fraction(k, 24 * factor) for k in range(16 * factor)]
    # The audio is copied: same codec, same packets, same start and end; the video lasts as long.
    assert got["others"] == src["others"] and "audio" in got["others"]
    _, start, end, _ = got["others"]["audio"]
    assert abs((got["times"][-1] + Fraction(1, 24 * factor)) - src["times"][-1] - Fraction(1, 24)) < Fraction(1, 1000)
    assert abs(end - Fraction(16, 24)) < Fraction(1, 20)
    # Input frames stay in place; across the cut (frames 7 | 8) the new frames repeat frame 7.
    for i in range(16):
        assert np.abs(got["frames"][i * factor] - src["frames"][i]).mean() < 2 / 255
    for j in range(1, factor):
        assert np.abs(got["frames"][7 * factor + j] - src["frames"][7]).mean() < 2 / 255
    # Elsewhere the random network's frames are something else.
    assert np.abs(got["frames"][1] - src["frames"][0]).mean() > 10 / 255


@needs_packages("av", "tqdm")
def test_no_scene_detect_interpolates_across_the_cut(tmp_path, weights, clip, capsys, blend_network):
    out = tmp_path / "x2.mkv"
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", clip, out, "--no-scene-detect"), capsys)
    assert rc == 0, err
    assert "scene detection off" in stdout and len(blend_network) == 15
    src, got = read_clip(clip, frames=True), read_clip(out, frames=True)
    blend = (src["frames"][7] + src["frames"][8]) / 2
    assert np.abs(got["frames"][15] - blend).mean() < 3 / 255
    # A threshold above every score finds no cut either; one below the motion finds them all.
    rc, stdout, _ = run_cli(video_argv(weights, "EDSC_s", clip, tmp_path / "t.mkv", "--scene-threshold", "99"), capsys)
    assert rc == 0 and "0 scene cut(s)" in stdout
    rc, stdout, _ = run_cli(video_argv(weights, "EDSC_s", clip, tmp_path / "u.mkv", "--scene-threshold", "0"), capsys)
    assert rc == 0 and "15 scene cut(s)" in stdout and "(0 interpolated" in stdout


@needs_apps
@pytest.mark.parametrize("rate, fps, frames, expected", [
    (Fraction(25), "60", 10, 24),  # 2.4x: 10 frames, 0.4 s
    (Fraction(24000, 1001), "60", 12, 31),  # 23.976 -> 60: 0.5005 s
    (Fraction(24), "59.94", 12, 30),  # to an NTSC rate: 0.5 s * 60000/1001 = 29.97
])
@needs_packages("av", "tqdm")
def test_fps_any_target_rate(tmp_path, weights, capsys, rate, fps, frames, expected, blend_network):
    source = make_clip(tmp_path / "in.mp4", frames=frames, rate=rate)
    out = tmp_path / "out.mp4"
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_m", source, out, "--fps", fps), capsys)
    assert rc == 0, err
    got = read_clip(out)
    target = timing.parse_rate(fps)
    assert len(got["times"]) == expected
    for k, t in enumerate(got["times"]):
        assert abs(t - Fraction(k) / target) <= got["time_base"], (k, t)
    src = read_clip(source)
    assert got["others"]["audio"] == src["others"]["audio"]
    # EDSC_s cannot make these positions: an error before anything is written.
    out_s = tmp_path / "s" / "out.mp4"
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", source, out_s, "--fps", fps), capsys)
    assert_one_line_error(rc, err, "EDSC_m", "EDSC_s")
    assert not out_s.parent.exists()


@needs_packages("av", "tqdm")
def test_fps_with_edsc_s_when_the_ratio_is_a_power_of_two_and_decimation(tmp_path, weights, clip, capsys):
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", clip, tmp_path / "x4.mkv", "--fps", "96"), capsys)
    assert rc == 0, err
    times = read_clip(tmp_path / "x4.mkv")["times"]  # (Matroska shifts all streams by the audio's priming delay)
    assert len(times) == 64  # (Matroska keeps milliseconds)
    assert all(abs(t - times[0] - Fraction(k, 96)) <= Fraction(1, 1000) for k, t in enumerate(times))
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", clip, tmp_path / "half.mp4", "--fps", "12"), capsys)
    assert rc == 0 and "(0 interpolated" in stdout, err
    assert len(read_clip(tmp_path / "half.mp4")["times"]) == 8


@needs_packages("av", "tqdm")
def test_variable_frame_rate_uses_the_timestamps(tmp_path, weights, capsys, blend_network):
    times_ms = [0, 40, 100, 120, 200, 240, 320, 340]
    source = make_clip(tmp_path / "vfr.mkv", frames=8, times_ms=times_ms)
    assert video.probe(source).variable_rate
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", source, tmp_path / "x2.mkv", "--factor", "2"), capsys)
    assert rc == 0, err
    times = read_clip(tmp_path / "x2.mkv")["times"]
    got = [(t - times[0]) * 1000 for t in times]
    last = float(video.probe(source).end * 1000)
    expected = [t for a, b in zip(times_ms, times_ms[1:]) for t in (a, (a + b) / 2)] + [340, (340 + last) / 2]
    assert got == pytest.approx(expected, abs=1)
    rc, _, err = run_cli(video_argv(weights, "EDSC_m", source, tmp_path / "50.mp4", "--fps", "50"), capsys)
    assert rc == 0, err
    got = read_clip(tmp_path / "50.mp4")["times"]
    end = video.probe(source).end  # the last frame lasts its packet's duration (1/24 s here)
    assert len(got) == math.ceil(end * 50) == 20
    assert all(abs(t - Fraction(k, 50)) < Fraction(1, 1000) for k, t in enumerate(got))


@needs_packages("av")
@pytest.mark.parametrize("codec", ["libx264", "libx265", "libvpx-vp9"])
def test_every_encoder_opens_with_the_thread_count_of_a_big_machine(tmp_path, codec):
    """The tool passes 1.5 threads a core (24 on 16 cores); x265 refused that as frame threads (at most 15)."""
    target = tmp_path / ("out.webm" if codec == "libvpx-vp9" else "out.mkv")
    sink = video.VideoSink(target, target, 64, 48, Fraction(24), Fraction(1, 24), codec=codec, crf=30,
                           threads=interpolate.encoder_threads(64))
    try:
        assert sink.encoder == codec
    finally:
        sink.abort()
    assert not target.exists()


@needs_packages("av", "tqdm")
def test_codec_crf_and_pixel_format_follow_the_input_or_are_set(tmp_path, weights, clip, capsys, blend_network):
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", clip, tmp_path / "same.mp4"), capsys)
    assert rc == 0 and "libx264 yuv420p crf 12" in stdout, stdout + err  # the CRF the input's x264 recorded
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", clip, tmp_path / "set.mkv", "--codec", "libx265", "--crf",
                                         "30", "--pix-fmt", "yuv444p"), capsys)
    assert rc == 0, err
    got = read_clip(tmp_path / "set.mkv")
    assert (got["codec"], got["pix_fmt"], got["width"], got["height"]) == ("hevc", "yuv444p", 64, 48)
    # .webm takes neither H.264 nor AAC: VP9, and the audio is left out with a note.
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", clip, tmp_path / "v.webm")[:-1], capsys)
    assert rc == 0, err
    assert "audio stream" in err and "left out" in err
    assert read_clip(tmp_path / "v.webm")["codec"] == "vp9"
    for bad, needle in ((["--codec", "nope264"], "nope264"), (["--pix-fmt", "yuv999"], "yuv999"),
                        (["--crf", "99"], "--crf"), (["--codec", "aac"], "not a video encoder")):
        rc, _, err = run_cli(video_argv(weights, "EDSC_s", clip, tmp_path / "bad.mp4", *bad), capsys)
        assert_one_line_error(rc, err, needle)
        assert not (tmp_path / "bad.mp4").exists()


@needs_packages("av", "tqdm")
@pytest.mark.parametrize("ext", [".m4v", ".mov", ".avi", ".gif"])
def test_other_containers_keep_every_frame_and_the_size(tmp_path, weights, capsys, ext, blend_network):
    source = make_clip(tmp_path / "odd.mp4", frames=6, w=50, h=30, audio=False)
    out = tmp_path / "sub" / f"out{ext}"
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", source, out), capsys)
    assert rc == 0, err
    got = read_clip(out)
    assert (got["width"], got["height"], len(got["times"])) == (50, 30, 12)
    assert leftover_files(out.parent) == [out.name]


@needs_apps
def test_folder_of_frames_to_frames_and_to_a_video(tmp_path, weights, capsys):
    frames = tmp_path / "frames"
    frames.mkdir()
    rng = np.random.default_rng(1)
    originals = [rng.integers(0, 256, (20, 24, 3), dtype=np.uint8) for _ in range(3)]
    for k, pixels in enumerate(originals):
        Image.fromarray(pixels).save(frames / f"{k:03d}.png")
    # 3 frames at 25 fps last 0.12 s, and so does the output: 3 * factor frames, the last one repeated.
    for name, factor, expected in (("EDSC_s", 2, 6), ("EDSC_s", 4, 12), ("EDSC_m", 3, 9)):
        out = tmp_path / f"out_{name}_{factor}"
        rc, _, err = run_cli(video_argv(weights, name, frames, out, "--factor", factor), capsys)
        assert rc == 0, err
        written = sorted(out.glob("*.png"))
        assert len(written) == expected
        for k, pixels in enumerate(originals):  # the input frames, unchanged, at every factor-th place
            assert np.array_equal(images.read_array(written[k * factor]), pixels)
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", frames, tmp_path / "f.mp4", "--input-fps", "10"), capsys)
    assert rc == 0, err
    assert read_clip(tmp_path / "f.mp4")["times"] == [Fraction(k, 20) for k in range(6)]
    # A video into a folder of frames.
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", tmp_path / "f.mp4", tmp_path / "back/"), capsys)
    assert rc == 0, err
    assert len(list((tmp_path / "back").glob("*.png"))) == 12


@pytest.fixture
def umask_027():
    before = os.umask(0o027)
    yield 0o027
    os.umask(before)


@needs_apps
def test_frame_folders_get_the_umask_or_keep_an_existing_folders_mode(tmp_path, weights, clip, capsys, umask_027,
                                                                       blend_network):
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", clip, tmp_path / "new/"), capsys)
    assert rc == 0, err
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o750  # as mkdir makes it under umask 027
    existing = tmp_path / "existing"
    existing.mkdir()
    existing.chmod(0o775)
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", clip, existing), capsys)
    assert rc == 0, err
    assert stat.S_IMODE(existing.stat().st_mode) == 0o775 and len(list(existing.glob("*.png"))) == 32


@needs_apps
def test_a_folder_of_frames_lasts_as_long_as_a_video_of_them(tmp_path, weights, capsys, blend_network):
    frames = tmp_path / "frames"
    frames.mkdir()
    for k in range(4):
        Image.fromarray(scene(k, 32, 16, False)).save(frames / f"{k:03d}.png")
    # 4 frames at 25 fps last 0.16 s: x2 gives 8 frames at 50 fps, the last a copy of the last input frame.
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", frames, tmp_path / "x2/"), capsys)
    assert rc == 0, err
    written = sorted((tmp_path / "x2").glob("*.png"))
    assert len(written) == 8
    assert np.array_equal(images.read_array(written[-1]), images.read_array(frames / "003.png"))
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", frames, tmp_path / "x2.mkv"), capsys)
    assert rc == 0, err
    got = read_clip(tmp_path / "x2.mkv")
    assert got["times"] == [Fraction(k, 50) for k in range(8)]
    # --fps too: 0.16 s at 60 fps is 9.6 frame periods, so 10 frames (as a video of these frames gives),
    # of which 7 are new: only k/60 = 0 falls on an input frame, 8/60 and 9/60 come after the last one.
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_m", frames, tmp_path / "f60/", "--fps", "60"), capsys)
    assert rc == 0 and "wrote 10 frames (7 interpolated" in stdout, err
    assert len(list((tmp_path / "f60").glob("*.png"))) == 10 == timing.constant_rate_count(4, Fraction(25), None,
                                                                                            Fraction(60), True)


@needs_apps
def test_video_bad_inputs_are_one_line_and_write_nothing(tmp_path, weights, clip, capsys):
    text = tmp_path / "notes.mp4"
    text.write_text("this is text, not a video\n")
    one = tmp_path / "one.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(one)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(mixed / "a.png")
    Image.fromarray(np.zeros((9, 8, 3), np.uint8)).save(mixed / "b.png")
    broken = tmp_path / "broken"
    broken.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(broken / "a.png")
    corrupt_png(broken / "b.png", (broken / "a.png").read_bytes())
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    out = tmp_path / "out"
    out.mkdir()
    cases = [
        (tmp_path / "nope.mp4", out / "o.mp4", [], ["nope.mp4", "no such"]),
        (tmp_path / "nope_dir", out / "o.mp4", [], ["--video", "nope_dir", "no such file or folder"]),
        (text, out / "o.mp4", [], [text, "not a video"]),
        (one, out / "o.mp4", [], [one, "at least two"]),
        (mixed, out / "o.mp4", [], [mixed / "a.png", mixed / "b.png", "8x8", "8x9"]),
        (broken, out / "o.mp4", [], [broken / "b.png"]),
        (clip, out / "newname.png", [], ["newname.png", "not one image"]),
        (clip, out / "o.mp5", [], [".mp5"]),
        (clip, full, [], [full, "not empty"]),
        (clip, clip, [], ["is the input"]),
        (clip, out / "o.mp4", ["--factor", "3"], ["--factor 3", "EDSC_m"]),
        (clip, out / "o.mp4", ["--factor", "0"], ["--factor"]),
        (clip, out / "o.mp4", ["--fps", "abc"], ["--fps", "abc"]),
        (clip, out / "o.mp4", ["--input-fps", "10"], ["--input-fps"]),
        (clip, out / "o.mp4", ["--tile", "16"], ["--tile"]),
    ]
    for source, target, extra, needles in cases:
        rc, _, err = run_cli(video_argv(weights, "EDSC_s", source, target, *extra), capsys)
        assert_one_line_error(rc, err, *needles)
    assert leftover_files(out) == [] and leftover_files(full) == ["keep.txt"]
    assert not (out / "newname.png").exists()
    # EDSC_s weights with an EDSC_m-only rate, a missing output folder: still nothing created.
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", clip, tmp_path / "new" / "o.mp4", "--fps", "60"), capsys)
    assert_one_line_error(rc, err, "EDSC_m")
    assert not (tmp_path / "new").exists()


@needs_packages("av", "tqdm")
def test_values_that_would_do_nothing_or_be_ignored_are_refused(tmp_path, weights, clip, capsys):
    out = tmp_path / "out"
    out.mkdir()
    for extra, needles in ((["--scene-threshold", "-1"], ["--scene-threshold", "-1"]),
                           (["--scene-threshold", "nan"], ["--scene-threshold", "nan"]),
                           (["--scene-threshold", "101"], ["--scene-threshold", "101"]),
                           (["--time", "0.3"], ["--time", "pair mode"])):
        rc, _, err = run_cli(video_argv(weights, "EDSC_m", clip, out / "o.mp4", *extra), capsys)
        assert_one_line_error(rc, err, *needles)
    assert leftover_files(out) == []
    model = engine.load_model(weights["EDSC_s"])
    with pytest.raises(ValueError, match="scene-threshold"):
        interpolate.interpolate_video(model, clip, out / "o.mp4", scene_threshold=-1.0, quiet=True)
    # 0 and 100 are scores too: every change a cut, or none.
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", clip, out / "o.mp4", "--scene-threshold", "0"), capsys)
    assert rc == 0 and "15 scene cut(s)" in stdout and "(0 interpolated" in stdout, err


@needs_apps
def test_full_disk_mid_video_leaves_no_output(tmp_path, weights, clip, capsys, monkeypatch, blend_network):
    written = []

    def mux_until_full(container, packet):
        written.append(packet)
        if len(written) > 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        container.mux(packet)

    monkeypatch.setattr(video, "_mux", mux_until_full)
    out = tmp_path / "out"
    out.mkdir()
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", clip, out / "x2.mp4"), capsys)
    assert_one_line_error(rc, err, "no space left")
    assert leftover_files(out) == []
    # The same into a folder of frames: the half-written folder is removed too.
    monkeypatch.setattr(video, "_save_png", lambda image, f: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", clip, out / "frames/"), capsys)
    assert_one_line_error(rc, err, "no space left")
    assert leftover_files(out) == []


@needs_apps
def test_full_disk_and_uncreatable_outputs_name_the_output_not_a_temporary_file(tmp_path, weights, clip, capsys,
                                                                                  monkeypatch, blend_network):
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(video, "_save_png", lambda image, f: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", clip, out / "frames/"), capsys)
    assert_one_line_error(rc, err, f"writing {out / 'frames'}: no space left on device")
    monkeypatch.setattr(video, "_mux", lambda container, packet: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", clip, out / "x2.mp4"), capsys)
    assert_one_line_error(rc, err, f"writing {out / 'x2.mp4'}: no space left on device")
    for target in ("/proc/x2.mp4", "/proc/frames/"):
        rc, _, err = run_cli(video_argv(weights, "EDSC_s", clip, target), capsys)
        assert_one_line_error(rc, err, target.rstrip("/"), "cannot create")
        assert "partial" not in err
    assert leftover_files(out) == []


def faststart_copy(source: Path, target: Path) -> Path:
    """``source``'s video stream remuxed with its index first (movflags=faststart, as streaming sites
    serve files): FFmpeg can then open the file even when its end is cut off."""
    with av.open(str(source)) as src, av.open(str(target), "w", options={"movflags": "faststart"}) as out:
        stream = out.add_stream_from_template(src.streams.video[0])
        for packet in src.demux(src.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                out.mux(packet)
    return target


@needs_apps
def test_a_truncated_video_that_ffmpeg_still_opens_is_an_error_not_a_short_output(tmp_path, weights, capsys,
                                                                                  blend_network):
    whole = faststart_copy(make_clip(tmp_path / "whole.mp4", frames=48, audio=False), tmp_path / "fast.mp4")
    truncated = tmp_path / "truncated.mp4"
    data = whole.read_bytes()
    truncated.write_bytes(data[: len(data) * 7 // 10])
    listed = video.probe(truncated).times
    assert 2 < len(listed) < 48  # FFmpeg opens it and lists the frames whose packets start in it
    out = tmp_path / "out"
    out.mkdir()
    for target in (out / "x2.mp4", out / "frames/"):
        rc, _, err = run_cli(video_argv(weights, "EDSC_s", truncated, target), capsys)
        assert_one_line_error(rc, err, truncated, "truncated", f"{len(listed)} frames")
    assert leftover_files(out) == []


@needs_packages("av", "tqdm")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_remove_the_partial_output(tmp_path, weights, signum):
    source = make_clip(tmp_path / "long.mp4", frames=400, w=128, h=96, audio=False)
    out = tmp_path / "out"
    out.mkdir()
    # Started as a shell starts it, with both signals at their defaults: an ignored disposition is
    # inherited, so under `nohup pytest` the tool would rightly keep ignoring SIGHUP and run to the end.
    start = ("import runpy, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
             "signal.signal(signal.SIGTERM, signal.SIG_DFL); sys.argv[0] = 'interpolate'; "
             "runpy.run_module('edsc_ext.apps.interpolate', run_name='__main__')")
    command = [sys.executable, "-c", start, *map(str, video_argv(weights, "EDSC_s", source, out / "x2.mp4"))]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=Path(__file__).resolve().parents[1])
    try:
        deadline = time.monotonic() + 120
        while not leftover_files(out) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # until the temporary output exists: the run is under way
        assert process.poll() is None, process.communicate()
        process.send_signal(signum)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 128 + signum, err
    assert f"stopped by {signal.Signals(signum).name}" in err and "Traceback" not in err, err
    assert leftover_files(out) == []


def test_an_ignored_sighup_stays_ignored_and_a_default_one_stops_the_run():
    """nohup's SIGHUP (ignored) is left alone; at its default it raises Stopped; restored after."""
    from edsc_ext.apps import common

    before = signal.getsignal(signal.SIGHUP)
    try:
        for disposition, stops in ((signal.SIG_IGN, False), (signal.SIG_DFL, True)):
            signal.signal(signal.SIGHUP, disposition)
            with common.signals_stop_the_run():
                handler = signal.getsignal(signal.SIGHUP)
                assert (handler not in (signal.SIG_IGN, signal.SIG_DFL)) == stops
                if stops:
                    with pytest.raises(common.Stopped) as stopped:
                        handler(signal.SIGHUP, None)
                    assert stopped.value.name == "SIGHUP"
            assert signal.getsignal(signal.SIGHUP) == disposition
    finally:
        signal.signal(signal.SIGHUP, before)


def test_the_queues_are_bounded():
    produced = []

    def frames():
        for k in range(50):
            produced.append(k)
            yield k

    import time

    reader = video.Prefetch(frames, maxsize=3)
    seen = []
    for k in reader:
        seen.append(k)
        time.sleep(0.002)
        assert len(produced) - len(seen) <= 3 + 1  # the queue, plus the one the thread holds
    assert seen == list(range(50))

    class Slow:
        items = []

        def write(self, item):
            time.sleep(0.002)
            self.items.append(item)

        def finish(self):
            self.items.append("end")

        def abort(self):
            pass

    sink = Slow()
    writer = video.BackgroundWriter(sink, maxsize=2)
    for k in range(20):
        writer.put(k)
        assert k - len(sink.items) <= 2 + 1
    writer.close()
    assert sink.items == list(range(20)) + ["end"]


@needs_packages("tqdm")
def test_progress_bar_counts_when_quiet_and_shows_totals(capsys):
    bar = interpolate.progress(total=3, desc="x", disable=True)
    for _ in range(3):
        bar.update(1)
    bar.set_postfix_str("loss 1", refresh=False)
    bar.close()
    assert bar.n == bar.total == 3 and bar.postfix == "loss 1"
    assert capsys.readouterr().err == ""
    shown = interpolate.progress(total=2, desc="y", unit="frame")
    shown.update(2)
    shown.close()
    assert "2/2" in capsys.readouterr().err


@needs_packages("av", "tqdm")
@needs_video_data
def test_real_clip_car_turn_x2_and_60_fps(tmp_path, weights, capsys, blend_network):
    out = tmp_path / "car_x2.mp4"
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", CAR_TURN, out), capsys)
    assert rc == 0, err
    got = read_clip(out)
    assert (got["width"], got["height"], got["codec"]) == (640, 360, "h264")  # not 640x368
    assert got["times"] == [Fraction(k, 50) for k in range(162)]
    assert "crf 23" in stdout  # the CRF car-turn's x264 recorded
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_m", CAR_TURN, tmp_path / "car_60.mkv", "--fps", "60",
                                         "--batch", "4"), capsys)
    assert rc == 0, err
    got = read_clip(tmp_path / "car_60.mkv")
    assert len(got["times"]) == 195 and (got["width"], got["height"]) == (640, 360)  # 3.24 s * 60 = 194.4
    assert all(abs(t - got["times"][0] - Fraction(k, 60)) <= Fraction(1, 1000) for k, t in enumerate(got["times"]))


@needs_apps
@needs_video_data
def test_real_clip_through_the_network_in_tiles(tmp_path, weights, capsys, monkeypatch):
    # Three frames of car-turn, cropped to 96x160, through the random EDSC_s in 64-pixel tiles.
    info = video.probe(CAR_TURN)
    decoded = video.decode_frames(info)
    frames = [a for _, (_, a) in zip(range(3), decoded)]
    decoded.close()
    folder = tmp_path / "car"
    folder.mkdir()
    for k, a in enumerate(frames):
        Image.fromarray(a[100:196, 200:360]).save(folder / f"{k}.png")
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", folder, tmp_path / "tiled/", "--tile", "64", "--tile-margin",
                                    "32"), capsys)
    assert rc == 0, err
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", folder, tmp_path / "whole/"), capsys)
    assert rc == 0, err
    for k in range(5):
        a = images.read_array(tmp_path / "tiled" / f"{k:08d}.png").astype(int)
        b = images.read_array(tmp_path / "whole" / f"{k:08d}.png").astype(int)
        assert np.abs(a - b).max() <= 1  # 8-bit rounding of values that differ by < 1e-3


# --------------------------------------------------------------------------------------------
# Evaluation


def test_metrics(gen):
    a = torch.rand(3, 24, 24, generator=gen, dtype=torch.float64)
    assert evaluate.ssim(a, a) == pytest.approx(1.0)
    assert evaluate.psnr(a, a) == float("inf")
    b = (a + 0.1).clamp(0, 1)
    assert evaluate.psnr(a, a + 0.1) == pytest.approx(20.0)
    noise = torch.rand(3, 24, 24, generator=gen, dtype=torch.float64)
    assert abs(evaluate.ssim(a, noise)) < 0.2 < evaluate.ssim(a, b) < 1


def test_metrics_equal_scikit_image(gen):
    """PSNR and SSIM against scikit-image's (Gaussian window, sigma 1.5, population covariance, as
    Wang et al.): random images and a smoothed, noisy, shifted version of each, several sizes."""
    metrics = pytest.importorskip("skimage.metrics", reason="needs skimage: pip install scikit-image")
    for h, w in ((24, 24), (37, 50), (64, 31)):
        a = torch.rand(3, h, w, generator=gen, dtype=torch.float64)
        smooth = torch.nn.functional.avg_pool2d(a.unsqueeze(0), 3, stride=1, padding=1, count_include_pad=False)[0]
        b = (0.7 * smooth + 0.3 * torch.rand(3, h, w, generator=gen, dtype=torch.float64)).roll(1, dims=2)
        x, y = a.permute(1, 2, 0).numpy(), b.permute(1, 2, 0).numpy()
        expected_ssim = metrics.structural_similarity(x, y, data_range=1.0, channel_axis=2, gaussian_weights=True,
                                                      sigma=1.5, use_sample_covariance=False)
        assert evaluate.ssim(b, a) == pytest.approx(expected_ssim, abs=1e-9)
        assert evaluate.psnr(b, a) == pytest.approx(metrics.peak_signal_noise_ratio(x, y, data_range=1.0), abs=1e-9)


@needs_packages("PIL", "tqdm")
@needs_middlebury
def test_evaluate_prints_a_table(weights, capsys):
    rc = evaluate.main(["--weights", str(weights["EDSC_s"]), "--data", str(MIDDLEBURY), "--sequences",
                        "Venus,RubberWhale", "--crop", "48", "--device", "cpu", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert [r.split("|")[1].strip() for r in rows] == ["sequence", "Venus", "RubberWhale", "mean"]
    psnr_value = float(rows[1].split("|")[2])
    ssim_value = float(rows[1].split("|")[3])
    assert 0 < psnr_value < 60 and -1 <= ssim_value <= 1
    assert evaluate.find_middlebury(str(MIDDLEBURY)) == MIDDLEBURY
    # EDSC_s at another time than the midpoint: one line, exit code 2.
    rc = evaluate.main(["--weights", str(weights["EDSC_s"]), "--data", str(MIDDLEBURY), "--time", "0.25", "--quiet"])
    assert_one_line_error(rc, capsys.readouterr().err, "EDSC_s", "EDSC_m")


# --------------------------------------------------------------------------------------------
# More than 8 bits, and the --compile switch.


def write_x264_clip(path: Path, frames, pix_fmt: str, colorspace=None, color_range=None) -> Path:
    """A 32x32, 24 fps, near-lossless (CRF 10) H.264 clip of the given av.VideoFrames."""
    out = av.open(str(path), "w")
    stream = out.add_stream("libx264", rate=24, options={"crf": "10"})
    stream.width, stream.height, stream.pix_fmt = 32, 32, pix_fmt
    if colorspace is not None:
        stream.codec_context.colorspace, stream.codec_context.color_range = colorspace, color_range
    for k, frame in enumerate(frames):
        frame.pts = k
        out.mux(stream.encode(frame))
    out.mux(stream.encode(None))
    out.close()
    return path


@needs_packages("av", "tqdm")
def test_ten_bit_video_stays_ten_bit(tmp_path, weights, capsys, blend_network):
    ramps = [(np.linspace(0, 65535, 32 * 32 * 3).reshape(32, 32, 3) + k * 500) % 65535 for k in range(4)]
    source = write_x264_clip(tmp_path / "deep.mkv", [av.VideoFrame.from_ndarray(r.astype(np.uint16), format="rgb48le")
                                                      for r in ramps], "yuv420p10le")
    assert video.probe(source).deep
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", source, tmp_path / "x2.mkv"), capsys)
    assert rc == 0, err
    got = read_clip(tmp_path / "x2.mkv")
    assert got["pix_fmt"] == "yuv420p10le" and len(got["times"]) == 8


@needs_packages("av", "PIL")
def test_compile_flag_compiles_the_network(tmp_path, weights, clip, capsys, monkeypatch):
    compiled = []

    def fake_compile(fn, **kwargs):
        compiled.append((fn.__name__, kwargs.get("mode")))
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    first, second = write_pair(tmp_path / "in", 16, 16)
    rc, _, err = run_cli(["--weights", weights["EDSC_s"], "--compile", first, second, "-o", tmp_path / "m.png",
                          "--device", "cpu"], capsys)
    # The network under the engine's autocast (entered inside what is compiled); no CUDA graphs on the CPU.
    assert rc == 0 and compiled == [("_autocast_forward", None)], err


@needs_packages("av", "tqdm")
def test_colour_tags_of_the_input_are_kept(tmp_path, weights, capsys, blend_network):
    frames = [av.VideoFrame.from_ndarray(np.full((32, 32, 3), 40 * k + 30, np.uint8), format="rgb24").reformat(
        format="yuv420p", dst_colorspace=1, dst_color_range=1) for k in range(3)]
    source = write_x264_clip(tmp_path / "bt709.mp4", frames, "yuv420p", colorspace=1, color_range=1)  # BT.709, limited
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", source, tmp_path / "x2.mp4"), capsys)
    assert rc == 0, err
    with av.open(str(tmp_path / "x2.mp4")) as container:
        ctx = container.streams.video[0].codec_context
        assert (int(ctx.colorspace), int(ctx.color_range)) == (1, 1)
        first = next(container.decode(video=0)).to_ndarray(format="rgb24").astype(int)
    assert np.abs(first - 30).max() <= 2


@needs_packages("av", "PIL")
@pytest.mark.parametrize("module", ["av", "PIL", "tqdm"])
def test_a_missing_apps_package_is_one_line_naming_the_extra(tmp_path, weights, clip, capsys, monkeypatch, module):
    first, second = write_pair(tmp_path / "in", 8, 8)
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)  # import fails
    if module == "PIL":
        monkeypatch.setitem(sys.modules, "PIL.Image", None)
    argv = {"av": video_argv(weights, "EDSC_s", clip, tmp_path / "o.mp4"),
            "PIL": ["--weights", weights["EDSC_s"], first, second, "-o", tmp_path / "o.png", "--device", "cpu"],
            "tqdm": video_argv(weights, "EDSC_s", clip, tmp_path / "o.mp4")[:-1]}[module]
    rc, _, err = run_cli(argv, capsys)
    assert_one_line_error(rc, err, f"'{module}' package", 'pip install tqdm pillow "av>=18"')


@needs_packages("av", "tqdm")
def test_subtitles_are_copied_where_the_container_takes_them(tmp_path, weights, capsys, blend_network):
    source = tmp_path / "subs.mkv"
    out = av.open(str(source), "w")
    stream = out.add_stream("libx264", rate=24)
    stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
    subs = out.add_mux_stream("subrip", time_base=Fraction(1, 1000))
    for k in range(6):
        frame = av.VideoFrame.from_ndarray(scene(k, 32, 32, False), format="rgb24")
        frame.pts = k
        out.mux(stream.encode(frame))
        if k == 2:
            packet = av.Packet(b"Hello there")
            packet.stream, packet.time_base = subs, Fraction(1, 1000)
            packet.pts = packet.dts = 83
            packet.duration = 100
            out.mux(packet)
    out.mux(stream.encode(None))
    out.close()
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", source, tmp_path / "x2.mkv"), capsys)
    assert rc == 0 and "copied subtitle" in stdout, err
    with av.open(str(tmp_path / "x2.mkv")) as container:
        copied = [(bytes(p), p.pts, p.duration) for p in container.demux(container.streams.subtitles[0]) if p.size]
    assert copied == [(b"Hello there", 83, 100)]
    # MP4 takes no SubRip: left out, with a note (not an error).
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", source, tmp_path / "x2.mp4")[:-1], capsys)
    assert rc == 0 and "subtitle stream" in err and "left out" in err


# --------------------------------------------------------------------------------------------
# The device side of the video path: colour conversion, untouched copies, rotation, speed flags.


def smooth_rgb(gen, h: int, w: int) -> np.ndarray:
    """A random smooth RGB image (uint8): noise at 1/8 of the size, bilinearly upsampled."""
    small = torch.rand(1, 3, h // 8 + 1, w // 8 + 1, generator=gen)
    big = torch.nn.functional.interpolate(small, size=(h, w), mode="bilinear", align_corners=False)
    return (big[0].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()


def swscale_rgb(planes: np.ndarray, layout, colorspace: int, color_range: int) -> np.ndarray:
    """swscale's 8-bit RGB of flat planar samples, the chroma first repeated over the pixels it covers."""
    h, w = layout.height, layout.width
    _, sx, sy = frames.PLANAR_YUV[layout.format]
    y, u, v = layout.planes(planes)
    full = [y] + [np.repeat(np.repeat(c, 1 << sy, 0), 1 << sx, 1)[:h, :w] for c in (u, v)]
    name = {8: "yuv444p", 10: "yuv444p10le", 12: "yuv444p12le"}[layout.bits]
    frame = av.VideoFrame(w, h, name)
    for target, source in zip(video.plane_views(frame, frames.Layout(name, h, w)), full):
        target[...] = source
    return frame.to_ndarray(format="rgb24", src_colorspace=colorspace, src_color_range=color_range)


def yuv_reference(rgb: np.ndarray, layout) -> np.ndarray:
    """The flat planar YUV codes of an 8-bit RGB image in float64 (rounded), from the standards' luma
    weights and ranges; each chroma sample the mean of the pixels it covers (sizes its multiples here)."""
    kr, kb = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722), "bt2020": (0.2627, 0.0593)}[layout.matrix]
    r, g, b = (rgb.astype(np.float64) / 255).transpose(2, 0, 1)
    y = kr * r + (1 - kr - kb) * g + kb * b
    _, sx, sy = frames.PLANAR_YUV[layout.format]
    h, w = y.shape

    def covered_mean(c):
        return c.reshape(h >> sy, 1 << sy, w >> sx, 1 << sx).mean(axis=(1, 3))

    cb, cr = covered_mean((b - y) / (2 * (1 - kb))), covered_mean((r - y) / (2 * (1 - kr)))
    top, scale = (1 << layout.bits) - 1, 1 << (layout.bits - 8)
    if layout.full_range:
        y, cb, cr = y * top, cb * top + (top + 1) / 2, cr * top + (top + 1) / 2
    else:
        y, cb, cr = (16 + 219 * y) * scale, (128 + 224 * cb) * scale, (128 + 224 * cr) * scale
    return np.clip(np.round(np.concatenate([p.ravel() for p in (y, cb, cr)])), 0, top)


@needs_packages("av")
@pytest.mark.parametrize("pix_fmt, colorspace, color_range", [
    ("yuv420p", 2, 0), ("yuv420p", 1, 1), ("yuv420p", 5, 2), ("yuv422p", 1, 1), ("yuv444p", 6, 1),
    ("yuv420p10le", 1, 1), ("yuv420p10le", 9, 1), ("yuv422p10le", 9, 2), ("yuv444p12le", 1, 1)])
def test_device_yuv_conversion_agrees_with_swscale(gen, pix_fmt, colorspace, color_range):
    from av.video.reformatter import VideoReformatter

    h, w = 48, 80
    rgb = smooth_rgb(gen, h, w)
    yuv_frame = VideoReformatter().reformat(av.VideoFrame.from_ndarray(rgb, format="rgb24"), format=pix_fmt,
                                            dst_colorspace=colorspace, dst_color_range=color_range)
    layout = frames.yuv_layout_of(pix_fmt, colorspace, color_range, w, h)
    assert layout.matrix == {1: "bt709", 9: "bt2020"}.get(colorspace, "bt601")
    assert layout.full_range == (color_range == 2) and layout.planar
    planes = video.frame_to_host(yuv_frame, layout)
    assert planes.shape == layout.shape and planes.dtype == layout.dtype
    step = 1 << (layout.bits - 8)  # codes per 8-bit level
    y_size = h * w
    # YUV -> RGB: swscale's own conversion of the same planes, their chroma repeated to 4:4:4 first (as
    # the device does; swscale's generic path for deep formats filters the chroma instead).
    expected = swscale_rgb(planes, layout, colorspace, color_range)
    bgr = frames.to_model(frames.host_tensor(planes), layout)
    assert bgr.shape == (3, h, w) and bgr.dtype == torch.float32
    references = [expected]
    if pix_fmt == "yuv420p":  # swscale's unscaled 4:2:0 path repeats the chroma too (and rounds its own way)
        references.append(yuv_frame.to_ndarray(format="rgb24", src_colorspace=colorspace, src_color_range=color_range))
    for reference in references:
        diff = (bgr.flip(0).permute(1, 2, 0) * 255 - torch.from_numpy(reference).float()).abs()
        assert diff.max() <= 3.5 and diff.mean() <= 1.5, (diff.max(), diff.mean())
    # RGB -> YUV: every sample within a code of the float64 reference (chroma: the mean of the pixels it
    # covers); the luma within a level of swscale's, the chroma close to its filter on average. Not at
    # each sample: swscale (FFmpeg 7.1) writes runs of neutral chroma (512) into some 4:2:2 10-bit frames.
    mine = frames.from_model(torch.from_numpy(rgb).permute(2, 0, 1).flip(0).float() / 255, layout)
    assert mine.shape == planes.shape and mine.dtype == layout.torch_dtype
    mine = frames.host_array(mine, layout).astype(int)
    assert np.abs(mine - yuv_reference(rgb, layout)).max() <= 1
    d = np.abs(mine - planes.astype(int)) / step
    assert d[:y_size].max() <= 1 and d[y_size:].mean() <= 1.5, (d[:y_size].max(), d[y_size:].mean())
    # There and back: the chroma exactly, the luma to within one code (colours the RGB cube holds: a
    # clamped one converts back to another).
    back = frames.host_array(frames.from_model(bgr, layout), layout).astype(int)
    d = np.abs(back - planes.astype(int))
    clamped = ((bgr <= 0) | (bgr >= 1)).any(0)[None, None].float()
    (_, _), (ch, cw), _ = layout.plane_shapes
    block = torch.nn.functional.adaptive_max_pool2d(clamped, (ch, cw))[0, 0].bool().numpy()
    assert clamped.mean() < 0.05
    assert d[:y_size][~clamped[0, 0].bool().numpy().ravel()].max() <= 1
    chroma = d[y_size:].reshape(2, ch, cw)
    assert chroma[:, ~block].max() == 0
    # Batches convert alike.
    pair = frames.to_model(frames.host_tensor(np.stack([planes, planes])), layout)
    assert torch.equal(pair[0], bgr) and torch.equal(pair[1], bgr)
    # The scene thumbnail of the Y plane: the luma of the RGB with the video's matrix, to within rounding
    # (BT.601: what the RGB path's thumbnail weighs).
    y_thumb = interpolate.luma_thumbnail_of(planes, layout)
    kr, kb = frames.YUV_MATRICES[layout.matrix]
    r, g, b = torch.from_numpy(expected).permute(2, 0, 1).float() / 255
    luma_thumb = timing.luma_thumbnail(kr * r + (1 - kr - kb) * g + kb * b)
    assert y_thumb.shape == luma_thumb.shape == (38, 64) and (y_thumb - luma_thumb).abs().max() < 0.01
    if layout.matrix == "bt601":
        rgb_thumb = interpolate.luma_thumbnail_of(expected, frames.Layout("rgb24", h, w))
        assert (y_thumb - rgb_thumb).abs().max() < 0.01
    # Formats and matrices the device does not convert are left to swscale.
    assert frames.yuv_layout_of(pix_fmt, 7, 0, w, h) is None  # SMPTE 240M
    assert frames.yuv_layout_of("nv12", 1, 0, w, h) is None and frames.yuv_layout_of("gbrp", 1, 0, w, h) is None


@needs_packages("av")
def test_odd_sized_planar_frames_convert_and_round_trip(gen):
    h, w = 15, 21  # chroma 8x11 at 4:2:0, the last row and column covering one pixel
    rgb = smooth_rgb(gen, 16, 24)[:h, :w]
    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24").reformat(format="yuv420p")
    layout = frames.yuv_layout_of("yuv420p", 2, 0, w, h)
    assert layout.plane_shapes == [(15, 21), (8, 11), (8, 11)]
    planes = video.frame_to_host(frame, layout)
    bgr = frames.to_model(torch.from_numpy(planes), layout)
    expected = swscale_rgb(planes, layout, 2, 0)
    assert (bgr.flip(0).permute(1, 2, 0) * 255 - torch.from_numpy(expected).float()).abs().max() <= 3.5
    back = frames.from_model(bgr, layout).numpy().astype(int)
    assert np.abs(back[h * w:] - planes[h * w:].astype(int)).max() == 0
    assert np.abs(back[:h * w] - planes[:h * w].astype(int)).max() <= 1


def test_rgb_layouts_round_trip(gen):
    rgb8 = smooth_rgb(gen, 8, 16)
    layout = frames.Layout("rgb24", 8, 16)
    bgr = frames.to_model(torch.from_numpy(rgb8), layout)
    assert np.array_equal(bgr.flip(0).permute(1, 2, 0).mul(255).round().to(torch.uint8).numpy(), rgb8)
    assert np.array_equal(frames.from_model(bgr, layout).numpy(), rgb8)
    rgb16 = (rgb8.astype(np.uint16) * 257 + 3).astype(np.uint16)
    layout16 = frames.Layout("rgb48le", 8, 16)
    back = frames.from_model(frames.to_model(frames.host_tensor(rgb16), layout16), layout16)
    assert back.dtype == torch.int16 and np.array_equal(frames.host_array(back, layout16), rgb16)


class RecordingSink:
    """A sink that keeps what it is given (in the encode thread), in the layout ``layout``."""

    def __init__(self, layout):
        self.layout, self.items, self.finished = layout, [], False

    def write(self, item):
        host, time = item
        self.items.append((host.get().copy(), host.layout, time))

    def finish(self):
        self.finished = True

    def abort(self):
        pass


@needs_packages("av")
def test_copied_frames_reach_the_encoder_untouched_and_new_ones_are_converted(weights, clip, blend_network):
    source = interpolate.open_source(clip)
    layout = source.layout
    assert layout.format == "yuv420p"  # the x264 clip: its planes are handed over as they are
    decoded = [a for _, a in video.decode_frames(source.info, layout)]
    model = load_weights(weights["EDSC_s"])
    engine_ = engine.Interpolator(model, batch=3)
    sink = RecordingSink(layout)
    schedule = timing.Schedule(factor=2, start=source.times[0], tolerance=source.time_base / 2)
    written, made, cuts = interpolate.stream_frames(engine_, source, sink, schedule)
    assert (written, made, cuts) == (32, 15 - 1, 1) and sink.finished
    assert [time for _, _, time in sink.items] == [Fraction(k, 48) for k in range(32)]
    for k, (array, got_layout, _) in enumerate(sink.items):
        assert got_layout == layout and array.shape == (64 * 48 * 3 // 2,)
        if k % 2 == 0:  # input frame k/2, as decoded
            assert np.array_equal(array, decoded[k // 2]), k
    # A new frame is the blend of its neighbours, converted on the device (to within rounding).
    first, second = (frames.to_model(torch.from_numpy(decoded[j]), layout) for j in (2, 3))
    expected = frames.from_model((first + second) / 2, layout).numpy()
    assert np.abs(sink.items[5][0].astype(int) - expected.astype(int)).max() <= 1
    assert [shape[0] for shape in blend_network] == [3, 3, 3, 3, 2]  # batches of 3 new frames, the rest at the end


def load_weights(path):
    return engine.load_model(path, device="cpu")


@needs_apps
@pytest.mark.parametrize("rotation", [90, 180, 270])
def test_rotated_input_keeps_its_matrix_or_gets_turned_pixels(tmp_path, weights, capsys, blend_network, rotation):
    source = make_clip(tmp_path / f"phone{rotation}.mp4", frames=4, w=64, h=48, audio=False, rotation=rotation)
    info = video.probe(source)
    assert info.rotation == rotation and not info.mirrored
    upright = [np.rot90(f, rotation // 90) for f in read_clip(source, frames=True)["frames"]]
    # MP4 and MKV keep the matrix: same coded size, players turn it alike.
    for ext in (".mp4", ".mkv"):
        out = tmp_path / f"kept{rotation}{ext}"
        rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", source, out), capsys)
        assert rc == 0 and f"display rotation {rotation} kept" in stdout, err
        got = read_clip(out)
        assert (got["width"], got["height"], got["rotation"]) == (64, 48, rotation)
    # AVI stores no matrix: the pixels are turned (the size too, for a quarter turn).
    out = tmp_path / f"turned{rotation}.avi"
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", source, out), capsys)
    assert rc == 0 and f"pixels turned by {rotation}" in stdout, err
    got = read_clip(out, frames=True)
    assert got["rotation"] == 0 and (got["height"], got["width"]) == upright[0].shape[:2]
    assert np.abs(got["frames"][0] - upright[0]).mean() < 0.03  # mpeg4 at the input's bit rate
    # PNG frames are upright too.
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", source, tmp_path / f"frames{rotation}/"), capsys)
    assert rc == 0, err
    first = images.read_array(tmp_path / f"frames{rotation}" / "00000000.png").astype(np.float32) / 255
    assert first.shape == upright[0].shape and np.abs(first - upright[0]).max() < 0.02


@needs_apps
def test_a_mirroring_display_matrix_is_kept_as_it_is_or_noted(tmp_path, weights, capsys, blend_network):
    source = tmp_path / "selfie.mp4"
    with av.open(str(source), "w") as out:
        stream = out.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        stream.set_display_rotation(90, hflip=True)
        for k in range(3):
            frame = av.VideoFrame.from_ndarray(scene(k, 32, 32, False), format="rgb24")
            frame.pts = k
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    info = video.probe(source)
    assert info.mirrored and info.display_matrix is not None
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", source, tmp_path / "kept.mov"), capsys)
    assert rc == 0, err
    assert video.probe(tmp_path / "kept.mov").display_matrix == info.display_matrix
    argv = [a for a in video_argv(weights, "EDSC_s", source, tmp_path / "frames/") if a != "--quiet"]
    rc, _, err = run_cli(argv, capsys)
    assert rc == 0 and "mirrors" in err and "not mirrored" in err, err


@needs_packages("av", "tqdm")
def test_preset_is_passed_to_x264_and_checked(tmp_path, weights, clip, capsys, blend_network):
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", clip, tmp_path / "fast.mp4", "--preset", "veryfast"),
                              capsys)
    assert rc == 0 and "preset veryfast" in stdout, err
    assert len(read_clip(tmp_path / "fast.mp4")["times"]) == 32
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", clip, tmp_path / "bad.mp4", "--preset", "warp"), capsys)
    assert_one_line_error(rc, err, "--preset warp", "veryfast")
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", clip, tmp_path / "bad.avi", "--codec", "mpeg4", "--preset",
                                    "fast"), capsys)
    assert_one_line_error(rc, err, "--preset fast", "no presets")
    assert leftover_files(tmp_path) == ["fast.mp4"]


@needs_packages("av", "tqdm")
def test_speed_flags_fall_back_on_the_cpu_in_one_line(tmp_path, weights, clip, capsys):
    # Lossless (--crf 0): the comparison is of the network's frames. A lossy x264 encode of the same frames
    # came out different in one frame between two runs of one process (CI, after the real-clip tests).
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", clip, tmp_path / "plain.mkv", "--crf", "0"), capsys)
    assert rc == 0 and "network: eager fp32" in stdout, err
    plain = read_clip(tmp_path / "plain.mkv", frames=True)["frames"]
    for flags, needle in ((["--half"], "--half"), (["--bf16"], "--half"), (["--cuda-graph"], "--cuda-graph")):
        out = tmp_path / f"{flags[0][2:]}.mkv"
        # Without --quiet: the notes are shown.
        argv = [a for a in video_argv(weights, "EDSC_s", clip, out, "--crf", "0", *flags) if a != "--quiet"]
        rc, stdout, err = run_cli(argv, capsys)
        notes = [line for line in err.splitlines() if line.strip() and "interpolating" not in line]
        assert rc == 0 and len(notes) == 1 and needle in notes[0] and "cpu" in notes[0], err
        assert "Traceback" not in err and "network: eager fp32" in stdout
        got = read_clip(out, frames=True)["frames"]
        assert all(np.array_equal(a, b) for a, b in zip(got, plain))  # the same float32 path
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", clip, tmp_path / "x.mkv", "--half", "--bf16"), capsys)
    assert_one_line_error(rc, err, "--bf16", "--half")


@needs_packages("av", "tqdm")
def test_a_failing_compile_falls_back_to_the_eager_network_in_one_line(tmp_path, weights, clip, capsys, monkeypatch):
    attempts = []

    def failing_compile(model, **kwargs):
        def compiled(*args):
            attempts.append(len(args))
            raise RuntimeError("InductorError: no working C++ compiler found\nmore detail")
        return compiled

    monkeypatch.setattr(torch, "compile", failing_compile)
    argv = [a for a in video_argv(weights, "EDSC_s", clip, tmp_path / "c.mkv", "--compile") if a != "--quiet"]
    rc, stdout, err = run_cli(argv, capsys)
    notes = [line for line in err.splitlines() if line.strip() and "interpolating" not in line]
    assert rc == 0 and attempts == [3] and len(notes) == 1, err
    assert "torch.compile failed" in notes[0] and "no working C++ compiler" in notes[0] and "more detail" not in err
    assert "network: eager fp32" in stdout and "compiled" not in stdout


@needs_packages("av", "tqdm")
def test_video_benchmark_reports_model_tool_and_io_rates(tmp_path, capsys):
    from edsc_ext.benchmarks import video as video_benchmark

    path = tmp_path / "video.json"
    rc = video_benchmark.main(["--size", "64x32", "--frames", "3", "--device", "cpu", "--repeat", "1",
                               "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    report = json.loads(path.read_text())
    assert (report["width"], report["height"], report["frames"], report["new_frames"]) == (64, 32, 3, 2)
    assert report["output_frames"] == 6 and report["network"] == "eager fp32" and report["precision"] == "fp32"
    assert report["host_layout"] == "yuv420p" and report["encoding"].startswith("libx264 yuv420p")
    assert report["device"].startswith("CPU") and report["batch"] == 1 and not report["blend"]
    assert report["cudnn_benchmark"] is False and "cuDNN autotuning off" in out
    assert [row["run"] for row in report["rows"]] == ["model", "memory", "io"]
    for row in report["rows"]:
        assert row["seconds"] > 0 and len(row["all_seconds"]) == 1
        assert row["new_frames_per_s"] == pytest.approx(2 / row["seconds"])
        assert row["vs_model"] == pytest.approx(report["rows"][0]["seconds"] / row["seconds"])
    assert report["rows"][0]["output_frames_per_s"] is None
    assert report["rows"][2]["output_frames_per_s"] == pytest.approx(6 / report["rows"][2]["seconds"])
    assert "| model only" in out and "| tool with I/O" in out and "vs model" in out
    # The network replaced by a blend: the tool's own overhead.
    rc = video_benchmark.main(["--size", "64x32", "--frames", "3", "--device", "cpu", "--repeat", "1", "--blend",
                               "--cudnn-benchmark", "--json", str(path)])
    blended = json.loads(path.read_text())
    assert rc == 0 and blended["network"] == "blend fp32" and blended["cudnn_benchmark"] is True
    capsys.readouterr()
    rc = video_benchmark.main(["--size", "63x32"])
    assert_one_line_error(rc, capsys.readouterr().err, "--size", "even")


def device_frames(gen, count: int, h: int, w: int, device: str = "cuda"):
    """Random smooth BGR frames (3, H, W) in [0, 1] on the device."""
    return [torch.from_numpy(smooth_rgb(gen, h, w)).permute(2, 0, 1).flip(0).float().div(255).to(device)
            for _ in range(count)]


@requires_cuda
@pytest.mark.parametrize("multiple", [False, True])
def test_cuda_graph_and_half_paths_run_and_match_the_fp32_eager_network(gen, multiple):
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    model = (EDSC_m() if multiple else EDSC_s()).cuda().eval()
    h, w = 72, 100  # padded to 96x128 inside
    frames = device_frames(gen, 4, h, w)
    times = [0.3, 0.5, 0.8] if multiple else [Fraction(1, 2)] * 3
    jobs = [(frames[i], frames[i + 1], t) for i, t in enumerate(times)]  # 3 jobs in batches of 2: one padded
    eager = engine.Interpolator(model, batch=2, cuda_graph=False)
    expected = torch.stack(eager.interpolate_bgr(jobs))
    assert eager.paths == {"eager fp32": 2} and expected.shape == (3, 3, h, w)
    graph = engine.Interpolator(model, batch=2)  # the default on CUDA: graph replay
    graph.prepare(h, w)
    # float32 convolutions run on cuDNN's TF32 (torch's default), whose algorithm choice may differ
    # between the captured and the eager calls: rounding at TF32's 10-bit mantissa, 1.5e-5 on the H200.
    assert rel_error(torch.stack(graph.interpolate_bgr(jobs)), expected) < 1e-3
    assert graph.paths == {"graph fp32": 2}
    # Half precisions (autocast, channels_last), replayed and eager; tolerances of the model's tests,
    # loosened 1.5x for the clamped, cropped output.
    for half, tol in (("fp16", 5e-3), ("bf16", 3e-2)):
        for cuda_graph in (True, False):
            fast = engine.Interpolator(model, batch=2, half=half, cuda_graph=cuda_graph)
            fast.prepare(h, w)
            got = torch.stack(fast.interpolate_bgr(jobs))
            assert fast.paths == {f"{'graph' if cuda_graph else 'eager'} {half}": 2}
            assert got.dtype == torch.float32 and rel_error(got, expected) < tol, (half, cuda_graph)


def test_compiled_graphs_pad_a_partial_batch_and_copy_each_output(gen, monkeypatch):
    """The engine's logic around compiled CUDA graphs, on the CPU with a stand-in for the compiled
    function: every call gets the whole batch (a partial one padded with its last pair, so that one
    compile and one graph serve the frame size), each output is sliced back and copied out of the
    graph's memory, and a new replay step is marked before each call."""
    from edsc_ext.apps import engine as engine_module

    calls, steps = [], []

    def fake_compile(fn, **kwargs):
        assert kwargs.get("mode") is None  # on the CPU: no graphs asked for
        def compiled(first, second, times):
            calls.append(first.shape[0])
            compiled.last = fn(first, second, times)
            return compiled.last
        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: steps.append(1))
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    model = EDSC_s().eval()
    frames_ = [torch.rand(3, 40, 50, generator=gen) for _ in range(4)]
    jobs = [(frames_[i], frames_[i + 1], Fraction(1, 2)) for i in range(3)]
    expected = engine_module.Interpolator(model, batch=2).interpolate_bgr(jobs)
    runner = engine_module.Interpolator(model, batch=2, compile=True)
    runner.compiled_graphs = True  # what CUDA with whole frames sets
    got = runner.interpolate_bgr(jobs)
    assert calls == [2, 2] and len(steps) == 2 and runner.paths == {"compiled graph fp32": 2}
    assert len(got) == 3 and all(torch.equal(a, b) for a, b in zip(got, expected))
    # One pair through the network: padded to the batch, sliced back, copied out of the output's memory.
    out = runner._forward(*(f[:, :32, :32].unsqueeze(0) for f in frames_[:2]), None)
    graph_output = runner._net.last
    assert calls[-1] == 2 and out.shape == (1, 3, 32, 32) and torch.equal(out, graph_output[:1])
    assert out.untyped_storage().data_ptr() != graph_output.untyped_storage().data_ptr()


@requires_cuda
@pytest.mark.cuda
def test_cuda_compile_replays_the_compiled_network_as_cuda_graphs(gen):
    """--compile on CUDA with whole frames: torch.compile in mode "reduce-overhead" (the network under
    the engine's autocast, replayed as CUDA graphs), each frame its own copy (a later replay does not
    overwrite it), equal to the eager network in the same precision."""
    from edsc_ext.apps import engine as engine_module

    torch._dynamo.reset()
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    model = EDSC_s().cuda().eval()
    h, w = 72, 100
    frames_ = device_frames(gen, 4, h, w)
    jobs = [(frames_[i], frames_[i + 1], Fraction(1, 2)) for i in range(3)]
    eager = engine_module.Interpolator(model, half="fp16", cuda_graph=False)
    expected = torch.stack(eager.interpolate_bgr(jobs))
    fast = engine_module.Interpolator(model, half="fp16", compile=True)
    got = torch.stack(fast.interpolate_bgr(jobs))
    assert fast.compiled and fast.compiled_graphs and not fast.use_graph
    assert fast.paths == {"compiled graph fp16": 3} and eager.paths == {"eager fp16": 3}
    assert rel_error(got, expected) < 5e-3
    tiled = engine_module.Interpolator(model, half="fp16", compile=True, tile=64)  # tiles: compiled, no graphs
    assert tiled.compiled and not tiled.compiled_graphs


@requires_cuda
def test_cuda_transfers_keep_every_frame_in_flight(gen):
    transfer = frames.Transfer(torch.device("cuda"))
    layout = frames.Layout("yuv420p", 48, 64)
    host = [torch.randint(0, 256, layout.shape, generator=gen, dtype=torch.uint8).numpy() for _ in range(12)]
    pinned = [transfer.pin(a) for a in host]
    assert all(p.is_pinned() for p in pinned)
    uploaded = [transfer.upload(p) for p in pinned]
    back = transfer.download(torch.stack(uploaded), layout)  # queued behind the uploads, not waited for
    assert [np.array_equal(b.get(), a) for a, b in zip(host, back)] == [True] * 12
    # Through the colour conversion on the GPU: what the CPU computes, to within a rounding tie.
    converted = transfer.download(frames.from_model(frames.to_model(torch.stack(uploaded), layout), layout), layout)
    for a, b in zip(host, converted):
        expected = frames.from_model(frames.to_model(torch.from_numpy(a), layout), layout).numpy()
        assert np.abs(b.get().astype(int) - expected.astype(int)).max() <= 1
    # 16-bit RGB (10-bit video's path) through the device and back, every value.
    rgb16 = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen))).integers(
        0, 65536, (8, 16, 3), dtype=np.uint16)
    layout16 = frames.Layout("rgb48le", 8, 16)
    on_device = frames.to_model(transfer.upload(transfer.pin(rgb16)), layout16)
    (back16,) = transfer.download(frames.from_model(on_device, layout16)[None], layout16)
    assert back16.get().dtype == np.uint16 and np.array_equal(back16.get(), rgb16)


@needs_apps
@requires_cuda
def test_video_on_cuda_graph_and_half_against_eager_fp32(tmp_path, weights, capsys):
    source = make_clip(tmp_path / "c.mp4", frames=6, w=96, h=64, audio=False)
    runs = {}
    # Without flags on CUDA: float16, replayed as a CUDA graph.
    flag_sets = (("eager", ["--no-cuda-graph", "--float32"]), ("graph", ["--float32"]), ("half", []),
                 ("batch", ["--batch", "4", "--float32"]))
    for name, flags in flag_sets:
        argv = ["--weights", weights["EDSC_s"], "--video", source, "-o", tmp_path / f"{name}/", "--device", "cuda",
                "--quiet", *flags]
        rc, stdout, err = run_cli(argv, capsys)
        assert rc == 0, err
        runs[name] = (stdout, [images.read_array(tmp_path / name / f"{k:08d}.png").astype(int) for k in range(12)])
    assert "network: eager fp32" in runs["eager"][0] and "network: graph fp32" in runs["graph"][0]
    assert "network: graph fp16" in runs["half"][0] and "network: graph fp32" in runs["batch"][0]
    eager = runs["eager"][1]
    # 8-bit levels: the same float32 kernels round alike but for ties; float16 within ~1e-2 of float32.
    for name, limit, mean in (("graph", 1, 0.01), ("batch", 1, 0.01), ("half", 10, 1.0)):
        diffs = [np.abs(a - b) for a, b in zip(runs[name][1], eager)]
        assert max(d.max() for d in diffs) <= limit and max(d.mean() for d in diffs) <= mean, name
        assert all(np.array_equal(a, b) for a, b in zip(runs[name][1][::2], eager[::2]))  # the input frames


@requires_cuda
def test_compile_without_triton_on_cuda_is_one_line(weights, capsys, monkeypatch):
    monkeypatch.setattr(engine, "has_triton", lambda: False)
    model = engine.load_model(weights["EDSC_s"], device="cuda")
    runner = engine.Interpolator(model, compile=True)
    err = capsys.readouterr().err
    assert not runner.compiled and "--compile needs Triton" in err and len(err.strip().splitlines()) == 1
