"""ONNX export of models that use :func:`edsc_ext.deform_sepconv`, without a plugin.

    import edsc_ext.models.onnx
    edsc_ext.models.onnx.export(model, (frame0, frame1), "edsc.onnx")  # dynamic batch, height and width

:func:`export` is :func:`torch.onnx.export` (the dynamo exporter) with a translation of
``torch.ops.edsc_ext.deform_sepconv_forward`` into standard ONNX operators: every tap's sample
position goes into one grid for ``GridSample`` (opset 20, bilinear, ``zeros`` or ``border``
padding), the samples are weighted by vertical * horizontal * mask and summed over the taps (the
formulation of :func:`edsc_ext.reference.deform_sepconv_grid_sample`). ONNX Runtime, TensorRT and
other runtimes with GridSample run the model as it is. The translation is available on its own for
your own ``torch.onnx.export`` calls::

    torch.onnx.export(model, args, path, dynamo=True, opset_version=20,
                      custom_translation_table=edsc_ext.models.onnx.translation_table())

Needs the packages ``onnx`` and ``onnxscript`` (the ``deploy`` extra: ``pip install onnx onnxscript
onnxruntime``, onnxruntime to run the result).
"""

from __future__ import annotations

import inspect
import os
import warnings
from typing import Any, Optional

import torch

from ..ops import SPEC
from .networks import EDSC, SIZE_MULTIPLE

__all__ = ["export", "translation_table", "dynamic_shapes_for", "OPSET"]

# GridSample's mode "linear" (and N-D grids) came with opset 20; opset 16 had "bilinear".
OPSET = 20
# padding_mode codes of the op -> their traits, as the compiled library states them (edsc_ext.ops.SPEC).
_PADDING_MODES = {mode.code: mode for mode in SPEC.padding_modes}


def _require(name: str):
    try:
        return __import__(name)
    except ImportError as e:
        raise ImportError(f"edsc_ext.models.onnx needs the package {name!r}: pip install onnx onnxscript "
                          "(the deploy extra)") from e


def _deform_sepconv_forward_onnx(input, vertical, horizontal, offset, mask, kernel_h: int, kernel_w: int,
                                 pad_h: int, pad_w: int, dilation_h: int, dilation_w: int, padding_mode: int,
                                 offset_dx=None):
    """``edsc_ext::deform_sepconv_forward`` in ONNX operators (traced by onnxscript: the Python
    control flow below runs at export time, on the op's constant arguments and on which optional
    tensors are present)."""
    from onnxscript import opset20 as op

    kh, kw = int(kernel_h), int(kernel_w)
    taps = kh * kw
    # Mixed precision (half-type per-pixel tensors, a float32 frame): ONNX arithmetic takes one
    # type, the frame's, as the kernels compute (a cast to the same type is removed by runtimes).
    vertical, horizontal, offset, mask, offset_dx = (
        None if t is None else op.CastLike(t, input) for t in (vertical, horizontal, offset, mask, offset_dx))
    traits = _PADDING_MODES[int(padding_mode)]
    mode = "border" if traits.clamps else "zeros"  # GridSample's padding_mode
    edsc = traits.doubles_border
    # A mode that shifts the taps moves tap 0 by 1 - (K-1)//2 along each axis (edsc_ext.reference.edsc_tap_shift).
    shift_h = 1 - (kh - 1) // 2 if traits.shifts_taps else 0
    shift_w = 1 - (kw - 1) // 2 if traits.shifts_taps else 0
    shape = op.Shape(input)
    n = op.Slice(shape, [0], [1])
    h_in = op.Slice(shape, [2], [3])
    w_in = op.Slice(shape, [3], [4])
    # H_out = H_in + 2*pad_h - dilation_h*(KH-1), likewise W_out.
    h_out = op.Add(h_in, op.Constant(value_ints=[2 * pad_h - dilation_h * (kh - 1)]))
    w_out = op.Add(w_in, op.Constant(value_ints=[2 * pad_w - dilation_w * (kw - 1)]))
    h_in_f = op.CastLike(h_in, input)
    w_in_f = op.CastLike(w_in, input)

    # Undeformed positions of tap t = i*KW + j at (y, x): (y - pad_h + i*dil_h, x - pad_w + j*dil_w),
    # as (1, T, H_out, 1) and (1, T, 1, W_out).
    rows = op.CastLike(op.Range(op.Constant(value_int=0), op.Squeeze(h_out, [0]), op.Constant(value_int=1)), input)
    cols = op.CastLike(op.Range(op.Constant(value_int=0), op.Squeeze(w_out, [0]), op.Constant(value_int=1)), input)
    tap_y = op.CastLike(op.Constant(value_floats=[float(i * dilation_h - pad_h + shift_h)
                                                  for i in range(kh) for _ in range(kw)]), input)
    tap_x = op.CastLike(op.Constant(value_floats=[float(j * dilation_w - pad_w + shift_w)
                                                  for _ in range(kh) for j in range(kw)]), input)
    py = op.Add(op.Reshape(rows, [1, 1, -1, 1]), op.Reshape(tap_y, [1, taps, 1, 1]))
    px = op.Add(op.Reshape(cols, [1, 1, 1, -1]), op.Reshape(tap_x, [1, taps, 1, 1]))
    full = op.Concat(n, op.Constant(value_ints=[taps]), h_out, w_out, axis=0)  # (N, T, H_out, W_out)
    finite = None
    if offset is not None:
        if offset_dx is not None:  # split offsets: dy and dx tensors
            py = op.Add(py, offset)
            px = op.Add(px, offset_dx)
        else:  # offset channels are (dy, dx) per tap
            py = op.Add(py, op.Slice(offset, [0], [2 * taps], [1], [2]))
            px = op.Add(px, op.Slice(offset, [1], [2 * taps], [1], [2]))
        # A non-finite offset makes its output pixel NaN in every channel (the op's contract).
        bad = op.Or(op.Or(op.IsNaN(py), op.IsInf(py)), op.Or(op.IsNaN(px), op.IsInf(px)))
        finite = op.Not(op.Cast(op.ReduceMax(op.Cast(bad, to=6), [1], keepdims=1), to=9))  # (N, 1, H_out, W_out)
        if mode == "zeros":
            # Far-away coordinates: keep them small (and still outside) so that nothing overflows.
            one = op.CastLike(op.Constant(value_float=1.0), input)
            two = op.CastLike(op.Constant(value_float=2.0), input)
            py = op.Clip(py, op.Neg(two), op.Squeeze(op.Add(h_in_f, one), [0]))
            px = op.Clip(px, op.Neg(two), op.Squeeze(op.Add(w_in_f, one), [0]))
    else:
        py = op.Expand(py, full)
        px = op.Expand(px, full)
    edsc_factor = None
    if edsc:
        # The border pixel counts twice along an axis where the coordinate lies outside
        # [-pad, size - 1 + pad): a factor of 2 per axis.
        def axis_factor(p, size_f, pad):
            lo = op.CastLike(op.Constant(value_float=float(-pad)), input)
            hi = op.Squeeze(op.Add(size_f, op.CastLike(op.Constant(value_float=float(pad - 1)), input)), [0])
            outside = op.Or(op.Less(p, lo), op.GreaterOrEqual(p, hi))
            return op.Add(op.CastLike(op.Constant(value_float=1.0), input), op.CastLike(outside, input))

        edsc_factor = op.Mul(axis_factor(py, h_in_f, pad_h), axis_factor(px, w_in_f, pad_w))  # (N, T, H_out, W_out)
    # align_corners=0 maps pixel x to (2x + 1)/W - 1 and, unlike align_corners=1, addresses a
    # 1-pixel side too; GridSample's border mode clamps the pixel coordinate into [0, size-1].
    one = op.CastLike(op.Constant(value_float=1.0), input)
    two = op.CastLike(op.Constant(value_float=2.0), input)
    gx = op.Sub(op.Div(op.Add(op.Mul(px, two), one), w_in_f), one)
    gy = op.Sub(op.Div(op.Add(op.Mul(py, two), one), h_in_f), one)
    grid = op.Concat(op.Unsqueeze(gx, [4]), op.Unsqueeze(gy, [4]), axis=4)  # (N, T, H_out, W_out, 2)
    grid = op.Reshape(grid, op.Concat(n, op.Constant(value_ints=[-1]), w_out, op.Constant(value_ints=[2]), axis=0))
    samples = op.GridSample(input, grid, mode="linear", padding_mode=mode, align_corners=0)  # (N, C, T*H_out, W_out)
    samples = op.Reshape(samples, op.Concat(op.Constant(value_ints=[0, 0, taps]), h_out, w_out, axis=0))

    # weight[n, t] = vertical[n, i] * horizontal[n, j] * mask[n, t], absent factors are ones.
    weight = None
    if vertical is not None:
        weight = op.Unsqueeze(vertical, [2])  # (N, KH, 1, H_out, W_out)
    if horizontal is not None:
        hz = op.Unsqueeze(horizontal, [1])  # (N, 1, KW, H_out, W_out)
        weight = hz if weight is None else op.Mul(weight, hz)
    if weight is not None:
        if vertical is None or horizontal is None:  # broadcast the missing axis of the (KH, KW) grid
            weight = op.Expand(weight, op.Concat(n, op.Constant(value_ints=[kh, kw]), h_out, w_out, axis=0))
        weight = op.Reshape(weight, op.Concat(op.Constant(value_ints=[0, taps]), h_out, w_out, axis=0))
    if mask is not None:
        weight = mask if weight is None else op.Mul(weight, mask)
    if edsc_factor is not None:
        weight = edsc_factor if weight is None else op.Mul(weight, edsc_factor)
    if weight is not None:
        samples = op.Mul(samples, op.Unsqueeze(weight, [1]))  # (N, C, T, H_out, W_out)
    out = op.ReduceSum(samples, [2], keepdims=0)
    if finite is not None:
        out = op.Where(finite, out, op.CastLike(op.Constant(value_float=float("nan")), input))
    return out


def translation_table() -> dict:
    """``{torch.ops.edsc_ext.deform_sepconv_forward.default: onnxscript function}``, the
    ``custom_translation_table`` entry for :func:`torch.onnx.export` (dynamo exporter, opset >= 20)."""
    _require("onnxscript")
    return {torch.ops.edsc_ext.deform_sepconv_forward.default: _deform_sepconv_forward_onnx}


def dynamic_shapes_for(model: torch.nn.Module, args: tuple, size_multiple: Optional[int] = None):
    """Dynamic batch, height and width for every 4-D tensor in ``args`` (and the batch of 1-D ones).

    :class:`edsc_ext.models.EDSC` (or ``size_multiple=m``): all 4-D frames share one batch, height
    and width, height and width multiples of ``m`` (32 for EDSC) of at least ``2*m``, and a 1-D
    tensor (EDSC_m's ``time``) has the frames' batch. Otherwise each dimension is ``Dim.AUTO``:
    torch.export works out which sizes are equal, and keeps static what the model makes static.
    """
    from torch.export import Dim

    if size_multiple is None:
        if isinstance(model, EDSC):
            size_multiple = SIZE_MULTIPLE
    if size_multiple is None:
        batch = height = width = Dim.AUTO
    else:
        batch = Dim("batch", min=1, max=4096)
        # At least two multiples: a dynamic size may not be 1 (torch.export specialises those), and
        # EDSC's 32x smaller bottleneck would be 1 pixel at one multiple.
        height = Dim("height_div", min=2, max=4096) * size_multiple
        width = Dim("width_div", min=2, max=4096) * size_multiple
    specs = [{0: batch, 2: height, 3: width} if isinstance(a, torch.Tensor) and a.dim() == 4
             else ({0: batch} if isinstance(a, torch.Tensor) and a.dim() == 1 else None) for a in args]
    # torch.export wants the structure of forward's signature: a *args parameter is one tuple.
    params = list(inspect.signature(model.forward).parameters.values())
    for k, p in enumerate(params):
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            if k < len(specs):  # (an empty *args is not there at all)
                specs[k:] = [tuple(specs[k:])]
            break
    return tuple(specs)


def export(model: torch.nn.Module, args: tuple, path: "str | os.PathLike", *, dynamic: bool = True,
           dynamic_shapes: Any = None, size_multiple: Optional[int] = None, opset_version: int = OPSET,
           external_data: bool = False, custom_translation_table: Optional[dict] = None, **kwargs):
    """Exports ``model`` called on ``args`` to the ONNX file ``path``; returns the ``ONNXProgram``.

    Args:
        model: a module (in eval mode for inference) whose forward may call deform_sepconv.
        args: example inputs, a tuple. Use a batch of at least 2 and sizes that are not 1: torch.export
            specialises dimensions of size 1.
        dynamic: dynamic batch, height and width (:func:`dynamic_shapes_for`); False: the example's shapes.
        dynamic_shapes: torch.export's ``dynamic_shapes``, instead of ``dynamic``'s.
        size_multiple: for ``dynamic``: height and width are multiples of it (default 32 for EDSC).
        opset_version: at least 20 (GridSample with mode "linear").
        external_data: weights in a separate file (needed above 2 GB); default: one file.
        custom_translation_table: more translations, merged with :func:`translation_table`.
        kwargs: passed to :func:`torch.onnx.export`.
    """
    _require("onnx")
    if opset_version < OPSET:
        raise ValueError(f"opset_version must be >= {OPSET} (GridSample with mode 'linear'), got {opset_version}")
    args = tuple(args)
    if dynamic_shapes is None and dynamic:
        dynamic_shapes = dynamic_shapes_for(model, args, size_multiple)
    kwargs.setdefault("verbose", False)
    table = translation_table()
    table.update(custom_translation_table or {})
    with warnings.catch_warnings():
        # Dims that share constraints (all frames' batch, ...) get one name: nothing to warn about.
        warnings.filterwarnings("ignore", message=".*The axis name: .* will not be used")
        program = torch.onnx.export(model, args, dynamo=True, opset_version=opset_version,
                                    dynamic_shapes=dynamic_shapes, custom_translation_table=table,
                                    external_data=external_data, **kwargs)
    program.save(os.fspath(path), external_data=external_data)
    return program
