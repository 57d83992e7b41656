"""edsc-interpolate's video pipeline (issue #44): the stage profile and the overlap of the stages, several
devices (cpu,cpu; one GPU listed twice; two GPUs), original frames reaching the encoder as decoded (bit-exact
after a lossless encode, 8-bit and 10-bit), 10-bit video without an 8-bit step, the defects a new user met
(--factor 1, --fps equal to the input's, odd sizes, what an interrupted run leaves, --version), the test clip
and the throughput script.

Clips are made here with PyAV (tiny frames); networks are random EDSC_s/EDSC_m on the CPU, or the blend of the
two frames where what the network computes does not matter."""

from __future__ import annotations

import errno
import json
import re
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from edsc_ext.apps.common import EXTRA_HINT
from edsc_ext.models import EDSC_m

from conftest import assert_one_line_error, missing_packages, requires_cuda, requires_two_gpus, run_cli, subprocess_env

MISSING = missing_packages("av", "PIL", "tqdm")
pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(bool(MISSING), reason=f"needs the apps extra ({', '.join(MISSING)} missing or too "
                                                       f"old): {EXTRA_HINT}")]
if not MISSING:
    import av

    from edsc_ext.apps import common, engine, frames, interpolate, stages, timing, video
    from edsc_ext.benchmarks import video as video_benchmark

REPO = Path(__file__).resolve().parent.parent


def video_argv(weights, name, source, target, *extra):
    return ["--weights", weights[name], "--video", source, "-o", target, "--device", "cpu", "--quiet", *extra]


def random_planes(rng, layout) -> np.ndarray:
    """Samples of every code of the layout's depth (the chroma kept in gamut-ish: near the middle)."""
    top = (1 << layout.bits) - 1
    y_size = layout.height * layout.width
    out = np.empty(layout.shape, dtype=layout.dtype)
    out[:y_size] = rng.integers(0, top + 1, y_size)
    out[y_size:] = rng.integers(top // 4, 3 * top // 4, out.size - y_size)
    return out


def lossless_clip(path: Path, pix_fmt: str, count: int = 6, w: int = 64, h: int = 48, seed: int = 0,
                  rate: int = 24) -> list:
    """A clip of random planes encoded losslessly (x264 at quantiser 0); returns the planes."""
    rng = np.random.default_rng(seed)
    layout = frames.Layout(pix_fmt, h, w)
    written = []
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=rate, options={"qp": "0", "preset": "ultrafast"})
        stream.width, stream.height, stream.pix_fmt = w, h, pix_fmt
        for k in range(count):
            planes = random_planes(rng, layout)
            frame = video.host_to_frame(av, planes, layout)
            frame.pts = k
            out.mux(stream.encode(frame))
            written.append(planes)
        out.mux(stream.encode(None))
    return written


def moving_clip(path: Path, frames: int = 8, w: int = 32, h: int = 32, cut_at=None, audio: bool = True,
                times_ms=None, rate: int = 24) -> Path:
    """A clip of moving gradients (x264 CRF 12), a hard cut before frame ``cut_at`` (another shot, of other
    colours), ``times_ms`` its frames' times for a variable rate, with a stereo AAC track as long as it."""
    yy, xx = np.mgrid[0:h, 0:w]
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=rate, options={"crf": "12"})
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        if times_ms is not None:
            stream.codec_context.time_base = stream.time_base = Fraction(1, 1000)
        sound = out.add_stream("aac", rate=48000) if audio else None
        if sound is not None:
            sound.layout = "stereo"
        for k in range(frames):
            if cut_at is None or k < cut_at:
                rgb = np.stack([(xx * 3 + k * 2) % 256, yy * 4 % 256, np.full_like(xx, 50)], -1)
            else:
                rgb = np.stack([np.full_like(xx, 235), (250 - yy * 3 - k) % 256, (xx * 2 + 100) % 256], -1)
            frame = av.VideoFrame.from_ndarray(rgb.astype(np.uint8), format="rgb24")
            frame.pts = k if times_ms is None else times_ms[k]
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
        if sound is not None:
            samples = int(48000 * (frames / rate if times_ms is None else (times_ms[-1] + 40) / 1000))
            wave = (0.2 * np.sin(2 * np.pi * 440 * np.arange(samples) / 48000)).astype(np.float32)
            for i in range(0, samples, 1024):
                chunk = av.AudioFrame.from_ndarray(np.ascontiguousarray(np.stack([wave[i:i + 1024]] * 2)),
                                                   format="fltp", layout="stereo")
                chunk.sample_rate, chunk.pts = 48000, i
                out.mux(sound.encode(chunk))
            out.mux(sound.encode(None))
    return path


def read_pix_fmt(path: Path) -> str:
    with av.open(str(path)) as container:
        return container.streams.video[0].codec_context.pix_fmt


def png(path: Path, pixels: np.ndarray) -> Path:
    from PIL import Image

    Image.fromarray(pixels).save(path)
    return path


def read_png(path: Path) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(path)).astype(int)


def decoded_planes(path: Path) -> tuple:
    """(pixel format, the flat planes of every frame) of a video file."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        out = []
        for frame in container.decode(stream):
            layout = frames.Layout(frame.format.name, frame.height, frame.width)
            out.append(video.frame_to_host(frame, layout))
        return stream.codec_context.pix_fmt, out


# --------------------------------------------------------------------------------------------
# Originals untouched, 10-bit end to end.


@pytest.mark.parametrize("pix_fmt", ["yuv420p", "yuv420p10le"])
def test_original_frames_come_out_bit_exact_after_a_lossless_encode(tmp_path, weights, capsys, blend_network,
                                                                    pix_fmt):
    source = tmp_path / f"in_{pix_fmt}.mkv"
    planes = lossless_clip(source, pix_fmt)
    assert [np.array_equal(a, b) for a, b in zip(planes, decoded_planes(source)[1])] == [True] * 6
    out = tmp_path / "x2.mkv"
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", source, out, "--crf", "0", "--no-scene-detect"), capsys)
    assert rc == 0 and f"libx264 {pix_fmt} lossless" in stdout, stdout + err
    got_format, got = decoded_planes(out)
    assert got_format == pix_fmt and len(got) == 12
    for k in range(6):
        assert np.array_equal(got[2 * k], planes[k]), k  # every code of every original frame


def test_ten_bit_video_is_interpolated_without_an_eight_bit_step(tmp_path, weights, capsys, blend_network):
    source = tmp_path / "deep.mkv"
    planes = lossless_clip(source, "yuv420p10le", count=4)
    info = video.probe(source)
    layout = interpolate.open_source(source).layout
    assert info.deep and layout.format == "yuv420p10le" and layout.bits == 10  # the device converts it
    out = tmp_path / "x2.mkv"
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", source, out, "--crf", "0", "--no-scene-detect"), capsys)
    assert rc == 0, err
    _, got = decoded_planes(out)
    for k in range(3):
        # The new frame: the blend of its neighbours in float from their 10-bit codes, back to 10 bits.
        a, b = (frames.to_model(frames.host_tensor(planes[j]), layout) for j in (k, k + 1))
        expected = frames.host_array(frames.from_model((a + b) / 2, layout), layout).astype(int)
        new = got[2 * k + 1].astype(int)
        assert np.abs(new - expected).max() <= 1, k
        # 10-bit codes all the way: most are not multiples of 4 (an 8-bit step would make them all so).
        assert (new % 4 != 0).mean() > 0.5


def test_a_decoded_frame_goes_to_the_encoder_as_it_is_only_where_it_fits(tmp_path, weights, blend_network):
    source = tmp_path / "in.mp4"
    lossless_clip(source, "yuv420p", count=4)
    src = interpolate.open_source(source)
    written = []

    class Sink(video.VideoSink):
        def write(self, item):
            written.append(type(item[0]).__name__)
            super().write(item)

    model = engine.load_model(weights["EDSC_s"])
    for pix_fmt, decoded in (("yuv420p", "VideoFrame"), ("yuv444p", "HostFrame")):
        sink = Sink(tmp_path / f"{pix_fmt}.mkv", tmp_path / f"{pix_fmt}.mkv", 64, 48, Fraction(48), Fraction(1, 48),
                    info=src.info, pix_fmt=pix_fmt)
        written.clear()
        schedule = timing.Schedule(factor=2, start=src.times[0], tolerance=src.time_base / 2)
        interpolate.stream_frames(engine.Interpolator(model), src, sink, schedule, scene_threshold=None)
        # Input frames (and the last one's copy, which ends the video) as decoded where they fit; new frames
        # from the device.
        assert written[0::2] == [decoded] * 4 and written[1::2] == ["HostFrame"] * 3 + [decoded], written


# --------------------------------------------------------------------------------------------
# Several devices.


def test_device_lists_are_parsed_and_bad_ones_are_one_line(tmp_path, weights, capsys):
    assert interpolate.parse_devices("cpu,cpu") == [torch.device("cpu")] * 2
    assert interpolate.parse_devices(" cpu ") == [torch.device("cpu")]
    if not torch.cuda.is_available():
        for text in ("cuda:all", "cuda:0,cuda:1", "cuda"):
            with pytest.raises(common.UserError, match="no CUDA GPU"):
                interpolate.parse_devices(text)
    source = tmp_path / "in.mp4"
    lossless_clip(source, "yuv420p", count=3)
    for text, needle in (("cpu,tpu9", "tpu9"), ("cpu,cuda:0" if torch.cuda.is_available() else "cuda:all",
                                                 "cuda")):
        rc, _, err = run_cli(video_argv(weights, "EDSC_s", source, tmp_path / "o.mp4")[:-3] + ["--device", text],
                             capsys)
        assert_one_line_error(rc, err, "--device", needle)
    assert not (tmp_path / "o.mp4").exists()


def test_replicas_have_their_own_parameters_of_equal_values():
    model = EDSC_m().eval()
    first, second = interpolate.replicate(model, ["cpu", "cpu"])
    assert first is model and second is not model and second.multiple and not second.training
    pairs = list(zip(model.state_dict().values(), second.state_dict().values()))
    assert len(pairs) == len(model.state_dict()) and all(torch.equal(a, b) for a, b in pairs)
    assert not any(a.data_ptr() == b.data_ptr() for a, b in pairs)


def engines_used(monkeypatch):
    used = []
    original = engine.Interpolator.interpolate_bgr

    def recording(self, jobs):
        used.append((id(self), len(jobs)))
        return original(self, jobs)

    monkeypatch.setattr(engine.Interpolator, "interpolate_bgr", recording)
    return used


@pytest.mark.parametrize("name, extra", [("EDSC_s", ["--factor", "4"]), ("EDSC_m", ["--fps", "60", "--batch", "2"])])
def test_two_cpu_devices_give_the_output_of_one_bit_for_bit(tmp_path, weights, capsys, monkeypatch, name, extra):
    source = moving_clip(tmp_path / "cut.mp4", frames=8, w=32, h=32, cut_at=4)  # with audio and a scene cut
    used = engines_used(monkeypatch)
    outputs = {}
    for devices in ("cpu", "cpu,cpu"):
        out = tmp_path / f"{devices.replace(',', '_')}.mkv"
        argv = video_argv(weights, name, source, out, "--crf", "0", *extra)
        argv[argv.index("--device") + 1] = devices
        rc, stdout, err = run_cli(argv, capsys)
        assert rc == 0 and "1 scene cut(s)" in stdout and "copied audio" in stdout, err
        outputs[devices] = (stdout, out)
    one, two = (decoded_planes(outputs[d][1])[1] for d in ("cpu", "cpu,cpu"))
    assert len(one) == len(two) > 8 and all(np.array_equal(a, b) for a, b in zip(one, two))
    with av.open(str(outputs["cpu"][1])) as a, av.open(str(outputs["cpu,cpu"][1])) as b:
        audio = [[bytes(p) for p in c.demux(c.streams.audio[0]) if p.size] for c in (a, b)]
    assert audio[0] == audio[1] and audio[0]
    assert "on cpu, cpu" in outputs["cpu,cpu"][0]
    # The second run dealt its groups of pairs out to two engines in turn.
    second_run = used[len(used) // 2:]
    engines = list(dict.fromkeys(e for e, _ in second_run))
    assert len(engines) == 2 and [e for e, _ in second_run] == [engines[k % 2] for k in range(len(second_run))]


@requires_cuda
@pytest.mark.cuda
def test_one_gpu_listed_twice_gives_the_output_of_one(tmp_path, weights, capsys, monkeypatch):
    source = moving_clip(tmp_path / "cut.mp4", frames=8, w=96, h=64, cut_at=4)
    used = engines_used(monkeypatch)
    runs = {}
    for devices in ("cuda:0", "cuda:0,cuda:0"):
        out = tmp_path / f"{devices.replace(',', '_').replace(':', '')}/"
        argv = video_argv(weights, "EDSC_s", source, out)
        argv[argv.index("--device") + 1] = devices
        rc, stdout, err = run_cli(argv, capsys)
        assert rc == 0 and "network: graph fp16" in stdout, err
        runs[devices] = [read_png(p) for p in sorted(out.glob("*"))]
    one, two = runs["cuda:0"], runs["cuda:0,cuda:0"]
    assert len(one) == len(two) == 16
    assert all(np.abs(a - b).max() <= 1 for a, b in zip(one, two))  # the same network, its own graph
    assert all(np.array_equal(a, b) for a, b in zip(one[0::2], two[0::2]))
    second_run = used[len(used) // 2:]
    assert len({e for e, _ in second_run}) == 2


@requires_two_gpus
@pytest.mark.multi_gpu
def test_two_gpus_split_the_pairs_and_each_holds_what_one_holds(tmp_path, weights, capsys):
    source = moving_clip(tmp_path / "cut.mp4", frames=10, w=256, h=128, cut_at=5)
    runs, memory = {}, {}
    for devices in ("cuda:0", "cuda:0,cuda:1"):
        torch.cuda.empty_cache()
        for index in range(2):
            torch.cuda.reset_peak_memory_stats(index)
        out = tmp_path / f"{devices.replace(',', '_').replace(':', '')}/"
        argv = video_argv(weights, "EDSC_s", source, out)
        argv[argv.index("--device") + 1] = devices
        rc, stdout, err = run_cli(argv, capsys)
        assert rc == 0 and "1 scene cut(s)" in stdout, err
        runs[devices] = [read_png(p) for p in sorted(out.glob("*"))]
        memory[devices] = [torch.cuda.max_memory_allocated(index) for index in range(2)]
    assert all(np.abs(a - b).max() <= 1 for a, b in zip(runs["cuda:0"], runs["cuda:0,cuda:1"]))
    single = memory["cuda:0"][0]
    assert memory["cuda:0,cuda:1"][1] <= 1.25 * single and memory["cuda:0,cuda:1"][0] <= 1.25 * single


# --------------------------------------------------------------------------------------------
# The stage profile.


def test_stage_profile_merges_intervals_and_names_the_bound():
    profile = stages.StageProfile()
    profile.began = 0.0
    profile.ended = 10.0
    profile._add("decode", "", 0.0, 1.0, 5)
    profile._add("decode", "", 0.5, 2.0, 5)  # overlaps the first: 2 s busy in all
    profile._add("network", "cpu", 1.0, 9.0, 8)
    profile._add("encode", "", 1.5, 4.5, 16)
    profile._add("mux", "", 4.5, 5.0, 16)
    rows = {row.stage: row for row in profile.rows()}
    assert rows["decode"].seconds == pytest.approx(2.0) and rows["decode"].frames == 10
    assert rows["decode"].rate == pytest.approx(5.0) and rows["decode"].busy == pytest.approx(0.2)
    assert profile.bound().stage == "network"
    assert profile.overlap_with_network("decode") == pytest.approx(1.0 / 8)
    assert profile.overlap_with_network("encode") == pytest.approx(3.0 / 8)
    profile._add("encode", "", 5.0, 10.0, 16)  # encode and mux together busy 9 s of 10
    assert profile.bound().stage == "encode"
    summary = profile.summary()
    assert summary["bound"] == "encode" and [r["stage"] for r in summary["rows"]] == list(stages.STAGES)
    table = profile.table()
    assert "| network | 8.00 | 8 | 1.0 | 80% |" in table and "bound: encode" in table


def slow_stages(monkeypatch, network_s: float, mux_s: float):
    """The network replaced by a blend that takes ``network_s`` a call, each packet written ``mux_s`` late:
    stages of known lengths, which sleep (so they overlap on any machine, however loaded)."""

    def network(self, first, second, times):
        time.sleep(network_s)
        return ((first + second) / 2).clamp(0, 1)

    def mux(container, packet):
        time.sleep(mux_s)
        container.mux(packet)

    monkeypatch.setattr(engine.Interpolator, "_network", network)
    monkeypatch.setattr(video, "_mux", mux)


def test_decode_network_and_encode_overlap(tmp_path, weights, monkeypatch):
    source = moving_clip(tmp_path / "in.mp4", frames=20, w=64, h=48, audio=False)
    slow_stages(monkeypatch, network_s=0.04, mux_s=0.015)
    # x264 holds back about as many frames as it has frame threads: 24 on 16 cores would keep most of
    # these 40 until the flush, after the network. Two threads, as on a small machine.
    monkeypatch.setattr(interpolate, "encoder_threads", lambda cores: 2)
    model = engine.load_model(weights["EDSC_s"])
    result = interpolate.interpolate_video(model, source, tmp_path / "x2.mp4", quiet=True, show_progress=False,
                                           scene_threshold=None, preset="ultrafast")  # no lookahead to wait for
    profile = result.profile
    rows = {row.stage: row for row in profile.rows()}
    assert rows["network"].frames == 19 and rows["decode"].frames == 20 and rows["encode"].frames == 40
    assert rows["network"].seconds >= 19 * 0.04 and rows["mux"].seconds >= 40 * 0.015
    # The stages ran side by side: the packets were written while the network ran, decoding was done
    # ahead, and the whole run took far less than the stages one after another.
    assert profile.overlap_with_network("mux") > 0.4
    assert profile.waits["main thread for decoded frames"] < 0.25 * rows["network"].seconds
    busy = sum(row.seconds for row in rows.values())
    assert profile.wall < 0.85 * busy, (profile.wall, busy)
    assert profile.bound().stage == "network"
    assert "bound: network" in interpolate.speed_summary(result)
    startup = profile.summary()["startup_s"]
    assert set(startup) == {"network ready", "first frame read", "first frame to the encoder", "first packet written"}


def test_an_encoder_bound_run_says_so_with_the_preset_that_keeps_up(tmp_path, weights, capsys, monkeypatch):
    source = moving_clip(tmp_path / "in.mp4", frames=12, w=64, h=48, audio=False)
    slow_stages(monkeypatch, network_s=0.02, mux_s=0.03)
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_s", source, tmp_path / "x2.mp4", "--preset", "medium"), capsys)
    assert rc == 0, err
    advice = re.search(r"bound: encode, busy \d+%; libx264 at preset medium is the bound(: --preset (\w+) keeps up|, "
                       r"and --preset ultrafast would not keep up either)\)", stdout)
    assert advice and (advice[2] is None or interpolate.PRESET_SPEED[advice[2]] > 1), stdout


def test_profile_flags_print_the_table_and_write_json(tmp_path, weights, capsys, blend_network):
    source = tmp_path / "in.mp4"
    lossless_clip(source, "yuv420p", count=4)
    path = tmp_path / "profile.json"
    argv = video_argv(weights, "EDSC_s", source, tmp_path / "x2.mp4", "--profile", "--profile-json", path,
                      "--no-scene-detect")
    rc, stdout, err = run_cli(argv, capsys)
    assert rc == 0, err
    assert "| stage | time (s) | frames | frames/s | busy | CPU cores |" in err and "| decode |" in err
    data = json.loads(path.read_text())
    assert data["frames"] == 8 and data["interpolated"] == 3 and data["devices"] == ["cpu"]
    assert [row["stage"] for row in data["profile"]["rows"]] == list(stages.STAGES)
    assert data["profile"]["facts"]["encoder"] == "libx264"
    first, second = tmp_path / "a.png", tmp_path / "b.png"
    for p in (first, second):
        png(p, np.zeros((8, 8, 3), np.uint8))
    rc, _, err = run_cli(["--weights", weights["EDSC_s"], first, second, "-o", tmp_path / "m.png", "--profile"],
                         capsys)
    assert_one_line_error(rc, err, "--profile", "--video")


# --------------------------------------------------------------------------------------------
# The new user's defects.


def test_factor_one_and_the_inputs_own_rate_are_refused(tmp_path, weights, capsys):
    source = moving_clip(tmp_path / "in.mp4", frames=4, audio=False)
    out = tmp_path / "new" / "o.mp4"
    for extra, needles in ((["--factor", "1"], ["--factor 1", "no new frames"]),
                           (["--fps", "24"], ["--fps 24", "input's own frame rate"])):
        rc, _, err = run_cli(video_argv(weights, "EDSC_s", source, out, *extra), capsys)
        assert_one_line_error(rc, err, *needles)
        assert not out.parent.exists()
    folder = tmp_path / "frames"
    folder.mkdir()
    for k in range(3):
        png(folder / f"{k}.png", np.full((8, 8, 3), 40 * k, np.uint8))
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", folder, out, "--input-fps", "30", "--fps", "30"), capsys)
    assert_one_line_error(rc, err, "--fps 30", "input's own")
    model = engine.load_model(weights["EDSC_s"])
    with pytest.raises(common.UserError, match="--factor 1"):
        interpolate.interpolate_video(model, source, out, factor=1, quiet=True)


def test_fps_equal_to_a_variable_rate_inputs_average_is_a_retiming(tmp_path, weights, capsys, blend_network):
    source = moving_clip(tmp_path / "vfr.mkv", frames=8, times_ms=[0, 40, 100, 120, 200, 240, 320, 340], audio=False)
    info = video.probe(source)
    assert info.variable_rate
    rc, stdout, err = run_cli(video_argv(weights, "EDSC_m", source, tmp_path / "cfr.mkv", "--fps",
                                         str(info.rate)), capsys)
    assert rc == 0, err


def test_odd_sizes_say_which_pixel_format_and_why(tmp_path, weights, capsys, blend_network):
    source = moving_clip(tmp_path / "even.mp4", frames=3, w=50, h=30, audio=False)
    folder = tmp_path / "odd"
    folder.mkdir()
    for k in range(3):
        png(folder / f"{k}.png", np.full((31, 51, 3), 60 * k, np.uint8))
    argv = [a for a in video_argv(weights, "EDSC_s", folder, tmp_path / "o.mp4") if a != "--quiet"]
    rc, _, err = run_cli(argv, capsys)
    notes = [line for line in err.splitlines() if "cannot be encoded" in line]
    assert rc == 0 and len(notes) == 1, err
    assert "51x31" in notes[0] and "yuv420p" in notes[0] and "writing yuv444p" in notes[0]
    assert "even width and height" in notes[0] and "--pix-fmt" in notes[0]
    assert read_pix_fmt(tmp_path / "o.mp4") == "yuv444p"
    # Asked for: no note; a 4:2:0 one refused; an even size: no note.
    argv = [a for a in video_argv(weights, "EDSC_s", folder, tmp_path / "p.mkv", "--pix-fmt", "yuv444p10le")
            if a != "--quiet"]
    rc, _, err = run_cli(argv, capsys)
    assert rc == 0 and "cannot be encoded" not in err and read_pix_fmt(tmp_path / "p.mkv") == "yuv444p10le", err
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", folder, tmp_path / "q.mp4", "--pix-fmt", "yuv420p"), capsys)
    assert_one_line_error(rc, err, "51x31", "yuv420p")
    rc, _, err = run_cli([a for a in video_argv(weights, "EDSC_s", source, tmp_path / "r.mp4") if a != "--quiet"],
                         capsys)
    assert rc == 0 and "cannot be encoded" not in err


@pytest.mark.parametrize("how", ["interrupted", "disk full"])
@pytest.mark.parametrize("target", ["a/b/x2.mp4", "a/b/frames/"])
def test_a_failed_or_interrupted_run_removes_the_folders_it_made(tmp_path, weights, capsys, monkeypatch,
                                                                 blend_network, how, target):
    source = moving_clip(tmp_path / "in.mp4", frames=8, audio=False)
    (tmp_path / "keep").mkdir()
    writes = []

    def failing(self, item):
        writes.append(1)
        if len(writes) == 3:
            raise KeyboardInterrupt if how == "interrupted" else OSError(errno.ENOSPC, "No space left on device")
        return original(self, item)

    sink = video.VideoSink if target.endswith(".mp4") else video.FolderSink
    original = sink.write
    monkeypatch.setattr(sink, "write", failing)
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", source, tmp_path / target), capsys)
    assert rc == (130 if how == "interrupted" else 2), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.mp4", "keep"]
    # An existing folder stays, emptied of what the run wrote.
    writes.clear()
    rc, _, err = run_cli(video_argv(weights, "EDSC_s", source, tmp_path / "keep" / target), capsys)
    assert rc != 0 and sorted(p.name for p in tmp_path.iterdir()) == ["in.mp4", "keep"]
    assert not any((tmp_path / "keep").iterdir())


def test_pair_mode_removes_the_folder_it_made_when_the_write_fails(tmp_path, weights, capsys, monkeypatch):
    from edsc_ext.apps import images

    first, second = tmp_path / "a.png", tmp_path / "b.png"
    for p in (first, second):
        png(p, np.zeros((8, 8, 3), np.uint8))
    monkeypatch.setattr(images, "write_image", lambda path, image: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    rc, _, err = run_cli(["--weights", weights["EDSC_s"], first, second, "-o", tmp_path / "new" / "deep" / "m.png",
                          "--device", "cpu"], capsys)
    assert rc == 2 and not (tmp_path / "new").exists(), err


def test_both_commands_answer_version(capsys):
    import edsc_ext
    from edsc_ext import __main__ as edsc_main

    with pytest.raises(SystemExit) as done:
        edsc_main.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == (f"edsc_ext {edsc_ext.__version__} "
                                                                         f"(torch {torch.__version__})")
    rc = interpolate.main(["--version"])
    out = capsys.readouterr().out.strip()
    pyav = f"PyAV {av.__version__}"
    assert rc == 0 and out == f"edsc-interpolate {edsc_ext.__version__} (torch {torch.__version__}, {pyav})"
    for module in ("edsc_ext", "edsc_ext.apps.interpolate"):
        done = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True,
                              cwd=REPO, timeout=120)
        assert done.returncode == 0 and edsc_ext.__version__ in done.stdout, done.stderr


# --------------------------------------------------------------------------------------------
# Defaults, the test clip and the throughput script.


def test_defaults_on_cuda_are_half_precision_and_a_preset_that_keeps_up(tmp_path, weights, monkeypatch):
    """What a user gets without flags: float16 and veryfast where the network runs on CUDA (checked here
    through the engine's and the sink's arguments), float32 and the encoder's own preset on the CPU."""
    seen = {}
    original_sink = video.VideoSink.__init__

    def sink_init(self, *args, **kwargs):
        seen["default_preset"] = kwargs.get("default_preset")
        original_sink(self, *args, **kwargs)

    monkeypatch.setattr(video.VideoSink, "__init__", sink_init)
    source = moving_clip(tmp_path / "in.mp4", frames=3, audio=False)
    model = engine.load_model(weights["EDSC_s"])
    result = interpolate.interpolate_video(model, source, tmp_path / "x2.mp4", quiet=True, show_progress=False)
    assert seen["default_preset"] is None and result.preset is None and "eager fp32" in result.network
    engines = interpolate._engines(model, None, None, batch=1, tile=None, margin=64, half=None, compile=False,
                                   cuda_graph=None, quiet=True)
    assert engines[0].precision == "fp32"
    if torch.cuda.is_available():
        cuda_model = engine.load_model(weights["EDSC_s"], device="cuda")
        result = interpolate.interpolate_video(cuda_model, source, tmp_path / "c.mp4", quiet=True,
                                               show_progress=False)
        assert result.preset == video.FAST_PRESET and result.network.startswith("graph fp16")


def test_the_test_clip_is_deterministic_with_audio(tmp_path):
    outputs = []
    for name in ("a.mp4", "b.mp4"):
        done = subprocess.run([sys.executable, str(REPO / "tools" / "make_test_clip.py"), str(tmp_path / name),
                               "--size", "64x48", "--seconds", "1"], capture_output=True, text=True, cwd=REPO,
                              timeout=120, env=subprocess_env(REPO))
        assert done.returncode == 0 and "24 frames" in done.stdout, done.stderr
        outputs.append(decoded_planes(tmp_path / name)[1])
    assert [len(o) for o in outputs] == [24, 24]
    assert [k for k, (a, b) in enumerate(zip(*outputs)) if not np.array_equal(a, b)] == []
    assert not all(np.array_equal(outputs[0][0], f) for f in outputs[0][1:])  # it moves
    with av.open(str(tmp_path / "a.mp4")) as container:
        assert container.streams.audio[0].codec_context.name == "aac"
    info = video.probe(tmp_path / "a.mp4")
    assert info.end == 1 and info.copied == [(1, "audio", "aac")]
    deep = video_benchmark.make_clip(tmp_path / "deep.mkv", 32, 32, 3, pix_fmt="yuv420p10le")
    fmt, planes = decoded_planes(deep)
    assert fmt == "yuv420p10le" and (planes[0] % 4 != 0).mean() > 0.5


def test_the_blending_network_makes_the_mean_of_the_two_frames(gen):
    for multiple in (False, True):
        for sampling in ("compat", "clean"):
            model = video_benchmark.blending_network(multiple, sampling)
            first, second = torch.rand(2, 1, 3, 64, 96, generator=gen).unbind(0)
            with torch.no_grad():
                out = model(first, second, 0.3) if multiple else model(first, second)
            assert torch.allclose(out, (first + second) / 2, atol=1e-6), (multiple, sampling)


def test_the_throughput_script_makes_its_table(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "tools" / "video_throughput.py"), "--out", str(tmp_path),
                           "--device", "cpu", "--quick", "--configs", "medium", "--no-benchmark"],
                          capture_output=True, text=True, cwd=REPO, timeout=600,
                          env=subprocess_env(REPO))
    assert done.returncode == 0, done.stderr
    assert "| medium | `--preset medium` | 32x32 | 11 |" in done.stdout
    assert "Stage profile, medium" in done.stdout and "| network |" in done.stdout
    data = json.loads((tmp_path / "throughput.json").read_text())
    assert data["runs"][0]["interpolated"] == 11 and data["runs"][0]["startup_to_encoder_s"] > 0
    done = subprocess.run([sys.executable, str(REPO / "tools" / "video_throughput.py"), "--out", str(tmp_path),
                           "--multi-gpu", "--device", "cpu", "--pair", "cpu,cpu", "--quick", "--no-benchmark"],
                          capture_output=True, text=True, cwd=REPO, timeout=600,
                          env=subprocess_env(REPO))
    assert done.returncode == 0, done.stderr
    assert "cpu against cpu,cpu" in done.stdout and "speedup, two GPUs against one: " in done.stdout


def test_the_preset_table_times_every_preset_on_the_clip(tmp_path):
    """--presets: x264 at each preset on the clip's frames, medium's row the unit; the clip's rate read while
    its container is open (PyAV refuses it after)."""
    clip = video_benchmark.make_clip(tmp_path / "clip.mkv", 32, 32, 4)
    report = video_benchmark.preset_speeds(clip, repeat=1)
    assert report["frames"] == 4 and report["size"] == "32x32"
    assert [r["preset"] for r in report["rows"]] == list(video_benchmark.PRESETS_MEASURED)
    medium = next(r for r in report["rows"] if r["preset"] == "medium")
    assert medium["vs_medium"] == 1 and all(r["frames_per_s"] > 0 and r["bytes"] > 0 for r in report["rows"])
    assert "| medium |" in video_benchmark.format_presets(report)
