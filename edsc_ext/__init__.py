"""edsc_ext: adaptive deformable separable convolution for PyTorch, on CPU and CUDA.

    import edsc_ext
    out = edsc_ext.deform_sepconv(frame, vertical, horizontal, offset, mask,
                                  padding=2, padding_mode="border")

Importing loads the compiled kernels (registering torch.ops.edsc_ext.*). When they were built for
another torch or CUDA, the ImportError says what was built, what is installed and how to fix it.
EDSC_EXT_JIT=1 compiles them for the running torch instead (see edsc_ext.jit).
"""

import sys as _sys

import torch  # noqa: F401  (loads libtorch before the extension that links against it)

from . import _loader
from ._version import __version__ as _base_version

_C, _BUILD_META, _BUILD_KIND = _loader.load()  # registers torch.ops.edsc_ext.*
_sys.modules.setdefault(__name__ + "._C", _C)  # a JIT build has another module name

from . import (  # noqa: E402,F401
    _policy,  # noqa: E402
    nn,
    reference,
)
from ._policy import KernelPolicy, current_kernel_policy, kernel_policy  # noqa: E402,F401
from .ops import _plan, avg_pool2x, deform_sepconv, upsample_bilinear2x, vector_add  # noqa: E402,F401

_policy._install_initial()  # the EDSC_EXT_* environment switches, read once

__version__ = _BUILD_META.get("version") or _base_version
__all__ = ["deform_sepconv", "upsample_bilinear2x", "avg_pool2x", "vector_add", "kernel_policy", "KernelPolicy",
           "current_kernel_policy", "build_info", "nn", "reference", "__version__"]


def build_info() -> dict:
    """How the loaded extension was built.

    Keys: ``version``, ``build`` ('setuptools' or 'jit'), ``torch_version`` and ``torch_cuda_version``
    (the torch it was compiled against), ``with_cuda``, ``cuda_version`` (the toolkit), and
    ``cuda_sass_archs`` / ``cuda_ptx_archs`` (e.g. ['80', '90'], the GPU architectures it has
    machine code / PTX for), ``binary`` (the file loaded). The binary's own record
    (``_C.build_info()``) wins where both have a key.
    """
    info = dict(_BUILD_META)
    info.pop("python", None)
    info.update(dict(_C.build_info()))
    # The binary knows torch's x.y.z; the build meta the full version (e.g. 2.14.1+cu130).
    full = _BUILD_META.get("torch_version")
    if full and full.split("+")[0] == info.get("torch_version"):
        info["torch_version"] = full
    info["version"] = __version__
    info["build"] = _BUILD_KIND
    info["binary"] = getattr(_C, "__file__", None)
    info.setdefault("torch_cuda_version", None)
    for key in ("cuda_sass_archs", "cuda_ptx_archs"):
        value = info.get(key) or ""
        if isinstance(value, str):
            value = value.replace(",", "_").split("_")  # older binaries used commas
        info[key] = [a for a in value if a and a != "0"]
    return info
