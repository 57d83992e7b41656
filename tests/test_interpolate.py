"""Image IO (the dependency-free PNG codec), the edsc-interpolate command (pair and video-folder
modes) and the Middlebury evaluation."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
import torch

from conftest import needs_shared_data, shared_data_path
from edsc_ext import _image, evaluate, interpolate
from edsc_ext.models import EDSC_m, EDSC_s, save_checkpoint

MIDDLEBURY = shared_data_path("middlebury")
needs_middlebury = needs_shared_data("middlebury")


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    folder = tmp_path_factory.mktemp("weights")
    torch.manual_seed(0)
    paths = {}
    for name, model in (("EDSC_s", EDSC_s()), ("EDSC_m", EDSC_m())):
        paths[name] = folder / f"{name}.pth"
        save_checkpoint(model, paths[name])
    return paths


def random_image(gen, h, w, c=3):
    return torch.randint(0, 256, (h, w, c), generator=gen, dtype=torch.uint8)


# --------------------------------------------------------------------------------------------
# PNG codec


def encode_png(pixels: torch.Tensor, kinds, color: int, extra: tuple = ()) -> bytes:
    """A PNG with the given filter type per row (the encoder side of all five filters)."""
    h, w, c = pixels.shape
    x = pixels.to(torch.int32).reshape(h, w * c)
    zero_col = torch.zeros(h, c, dtype=torch.int32)
    a = torch.cat([zero_col, x[:, :-c]], 1)  # left
    b = torch.cat([torch.zeros(1, w * c, dtype=torch.int32), x[:-1]], 0)  # up
    cc = torch.cat([torch.zeros(1, w * c, dtype=torch.int32), a[:-1]], 0)  # up-left
    p = a + b - cc
    pa, pb, pc = (p - a).abs(), (p - b).abs(), (p - cc).abs()
    paeth = torch.where((pa <= pb) & (pa <= pc), a, torch.where(pb <= pc, b, cc))
    preds = [torch.zeros_like(x), a, b, (a + b) // 2, paeth]
    rows = [bytes([k]) + bytes(((x[r] - preds[k][r]) % 256).to(torch.uint8).tolist()) for r, k in enumerate(kinds)]

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    chunks = b"".join(chunk(kind, body) for kind, body in zip(extra[::2], extra[1::2]))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0)) + chunks
            + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b""))


@pytest.mark.parametrize("shape", [(7, 13, 3), (1, 9, 4), (11, 1, 1), (5, 6, 2)])
def test_png_round_trip(tmp_path, gen, shape):
    pixels = random_image(gen, *shape)
    path = tmp_path / "x.png"
    _image.write_png(path, pixels)
    assert torch.equal(_image.read_png(path), pixels)


@pytest.mark.parametrize("color, channels", [(2, 3), (6, 4), (0, 1), (4, 2)])
def test_png_decodes_every_filter_type(gen, color, channels):
    pixels = random_image(gen, 12, 17, channels)
    # Smooth content too, where Paeth/Average predictions differ from their neighbours' values.
    pixels[6:] = torch.linspace(0, 255, 17).to(torch.uint8).view(1, 17, 1).expand(6, 17, channels)
    kinds = [r % 5 for r in range(12)]
    assert torch.equal(_image.read_png(encode_png(pixels, kinds, color)), pixels)


def test_png_palette(gen):
    table = random_image(gen, 1, 7, 3)[0]  # 7 RGB colours
    index = torch.randint(0, 7, (5, 9, 1), generator=gen, dtype=torch.uint8)
    data = encode_png(index, [4, 3, 1, 2, 0], 3, extra=(b"PLTE", bytes(table.flatten().tolist())))
    assert torch.equal(_image.read_png(data), table[index[..., 0].long()])
    alpha = bytes([0, 128])  # the first two colours are (semi-)transparent
    data = encode_png(index, [4] * 5, 3, extra=(b"PLTE", bytes(table.flatten().tolist()), b"tRNS", alpha))
    rgba = _image.read_png(data)
    assert rgba.shape == (5, 9, 4) and torch.equal(rgba[..., :3], table[index[..., 0].long()])
    assert torch.equal(rgba[..., 3], torch.tensor([0, 128, 255, 255, 255, 255, 255], dtype=torch.uint8)[index[..., 0].long()])


def test_png_errors(tmp_path):
    with pytest.raises(ValueError, match="signature"):
        _image.read_png(b"not a png at all")
    with pytest.raises(ValueError, match="uint8"):
        _image.write_png(tmp_path / "x.png", torch.zeros(4, 4, 3))


@needs_middlebury
def test_reads_middlebury_frames():
    path = MIDDLEBURY / "Venus" / "frame10.png"
    pixels = _image.read_png(path)
    assert pixels.shape == (380, 420, 3) and pixels.dtype == torch.uint8
    # Re-encoding with every row's filter type changed gives the same pixels back.
    again = _image.read_png(encode_png(pixels[:40], [(r * 3) % 5 for r in range(40)], 2))
    assert torch.equal(again, pixels[:40])
    image = _image.read_image(path)
    assert image.shape == (3, 380, 420) and 0 <= image.min() < image.max() <= 1


# --------------------------------------------------------------------------------------------
# edsc-interpolate


def write_pair(folder: Path, gen, h=37, w=50):
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(2):
        paths.append(folder / f"f{k}.png")
        _image.write_png(paths[-1], random_image(gen, h, w))
    return paths


def test_cli_pair_writes_an_image_of_the_right_size(tmp_path, gen, weights, capsys):
    first, second = write_pair(tmp_path / "in", gen)
    out = tmp_path / "out" / "middle.png"
    rc = interpolate.main(["--model", "EDSC_s", "--weights", str(weights["EDSC_s"]), str(first), str(second),
                           "-o", str(out), "--device", "cpu"])
    assert rc == 0, capsys.readouterr().err
    assert _image.read_png(out).shape == (37, 50, 3)
    # EDSC_m at another time; the variant is read off the weights when --model is left out.
    out_m = tmp_path / "quarter.png"
    assert interpolate.main(["--weights", str(weights["EDSC_m"]), "--time", "0.25", str(first), str(second),
                             "-o", str(out_m), "--device", "cpu"]) == 0
    assert _image.read_png(out_m).shape == (37, 50, 3)
    # Errors are reported, not raised.
    assert interpolate.main(["--weights", str(weights["EDSC_s"]), "--time", "0.25", str(first), str(second),
                             "-o", str(out_m)]) == 1
    assert interpolate.main(["--model", "EDSC_m", "--weights", str(weights["EDSC_s"]), str(first), str(second),
                             "-o", str(out_m)]) == 1
    assert "EDSC_s" in capsys.readouterr().err


def test_cli_module_entry_point_help():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "edsc_ext.interpolate", "--help"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and "--video" in result.stdout


@pytest.mark.parametrize("name, factor, expected", [("EDSC_s", 2, 5), ("EDSC_s", 4, 9), ("EDSC_m", 3, 7)])
def test_cli_video_folder_multiplies_the_frame_rate(tmp_path, gen, weights, name, factor, expected):
    frames = tmp_path / "frames"
    frames.mkdir()
    originals = [random_image(gen, 20, 24) for _ in range(3)]
    for k, pixels in enumerate(originals):
        _image.write_png(frames / f"{k:03d}.png", pixels)
    out = tmp_path / "out"
    rc = interpolate.main(["--weights", str(weights[name]), "--video", str(frames), "-o", str(out),
                           "--factor", str(factor), "--device", "cpu", "--quiet"])
    assert rc == 0
    written = sorted(out.glob("*.png"))
    assert len(written) == expected
    # The input frames are kept, in place, at every factor-th position.
    for k, pixels in enumerate(originals):
        assert torch.equal(_image.read_png(written[k * factor]), pixels)
    assert all(_image.read_png(p).shape == (20, 24, 3) for p in written)


def test_cli_video_rejects_non_power_of_two_for_edsc_s(tmp_path, gen, weights):
    frames = tmp_path / "frames"
    write_pair(frames, gen, 8, 8)
    assert interpolate.main(["--weights", str(weights["EDSC_s"]), "--video", str(frames), "-o",
                             str(tmp_path / "o"), "--factor", "3", "--quiet"]) == 1


# --------------------------------------------------------------------------------------------
# Evaluation


def test_metrics(gen):
    a = torch.rand(3, 24, 24, generator=gen, dtype=torch.float64)
    assert evaluate.ssim(a, a) == pytest.approx(1.0)
    assert evaluate.psnr(a, a) == float("inf")
    b = (a + 0.1).clamp(0, 1)
    assert evaluate.psnr(a, a + 0.1) == pytest.approx(20.0)
    assert abs(evaluate.ssim(a, torch.rand(3, 24, 24, generator=gen, dtype=torch.float64))) < 0.2 < evaluate.ssim(a, b) < 1


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
