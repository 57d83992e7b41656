"""The op benchmark (edsc_ext.benchmarks.op): a CPU smoke run and the floor byte counting."""

from __future__ import annotations

import json

import pytest
import torch

import edsc_ext
from edsc_ext.benchmarks import op as benchmark
from edsc_ext.benchmarks.op import Case, floor_bytes, gather_traffic


def test_main_cpu_quick_writes_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    md = tmp_path / "bench.md"
    rc = benchmark.main(["--device", "cpu", "--quick", "--cases", "train", "--dtypes", "float32",
                         "--impls", "compat", "grid_sample", "--json", str(path), "--markdown", str(md),
                         "--no-progress"])
    assert rc == 0
    data = json.loads(path.read_text())
    rows = data["rows"]
    assert data["copy_bandwidth"]["gbps"] > 0
    # train x float32 x {fwd, fwd+bwd} x {floor, edsc_ext, compat, grid_sample}
    assert len(rows) == 8
    assert {(r["pass"], r["impl"]) for r in rows} == {
        (p, i) for p in ("fwd", "fwd+bwd") for i in ("floor", "edsc_ext", "compat", "grid_sample")}
    for r in rows:
        assert r["case"] == "train" and r["dtype"] == "float32" and r["status"] == "ok", r
        assert r["ms"] > 0 and r["floor_ms"] > 0 and r["floor_bytes"] > 0, r
        assert r["gbps"] > 0 and r["pct_floor"] > 0, r
        assert r["peak_extra_bytes"] is None  # n/a on the CPU
        if r["impl"] == "floor":
            assert r["pct_floor"] == 100.0
        else:
            assert r["speedup_vs_grid_sample"] > 0 and r["x_edsc_ext"] > 0
    fwd, bwd = (next(r for r in rows if r["pass"] == p and r["impl"] == "floor") for p in ("fwd", "fwd+bwd"))
    assert fwd["floor_bytes"] == floor_bytes(benchmark.CPU_CASES[0], torch.float32, backward=False)
    assert bwd["floor_bytes"] > fwd["floor_bytes"]
    assert fwd["gather_traffic"] == gather_traffic(benchmark.CPU_CASES[0], torch.float32, channels_last=False)
    assert "M sector requests" in fwd["note"] and "input-gradient additions" in bwd["note"]
    out = capsys.readouterr().out
    assert "| case |" in out and "**floor**" in out and "edsc-benchmark --device cpu" in out
    assert md.read_text() == out


def test_main_cpu_channels_last(tmp_path, capsys):
    path = tmp_path / "bench.json"
    rc = benchmark.main(["--device", "cpu", "--quick", "--cases", "adacof", "--dtypes", "float32", "--no-baseline",
                         "--channels-last", "--json", str(path), "--no-progress"])
    assert rc == 0
    data = json.loads(path.read_text())
    assert data["options"]["channels_last"] is True
    timed = [r for r in data["rows"] if r["impl"] == "edsc_ext"]
    assert len(timed) == 2 and all(r["status"] == "ok" and r["ms"] > 0 for r in timed)
    assert {r["memory_format"] for r in data["rows"]} == {"channels_last"}
    assert "**memory format: channels_last**" in capsys.readouterr().out


def test_many_channel_cases_run_channels_last(tmp_path, capsys):
    """The many-channel cases run in channels_last (their natural layout) and the others contiguous;
    the table marks the channels_last rows when a run mixes the two."""
    assert {c.name for c in benchmark.CASES if c.channels_last} == {"feat", "feat64"}
    assert {c.name for c in benchmark.CPU_CASES if c.channels_last} == {"feat", "feat64"}
    path = tmp_path / "bench.json"
    rc = benchmark.main(["--device", "cpu", "--quick", "--cases", "train", "feat", "--dtypes", "float32",
                         "--no-baseline", "--json", str(path), "--no-progress"])
    assert rc == 0
    rows = [r for r in json.loads(path.read_text())["rows"] if r["impl"] == "edsc_ext"]
    assert {(r["case"], r["memory_format"]) for r in rows} == {("train", "contiguous"), ("feat", "channels_last")}
    table = capsys.readouterr().out
    feat_shape = next(c.shape for c in benchmark.CPU_CASES if c.name == "feat")
    assert f"| feat | {feat_shape}, channels_last |" in table and "| train | 2x3x64x64 |" in table


def test_main_under_a_kernel_policy(tmp_path, capsys, monkeypatch):
    """--policy runs the timing under edsc_ext.kernel_policy(...) and restores the policy after."""
    seen = []
    real_run = benchmark.run

    def spy(*args, **kwargs):
        seen.append(edsc_ext.current_kernel_policy())
        return real_run(*args, **kwargs)

    monkeypatch.setattr(benchmark, "run", spy)
    path = tmp_path / "bench.json"
    before = edsc_ext.current_kernel_policy()
    rc = benchmark.main(["--device", "cpu", "--quick", "--cases", "sepconv", "--dtypes", "float32", "--no-baseline",
                         "--policy", "grid_taps=false", "cpu_scratch_mb=16", "--json", str(path), "--no-progress"])
    assert rc == 0
    assert [(p.grid_taps, p.cpu_scratch_mb) for p in seen] == [(False, 16)]
    assert edsc_ext.current_kernel_policy() == before
    assert json.loads(path.read_text())["options"]["policy"] == {"grid_taps": False, "cpu_scratch_mb": 16}
    assert "**kernel policy: grid_taps=False, cpu_scratch_mb=16**" in capsys.readouterr().out


@pytest.mark.parametrize("item, message", [("vector_loads", "expected KEY=VALUE"), ("speed=fast", "expected KEY=VALUE"),
                                           ("vector_loads=maybe", "takes true or false"),
                                           ("cpu_scratch_mb=-1", "integer >= 0"), ("cpu_isa=avx9", "cpu_isa must be")])
def test_main_rejects_a_bad_policy(capsys, item, message):
    with pytest.raises(SystemExit) as exc:
        benchmark.main(["--device", "cpu", "--policy", item])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_policy_ab_tool_on_the_cpu(tmp_path, monkeypatch, capsys):
    """tools/policy_ab.py (the kernel A/B of device sessions) times both policies in one process, names
    each one's plans and checks that their results agree; here on the CPU, the baseline loops against
    the default ones."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "tools" / "policy_ab.py"
    spec = importlib.util.spec_from_file_location("policy_ab", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = tmp_path / "ab.json"
    before = edsc_ext.current_kernel_policy()
    monkeypatch.setattr(sys, "argv", ["policy_ab.py", "--device", "cpu", "--cases", "train", "--dtypes", "float32",
                                      "--rounds", "2", "--reps", "1", "--a", "cpu_isa=baseline", "--json", str(out)])
    assert tool.main() == 0
    assert edsc_ext.current_kernel_policy() == before
    rows = json.loads(out.read_text())["rows"]
    assert [(r["case"], r["pass"]) for r in rows] == [("train", "fwd"), ("train", "fwd+bwd")]
    isa = edsc_ext._plan(torch.zeros(1, 1, 1, 1), kernel_size=1).forward.split("/")[1]  # this CPU's default
    for row in rows:
        assert row["plan_a"].endswith("/baseline") and row["plan_b"].endswith("/" + isa), row
        assert len(row["rounds_a_ms"]) == len(row["rounds_b_ms"]) == 2
        assert row["a_ms"] > 0 and row["b_ms"] > 0 and row["a_x_floor"] > 1
        assert row["max_rel_diff"] < 1e-5  # FMA rounds once: the last bits differ
    assert "train float32 fwd+bwd: A " in capsys.readouterr().out


def test_floor_bytes_by_hand():
    # EDSC-style: N=1, C=2, 4x5 output, K=3, padding 1 -> input 4x5 as well.
    case = Case("t", n=1, c=2, h=4, w=5, k=3, padding=1)
    assert (case.h_in, case.w_in) == (4, 5)
    inp = 1 * 2 * 4 * 5          # 40
    out = 1 * 2 * 4 * 5          # 40
    vert = horiz = 1 * 3 * 20    # 60 each
    offset = 1 * 2 * 9 * 20      # 360
    mask = 1 * 9 * 20            # 180
    assert case.tensor_numels() == {"input": inp, "vertical": vert, "horizontal": horiz, "offset": offset,
                                    "mask": mask, "output": out}
    per_pixel = vert + horiz + offset + mask  # 660
    assert per_pixel == 660
    # forward: read input + per-pixel, write output = 740 elements
    assert floor_bytes(case, torch.float32, backward=False) == 740 * 4 == 2960
    # fwd+bwd: forward (740) + backward reads grad_out (40), input (40), per-pixel (660)
    # + writes grad_input (40) and the per-pixel gradients (660) = 2180 elements
    assert floor_bytes(case, torch.float32, backward=True) == (740 + 40 + 40 + 660 + 40 + 660) * 4 == 8720
    assert floor_bytes(case, torch.bfloat16, backward=True) == 2180 * 2

    # sepconv-style (no offset, no mask): per-pixel = V + H = 120 elements.
    sep = Case("s", n=1, c=2, h=4, w=5, k=3, padding=1, deformable=False)
    assert floor_bytes(sep, torch.float16, backward=False) == (40 + 120 + 40) * 2 == 400
    assert floor_bytes(sep, torch.float16, backward=True) == (3 * 40 + 3 * 120 + 2 * 40) * 2 == 1120

    # AdaCoF-style (offset + mask, dilation 2, padding 2): input 4 + 4 - 2*2 = 4 rows, per-pixel 540.
    ada = Case("a", n=1, c=2, h=4, w=5, k=3, padding=2, dilation=2, padding_mode="zeros", separable=False)
    assert (ada.h_in, ada.w_in) == (4, 5)
    assert floor_bytes(ada, torch.float32, backward=False) == (40 + 540 + 40) * 4 == 2480


def _sectors_touched(rows_start_bytes, span):
    """Exact 32-byte sectors that spans of `span` bytes starting at each address touch."""
    first = rows_start_bytes // 32
    return ((rows_start_bytes + span - 1) // 32 - first + 1).sum().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_gather_traffic_matches_an_exact_count_of_random_taps(dtype, channels_last):
    # Counts, for random fractional taps away from the border, the sectors each sample's two rows
    # touch at their real byte addresses, and holds the model's expectation against that count.
    case = Case("g", n=2, c=3, h=40, w=52, k=3, padding=1, channels_last=channels_last)
    e = torch.empty((), dtype=dtype).element_size()
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    samples = case.n * case.k * case.k * case.h * case.w
    y = torch.randint(2, case.h_in - 3, (samples,), generator=gen)
    x = torch.randint(2, case.w_in - 3, (samples,), generator=gen)
    n = torch.randint(0, case.n, (samples,), generator=gen)
    rows = torch.cat([y, y + 1])
    cols, batch = torch.cat([x, x]), torch.cat([n, n])
    if channels_last:  # a row's two pixels with all their channels: one span of 2*C*e bytes
        start = ((batch * case.h_in + rows) * case.w_in + cols) * case.c * e
        exact = _sectors_touched(start, 2 * case.c * e)
    else:  # a span of 2*e per channel plane
        exact = 0
        for c in range(case.c):
            start = (((batch * case.c + c) * case.h_in + rows) * case.w_in + cols) * e
            exact += _sectors_touched(start, 2 * e)
    model = gather_traffic(case, dtype)
    assert model["samples"] == samples
    assert model["l1_sectors"] == pytest.approx(exact, rel=0.03)
    assert model["l1_sectors_backward"] == 2 * model["l1_sectors"]
    assert model["atomics"] == 4 * case.c * samples


def test_gather_traffic_by_hand():
    one = Case("1", n=1, c=3, h=1, w=1, k=1, padding=0)
    assert gather_traffic(one, torch.float32)["l1_sectors"] == pytest.approx(2 * 3 * (1 + 4 / 32))  # 6.75
    assert gather_traffic(one, torch.float32, channels_last=True)["l1_sectors"] == pytest.approx(2 * (1 + 5 * 4 / 32))
    assert gather_traffic(one, torch.bfloat16)["l1_sectors"] == pytest.approx(2 * 3 * (1 + 2 / 32))


def test_case_geometry_matches_the_op():
    # H_in = H_out for every listed case, and the op accepts the inputs each case makes.
    for case in benchmark.CASES:
        assert (case.h_in, case.w_in) == (case.h, case.w), case
    for case in benchmark.CPU_CASES:
        tiny = case.tiny()
        out = benchmark.edsc_ext.deform_sepconv(*tiny.make_inputs(torch.float32, "cpu", 0), **tiny.kwargs())
        assert tuple(out.shape) == (tiny.n, tiny.c, tiny.h, tiny.w)


def test_peers_are_checked_and_skipped_where_they_do_not_apply(monkeypatch):
    cases = [c for c in benchmark.CPU_CASES if c.name in ("train", "adacof")]
    checked = []
    real_check = benchmark.check_peer

    def spy(case, device, impl="grid_sample", seed=0):
        checked.append((case.name, impl))
        return real_check(case, device, impl, seed)

    monkeypatch.setattr(benchmark, "check_peer", spy)
    rows = benchmark.run("cpu", dtypes=["float32"], cases=[c.tiny() for c in cases], warmup=0, reps=1,
                         progress=False, impls=["edsc_ext", "compat", "deform_conv2d"])
    tv = benchmark._torchvision_ops() is not None
    # compat: EDSC's geometry only (adacof has no separable kernels); deform_conv2d when torchvision is there.
    assert checked == [("train", "compat")] + ([("train", "deform_conv2d"), ("adacof", "deform_conv2d")] if tv else [])
    by = {(r["case"], r["pass"], r["impl"]): r for r in rows}
    assert by[("adacof", "fwd", "compat")]["status"] == "n/a"
    assert by[("train", "fwd+bwd", "compat")]["status"] == "ok"
    status = by[("train", "fwd", "deform_conv2d")]["status"]
    assert status == ("ok" if tv else "n/a"), status


@pytest.mark.parametrize("impl", ["edsc_ext", "compat"])
def test_peer_inputs_keep_the_memory_format(impl):
    """Under --channels-last a peer's prepared inputs (EDSC's two offset tensors included) are
    channels_last too, so the timed call makes no layout copies."""
    case = next(c for c in benchmark.CPU_CASES if c.name == "train").tiny()
    gen = torch.Generator().manual_seed(0)
    per_pixel = [case.k, case.k, 2 * case.k * case.k, case.k * case.k]
    shapes = [(case.n, case.c, case.h_in, case.w_in)] + [(case.n, k, case.h, case.w) for k in per_pixel]
    tensors = [torch.randn(s, generator=gen).contiguous(memory_format=torch.channels_last) for s in shapes]
    _, inputs = benchmark._impl_call(impl, case, tensors)
    for t in inputs:
        assert t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous(), (impl, t.shape, t.stride())


def test_peer_check_catches_a_wrong_peer(monkeypatch):
    case = benchmark.CPU_CASES[0]
    real = benchmark._impl_call

    def off_by_a_little(impl, case, tensors):
        fn, inputs = real(impl, case, tensors)
        return (lambda *ts: fn(*ts) * 1.001), inputs

    monkeypatch.setattr(benchmark, "_impl_call", off_by_a_little)
    with pytest.raises(AssertionError, match="compat's output differs"):
        benchmark.check_peer(case, "cpu", "compat")


def test_model_flag_runs_the_model_benchmark(monkeypatch):
    from edsc_ext.benchmarks import networks

    seen = []
    monkeypatch.setattr(networks, "main", lambda argv=None: seen.append(argv) or 0)
    assert benchmark.main(["--model", "--device", "cpu", "--quick"]) == 0
    assert seen == [["--device", "cpu", "--quick"]]


def test_video_flag_runs_the_video_benchmark(monkeypatch):
    from edsc_ext.benchmarks import video

    seen = []
    monkeypatch.setattr(video, "main", lambda argv=None: seen.append(argv) or 0)
    assert benchmark.main(["--video", "--device", "cpu"]) == 0
    assert seen == [["--device", "cpu"]]


def _load_tool(name):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_roofline_tool_reads_ncu_csv_and_names_the_bound():
    """tools/roofline.py (run on the GPU under ncu) turns ncu's raw CSV into per-kernel rows and names
    the most utilised unit; here on a CSV of ncu's layout (header, units, one row per kernel)."""
    tool = _load_tool("roofline")
    header = ["ID", "Kernel Name", "gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
              "lts__throughput.avg.pct_of_peak_sustained_elapsed",
              "l1tex__throughput.avg.pct_of_peak_sustained_active", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
              "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"]
    units = ["", "", "usecond", "%", "%", "%", "%", "", ""]
    rows = [["0", "void edsc_ext::deform_sepconv_forward_kernel<float, int>(Params)", "246.5", "30.1", "41.0",
             "87.5", "60.2", "1,000", "4,500"],
            ["1", "void at::native::vectorized_elementwise_kernel<4>(int)", "12", "80.0", "50.0", "20.0", "10.0",
             "10", "40"]]
    text = "==PROF== Connected\n" + "\n".join(",".join(f'"{v}"' for v in r) for r in [header, units, *rows])
    kernels = tool.parse_raw_csv(text)
    assert [tool.short_kernel_name(k["kernel"]) for k in kernels] == ["deform_sepconv_forward_kernel",
                                                                     "vectorized_elementwise_kernel"]
    assert kernels[0]["time"] == pytest.approx(0.2465) and kernels[0]["ld_sectors"] == 4500
    assert [tool.name_bound(k) for k in kernels] == [("L1/TEX", 87.5), ("DRAM", 80.0)]
    errors = ["==ERROR== Failed to find metric lts__t_sectors_op_red.sum"]
    assert tool.unknown_metrics(errors, list(tool.METRICS)) == ["lts__t_sectors_op_red.sum"]


def test_benchmark_ab_times_two_builds_in_alternating_processes(tmp_path):
    """tools/benchmark_ab.py: each build's rows from its own processes, before and after alternating; each
    row's best median per build and after / before, in a table and in JSON; a run that fails is named and
    makes the exit code 1."""
    import math
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    script = repo / "tools" / "benchmark_ab.py"
    common = ["--device", "cpu", "--quick", "--no-baseline", "--cases", "train", "--dtypes", "float32"]
    done = subprocess.run([sys.executable, str(script), f"old={repo}", f"new={repo}", "--rounds", "2", "--out",
                           str(tmp_path), "--", *common], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.glob("*-*.json")) == ["new-1.json", "new-2.json", "old-1.json",
                                                                 "old-2.json"]
    result = json.loads((tmp_path / "ab.json").read_text())
    assert result["labels"] == ["old", "new"]
    assert [(r["case"], r["dtype"], r["pass"]) for r in result["rows"]] == [("train", "float32", "fwd"),
                                                                          ("train", "float32", "fwd+bwd")]
    for r in result["rows"]:
        assert all(len(r["runs_ms"][label]) == 2 for label in ("old", "new"))
        assert r["best_ms"] == {label: min(r["runs_ms"][label]) for label in ("old", "new")}
        assert math.isclose(r["ratio"], r["best_ms"]["new"] / r["best_ms"]["old"])
    assert result["summary"]["rows"] == 2
    assert "| case | format | dtype | pass | old ms | new ms | new / old |" in done.stdout
    assert "2 rows; new / old: min " in done.stdout
    failed = subprocess.run([sys.executable, str(script), f"old={repo}", f"new={repo}", "--rounds", "1", "--out",
                             str(tmp_path / "bad"), "--", *common[:-4], "--cases", "no_such_case"],
                            capture_output=True, text=True, timeout=600)
    assert failed.returncode == 1 and "round 1 old: exit code" in failed.stderr and "0 rows" in failed.stdout
