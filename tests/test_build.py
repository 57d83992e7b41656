"""The build and distribution machinery: build facts, the import-time explanation of a mismatched
binary, the architecture tables, the sdist, the wheel configuration, and (marked ``build``, run
when EDSC_EXT_BUILD_TESTS=1, as .ci/run does) the JIT build.

The wheel itself (pip wheel, auditwheel, a fresh venv) and the CMake build + ctest are checked by
.ci/run's stages, which reuse the CI's build folders; see there.
"""

from __future__ import annotations

import os
import re
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
from edsc_ext import _loader, jit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.dirname(os.path.abspath(edsc_ext.__file__))
CIBW_SH = os.path.join(REPO, "tools", "wheels", "cibw.sh")

run_build_tests = pytest.mark.skipif(os.environ.get("EDSC_EXT_BUILD_TESTS") != "1",
                                     reason="slow build test: set EDSC_EXT_BUILD_TESTS=1 (.ci/run does)")


# --------------------------------------------------------------------------- build facts

def test_build_info_facts():
    info = edsc_ext.build_info()
    for key in ("version", "build", "torch_version", "torch_floor", "with_cuda", "cuda_version", "cuda_sass_archs",
                "cuda_ptx_archs"):
        assert key in info, key
    assert info["build"] in ("setuptools", "jit")
    # One binary for every torch from the floor on: the torch it runs with may differ from its headers'.
    assert bs.major_minor(info["torch_floor"]) == bs.STABLE_ABI_FLOOR
    assert bs.major_minor(torch.__version__) >= bs.STABLE_ABI_FLOOR
    assert info["version"] == edsc_ext.__version__
    assert isinstance(info["cuda_sass_archs"], list) and isinstance(info["cuda_ptx_archs"], list)
    if info["with_cuda"]:
        assert info["cuda_sass_archs"], "a CUDA build records its architectures"
        if torch.version.cuda:  # a CUDA build also runs (on the CPU) with a CPU-only torch
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
    assert meta["torch_floor"] == binary["torch_floor"]
    assert meta["with_cuda"] == binary["with_cuda"]
    if meta["with_cuda"]:
        assert bs.ARCH_SEPARATOR.join(meta["cuda_sass_archs"]) == binary["cuda_sass_archs"]
        assert meta["cuda_version"] == binary["cuda_version"]


def test_the_module_exports_its_init_and_no_header_copies():
    """Built with -fvisibility=hidden (_build_support.CXX_FLAGS): of its own and its headers' code the module
    exports PyInit__C alone, so its inline copies of c10, torch's stable API and CCCL cannot bind to, or be
    bound by, another extension's built against other headers (libstdc++'s std:: stays default-visible)."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    listing = subprocess.run([nm, "-D", "-C", "--defined-only", edsc_ext._C.__file__], capture_output=True, text=True,
                             check=True).stdout
    symbols = [line.split(" ", 2)[2] for line in listing.splitlines() if line.count(" ") >= 2]
    assert "PyInit__C" in symbols
    # A namespace at a name boundary: "at::" must not match libstdc++'s "...Format::".
    header_namespace = re.compile(r"(?<![\w:])(edsc_ext|c10|torch|at|cuda|cub|thrust)::")
    leaked = [s for s in symbols if header_namespace.search(s)]
    assert not leaked, f"{len(leaked)} exported, e.g. {leaked[:5]}"


def test_the_module_needs_no_half_precision_helpers_of_a_new_libgcc():
    """The CPU loops convert float16 with F16C (src/cpu/f16c_half.h: _Float16 conversions inside the AVX2
    loops). Compiled anywhere else, the same conversions become calls to libgcc's __extendhfsf2 /
    __truncsfhf2, which only GCC 12's libgcc has: a wheel that referenced them would not load on an older
    system. So the library must reference neither."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    listing = subprocess.run([nm, "-D", "--undefined-only", edsc_ext._C.__file__], capture_output=True, text=True,
                             check=True).stdout
    undefined = {line.split()[-1].split("@")[0] for line in listing.splitlines() if line.strip()}
    assert undefined, "nm listed no undefined symbols at all: the check would prove nothing"
    half_helpers = sorted(s for s in undefined if re.fullmatch(r"__(extend|trunc)\w*hf\w*", s))
    assert not half_helpers, f"the module references {half_helpers}"


def test_version_label():
    """Labels name the CUDA of the kernels, not a torch: the binary runs with every torch from the floor on."""
    assert bs.local_version_label("13.0") == "cu130"
    assert bs.local_version_label("12.8") == "cu128"
    assert bs.local_version_label(None) == "cpu"
    # The remedy points at what a release publishes: one wheel per CUDA major.
    assert [bs.release_label(v) for v in ("13.0", "13.2", "12.6", "12.8", None)] == [
        "cu130", "cu130", "cu128", "cu128", "cpu"]
    assert bs.torch_requirement() == "torch>={}.{}".format(*bs.STABLE_ABI_FLOOR)
    assert bs.STABLE_ABI_FLOOR <= (2, 11), "the H200 runs torch 2.11"
    meta = _loader.read_build_meta()
    if meta and meta.get("build") == "setuptools":
        label = edsc_ext.__version__.partition("+")[2]
        expected = bs.local_version_label(meta["torch_cuda_version"] if meta["with_cuda"] else None)
        assert label in ("", expected)


# --------------------------------------------------------------------------- architectures

@pytest.mark.parametrize("cuda", ["12.6", "12.8", "13.0", "13.2"])
def test_wheel_arch_table_matches_setup(cuda):
    """tools/wheels/cibw.sh (the wheels) and wheel_arch_list agree."""
    if not shutil.which("bash") or not os.path.exists(CIBW_SH):
        pytest.skip("needs bash and the checkout's tools/wheels/cibw.sh")
    out = subprocess.run(["bash", CIBW_SH, "arch-list"], env={**os.environ, "EDSC_EXT_CUDA_VERSION": cuda},
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == bs.wheel_arch_list(cuda)
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
    assert _loader.mismatch("2.10", "13.0", True, "2.14.0+cu130", "13.0") is None
    assert _loader.mismatch("2.10", "13.0", True, "2.10.0+cu130", "13.0") is None  # the floor itself
    assert _loader.mismatch("2.10", "12.8", True, "2.11.0+cu126", "12.6") is None  # same CUDA major
    assert _loader.mismatch("2.10", None, False, "2.14.1+cu130", "13.0") is None  # CPU build, any CUDA
    assert _loader.mismatch("2.10", "13.0", True, "2.13.0+cpu", "") is None  # CUDA build, on the CPU
    assert "torch 2.9.1 is older than 2.10" in _loader.mismatch("2.10", None, False, "2.9.1", "")
    assert ("its kernels are for CUDA 12.8 but the installed torch uses CUDA 13.0"
            in _loader.mismatch("2.10", "12.8", True, "2.14.1+cu130", "13.0"))


def test_refusal_is_one_line_that_says_what_to_install():
    facts = {"version": "0.1.0+cu128", "torch_floor": "2.10", "wheel_index": "https://example.org/whl"}
    below = _loader.refusal(_loader.mismatch("2.10", None, False, "2.9.1", ""), facts)
    assert "\n" not in below
    assert below.startswith("edsc_ext 0.1.0+cu128 cannot run here: torch 2.9.1 is older than 2.10")
    assert below.endswith('pip install "torch>=2.10"')
    other_cuda = _loader.refusal(_loader.mismatch("2.10", "12.8", True, "2.14.1+cu130", "13.0"), facts)
    wanted = bs.release_label(torch.version.cuda)
    assert "\n" not in other_cuda and "CUDA 12.8" in other_cuda
    assert other_cuda.endswith(f'pip install --force-reinstall --no-deps "edsc-ext=={_loader.BASE_VERSION}'
                               f'+{wanted}" -f https://example.org/whl/{wanted}.html')


def test_explanation_says_what_and_how():
    meta = {"version": "0.1.0+cu126", "build": "setuptools", "torch_version": "2.14.1+cu126", "torch_floor": "2.10",
            "torch_cuda_version": "12.6", "with_cuda": True, "cuda_version": "12.6",
            "cuda_sass_archs": ["75", "90"], "wheel_index": "https://example.org/whl"}
    text = _loader.explain("the binary does not load", meta, cause=ImportError("libcuda.so.1: cannot open"))
    wanted = bs.release_label(torch.version.cuda)
    assert "built for: torch >= 2.10 with CUDA 12.6, kernels for sm 75,90 (headers of torch 2.14.1+cu126)" in text
    assert f"installed: torch {torch.__version__}" in text
    assert f"-f https://example.org/whl/{wanted}.html" in text
    assert "pip install --no-build-isolation" in text and "EDSC_EXT_JIT=1" in text
    assert "Underlying error: ImportError: libcuda.so.1: cannot open" in text


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


@pytest.mark.parametrize("case", ["floor", "cuda"])
def test_import_refuses_a_torch_that_does_not_fit(tmp_path, case):
    """The facts are checked before the binary is touched: no binary is needed to get the one line."""
    running = bs.major_minor(torch.__version__)
    other_cuda = "12.8" if (torch.version.cuda or "13").startswith("13") else "13.0"
    meta = {"version": "0.1.0+cu128", "build": "setuptools", "torch_version": "2.14.1+cu128",
            "torch_floor": f"{running[0]}.{running[1] + 1}" if case == "floor" else "2.10",
            "torch_cuda_version": other_cuda, "with_cuda": True, "cuda_version": other_cuda,
            "cuda_sass_archs": ["75"], "cuda_ptx_archs": ["75"]}
    if case == "cuda" and not torch.version.cuda:
        pytest.skip("a CUDA-major mismatch needs a CUDA torch (a CPU torch runs any CUDA build on the CPU)")
    result = _import_in_subprocess(_package_copy(tmp_path, meta))
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: edsc_ext 0.1.0+cu128 cannot run here: ")
    assert ("older than" in last and 'pip install "torch>=' in last) if case == "floor" else \
        (f"its kernels are for CUDA {other_cuda}" in last and "pip install" in last)


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


def _checkout_and_site(tmp_path):
    """A source checkout whose package has no binary (tmp/checkout) and a site folder (tmp/site) holding a
    build of edsc_ext: the running binary, with build facts that say it was built from the checkout's
    sources."""
    meta = _loader.read_build_meta()
    if edsc_ext.build_info()["build"] != "setuptools" or meta is None:
        pytest.skip("needs a setuptools build with _build_meta.py")
    checkout = tmp_path / "checkout"
    shutil.copytree(PACKAGE, checkout / "edsc_ext",
                    ignore=shutil.ignore_patterns("*.so", "_build_meta.py", "__pycache__", "_csrc"))
    sources = jit.source_root()
    for rel in bs.tracked_files(sources):
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(os.path.join(sources, rel), checkout / rel)
    for name in ("setup.py", "pyproject.toml"):
        (checkout / name).write_text("# a checkout's marker\n")
    site = tmp_path / "site" / "edsc_ext"
    shutil.copytree(PACKAGE, site, ignore=shutil.ignore_patterns("__pycache__", "_csrc"))
    shutil.copyfile(edsc_ext._C.__file__, site / os.path.basename(edsc_ext._C.__file__))
    (site / "_build_meta.py").write_text(bs.build_meta_source(
        {**meta, "sources_digest": bs.sources_digest(str(checkout))}))
    return checkout, site.parent


def _python_in(folder, code, pythonpath):
    # As if run from that folder: sys.path[0] is it. An editable install's finder would answer for the
    # copies: drop it, as an installed (non-editable) build has none.
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in "
            "getattr(f, '__module__', '')]; " + code)
    environ = {**os.environ, "PYTHONPATH": str(pythonpath)}
    environ.pop("EDSC_EXT_JIT", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, cwd=folder)


def test_unbuilt_checkout_uses_the_installed_build_of_its_sources(tmp_path):
    """Python run in the root of a checkout after `pip install .` imports the checkout; its kernels come
    from the build installed from the same sources."""
    checkout, site = _checkout_and_site(tmp_path)
    result = _python_in(checkout, "import edsc_ext, torch; i = edsc_ext.build_info(); print(edsc_ext.__file__); "
                                  "print(i['binary']); print(edsc_ext.vector_add(torch.ones(3), torch.ones(3)))",
                        site)
    assert result.returncode == 0, result.stderr[-3000:]
    package_file, binary, total = result.stdout.splitlines()[-3:]
    assert package_file.startswith(str(checkout))
    assert binary.startswith(str(site))
    assert "2., 2., 2." in total


def test_unbuilt_checkout_refuses_a_build_of_other_sources(tmp_path):
    checkout, site = _checkout_and_site(tmp_path)
    # An edit of the checkout's sources after the build: no installed build (this environment's own
    # included) was made from them any more.
    with open(checkout / "src" / "registration.cpp", "a") as f:
        f.write("// edited after the build\n")
    result = _python_in(checkout, "import edsc_ext", site)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: edsc_ext is imported from the source checkout {checkout}, which is not built")
    assert "built from other sources" in last and f"run `pip install --no-build-isolation -e .` in {checkout}" in last


# --------------------------------------------------------------------------- the installed C++ API

PUBLIC_HEADERS = ["edsc_ext.h", "spec.h"]


def test_the_installed_headers_are_the_api():
    """include/edsc_ext holds the C++ API alone (edsc_ext.h and the spec.h it includes; the internal
    headers live in src/), which is what CMake installs, and the public headers include no other header
    of the project."""
    include = os.path.join(REPO, "include", "edsc_ext")
    if not os.path.isdir(include):
        pytest.skip("needs the checkout")
    assert sorted(os.listdir(include)) == PUBLIC_HEADERS
    for name in PUBLIC_HEADERS:
        with open(os.path.join(include, name)) as f:
            own = re.findall(r'#include "([^"]+)"', f.read())
        assert set(own) <= {f"edsc_ext/{h}" for h in PUBLIC_HEADERS}, (name, own)
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        cmake = f.read()
    installed = re.findall(r'install\(FILES ([^)]*) DESTINATION "\$\{CMAKE_INSTALL_INCLUDEDIR\}/edsc_ext"\)', cmake)
    assert [sorted(files.split()) for files in installed] == [[f"include/edsc_ext/{h}" for h in PUBLIC_HEADERS]]
    assert "install(DIRECTORY include" not in cmake
    assert bs.INCLUDE_DIRS == ("include", "src")


def test_the_api_compiles_from_the_installed_headers_alone(tmp_path):
    """A C++ consumer (tests/cpp/consumer/main.cpp) compiles against include/ and torch's headers, with
    nothing of src/ on its include path, in the standard torch.utils.cpp_extension and our CMake build
    with (C++20: torch 2.14's ATen headers need it)."""
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    consumer = os.path.join(REPO, "tests", "cpp", "consumer", "main.cpp")
    if compiler is None or not os.path.isfile(consumer):
        pytest.skip("needs a C++ compiler and the checkout")
    from torch.utils.cpp_extension import include_paths

    # The public headers copied alone, so that a stray include of an internal header cannot resolve.
    copied = tmp_path / "include" / "edsc_ext"
    copied.mkdir(parents=True)
    for name in PUBLIC_HEADERS:
        shutil.copy(os.path.join(REPO, "include", "edsc_ext", name), copied / name)
    flags = [f"-I{d}" for d in [str(tmp_path / "include")] + include_paths()]
    result = subprocess.run([compiler, "-std=c++20", "-fsyntax-only", "-w", *flags, consumer], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr[-3000:]


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
        "edsc_ext/_loader.py", "edsc_ext/jit.py", "edsc_ext/_version.py", "edsc_ext/ops.py",
        "cmake/edsc_extConfig.cmake.in", "tests/cpp/consumer/CMakeLists.txt"}
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


# --------------------------------------------------------------------------- python -m edsc_ext

def test_main_help_prints_usage_and_checks_nothing(capsys):
    from edsc_ext import __main__ as main

    with pytest.raises(SystemExit) as exit_info:
        main.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m edsc_ext") and "--json" in out and "--device" in out
    assert "self-check" not in out


def test_main_json_report_of_the_cpu(capsys):
    import json

    from edsc_ext import __main__ as main

    assert main.main(["--json", "--device", "cpu", "--dtype", "float64", "float32"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is True and report["torch"] == torch.__version__
    assert report["build_info"]["version"] == edsc_ext.__version__
    assert [(c["device"], c["dtype"]) for c in report["checks"]] == [("cpu", "float64"), ("cpu", "float32")]
    for check in report["checks"]:
        assert check["ok"] and 0 <= check["max_relative_error"] <= check["tolerance"]


def test_main_report_only(capsys):
    from edsc_ext import __main__ as main

    assert main.main(["--no-check"]) == 0
    out = capsys.readouterr().out
    assert f"edsc_ext {edsc_ext.__version__}" in out and "built for: torch >= " in out
    assert "self-check" not in out and " ok " not in out


@pytest.mark.parametrize("device, message", [
    ("gpu", "--device gpu: not a device (expected cpu, cuda or cuda:N)"),
    ("meta", "--device meta: edsc_ext has kernels for cpu and cuda only"),
    ("cuda:99", "--device cuda:99: "),
])
def test_main_bad_device_is_one_line_and_exit_code_2(capsys, device, message):
    from edsc_ext import __main__ as main

    with pytest.raises(SystemExit) as exit_info:
        main.main(["--device", device])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err.strip().splitlines()[-1]
    assert "Traceback" not in err


def test_main_notes_gpus_that_run_only_ptx(monkeypatch):
    from edsc_ext import __main__ as main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    caps = {0: (8, 6), 1: (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: caps[i])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"GPU{i}")
    info = {"with_cuda": True, "cuda_sass_archs": ["80"], "cuda_ptx_archs": ["80"]}  # the no-GPU default build
    notes = main.arch_notes(info)
    assert len(notes) == 1 and "cuda:1 (GPU1, compute capability 9.0) runs this build's PTX" in notes[0]
    assert 'TORCH_CUDA_ARCH_LIST="9.0"' in notes[0]
    assert main.arch_warnings(info) == []


# --------------------------------------------------------------------------- source build defaults

def test_source_build_targets_the_visible_gpus_else_one_architecture_and_ptx():
    assert bs.source_arch_list([(9, 0)])[0] == "9.0+PTX"
    assert bs.source_arch_list([(8, 6), (9, 0), (8, 6)])[0] == "8.6;9.0+PTX"
    arch_list, why = bs.source_arch_list([])
    assert arch_list == bs.NO_GPU_ARCH_LIST and "no GPU is visible" in why
    sass, ptx = bs.encode_arch_list(arch_list)
    assert len(sass) == 1 and ptx == sass, "one architecture's machine code plus its PTX"
    # That one build runs on every GPU from Ampere on: its machine code on 8.x, its PTX on the later ones.
    for capability in ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)):
        assert bs.arch_runs_on(sass, ptx, capability), capability
    assert not bs.arch_runs_on(sass, ptx, (7, 5))


def test_default_jobs_uses_the_cores():
    jobs = bs.default_jobs()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    assert 1 <= jobs <= cores
    assert bs.estimated_build_seconds(1, 2) > bs.estimated_build_seconds(0, 2) > 0
    assert bs.estimated_build_seconds(2, 2) > bs.estimated_build_seconds(1, 2) > bs.estimated_build_seconds(1, 4)


def test_sources_digest_follows_the_sources(tmp_path):
    root = tmp_path / "tree"
    for rel in ("src/registration.cpp", "src/cpu/a.cpp", "include/edsc_ext/a.h"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    digest = bs.sources_digest(str(root))
    assert digest == bs.sources_digest(str(root)) and len(digest) == 16
    (root / "src/cpu/a.cpp").write_text("changed")
    assert bs.sources_digest(str(root)) != digest
