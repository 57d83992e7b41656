"""Build configuration shared by the three build paths: setup.py (wheels and source installs),
:mod:`edsc_ext.jit` (``torch.utils.cpp_extension.load``) and, for its arch table, the wheel
workflow (``tools/wheels/cibw.sh`` is checked against :func:`wheel_arch_list` by the tests).

This module imports nothing outside the standard library at module level: setup.py loads it by
file path before torch is imported (``CUDA_HOME`` must be settled first), and the JIT loads it
from the installed package.
"""

import glob
import os
import re
import shutil
import subprocess

# The extension's sources, relative to the folder holding src/ and include/ (the repository root,
# or edsc_ext/_csrc inside an installed wheel). src/cuda/*.cpp is the CUDA backend's plain C++ (its
# planner), compiled into every build so that CUDA plans can be made without a GPU.
CPU_SOURCE_GLOBS = ("src/*.cpp", "src/cpu/*.cpp", "src/cuda/*.cpp")
CUDA_SOURCE_GLOBS = ("src/cuda/*.cu",)
HEADER_GLOBS = ("include/edsc_ext/*.h", "src/*.h", "src/cpu/*.h", "src/cuda/*.h", "src/cuda/*.cuh")
# The include folders of every build: include/ holds the C++ API (edsc_ext/edsc_ext.h and the
# edsc_ext/spec.h it takes, the headers CMake installs), src/ the internal headers.
INCLUDE_DIRS = ("include", "src")

# Where an installed wheel keeps a copy of src/ and include/ for the JIT build.
SHIPPED_SOURCES_DIR = "_csrc"

# The C++ standard is the one torch.utils.cpp_extension picks for this torch. -g0 overrides the -g of
# Python's own CFLAGS, which setuptools passes to every C++ unit: the debug info of the templated
# CPU kernels was 33 of the module's 50 MB and a third of their compile time (the CPU backward's, measured on
# a 2-core machine: 110 s -> 77 s, object 36 -> 3.5 MB). nvcc units get no -g either way.
# -fvisibility=hidden: the module exports PyInit__C alone. torch declares its stable API (torch::stable,
# torch::headeronly) hidden so that extensions built against different torch headers cannot bind to each
# other's inline copies; the extension's own symbols, and the weak and unique ones that the c10 and CCCL
# headers instantiate, get the same protection (and gcc stops warning about default-visibility types
# holding hidden stable Tensors).
CXX_FLAGS = ["-O3", "-g0", "-fvisibility=hidden"]
NVCC_FLAGS = ["-O3", "-lineinfo", "-Xcompiler=-fvisibility=hidden"]

# The oldest torch the binary runs with: the host code uses torch only through the LibTorch stable
# ABI (src/torch_stable.h), compiled for this version's stable API (TORCH_TARGET_VERSION).
# 2.10 is the first whose stable API has what the op needs: torch_call_dispatcher (empty with a
# memory format, contiguous, to, new_zeros, copy_, zero_, and any ATen op by name), parallel_for and
# get_num_threads, typed data pointers, std::vector / std::string arguments (bool[5], int[], str[])
# and torch_library_impl.
STABLE_ABI_FLOOR = (2, 10)
# The Python module (src/python_module.cpp) uses the limited C API of this Python on: one abi3 binary
# for every Python from it on (torch 2.10 needs 3.10).
PY_LIMITED_API = (3, 10)


def stable_abi_macros():
    """The preprocessor definitions of every build: the stable-ABI target and the limited Python API."""
    major, minor = STABLE_ABI_FLOOR
    return [("TORCH_TARGET_VERSION", f"0x{major:02x}{minor:02x}000000000000"),
            ("Py_LIMITED_API", "0x{:02x}{:02x}0000".format(*PY_LIMITED_API))]


# torch's CUDA libraries and the shared CUDA runtime, which torch.utils.cpp_extension links a CUDA
# extension to. The wheel links none of them: with the CUDA runtime linked statically and torch's
# current stream looked up at run time (src/cuda/cuda_host.cuh), the CUDA wheel also loads, and runs
# on the CPU, with a CPU-only torch.
TORCH_CUDA_LIBRARIES = ("cudart", "c10_cuda", "torch_cuda")
STATIC_CUDA_RUNTIME = ("cudart_static", "dl", "rt", "pthread")


def static_cuda_runtime_glibc_wraps(root):
    """The link flags that route the static CUDA runtime's glibc calls through the wrappers of
    src/compat/manylinux_glibc.cpp (names from src/compat/static_cuda_runtime_glibc.def)."""
    with open(os.path.join(root, "src", "compat", "static_cuda_runtime_glibc.def")) as f:
        names = re.findall(r"^EDSC_EXT_GLIBC_\w+\((\w+)", f.read(), flags=re.MULTILINE)
    return ["-Wl," + ",".join(f"--wrap={name}" for name in names)]


def cpu_loadable_libraries(libraries):
    """A CUDA extension's link libraries without TORCH_CUDA_LIBRARIES, with STATIC_CUDA_RUNTIME."""
    return [lib for lib in libraries if lib not in TORCH_CUDA_LIBRARIES] + list(STATIC_CUDA_RUNTIME)


def abi3_tag():
    """The wheel's Python tag for the limited API: 'cp310'."""
    return "cp{}{}".format(*PY_LIMITED_API)


def flag(name, environ=None):
    """True when the environment variable is set to 1/true/yes/on."""
    value = (environ if environ is not None else os.environ).get(name, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


# --------------------------------------------------------------------------- CUDA toolkit

def is_cuda_root(path):
    return bool(path) and os.path.isfile(os.path.join(path, "bin", "nvcc")) and os.path.isfile(
        os.path.join(path, "include", "cuda_runtime.h"))


def find_cuda_home(environ=None):
    """The CUDA toolkit root, or None.

    torch guesses CUDA_HOME from `which nvcc`; where nvcc is a wrapper script (/usr/local/bin/nvcc)
    that guess is /usr/local, which has no CUDA headers. So take CUDA_HOME/CUDA_PATH when they point
    at a toolkit, then /usr/local/cuda, then nvcc's own location, then /usr/local/cuda-*.
    """
    environ = environ if environ is not None else os.environ
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if is_cuda_root(environ.get(var)):
            return environ[var]
    if is_cuda_root("/usr/local/cuda"):
        return "/usr/local/cuda"
    nvcc = shutil.which("nvcc")
    if nvcc:
        root = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        if is_cuda_root(root):
            return root
    candidates = sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    return next((c for c in candidates if is_cuda_root(c)), None)


def cuda_home_problem(environ=None):
    """Why CUDA_HOME (when set) is not usable, or None."""
    environ = environ if environ is not None else os.environ
    value = environ.get("CUDA_HOME")
    if value and not is_cuda_root(value):
        return (f"CUDA_HOME={value} is not a CUDA toolkit root (it needs bin/nvcc and include/cuda_runtime.h; "
                f"e.g. /usr/local/cuda)")
    return None


def nvcc_version(cuda_home):
    """(major, minor) of cuda_home/bin/nvcc, or None."""
    try:
        out = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"], capture_output=True,
                             text=True, check=False).stdout
    except OSError:
        return None
    match = re.search(r"release (\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None


def decide_cuda(torch_cuda_version, cuda_home, cpu_only=False):
    """(build the CUDA kernels?, why) for a torch built with CUDA `torch_cuda_version` (None: CPU torch)."""
    if cpu_only:
        return False, "EDSC_EXT_CPU_ONLY=1"
    if torch_cuda_version is None:
        return False, "the installed torch has no CUDA support"
    if not cuda_home:
        problem = cuda_home_problem()
        return False, problem or "no CUDA toolkit found (install nvcc or set CUDA_HOME to a folder with bin/nvcc)"
    nvcc = nvcc_version(cuda_home)
    torch_major = int(torch_cuda_version.split(".")[0])
    if nvcc and nvcc[0] != torch_major:
        return False, (f"nvcc {nvcc[0]}.{nvcc[1]} in {cuda_home} does not match the CUDA {torch_cuda_version} "
                       f"torch was built with (CUDA major versions must agree)")
    return True, f"CUDA {torch_cuda_version}, toolkit {cuda_home}" + (f" (nvcc {nvcc[0]}.{nvcc[1]})" if nvcc else "")


def pip_cuda_include_dirs():
    """Header folders of the nvidia-* pip packages that come with torch (cuBLAS, cuSPARSE, ...).

    ATen's CUDA headers include cublas_v2.h and cusparse.h, which a minimal toolkit may lack.
    """
    dirs = []
    try:
        import nvidia  # namespace package installed with CUDA builds of torch
    except ImportError:
        return dirs
    for base in list(getattr(nvidia, "__path__", [])):
        for inc in sorted(glob.glob(os.path.join(base, "*", "include"))):
            if glob.glob(os.path.join(inc, "cublas*.h")) or glob.glob(os.path.join(inc, "cusparse*.h")):
                dirs.append(inc)
    return dirs


# --------------------------------------------------------------------------- architectures

def wheel_arch_list(cuda_version):
    """The TORCH_CUDA_ARCH_LIST of the published wheels: real machine code (SASS) for every
    architecture this project supports with that CUDA (Turing 7.5 and newer), plus PTX for the
    newest, so that later GPUs still run (the driver compiles the PTX)."""
    major, minor = (int(x) for x in str(cuda_version).split(".")[:2])
    if major >= 13:
        return "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX"
    if (major, minor) >= (12, 8):
        return "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX"
    return "7.5;8.0;8.6;8.9;9.0+PTX"


# A source build for a machine with no visible GPU (a container build, a CI runner, a login node):
# one architecture's machine code plus its PTX, instead of the wheels' seven. sm_80 code runs on every
# Ampere and Ada GPU (8.x), and the driver compiles the PTX for the later ones (Hopper, Blackwell) on
# first use; Turing (7.5) is left out, and `python -m edsc_ext` says so on such a GPU.
NO_GPU_ARCH_LIST = "8.0+PTX"


def source_arch_list(capabilities):
    """(TORCH_CUDA_ARCH_LIST, why) for a source build when none is given: the architectures of the
    visible GPUs, compute capabilities [(major, minor), ...], with PTX on the newest; with none
    visible, NO_GPU_ARCH_LIST."""
    capabilities = sorted(set(capabilities))
    if capabilities:
        names = ", ".join(f"{major}.{minor}" for major, minor in capabilities)
        return arch_list_for_devices(capabilities), f"the visible GPUs' architectures ({names})"
    return NO_GPU_ARCH_LIST, ("no GPU is visible: sm_80 machine code (Ampere, Ada) plus PTX that the driver "
                              "compiles for newer GPUs")


def default_jobs():
    """Parallel compile jobs when MAX_JOBS is unset: one per usable core, but no more than one per
    2 GiB of available memory (an nvcc job of the CUDA units takes about that)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        with open("/proc/meminfo") as f:
            available_kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        cores = min(cores, max(1, available_kib // (2 * 1024 * 1024)))
    except (OSError, StopIteration, ValueError):
        pass
    return max(1, cores)


# Compile seconds of the units, one core each, on a 2-core x86-64 machine (the CI kind): all C++ units
# together; the host side of all CUDA units; their device code per architecture (SASS and PTX of one
# architecture share one front end; the host part is roughly the units' headers). Only for the
# estimate a build prints.
COMPILE_SECONDS_CPU = 320
COMPILE_SECONDS_CUDA_HOST = 200
COMPILE_SECONDS_CUDA_PER_ARCH = 500


def estimated_build_seconds(n_cuda_archs, jobs):
    """A rough wall time for a build with CUDA kernels for n_cuda_archs architectures (0: CPU-only)
    and `jobs` parallel jobs."""
    work = COMPILE_SECONDS_CPU
    if n_cuda_archs:
        work += COMPILE_SECONDS_CUDA_HOST + COMPILE_SECONDS_CUDA_PER_ARCH * n_cuda_archs
    return work / max(1, jobs) + 20  # + linking


def encode_arch_list(arch_list):
    """'8.0;8.6 9.0+PTX' -> (['80', '86', '90'], ['90']): SASS and PTX architectures."""
    sass, ptx = [], []
    for entry in arch_list.replace(";", " ").replace(",", " ").split():
        name = entry.split("+")[0].replace(".", "").lower()
        if not name.rstrip("af").isdigit():
            raise ValueError(f"TORCH_CUDA_ARCH_LIST entry {entry!r} is not of the form 8.6, 9.0a or 9.0+PTX")
        sass.append(name)
        if entry.upper().endswith("+PTX"):
            ptx.append(name)
    return sass, ptx


def arch_list_for_devices(capabilities):
    """A TORCH_CUDA_ARCH_LIST for the GPUs of this machine: their architectures, PTX on the newest."""
    archs = sorted(set(capabilities))
    if not archs:
        return None
    parts = [f"{major}.{minor}" for major, minor in archs]
    parts[-1] += "+PTX"
    return ";".join(parts)


# Separates the architectures in the EDSC_EXT_CUDA_SASS/PTX macros and in _C.build_info().
ARCH_SEPARATOR = "_"


def arch_macros(arch_list):
    """Preprocessor definitions that record the architectures in the binary (see build_info()).

    Underscore-separated integers (75_80_90a) survive the shell and ninja unquoted; commas do not
    survive nvcc, which reads -DNAME=a,b as two definitions."""
    sass, ptx = encode_arch_list(arch_list)
    return [("EDSC_EXT_WITH_CUDA", None), ("EDSC_EXT_CUDA_SASS", ARCH_SEPARATOR.join(sass) or "0"),
            ("EDSC_EXT_CUDA_PTX", ARCH_SEPARATOR.join(ptx) or "0")]



def macro_flags(macros):
    return [f"-D{name}" if value is None else f"-D{name}={value}" for name, value in macros]


def arch_runs_on(sass, ptx, capability):
    """Whether a binary with these SASS/PTX architectures (['80', '90a', ...]) has code for a GPU
    of compute capability (major, minor): SASS of the same major and a minor not above the GPU's
    (an 'a' variant: only that exact GPU), or PTX of an architecture not above the GPU's."""
    major, minor = capability
    cc = major * 10 + minor

    def number(arch):
        digits = arch.rstrip("af")
        return int(digits) if digits.isdigit() else None

    def runs(arch, is_ptx):
        n = number(arch)
        if n is None:
            return False
        if arch.endswith("a"):  # architecture-specific code runs on that exact GPU only
            return n == cc
        # SASS runs on later minor revisions of its major; PTX is compiled for any later GPU.
        return n <= cc and (is_ptx or n // 10 == major)

    return any(runs(a, False) for a in sass) or any(runs(a, True) for a in ptx)


# --------------------------------------------------------------------------- sources and versions

def source_files(root, with_cuda):
    """The sources to compile, relative to root, sorted."""
    globs = CPU_SOURCE_GLOBS + (CUDA_SOURCE_GLOBS if with_cuda else ())
    files = []
    for pattern in globs:
        files += sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, pattern)))
    return files


def tracked_files(root):
    """Every file the build reads (sources and headers), relative to root: what a JIT build hashes."""
    files = set(source_files(root, with_cuda=True))
    for pattern in HEADER_GLOBS:
        files.update(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, pattern)))
    return sorted(files)


def sources_digest(root):
    """A short hash of every source and header the build reads (their paths and contents): which
    sources a binary was built from, so that a checkout can tell whether an installed build is its own."""
    import hashlib

    digest = hashlib.sha256()
    for rel in tracked_files(root):
        digest.update(rel.replace(os.sep, "/").encode() + b"\0")
        with open(os.path.join(root, rel), "rb") as f:
            digest.update(f.read())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def major_minor(version):
    """'2.14.1+cu130' -> (2, 14)."""
    match = re.match(r"(\d+)\.(\d+)", str(version))
    if not match:
        raise ValueError(f"not a version: {version!r}")
    return int(match.group(1)), int(match.group(2))


def cuda_tag(cuda_version):
    """'13.0' -> 'cu130'; None -> 'cpu'."""
    if not cuda_version:
        return "cpu"
    major, minor = major_minor(cuda_version)
    return f"cu{major}{minor}"


def local_version_label(cuda_version):
    """The wheel's local version label, 'cu130', 'cu128' or 'cpu': the CUDA toolkit of its kernels.
    No torch in it: the binary runs with every torch from STABLE_ABI_FLOOR on."""
    return cuda_tag(cuda_version)


# What a release publishes: one wheel per CUDA major (.github/workflows/wheels.yml), plus cpu.
RELEASE_LABELS = {"13": "cu130", "12": "cu128"}


def release_label(cuda_version):
    """The published wheel for a torch built with CUDA ``cuda_version`` (None: a CPU-only torch): its
    CUDA major's build, so that a CUDA 12.6 torch is sent to cu128, not to a cu126 page nobody publishes."""
    if not cuda_version:
        return "cpu"
    return RELEASE_LABELS.get(str(cuda_version).split(".")[0], local_version_label(cuda_version))


def torch_requirement():
    """The dependency a binary wheel declares: any torch from the stable-ABI floor on."""
    return "torch>={}.{}".format(*STABLE_ABI_FLOOR)


def build_meta_source(facts):
    """Text of edsc_ext/_build_meta.py: the build facts, readable without loading the binary."""
    lines = ['"""Generated by setup.py when the extension was built; do not edit (not in git)."""', ""]
    for key in sorted(facts):
        lines.append(f"{key.upper()} = {facts[key]!r}")
    return "\n".join(lines) + "\n"


def build_facts(version, build, with_cuda, toolkit, arch_list, **extra):
    """The facts a build records (read by edsc_ext._loader and build_info()), for every build path."""
    import torch

    sass, ptx = encode_arch_list(arch_list) if (with_cuda and arch_list) else ([], [])
    facts = {
        "version": version,
        "build": build,
        "torch_version": torch.__version__,
        "torch_floor": "{}.{}".format(*STABLE_ABI_FLOOR),
        "torch_cuda_version": torch.version.cuda,
        "with_cuda": with_cuda,
        "cuda_version": toolkit,
        "cuda_arch_list": arch_list,
        "cuda_sass_archs": sass,
        "cuda_ptx_archs": ptx,
    }
    facts.update(extra)
    return facts
