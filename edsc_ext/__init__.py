"""edsc_ext: adaptive deformable separable convolution for PyTorch, on CPU and CUDA.

    import edsc_ext
    out = edsc_ext.deform_sepconv(frame, vertical, horizontal, offset, mask,
                                  padding=2, padding_mode="border")
"""

import torch  # noqa: F401  (loads libtorch before the extension that links against it)

from . import _C  # registers torch.ops.edsc_ext.*
from . import nn, reference  # noqa: F401
from .ops import deform_sepconv, vector_add

__version__ = "0.1.0"
__all__ = ["deform_sepconv", "vector_add", "build_info", "nn", "reference", "__version__"]


def build_info() -> dict:
    """How the compiled extension was built: torch and CUDA versions, GPU architectures."""
    info = dict(_C.build_info())
    info["version"] = __version__
    info["cuda_sass_archs"] = [a for a in info.get("cuda_sass_archs", "").split(",") if a and a != "0"]
    info["cuda_ptx_archs"] = [a for a in info.get("cuda_ptx_archs", "").split(",") if a and a != "0"]
    return info
