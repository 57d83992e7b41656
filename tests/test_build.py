"""The build and distribution machinery: build facts, the import-time explanation of a mismatched
binary, the architecture tables, the sdist, the wheel configuration, and (marked ``build``, run
when EDSC_EXT_BUILD_TESTS=1, as .ci/run does) the JIT build.

The wheel itself (pip wheel, auditwheel, a fresh venv) and the CMake build + ctest are checked by
.ci/run's stages, which reuse the CI's build folders; see there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import time

import pytest
import torch

import edsc_ext
from edsc_ext import _build_support as bs
from edsc_ext import _loader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.dirname(os.path.abspath(edsc_ext.__file__))
CIBW_SH = os.path.join(REPO, "tools", "wheels", "cibw.sh")

run_build_tests = pytest.mark.skipif(os.environ.get("EDSC_EXT_BUILD_TESTS") != "1",
                                     reason="slow build test: set EDSC_EXT_BUILD_TESTS=1 (.ci/run does)")


# --------------------------------------------------------------------------- build facts

def test_build_info_facts():
    info = edsc_ext.build_info()
    for key in ("version", "build", "torch_version", "with_cuda", "cuda_version", "cuda_sass_archs",
                "cuda_ptx_archs"):
        assert key in info, key
    assert info["build"] in ("setuptools", "jit")
    assert bs.major_minor(info["torch_version"]) == bs.major_minor(torch.__version__)
    assert info["version"] == edsc_ext.__version__
    assert isinstance(info["cuda_sass_archs"], list) and isinstance(info["cuda_ptx_archs"], list)
    if info["with_cuda"]:
        assert info["cuda_sass_archs"], "a CUDA build records its architectures"
        assert int(info["cuda_version"].split(".")[0]) == int(torch.version.cuda.split(".")[0])
    else:
        assert info["cuda_sass_archs"] == [] and info["cuda_ptx_archs"] == []


def test_build_meta_matches_binary():
    """setup.py's _build_meta.py (read before loading) says what the binary says."""
    meta = _loader.read_build_meta()
    if meta is None or edsc_ext.build_info()["build"] != "setuptools":
        pytest.skip("not a setuptools build with _build_meta.py")
    binary = edsc_ext._C.build_info()
    assert meta["torch_version"].split("+")[0] == binary["torch_version"]
    assert meta["with_cuda"] == binary["with_cuda"]
    if meta["with_cuda"]:
        assert bs.ARCH_SEPARATOR.join(meta["cuda_sass_archs"]) == binary["cuda_sass_archs"]
        assert meta["cuda_version"] == binary["cuda_version"]


def test_version_label():
    assert bs.local_version_label("2.14.1+cu130", "13.0") == "cu130torch2.14"
    assert bs.local_version_label("2.13.0+cpu", None) == "cputorch2.13"
    assert bs.local_version_label("2.9.1", "12.6") == "cu126torch2.9"
    assert bs.torch_requirement("2.14.1+cu130") == "torch==2.14.*"
    meta = _loader.read_build_meta()
    if meta and meta.get("build") == "setuptools":
        label = edsc_ext.__version__.partition("+")[2]
        expected = bs.local_version_label(meta["torch_version"], meta["torch_cuda_version"] if meta["with_cuda"]
                                          else None)
        assert label in ("", expected)


# --------------------------------------------------------------------------- architectures

@pytest.mark.parametrize("cuda", ["12.6", "12.8", "13.0", "13.2"])
def test_wheel_arch_table_matches_setup(cuda):
    """tools/wheels/cibw.sh (the wheels) and default_arch_list (source builds) agree."""
    if not shutil.which("bash") or not os.path.exists(CIBW_SH):
        pytest.skip("needs bash and the checkout's tools/wheels/cibw.sh")
    out = subprocess.run(["bash", CIBW_SH, "arch-list"], env={**os.environ, "EDSC_EXT_CUDA_VERSION": cuda},
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == bs.default_arch_list(cuda)
    sass, ptx = bs.encode_arch_list(out)
    assert "90" in sass and len(ptx) == 1 and ptx[0] == sass[-1], "SASS for Hopper, PTX for the newest only"
    assert sass == sorted(sass, key=int)


def test_arch_runs_on():
    sass, ptx = ["75", "80", "86", "90"], ["90"]
    assert bs.arch_runs_on(sass, ptx, (9, 0))
    assert bs.arch_runs_on(sass, ptx, (8, 9))  # sm_86 machine code runs on 8.9
    assert bs.arch_runs_on(sass, ptx, (12, 0))  # PTX 9.0 is compiled by the driver
    assert not bs.arch_runs_on(["80", "90"], [], (12, 0))
    assert not bs.arch_runs_on(["80"], [], (7, 5))
    assert not bs.arch_runs_on(["90a"], [], (10, 0)) and bs.arch_runs_on(["90a"], [], (9, 0))
    assert bs.arch_list_for_devices([(9, 0), (8, 0), (9, 0)]) == "8.0;9.0+PTX"
    with pytest.raises(ValueError, match="TORCH_CUDA_ARCH_LIST"):
        bs.encode_arch_list("sm90")


# --------------------------------------------------------------------------- the import-time explanation

def test_mismatch_rules():
    assert _loader.mismatch("2.14.1", "13.0", True, "2.14.0+cu130", "13.0") is None
    assert _loader.mismatch("2.14.1", "12.6", True, "2.14.1+cu128", "12.8") is None  # same CUDA major
    assert _loader.mismatch("2.14.1", None, False, "2.14.1+cu130", "13.0") is None  # CPU build, any CUDA
    assert "torch 2.14 vs 2.13" in _loader.mismatch("2.14.1", "13.0", True, "2.13.0", "13.0")
    assert "CUDA 12.6 vs 13.0" in _loader.mismatch("2.14.1", "12.6", True, "2.14.1+cu130", "13.0")
    assert "no CUDA" in _loader.mismatch("2.14.1", "13.0", True, "2.14.1+cpu", "")


def test_explanation_says_what_and_how():
    meta = {"version": "0.1.0+cu126torch2.9", "build": "setuptools", "torch_version": "2.9.1+cu126",
            "torch_cuda_version": "12.6", "with_cuda": True, "cuda_version": "12.6",
            "cuda_sass_archs": ["75", "90"], "wheel_index": "https://example.org/whl"}
    text = _loader.explain("it was built for another torch (torch 2.9 vs 2.14)", meta,
                           cause=ImportError("undefined symbol: _ZN3c104impl3cow11cow_deleterEPv"))
    wanted = bs.local_version_label(torch.__version__, torch.version.cuda)
    assert "built for: torch 2.9.1+cu126 (CUDA 12.6)" in text
    assert f"installed: torch {torch.__version__}" in text
    assert f'pip install --force-reinstall --no-deps "edsc-ext==0.1.0" -f https://example.org/whl/{wanted}.html' in text
    assert 'pip install "torch==2.9.*" --index-url https://download.pytorch.org/whl/cu126' in text
    assert "pip install --no-build-isolation" in text and "EDSC_EXT_JIT=1" in text
    assert "Underlying error: ImportError: undefined symbol: _ZN3c104impl3cow11cow_deleterEPv" in text


def _package_copy(tmp_path, meta=None, binary_bytes=None):
    """A copy of the Python package (no compiled extension) under tmp_path/pkgs, optionally with a
    _build_meta.py and a fake binary."""
    dest = tmp_path / "pkgs" / "edsc_ext"
    shutil.copytree(PACKAGE, dest, ignore=shutil.ignore_patterns("*.so", "_build_meta.py", "__pycache__", "_csrc"))
    if meta is not None:
        (dest / "_build_meta.py").write_text(bs.build_meta_source(meta))
    if binary_bytes is not None:
        import sysconfig
        (dest / ("_C" + sysconfig.get_config_var("EXT_SUFFIX"))).write_bytes(binary_bytes)
    return str(tmp_path / "pkgs")


def _import_in_subprocess(pythonpath, **env):
    # An editable install of edsc_ext elsewhere would answer `edsc_ext._C` for the copy: drop its finder.
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in "
            "getattr(f, '__module__', '')]; import edsc_ext")
    environ = {**os.environ, "PYTHONPATH": pythonpath, **env}
    environ.pop("EDSC_EXT_JIT", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, cwd=pythonpath)


def test_import_explains_torch_mismatch(tmp_path):
    """The facts are checked before the binary is touched: no binary is needed to get the message."""
    meta = {"version": "0.1.0+cu126torch1.13", "build": "setuptools", "torch_version": "1.13.1+cu126",
            "torch_cuda_version": "12.6", "with_cuda": True, "cuda_version": "12.6",
            "cuda_sass_archs": ["75"], "cuda_ptx_archs": ["75"]}
    result = _import_in_subprocess(_package_copy(tmp_path, meta))
    assert result.returncode != 0
    err = result.stderr
    assert "ImportError: edsc_ext cannot load its compiled kernels: it was built for another torch (torch 1.13 vs" in err
    assert "built for: torch 1.13.1+cu126 (CUDA 12.6)" in err and f"installed: torch {torch.__version__}" in err
    assert "pip install" in err and "EDSC_EXT_JIT=1" in err
    assert "undefined symbol" not in err


def test_import_explains_a_binary_that_does_not_load(tmp_path):
    meta = {"version": "0.1.0", "build": "setuptools", "torch_version": torch.__version__,
            "torch_cuda_version": torch.version.cuda, "with_cuda": False, "cuda_version": None}
    result = _import_in_subprocess(_package_copy(tmp_path, meta, binary_bytes=b"not an ELF file"))
    assert result.returncode != 0
    assert "edsc_ext cannot load its compiled kernels: the binary does not load" in result.stderr
    assert "Underlying error: ImportError:" in result.stderr  # the loader's own message is kept
    assert "direct cause" in result.stderr  # and chained


def test_import_explains_a_missing_binary(tmp_path):
    result = _import_in_subprocess(_package_copy(tmp_path))
    assert result.returncode != 0
    assert "no compiled extension is installed" in result.stderr
    assert "pip install --no-build-isolation -e ." in result.stderr


# --------------------------------------------------------------------------- sdist and wheel config

def test_sdist_has_every_source(tmp_path):
    """The sdist (built without torch or a compiler) carries what all three build paths need."""
    if not os.path.exists(os.path.join(REPO, "setup.py")):
        pytest.skip("needs the checkout")
    pytest.importorskip("setuptools")
    code = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    name = out.stdout.strip().splitlines()[-1]
    assert name.startswith("edsc_ext-") and "+" not in name, name  # no local label on an sdist
    with tarfile.open(tmp_path / name) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    needed = set(bs.tracked_files(REPO)) | {
        "setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "CMakeLists.txt", "tests/cpp/test_deform_sepconv.cpp",
        "src/compat/manylinux_glibc.cpp", "tools/wheels/cibw.sh", "edsc_ext/__init__.py", "edsc_ext/_build_support.py",
        "edsc_ext/_loader.py", "edsc_ext/jit.py", "edsc_ext/_version.py", "edsc_ext/ops.py"}
    missing = sorted(needed - members)
    assert not missing, f"sdist lacks {missing}"
    assert not [m for m in members if m.endswith((".so", ".o")) or m.endswith("_build_meta.py")]


def test_cibuildwheel_accepts_config():
    cibw = shutil.which("cibuildwheel")
    if cibw is None:
        pytest.skip("cibuildwheel not installed (.ci/run checks it in its tools venv)")
    env = {**os.environ, "EDSC_EXT_CUDA_VERSION": "13.0", "EDSC_EXT_TORCH_VERSION": "2.14.1"}
    out = subprocess.run([cibw, "--platform", "linux", "--print-build-identifiers"], cwd=REPO, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [f"cp3{v}-manylinux_x86_64" for v in (10, 11, 12, 13)]


# --------------------------------------------------------------------------- JIT (slow)

def _source_copy(tmp_path):
    """The package and its sources in checkout layout under tmp_path/src_copy (the JIT compiles them)."""
    root = tmp_path / "src_copy"
    shutil.copytree(PACKAGE, root / "edsc_ext", ignore=shutil.ignore_patterns("*.so", "_build_meta.py", "__pycache__",
                                                                             "_csrc"))
    src_root = REPO if os.path.isdir(os.path.join(REPO, "src")) else os.path.join(PACKAGE, bs.SHIPPED_SOURCES_DIR)
    shutil.copytree(os.path.join(src_root, "src"), root / "src")
    shutil.copytree(os.path.join(src_root, "include"), root / "include")
    return root


JIT_PROBE = textwrap.dedent("""
    import json, torch, edsc_ext
    from edsc_ext import jit
    info = edsc_ext.build_info()
    out = edsc_ext.vector_add(torch.ones(3), torch.full((3,), 2.0))
    print(json.dumps({"build": info["build"], "with_cuda": info["with_cuda"], "dir": info["build_directory"],
                      "module": edsc_ext._C.__name__, "ok": out.tolist() == [3.0, 3.0, 3.0],
                      "sources": jit.source_root()}))
""")


@pytest.mark.build
@run_build_tests
def test_jit_build_cached_and_rebuilt_when_sources_change(tmp_path):
    import json

    root = _source_copy(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(root), "EDSC_EXT_JIT": "1", "EDSC_EXT_CPU_ONLY": "1",
           "EDSC_EXT_JIT_CACHE": str(tmp_path / "cache"), "MAX_JOBS": os.environ.get("MAX_JOBS", "2")}

    def probe():
        out = subprocess.run([sys.executable, "-c", JIT_PROBE], env=env, cwd=str(tmp_path), capture_output=True,
                             text=True)
        assert out.returncode == 0, out.stderr[-5000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    t0 = time.time()
    first = probe()
    cold = time.time() - t0
    assert first["build"] == "jit" and first["ok"] and first["module"] == "edsc_ext_jit"
    assert first["with_cuda"] is False and first["sources"] == str(root)
    assert first["dir"].startswith(str(tmp_path / "cache"))
    binary = next(os.path.join(first["dir"], f) for f in os.listdir(first["dir"]) if f.endswith(".so"))
    built_at = os.path.getmtime(binary)

    t0 = time.time()
    second = probe()  # cached: nothing to compile
    assert second["dir"] == first["dir"] and os.path.getmtime(binary) == built_at
    assert time.time() - t0 < max(20.0, cold / 2), "the cached JIT build should load without compiling"

    time.sleep(1.1)  # a later mtime for ninja
    with open(root / "src" / "cpu" / "vector_add_cpu.cpp", "a") as f:
        f.write("\n// changed by test_jit_build_cached_and_rebuilt_when_sources_change\n")
    third = probe()
    assert third["ok"] and third["dir"] == first["dir"]
    assert os.path.getmtime(binary) > built_at, "a changed source must be recompiled"

    # The self-check passes on the JIT build.
    out = subprocess.run([sys.executable, "-m", "edsc_ext"], env=env, cwd=str(tmp_path), capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "build: jit" in out.stdout and "self-check passed" in out.stdout


def test_self_check_warns_about_uncovered_gpus(monkeypatch):
    """`python -m edsc_ext` names each visible GPU that the binary has neither SASS nor PTX for."""
    from edsc_ext import __main__ as main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    caps = {0: (9, 0), 1: (8, 9), 2: (10, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: caps[i])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"GPU{i}")
    info = {"with_cuda": True, "cuda_sass_archs": ["80", "86", "90"], "cuda_ptx_archs": []}
    lines = main.arch_warnings(info)
    assert len(lines) == 1 and "cuda:2 (GPU2, compute capability 10.0)" in lines[0]
    assert 'TORCH_CUDA_ARCH_LIST="10.0"' in lines[0]
    assert main.arch_warnings({**info, "cuda_ptx_archs": ["90"]}) == []  # PTX 9.0 runs on 10.0
    assert main.arch_warnings({**info, "with_cuda": False}) == []  # reported separately


def test_arch_macros_survive_nvcc():
    """nvcc reads -DNAME=a,b as two definitions (b is then an invalid macro name), so the
    architecture list must be encoded without commas, for any number of architectures."""
    from edsc_ext import _build_support as bs

    macros = dict(bs.arch_macros("7.5;8.0;8.6 9.0a;10.0;12.0+PTX"))
    assert macros["EDSC_EXT_CUDA_SASS"] == "75_80_86_90a_100_120"
    assert macros["EDSC_EXT_CUDA_PTX"] == "120"
    for flag in bs.macro_flags(bs.arch_macros("8.0;9.0+PTX")):
        assert "," not in flag and " " not in flag, flag
