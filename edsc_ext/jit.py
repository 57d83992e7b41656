"""JIT build: compile the extension's own sources for the running torch, on first use.

    EDSC_EXT_JIT=1 python train.py       # import edsc_ext compiles (once) instead of loading the wheel's binary
    EDSC_EXT_JIT=auto python train.py    # only when the prebuilt binary does not fit the installed torch

:func:`load` builds with ``torch.utils.cpp_extension.load`` (ninja) from the checkout's ``src/`` and
``include/`` or, in an installed wheel, the copy shipped in ``edsc_ext/_csrc``. The build folder
is cached per Python, torch, CUDA and architecture list (``EDSC_EXT_JIT_CACHE``, default
``~/.cache/torch_extensions/edsc_ext``); ninja tracks every source and header, so a later call
recompiles only what changed and is instant when nothing did.

CUDA kernels are built when torch has CUDA and a toolkit whose major version matches is found
(``CUDA_HOME``, ``/usr/local/cuda``, or ``nvcc`` on ``PATH``), for ``TORCH_CUDA_ARCH_LIST`` or else
the visible GPUs' architectures (none visible: ``_build_support.NO_GPU_ARCH_LIST``); otherwise the
build is CPU-only and says why. ``EDSC_EXT_CPU_ONLY=1``
and ``EDSC_EXT_FORCE_CUDA=1`` work as for setup.py.
"""

import hashlib
import os
import sys
import warnings

import torch

from . import _build_support as bs
from ._version import __version__ as BASE_VERSION

__all__ = ["load", "source_root", "build_directory", "last_build_facts"]

MODULE_NAME = "edsc_ext_jit"
_loaded = None  # (module, facts) once built and loaded in this process
_last_facts = {}


def source_root():
    """The folder holding src/ and include/: the checkout, or the copy inside the installed package."""
    package = os.path.dirname(os.path.abspath(__file__))
    for root in (os.path.dirname(package), os.path.join(package, bs.SHIPPED_SOURCES_DIR)):
        if os.path.isfile(os.path.join(root, "src", "registration.cpp")) and os.path.isdir(
                os.path.join(root, "include", "edsc_ext")):
            return root
    raise RuntimeError("edsc_ext.jit: the C++/CUDA sources are not installed with this package; reinstall "
                       "edsc-ext from a wheel or a checkout (they ship src/ and include/)")


def _cache_root():
    root = os.environ.get("EDSC_EXT_JIT_CACHE") or os.path.join(
        os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions"),
        "edsc_ext")
    return os.path.abspath(root)


def visible_gpu_capabilities():
    """Compute capabilities [(major, minor), ...] of the GPUs this process sees."""
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]


def _plan():
    """What to build: with_cuda, why, cuda_home, arch_list, toolkit version."""
    cpu_only = bs.flag("EDSC_EXT_CPU_ONLY")
    if cpu_only and bs.flag("EDSC_EXT_FORCE_CUDA"):
        raise RuntimeError("EDSC_EXT_FORCE_CUDA=1 and EDSC_EXT_CPU_ONLY=1 contradict each other: set one")
    cuda_home = None if cpu_only else bs.find_cuda_home()
    with_cuda, why = bs.decide_cuda(torch.version.cuda, cuda_home, cpu_only)
    if bs.flag("EDSC_EXT_FORCE_CUDA") and not with_cuda:
        raise RuntimeError(f"EDSC_EXT_FORCE_CUDA=1 but CUDA kernels cannot be built: {why}")
    arch_list, toolkit = None, None
    if with_cuda:
        arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST") or bs.source_arch_list(visible_gpu_capabilities())[0]
        nvcc = bs.nvcc_version(cuda_home)
        toolkit = f"{nvcc[0]}.{nvcc[1]}" if nvcc else torch.version.cuda
    return with_cuda, why, cuda_home, arch_list, toolkit


def build_directory(with_cuda=None, arch_list=None):
    """The cache folder for this Python/torch/CUDA/architecture combination."""
    if with_cuda is None:
        with_cuda, _, _, arch_list, _ = _plan()
    flavour = f"{bs.cuda_tag(torch.version.cuda)}" if with_cuda else "cpu"
    key = hashlib.sha256(repr((arch_list, bs.CXX_FLAGS, bs.NVCC_FLAGS, sys.executable)).encode()).hexdigest()[:10]
    name = "py{}{}_torch{}_{}_{}".format(*sys.version_info[:2], torch.__version__.replace("+", "_"), flavour, key)
    return os.path.join(_cache_root(), name)


def last_build_facts():
    """The build facts of the JIT build loaded in this process (same keys as edsc_ext.build_info())."""
    return dict(_last_facts)


def load(verbose=False):
    """Compile (or reuse the cached build of) the extension for the running torch and load it.

    Returns the compiled module (its ops are registered under torch.ops.edsc_ext). At most one
    build of the extension can be loaded into a process: set EDSC_EXT_JIT=1 before importing
    edsc_ext rather than calling this after the prebuilt binary was loaded.
    """
    global _loaded, _last_facts
    if _loaded is not None:
        return _loaded[0]
    prebuilt = sys.modules.get("edsc_ext._C")
    if prebuilt is not None and getattr(prebuilt, "__name__", "") != MODULE_NAME:
        raise RuntimeError("edsc_ext.jit.load(): the prebuilt extension is already loaded in this process "
                           "(its ops are registered); set EDSC_EXT_JIT=1 before `import edsc_ext` instead")

    from torch.utils import cpp_extension

    root = source_root()
    with_cuda, why, cuda_home, arch_list, toolkit = _plan()
    if not with_cuda and torch.version.cuda is not None and not bs.flag("EDSC_EXT_CPU_ONLY"):
        warnings.warn(f"edsc_ext.jit: building CPU-only kernels: {why}", RuntimeWarning, stacklevel=2)
    directory = build_directory(with_cuda, arch_list)
    os.makedirs(directory, exist_ok=True)

    macros = bs.stable_abi_macros() + (bs.arch_macros(arch_list) if with_cuda else [])
    sources = [os.path.join(root, s) for s in bs.source_files(root, with_cuda)]
    include_dirs = [os.path.join(root, d) for d in bs.INCLUDE_DIRS] + (bs.pip_cuda_include_dirs() if with_cuda else [])
    saved = {k: os.environ.get(k) for k in ("TORCH_CUDA_ARCH_LIST", "CUDA_HOME")}
    saved_cuda_home = cpp_extension.CUDA_HOME
    try:
        if with_cuda:
            # torch reads the architectures from the environment, and CUDA_HOME once at import.
            os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list
            os.environ["CUDA_HOME"] = cuda_home
            cpp_extension.CUDA_HOME = cuda_home
        if verbose:
            print(f"edsc_ext.jit: building {'CPU + CUDA' if with_cuda else 'CPU-only'} kernels ({why}) in "
                  f"{directory}", file=sys.stderr)
        module = cpp_extension.load(
            name=MODULE_NAME,
            sources=sources,
            extra_cflags=list(bs.CXX_FLAGS) + bs.macro_flags(macros),
            extra_cuda_cflags=list(bs.NVCC_FLAGS) + bs.macro_flags(macros),
            extra_include_paths=include_dirs,
            build_directory=directory,
            with_cuda=with_cuda,
            verbose=verbose,
        )
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        cpp_extension.CUDA_HOME = saved_cuda_home
    _last_facts = bs.build_facts(BASE_VERSION, "jit", with_cuda, toolkit, arch_list, build_directory=directory,
                                 sources=root)
    _loaded = (module, _last_facts)
    return module
