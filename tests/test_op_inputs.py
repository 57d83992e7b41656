"""What the op is given: bad arguments (each error names the argument), absent tensors, memory
layouts (non-contiguous views, channels_last), empty and extreme sizes, non-finite and huge
offsets, meta tensors and devices. Each case is checked against the float64 reference.

Tests that take a ``device`` run on the CPU and, where a GPU is present, on CUDA (those cases carry
the ``cuda`` mark and skip cleanly without a GPU)."""

from __future__ import annotations

import json
import re

import pytest
import torch

import edsc_ext
from edsc_ext import reference as R
from edsc_ext.ops import MAX_KERNEL_WIDTH, MIXED_PRECISION, SPEC, normalize_args
from edsc_ext.ops import PADDING_MODES as OP_PADDING_MODES

from conftest import (
    ALL_PRESENT,
    ARG_NAMES,
    DEVICES,
    F16,
    F32,
    F64,
    GRAD_FACTOR,
    PADDING_MODES,
    assert_close,
    assert_grads_close,
    assert_matches_reference,
    cases,
    default_grad_output,
    dtypes,
    forward_and_grads,
    make_inputs,
    named,
    per_device,
    plans_of,
    present_id,
    reference,
    reference_and_grads,
    requires_cuda,
    requires_two_gpus,
    synchronize,
)

OP = edsc_ext.deform_sepconv
FORWARD = torch.ops.edsc_ext.deform_sepconv_forward
BACKWARD = torch.ops.edsc_ext.deform_sepconv_backward
MODES = named(*PADDING_MODES)


# ---------------------------------------------------------------------------------------------
# Argument checking: each bad call raises a TypeError/ValueError that names the argument.


def _bad_calls():
    x = torch.randn(2, 3, 6, 6)
    v, h = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    off, m = torch.randn(2, 18, 4, 4), torch.rand(2, 9, 4, 4)
    return [
        ("input ndim", lambda: OP(x[0], v, h), ValueError, "input"),
        # input cannot be None: its message does not offer it (issue #45); the optional tensors' do.
        ("input not a tensor", lambda: OP(x.tolist(), v, h), TypeError, r"^input must be a Tensor, got list$"),
        ("input None", lambda: OP(None, v, h), TypeError, r"^input must be a Tensor, got None$"),
        ("vertical not a tensor", lambda: OP(x, v.tolist(), h), TypeError,
         r"^vertical must be a Tensor or None, got list$"),
        ("vertical ndim", lambda: OP(x, v[0], h), ValueError, "vertical"),
        ("mask ndim", lambda: OP(x, v, h, off, m.flatten(2)), ValueError, "mask"),
        ("offset not a tensor", lambda: OP(x, v, h, 0.5), TypeError, "offset"),
        ("batch mismatch", lambda: OP(x, v, h, off[:1]), ValueError, "offset"),
        ("batch mismatch vertical", lambda: OP(x, v[:1], h), ValueError, "vertical"),
        ("KH vs kernel_size", lambda: OP(x, v, h, kernel_size=(2, 3)), ValueError, "vertical"),
        ("KW vs kernel_size", lambda: OP(x, v, h, kernel_size=(3, 5)), ValueError, "horizontal"),
        ("offset channels", lambda: OP(x, v, h, off[:, :16]), ValueError, "offset"),
        ("odd offset channels", lambda: OP(x, None, None, off[:, :17]), ValueError, "offset"),
        ("offset taps vs KH", lambda: OP(x, v, None, torch.randn(2, 10, 4, 4)), ValueError, "offset"),
        ("mask channels", lambda: OP(x, v, h, off, m[:, :8]), ValueError, "mask"),
        ("spatial size", lambda: OP(x, v, h[:, :, :3]), ValueError, "horizontal"),
        ("negative padding", lambda: OP(x, v, h, padding=-1), ValueError, "padding"),
        ("negative padding pair", lambda: OP(x, v, h, padding=(1, -1)), ValueError, "padding"),
        ("padding triple", lambda: OP(x, v, h, padding=(1, 1, 1)), TypeError, "padding"),
        ("padding float", lambda: OP(x, v, h, padding=1.0), TypeError, "padding"),
        ("dilation 0", lambda: OP(x, v, h, dilation=0), ValueError, "dilation"),
        ("kernel_size 0", lambda: OP(x, None, None, kernel_size=0), ValueError, "kernel_size"),
        ("kernel_size bool", lambda: OP(x, kernel_size=True), TypeError, "kernel_size"),
        ("padding_mode", lambda: OP(x, v, h, padding_mode="reflect"), ValueError, "padding_mode"),
        ("padding_mode None", lambda: OP(x, v, h, padding_mode=None), ValueError, "padding_mode"),
        ("integer input", lambda: OP(x.long(), v.long(), h.long()), TypeError, "input"),
        ("integer offset", lambda: OP(x, v, h, off.int()), TypeError, "offset"),
        ("bool mask", lambda: OP(x, v, h, off, m > 0.5), TypeError, "mask"),
        ("mixed dtypes", lambda: OP(x, v, h.double()), TypeError, "horizontal"),
        ("mixed dtypes half", lambda: OP(x, v, h, off, m.half()), TypeError, "mask"),
        ("devices", lambda: OP(x, v.to("meta"), h), ValueError, "vertical"),
        ("devices input", lambda: OP(x.to("meta"), v, h, off), ValueError, "vertical"),
        # The shapes the taps fit, and the one-number spelling of the square one.
        ("ambiguous kernel", lambda: OP(x, None, None, off, m), ValueError,
         r"^offset has 9 taps, which fits 3 kernel sizes KHxKW \(1x9, 3x3, 9x1\): pass kernel_size=3 or "
         r"kernel_size=\(KH, KW\)$"),
        ("ambiguous mask", lambda: OP(x, None, None, None, torch.rand(2, 12, 4, 4)), ValueError,
         r"^mask has 12 taps, which fits 6 kernel sizes KHxKW \(1x12, 2x6, 3x4, 4x3, 6x2, 12x1\): pass "
         r"kernel_size=\(KH, KW\)$"),
        ("no kernel info", lambda: OP(x), ValueError, "kernel_size"),
        ("negative output", lambda: OP(x, kernel_size=9), ValueError, "output size"),
        ("too wide", lambda: OP(x, kernel_size=(1, 129), padding=(0, 64)), ValueError, "KW"),
    ]


@pytest.mark.parametrize("name, call, exc, match", _bad_calls(), ids=[c[0] for c in _bad_calls()])
def test_bad_arguments(name, call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(padding=-1), ValueError, "padding"),
    (dict(dilation=0), ValueError, "dilation"),
    (dict(padding_mode="circular"), ValueError, "padding_mode"),
    (dict(kernel_size=(3, 3, 3)), TypeError, "kernel_size"),
    (dict(kernel_size=0), ValueError, "kernel_size"),
])
def test_module_rejects_bad_geometry_at_construction(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        edsc_ext.nn.DeformSepConv2d(**kwargs)


def test_raw_ops_check_shapes(gen):
    """The compiled ops check what memory safety depends on even when called directly (TORCH_CHECK
    variants raise RuntimeError, ValueError or TypeError; any of them, never a crash)."""
    ERRORS = (RuntimeError, ValueError, TypeError)
    case = make_inputs(1, 2, 5, 6, 3, 3, 1, 1, generator=gen)
    args = normalize_args(*case.tensors, **case.kwargs).op_kwargs()
    with pytest.raises(ERRORS, match="offset"):
        FORWARD(**{**args, "offset": case.offset[:, :16]})
    with pytest.raises(ERRORS):
        FORWARD(**{**args, "kernel_h": 4})  # kernel_h disagrees with vertical
    with pytest.raises(ERRORS, match="padding"):
        FORWARD(**{**args, "padding_mode": 7})
    with pytest.raises(ERRORS):
        FORWARD(**{**args, "pad_w": -1})  # negative padding
    with pytest.raises(ERRORS):  # grad_output of the wrong size
        BACKWARD(grad_output=torch.zeros(1, 2, 4, 4, dtype=F64), **args, output_mask=[True] * 5)
    with pytest.raises(ERRORS):
        FORWARD(**{**args, "input": case.input.float()})  # mixed dtypes


def test_does_not_modify_inputs(gen):
    case = make_inputs(2, 3, 6, 7, 3, 3, 1, 1, generator=gen).leaves()
    before = case.map(lambda t: t.detach().clone())
    out = case.call(OP, padding_mode="border")
    out.backward(torch.ones_like(out))
    for name, a, b in zip(ARG_NAMES, case.tensors, before.tensors):
        assert torch.equal(a.detach(), b), name


# ---------------------------------------------------------------------------------------------
# The spec: what the op accepts and how each padding mode samples, stated once by the compiled
# library (include/edsc_ext/spec.h, torch.ops.edsc_ext.deform_sepconv_spec)


def test_python_reads_the_compiled_spec():
    raw = json.loads(torch.ops.edsc_ext.deform_sepconv_spec())
    assert [mode._asdict() for mode in SPEC.padding_modes] == raw["padding_modes"]
    assert OP_PADDING_MODES == {mode["name"]: mode["code"] for mode in raw["padding_modes"]}
    assert OP_PADDING_MODES == {"zeros": 0, "border": 1, "edsc": 2}
    assert [[str(d).removeprefix("torch.") for d in pair] for pair in SPEC.dtype_pairs] == raw["dtype_pairs"]
    assert MAX_KERNEL_WIDTH == raw["max_kernel_width"] == 128 and SPEC.specialized_kernel == 5
    assert MIXED_PRECISION == {F32: (F16, torch.bfloat16)}
    traits = {mode.name: (mode.clamps, mode.doubles_border, mode.shifts_taps, mode.grid_taps, mode.bound_factor)
              for mode in SPEC.padding_modes}
    assert traits == {"zeros": (False, False, False, True, 1), "border": (True, False, False, True, 1),
                      "edsc": (True, True, True, False, 4)}


def _sample_by_traits(image, mode, y, x, pad):
    """input[y, x] of a 2-D image as a mode's traits say (integer coordinates: no interpolation):
    clamped into the image, counted twice along an axis outside [-pad, size - 1 + pad) where the
    border doubles, else 0 outside."""
    value = 1.0
    coordinates = []
    for c, size in ((y, image.shape[0]), (x, image.shape[1])):
        if mode.clamps:
            if mode.doubles_border and (c < -pad or c >= size - 1 + pad):
                value *= 2
            c = min(max(c, 0), size - 1)
        elif not 0 <= c < size:
            return 0.0
        coordinates.append(c)
    return value * float(image[coordinates[0], coordinates[1]])


@pytest.mark.parametrize("offsets", [False, True], ids=["grid", "offsets"])
@pytest.mark.parametrize("mode", SPEC.padding_modes, ids=[mode.name for mode in SPEC.padding_modes])
def test_each_padding_mode_samples_as_its_traits_say(gen, mode, offsets):
    """The kernels branch on the spec's traits, not on a mode's name: at integer positions (taps on
    the grid, or integer offsets reaching far outside) every mode's output is the sum of the samples
    its traits describe (clamps, doubles_border, shifts_taps), on the per-pixel loops and, without
    offsets, the row loops of the modes with the grid_taps trait."""
    k, pad, size = 3, 1, 5
    image = torch.randn(1, 1, size, size, generator=gen, dtype=F64)
    offset = (torch.randint(-7, 8, (1, 2 * k * k, size, size), generator=gen).to(F64) if offsets
              else torch.zeros(1, 2 * k * k, size, size, dtype=F64))
    out = edsc_ext.deform_sepconv(image, offset=offset if offsets else None, kernel_size=k, padding=pad,
                                  padding_mode=mode.name)
    shift = 1 - (k - 1) // 2 if mode.shifts_taps else 0
    expected = torch.zeros_like(out)
    for y in range(size):
        for x in range(size):
            for i in range(k):
                for j in range(k):
                    t = i * k + j
                    dy, dx = int(offset[0, 2 * t, y, x]), int(offset[0, 2 * t + 1, y, x])
                    expected[0, 0, y, x] += _sample_by_traits(image[0, 0], mode, y - pad + i + shift + dy,
                                                              x - pad + j + shift + dx, pad)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    plan = edsc_ext._plan(image, offset=offset if offsets else None, kernel_size=k, padding=pad,
                          padding_mode=mode.name).forward
    assert plan.startswith("grid_taps_rows/" if mode.grid_taps and not offsets else "pixels/"), plan


def test_every_message_is_built_from_the_spec(gen):
    """The messages name what the spec states, on both sides: the Python checks (ValueError,
    TypeError) and the compiled op's own (a RuntimeError through the stable ABI)."""
    case = make_inputs(1, 2, 5, 6, 3, 3, 1, 1, generator=gen)
    kwargs = normalize_args(*case.tensors, **case.kwargs).op_kwargs()
    call = lambda **changes: edsc_ext.deform_sepconv(*case.tensors, **{**case.kwargs, **changes})  # noqa: E731
    raw = lambda **changes: FORWARD(**{**kwargs, **changes})  # noqa: E731

    # padding_mode: every mode by name in Python, by code and name in the compiled op.
    with pytest.raises(ValueError, match="padding_mode") as python:
        call(padding_mode="reflect")
    with pytest.raises(RuntimeError, match="padding_mode code") as compiled:
        raw(padding_mode=len(SPEC.padding_modes))
    for mode in SPEC.padding_modes:
        assert repr(mode.name) in str(python.value) and f"{mode.code} ({mode.name})" in str(compiled.value)

    # The frame's dtypes, and the rule of the pairs (every mixed pair named).
    frames = SPEC.frame_dtypes_text
    assert frames == "float64, float32, float16 or bfloat16"
    assert all(str(frame).removeprefix("torch.") in frames for frame, _ in SPEC.dtype_pairs)
    with pytest.raises(TypeError, match=re.escape(frames)):
        edsc_ext.deform_sepconv(case.input.long(), kernel_size=3)
    with pytest.raises(TypeError, match=re.escape(f"input must be {frames}")):
        edsc_ext.deform_sepconv(case.input.to(torch.float8_e4m3fn), kernel_size=3)
    with pytest.raises(RuntimeError, match=re.escape(f"input must be {frames}")):
        raw(input=case.input.to(torch.float8_e4m3fn), vertical=None, horizontal=None, offset=None, mask=None)
    for frame, per_pixel in SPEC.dtype_pairs:
        if frame != per_pixel:
            assert re.search(rf"{str(per_pixel).removeprefix('torch.')}\b.* with a {str(frame).removeprefix('torch.')}"
                             " input", SPEC.dtype_rule)
    with pytest.raises(TypeError, match=re.escape(SPEC.dtype_rule)):
        edsc_ext.deform_sepconv(case.input, *(t.half() for t in case.tensors[1:]), **case.kwargs)
    with pytest.raises(RuntimeError, match=re.escape(SPEC.dtype_rule)):
        raw(vertical=case.vertical.half(), horizontal=case.horizontal.half(), offset=case.offset.half(),
            mask=case.mask.half())

    # The sizes.
    limit = str(SPEC.max_kernel_width)
    with pytest.raises(ValueError, match=f"maximum {limit}"):
        edsc_ext.deform_sepconv(case.input, kernel_size=(1, SPEC.max_kernel_width + 1), padding=(0, 64))
    with pytest.raises(RuntimeError, match=f"maximum {limit}"):
        raw(kernel_w=SPEC.max_kernel_width + 1)
    for name, python_changes, compiled_changes, minimum in (
            ("padding", dict(padding=SPEC.min_padding - 1), dict(pad_h=SPEC.min_padding - 1), SPEC.min_padding),
            ("dilation", dict(dilation=SPEC.min_dilation - 1), dict(dilation_w=SPEC.min_dilation - 1),
             SPEC.min_dilation),
            ("kernel", dict(kernel_size=SPEC.min_kernel_size - 1), dict(kernel_h=SPEC.min_kernel_size - 1),
             SPEC.min_kernel_size)):
        with pytest.raises(ValueError, match=f">= {minimum}"):
            call(**python_changes)
        with pytest.raises(RuntimeError, match=f"{name}.* must be >= {minimum}"):
            raw(**compiled_changes)


# ---------------------------------------------------------------------------------------------
# Absent tensors


# On CUDA 3 channels (the RGB kernels).
ABSENT_CONFIGS = {"cpu": (2, 2, 6, 7, 3, 2, 1, (1, 2)), "cuda": (2, 3, 7, 8, 3, 2, 1, (1, 2))}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("present", ALL_PRESENT, ids=present_id)
def test_absent_tensors(gen, device, present):
    case = make_inputs(*ABSENT_CONFIGS[device], present=present, device=device, generator=gen)
    for mode in PADDING_MODES:
        assert_matches_reference(case, mode)
    if present[0] and present[1]:
        # The kernel size then follows from vertical and horizontal.
        no_ks = case.replace(kwargs={k: v for k, v in case.kwargs.items() if k != "kernel_size"})
        assert torch.equal(no_ks.call(OP), case.call(OP))


# ---------------------------------------------------------------------------------------------
# Memory layouts


def _layout(t: torch.Tensor, kind: str) -> torch.Tensor:
    """The same values as t in a non-contiguous layout."""
    if kind == "transposed":
        return t.transpose(2, 3).contiguous().transpose(2, 3)
    if kind == "sliced":  # strided in every dimension, at an offset into its storage
        big = torch.zeros(t.shape[0] + 1, t.shape[1] * 2, t.shape[2] + 3, t.shape[3] * 2, dtype=t.dtype,
                          device=t.device)
        view = big[1:, ::2, 2:-1, 1::2]
        view.copy_(t)
        return view
    if kind == "wide_rows":  # rows twice as long as the view's
        return torch.cat([t, t], dim=3)[..., : t.shape[3]]
    if kind == "channels_last":
        return t.contiguous(memory_format=torch.channels_last)
    if kind == "batch_expanded":  # stride 0 in the batch dimension
        return t[:1].expand(t.shape)
    raise AssertionError(kind)


@pytest.mark.parametrize("device, config, kind, padding_mode", per_device(
    cpu=cases({"6x7": (2, 3, 6, 7, 3, 3, 1, 1)}, named("transposed", "sliced", "channels_last", "batch_expanded"),
              MODES),
    cuda=cases({"7x8": (2, 3, 7, 8, 3, 3, 1, 1)}, named("channels_last", "transposed", "wide_rows"),
               named("border"))))
def test_non_contiguous_inputs(gen, device, config, kind, padding_mode):
    case = make_inputs(*config, device=device, generator=gen)
    odd = case.map(lambda t: _layout(t, kind))
    if kind == "batch_expanded":
        case = odd.map(lambda t: t.contiguous())  # the expected values: both batch items alike
    assert not any(t.is_contiguous() for t in odd.tensors)
    assert_matches_reference(case, padding_mode, run=odd)


# Which of (input, vertical, horizontal, offset, mask) are channels_last.
CHANNELS_LAST = {
    "all": (True, True, True, True, True),
    "input-only": (True, False, False, False, False),
    "per-pixel-only": (False, True, True, True, True),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("layout", list(CHANNELS_LAST))
def test_channels_last(gen, layout, padding_mode, device):
    case = make_inputs(2, 3, 9, 10, 3, 3, 1, 1, dtype=F32, device=device, generator=gen)
    odd = case.replace(**{name: (t.contiguous(memory_format=torch.channels_last) if cl else t)
                          for name, t, cl in zip(ARG_NAMES, case.tensors, CHANNELS_LAST[layout])})
    out, grads = forward_and_grads(OP, odd, padding_mode)
    # The input decides the call's memory format: the output and the backward op's gradients come in
    # it (the leaves' .grad then follow autograd's layout contract: each leaf's own strides).
    format = torch.channels_last if CHANNELS_LAST[layout][0] else torch.contiguous_format
    args = normalize_args(*odd.tensors, **odd.kwargs, padding_mode=padding_mode)
    raw_grads = BACKWARD(grad_output=default_grad_output(out.shape).to(out), **args.op_kwargs(), output_mask=[True] * 5)
    for name, t in zip(("output",) + ARG_NAMES, (out,) + tuple(raw_grads)):
        assert t.is_contiguous(memory_format=format), (name, t.stride())
    expected, expected_grads = reference_and_grads(case, padding_mode)
    assert_close(out, expected, F32)
    assert_grads_close(grads, expected_grads, F32)


@pytest.mark.parametrize("device", DEVICES)
def test_channels_last_single_channel(gen, device):
    """C=1: channels_last and contiguous are the same layout; the values must be right either way."""
    case = make_inputs(2, 1, 8, 9, 3, 3, 1, 1, dtype=F32, device=device, generator=gen)
    odd = case.map(lambda t: t.contiguous(memory_format=torch.channels_last))
    out, grads = forward_and_grads(OP, odd, "zeros")
    expected, expected_grads = reference_and_grads(case, "zeros")
    assert_close(out, expected, F32)
    assert_grads_close(grads, expected_grads, F32)


COPY_OPS = {"aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy"}


def _ops_run_by(fn) -> set:
    """The names of the aten/custom ops that fn dispatches (torch.profiler, host side)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {event.name for event in prof.events()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "input-only"])
def test_layout_copies(gen, layout, device):
    """Tensors already in the call's memory format are used in place: neither the forward nor the
    backward op copies anything (float32, whose gradients need no dtype conversion); a per-pixel
    tensor in the other format is converted, which the profiler does see."""
    case = make_inputs(2, 3, 9, 10, 3, 3, 1, 1, dtype=F32, device=device, generator=gen)
    if layout != "contiguous":
        as_cl = lambda t: t.contiguous(memory_format=torch.channels_last)  # noqa: E731
        case = case.replace(input=as_cl(case.input)) if layout == "input-only" else case.map(as_cl)
    args = normalize_args(*case.tensors, **case.kwargs, padding_mode="zeros").op_kwargs()
    grad_output = torch.randn((2, 3, 9, 10), generator=gen, dtype=F32).to(device)
    if layout != "contiguous":
        grad_output = grad_output.contiguous(memory_format=torch.channels_last)
    ops = _ops_run_by(lambda: (FORWARD(**args), BACKWARD(grad_output=grad_output, **args, output_mask=[True] * 5)))
    assert {"edsc_ext::deform_sepconv_forward", "edsc_ext::deform_sepconv_backward"} <= ops, ops
    if layout == "input-only":
        assert ops & COPY_OPS, ops
    else:
        assert not ops & COPY_OPS, sorted(ops & COPY_OPS)


def _channel_slice(t: torch.Tensor, extra: int, fmt) -> torch.Tensor:
    """t as the first channels of a tensor with ``extra`` more (zero) channels in memory format
    ``fmt``: the view the EDSC network's padded heads hand the op."""
    wide = torch.zeros(t.shape[0], t.shape[1] + extra, *t.shape[2:], dtype=t.dtype, device=t.device)
    wide = wide.contiguous(memory_format=fmt)
    wide[:, : t.shape[1]].copy_(t)
    return wide[:, : t.shape[1]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offsets", ["interleaved", "split"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_per_pixel_views(gen, layout, offsets, device):
    """Per-pixel tensors that are views: channel slices of wider tensors (batch stride and, in
    channels_last, pixel stride larger than their own channel count), split offsets as two slices of
    one tensor, a mask expanded along the batch. The forward reads them in place (no copy; on CUDA
    the one-thread-per-pixel kernel, which follows their strides); the values and every gradient (to
    the wider tensors) match the reference of the dense tensors."""
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    dense = make_inputs(2, 3, 9, 10, 5, 5, 2, 1, dtype=F32, generator=gen)
    dense = dense.replace(mask=dense.mask[:1].expand(dense.mask.shape).contiguous())  # both images alike
    frame = dense.input.contiguous(memory_format=fmt).to(device)
    vertical = _channel_slice(dense.vertical.to(device), 3, fmt)
    horizontal = _channel_slice(dense.horizontal.to(device), 11, fmt)
    if offsets == "split":
        dy, dx = dense.offset[:, 0::2], dense.offset[:, 1::2]
        both = _channel_slice(torch.cat([dy, dx], 1).to(device), 6, fmt)
        offset = (both[:, :25], both[:, 25:])
    else:
        offset = _channel_slice(dense.offset.to(device), 6, fmt)
    mask = dense.mask[:1].to(device).contiguous(memory_format=fmt).expand(dense.mask.shape)
    views = (vertical, horizontal) + (offset if offsets == "split" else (offset,)) + (mask,)
    assert not any(v.is_contiguous(memory_format=fmt) for v in views)
    kwargs = dict(kernel_size=5, padding=2, padding_mode="border")
    normalized = normalize_args(frame, vertical, horizontal, offset, mask, **kwargs)
    op_kwargs = normalized.op_kwargs()
    ops = _ops_run_by(lambda: FORWARD(**op_kwargs))
    assert not ops & COPY_OPS, sorted(ops & COPY_OPS)
    plan = edsc_ext._plan(frame, vertical, horizontal, offset, mask, **kwargs).forward
    assert (plan == "pixels_rgb") if device == "cuda" else plan.startswith("pixels/"), plan
    out = FORWARD(**op_kwargs)
    assert out.is_contiguous(memory_format=fmt)
    assert_close(out, reference(dense, "border"), F32)

    # Gradients through the views reach the wider tensors (the backward makes the views dense).
    bases = [v._base for v in (vertical, horizontal) + (offset if offsets == "split" else (offset,))]
    leaves = [b.detach().clone().requires_grad_() for b in dict.fromkeys(bases)]
    by_base = dict(zip(dict.fromkeys(bases), leaves))
    frame_leaf = frame.detach().clone().requires_grad_()
    mask_leaf = dense.mask[:1].to(device).contiguous(memory_format=fmt).requires_grad_()
    sliced = [by_base[v._base][:, : v.shape[1]] for v in (vertical, horizontal)]
    if offsets == "split":
        whole = by_base[offset[0]._base]
        offset_arg = (whole[:, :25], whole[:, 25:50])
    else:
        offset_arg = by_base[offset._base][:, :50]
    grad_output = default_grad_output(out.shape).to(out)
    OP(frame_leaf, *sliced, offset_arg, mask_leaf.expand(dense.mask.shape), **kwargs).backward(grad_output)
    _, expected = reference_and_grads(dense, "border", default_grad_output(out.shape))
    g_frame, g_v, g_h, g_off, g_mask = expected
    assert_close(frame_leaf.grad, g_frame, F32, factor=GRAD_FACTOR, what="grad of input")
    assert_close(by_base[vertical._base].grad[:, :5], g_v, F32, factor=GRAD_FACTOR, what="grad of vertical")
    assert_close(by_base[horizontal._base].grad[:, :5], g_h, F32, factor=GRAD_FACTOR, what="grad of horizontal")
    if offsets == "split":
        g = by_base[offset[0]._base].grad
        assert_close(g[:, :25], g_off[:, 0::2], F32, factor=GRAD_FACTOR, what="grad of dy")
        assert_close(g[:, 25:50], g_off[:, 1::2], F32, factor=GRAD_FACTOR, what="grad of dx")
    else:
        assert_close(by_base[offset._base].grad[:, :50], g_off, F32, factor=GRAD_FACTOR, what="grad of offset")
    assert_close(mask_leaf.grad, g_mask.sum(0, keepdim=True), F32, factor=GRAD_FACTOR, what="grad of mask")
    for base_grad, k in ((by_base[vertical._base].grad, 5), (by_base[horizontal._base].grad, 5)):
        assert torch.equal(base_grad[:, k:], torch.zeros_like(base_grad[:, k:]))


def test_cpu_views_without_offsets_take_the_per_pixel_loops(gen):
    """The CPU row loops of calls without offsets read dense per-pixel tensors: a view sends the
    call to the per-pixel loops (read in place), with the same result."""
    case = make_inputs(2, 3, 9, 10, 5, 5, 2, 1, present=(True, True, False, True), dtype=F32, generator=gen)
    view = case.replace(vertical=_channel_slice(case.vertical, 3, torch.contiguous_format))
    kwargs = dict(**case.kwargs, padding_mode="border")
    isa = edsc_ext._plan(*case.tensors, **kwargs).forward.split("/")[1]
    assert edsc_ext._plan(*case.tensors, **kwargs).forward == "grid_taps_rows/" + isa
    assert edsc_ext._plan(*view.tensors, **kwargs).forward == "pixels/" + isa
    args = normalize_args(*view.tensors, **kwargs).op_kwargs()
    assert not _ops_run_by(lambda: FORWARD(**args)) & COPY_OPS
    assert_close(FORWARD(**args), reference(case, "border"), F32)


def test_per_pixel_views_of_other_patterns_are_copied(gen):
    """A view whose strides the kernels cannot follow (every other channel of an interleaved offset)
    is made dense first: the profiler sees the copy, and the values are right."""
    case = make_inputs(2, 3, 9, 10, 5, 5, 2, 1, dtype=F32, generator=gen)
    wide = torch.randn(2, 100, 9, 10, generator=gen)
    wide[:, 0::2] = case.offset
    odd = case.replace(offset=wide[:, 0::2])
    args = normalize_args(*odd.tensors, **odd.kwargs, padding_mode="border").op_kwargs()
    assert _ops_run_by(lambda: FORWARD(**args)) & COPY_OPS
    assert_close(FORWARD(**args), reference(case, "border"), F32)


# ---------------------------------------------------------------------------------------------
# Meta tensors


def test_meta_tensors_give_shapes():
    meta = make_inputs(2, 3, 6, 7, 3, 2, 1, (1, 2)).to(device="meta")
    out = meta.call(OP, padding_mode="border")
    assert out.device.type == "meta" and out.shape == (2, 3, 6, 7 + 2 - 2)


def test_meta_output_memory_format():
    """The fake kernel predicts the output memory format (what torch.compile plans with)."""
    case = make_inputs(2, 3, 6, 7, 3, 3, 1, 1).to(device="meta")
    out = case.map(lambda t: t.contiguous(memory_format=torch.channels_last)).call(OP, padding=1)
    assert out.device.type == "meta" and out.shape == (2, 3, 6, 7)
    assert out.is_contiguous(memory_format=torch.channels_last), out.stride()
    assert case.call(OP, padding=1).is_contiguous()


# ---------------------------------------------------------------------------------------------
# Sizes: empty, one pixel, wide kernels, more than 2**31 elements


EMPTY_SHAPES = {
    # (N, C, H_in, W_in), (KH, KW), padding
    "N=0": ((0, 3, 6, 7), (3, 3), 1),  # empty batch
    "C=0": ((2, 0, 6, 7), (3, 3), 1),  # no channels
    "H_out=0": ((2, 3, 2, 7), (3, 3), 0),
    "W_out=0": ((2, 3, 6, 2), (2, 3), 0),
    "H_in=0": ((1, 2, 0, 5), (3, 3), 2),  # an empty image with padding: a (2, 7) output of zeros
}


@pytest.mark.parametrize("device, spec, padding_mode", per_device(
    cpu=cases(EMPTY_SHAPES, MODES),
    cuda=cases({name: EMPTY_SHAPES[name] for name in ("N=0", "C=0", "H_out=0")}, MODES)))
def test_empty(gen, device, spec, padding_mode):
    shape, kernel, padding = spec
    case = make_inputs(*shape, *kernel, padding, 1, device=device, generator=gen)
    out, grads = forward_and_grads(OP, case, padding_mode)
    synchronize(device)
    expected, _ = reference_and_grads(case, padding_mode)
    assert out.shape == expected.shape and out.device == case.input.device
    n, c, h, w = shape
    if h == 0:
        assert out.shape == (1, 2, 2, 7)
        assert torch.equal(out, torch.zeros_like(out))
    else:
        assert out.numel() == 0
    for name, g, t in zip(ARG_NAMES, grads, case.tensors):
        assert g.shape == t.shape and g.device == t.device, name
        assert torch.all(g == 0), name


def test_single_pixel_input(gen):
    case = make_inputs(2, 3, 1, 1, 3, 3, 1, 1, generator=gen)
    for mode in PADDING_MODES:
        assert_matches_reference(case, mode)


@pytest.mark.parametrize("KW", [17, 128])
def test_wide_kernels(gen, KW):
    """Kernel widths past the small accumulator array, up to the supported maximum."""
    case = make_inputs(1, 2, 3, KW + 3, 2, KW, (1, 2), 1, generator=gen)
    for mode in PADDING_MODES:
        assert_matches_reference(case, mode)


@pytest.mark.cuda
@requires_cuda
def test_more_than_2_31_elements():
    """An input and output of more than 2**31 elements (float16, 46341 x 46342), so that flat
    indices, including those inside one image plane, need 64 bits. Forward only; a few pixels,
    at the start, the middle and the far corner, are checked against the reference on crops."""
    H, W = 46341, 46342
    numel = H * W
    assert numel > 2**31
    need = 4 * numel * 2 + (2 << 30)  # input, 2-channel offset, output (float16), some slack
    free, _ = torch.cuda.mem_get_info()
    if free < max(need, 16 << 30):
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory, {free / 2**30:.1f} GiB free")
    g = torch.Generator(device="cuda").manual_seed(1234)
    input = torch.randn((1, 1, H, W), device="cuda", dtype=F16, generator=g)
    offset = torch.rand((1, 2, H, W), device="cuda", dtype=F16, generator=g).mul_(3).sub_(1.5)
    assert edsc_ext._plan(input, offset=offset, padding_mode="zeros").forward == "pixels"  # 64-bit indices
    try:
        out = OP(input, offset=offset, padding_mode="zeros")
        torch.cuda.synchronize()
        assert out.shape == (1, 1, H, W)
        points = [(0, 0), (0, W - 1), (1, 1), (H // 2, W // 2), (H - 2, W - 3), (H - 1, 0), (H - 1, W - 1),
                  (H - 1, W - 2), (46340, 46000)]
        picks = torch.Generator().manual_seed(0)
        points += [(int(torch.randint(0, H, (1,), generator=picks)), int(torch.randint(0, W, (1,), generator=picks)))
                   for _ in range(8)]
        for y, x in points:
            # Samples stay within 2.5 pixels of (y, x); a crop of +-3 holds them all (a crop edge at
            # the image edge is the image edge, so the zeros beyond it are the same).
            y0, y1, x0, x1 = max(0, y - 3), min(H, y + 4), max(0, x - 3), min(W, x + 4)
            crop_in = input[:, :, y0:y1, x0:x1].double().cpu()
            crop_off = offset[:, :, y0:y1, x0:x1].double().cpu()
            expected = R.deform_sepconv(crop_in, offset=crop_off)[0, 0, y - y0, x - x0].item()
            actual = out[0, 0, y, x].item()
            assert abs(actual - expected) <= 2e-2 + 2e-3 * abs(expected), (y, x, actual, expected)
        # Border mode too, at the far corner.
        del out
        out = OP(input, offset=offset, padding_mode="border")
        y, x = H - 1, W - 1
        crop_in = input[:, :, y - 3:, x - 3:].double().cpu()
        crop_off = offset[:, :, y - 3:, x - 3:].double().cpu()
        expected = R.deform_sepconv(crop_in, offset=crop_off, padding_mode="border")[0, 0, 3, 3].item()
        assert abs(out[0, 0, y, x].item() - expected) <= 2e-2 + 2e-3 * abs(expected)
    finally:
        del input, offset
        out = None
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Non-finite and huge offsets


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("device, config, dtype, poison, which, padding_mode", per_device(
    # A NaN or an inf at tap 4's dx of pixel (3, 2) of batch 1; every gradient checked away from it.
    cpu=cases({"3x3-c3": (2, 3, 6, 7, 3, 3, 1, 1)}, dtypes(F64),
              {"nan": [((1, 9, 3, 2), NAN)], "inf": [((1, 9, 3, 2), INF)]}, {"all-grads": ARG_NAMES}, MODES),
    # Both at once, at two pixels; the input gradient alone (its own backward kernels). 5x5 RGB takes
    # the kernels with straight-line taps, which sample (0, 0) there and apply the NaN after the taps.
    cuda=cases({"3x3-c5": (2, 5, 6, 7, 3, 3, 1, 1), "5x5-rgb": (2, 3, 6, 7, 5, 5, 2, 1)}, dtypes(F32, F16),
               {"nan+inf": [((1, 9, 3, 2), NAN), ((0, 0, 5, 6), INF)]}, {"input-grad": ("input",)}, MODES)))
def test_non_finite_offset(gen, device, config, dtype, poison, which, padding_mode):
    """A NaN or inf offset makes its pixel's output NaN and nothing else; when the poisoned pixels
    get no gradient, the gradients are those of the clean case (at the poisoned pixels themselves
    see test_non_finite_offset_rule_for_every_gradient)."""
    case = make_inputs(*config, dtype=dtype, device=device, generator=gen)
    offset = case.offset.clone()
    poisoned_pixels = torch.zeros((case.input.shape[0], 1) + case.offset.shape[2:], dtype=torch.bool)
    for index, value in poison:
        offset[index] = value
        poisoned_pixels[index[0], 0, index[2], index[3]] = True
    poisoned = case.replace(offset=offset)
    out = poisoned.call(OP, padding_mode=padding_mode)
    nan = poisoned_pixels.expand(out.shape)
    assert torch.equal(torch.isnan(out).cpu(), nan)
    assert_close(out, reference(poisoned, padding_mode), dtype)
    grad_output = (~nan).double()
    _, grads = forward_and_grads(OP, poisoned, padding_mode, grad_output, which=which)
    _, expected = reference_and_grads(case, padding_mode, grad_output, which=which)
    assert_close(grads[0], expected[0], dtype, factor=GRAD_FACTOR, what="grad of input")
    for name, g, e in zip(ARG_NAMES[1:], grads[1:], expected[1:]):
        if name in which:
            keep = ~poisoned_pixels.expand(g.shape)
            assert_close(g[keep.to(g.device)], e[keep], dtype, factor=GRAD_FACTOR, what=f"grad of {name}")


# The rule for a non-finite offset (README, "The op"), per tap t = (i, j) of output pixel (n, y, x) whose
# dy or dx is NaN or +-inf: the output is NaN in every channel; that tap reads no pixel, so the frame
# gradient gets nothing from it (the pixel's other taps add theirs); the gradients of its own values are
# NaN: both offset components of t, mask t, vertical row i and horizontal column j at (n, y, x).
# Each with the CUDA backward plans it takes in float32 and float64 (the CPU takes its fused backward,
# and the two-pass one under cpu_scratch_mb=0).
NON_FINITE_CONFIGS = {"3x3-c2": ((2, 2, 6, 7, 3, 3, 1, 1), "contiguous", ("tiled", "tiled")),
                      "5x5-rgb": ((2, 3, 8, 9, 5, 5, 2, 1), "contiguous",
                                  ("tiled_rgb_lean_prefetch", "tiled_rgb_prefetch")),
                      "3x3-c8-cl": ((2, 8, 6, 7, 3, 3, 1, 1), "channels_last", ("lane_tile", "nchw_copies")),
                      "3x3-c72-cl": ((2, 72, 6, 7, 3, 3, 1, 1), "channels_last", ("channel_lanes", "nchw_copies"))}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
@pytest.mark.parametrize("config", NON_FINITE_CONFIGS.values(), ids=NON_FINITE_CONFIGS.keys())
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "edsc"])
def test_non_finite_offset_rule_for_every_gradient(gen, device, config, dtype, padding_mode):
    """The op and the reference follow the one rule, in the output and all five gradients, with a
    grad_output that reaches the poisoned pixels (zeros there included)."""
    shape, layout, cuda_backward = config
    case = make_inputs(*shape, generator=gen).map(
        lambda t: t.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else t)
    n_taps, kw = case.mask.shape[1], case.horizontal.shape[1]
    offset = case.offset.clone()
    # (batch, tap, component, y, x): two taps of one pixel in one row, one in the last row, one at a corner.
    bad = [(1, 4, 1, 3, 2, float("nan")), (0, 0, 0, 1, 4, float("inf")), (0, 2, 0, 1, 4, -float("inf")),
           (0, n_taps - 1, 1, 1, 4, float("nan")), (1, n_taps - 1, 0, 0, 0, float("nan"))]
    expected_nan = {name: torch.zeros(t.shape, dtype=torch.bool) for name, t in zip(ARG_NAMES, case.tensors)}
    out_nan = torch.zeros((shape[0], shape[1], *offset.shape[2:]), dtype=torch.bool)
    for n, t, component, y, x, value in bad:
        offset[n, 2 * t + component, y, x] = value
        out_nan[n, :, y, x] = True
        expected_nan["vertical"][n, t // kw, y, x] = True
        expected_nan["horizontal"][n, t % kw, y, x] = True
        expected_nan["offset"][n, 2 * t:2 * t + 2, y, x] = True
        expected_nan["mask"][n, t, y, x] = True
    run = case.replace(offset=offset).to(dtype, device)
    expected_out, expected_grads = reference_and_grads(run, padding_mode)
    assert torch.equal(torch.isnan(expected_out), out_nan)
    for name, e in zip(ARG_NAMES, expected_grads):
        assert torch.equal(torch.isnan(e), expected_nan[name]), f"reference: grad of {name}"
    policies = [{}] + ([{"cpu_scratch_mb": 0}, {"cpu_sample_rows": False}] if device == "cpu" else [])
    for changes in policies:
        with edsc_ext.kernel_policy(**changes):
            plans = plans_of(run, padding_mode)
            out, grads = forward_and_grads(OP, run, padding_mode)
        if device == "cpu":  # fewer than 8 channels: row by row, unless the policy says pixel by pixel
            rows = shape[1] < 8 and changes.get("cpu_sample_rows", True)
            expected_plan = ("sample_rows" if rows else
                             "pixels_two_pass" if "cpu_scratch_mb" in changes else "pixels_fused")
        else:
            expected_plan = cuda_backward[dtype == F64]
        assert plans.backward.startswith(expected_plan), plans
        assert torch.equal(torch.isnan(out).cpu(), out_nan), changes
        assert_close(out, expected_out, dtype)
        for name, g, e in zip(ARG_NAMES, grads, expected_grads):
            assert torch.equal(torch.isnan(g).cpu(), expected_nan[name]), f"op {changes}: grad of {name}"
            assert_close(g, e, dtype, factor=GRAD_FACTOR, what=f"grad of {name}")


@pytest.mark.parametrize("device, config, forward_dtypes, grad_dtype", per_device(
    cpu={"c2": ((2, 2, 5, 6, 3, 3, 1, 1), (F32, F64), F64)},
    cuda={"c3": ((2, 3, 6, 7, 3, 3, 1, 1), (F32,), F32)}))
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_huge_offsets(gen, device, config, forward_dtypes, grad_dtype, padding_mode):
    """Offsets of +-1e30 and -3e38: finite outputs (no overflow in the index computation) equal to
    the reference, and no offset gradient where the samples are that far away."""
    case = make_inputs(*config, device=device, generator=gen)
    offset = case.offset.clone()
    offset[0, :, 1:3] = 1e30
    offset[1, 1::2, :, :2] = -1e30
    offset[1, 0::4, 4] = -3e38
    big = case.replace(offset=offset)
    for dtype in forward_dtypes:
        out = big.to(dtype).call(OP, padding_mode=padding_mode)
        assert torch.isfinite(out).all()
        assert_close(out, reference(big.to(dtype), padding_mode), dtype)
    out, grads = forward_and_grads(OP, big.to(grad_dtype), padding_mode)
    _, expected = reference_and_grads(big.to(grad_dtype), padding_mode)
    assert_grads_close(grads, expected, grad_dtype)
    assert torch.all(grads[3][0, :, 1:3] == 0)  # no offset gradient where the sample is far away


# ---------------------------------------------------------------------------------------------
# Devices


@pytest.mark.cuda
@pytest.mark.multi_gpu
@requires_two_gpus
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_other_device(gen, padding_mode):
    """Tensors on cuda:1 while the current device is cuda:0."""
    case = make_inputs(2, 3, 9, 10, 3, 3, 1, 1, dtype=F32, device="cuda:1", generator=gen)
    with torch.cuda.device(0):
        out, grads = forward_and_grads(OP, case, padding_mode)
        assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(1)
    assert out.device == torch.device("cuda:1")
    assert all(g.device == torch.device("cuda:1") for g in grads)
    expected, expected_grads = reference_and_grads(case, padding_mode)
    assert_close(out, expected, F32)
    assert_grads_close(grads, expected_grads, F32)


@pytest.mark.cuda
@pytest.mark.multi_gpu
@requires_two_gpus
def test_mixed_devices_rejected(gen):
    case = make_inputs(1, 2, 5, 5, 3, 3, 1, 1, device="cuda:0", generator=gen)
    with pytest.raises(ValueError, match="mask"):
        OP(*case.tensors[:4], case.mask.to("cuda:1"), padding=1)
