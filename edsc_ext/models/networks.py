"""The EDSC networks (Cheng & Chen, TPAMI 2021) on top of :mod:`edsc_ext`, checkpoint-compatible.

``EDSC(kernel_size=5, multiple=False)`` is EDSC_s (the midpoint between two frames);
``multiple=True`` is EDSC_m, which interpolates at any time ``t`` in (0, 1). Their ``state_dict``
keys and shapes are those of the released checkpoints (which hold it under ``'model_state'``), so
:func:`load_checkpoint` reads them directly.

Conventions of the original (the released weights expect them): frames are (N, 3, H, W) in [0, 1],
BGR channel order (OpenCV's), H and W multiples of 32 (:meth:`EDSC.interpolate` pads and crops
for you).

``sampling="compat"`` (the default) reproduces the original layer exactly (taps one pixel up-left of
centred, border pixels counted twice past the frame; see :mod:`edsc_ext.models.compat`): use it with the
released weights. ``sampling="clean"`` uses :func:`edsc_ext.deform_sepconv` with centred taps and
plain replicate padding, for networks trained with this package.

``fused=True`` (the default) runs the same function faster: each heterogeneous convolution as
fewer convolutions (on CUDA one dense 3x3, its re-parameterisation), and the eleven heads as a few
wide and grouped convolutions whose weights are the per-head parameters concatenated at run time
(see :meth:`EDSC.fused_heads`). Nothing is stored twice: the state dict, training and checkpoints
see only the original parameters. ``fused=False`` (or setting ``model.fused``) is the original
code's composition, module by module. :meth:`EDSC.capture` replays a fixed-shape inference as a
CUDA graph; :func:`compile_edsc` is the compiled recipe (torch.compile of a function entering autocast,
replayed as CUDA graphs).

The speed options of issue #43 are explicit arguments (``tools/network_variants.py`` times them all in
one run): ``half_upsampling`` (bilinear upsampling in the activations' half type under autocast, not
float32), ``conv_relu`` (inference: cuDNN's fused convolution, bias and ReLU) and ``upsampling_kernel``
(on CUDA :func:`edsc_ext.upsample_bilinear2x` rather than ATen's kernel) with ``pooling_kernel`` (the same for
the average poolings, :func:`edsc_ext.avg_pool2x`), on by default since each
measured faster on its own; ``head_layout="wide"`` (the eleven heads' first convolutions as one),
``head_tails`` (the heads' upsamplings and last convolutions merged across heads),
``cache_weights`` (inference: the fused weights kept while the parameters are unchanged; on in the
tools) and :func:`compile_edsc`'s ``cudnn_benchmark``, ``freezing`` and ``max_autotune``, off. The
``DEFAULT_*`` constants below are the defaults: switching one is its line.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import os
import sys
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..ops import avg_pool2x, deform_sepconv, natively_supported, upsample_bilinear2x
from .compat import compat_deform_sepconv

__all__ = ["HetConv2d", "EDSC", "EDSC_s", "EDSC_m", "CapturedEDSC", "CompiledEDSC", "compile_edsc",
           "cudnn_autotuning", "load_checkpoint", "save_checkpoint", "read_checkpoint", "CheckpointError",
           "state_dict_of", "pad_to_multiple", "auto_head_layout", "upsample2x", "downsample2x", "SAMPLINGS",
           "MODEL_NAMES", "HEAD_LAYOUTS", "HEAD_TAILS", "SIZE_MULTIPLE", "UPSAMPLING_KERNELS", "POOLING_KERNELS"]

SAMPLINGS = ("compat", "clean")
# How the fused heads run: "grouped" (the first layers as one convolution, the others grouped),
# "block_diagonal" (as grouped, but the last two layers, whose heads have few and odd channel counts,
# as one dense convolution with zeros off the heads' blocks: more arithmetic, no grouped kernel, which
# some backends run slowly), "per_head" (one head at a time, as unfused: oneDNN, the CPU's backend,
# runs the heads' separate convolutions faster than wide or grouped ones; there the arithmetic, not
# the number of calls, bounds the time), "padded" (per_head with each head's odd channel counts (k,
# k*k, 3, EDSC_m's 65 inputs), and the 6 input channels of the trunk's first convolution, rounded up to
# a multiple of CHANNEL_MULTIPLE by zero weights: cuDNN's tensor-core convolutions want channels in
# multiples of 8 and otherwise pad copies of the tensors or take slower engines), or "auto": padded for
# inference and compiled training on CUDA, per_head otherwise (auto_head_layout; BENCHMARKS.md, issue #20).
# "wide" runs the first layers of all heads as one convolution (64 -> 11 x 64 channels: one GEMM wide enough
# for the tensor cores, where eleven 64-wide ones reach a quarter of their rate) and the rest of each head
# as "padded"; "wide_grouped" also runs the second layers as one grouped convolution (issue #43).
HEAD_LAYOUTS = ("auto", "grouped", "block_diagonal", "per_head", "padded", "wide", "wide_grouped")
# The layouts whose trunk's first convolution reads 8 channels (the frames' 6 and 2 zero ones).
PADDED_LAYOUTS = ("padded", "wide", "wide_grouped")
# The defaults of issue #43's speed options, each a one-line switch once the H200 has measured it
# (tools/network_variants.py): what head_layout="auto" runs on CUDA for inference and for compiled
# training, and the EDSC arguments half_upsampling, conv_relu and cache_weights; compile_edsc's and
# EDSC.capture's cudnn_benchmark, and compile_edsc's freezing.
# On: what measured faster on its own on the H200 for inference (BENCHMARKS.md, issue #43). Off: the wide
# layout (slower on its own, twice the peak memory), cache_weights (an edit through .data would go unseen: the
# tools, whose weights never change, turn it on), cudnn_benchmark (no gain measured) and freezing (a compiled
# model would ignore later weight updates).
DEFAULT_CUDA_INFERENCE_HEAD_LAYOUT = "padded"
DEFAULT_CUDA_COMPILED_TRAINING_HEAD_LAYOUT = "padded"
DEFAULT_HALF_UPSAMPLING = True
# What runs the bilinear upsamplings on CUDA (upsample2x): "edsc_ext" (edsc_ext.upsample_bilinear2x) or
# "aten" (F.interpolate).
UPSAMPLING_KERNELS = ("edsc_ext", "aten")
DEFAULT_UPSAMPLING_KERNEL = "edsc_ext"
# What runs the U-Net's 2x2 average poolings on CUDA (downsample2x): "edsc_ext" (edsc_ext.avg_pool2x) or "aten"
# (F.avg_pool2d).
POOLING_KERNELS = ("edsc_ext", "aten")
DEFAULT_POOLING_KERNEL = "edsc_ext"
DEFAULT_CONV_RELU = True
# How the padded layouts run the heads' tails (the bilinear upsampling and the last convolution, at full
# resolution): "per_head" (each head its own upsampling and convolution), "merged_narrow" (the heads of
# CHANNEL_MULTIPLE padded channels, the four kernel heads and the bias head, as one upsampling and one dense
# block-diagonal convolution: cuDNN runs an 8-channel convolution at 6x its roofline, issue #43) or "merged"
# (the wider heads, offsets and masks, too, as one upsampling and one grouped convolution).
HEAD_TAILS = ("per_head", "merged_narrow", "merged")
DEFAULT_HEAD_TAILS = "per_head"
DEFAULT_CACHE_WEIGHTS = False
DEFAULT_CUDNN_BENCHMARK = False
DEFAULT_FREEZING = False
CHANNEL_MULTIPLE = 8
MODEL_NAMES = ("EDSC_s", "EDSC_m")
# Five 2x average poolings down to the bottleneck.
SIZE_MULTIPLE = 32


def block_diagonal(weight: Tensor, groups: int) -> Tensor:
    """The dense weight (out, in, *kernel) of a grouped convolution's weight (out, in/groups, *kernel):
    group g's block on the diagonal, exact zeros elsewhere (differentiable in ``weight``)."""
    out_channels, in_per_group = weight.shape[:2]
    kernel = weight.shape[2:]
    if out_channels % groups:
        raise ValueError(f"weight's {out_channels} output channels are not divisible by groups={groups}")
    blocks = weight.reshape(groups, out_channels // groups, 1, in_per_group, *kernel)
    blocks = blocks.expand(groups, out_channels // groups, groups, in_per_group, *kernel)
    on_diagonal = torch.eye(groups, dtype=torch.bool, device=weight.device)
    on_diagonal = on_diagonal.reshape(groups, 1, groups, 1, *(1,) * len(kernel))
    # where, not a product with the identity: a non-finite weight stays in its own block.
    return torch.where(on_diagonal, blocks, 0).reshape(out_channels, groups * in_per_group, *kernel)


def _autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype autocast casts convolutions to on ``device_type`` now, or None where it is off (or has no
    autocast: meta tensors)."""
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type autocast does not know
        return None
    return torch.get_autocast_dtype(device_type) if enabled else None


def _cached(owner: nn.Module, slot, params: Sequence[Tensor], make: Callable[[], Tuple[Tensor, ...]]
            ) -> Tuple[Tensor, ...]:
    """``make()``, the fused weights of ``owner`` computed from ``params``; with ``owner.cache_weights``
    in inference (no gradients, not traced by torch.compile), the value of an earlier call instead,
    already in autocast's dtype, while every parameter keeps its storage and version counter (an
    optimizer step, ``load_state_dict`` or any in-place update bumps it; writes through ``.data`` do not,
    and may then be missed: call :meth:`EDSC.clear_weight_cache` after those)."""
    if not getattr(owner, "cache_weights", False) or torch.is_grad_enabled() or _is_compiling():
        return make()
    device_type = params[0].device.type
    dtype = _autocast_dtype(device_type)
    key = (dtype,) + tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
    cache: Dict = owner.__dict__.setdefault("_weight_cache", {})
    hit = cache.get(slot)
    if hit is not None and hit[0] == key:
        return hit[1]
    value = tuple(v if v is None else v.detach() for v in make())
    if dtype is not None:
        value = tuple(v.to(dtype) if v is not None and v.is_floating_point() else v for v in value)
    # Kept in the parameters' memory format (a channels_last model's convolutions would copy others each call).
    formats = {_memory_format(p) for p in params if p.dim() == 4 and p.shape[2] * p.shape[3] > 1}
    if formats == {torch.channels_last}:
        value = tuple(v.contiguous(memory_format=torch.channels_last) if v is not None and v.dim() == 4 else v
                      for v in value)
    cache[slot] = (key, value)
    return value


def _stride_order_equal(a: Sequence[int], b: Sequence[int], shape: Sequence[int]) -> bool:
    return all(x == y for x, y, n in zip(a, b, shape) if n > 1)


# The op is defined with torch.library.Library rather than torch.library.custom_op: custom_op wraps its
# kernel in torch._disable_dynamo, whose first call imports torch._dynamo (sympy and the rest), seconds of
# the video tool's start-up on a cold disk that no compilation asked for. _outside_dynamo keeps the kernel
# out of Dynamo's tracing as that wrapper does, once Dynamo is there to trace.
_MODELS_LIBRARY = torch.library.Library("edsc_ext_models", "DEF")
_MODELS_LIBRARY.define("conv2d_relu(Tensor input, Tensor weight, Tensor bias, SymInt padding, SymInt groups) -> Tensor",
                       tags=(torch.Tag.pt2_compliant_tag,))


def _outside_dynamo(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``fn`` run as a kernel that Dynamo does not trace into (``torch.compiler.disable``), without
    importing Dynamo: while torch._dynamo is not imported, nothing is compiling, so ``fn`` runs as it is."""
    disabled = None

    @functools.wraps(fn)
    def kernel(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            if "torch._dynamo" not in sys.modules:
                return fn(*args, **kwargs)
            disabled = torch.compiler.disable(fn, recursive=True)
        return disabled(*args, **kwargs)

    return kernel


def _conv2d_relu_kernel(input: Tensor, weight: Tensor, bias: Tensor, padding: int, groups: int) -> Tensor:
    """relu(conv2d(input, weight, bias)), stride 1: on CUDA cuDNN's fused convolution, bias and ReLU
    (``torch.cudnn_convolution_relu``: one kernel, no separate ReLU pass over the output); elsewhere the
    two operators. The output is in the input's memory format (as :func:`_conv2d_relu_fake` says).
    (torch builds it as cuDNN's conv + 0 * z + bias -> ReLU with z its own uninitialised output; the CUDA
    test leaves NaN where that output lands, so a kernel that read z would fail it.)"""
    memory_format = _memory_format(input)
    if input.is_cuda and torch.backends.cudnn.is_available():
        out = torch.cudnn_convolution_relu(input.contiguous(memory_format=memory_format),
                                           weight.contiguous(memory_format=memory_format), bias,
                                           [1, 1], [padding, padding], [1, 1], groups)
    else:
        out = F.relu(F.conv2d(input, weight, bias, padding=padding, groups=groups))
    wanted = torch.empty(out.shape, device="meta", memory_format=memory_format).stride()
    if out.stride() == wanted:
        return out
    if _stride_order_equal(out.stride(), wanted, out.shape):  # only the strides of size-1 dims differ
        return out.as_strided(out.shape, wanted)
    return out.contiguous(memory_format=memory_format)


_MODELS_LIBRARY.impl("conv2d_relu", _outside_dynamo(_conv2d_relu_kernel), "CompositeExplicitAutograd")
_conv2d_relu_op = torch.ops.edsc_ext_models.conv2d_relu.default


def _conv2d_relu_backward(ctx, grad: Tensor):
    raise RuntimeError("edsc_ext_models::conv2d_relu has no gradient: it is for inference (the networks call it "
                       "only without gradients); for training use F.relu(F.conv2d(...))")


torch.library.register_autograd("edsc_ext_models::conv2d_relu", _conv2d_relu_backward, lib=_MODELS_LIBRARY)


@torch.library.register_fake("edsc_ext_models::conv2d_relu", lib=_MODELS_LIBRARY)
def _conv2d_relu_fake(input: Tensor, weight: Tensor, bias: Tensor, padding: int, groups: int) -> Tensor:
    n, _, h, w = input.shape
    out_h, out_w = h + 2 * padding - weight.shape[2] + 1, w + 2 * padding - weight.shape[3] + 1
    return torch.empty((n, weight.shape[0], out_h, out_w), dtype=input.dtype, device=input.device,
                       memory_format=_memory_format(input))


def _register_conv2d_relu_flops(flop_counter) -> None:
    """FlopCounterMode counts ``conv2d_relu`` as the convolution it is (the ReLU's comparisons are not
    FLOPs there either), so the networks' FLOP figures do not depend on ``conv_relu``."""
    target = torch.ops.edsc_ext_models.conv2d_relu
    if target in flop_counter.flop_registry:  # a reload of this module
        return

    @flop_counter.register_flop_formula(target)
    def _conv2d_relu_flops(x_shape, w_shape, _bias, _padding, _groups, *, out_shape=None, **kwargs) -> int:
        return flop_counter.conv_flop_count(x_shape, w_shape, out_shape, transposed=False)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``action(module)`` once module ``name`` has been imported: importing
    torch.utils.flop_counter loads Triton, which the video tool's start-up should not pay
    for a FLOP formula that only FlopCounterMode reads (and it copies the registry when it is made, so an
    import of the module is early enough)."""

    def __init__(self, name: str, action: Callable[[Any], None]) -> None:
        self.name, self.action = name, action

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # find the real spec with the other finders, then wrap its loader
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module, action = spec.loader.exec_module, self.action

        def exec_then_act(module) -> None:
            exec_module(module)
            action(module)

        spec.loader.exec_module = exec_then_act
        return spec


def _when_imported(name: str, action: Callable[[Any], None]) -> None:
    module = sys.modules.get(name)
    if module is not None:
        action(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, action))


_when_imported("torch.utils.flop_counter", _register_conv2d_relu_flops)


def conv2d_relu(x: Tensor, weight: Tensor, bias: Tensor, padding: int, groups: int = 1) -> Tensor:
    """``relu(conv2d(x, weight, bias, padding=padding, groups=groups))`` as one fused call (see
    :func:`_conv2d_relu_op`), for inference: it has no gradient. Under autocast, in autocast's dtype, as
    ``F.conv2d`` would run."""
    dtype = _autocast_dtype(x.device.type)
    if dtype is not None:
        x, weight, bias = x.to(dtype), weight.to(dtype), bias.to(dtype)
    # The weight in the input's memory format here, where torch.compile fuses it into the weight's making
    # (or folds it, frozen), rather than a copy inside the op on every call.
    return _conv2d_relu_op(x, weight.contiguous(memory_format=_memory_format(x)), bias, padding, groups)


class HetConv2d(nn.Module):
    """The "efficient heterogeneous" convolution of EDSC: a grouped KxK convolution with ``p`` groups,
    plus a 1x1 convolution, minus a grouped 1x1 convolution (which the 1x1 already contains).

    The three are linear in the input, so they are one dense KxK convolution whose centre tap holds
    the 1x1 terms (:meth:`folded_weight`, computed from the parameters on every call, so it is never
    stale and gradients reach the original parameters). ``fused=True`` (the default) runs
    :meth:`forward_folded` on accelerators, where the dense convolution is faster, and
    :meth:`forward_grouped_and_1x1` on the CPU, where the dense one's ``p``-fold arithmetic costs
    more than the extra pass; ``fused=False`` runs the original's three convolutions
    (:meth:`forward_unfused`). ``cache_weights`` (set by :class:`EDSC`) keeps the folded weights for
    inference while the parameters are unchanged (see :func:`_cached`).
    """

    def __init__(self, in_channels: int, out_channels: int, p: int = 4, kernel_size: int = 3, padding: int = 1):
        super().__init__()
        if in_channels % p or out_channels % p:
            raise ValueError(f"in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible "
                             f"by p={p}")
        if kernel_size % 2 == 0 or padding != kernel_size // 2:
            raise ValueError(f"kernel_size must be odd and padding kernel_size // 2 (the 1x1 terms sit at the "
                             f"centre tap), got kernel_size={kernel_size}, padding={padding}")
        self.groups = p
        self.fused = True
        self.cache_weights = False
        # The attribute names are the checkpoints' keys.
        self.conv3x3 = nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding, groups=p)
        self.conv1x1_ = nn.Conv2d(in_channels, out_channels, 1, groups=p)
        self.conv1x1 = nn.Conv2d(in_channels, out_channels, 1)

    def extra_repr(self) -> str:
        return f"fused={self.fused}"

    def _centre(self) -> Tuple[int, int, int, int]:
        """F.pad's sides that put a 1x1 weight at the centre tap of the KxK one."""
        half = self.conv3x3.kernel_size[0] // 2
        return (half, half, half, half)

    def folded_weight(self) -> Tuple[Tensor, Tensor]:
        """(weight, bias) of the one dense KxK convolution equal to this module."""
        grouped = self.conv3x3.weight - F.pad(self.conv1x1_.weight, self._centre())
        weight = block_diagonal(grouped, self.groups) + F.pad(self.conv1x1.weight, self._centre())
        bias = self.conv3x3.bias + self.conv1x1.bias - self.conv1x1_.bias
        return weight, bias

    def forward_unfused(self, x: Tensor) -> Tensor:
        """The original's three convolutions."""
        return self.conv3x3(x) + self.conv1x1(x) - self.conv1x1_(x)

    def dense_weight(self) -> Tuple[Tensor, Tensor]:
        """:meth:`folded_weight`, or its cached value (``cache_weights``, inference)."""
        return _cached(self, "folded", list(self.parameters()), self.folded_weight)

    def forward_folded(self, x: Tensor) -> Tensor:
        """One dense KxK convolution (:meth:`folded_weight`)."""
        weight, bias = self.dense_weight()
        return F.conv2d(x, weight, bias, padding=self.conv3x3.padding)

    def forward_grouped_and_1x1(self, x: Tensor) -> Tensor:
        """The grouped KxK convolution plus one dense 1x1 convolution holding both 1x1 terms."""
        def make():
            pointwise = self.conv1x1.weight - block_diagonal(self.conv1x1_.weight, self.groups)
            return self.conv3x3.weight, pointwise, self.conv3x3.bias + self.conv1x1.bias - self.conv1x1_.bias

        grouped, pointwise, bias = _cached(self, "grouped_and_1x1", list(self.parameters()), make)
        return torch.add(F.conv2d(x, grouped, bias, padding=self.conv3x3.padding, groups=self.groups),
                         F.conv2d(x, pointwise))

    def forward(self, x: Tensor) -> Tensor:
        if not self.fused:
            return self.forward_unfused(x)
        if x.device.type == "cpu":
            return self.forward_grouped_and_1x1(x)
        return self.forward_folded(x)


def check_frames(first: Tensor, second: Tensor) -> None:
    """The networks' input: two frames (N, 3, H, W) of one shape, BGR as the released weights expect."""
    if first.shape != second.shape or first.dim() != 4 or first.shape[1] != 3:
        raise ValueError(f"first and second must be (N, 3, H, W) BGR frames of one shape, got {tuple(first.shape)} "
                         f"and {tuple(second.shape)}")


def check_time(time, *, read_device_values: bool = False) -> None:
    """Raises a ValueError naming ``time`` unless it (a number, or each value of a tensor or a list) lies in (0, 1),
    strictly between the two frames. A tensor's values are read where that costs no device sync (on the
    CPU, outside torch.compile and export tracing); ``read_device_values`` reads a GPU tensor's too."""
    if time is None:
        return
    kind = "tensor"
    if isinstance(time, (list, tuple)):
        kind, time = type(time).__name__, torch.as_tensor(time, dtype=torch.float64)
    if isinstance(time, Tensor):
        if type(time) is not Tensor or _is_compiling() or (time.device.type != "cpu" and not read_device_values):
            return
        outside = ~((time > 0) & (time < 1))  # NaN compares False: outside
        if bool(outside.any()):
            first = time[outside][0].item()
            raise ValueError(f"time must be in (0, 1) (strictly between the two frames), got {first!r} in a {kind} "
                             f"of shape {tuple(time.shape)}")
    elif not 0 < time < 1:
        raise ValueError(f"time must be in (0, 1) (strictly between the two frames), got {float(time)!r}")


def _is_compiling() -> bool:
    is_compiling = getattr(torch.compiler, "is_compiling", None)  # torch >= 2.3
    return bool(is_compiling()) if is_compiling is not None else torch._dynamo.is_compiling()


def _is_exporting() -> bool:
    # The flag behind torch.compiler.is_exporting(), read directly: before torch 2.13, dynamo folds the
    # function itself to True under any torch.compile, which sent compiled CUDA training back to the
    # native upsampling's atomic backward. A module global reads as what it is, guarded, in both.
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    if flag is not None:
        return bool(flag)
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    return bool(is_exporting()) if is_exporting is not None else False


def _upsample_axis_by_slices(x: Tensor, dim: int) -> Tensor:
    """``x`` upsampled 2x along ``dim`` (bilinear, corners aligned) with slices and products only.

    With n samples the output 2n has, exactly: out[2i] = x[i] + i/(2n-1) (x[i-1] - x[i]) and
    out[2i+1] = x[i] + (n-1-i)/(2n-1) (x[i+1] - x[i]) (the weight of a missing neighbour is 0)."""
    n = x.shape[dim]
    shape = [1] * x.dim()
    shape[dim] = n
    i = torch.arange(n, device=x.device, dtype=torch.float32 if x.dtype != torch.float64 else x.dtype)
    to_previous = (i / (2 * n - 1)).reshape(shape)
    to_next = ((n - 1 - i) / (2 * n - 1)).reshape(shape)
    previous = torch.cat([x.narrow(dim, 0, 1), x.narrow(dim, 0, n - 1)], dim)
    following = torch.cat([x.narrow(dim, 1, n - 1), x.narrow(dim, n - 1, 1)], dim)
    even = x + to_previous * (previous - x)
    odd = x + to_next * (following - x)
    return torch.stack([even, odd], dim + 1).flatten(dim, dim + 1)


def upsample2x(x: Tensor, half: bool = False, kernel: str = DEFAULT_UPSAMPLING_KERNEL) -> Tensor:
    """EDSC's upsampling: bilinear, 2x, corners aligned (``F.interpolate``'s values).

    Compiled with gradients, it is written as shifted slices and weighted sums
    (:func:`_upsample_axis_by_slices`): inductor fuses those forward and backward into pointwise
    kernels, where its own backward of ``upsample_bilinear2d`` scatters with atomic adds and took a
    quarter of a compiled training step on CUDA (BENCHMARKS.md, issue #20). Elsewhere on CUDA, with
    ``kernel="edsc_ext"`` (the default), :func:`edsc_ext.upsample_bilinear2x` runs it (16-byte stores;
    ATen's channels_last kernel writes one value a thread, and channels_last tensors of fewer than 16
    channels, the heads' kernels, take its NCHW kernel through strides: issue #43); with "aten", on
    the CPU and under torch.export (a program for inference, whose dynamic sizes the slices' views of
    n - 1 samples would specialise where n - 1 can be 1, issue #36, and which other runtimes read)
    the native operator. Under CUDA autocast, as the native operator, it computes and returns
    float32; with ``half``, a float16 or bfloat16 ``x`` gives its own dtype back (computed in float32
    all the same, rounded once): the convolution after it would cast the float32 result to that type
    anyway, so the values it reads are the same, without the float32 tensor of twice the bytes and its
    cast (issue #43)."""
    if kernel not in UPSAMPLING_KERNELS:
        raise ValueError(f"kernel must be one of {UPSAMPLING_KERNELS}, got {kernel!r}")
    keep = half and x.dtype in (torch.float16, torch.bfloat16)
    cuda = x.device.type == "cuda"
    if not (cuda and _is_compiling() and not _is_exporting() and torch.is_grad_enabled()):
        # Autocast's state is asked of CUDA and of half types only: a meta tensor's device has none.
        if cuda and kernel == "edsc_ext" and not _is_exporting() and (
                keep or x.dtype in (torch.float32, torch.float64) or not torch.is_autocast_enabled("cuda")):
            with torch.autocast("cuda", enabled=False):
                return upsample_bilinear2x(x)
        if keep and torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type, enabled=False):
                return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
        return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
    memory_format, dtype = _memory_format(x), x.dtype
    if dtype in (torch.float16, torch.bfloat16):  # computed in float32, as the native kernel does
        if torch.is_autocast_enabled("cuda") and not keep:  # CUDA autocast runs upsample_bilinear2d in float32
            dtype = torch.float32
        x = x.float()
    out = _upsample_axis_by_slices(_upsample_axis_by_slices(x, 2), 3)
    return out.to(dtype).contiguous(memory_format=memory_format)


class Upsample2x(nn.Module):
    """:func:`upsample2x` as a module (no state: the checkpoints' keys are unchanged); ``keep_half`` (set
    by :class:`EDSC`'s ``half_upsampling``) keeps half-precision inputs in their dtype under autocast,
    ``kernel`` (set by its ``upsampling_kernel``) is :func:`upsample2x`'s."""

    def __init__(self):
        super().__init__()
        self.keep_half = False
        self.kernel = DEFAULT_UPSAMPLING_KERNEL

    def extra_repr(self) -> str:
        return f"keep_half={self.keep_half}, kernel={self.kernel!r}"

    def forward(self, x: Tensor) -> Tensor:
        return upsample2x(x, self.keep_half, self.kernel)


def _upsample() -> nn.Module:
    return Upsample2x()


def downsample2x(x: Tensor, kernel: str = DEFAULT_POOLING_KERNEL) -> Tensor:
    """EDSC's downsampling: 2x2 average pooling with stride 2 (``F.avg_pool2d(x, 2)``'s values, bit for bit).
    On CUDA, with ``kernel="edsc_ext"`` (the default), outside torch.compile and torch.export,
    :func:`edsc_ext.avg_pool2x` runs it (16-byte loads and stores, where ATen's channels_last kernel reads and
    writes one value a thread: 7x its memory floor in the 1080p network, issue #43); compiled, inductor
    generates its own kernel; elsewhere, and with "aten", F.avg_pool2d."""
    if kernel not in POOLING_KERNELS:
        raise ValueError(f"kernel must be one of {POOLING_KERNELS}, got {kernel!r}")
    if x.device.type == "cuda" and kernel == "edsc_ext" and not _is_compiling() and not _is_exporting():
        return avg_pool2x(x)
    return F.avg_pool2d(x, 2)


def _stage(in_channels: int, out_channels: int, p: int) -> nn.Sequential:
    return nn.Sequential(HetConv2d(in_channels, out_channels, p), nn.ReLU(),
                         HetConv2d(out_channels, out_channels, p), nn.ReLU(),
                         HetConv2d(out_channels, out_channels, p), nn.ReLU())


def _head(in_channels: int, out_channels: int, sigmoid: bool = False) -> nn.Sequential:
    layers = [nn.Conv2d(in_channels, 64, 3, padding=1), nn.ReLU(),
              nn.Conv2d(64, 32, 3, padding=1), nn.ReLU(),
              nn.Conv2d(32, out_channels, 3, padding=1), nn.ReLU(),
              _upsample(),
              nn.Conv2d(out_channels, out_channels, 3, padding=1)]
    if sigmoid:
        layers.append(nn.Sigmoid())
    return nn.Sequential(*layers)


def auto_head_layout(device_type: str, grad_enabled: bool, compiling: bool = False) -> str:
    """What ``head_layout="auto"`` runs: on CUDA ``DEFAULT_CUDA_INFERENCE_HEAD_LAYOUT`` for inference
    and ``DEFAULT_CUDA_COMPILED_TRAINING_HEAD_LAYOUT`` for training under torch.compile, "per_head"
    otherwise. Measured on the H200 (BENCHMARKS.md, issues #20 and #43): padded channel counts win
    inference (most in half precision and compiled) and the compiled training step (no padding copies
    inside cuDNN, fewer launches), not the eager training step, whose backward convolutions they made
    slower in float16."""
    if device_type != "cuda":
        return "per_head"
    if not grad_enabled:
        return DEFAULT_CUDA_INFERENCE_HEAD_LAYOUT
    return DEFAULT_CUDA_COMPILED_TRAINING_HEAD_LAYOUT if compiling else "per_head"


def _round_up(channels: int) -> int:
    return -(-channels // CHANNEL_MULTIPLE) * CHANNEL_MULTIPLE


def _memory_format(x: Tensor) -> torch.memory_format:
    return torch.channels_last if not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last) \
        else torch.contiguous_format


def _zero_channels(x: Tensor, count: int) -> Tensor:
    """``count`` zero channels of ``x``'s batch, size, dtype and memory format, to concatenate with it."""
    n, _, h, w = x.shape
    return torch.empty((n, count, h, w), dtype=x.dtype, device=x.device, memory_format=_memory_format(x)).zero_()


def _padded_weight(model: "EDSC", conv: nn.Conv2d, in_channels: int, out_channels: int, ones_out: Optional[int] = None,
                   bias_in: Optional[int] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """``conv``'s weight and bias zero-padded to ``in_channels`` inputs and ``out_channels`` outputs
    (cached with ``model.cache_weights``). ``ones_out``: that padding output gets the bias 1 (its weights
    stay 0), so that it is exactly 1 after a ReLU and a bilinear upsampling (a weighted mean of ones);
    ``bias_in``: that padding input is such a channel of ones, and the bias is its weight at the centre tap
    (always inside the frame) instead of an argument, returned as None."""
    def make():
        extra_in, extra_out = in_channels - conv.in_channels, out_channels - conv.out_channels
        weight, bias = conv.weight, conv.bias
        if extra_in or extra_out:
            weight = F.pad(weight, (0, 0, 0, 0, 0, extra_in, 0, extra_out))
            bias = F.pad(bias, (0, extra_out))
        # Placed by zero padding, not item assignment: assigning a number copies it from the host, which a
        # CUDA-graph capture refuses (without cache_weights this runs inside the graph).
        if ones_out is not None:
            bias = bias + F.pad(bias.new_ones(1), (ones_out, out_channels - 1 - ones_out))
        if bias_in is not None:
            kh, kw = weight.shape[2:]
            centre = (kw // 2, kw - 1 - kw // 2, kh // 2, kh - 1 - kh // 2, bias_in, in_channels - 1 - bias_in)
            weight, bias = weight + F.pad(bias.view(-1, 1, 1, 1), centre), None
        return weight, bias

    slot = ("padded", id(conv), in_channels, out_channels, ones_out, bias_in)
    return _cached(model, slot, [conv.weight, conv.bias], make)


def _padded_conv(model: "EDSC", x: Tensor, conv: nn.Conv2d, out_channels: int, relu: bool,
                 ones_out: Optional[int] = None, bias_in: Optional[int] = None) -> Tensor:
    """``conv`` on ``x`` (which may carry zero channels past the conv's inputs), its weight zero-padded
    to ``x``'s channels and ``out_channels`` outputs (``ones_out``, ``bias_in``: see :func:`_padded_weight`);
    then the ReLU if ``relu``."""
    weight, bias = _padded_weight(model, conv, x.shape[1], out_channels, ones_out, bias_in)
    return model._conv(x, weight, bias, conv.padding[0], relu=relu)


def _spare_channel(channels: int) -> Optional[int]:
    """The first padding channel of ``channels`` rounded up (None where none is added)."""
    return channels if _round_up(channels) > channels else None


def _padded_head_body(model: "EDSC", head: nn.Sequential, x: Tensor, start: int = 0) -> Tensor:
    """``head``'s (a :func:`_head`'s) first three layers on ``x`` with its odd channel counts rounded up (see
    EDSC.padded_heads), from its layer ``start`` on: 0, 2 (``x`` is the first layer's output after its ReLU)
    or 4 (the second's). The third layer's output after its ReLU, at half resolution, with a channel of ones
    in its first padding channel: the last convolution's bias rides in its GEMM as that channel's weight (a
    convolution with a bias runs cuDNN's kernel and then ATen's broadcast addition, a non-vectorised pass
    over the full-resolution output); there is one, since K and K * K are odd."""
    if start not in (0, 2, 4):
        raise ValueError(f"start must be 0, 2 or 4, got {start}")
    y = x
    if start == 0:
        y = _padded_conv(model, y, head[0], head[0].out_channels, relu=True)
    if start <= 2:
        y = _padded_conv(model, y, head[2], head[2].out_channels, relu=True)
    k = head[4].out_channels
    return _padded_conv(model, y, head[4], _round_up(k), relu=True, ones_out=_spare_channel(k))


def _head_output(head: nn.Sequential, y: Tensor) -> Tensor:
    """A head's output from its last convolution's padded output ``y``: the channel slice, and the mask heads'
    sigmoid. That sigmoid reads the slice (ATen's strided kernel) and writes it dense, which the op reads
    faster: over the dense padded output the sigmoid took 0.13 ms less and the op 0.13 ms more (BENCHMARKS.md,
    issue #43)."""
    y = y[:, :head[7].out_channels]
    return torch.sigmoid(y) if len(head) > 8 else y


def _padded_last_conv(model: "EDSC", head: nn.Sequential, upsampled: Tensor) -> Tensor:
    """``head``'s last convolution, padded, on its upsampled body output (:func:`_padded_head_body`, then
    ``head[6]``); :func:`_head_output` makes the head's output of it. The caller takes the three steps one by one,
    rebinding one name, so that each step's input is freed once it is read."""
    k = head[7].out_channels
    return _padded_conv(model, upsampled, head[7], _round_up(k), relu=False, bias_in=_spare_channel(k))


def _merged_tail_weight(model: "EDSC", heads: Sequence[nn.Sequential], width: int, dense: bool
                        ) -> Tuple[Tensor, Optional[Tensor], int]:
    """The last convolutions of ``heads`` (each padded to ``width`` channels, its bias in the weight of its
    channel of ones) as one: a grouped weight, one group a head, or with ``dense`` the dense block-diagonal
    one; with the bias (zeros for the heads whose bias is in the weight) or None, and the groups."""
    convs = [head[7] for head in heads]

    def make():
        parts = [_padded_weight(model, conv, width, width, bias_in=_spare_channel(conv.out_channels))
                 for conv in convs]
        weight = torch.cat([w for w, _ in parts])
        bias = None
        if any(b is not None for _, b in parts):
            bias = torch.cat([b if b is not None else w.new_zeros(width) for w, b in parts])
        return (block_diagonal(weight, len(convs)) if dense else weight), bias

    slot = ("merged_tail", tuple(id(conv) for conv in convs), width, dense)
    weight, bias = _cached(model, slot, [p for conv in convs for p in (conv.weight, conv.bias)], make)
    return weight, bias, 1 if dense else len(convs)


def _padded_heads_outputs(model: "EDSC", heads: Sequence[nn.Sequential], inputs: Sequence[Tensor], start: int = 0
                          ) -> list:
    """The outputs of the padded ``heads`` on their ``inputs`` (from layer ``start``, see :func:`_padded_head_body`).
    Each head runs whole before the next, each tensor freed once read (every body kept until the tails ran
    raised the 1080p peak by 200 MiB), or, as ``model.head_tails`` says, the heads of one padded width are
    merged: their bodies concatenated, one upsampling, one convolution (dense block-diagonal for the narrow
    heads, grouped for the others), the outputs channel slices of it."""
    widths = [_round_up(head[4].out_channels) for head in heads]
    merges = {width for width in widths if widths.count(width) > 1 and (
        model.head_tails == "merged" or (model.head_tails == "merged_narrow" and width <= CHANNEL_MULTIPLE))}
    outputs: list = [None] * len(heads)
    merged: Dict[int, list] = {}
    for i, (head, x, width) in enumerate(zip(heads, inputs, widths)):
        y = _padded_head_body(model, head, x, start)
        if width in merges:
            merged.setdefault(width, []).append((i, y))
            continue
        y = head[6](y)
        y = _padded_last_conv(model, head, y)
        outputs[i] = _head_output(head, y)
        del y  # the masks' unsliced output: not alive while the next head runs
    for width, members in merged.items():
        indices = [i for i, _ in members]
        group = [heads[i] for i in indices]
        x = torch.cat([y for _, y in members], 1)
        members.clear()  # the bodies, once concatenated
        x = group[0][6](x)
        weight, bias, groups = _merged_tail_weight(model, group, width, dense=width <= CHANNEL_MULTIPLE)
        z = model._conv(x, weight, bias, group[0][7].padding[0], relu=False, groups=groups)
        for j, (i, head) in enumerate(zip(indices, group)):
            outputs[i] = _head_output(head, z[:, j * width:(j + 1) * width])
    return outputs


# Each frame's heads in the order the synthesis takes them: vertical, horizontal, offset x, offset y, mask.
FRAME_HEADS = (("moduleVertical1", "moduleHorizontal1", "moduleOffset1x", "moduleOffset1y", "moduleMask1"),
               ("moduleVertical2", "moduleHorizontal2", "moduleOffset2x", "moduleOffset2y", "moduleMask2"))
# The fused heads' channel order: heads of one output width side by side (each of the last two layers
# is then one convolution), frame 1's before frame 2's, each frame's in the synthesis' order. With
# each head, the time map its first layer reads in EDSC_m: 1 for t, 2 for 1 - t, 0 for none.
KERNEL_HEADS = (("moduleVertical1", 1), ("moduleHorizontal1", 1), ("moduleVertical2", 2), ("moduleHorizontal2", 2))
SAMPLING_HEADS = (("moduleOffset1x", 1), ("moduleOffset1y", 1), ("moduleMask1", 1),
                  ("moduleOffset2x", 2), ("moduleOffset2y", 2), ("moduleMask2", 2))
BIAS_HEADS = (("moduleBias", 0),)

HeadOutputs = Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]


class EDSC(nn.Module):
    """EDSC: a U-Net over both frames predicts, per frame, per-pixel separable kernels, deformation
    offsets and a mask; the output is the sum of the two adaptively convolved frames plus a
    predicted residual.

    Args:
        kernel_size: K, taps per axis of the adaptive kernels (5 in the paper).
        multiple: False for EDSC_s (midpoint only), True for EDSC_m (any time t in (0, 1)).
        sampling: "compat" (the original layer, for released weights) or "clean" (centred taps).
        het_p: groups of the heterogeneous convolutions.
        use_bias: add the predicted residual (the original's default).
        fused: run the heterogeneous convolutions folded and the heads fused (:meth:`fused_heads`);
            False: the original code's module-by-module composition. Also an attribute that can be
            switched at any time: both read the same parameters.
        head_layout: how the fused heads run: "auto" (the default: the layout measured fastest,
            "padded" for inference on CUDA and "per_head" otherwise), "grouped", "block_diagonal", "per_head"
            (the heads one module at a time), "padded" (one at a time, channel counts rounded up
            to multiples of 8), "wide" (the first layers as one convolution, then as "padded") or
            "wide_grouped" (the second layers too, as one grouped convolution); see ``HEAD_LAYOUTS``,
            :meth:`fused_heads` and :meth:`wide_heads`.
        half_upsampling: under autocast, the bilinear upsamplings return the activations' half type
            (computed in float32 and rounded once: the values the next convolution reads are the same)
            instead of float32; see :func:`upsample2x`.
        pooling_kernel: on CUDA, "edsc_ext" (:func:`edsc_ext.avg_pool2x`, the default) or "aten"
            (``F.avg_pool2d``) runs the U-Net's average poolings, outside torch.compile and torch.export;
            see :func:`downsample2x`.
        upsampling_kernel: on CUDA, "edsc_ext" (:func:`edsc_ext.upsample_bilinear2x`, the default) or
            "aten" (``F.interpolate``) runs the upsamplings, outside compiled training; see
            :func:`upsample2x`.
        conv_relu: in inference (no gradients; not under torch.export), each convolution followed by a
            ReLU runs as one call, on CUDA cuDNN's fused convolution, bias and ReLU
            (``torch.cudnn_convolution_relu``), so no separate pass reads and writes its output again;
            the heterogeneous convolutions run folded then (on the CPU they keep their two convolutions,
            cheaper there, and the ReLU after them its pass).
        head_tails: how the padded layouts run the heads' upsamplings and last convolutions: "per_head",
            "merged_narrow" (the four kernel heads and the bias head as one upsampling and one block-diagonal
            convolution) or "merged" (the offset and mask heads too, as one grouped convolution); see
            ``HEAD_TAILS``. The same values either way.
        cache_weights: in eager inference (no gradients, not traced), keep the fused weights (folded,
            padded, concatenated, cast to autocast's dtype) while the parameters keep their storage and
            version; see :meth:`clear_weight_cache`. A graph captured with it reads the weights as
            they were at capture.

    All but ``kernel_size``, ``multiple`` and ``het_p`` are also attributes, which can be switched at
    any time; none changes the state dict.
    """

    def __init__(self, kernel_size: int = 5, multiple: bool = False, sampling: str = "compat", het_p: int = 4,
                 use_bias: bool = True, fused: bool = True, head_layout: str = "auto",
                 half_upsampling: bool = DEFAULT_HALF_UPSAMPLING, conv_relu: bool = DEFAULT_CONV_RELU,
                 cache_weights: bool = DEFAULT_CACHE_WEIGHTS, upsampling_kernel: str = DEFAULT_UPSAMPLING_KERNEL,
                 pooling_kernel: str = DEFAULT_POOLING_KERNEL, head_tails: str = DEFAULT_HEAD_TAILS):
        super().__init__()
        if sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd and positive, got {kernel_size}")
        if head_layout not in HEAD_LAYOUTS:
            raise ValueError(f"head_layout must be one of {HEAD_LAYOUTS}, got {head_layout!r}")
        self.kernel_size = kernel_size
        self.multiple = multiple
        self.sampling = sampling
        self.use_bias = use_bias
        self.head_layout = head_layout
        k, p = kernel_size, het_p
        head_in = 65 if multiple else 64

        # Registration order is the checkpoints' key order.
        self.moduleConv1 = nn.Sequential(nn.Conv2d(6, 32, 3, padding=1), nn.ReLU(),
                                         HetConv2d(32, 32, p), nn.ReLU(),
                                         HetConv2d(32, 32, p), nn.ReLU())
        self.moduleConv2 = _stage(32, 64, p)
        self.moduleConv3 = _stage(64, 128, p)
        self.moduleConv4 = _stage(128, 256, p)
        self.moduleConv5 = _stage(256, 512, p)
        self.moduleDeconv5 = _stage(512, 512, p)
        self.moduleDeconv4 = _stage(512, 256, p)
        self.moduleDeconv3 = _stage(256, 128, p)
        self.moduleDeconv2 = _stage(128, 64, p)
        for name, channels in (("moduleUpsample5", 512), ("moduleUpsample4", 256), ("moduleUpsample3", 128),
                               ("moduleUpsample2", 64)):
            self.add_module(name, nn.Sequential(_upsample(), HetConv2d(channels, channels, p), nn.ReLU()))
        self.moduleVertical1 = _head(head_in, k)
        self.moduleVertical2 = _head(head_in, k)
        self.moduleHorizontal1 = _head(head_in, k)
        self.moduleHorizontal2 = _head(head_in, k)
        self.moduleOffset1x = _head(head_in, k * k)
        self.moduleOffset1y = _head(head_in, k * k)
        self.moduleOffset2x = _head(head_in, k * k)
        self.moduleOffset2y = _head(head_in, k * k)
        self.moduleMask1 = _head(head_in, k * k, sigmoid=True)
        self.moduleMask2 = _head(head_in, k * k, sigmoid=True)
        self.moduleBias = _head(64, 3)
        self.fused = fused
        self.half_upsampling = half_upsampling
        self.upsampling_kernel = upsampling_kernel
        self.pooling_kernel = pooling_kernel
        self.conv_relu = conv_relu
        self.cache_weights = cache_weights
        self.head_tails = head_tails

    @property
    def name(self) -> str:
        return "EDSC_m" if self.multiple else "EDSC_s"

    @property
    def fused(self) -> bool:
        """Whether forward runs the fused composition; setting it switches every HetConv2d too."""
        return self._fused

    @fused.setter
    def fused(self, value: bool) -> None:
        self._fused = bool(value)
        for module in self.modules():
            if isinstance(module, HetConv2d):
                module.fused = self._fused

    def load_state_dict(self, state_dict, *args, **kwargs):
        """``nn.Module.load_state_dict``, which refuses a whole checkpoint: :func:`save_checkpoint` and the
        released files hold the weights under ``'model_state'``, which a plain ``load_state_dict`` would
        report as every key missing (or, with ``strict=False``, load nothing at all, silently)."""
        if isinstance(state_dict, Mapping) and isinstance(state_dict.get("model_state"), Mapping):
            raise ValueError("load_state_dict got a whole EDSC checkpoint ({'model_state': ..., ...}), not a state "
                             "dict: load the file with edsc_ext.models.load_checkpoint(path, model), or pass "
                             "checkpoint['model_state']")
        return super().load_state_dict(state_dict, *args, **kwargs)

    @property
    def half_upsampling(self) -> bool:
        """Whether the upsamplings keep half types under autocast; setting it switches every one."""
        return self._half_upsampling

    @half_upsampling.setter
    def half_upsampling(self, value: bool) -> None:
        self._half_upsampling = bool(value)
        for module in self.modules():
            if isinstance(module, Upsample2x):
                module.keep_half = self._half_upsampling

    @property
    def upsampling_kernel(self) -> str:
        """What runs the upsamplings on CUDA (see :func:`upsample2x`); setting it switches every one."""
        return self._upsampling_kernel

    @upsampling_kernel.setter
    def upsampling_kernel(self, value: str) -> None:
        if value not in UPSAMPLING_KERNELS:
            raise ValueError(f"upsampling_kernel must be one of {UPSAMPLING_KERNELS}, got {value!r}")
        self._upsampling_kernel = value
        for module in self.modules():
            if isinstance(module, Upsample2x):
                module.kernel = value

    @property
    def pooling_kernel(self) -> str:
        """What runs the U-Net's average poolings on CUDA (see :func:`downsample2x`)."""
        return self._pooling_kernel

    @pooling_kernel.setter
    def pooling_kernel(self, value: str) -> None:
        if value not in POOLING_KERNELS:
            raise ValueError(f"pooling_kernel must be one of {POOLING_KERNELS}, got {value!r}")
        self._pooling_kernel = value

    @property
    def head_tails(self) -> str:
        """How the padded layouts run the heads' upsamplings and last convolutions (``HEAD_TAILS``)."""
        return self._head_tails

    @head_tails.setter
    def head_tails(self, value: str) -> None:
        if value not in HEAD_TAILS:
            raise ValueError(f"head_tails must be one of {HEAD_TAILS}, got {value!r}")
        self._head_tails = value

    @property
    def cache_weights(self) -> bool:
        """Whether eager inference keeps the fused weights (see :func:`_cached`); setting it switches every
        HetConv2d too, and switching it off drops what was kept."""
        return self._cache_weights

    @cache_weights.setter
    def cache_weights(self, value: bool) -> None:
        self._cache_weights = bool(value)
        for module in self.modules():
            if isinstance(module, HetConv2d):
                module.cache_weights = self._cache_weights
        if not self._cache_weights:
            self.clear_weight_cache()

    def clear_weight_cache(self) -> None:
        """Drops the weights ``cache_weights`` kept (needed only after writes that bypass the parameters'
        version counters, such as through ``.data``)."""
        for module in self.modules():
            module.__dict__.pop("_weight_cache", None)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, multiple={self.multiple}, sampling={self.sampling!r}, "
                f"fused={self.fused}, head_layout={self.head_layout!r}, half_upsampling={self.half_upsampling}, "
                f"upsampling_kernel={self.upsampling_kernel!r}, pooling_kernel={self.pooling_kernel!r}, "
                f"conv_relu={self.conv_relu}, head_tails={self.head_tails!r}, cache_weights={self.cache_weights}")

    def _pool(self, x: Tensor) -> Tensor:
        return downsample2x(x, self.pooling_kernel)

    def _conv_relu_now(self) -> bool:
        """Whether ``conv_relu`` applies to this call: fused, no gradients, not exported."""
        return self.conv_relu and self.fused and not torch.is_grad_enabled() and not _is_exporting()

    def _conv(self, x: Tensor, weight: Tensor, bias: Tensor, padding: int, relu: bool, groups: int = 1) -> Tensor:
        """A stride-1 convolution of the fused path, then the ReLU if ``relu``: one fused call where
        ``conv_relu`` applies (:func:`conv2d_relu`)."""
        if relu and self._conv_relu_now():
            return conv2d_relu(x, weight, bias, padding, groups)
        y = F.conv2d(x, weight, bias, padding=padding, groups=groups)
        return F.relu(y, inplace=True) if relu else y

    def _run(self, sequence: nn.Sequential, x: Tensor) -> Tensor:
        """``sequence(x)``; where ``conv_relu`` applies, each convolution (HetConv2d folded) and the ReLU
        after it as one call."""
        if not self._conv_relu_now():
            return sequence(x)
        modules = list(sequence)
        i = 0
        while i < len(modules):
            module = modules[i]
            followed_by_relu = i + 1 < len(modules) and isinstance(modules[i + 1], nn.ReLU)
            # On the CPU a HetConv2d keeps its two convolutions (HetConv2d.forward: cheaper than the folded one).
            if followed_by_relu and isinstance(module, HetConv2d) and x.device.type != "cpu":
                x = conv2d_relu(x, *module.dense_weight(), module.conv3x3.padding[0])
                i += 2
            elif followed_by_relu and isinstance(module, nn.Conv2d):
                weight, bias = _cached(self, ("conv", id(module)), [module.weight, module.bias],
                                       lambda module=module: (module.weight, module.bias))
                x = conv2d_relu(x, weight, bias, module.padding[0])
                i += 2
            else:
                x = module(x)
                i += 1
        return x

    def features(self, first: Tensor, second: Tensor) -> Tensor:
        """The U-Net: the 64-channel half-resolution feature the heads read. With the "padded" and the
        "wide" layouts (see ``head_layout``) the first convolution reads the two frames' 6 channels and 2
        zero ones."""
        if self.fused and self._layout(first) in PADDED_LAYOUTS:
            c = first.shape[1] + second.shape[1]
            x = torch.cat([first, second, _zero_channels(first, _round_up(c) - c)], 1)
            conv1 = _padded_conv(self, x, self.moduleConv1[0], self.moduleConv1[0].out_channels, relu=True)
            conv1 = self._run(self.moduleConv1[2:], conv1)
        else:
            conv1 = self._run(self.moduleConv1, torch.cat([first, second], 1))
        conv2 = self._run(self.moduleConv2, self._pool(conv1))
        conv3 = self._run(self.moduleConv3, self._pool(conv2))
        conv4 = self._run(self.moduleConv4, self._pool(conv3))
        conv5 = self._run(self.moduleConv5, self._pool(conv4))
        deconv5 = self._run(self.moduleUpsample5, self._run(self.moduleDeconv5, self._pool(conv5)))
        deconv4 = self._run(self.moduleUpsample4, self._run(self.moduleDeconv4, deconv5 + conv5))
        deconv3 = self._run(self.moduleUpsample3, self._run(self.moduleDeconv3, deconv4 + conv4))
        deconv2 = self._run(self.moduleUpsample2, self._run(self.moduleDeconv2, deconv3 + conv3))
        return deconv2 + conv2

    def unfused_heads(self, combine: Tensor, time: Union[float, Tensor, None] = None
                      ) -> Tuple[HeadOutputs, HeadOutputs, Optional[Tensor]]:
        """The eleven heads one module at a time, as the original code runs them: per frame
        (vertical, horizontal, offset_x, offset_y, mask), and the bias (None without ``use_bias``)."""
        if self.multiple:
            t = self._time_map(time, combine)
            in1, in2 = torch.cat([combine, t], 1), torch.cat([combine, 1 - t], 1)
        else:
            in1 = in2 = combine
        frame1 = tuple(getattr(self, name)(in1) for name in FRAME_HEADS[0])
        frame2 = tuple(getattr(self, name)(in2) for name in FRAME_HEADS[1])
        return frame1, frame2, self.moduleBias(combine) if self.use_bias else None

    def fused_heads(self, combine: Tensor, time: Union[float, Tensor, None] = None
                    ) -> Tuple[HeadOutputs, HeadOutputs, Optional[Tensor]]:
        """The eleven heads as a few convolutions; the same values as :meth:`unfused_heads`.

        The weights are the heads' parameters concatenated on every call (differentiable, nothing
        stored twice), in the channel order of ``KERNEL_HEADS``, ``SAMPLING_HEADS``, ``BIAS_HEADS``:

        1. the first layers of all heads: one convolution of the feature (EDSC_m: of the feature, t
           and 1 - t; each head's weight holds its time column at the map its frame reads and zeros
           at the other, so by linearity it is the head's convolution of ``cat(feature, t)`` or
           ``cat(feature, 1 - t)``, zero padding at the borders included);
        2. the second layers: one convolution with a group per head;
        3. per output width (the kernel heads, the offset and mask heads, the bias head): the third
           layers as one grouped convolution, the bilinear upsampling, the last layers as one
           grouped (or block-diagonal, ``head_layout``) convolution.

        The outputs are channel slices (views) of those last convolutions: kernels
        (vertical1, horizontal1, vertical2, horizontal2) and offsets and masks (offset1x, offset1y,
        mask1, offset2x, offset2y, mask2); the masks' sigmoid makes new tensors, as the modules do.
        ``head_layout="per_head"`` (what "auto" runs on the CPU and for training) runs
        :meth:`unfused_heads` instead, and ``"padded"`` (what "auto" runs for inference on CUDA)
        :meth:`padded_heads`.
        """
        layout = self._layout(combine)
        if layout == "per_head":
            return self.unfused_heads(combine, time)
        if layout == "padded":
            return self.padded_heads(combine, time)
        if layout in ("wide", "wide_grouped"):
            return self.wide_heads(combine, time)
        if self.multiple:
            # A materialised one-channel map is contiguous in both memory formats, so the
            # concatenation keeps the feature's (an expanded one would make it NCHW).
            t = self._time_map(time, combine).contiguous(memory_format=torch.channels_last)
            x = torch.cat([combine, t, 1 - t], 1)
        else:
            x = combine
        widths = (KERNEL_HEADS, SAMPLING_HEADS) + ((BIAS_HEADS,) if self.use_bias else ())
        heads = [(getattr(self, name), reads) for group in widths for name, reads in group]
        first_layers = [head[0] for head, _ in heads]
        y = F.conv2d(x, torch.cat([self._first_layer_weight(conv.weight, reads)
                                   for conv, (_, reads) in zip(first_layers, heads)]),
                     torch.cat([conv.bias for conv in first_layers]), padding=first_layers[0].padding)
        y = F.relu(y, inplace=True)
        y = F.relu(self._heads_conv(y, [head[2] for head, _ in heads], layout="grouped"), inplace=True)
        parts = y.split([sum(getattr(self, name)[2].out_channels for name, _ in group) for group in widths], 1)
        outputs = []
        for group, part in zip(widths, parts):
            modules = [getattr(self, name) for name, _ in group]
            z = F.relu(self._heads_conv(part, [head[4] for head in modules], layout), inplace=True)
            z = upsample2x(z, kernel=self.upsampling_kernel)
            outputs.append(self._heads_conv(z, [head[7] for head in modules], layout))
        k = self.kernel_size
        vertical1, horizontal1, vertical2, horizontal2 = outputs[0].split(k, 1)
        offset1x, offset1y, mask1, offset2x, offset2y, mask2 = outputs[1].split(k * k, 1)
        return ((vertical1, horizontal1, offset1x, offset1y, torch.sigmoid(mask1)),
                (vertical2, horizontal2, offset2x, offset2y, torch.sigmoid(mask2)),
                outputs[2] if self.use_bias else None)

    def padded_heads(self, combine: Tensor, time: Union[float, Tensor, None] = None
                     ) -> Tuple[HeadOutputs, HeadOutputs, Optional[Tensor]]:
        """The heads one by one, as :meth:`unfused_heads`, with every channel count a multiple of
        ``CHANNEL_MULTIPLE``: the weights are the parameters with zero rows and columns added on every
        call, so the extra channels are exact zeros (after the ReLU and the upsampling too) and the
        outputs, channel slices of the last convolutions, equal the unfused heads'."""
        if self.multiple:
            # [feature, t, zeros]: 65 channels rounded up, built once per frame.
            c = combine.shape[1]
            t = self._time_map(time, combine).contiguous(memory_format=_memory_format(combine))
            zeros = _zero_channels(combine, _round_up(c + 1) - c - 1)
            in1, in2 = torch.cat([combine, t, zeros], 1), torch.cat([combine, 1 - t, zeros], 1)
        else:
            in1 = in2 = combine
        names = FRAME_HEADS[0] + FRAME_HEADS[1] + (("moduleBias",) if self.use_bias else ())
        heads = [getattr(self, name) for name in names]
        inputs = [in1] * len(FRAME_HEADS[0]) + [in2] * len(FRAME_HEADS[1]) + [combine] * self.use_bias
        outputs = _padded_heads_outputs(self, heads, inputs)
        n = len(FRAME_HEADS[0])
        return tuple(outputs[:n]), tuple(outputs[n:2 * n]), outputs[2 * n] if self.use_bias else None

    def wide_heads(self, combine: Tensor, time: Union[float, Tensor, None] = None
                   ) -> Tuple[HeadOutputs, HeadOutputs, Optional[Tensor]]:
        """The heads as :meth:`padded_heads`, with the first layers of all of them as one convolution
        (``head_layout="wide"``): 64 input channels (EDSC_m: the feature, t, 1 - t and zeros to 72, each
        head's weight holding its time column at the map its frame reads, as in :meth:`fused_heads`) to
        11 x 64 outputs, one GEMM of 704 columns where the per-head layouts run eleven of 64. Each head's
        ReLU reads its 64-channel slice of that output and writes it dense, so the pass the per-head
        layouts spend on the ReLU also makes the next convolution's input; the rest of each head runs
        as :meth:`padded_heads`. With ``head_layout="wide_grouped"`` the second layers run as one
        grouped convolution (11 groups of 64 -> 32) too, and the ReLU after it splits the heads."""
        names = FRAME_HEADS[0] + FRAME_HEADS[1] + (("moduleBias",) if self.use_bias else ())
        heads = [getattr(self, name) for name in names]
        if self.multiple:
            # [feature, t, 1 - t, zeros]: a materialised map is contiguous in both memory formats, so the
            # concatenation keeps the feature's.
            c = combine.shape[1] + 2
            t = self._time_map(time, combine).contiguous(memory_format=_memory_format(combine))
            x = torch.cat([combine, t, 1 - t, _zero_channels(combine, _round_up(c) - c)], 1)
            reads = (1,) * len(FRAME_HEADS[0]) + (2,) * len(FRAME_HEADS[1]) + (0,) * self.use_bias
        else:
            x, reads = combine, (None,) * len(heads)
        in_channels = x.shape[1]

        def first_layers():
            weights = []
            for head, read in zip(heads, reads):
                weight = head[0].weight if read is None else self._first_layer_weight(head[0].weight, read)
                weights.append(F.pad(weight, (0, 0, 0, 0, 0, in_channels - weight.shape[1])))
            return torch.cat(weights), torch.cat([head[0].bias for head in heads])

        params = [p for head in heads for p in (head[0].weight, head[0].bias)]
        weight, bias = _cached(self, ("wide", in_channels), params, first_layers)
        grouped = self._layout(combine) == "wide_grouped"
        y = self._conv(x, weight, bias, heads[0][0].padding[0], relu=grouped)
        start = 2
        if grouped:
            def second_layers():
                return (torch.cat([head[2].weight for head in heads]), torch.cat([head[2].bias for head in heads]))

            params = [p for head in heads for p in (head[2].weight, head[2].bias)]
            weight, bias = _cached(self, "wide_second", params, second_layers)
            y = F.conv2d(y, weight, bias, padding=heads[0][2].padding[0], groups=len(heads))
            start = 4
        widths = [head[start].in_channels for head in heads]
        parts = [F.relu(part) for part in y.split(widths, 1)]  # dense per head: the next convolution's input
        outputs = _padded_heads_outputs(self, heads, parts, start=start)
        n = len(FRAME_HEADS[0])
        return tuple(outputs[:n]), tuple(outputs[n:2 * n]), outputs[2 * n] if self.use_bias else None

    def _layout(self, x: Tensor) -> str:
        """The head layout that runs on ``x`` now ("auto" resolved by :func:`auto_head_layout`)."""
        if self.head_layout != "auto":
            return self.head_layout
        return auto_head_layout(x.device.type, torch.is_grad_enabled(), _is_compiling())

    def _first_layer_weight(self, weight: Tensor, reads: int) -> Tensor:
        """A head's first-layer weight over the fused input (EDSC_m: feature, t, 1 - t)."""
        if not self.multiple:
            return weight
        if reads == 1:  # [feature, t] and a zero column for 1 - t
            return F.pad(weight, (0, 0, 0, 0, 0, 1))
        if reads == 2:  # [feature], a zero column for t, and [1 - t]
            feature, time = weight[:, :-1], weight[:, -1:]
            return torch.cat([feature, torch.zeros_like(time), time], 1)
        return F.pad(weight, (0, 0, 0, 0, 0, 2))  # the bias head reads the feature only

    @staticmethod
    def _heads_conv(x: Tensor, convs: Sequence[nn.Conv2d], layout: str) -> Tensor:
        """The convolutions ``convs`` (one per head) on their inputs stacked in ``x``, as one call."""
        if len(convs) == 1:
            return convs[0](x)
        weight = torch.cat([conv.weight for conv in convs])
        bias = torch.cat([conv.bias for conv in convs])
        groups = len(convs)
        if layout == "block_diagonal":
            weight, groups = block_diagonal(weight, groups), 1
        return F.conv2d(x, weight, bias, padding=convs[0].padding, groups=groups)

    def synthesize(self, frame: Tensor, vertical: Tensor, horizontal: Tensor, offset_x: Tensor,
                   offset_y: Tensor, mask: Tensor) -> Tensor:
        """Adaptive convolution of one (unpadded) frame with the heads' outputs, in the frame's dtype.
        Under autocast the heads run in half precision, and the op reads their outputs as they are
        with a float32 frame (the sampling is computed in float32, with no copies); other dtypes
        are cast to the frame's."""
        per_pixel = (vertical, horizontal, offset_x, offset_y, mask)
        dtypes = {t.dtype for t in per_pixel}
        dtype = dtypes.pop() if len(dtypes) == 1 else frame.dtype
        if not natively_supported(frame.dtype, dtype):
            dtype = frame.dtype
        vertical, horizontal, offset_x, offset_y, mask = (t if t.dtype == dtype else t.to(dtype) for t in per_pixel)
        pad = self.kernel_size // 2
        if self.sampling == "compat":
            # Identical to FunctionDSepconv on the replicate-padded frame, without the padded copy.
            return compat_deform_sepconv(frame, vertical, horizontal, offset_x, offset_y, mask, padding=pad)
        # offset_x moves the vertical coordinate: the (dy, dx) of split offsets, read in place.
        return deform_sepconv(frame, vertical, horizontal, (offset_x, offset_y), mask, padding=pad,
                              padding_mode="border")

    def _time_map(self, time, feature: Tensor) -> Tensor:
        n, _, h, w = feature.shape
        if time is None:
            time = 0.5
        t = torch.as_tensor(time, dtype=feature.dtype, device=feature.device)
        if t.dim() == 4 and t.shape[1:] == (1, h, w):
            return t.expand(n, 1, h, w)
        if t.numel() not in (1, n):
            raise ValueError(f"time must be a float, or one value per batch element ({n}), got shape "
                             f"{tuple(t.shape)}")
        return t.reshape(-1, 1, 1, 1).expand(n, 1, h, w)

    def forward(self, first: Tensor, second: Tensor, time: Union[float, Tensor, None] = None) -> Tensor:
        """Interpolates between ``first`` and ``second`` (N, 3, H, W), H and W multiples of 32.

        ``time`` (EDSC_m only): a float, or a tensor with one value per batch element, in (0, 1);
        default 0.5 (a value outside is a ValueError: always for a number, for a tensor where its values
        are on the CPU, since reading a GPU tensor's would wait for the device). Returns the (unclamped)
        interpolated frame, (N, 3, H, W).
        """
        check_frames(first, second)
        h, w = first.shape[2:]
        if h % SIZE_MULTIPLE or w % SIZE_MULTIPLE:
            raise ValueError(f"frame height and width must be multiples of {SIZE_MULTIPLE}, got {h}x{w} "
                             f"(use EDSC.interpolate or pad_to_multiple)")
        if not self.multiple and time is not None and not (isinstance(time, (int, float)) and time == 0.5):
            raise ValueError("EDSC_s interpolates the midpoint only; use EDSC(multiple=True) (EDSC_m) for "
                             "other times")
        if self.multiple:
            check_time(time)
        combine = self.features(first, second)
        heads = self.fused_heads if self.fused else self.unfused_heads
        frame1, frame2, bias = heads(combine, time)
        out = self.synthesize(first, *frame1) + self.synthesize(second, *frame2)
        if bias is not None:
            out = out + bias.to(out.dtype)
        return out

    @torch.no_grad()
    def interpolate(self, first: Tensor, second: Tensor, time: Union[float, Tensor, None] = None) -> Tensor:
        """Inference on frames of any size, (3, H, W) or (N, 3, H, W) in the model's channel order
        (BGR for the released weights): replicate-pads to a multiple of 32, runs the network,
        crops back and clamps to [0, 1]. ``time`` (EDSC_m): as in :meth:`forward`, in (0, 1), checked
        on any device."""
        single = first.dim() == 3
        if single:
            first, second = first.unsqueeze(0), second.unsqueeze(0)
        check_frames(first, second)
        if self.multiple:
            check_time(time, read_device_values=True)
        (first, second), (h, w) = pad_to_multiple((first, second), SIZE_MULTIPLE)
        out = self(first, second, time)[..., :h, :w].clamp(0, 1)
        return out[0] if single else out

    def capture(self, first: Tensor, second: Tensor, time: Union[float, Tensor, None] = None, *,
                autocast_dtype: Optional[torch.dtype] = None, warmup: int = 3,
                cudnn_benchmark: bool = DEFAULT_CUDNN_BENCHMARK) -> "CapturedEDSC":
        """A CUDA graph of this network's inference on frames of the shape, dtype, device and memory
        format of ``first`` and ``second`` (EDSC_m: and of ``time``'s shape), for frame loops;
        see :class:`CapturedEDSC`."""
        return CapturedEDSC(self, first, second, time, autocast_dtype=autocast_dtype, warmup=warmup,
                            cudnn_benchmark=cudnn_benchmark)


class CapturedEDSC:
    """A fixed-shape inference of an :class:`EDSC` network recorded once as a CUDA graph and then
    replayed: ``captured(first, second[, time])`` copies the inputs into the graph's static buffers,
    replays it and returns the output (a copy by default; ``copy=False`` returns the static output
    buffer, which the next call overwrites).

    The graph reads the parameters where they live, and folds and concatenates them inside it, so a
    replay sees in-place updates of the parameters (``load_state_dict``, an optimizer step); moving
    the model (``.to``) or replacing a parameter needs a new capture. ``autocast_dtype`` (float16 or
    bfloat16) records the network under CUDA autocast. EDSC_m's time is always a static tensor, of
    the shape of the ``time`` given at capture (a float: one value for the batch).

    ``cudnn_benchmark`` lets cuDNN time its algorithms for each convolution during the warm-up (see
    :func:`cudnn_autotuning`); the graph keeps the ones it chose. With the model's ``cache_weights``, the
    graph reads the weights kept at capture, and keeps them: later parameter updates are not seen.
    """

    def __init__(self, model: EDSC, first: Tensor, second: Tensor, time: Union[float, Tensor, None] = None, *,
                 autocast_dtype: Optional[torch.dtype] = None, warmup: int = 3,
                 cudnn_benchmark: bool = DEFAULT_CUDNN_BENCHMARK):
        if first.device.type != "cuda":
            raise ValueError(f"capture needs frames on a CUDA device, got first on {first.device}")
        if first.shape != second.shape or first.dtype != second.dtype or first.device != second.device:
            raise ValueError(f"first and second must be of one shape, dtype and device, got {tuple(first.shape)} "
                             f"{first.dtype} {first.device} and {tuple(second.shape)} {second.dtype} {second.device}")
        if autocast_dtype not in (None, torch.float16, torch.bfloat16):
            raise ValueError(f"autocast_dtype must be None, torch.float16 or torch.bfloat16, got {autocast_dtype}")
        if warmup < 1:
            raise ValueError(f"warmup must be at least 1 (cuDNN and the allocator settle outside the graph), "
                             f"got {warmup}")
        self.model = model
        self.autocast_dtype = autocast_dtype
        self.first = first.detach().clone()
        self.second = second.detach().clone()
        self.time: Optional[Tensor] = None
        if model.multiple:
            check_time(time)
            value = 0.5 if time is None else time
            self.time = torch.as_tensor(value, dtype=torch.float32, device=first.device).clone()
        elif time is not None and not (isinstance(time, (int, float)) and time == 0.5):
            raise ValueError("EDSC_s interpolates the midpoint only; capture it with time=None")
        # Side-stream warm-up, as torch.cuda.graphs asks: lazy initialisation stays out of the graph.
        with cudnn_autotuning(cudnn_benchmark):
            stream = torch.cuda.Stream(device=first.device)
            stream.wait_stream(torch.cuda.current_stream(first.device))
            with torch.cuda.stream(stream):
                for _ in range(warmup):
                    self._run()
            torch.cuda.current_stream(first.device).wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            # A capture stream on the frames' device: torch.cuda.graph's default one is made once, on the
            # device current at the first capture, and would leave a later capture on another GPU empty.
            with torch.cuda.graph(self.graph, stream=torch.cuda.Stream(device=first.device)):
                self.output = self._run()
        # The graph reads the kept weights by address: hold them for its life (cache_weights).
        self._weights = [cached for module in model.modules()
                         for _, cached in module.__dict__.get("_weight_cache", {}).values()]

    def _run(self) -> Tensor:
        # The autocast cache holds casts made outside the graph's memory pool: off while capturing.
        with torch.no_grad(), torch.autocast("cuda", dtype=self.autocast_dtype or torch.float16,
                                             enabled=self.autocast_dtype is not None, cache_enabled=False):
            return self.model(self.first, self.second, self.time)

    def __call__(self, first: Tensor, second: Tensor, time: Union[float, Tensor, None] = None, *,
                 copy: bool = True) -> Tensor:
        for name, given, static in (("first", first, self.first), ("second", second, self.second)):
            if given.shape != static.shape:
                raise ValueError(f"{name} must have the captured shape {tuple(static.shape)}, got {tuple(given.shape)}")
        if self.time is not None:
            check_time(time)
            value = torch.as_tensor(0.5 if time is None else time, dtype=torch.float32)
            if value.numel() not in (1, self.time.numel()):
                raise ValueError(f"time must be one value or of the captured time's shape {tuple(self.time.shape)}, "
                                 f"got shape {tuple(value.shape)}")
            self.time.copy_(value.to(self.time.device, non_blocking=True).reshape(-1).expand(self.time.numel())
                            .reshape(self.time.shape))
        elif time is not None and not (isinstance(time, (int, float)) and time == 0.5):
            raise ValueError("EDSC_s interpolates the midpoint only; call it with time=None")
        self.first.copy_(first, non_blocking=True)
        self.second.copy_(second, non_blocking=True)
        self.graph.replay()
        return self.output.clone() if copy else self.output


@contextlib.contextmanager
def cudnn_autotuning(on: bool) -> Iterator[None]:
    """``torch.backends.cudnn.benchmark`` on inside the block when ``on`` (else as the process set it),
    and restored after: cuDNN then times its algorithms for each new convolution shape and keeps the
    fastest, for the block only."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = before or bool(on)
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


class CompiledEDSC:
    """README's speed recipe: ``torch.compile`` of a function that enters autocast itself (so that the
    half type is part of the compiled graph; entered around a compiled model, torch's compile caches could
    hand a float16 graph to a bfloat16 run, pytorch/pytorch#181564) and calls ``model``, replayed as CUDA
    graphs (``cuda_graphs``, what mode "reduce-overhead" turns on: inductor's ``triton.cudagraphs``).
    ``compiled(first, second[, time])`` calls it; with graphs, each call starts a new graph step
    (``torch.compiler.cudagraph_mark_step_begin``), so the output is overwritten by the next call: clone
    what you keep. Under gradients it is a training step's forward (its backward is compiled and replayed
    too).

    Options, each a candidate speed-up (issue #43, timed by ``tools/network_variants.py``):

    - ``cudnn_benchmark``: cuDNN times its algorithms during each call (:func:`cudnn_autotuning`); the
      graphs keep the ones chosen at their warm-up. A training step's backward runs outside the call:
      enter ``cudnn_autotuning(True)`` around it too.
    - ``freezing``: inductor's freezing (inference, compiled under ``torch.no_grad()``): the parameters
      become constants of the compiled code, so the fused weights (folded, padded, concatenated, cast)
      are computed once at compile time; later parameter updates are not seen (compile again).
    - ``max_autotune``: inductor's autotuning of convolutions and matrix products (Triton templates
      against cuDNN/cuBLAS), timed at compile time: minutes of compilation.

    Compiles once per input shape (``dynamic=False``: a frame loop's fixed size); the first call's time
    is the compile's.
    """

    def __init__(self, model: nn.Module, autocast_dtype: Optional[torch.dtype] = None, *, cuda_graphs: bool = True,
                 cudnn_benchmark: bool = DEFAULT_CUDNN_BENCHMARK, freezing: bool = DEFAULT_FREEZING,
                 max_autotune: bool = False, fullgraph: bool = False, backend: str = "inductor"):
        if autocast_dtype not in (None, torch.float16, torch.bfloat16):
            raise ValueError(f"autocast_dtype must be None, torch.float16 or torch.bfloat16, got {autocast_dtype}")
        self.model = model
        self.autocast_dtype = autocast_dtype
        self.cuda_graphs = bool(cuda_graphs)
        self.cudnn_benchmark = bool(cudnn_benchmark)
        self.freezing = bool(freezing)
        self.max_autotune = bool(max_autotune)
        options: Dict[str, Any] = {"triton.cudagraphs": self.cuda_graphs}
        if self.freezing:
            options["freezing"] = True
        if self.max_autotune:
            options["max_autotune"] = True
        self.options = options
        # The options are inductor's configuration; other backends (tests trace with "aot_eager") take none.
        self._compiled = torch.compile(self._forward, backend=backend, fullgraph=fullgraph, dynamic=False,
                                       options=options if backend == "inductor" else None)

    def _forward(self, first: Tensor, second: Tensor, time: Union[float, Tensor, None] = None) -> Tensor:
        with torch.autocast(first.device.type, dtype=self.autocast_dtype or torch.float16,
                            enabled=self.autocast_dtype is not None):
            return self.model(first, second, time)

    def __call__(self, first: Tensor, second: Tensor, time: Union[float, Tensor, None] = None) -> Tensor:
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with cudnn_autotuning(self.cudnn_benchmark):
            return self._compiled(first, second, time)


def compile_edsc(model: nn.Module, autocast_dtype: Optional[torch.dtype] = torch.float16, *, cuda_graphs: bool = True,
                 cudnn_benchmark: bool = DEFAULT_CUDNN_BENCHMARK, freezing: bool = DEFAULT_FREEZING,
                 max_autotune: bool = False, fullgraph: bool = False, backend: str = "inductor") -> CompiledEDSC:
    """The compiled recipe (:class:`CompiledEDSC`): float16 autocast by default (``torch.bfloat16`` for
    training, ``None`` for float32). Put the model and the frames in channels_last first."""
    return CompiledEDSC(model, autocast_dtype, cuda_graphs=cuda_graphs, cudnn_benchmark=cudnn_benchmark,
                        freezing=freezing, max_autotune=max_autotune, fullgraph=fullgraph, backend=backend)


def EDSC_s(**kwargs) -> EDSC:  # noqa: N802 (the paper's name)
    """EDSC_s: midpoint interpolation (``EDSC(multiple=False)``)."""
    return EDSC(multiple=False, **kwargs)


def EDSC_m(**kwargs) -> EDSC:  # noqa: N802
    """EDSC_m: interpolation at any time t in (0, 1) (``EDSC(multiple=True)``)."""
    return EDSC(multiple=True, **kwargs)


def pad_to_multiple(frames, multiple: int = SIZE_MULTIPLE) -> Tuple[tuple, Tuple[int, int]]:
    """Replicate-pads (N, C, H, W) frames at the bottom and right to multiples of ``multiple``;
    returns the padded frames and the original (H, W)."""
    h, w = frames[0].shape[-2:]
    ph, pw = (-h) % multiple, (-w) % multiple
    if ph or pw:
        frames = tuple(F.pad(f, (0, pw, 0, ph), mode="replicate") for f in frames)
    return tuple(frames), (h, w)


# --------------------------------------------------------------------------------------------
# Checkpoints: {'model_state': state_dict, ...}, as released with the original code.


def state_dict_of(model: nn.Module) -> "OrderedDict[str, Tensor]":
    """The model's state dict with the wrappers' prefixes removed (DistributedDataParallel's
    ``module.``, torch.compile's ``_orig_mod.``), i.e. with the original's keys."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    model = getattr(model, "_orig_mod", model)
    return model.state_dict()


def save_checkpoint(model: nn.Module, path, **extra) -> None:
    """Saves ``{'model_state': state_dict, **extra}``, the released checkpoints' format.

    The weights are under ``'model_state'``, so the file is not a state dict itself: load it with
    :func:`load_checkpoint` (``load_checkpoint(path)``, or ``load_checkpoint(path, model)`` into an
    existing network), or pass ``torch.load(path)['model_state']`` to ``model.load_state_dict``;
    ``model.load_state_dict(torch.load(path))`` raises a ValueError that says so.
    """
    state = OrderedDict((k, v.detach().cpu()) for k, v in state_dict_of(model).items())
    torch.save({"model_state": state, **extra}, path)


class CheckpointError(ValueError):
    """A file (or object) that is not a readable EDSC checkpoint: ``source`` names it (the path, or
    ``"checkpoint"`` for an object), ``problem`` says what is wrong in a few words; the message is
    ``"SOURCE: PROBLEM"``, one line."""

    def __init__(self, source, problem: str):
        super().__init__(f"{source}: {problem}")
        self.source, self.problem = str(source), problem


# A PyTorch file is a zip archive, or (the format before torch 1.6) a pickle, whose first opcode is PROTO.
_TORCH_FILE_STARTS = (b"PK\x03\x04", b"\x80")


def _starts_like_a_torch_file(path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4).startswith(_TORCH_FILE_STARTS)
    except OSError:
        return True  # unreadable: torch.load's own error says why


def read_checkpoint(path, map_location="cpu") -> dict:
    """``torch.load(path, weights_only=True)`` of a checkpoint: a dict. An OSError (a missing file, a
    folder, no permission) propagates as it is; anything else that is not a PyTorch file holding a dict
    (text, an image, random bytes, a pickle of other objects, a truncated file, a bare tensor) is a
    :class:`CheckpointError` naming the file and saying what it is instead."""
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 (text: KeyError, foreign pickle: UnpicklingError, truncated: RuntimeError)
        reason = str(e).split("\n")[0].strip()
        if not _starts_like_a_torch_file(path):  # an image, text, ...: torch's unpickler may say anything
            reason = "not a PyTorch file"
        elif "Weights only load failed" in reason or "Unsupported global" in str(e):
            reason = "a pickle of other Python objects, not tensors"
        elif isinstance(e, KeyError) or "invalid load key" in reason:
            reason = "not a PyTorch file"
        elif "central directory" in reason or isinstance(e, EOFError) or "truncated" in reason.lower():
            reason = "truncated or damaged"
        raise CheckpointError(path, f"not a readable EDSC checkpoint ({reason[:120]})") from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(path, f"not an EDSC checkpoint (it holds a {type(checkpoint).__name__}, not a dict "
                                    "of tensors)")
    return checkpoint


def _strip_prefixes(state: dict) -> dict:
    out = OrderedDict()
    for key, value in state.items():
        for prefix in ("module.", "_orig_mod."):
            while key.startswith(prefix):
                key = key[len(prefix):]
        out[key] = value
    return out


def load_checkpoint(checkpoint, model: Optional[EDSC] = None, *, map_location="cpu", sampling: str = "compat",
                    strict: bool = True) -> EDSC:
    """Loads an EDSC checkpoint (a path, or an already loaded dict) into ``model``, or into a new
    EDSC whose variant (EDSC_s/EDSC_m) and kernel size are read off the weights.

    Accepts the released format (``{'model_state': ...}``), a bare state dict, and keys prefixed by
    ``module.`` (DistributedDataParallel) or ``_orig_mod.`` (torch.compile). Loads with
    ``weights_only=True``: tensors and plain containers only, no arbitrary pickled objects. A file or
    dict that is not an EDSC checkpoint is a :class:`CheckpointError` (a ValueError) naming it and
    saying what it is instead (:func:`read_checkpoint`); weights of another shape than ``model``'s, the
    RuntimeError of ``load_state_dict``.
    """
    source = "checkpoint"
    if isinstance(checkpoint, (str, os.PathLike)):
        source, checkpoint = checkpoint, read_checkpoint(checkpoint, map_location)
    if not isinstance(checkpoint, dict):
        raise TypeError(f"expected a checkpoint dict, got {type(checkpoint).__name__}")
    state = checkpoint.get("model_state", checkpoint)
    if not isinstance(state, dict):
        raise CheckpointError(source, f"not an EDSC checkpoint (its 'model_state' is a {type(state).__name__}, "
                                      "not a dict of tensors)")
    for key in ("state_dict", "model"):
        if key in state and isinstance(state[key], dict):
            state = state[key]
    state = _strip_prefixes(state)
    if model is None:
        head, kernel = state.get("moduleVertical1.0.weight"), state.get("moduleVertical1.7.weight")
        for key, value in (("moduleVertical1.0.weight", head), ("moduleVertical1.7.weight", kernel)):
            if value is None:
                raise CheckpointError(source, f"not an EDSC checkpoint (no {key!r} in its state)")
            if not isinstance(value, Tensor) or value.dim() != 4:
                raise CheckpointError(source, f"not an EDSC checkpoint (its {key!r} is not a 4-D weight)")
        model = EDSC(kernel_size=kernel.shape[0], multiple=head.shape[1] == 65, sampling=sampling)
    model.load_state_dict(state, strict=strict)
    return model
