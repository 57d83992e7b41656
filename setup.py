"""Builds edsc_ext._C: the CPU and (when a CUDA toolkit is found) CUDA kernels plus the pybind11
module, as one binary.

Environment:
  EDSC_EXT_FORCE_CUDA=1   fail instead of falling back to a CPU-only build when CUDA is missing
  EDSC_EXT_CPU_ONLY=1     build the CPU kernels only
  TORCH_CUDA_ARCH_LIST    architectures to compile for (default: see DEFAULT_ARCH_LISTS)
  CUDA_HOME               toolkit root; detected when unset (see find_cuda_home)
  MAX_JOBS                parallel compile jobs (ninja)
"""

import glob
import os
import shutil
import subprocess
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _is_cuda_root(path):
    return bool(path) and os.path.isfile(os.path.join(path, "bin", "nvcc")) and os.path.isfile(
        os.path.join(path, "include", "cuda_runtime.h"))


def find_cuda_home():
    """The CUDA toolkit root, or None.

    torch guesses CUDA_HOME from `which nvcc`; where nvcc is a wrapper script (/usr/local/bin/nvcc)
    that guess is /usr/local, which has no CUDA headers. So take CUDA_HOME/CUDA_PATH when they point
    at a toolkit, then /usr/local/cuda, then nvcc's own location.
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if _is_cuda_root(os.environ.get(var)):
            return os.environ[var]
    if _is_cuda_root("/usr/local/cuda"):
        return "/usr/local/cuda"
    nvcc = shutil.which("nvcc")
    if nvcc:
        root = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        if _is_cuda_root(root):
            return root
    candidates = sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    return next((c for c in candidates if _is_cuda_root(c)), None)


def _flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


FORCE_CUDA = _flag("EDSC_EXT_FORCE_CUDA")
CPU_ONLY = _flag("EDSC_EXT_CPU_ONLY")
if FORCE_CUDA and CPU_ONLY:
    sys.exit("EDSC_EXT_FORCE_CUDA=1 and EDSC_EXT_CPU_ONLY=1 contradict each other: set one")

_cuda_home = None if CPU_ONLY else find_cuda_home()
if _cuda_home:
    # Must be set before torch.utils.cpp_extension is imported: it reads CUDA_HOME once.
    os.environ["CUDA_HOME"] = _cuda_home

import torch  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402

# Real machine code for each architecture plus PTX for the newest, so future GPUs still run.
DEFAULT_ARCH_LISTS = {
    12: "7.5;8.0;8.6;8.9;9.0+PTX",
    13: "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX",
}


def _nvcc_version(cuda_home):
    out = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"], capture_output=True, text=True)
    for token in out.stdout.replace(",", " ").split():
        if token.startswith("V") and token[1:2].isdigit():
            return tuple(int(x) for x in token[1:].split(".")[:2])
    return None


def _pip_cuda_include_dirs():
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


def _decide_cuda():
    if CPU_ONLY:
        return False, "EDSC_EXT_CPU_ONLY=1"
    if torch.version.cuda is None:
        return False, f"torch {torch.__version__} has no CUDA support"
    if not _cuda_home:
        return False, "no CUDA toolkit found (set CUDA_HOME to a folder with bin/nvcc)"
    nvcc = _nvcc_version(_cuda_home)
    torch_major = int(torch.version.cuda.split(".")[0])
    if nvcc and nvcc[0] != torch_major:
        return False, (f"nvcc {nvcc[0]}.{nvcc[1]} in {_cuda_home} does not match the CUDA {torch.version.cuda} "
                       f"torch was built with")
    return True, f"CUDA {torch.version.cuda}, toolkit {_cuda_home}"


def _encode_arch_list(arch_list):
    """'8.0;8.6 9.0+PTX' -> ('80,86,90', '90'): the SASS and PTX architectures as integers."""
    sass, ptx = [], []
    for entry in arch_list.replace(";", " ").replace(",", " ").split():
        name = entry.split("+")[0].replace(".", "").lower()
        if not name.rstrip("af").isdigit():
            sys.exit(f"TORCH_CUDA_ARCH_LIST entry {entry!r} is not of the form 8.6, 9.0a or 9.0+PTX")
        sass.append(name)
        if entry.upper().endswith("+PTX"):
            ptx.append(name)
    return ",".join(sass), ",".join(ptx) or "0"


def make_extension():
    with_cuda, why = _decide_cuda()
    if FORCE_CUDA and not with_cuda:
        sys.exit(f"EDSC_EXT_FORCE_CUDA=1 but CUDA kernels cannot be built: {why}")
    print(f"edsc_ext: building {'CPU + CUDA' if with_cuda else 'CPU-only'} kernels ({why})", flush=True)

    sources = sorted(glob.glob(os.path.join("src", "*.cpp")) + glob.glob(os.path.join("src", "cpu", "*.cpp")))
    include_dirs = [os.path.join(ROOT, "include")]
    cxx_flags = ["-O3"]  # the C++ standard is the one torch.utils.cpp_extension picks for this torch
    define_macros = []
    if not with_cuda:
        return CppExtension("edsc_ext._C", sources, include_dirs=include_dirs,
                            extra_compile_args={"cxx": cxx_flags}, define_macros=define_macros)

    if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        major = int(torch.version.cuda.split(".")[0])
        os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCH_LISTS.get(major, DEFAULT_ARCH_LISTS[13])
    arch_list = os.environ["TORCH_CUDA_ARCH_LIST"]
    print(f"edsc_ext: TORCH_CUDA_ARCH_LIST={arch_list}", flush=True)
    sources += sorted(glob.glob(os.path.join("src", "cuda", "*.cu")))
    include_dirs += _pip_cuda_include_dirs()
    sass, ptx = _encode_arch_list(arch_list)
    # Comma-separated integers survive the shell and ninja unquoted; src/deform_sepconv.cpp turns
    # them back into strings for build_info().
    define_macros += [("EDSC_EXT_WITH_CUDA", None), ("EDSC_EXT_CUDA_SASS", sass), ("EDSC_EXT_CUDA_PTX", ptx)]
    nvcc_flags = ["-O3", "-lineinfo"]
    if _flag("EDSC_EXT_PTXAS_VERBOSE"):
        nvcc_flags.append("-Xptxas=-v")
    return CUDAExtension("edsc_ext._C", sources, include_dirs=include_dirs, define_macros=define_macros,
                         extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags})


setup(
    packages=find_packages(include=["edsc_ext", "edsc_ext.*"]),
    ext_modules=[make_extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=shutil.which("ninja") is not None)},
)
