"""Builds edsc_ext._C: the CPU and (when a CUDA toolkit is found) CUDA kernels plus a small Python
module, as one binary, with the headers of the torch installed in the build environment. The binary
uses torch only through the LibTorch stable ABI (include/edsc_ext/torch_stable.h) and the Python
module only the limited C API, so one wheel runs with every torch from _build_support.STABLE_ABI_FLOOR
on, under every Python from PY_LIMITED_API on (an abi3 wheel).

    pip install --no-build-isolation .          # from a checkout, with your torch's headers
    pip wheel --no-build-isolation --no-deps .  # a wheel, e.g. edsc_ext-0.1.0+cu130-cp310-abi3-linux_x86_64.whl

Environment:
  EDSC_EXT_FORCE_CUDA=1     fail instead of falling back to a CPU-only build when CUDA is missing
  EDSC_EXT_CPU_ONLY=1       build the CPU kernels only
  TORCH_CUDA_ARCH_LIST      architectures to compile for (default: the visible GPUs', else sm_80 + PTX;
                            the wheels set _build_support.wheel_arch_list)
  CUDA_HOME                 toolkit root; detected when unset (see _build_support.find_cuda_home)
  MAX_JOBS                  parallel compile jobs (default: one per core, _build_support.default_jobs)
  EDSC_EXT_LOCAL_VERSION    the wheel's local version label (default: cu130, cu128 or cpu; 'none': no label)
  EDSC_EXT_WHEEL_INDEX      the wheel index this build is published to (shown in import errors)

pip shows a build's output only with -v, so what the build does, why, and about how long it takes are
also written to the terminal (/dev/tty) when there is one.

The build records what it was built with twice: in the binary (_C.build_info()) and in a generated
edsc_ext/_build_meta.py beside it, which the package reads before loading the binary, so that a
torch below the floor, or of another CUDA major, gets an explanation instead of a loader error.
"""

import importlib.util
import os
import platform
import shutil
import sys
import time

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py as _build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
os.chdir(ROOT)  # setuptools wants source paths relative to the project


def _load_by_path(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Loaded by path: importing the edsc_ext package would import torch and the (unbuilt) binary.
bs = _load_by_path("_edsc_ext_build_support", os.path.join(ROOT, "edsc_ext", "_build_support.py"))
_version = _load_by_path("_edsc_ext_version", os.path.join(ROOT, "edsc_ext", "_version.py"))
BASE_VERSION = _version.__version__
WHEEL_INDEX = os.environ.get("EDSC_EXT_WHEEL_INDEX") or _version.WHEEL_INDEX

# The setuptools commands that compile (pip's build_wheel / build_editable hooks run bdist_wheel /
# editable_wheel).
BUILD_COMMANDS = ("bdist_wheel", "build", "build_ext", "install", "develop", "editable_wheel")
# An sdist is sources only: it needs neither torch nor a compiler, and carries no local label.
SDIST_ONLY = any(cmd in sys.argv[1:] for cmd in ("sdist", "egg_info")) and not any(
    cmd in sys.argv[1:] for cmd in BUILD_COMMANDS)

COMPILES = not SDIST_ONLY and any(cmd in sys.argv[1:] for cmd in BUILD_COMMANDS)

FORCE_CUDA = bs.flag("EDSC_EXT_FORCE_CUDA")
CPU_ONLY = bs.flag("EDSC_EXT_CPU_ONLY")
if FORCE_CUDA and CPU_ONLY:
    sys.exit("EDSC_EXT_FORCE_CUDA=1 and EDSC_EXT_CPU_ONLY=1 contradict each other: set one")

_cuda_home = None if (CPU_ONLY or SDIST_ONLY) else bs.find_cuda_home()
if _cuda_home:
    # Must be set before torch.utils.cpp_extension is imported: it reads CUDA_HOME once.
    os.environ["CUDA_HOME"] = _cuda_home


def announce(message):
    """Prints a line of the build's own; also to the terminal when pip captures the output of a
    compiling run (not of the metadata step before it, which says the same)."""
    print(f"edsc_ext: {message}", flush=True)
    if not COMPILES or sys.stdout.isatty():
        return
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(f"\nedsc_ext: {message}\n")
    except OSError:  # no terminal (CI, a log file): the captured output is all there is
        pass


def _minutes(seconds):
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _import_torch():
    try:
        import torch
    except ImportError:
        sys.exit(
            "edsc-ext: torch is not installed in the build environment.\n"
            "The extension is compiled with the headers of the installed torch (any torch from "
            f"{bs.STABLE_ABI_FLOOR[0]}.{bs.STABLE_ABI_FLOOR[1]} on),\n"
            "so install torch first and build without build isolation:\n"
            "    pip install torch && pip install --no-build-isolation edsc-ext    (or `.` in a checkout)\n"
            "Prebuilt wheels for common torch/CUDA pairs need no compiler: see the README's Install section.")
    return torch


def _local_label(torch, with_cuda):
    label = os.environ.get("EDSC_EXT_LOCAL_VERSION")
    if label is not None:
        return None if label.strip().lower() in ("", "none") else label.strip()
    return bs.local_version_label(torch.version.cuda if with_cuda else None)


class BuildPy(_build_py):
    """Also ships src/ and include/ inside the package (edsc_ext/_csrc), for edsc_ext.jit."""

    def run(self):
        super().run()
        if self.editable_mode:  # the checkout's own src/ and include/ are used
            return
        dest = os.path.join(self.build_lib, "edsc_ext", bs.SHIPPED_SOURCES_DIR)
        for rel in bs.tracked_files(ROOT):
            target = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            self.copy_file(os.path.join(ROOT, rel), target)


def make_build_ext(facts):
    from torch.utils.cpp_extension import BuildExtension

    class BuildExt(BuildExtension):
        """Writes edsc_ext/_build_meta.py next to the binary it builds (build dir, and the source
        tree for in-place/editable builds)."""

        def finalize_options(self):
            super().finalize_options()
            if getattr(self, "editable_mode", False):
                # pip install -e builds in a throw-away temp folder; use the regular build/temp.*
                # instead, so that ninja's objects survive: an edit-rebuild cycle recompiles only what
                # changed, and a later `pip wheel .` with the same flags only relinks.
                regular = self.distribution.get_command_class("build")(self.distribution)
                regular.initialize_options()
                regular.finalize_options()
                self.build_temp = os.path.join(ROOT, regular.build_temp)

        def run(self):
            start = time.monotonic()
            super().run()
            announce(f"compiled in {_minutes(time.monotonic() - start)}")
            text = bs.build_meta_source(facts)
            folders = {os.path.dirname(os.path.join(self.build_lib, *"edsc_ext._C".split(".")))}
            if self.inplace or getattr(self, "editable_mode", False):
                folders.add(os.path.join(ROOT, "edsc_ext"))
            for folder in folders:
                os.makedirs(folder, exist_ok=True)
                path = os.path.join(folder, "_build_meta.py")
                with open(path, "w") as f:
                    f.write(text)
                print(f"edsc_ext: wrote {os.path.relpath(path, ROOT)}", flush=True)

        def get_outputs(self):
            return super().get_outputs() + [os.path.join(self.build_lib, "edsc_ext", "_build_meta.py")]

    return BuildExt.with_options(use_ninja=shutil.which("ninja") is not None)


# numpy: torch warns at import ("Failed to initialize NumPy") in an environment without it.
RUNTIME_REQUIREMENTS = ["numpy"]


def configure():
    """(version, install_requires, ext_modules, cmdclass) for this build."""
    if SDIST_ONLY:
        return BASE_VERSION, RUNTIME_REQUIREMENTS + [bs.torch_requirement()], [], {"build_py": BuildPy}

    torch = _import_torch()
    if bs.major_minor(torch.__version__) < bs.STABLE_ABI_FLOOR:
        sys.exit("edsc-ext needs torch >= {}.{} to build (its stable ABI); the build environment has torch {}".format(
            *bs.STABLE_ABI_FLOOR, torch.__version__))
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    with_cuda, why = bs.decide_cuda(torch.version.cuda, _cuda_home, CPU_ONLY)
    if FORCE_CUDA and not with_cuda:
        sys.exit(f"EDSC_EXT_FORCE_CUDA=1 but CUDA kernels cannot be built: {why}")
    announce(f"building {'CPU + CUDA' if with_cuda else 'CPU-only'} kernels against torch {torch.__version__} ({why})")

    label = _local_label(torch, with_cuda)
    version = BASE_VERSION + (f"+{label}" if label else "")
    sources = bs.source_files(ROOT, with_cuda)
    _glibc_wheel = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    if _glibc_wheel:
        sources.append(os.path.join("src", "compat", "manylinux_glibc.cpp"))  # see that file
    include_dirs = [os.path.join(ROOT, d) for d in bs.INCLUDE_DIRS]
    arch_list = None
    macros = bs.stable_abi_macros()
    n_archs = 0
    if with_cuda:
        arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
        arch_why = "from TORCH_CUDA_ARCH_LIST"
        if not arch_list:
            capabilities = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())] \
                if torch.cuda.is_available() else []
            arch_list, arch_why = bs.source_arch_list(capabilities)
            os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list  # torch.utils.cpp_extension reads it from here
        try:
            macros += bs.arch_macros(arch_list)
        except ValueError as exc:
            sys.exit(str(exc))
        n_archs = len(set(bs.encode_arch_list(arch_list)[0]))
        announce(f"GPU architectures {arch_list} ({arch_why}; TORCH_CUDA_ARCH_LIST=\"8.6;9.0\" picks others)")
        include_dirs += bs.pip_cuda_include_dirs()
    if not os.environ.get("MAX_JOBS", "").strip():
        os.environ["MAX_JOBS"] = str(bs.default_jobs())  # torch.utils.cpp_extension passes it to ninja
    jobs = os.environ["MAX_JOBS"].strip()
    if not jobs.isdigit() or int(jobs) == 0:
        sys.exit(f"MAX_JOBS={jobs!r} is not a positive number of parallel compile jobs")
    jobs = int(jobs)
    if COMPILES:
        announce(f"compiling with {jobs} parallel jobs (MAX_JOBS); expect about "
                 f"{_minutes(bs.estimated_build_seconds(n_archs, jobs))} (on 2-core CI machines; faster cores take "
                 f"less), less when ninja finds objects of an earlier build")
    toolkit = None
    if with_cuda:
        nvcc = bs.nvcc_version(_cuda_home)
        toolkit = f"{nvcc[0]}.{nvcc[1]}" if nvcc else torch.version.cuda
    facts = bs.build_facts(version, "setuptools", with_cuda, toolkit, arch_list,
                           python="%d.%d" % sys.version_info[:2], wheel_index=WHEEL_INDEX,
                           sources_digest=bs.sources_digest(ROOT))

    # py_limited_api: no libtorch_python, no pybind11 (torch.utils.cpp_extension leaves them out).
    if with_cuda:
        nvcc_flags = list(bs.NVCC_FLAGS)
        if bs.flag("EDSC_EXT_PTXAS_VERBOSE"):
            nvcc_flags.append("-Xptxas=-v")
        ext = CUDAExtension("edsc_ext._C", sources, include_dirs=include_dirs, define_macros=macros,
                            extra_compile_args={"cxx": list(bs.CXX_FLAGS), "nvcc": nvcc_flags}, py_limited_api=True)
        ext.libraries = bs.cpu_loadable_libraries(ext.libraries)
        if _glibc_wheel and platform.machine() == "x86_64":
            ext.extra_link_args = bs.static_cuda_runtime_glibc_wraps(ROOT)  # see src/compat/manylinux_glibc.cpp
    else:
        ext = CppExtension("edsc_ext._C", sources, include_dirs=include_dirs, define_macros=macros,
                           extra_compile_args={"cxx": list(bs.CXX_FLAGS)}, py_limited_api=True)
    cmdclass = {"build_py": BuildPy, "build_ext": make_build_ext(facts)}
    return version, RUNTIME_REQUIREMENTS + [bs.torch_requirement()], [ext], cmdclass


VERSION, INSTALL_REQUIRES, EXT_MODULES, CMDCLASS = configure()

setup(
    version=VERSION,
    install_requires=INSTALL_REQUIRES,
    packages=find_packages(include=["edsc_ext", "edsc_ext.*"]),
    ext_modules=EXT_MODULES,
    cmdclass=CMDCLASS,
    options={"bdist_wheel": {"py_limited_api": bs.abi3_tag()}},
)
