"""torch.library.opcheck of every custom op the extension registers (deform_sepconv's forward and
backward, vector_add, upsample_bilinear2x, avg_pool2x), the one place where opcheck runs: the schema, the
autograd registration, the fake (meta) kernels and AOT dispatch with dynamic shapes, on every device, in both
memory layouts, with absent tensors, each padding mode, split offsets and mixed dtypes."""

from __future__ import annotations

import pytest
import torch

import edsc_ext
from edsc_ext.ops import normalize_args

from conftest import (
    BF16,
    DEVICES,
    F32,
    F64,
    LAYOUTS,
    PADDING_MODES,
    make_inputs,
    memory_format,
    mixed,
    present_id,
    split,
)

FORWARD = torch.ops.edsc_ext.deform_sepconv_forward
BACKWARD = torch.ops.edsc_ext.deform_sepconv_backward
# torch.library.opcheck's utilities, all of them (its default), named so that the result can be checked.
OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
ALL_SUCCEEDED = {name: "SUCCESS" for name in OPCHECK_UTILS}
# The backward op is not differentiable: its schema and its fake kernel.
BACKWARD_UTILS = ("test_schema", "test_faketensor")

GEOMETRIES = {
    # N, C, H_in, W_in, KH, KW, padding, dilation
    "2x3": (1, 3, 5, 6, 2, 3, 1, (1, 2)),
    "3x2": (1, 3, 6, 7, 3, 2, 1, (1, 2)),
}
# Which of (vertical, horizontal, offset, mask) are given.
PRESENT = [(True, True, True, True), (False, True, True, False), (False, False, False, False)]
# Which gradients of (input, vertical, horizontal, offset, mask) the backward op is asked for.
GRAD_MASKS = [[True] * 5, [False, False, False, True, True], [True, False, False, False, False],
              [False, True, False, True, False]]


def mask_id(mask) -> str:
    return "".join(letter if asked else "-" for letter, asked in zip("ivhom", mask))


def _case(device, layout, geometry, gen, present=(True, True, True, True)):
    case = make_inputs(*GEOMETRIES[geometry], present=present, device=device, generator=gen)
    return case.map(lambda t: t.contiguous(memory_format=memory_format(layout)))


def _detached(kwargs) -> dict:
    return {name: t.detach() if isinstance(t, torch.Tensor) else t for name, t in kwargs.items()}


# ---------------------------------------------------------------------------------------------
# deform_sepconv


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("present", PRESENT, ids=present_id)
@pytest.mark.parametrize("padding_mode", PADDING_MODES)
def test_opcheck_forward(gen, device, layout, geometry, present, padding_mode):
    case = _case(device, layout, geometry, gen, present).leaves()
    kwargs = normalize_args(*case.tensors, **case.kwargs, padding_mode=padding_mode).op_kwargs()
    assert torch.library.opcheck(FORWARD.default, (), kwargs, test_utils=OPCHECK_UTILS) == ALL_SUCCEEDED


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("grad_mask", GRAD_MASKS, ids=mask_id)
def test_opcheck_backward(gen, device, layout, geometry, grad_mask):
    case = _case(device, layout, geometry, gen)
    args = normalize_args(*case.tensors, **case.kwargs, padding_mode="border")
    grad_output = torch.randn(case.input.shape[:2] + args.output_size, generator=gen, dtype=F64).to(device)
    grad_output = grad_output.contiguous(memory_format=memory_format(layout))
    result = torch.library.opcheck(BACKWARD.default, (), dict(grad_output=grad_output, **_detached(args.op_kwargs()),
                                                              output_mask=grad_mask), test_utils=OPCHECK_UTILS)
    assert result == ALL_SUCCEEDED


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("padding_mode", ["edsc", "zeros"])
def test_opcheck_split_offsets(gen, device, layout, padding_mode):
    """dy and dx as two tensors (the forward's offset_dx keyword; the backward's sixth gradient)."""
    case = _case(device, layout, "2x3", gen)
    dy, dx = (t.requires_grad_() for t in split(case.offset))
    args = normalize_args(case.input.requires_grad_(), case.vertical, case.horizontal, (dy, dx), case.mask,
                          **case.kwargs, padding_mode=padding_mode)
    result = torch.library.opcheck(FORWARD.default, (), args.op_kwargs(), test_utils=OPCHECK_UTILS)
    assert result == ALL_SUCCEEDED
    grad_output = torch.randn((1, 3) + args.output_size, generator=gen, dtype=F64).to(device).contiguous(
        memory_format=memory_format(layout))
    plain = _detached(args.op_kwargs())
    for grad_mask in ([True] * 5, [False, False, False, True, False]):
        kwargs = dict(grad_output=grad_output, **plain, output_mask=grad_mask)
        result = torch.library.opcheck(BACKWARD.default, (), kwargs, test_utils=BACKWARD_UTILS)
        assert result == {name: "SUCCESS" for name in BACKWARD_UTILS}
        grads = BACKWARD(**kwargs)
        assert len(grads) == 6 and (grads[5].shape == dx.shape) == grad_mask[3]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("split_offsets", [False, True], ids=["interleaved", "split"])
def test_opcheck_mixed_dtypes(gen, device, layout, split_offsets):
    """A float32 frame with bfloat16 per-pixel tensors; the backward gives each its own dtype."""
    case = mixed(make_inputs(*GEOMETRIES["2x3"], generator=gen), BF16, device, layout=layout)
    offset = case.offset
    leaves = [t.detach().requires_grad_() for t in (case.input, case.vertical, case.horizontal)]
    offset = tuple(t.detach().requires_grad_() for t in split(offset)) if split_offsets else \
        offset.detach().requires_grad_()
    args = normalize_args(*leaves, offset, case.mask.detach().requires_grad_(), **case.kwargs, padding_mode="border")
    result = torch.library.opcheck(FORWARD.default, (), args.op_kwargs(), test_utils=OPCHECK_UTILS)
    assert result == ALL_SUCCEEDED
    grad_output = torch.randn((1, 3) + args.output_size, generator=gen).to(device).contiguous(
        memory_format=memory_format(layout))
    kwargs = dict(grad_output=grad_output, **_detached(args.op_kwargs()), output_mask=[True] * 5)
    result = torch.library.opcheck(BACKWARD.default, (), kwargs, test_utils=BACKWARD_UTILS)
    assert result == {name: "SUCCESS" for name in BACKWARD_UTILS}
    grads = BACKWARD(**kwargs)
    assert [g.dtype for g in grads[:5]] == [F32] + [BF16] * 4


# ---------------------------------------------------------------------------------------------
# vector_add


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_vector_add(gen, device):
    a = torch.randn((4, 5), generator=gen).to(device).requires_grad_()
    b = torch.randn((4, 5), generator=gen).to(device)
    torch.library.opcheck(torch.ops.edsc_ext.vector_add.default, (a, b))
    assert edsc_ext.vector_add(a, b).device.type == device


# ---------------------------------------------------------------------------------------------
# The 2x resampling ops: upsample_bilinear2x and avg_pool2x


@pytest.mark.parametrize("name, size", [("upsample_bilinear2x", (2, 8, 3, 5)), ("avg_pool2x", (2, 8, 6, 7))],
                         ids=["upsample_bilinear2x", "avg_pool2x"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [F64, F32, BF16], ids=["f64", "f32", "bf16"])
def test_opcheck_resample2x(gen, name, size, device, layout, dtype):
    op = getattr(torch.ops.edsc_ext, name).default
    x = torch.randn(size, generator=gen).to(device, dtype).contiguous(memory_format=memory_format(layout))
    result = torch.library.opcheck(op, (x.requires_grad_(),))
    assert result == ALL_SUCCEEDED, result
    # A channel slice of a channels_last tensor (no dense layout): the output is channels_last, as the fake says.
    sliced = x.detach()[:, 1:6].requires_grad_()
    assert torch.library.opcheck(op, (sliced,)) == ALL_SUCCEEDED
