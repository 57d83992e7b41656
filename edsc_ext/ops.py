"""The public ``deform_sepconv`` API: argument checks, autograd and fake (meta) kernels.

This is the one place where arguments are validated and turned into the flat form that the
compiled ops take (``torch.ops.edsc_ext.deform_sepconv_forward`` / ``..._backward``). The
pure-PyTorch reference (:mod:`edsc_ext.reference`) uses the same :func:`normalize_args`, so the
two can never disagree about what a call means.
"""

from __future__ import annotations

import json
import math
from typing import Dict, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

__all__ = ["deform_sepconv", "upsample_bilinear2x", "avg_pool2x", "normalize_args", "check_geometry", "split_offset",
           "DeformSepconvArgs", "SPEC", "PADDING_MODES", "MAX_KERNEL_WIDTH", "MIXED_PRECISION"]


# --------------------------------------------------------------------------------------------
# What the op accepts: the compiled library's spec (include/edsc_ext/spec.h), read once.


class PaddingModeSpec(NamedTuple):
    """A padding mode and its traits, as the kernels branch on them (include/edsc_ext/spec.h)."""

    name: str
    code: int  # padding_mode in the compiled ops' schemas
    clamps: bool  # coordinates clamped into the image (replicate padding); else pixels outside are 0
    doubles_border: bool  # the border pixel counts twice outside [-pad, size - 1 + pad) along an axis
    shifts_taps: bool  # tap 0 moved by 1 - (K-1)//2 along each axis
    grid_taps: bool  # calls without offsets or dilation may take the grid-tap kernels
    bound_factor: int  # the largest factor of a sample's weight
    description: str


class OpSpec(NamedTuple):
    """What ``deform_sepconv`` accepts, as the compiled library states it
    (``torch.ops.edsc_ext.deform_sepconv_spec``)."""

    padding_modes: Tuple[PaddingModeSpec, ...]
    dtype_pairs: Tuple[Tuple[torch.dtype, torch.dtype], ...]  # (frame, per-pixel tensors)
    min_kernel_size: int
    max_kernel_width: int  # the backward keeps one accumulator per horizontal tap
    min_padding: int
    min_dilation: int
    specialized_kernel: int  # KH = KW of the specialised kernels (EDSC's 5x5)
    frame_dtypes_text: str  # "float64, float32, float16 or bfloat16", as the messages name them
    dtype_rule: str  # "per-pixel tensors must have the input's dtype, or ..."

    def padding_mode(self, name: str) -> PaddingModeSpec:
        return next(mode for mode in self.padding_modes if mode.name == name)


def _read_spec() -> OpSpec:
    raw = json.loads(torch.ops.edsc_ext.deform_sepconv_spec())
    dtype = {str(d).removeprefix("torch."): d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16)}
    return OpSpec(padding_modes=tuple(PaddingModeSpec(**mode) for mode in raw["padding_modes"]),
                  dtype_pairs=tuple((dtype[frame], dtype[per_pixel]) for frame, per_pixel in raw["dtype_pairs"]),
                  min_kernel_size=raw["min_kernel_size"], max_kernel_width=raw["max_kernel_width"],
                  min_padding=raw["min_padding"], min_dilation=raw["min_dilation"],
                  specialized_kernel=raw["specialized_kernel"], frame_dtypes_text=raw["messages"]["frame_dtypes"],
                  dtype_rule=raw["messages"]["dtype_rule"])


SPEC = _read_spec()
# padding_mode name -> the integer code the compiled ops take.
PADDING_MODES: Dict[str, int] = {mode.name: mode.code for mode in SPEC.padding_modes}
MAX_KERNEL_WIDTH = SPEC.max_kernel_width
# The per-pixel dtypes the kernels read natively with a frame of another dtype (mixed precision):
# float16 / bfloat16 kernels, offsets and masks with a float32 frame, as autocast makes them.
MIXED_PRECISION: Dict[torch.dtype, Tuple[torch.dtype, ...]] = {}
for _frame, _per_pixel in SPEC.dtype_pairs:
    if _per_pixel != _frame:
        MIXED_PRECISION[_frame] = MIXED_PRECISION.get(_frame, ()) + (_per_pixel,)
# For the checks of every call: the spec's values as plain module constants (a set lookup, no attribute).
_FRAME_DTYPES = frozenset(frame for frame, _ in SPEC.dtype_pairs)
_DTYPE_PAIRS = frozenset(SPEC.dtype_pairs)
_MIN_KERNEL_SIZE, _MIN_PADDING, _MIN_DILATION = SPEC.min_kernel_size, SPEC.min_padding, SPEC.min_dilation

IntPair = Union[int, Sequence[int]]


class DeformSepconvArgs(NamedTuple):
    input: Tensor
    vertical: Optional[Tensor]
    horizontal: Optional[Tensor]
    offset: Optional[Tensor]
    mask: Optional[Tensor]
    kernel_h: int
    kernel_w: int
    pad_h: int
    pad_w: int
    dilation_h: int
    dilation_w: int
    padding_mode: str
    # Split offsets: ``offset`` holds the dy of every tap, (N, KH*KW, H_out, W_out), and this the dx.
    offset_dx: Optional[Tensor] = None

    @property
    def padding_mode_code(self) -> int:
        return PADDING_MODES[self.padding_mode]

    @property
    def per_pixel(self) -> tuple:
        """(vertical, horizontal, offset, mask, offset_dx)."""
        return (self.vertical, self.horizontal, self.offset, self.mask, self.offset_dx)

    def op_kwargs(self) -> dict:
        """The arguments of ``torch.ops.edsc_ext.deform_sepconv_forward`` by their schema names (the fields
        here, padding_mode as its code); the backward and the plan op take them too, with their own."""
        kwargs = self._asdict()
        kwargs["padding_mode"] = PADDING_MODES[self.padding_mode]
        return kwargs

    def op_args(self) -> tuple:
        """The same values in the forward schema's order, which the fields follow (checked at import
        against the schema's names): torch parses keyword arguments by name, a few µs a call."""
        return (*self[:_PADDING_MODE], PADDING_MODES[self.padding_mode], *self[_PADDING_MODE + 1:])

    @property
    def output_size(self) -> Tuple[int, int]:
        return output_size(self.input.shape[2], self.input.shape[3], self.kernel_h, self.kernel_w,
                           self.pad_h, self.pad_w, self.dilation_h, self.dilation_w)


# Where padding_mode sits among the fields (op_args puts its code there).
_PADDING_MODE = DeformSepconvArgs._fields.index("padding_mode")


def output_size(h_in: int, w_in: int, kh: int, kw: int, ph: int, pw: int, dh: int, dw: int) -> Tuple[int, int]:
    return h_in + 2 * ph - dh * (kh - 1), w_in + 2 * pw - dw * (kw - 1)


def _pair(value, name: str, minimum: int) -> Tuple[int, int]:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int or a pair of ints, got bool {value!r}")
    if isinstance(value, int):
        pair = (value, value)
    elif isinstance(value, (tuple, list, torch.Size)) and len(value) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        pair = (int(value[0]), int(value[1]))
    else:
        raise TypeError(f"{name} must be an int or a pair (h, w) of ints, got {value!r}")
    if min(pair) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return pair


def _check_tensor(t, name: str, input: Tensor, optional: bool = True) -> None:
    if t is None:
        if optional:
            return
        raise TypeError(f"{name} must be a Tensor, got None")
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a Tensor{' or None' if optional else ''}, got {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name} must have a floating dtype ({SPEC.frame_dtypes_text}), got {t.dtype}")
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-D, got {t.dim()}-D tensor of shape {tuple(t.shape)}")
    if t is input:
        return
    if t.device != input.device:
        raise ValueError(f"{name} is on {t.device} but input is on {input.device}; "
                         "all tensors must be on one device")
    if t.shape[0] != input.shape[0]:
        raise ValueError(f"{name} has batch size {t.shape[0]} but input has batch size {input.shape[0]}")


def natively_supported(frame_dtype: torch.dtype, per_pixel_dtype: torch.dtype) -> bool:
    """Whether the kernels take a frame of ``frame_dtype`` with per-pixel tensors of ``per_pixel_dtype``
    (a pair of ``SPEC.dtype_pairs``)."""
    return (frame_dtype, per_pixel_dtype) in _DTYPE_PAIRS


def _check_dtypes(input: Tensor, named_per_pixel) -> None:
    """The dtype rule: the per-pixel tensors share one dtype, the input's or (mixed precision) a
    half type with a float32 input (``SPEC.dtype_pairs``); the output and the input's gradient have
    the input's dtype, each per-pixel gradient its tensor's."""
    frame = input.dtype
    if frame not in _FRAME_DTYPES:
        raise TypeError(f"input must be {SPEC.frame_dtypes_text}, got {frame}")
    present = [(name, t) for name, t in named_per_pixel if t is not None]
    if not present:
        return
    first_name, first = present[0]
    per_pixel = first.dtype
    for name, t in present[1:]:
        if t.dtype != per_pixel:
            raise TypeError(f"{name} has dtype {t.dtype} but {first_name} has dtype {per_pixel}; the per-pixel "
                            "tensors must share one dtype (cast them, or use autocast)")
    if (frame, per_pixel) not in _DTYPE_PAIRS:
        raise TypeError(f"{first_name} has dtype {per_pixel} but input has dtype {frame}; {SPEC.dtype_rule} "
                        "(cast them, or use autocast)")


def check_geometry(kernel_size, padding, dilation, padding_mode):
    """Checks the call's geometry arguments; returns (kernel_size pair or None, padding, dilation)."""
    if padding_mode not in PADDING_MODES:
        raise ValueError(f"padding_mode must be one of {sorted(PADDING_MODES)}, got {padding_mode!r}")
    kernel_size = None if kernel_size is None else _pair(kernel_size, "kernel_size", _MIN_KERNEL_SIZE)
    return kernel_size, _pair(padding, "padding", _MIN_PADDING), _pair(dilation, "dilation", _MIN_DILATION)


def split_offset(offset):
    """``offset`` as the op takes it: a tensor (or None) -> (offset, None); a pair ``(dy, dx)`` of
    tensors (split offsets) -> (dy, dx)."""
    if isinstance(offset, (tuple, list)):
        if len(offset) != 2 or not all(isinstance(t, Tensor) for t in offset):
            raise TypeError("offset must be a Tensor, None, or a pair (dy, dx) of Tensors, got a "
                            f"{type(offset).__name__} of {[type(t).__name__ for t in offset]}")
        return offset[0], offset[1]
    return offset, None


def normalize_args(input, vertical=None, horizontal=None, offset=None, mask=None, *,
                   kernel_size=None, padding=0, dilation=1, padding_mode="zeros") -> DeformSepconvArgs:
    """Validate a ``deform_sepconv`` call and resolve kernel size, padding and dilation.

    Raises TypeError for wrong types/dtypes and ValueError for wrong shapes, devices and values,
    each naming the argument with what was expected and what was given.
    """
    offset, offset_dx = split_offset(offset)
    offset_name = "offset" if offset_dx is None else "offset[0] (dy)"
    _check_tensor(input, "input", input, optional=False)
    for name, t in (("vertical", vertical), ("horizontal", horizontal), ("offset", offset), ("mask", mask)):
        _check_tensor(t, offset_name if name == "offset" else name, input)
    _check_tensor(offset_dx, "offset[1] (dx)", input)
    _check_dtypes(input, (("vertical", vertical), ("horizontal", horizontal), (offset_name, offset),
                          ("offset[1] (dx)", offset_dx), ("mask", mask)))
    kernel_size, (ph, pw), (dh, dw) = check_geometry(kernel_size, padding, dilation, padding_mode)

    kh = vertical.shape[1] if vertical is not None else None
    kw = horizontal.shape[1] if horizontal is not None else None
    if kernel_size is not None:
        ks_h, ks_w = kernel_size
        if kh is not None and kh != ks_h:
            raise ValueError(f"kernel_size says KH={ks_h} but vertical has {kh} channels (KH)")
        if kw is not None and kw != ks_w:
            raise ValueError(f"kernel_size says KW={ks_w} but horizontal has {kw} channels (KW)")
        kh, kw = ks_h, ks_w
    if kh is None or kw is None:
        # Split offsets have one channel a tap, as the mask has.
        kh, kw = _infer_kernel_size(kh, kw, offset if offset_dx is None else None,
                                    mask if offset_dx is None or mask is not None else offset)
    if kh < _MIN_KERNEL_SIZE or kw < _MIN_KERNEL_SIZE:
        raise ValueError(f"vertical/horizontal must have at least {_MIN_KERNEL_SIZE} tap, got KH={kh}, KW={kw}")
    if kw > MAX_KERNEL_WIDTH:
        raise ValueError(f"kernel width KW={kw} exceeds the supported maximum {MAX_KERNEL_WIDTH}")

    taps = kh * kw
    if offset_dx is not None:
        for name, t in (("offset[0] (dy)", offset), ("offset[1] (dx)", offset_dx)):
            if t.shape[1] != taps:
                raise ValueError(f"{name} must have KH*KW = {taps} channels for KH={kh}, KW={kw} (split offsets: "
                                 f"one tensor of dy, one of dx), got {t.shape[1]} (shape {tuple(t.shape)})")
    elif offset is not None and offset.shape[1] != 2 * taps:
        raise ValueError(f"offset must have 2*KH*KW = {2 * taps} channels for KH={kh}, KW={kw}, "
                         f"got {offset.shape[1]} (shape {tuple(offset.shape)})")
    if mask is not None and mask.shape[1] != taps:
        raise ValueError(f"mask must have KH*KW = {taps} channels for KH={kh}, KW={kw}, "
                         f"got {mask.shape[1]} (shape {tuple(mask.shape)})")

    h_out, w_out = output_size(input.shape[2], input.shape[3], kh, kw, ph, pw, dh, dw)
    if h_out < 0 or w_out < 0:
        raise ValueError(
            f"output size would be negative: H_out = H_in + 2*pad_h - dilation_h*(KH-1) = {h_out}, "
            f"W_out = W_in + 2*pad_w - dilation_w*(KW-1) = {w_out} for input of shape {tuple(input.shape)}, "
            f"KH={kh}, KW={kw}, padding=({ph}, {pw}), dilation=({dh}, {dw})")
    for name, t in (("vertical", vertical), ("horizontal", horizontal), (offset_name, offset), ("mask", mask),
                    ("offset[1] (dx)", offset_dx)):
        if t is not None and tuple(t.shape[2:]) != (h_out, w_out):
            raise ValueError(f"{name} must have spatial size (H_out, W_out) = {(h_out, w_out)}, "
                             f"got {tuple(t.shape[2:])} (shape {tuple(t.shape)})")
    return DeformSepconvArgs(input, vertical, horizontal, offset, mask, kh, kw, ph, pw, dh, dw, padding_mode,
                             offset_dx)


def _infer_kernel_size(kh, kw, offset, mask) -> Tuple[int, int]:
    if offset is not None:
        if offset.shape[1] % 2:
            raise ValueError(f"offset must have an even number (2*KH*KW) of channels, got {offset.shape[1]}")
        taps, source = offset.shape[1] // 2, "offset"
    elif mask is not None:
        taps, source = mask.shape[1], "mask"
    else:
        raise ValueError("cannot tell the kernel size: pass vertical and horizontal, or kernel_size=(KH, KW)")
    known = kh if kh is not None else kw
    if known is not None:
        if taps % known:
            raise ValueError(f"{source} has {taps} taps, which is not a multiple of the "
                             f"{'KH' if kh is not None else 'KW'}={known} given")
        return (kh, taps // kh) if kh is not None else (taps // kw, kw)
    if taps == 1:
        return 1, 1
    shapes = [f"{h}x{taps // h}" for h in range(1, taps + 1) if taps % h == 0]
    listed = ", ".join(shapes if len(shapes) <= 6 else shapes[:3] + ["..."] + shapes[-2:])
    root = math.isqrt(taps)
    hint = f"kernel_size={root} or " if root * root == taps else ""
    raise ValueError(f"{source} has {taps} taps, which fits {len(shapes)} kernel sizes KHxKW ({listed}): "
                     f"pass {hint}kernel_size=(KH, KW)")


def deform_sepconv(input: Tensor, vertical: Optional[Tensor] = None, horizontal: Optional[Tensor] = None,
                   offset: Union[None, Tensor, Tuple[Tensor, Tensor]] = None, mask: Optional[Tensor] = None, *,
                   kernel_size: Optional[IntPair] = None, padding: IntPair = 0, dilation: IntPair = 1,
                   padding_mode: str = "zeros") -> Tensor:
    r"""Adaptive deformable separable convolution (sepconv, DSepConv/EDSC, AdaCoF).

    ``out[n,c,y,x] = sum_{i<KH, j<KW} V[n,i,y,x] * Hz[n,j,y,x] * M[n,t,y,x] * S(input[n,c], py, px)``
    with ``t = i*KW + j``, ``py = y - pad_h + i*dil_h + offset[n,2t,y,x]`` and
    ``px = x - pad_w + j*dil_w + offset[n,2t+1,y,x]``; S is bilinear sampling (align_corners=True).
    A missing vertical, horizontal or mask counts as all ones, a missing offset as all zeros.

    Args:
        input: (N, C, H_in, W_in) frame or feature map.
        vertical: (N, KH, H_out, W_out) per-pixel vertical kernels.
        horizontal: (N, KW, H_out, W_out) per-pixel horizontal kernels.
        offset: (N, 2*KH*KW, H_out, W_out), (dy, dx) per tap, torchvision ``deform_conv2d`` layout;
            or a pair ``(dy, dx)`` of (N, KH*KW, H_out, W_out) tensors (split offsets, as networks
            with one head per component make them), read where they are, with no stacked copy.
        mask: (N, KH*KW, H_out, W_out) per-tap modulation.
            The per-pixel tensors (vertical, horizontal, offset, mask) share one dtype: the input's,
            or float16 / bfloat16 with a float32 input (mixed precision, read as it is, computed in
            float32; under autocast see :func:`edsc_ext.ops.autocast_dtypes`).
        kernel_size: (KH, KW) when vertical or horizontal is absent and it cannot be inferred.
        padding: int or (pad_h, pad_w), virtual padding of the input (no padded copy is made).
        dilation: int or (dil_h, dil_w) spacing of the taps.
        padding_mode: ``"zeros"`` (outside pixels are 0), ``"border"`` (coordinates are clamped
            into the image, i.e. replicate padding; the offset gradient is 0 where clamped) or
            ``"edsc"``, the sampling of the EDSC layer (:mod:`edsc_ext.models.compat`): border mode with
            taps moved by ``s = 1 - (K-1)//2`` along each axis (``py = y - pad_h + i*dil_h + s_h +
            dy``; at K=5 one pixel up-left of centred) and, along each axis, the border pixel
            counted twice where the coordinate lies outside ``[-pad, size - 1 + pad)``, i.e. outside
            ``[0, padded size - 1)`` of the frame replicate-padded by ``padding``.

    Returns:
        (N, C, H_out, W_out) tensor of the input's dtype, ``H_out = H_in + 2*pad_h - dil_h*(KH-1)`` (likewise W_out),
        in ``torch.channels_last`` when ``input`` is (and not also contiguous), else contiguous;
        the gradients follow the same rule. Tensors already in that memory format are used in
        place, others are converted once (the CUDA backward of a channels_last call with more
        than 4 channels runs on NCHW copies, which is faster there).
    """
    args = _promoted_args(input, vertical, horizontal, offset, mask, kernel_size=kernel_size, padding=padding,
                          dilation=dilation, padding_mode=padding_mode)
    return torch.ops.edsc_ext.deform_sepconv_forward(*args.op_args())


def _promoted_args(input, vertical, horizontal, offset, mask, **geometry) -> DeformSepconvArgs:
    """normalize_args() of a call after the autocast policy (_autocast_promote), split offsets included."""
    offset, offset_dx = split_offset(offset)
    input, vertical, horizontal, offset, mask, offset_dx = _autocast_promote(
        input, vertical, horizontal, offset, mask, offset_dx)
    return normalize_args(input, vertical, horizontal, offset if offset_dx is None else (offset, offset_dx), mask,
                          **geometry)


def _autocast_enabled(device_type: str) -> bool:
    if device_type not in ("cpu", "cuda"):
        return False  # meta, and devices whose autocast this op has no policy for
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 took no device type
        return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()


def promoted_dtype(dtypes) -> torch.dtype:
    """The widest floating dtype among ``dtypes``, with float16 and bfloat16 together promoted to
    float32 (neither holds the other)."""
    dtypes = set(dtypes)
    if torch.float64 in dtypes:
        return torch.float64
    if torch.float32 in dtypes or {torch.float16, torch.bfloat16} <= dtypes:
        return torch.float32
    return dtypes.pop()


def autocast_dtypes(frame_dtype: torch.dtype, per_pixel_dtypes) -> Tuple[torch.dtype, torch.dtype]:
    """The autocast policy of deform_sepconv: the (frame, per-pixel) dtypes a call runs in.

    Nothing is ever downcast: the op is numerically sensitive (positions are offsets added to pixel
    coordinates), and an autocast network's float32 frame stays float32. Per-pixel tensors of
    several dtypes meet at their widest (promoted_dtype). A pair the kernels read natively
    (natively_supported: the same dtype, or half-type per-pixel tensors with a float32 frame, the
    usual autocast case) is then used as it is, with no copy; any other pair runs in the wider of
    the two for all tensors (a float16 frame with float32 kernels: float32).
    """
    per_pixel = promoted_dtype(per_pixel_dtypes) if per_pixel_dtypes else frame_dtype
    if natively_supported(frame_dtype, per_pixel):
        return frame_dtype, per_pixel
    widest = promoted_dtype({frame_dtype, per_pixel})
    return widest, widest


def _autocast_promote(input, *per_pixel):
    """Under autocast, cast the arguments to the dtypes of autocast_dtypes() instead of failing on
    mixed dtypes. The casts are differentiable, so each argument's gradient comes back in its own
    dtype; tensors already in their dtype are passed as they are.
    """
    if not isinstance(input, Tensor) or not _autocast_enabled(input.device.type) or not input.dtype.is_floating_point:
        return (input, *per_pixel)
    floating = {t.dtype for t in per_pixel if isinstance(t, Tensor) and t.dtype.is_floating_point}
    frame_dtype, per_pixel_dtype = autocast_dtypes(input.dtype, floating)

    def cast(t, dtype):
        return t.to(dtype) if isinstance(t, Tensor) and t.dtype.is_floating_point and t.dtype != dtype else t

    return (cast(input, frame_dtype), *(cast(t, per_pixel_dtype) for t in per_pixel))


# --------------------------------------------------------------------------------------------
# Kernel plans: which kernels a call runs (the planners in src/cpu/cpu_plan.h and
# src/cuda/cuda_plan.h).


class KernelPlans(NamedTuple):
    """The names of the forward and backward plans of a call (``"none"``: no backward runs,
    since no argument requires a gradient)."""

    forward: str
    backward: str


class CudaDeviceFacts(NamedTuple):
    """What the CUDA planner needs to know about a device, for planning without one."""

    major: int
    minor: int
    shared_memory_per_block_optin: int

    @classmethod
    def of(cls, device) -> "CudaDeviceFacts":
        props = torch.cuda.get_device_properties(device)
        return cls(props.major, props.minor, props.shared_memory_per_block_optin)


class CpuFacts(NamedTuple):
    """What the CPU planner needs to know about a machine, for planning for another one."""

    avx2: bool
    threads: int


# The H200 of the benchmarks (sm_90, 227 KB of shared memory a block).
H200 = CudaDeviceFacts(9, 0, 232448)


def _plan(input: Tensor, vertical: Optional[Tensor] = None, horizontal: Optional[Tensor] = None,
          offset: Optional[Tensor] = None, mask: Optional[Tensor] = None, *,
          kernel_size: Optional[IntPair] = None, padding: IntPair = 0, dilation: IntPair = 1,
          padding_mode: str = "zeros", device: Union[None, str, torch.device, CudaDeviceFacts, CpuFacts] = None
          ) -> KernelPlans:
    """The plans a :func:`deform_sepconv` call with these arguments would run, under the current
    :func:`edsc_ext.kernel_policy` and ``torch.use_deterministic_algorithms`` setting; the backward
    plan is that of the gradients the arguments require.

    ``device`` (default: the input's) plans for another device: ``"cpu"``, a CUDA device, or a
    described one (:class:`CudaDeviceFacts`, :class:`CpuFacts`), so that meta tensors describe the
    call without memory or a GPU.
    """
    args = _promoted_args(input, vertical, horizontal, offset, mask, kernel_size=kernel_size, padding=padding,
                          dilation=dilation, padding_mode=padding_mode)
    kwargs = args.op_kwargs()
    # The gradients the backward would compute, in its output_mask's order.
    output_mask = [kwargs[name] is not None and kwargs[name].requires_grad for name in _GRADIENT_OF[:5]]
    target = input.device if device is None else device
    if isinstance(target, str):
        target = torch.device(target)
    cpu_facts, cuda_device = [], []
    if isinstance(target, CudaDeviceFacts):
        cuda_device = list(target)
    elif isinstance(target, CpuFacts):
        cpu_facts = [int(target.avx2), int(target.threads)]
    elif isinstance(target, torch.device) and target.type == "cuda":
        cuda_device = list(CudaDeviceFacts.of(target))
    elif not (isinstance(target, torch.device) and target.type == "cpu"):
        raise ValueError(f"_plan: device must be 'cpu', a CUDA device, CudaDeviceFacts or CpuFacts, got {target!r} "
                         f"(meta tensors need device=...)")
    offset_dx = args.offset_dx
    output_mask[3] = output_mask[3] or (offset_dx is not None and offset_dx.requires_grad)
    detached = {name: value.detach() if isinstance(value, Tensor) else value for name, value in kwargs.items()}
    names = torch.ops.edsc_ext.deform_sepconv_plan(**detached, output_mask=output_mask, cpu_facts=cpu_facts,
                                                   cuda_device=cuda_device,
                                                   deterministic=torch.are_deterministic_algorithms_enabled())
    return KernelPlans(*names)


# --------------------------------------------------------------------------------------------
# Fake kernels (shape propagation for torch.compile / meta tensors) and autograd.


@torch.library.register_fake("edsc_ext::deform_sepconv_forward")
def _deform_sepconv_forward_fake(input, vertical, horizontal, offset, mask,
                                 kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode,
                                 offset_dx=None):
    n, c, h_in, w_in = input.shape
    h_out, w_out = output_size(h_in, w_in, kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w)
    return _in_layout_of(input, input.new_empty((n, c, h_out, w_out)))


def _in_layout_of(input, result):
    """A channels_last input makes the call channels_last (wants_channels_last in src/deform_sepconv_call.cpp)."""
    if (result.dim() == 4 and not input.is_contiguous()
            and input.is_contiguous(memory_format=torch.channels_last)):
        return result.contiguous(memory_format=torch.channels_last)
    return result


@torch.library.register_fake("edsc_ext::deform_sepconv_backward")
def _deform_sepconv_backward_fake(grad_output, input, vertical, horizontal, offset, mask,
                                  kernel_h, kernel_w, pad_h, pad_w, dilation_h, dilation_w, padding_mode,
                                  output_mask, offset_dx=None, deterministic=False):
    def like(t, wanted):
        # Gradients that were not asked for come back as empty tensors (allocate_grads in src/deform_sepconv_call.cpp).
        return t.new_empty(t.shape) if (t is not None and wanted) else input.new_empty((0,))

    # Every requested gradient comes in the call's memory format, as the output does; output_mask[3]
    # asks for both offset gradients of split offsets.
    return tuple(_in_layout_of(input, like(t, m))
                 for t, m in zip((input, vertical, horizontal, offset, mask, offset_dx), list(output_mask) +
                                 [output_mask[3]]))


# The compiled ops' arguments by name, read from their schemas: the forward's, those of them that
# are tensors (saved for the backward; the others are the geometry), and the tensor whose gradient
# each of the backward's returns is (output_mask asks for the first five; grad_offset_dx comes with
# grad_offset).
_FORWARD_SCHEMA = torch.ops.edsc_ext.deform_sepconv_forward.default._schema
_FORWARD_ARGUMENTS = tuple(a.name for a in _FORWARD_SCHEMA.arguments)
_FORWARD_TENSORS = tuple(a.name for a in _FORWARD_SCHEMA.arguments if "Tensor" in str(a.type))
_BACKWARD_SCHEMA = torch.ops.edsc_ext.deform_sepconv_backward.default._schema
_BACKWARD_ARGUMENTS = tuple(a.name for a in _BACKWARD_SCHEMA.arguments)
_GRADIENT_OF = tuple(r.name.removeprefix("grad_") for r in _BACKWARD_SCHEMA.returns)
if DeformSepconvArgs._fields != _FORWARD_ARGUMENTS:
    raise ImportError(f"edsc_ext.ops: DeformSepconvArgs has the fields {DeformSepconvArgs._fields}, but the compiled "
                      f"deform_sepconv_forward takes {_FORWARD_ARGUMENTS}: the Python package and the binary differ")


def _setup_context(ctx, inputs, output):
    args = dict(zip(_FORWARD_ARGUMENTS, inputs))
    ctx.save_for_backward(*(args.get(name) for name in _FORWARD_TENSORS))
    ctx.geometry = {name: args[name] for name in _FORWARD_ARGUMENTS if name not in _FORWARD_TENSORS}


def _backward(ctx, grad_output):
    tensors = dict(zip(_FORWARD_TENSORS, ctx.saved_tensors))
    needs = dict(zip(_FORWARD_ARGUMENTS, ctx.needs_input_grad))
    wanted = {name: bool(needs.get(name)) and tensors[name] is not None for name in _FORWARD_TENSORS}
    output_mask = [wanted[name] for name in _GRADIENT_OF[:5]]
    output_mask[3] = output_mask[3] or wanted["offset_dx"]
    grads = {}
    if any(output_mask):
        # The compiled op cannot ask torch for the determinism setting (the stable ABI has no call for it).
        values = {**tensors, **ctx.geometry, "grad_output": grad_output, "output_mask": output_mask,
                  "deterministic": torch.are_deterministic_algorithms_enabled()}
        # In the schema's order, by its names (torch parses keyword arguments by name, a few µs a call).
        returned = torch.ops.edsc_ext.deform_sepconv_backward(*(values[name] for name in _BACKWARD_ARGUMENTS))
        grads = dict(zip(_GRADIENT_OF, returned))
    # One gradient per input the call passed (None for the geometry and for what was not wanted).
    return tuple(grads[name] if wanted.get(name) else None for name in _FORWARD_ARGUMENTS[:len(ctx.needs_input_grad)])


torch.library.register_autograd("edsc_ext::deform_sepconv_forward", _backward, setup_context=_setup_context)


# --------------------------------------------------------------------------------------------
# vector_add: the smallest end-to-end example of the build and of device handling.


def vector_add(a: Tensor, b: Tensor) -> Tensor:
    """Elementwise ``a + b`` through the compiled extension, on the tensors' own device."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a Tensor, got {type(t).__name__}")
    if a.device != b.device:
        raise ValueError(f"b is on {b.device} but a is on {a.device}; both must be on one device")
    if a.dtype != b.dtype:
        raise TypeError(f"b has dtype {b.dtype} but a has dtype {a.dtype}; both must share one dtype")
    if a.shape != b.shape:
        raise ValueError(f"b has shape {tuple(b.shape)} but a has shape {tuple(a.shape)}; shapes must match")
    return torch.ops.edsc_ext.vector_add(a, b)


@torch.library.register_fake("edsc_ext::vector_add")
def _vector_add_fake(a, b):
    return torch.empty_like(a, memory_format=torch.contiguous_format)


def _vector_add_backward(ctx, grad):
    return grad, grad


torch.library.register_autograd("edsc_ext::vector_add", _vector_add_backward)


# --------------------------------------------------------------------------------------------
# upsample_bilinear2x: the EDSC networks' bilinear 2x upsampling (edsc_ext.models.upsample2x).

def upsample_bilinear2x(input: Tensor) -> Tensor:
    """``F.interpolate(input, scale_factor=2, mode="bilinear", align_corners=True)`` through the compiled
    extension, on the tensor's own device: (N, C, H, W) to (N, C, 2H, 2W) in ``input``'s dtype (the half
    types computed in float32 and rounded once, as ATen computes them, so the values equal
    F.interpolate's up to the order of the float32 operations), channels_last where ``input`` is, as
    F.interpolate's output. On CUDA each thread writes 16 bytes of the output, the traffic that bounds
    it; ATen's channels_last kernel writes one value a thread (issue #43). Differentiable: its backward
    is ATen's ``upsample_bilinear2d_backward``."""
    _check_resample2x_input(input, least=1)
    return torch.ops.edsc_ext.upsample_bilinear2x(input)


def _check_resample2x_input(input, least: int) -> None:
    """The 2x resampling ops' checks (src/resample2x_call.cpp makes them too), with Python's exception types."""
    if not isinstance(input, Tensor):
        raise TypeError(f"input must be a Tensor, got {type(input).__name__}")
    if input.dim() != 4:
        raise ValueError(f"input must be 4-D (N, C, H, W), got shape {tuple(input.shape)}")
    if input.dtype not in _FRAME_DTYPES:  # the dtypes the kernels compute in, as deform_sepconv's frame
        raise TypeError(f"input must be {SPEC.frame_dtypes_text}, got {input.dtype}")
    if input.shape[2] < least or input.shape[3] < least:
        raise ValueError(f"input's height and width must be at least {least}, got shape {tuple(input.shape)}")


def _resample2x_memory_format(input: Tensor) -> torch.memory_format:
    """The output's memory format (src/resample2x_call.cpp): channels_last where ``input``'s strides run in
    that order (ATen's is_channels_last_strides_2d: dense, or a view such as a channel slice), as the
    outputs of F.interpolate and F.avg_pool2d."""
    sizes, strides = input.shape, input.stride()
    if strides[1] == 0:
        return torch.contiguous_format
    least = 0
    for d in (1, 3, 2, 0):
        if sizes[d] == 0 or strides[d] < least or (d == 0 and least == strides[1]):
            return torch.contiguous_format
        least = strides[d] * (sizes[d] if sizes[d] > 1 else 1)
    return torch.channels_last


@torch.library.register_fake("edsc_ext::upsample_bilinear2x")
def _upsample_bilinear2x_fake(input):
    n, c, h, w = input.shape
    return torch.empty((n, c, 2 * h, 2 * w), dtype=input.dtype, device=input.device,
                       memory_format=_resample2x_memory_format(input))


def _upsample_bilinear2x_setup_context(ctx, inputs, output):
    ctx.input_size = list(inputs[0].shape)


def _interpolation_matrix(n, like: Tensor) -> Tensor:
    """The (2n, n) matrix of bilinear 2x upsampling with the corners aligned along one axis, in ``like``'s dtype."""
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    position = torch.arange(2 * n, device=like.device, dtype=dtype) * ((n - 1) / (2 * n - 1))
    lo = position.floor().long()
    frac = position - lo
    matrix = torch.zeros(2 * n, n, device=like.device, dtype=dtype)
    matrix.scatter_add_(1, lo.unsqueeze(1), (1 - frac).unsqueeze(1))
    matrix.scatter_add_(1, (lo + 1).clamp(max=n - 1).unsqueeze(1), frac.unsqueeze(1))
    return matrix


def _upsample_bilinear2x_backward(ctx, grad):
    n, c, h, w = ctx.input_size
    if not any(isinstance(size, torch.SymInt) for size in ctx.input_size):
        return torch.ops.aten.upsample_bilinear2d_backward(grad, [2 * h, 2 * w], ctx.input_size, True, None, None)
    # Traced with symbolic sizes (torch.compile(dynamic=True)), where ATen's backward has no symbolic meta kernel:
    # the same adjoint as two small matrix products, the transposed interpolation along each axis.
    rows, cols = _interpolation_matrix(h, grad), _interpolation_matrix(w, grad)
    return torch.einsum("yh,ncyx,xw->nchw", rows, grad.to(rows.dtype), cols).to(grad.dtype)


torch.library.register_autograd("edsc_ext::upsample_bilinear2x", _upsample_bilinear2x_backward,
                                setup_context=_upsample_bilinear2x_setup_context)


# --------------------------------------------------------------------------------------------
# avg_pool2x: the EDSC networks' 2x2 average pooling (the U-Net's encoder).

def avg_pool2x(input: Tensor) -> Tensor:
    """``F.avg_pool2d(input, 2)`` through the compiled extension, on the tensor's own device: (N, C, H, W)
    to (N, C, H // 2, W // 2) in ``input``'s dtype, each value the mean of a 2x2 block summed as ATen sums
    it (in float32 for the half types, rounded once: F.avg_pool2d's values bit for bit), channels_last
    where ``input`` is, as F.avg_pool2d's output. On CUDA each thread reads its four input pixels'
    channels and writes the output with 16-byte accesses, the traffic that bounds it; ATen's
    channels_last kernel reads and writes one value a thread (issue #43). Differentiable: each input
    value's gradient is a quarter of its block's (zero for a last odd row or column)."""
    _check_resample2x_input(input, least=2)
    return torch.ops.edsc_ext.avg_pool2x(input)


@torch.library.register_fake("edsc_ext::avg_pool2x")
def _avg_pool2x_fake(input):
    n, c, h, w = input.shape
    return torch.empty((n, c, h // 2, w // 2), dtype=input.dtype, device=input.device,
                       memory_format=_resample2x_memory_format(input))


def _avg_pool2x_setup_context(ctx, inputs, output):
    ctx.input_size = list(inputs[0].shape)
    ctx.memory_format = _resample2x_memory_format(inputs[0])


def _avg_pool2x_backward(ctx, grad):
    """Each output's gradient spread over its 2x2 block, divided by 4 (ATen's avg_pool2d_backward, without
    the input tensor it would keep alive), in the input's memory format."""
    n, c, h, w = ctx.input_size
    oh, ow = grad.shape[2], grad.shape[3]
    quarter = (grad / 4).permute(0, 2, 3, 1)  # (N, OH, OW, C): channels_last's order, where grad is
    blocks = quarter[:, :, None, :, None, :].expand(n, oh, 2, ow, 2, c).reshape(n, 2 * oh, 2 * ow, c)
    out = blocks.permute(0, 3, 1, 2)
    if 2 * oh != h or 2 * ow != w:
        out = torch.nn.functional.pad(out, (0, w - 2 * ow, 0, h - 2 * oh))
    return out.contiguous(memory_format=ctx.memory_format)


torch.library.register_autograd("edsc_ext::avg_pool2x", _avg_pool2x_backward, setup_context=_avg_pool2x_setup_context)
