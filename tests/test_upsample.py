"""edsc_ext.upsample_bilinear2x, the EDSC networks' bilinear 2x upsampling (corners aligned): its values
against F.interpolate in float64 and, on CUDA, against ATen's own kernel in the same dtype; the output's
memory format; the gradient (gradcheck); each CUDA kernel path, asserted to have run (the profiler names the
kernel); the argument errors; and the networks' upsampling_kernel switch. opcheck: tests/test_opcheck.py; the
kernels on the CPU: tests/test_cuda_emulation.py."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import edsc_ext
from edsc_ext.models import networks as models_module

from conftest import DEVICES, LAYOUTS, cuda_kernel_names, memory_format, rel_error, requires_cuda

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["f64", "f32", "f16", "bf16"]
# One rounding of the output (the half types) or the order of float32 operations, relative.
TOLERANCES = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}
SIZES = [(2, 16, 5, 7), (1, 8, 1, 4), (1, 3, 6, 1), (1, 1, 1, 1), (3, 5, 4, 4)]


def _reference(x: torch.Tensor) -> torch.Tensor:
    return F.interpolate(x.double(), scale_factor=2, mode="bilinear", align_corners=True)


def _assert_values(out: torch.Tensor, x: torch.Tensor) -> None:
    # The sampling position (scale times index) is rounded in the computing precision (float32 for the half
    # types), as ATen's is: a weight off by about eps times the axis' size moves a value by that times the
    # difference of its two samples (float32's position error alone is 1e-6 at 16 samples).
    tol = TOLERANCES[x.dtype]
    eps = torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps
    position = 4 * eps * max(x.shape[2:]) * (x.abs().max().item() if x.numel() else 0.0)
    torch.testing.assert_close(out.double(), _reference(x), rtol=tol, atol=tol + position)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_values_and_memory_format_are_f_interpolates(gen, device, layout, dtype):
    for size in SIZES:
        x = torch.randn(size, generator=gen).to(device, dtype).contiguous(memory_format=memory_format(layout))
        out = edsc_ext.upsample_bilinear2x(x)
        expected = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
        assert out.shape == expected.shape and out.dtype == dtype and out.device == x.device
        assert out.stride() == expected.stride(), (size, out.stride(), expected.stride())
        _assert_values(out, x)


@pytest.mark.parametrize("device", DEVICES)
def test_views_are_read_in_place_or_copied(gen, device):
    """A channel slice of a channels_last tensor (the networks' heads) gives a channels_last output, as
    F.interpolate's; a transposed view and an offset view give the right values."""
    base = torch.randn(2, 12, 6, 8, generator=gen).to(device).contiguous(memory_format=torch.channels_last)
    flat = torch.randn(2 * 11 * 6 * 8 + 1, generator=gen).to(device)
    offset = flat[1:].as_strided((2, 11, 6, 8), (528, 1, 88, 11))  # channels_last, one element into its storage
    for x in (base[:, 2:7], base[:, :, 1:], base.transpose(2, 3), offset):
        out = edsc_ext.upsample_bilinear2x(x)
        expected = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
        assert out.stride() == expected.stride(), (x.stride(), out.stride(), expected.stride())
        _assert_values(out, x)


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_is_f_interpolates(gen, device):
    x = torch.randn(2, 3, 4, 5, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    assert torch.autograd.gradcheck(edsc_ext.upsample_bilinear2x, (x,))
    x_cl = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    grad = torch.randn(2, 3, 8, 10, generator=gen, dtype=torch.float64).to(device)
    expected = torch.autograd.grad(F.interpolate(x_cl, scale_factor=2, mode="bilinear", align_corners=True), x_cl,
                                   grad)[0]
    torch.testing.assert_close(torch.autograd.grad(edsc_ext.upsample_bilinear2x(x_cl), x_cl, grad)[0], expected)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch_and_channels(device):
    for size in ((0, 3, 4, 5), (2, 0, 4, 5)):
        out = edsc_ext.upsample_bilinear2x(torch.zeros(size, device=device))
        assert out.shape == (size[0], size[1], 8, 10)


@pytest.mark.parametrize("bad, error, words", [
    (torch.zeros(3, 4, 5), ValueError, "must be 4-D (N, C, H, W), got shape (3, 4, 5)"),
    (torch.zeros(1, 3, 4, 5, dtype=torch.int64), TypeError, "float64, float32, float16 or bfloat16, got torch.int64"),
    (torch.zeros(1, 3, 0, 5), ValueError, "height and width must be at least 1, got shape (1, 3, 0, 5)"),
    ([[1.0]], TypeError, "input must be a Tensor, got list"),
])
def test_bad_input_is_named(bad, error, words):
    with pytest.raises(error) as caught:
        edsc_ext.upsample_bilinear2x(bad)
    assert words in str(caught.value)


def test_the_compiled_op_checks_too():
    """The op itself (torch.ops, past the Python checks) refuses a 3-D tensor with a message, not a crash."""
    with pytest.raises(RuntimeError, match=re.escape("input must be 4-D (N, C, H, W), got shape [3, 4, 5]")):
        torch.ops.edsc_ext.upsample_bilinear2x(torch.zeros(3, 4, 5))


def _cuda_kernels(fn) -> list:
    return cuda_kernel_names(fn, "upsample")


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype, vec", [(torch.float16, 8), (torch.bfloat16, 8), (torch.float32, 4),
                                        (torch.float64, 2)], ids=["f16", "bf16", "f32", "f64"])
def test_cuda_each_kernel_path_runs_and_matches_aten(gen, dtype, vec):
    """Each path of the launcher (16-byte or one-value threads, channels_last or NCHW) runs where the
    launcher says (the profiler names the kernel) and gives ATen's CUDA kernel's values: the same math in
    the same order (at most the rounding of products that a kernel fuses into multiply-adds)."""
    value = {torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16", torch.float32: "float",
             torch.float64: "double"}[dtype]
    cases = [  # size, channels_last, offset view (misaligned), expected kernel
        ((1, 4 * vec, 9, 10), True, False, f"upsample2x_channels_last_cuda_kernel<{value}, {vec}>"),
        ((2, 5, 9, 10), True, False, f"upsample2x_channels_last_cuda_kernel<{value}, 1>"),
        ((1, 4 * vec, 9, 10), True, True, f"upsample2x_channels_last_cuda_kernel<{value}, 1>"),
        ((2, 3, 7, 4 * vec), False, False, f"upsample2x_nchw_cuda_kernel<{value}, {vec}>"),
        ((2, 3, 7, 4 * vec), False, True, f"upsample2x_nchw_cuda_kernel<{value}, 1>"),
        ((2, 3, 7, 5), False, False, f"upsample2x_nchw_cuda_kernel<{value}, {vec if 10 % vec == 0 else 1}>"),
    ]
    for size, channels_last, offset, kernel in cases:
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        x = torch.randn(size, generator=gen).cuda().to(dtype).contiguous(memory_format=fmt)
        if offset:  # the same values one element into a larger storage: not 16-byte aligned
            storage = torch.empty(x.numel() + 1, dtype=dtype, device="cuda")
            x = storage[1:].as_strided(x.shape, x.stride()).copy_(x)
        out = []
        names = _cuda_kernels(lambda x=x, out=out: out.append(edsc_ext.upsample_bilinear2x(x)))
        assert any(kernel in name for name in names), (kernel, names)
        expected = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
        assert out[0].stride() == expected.stride()
        # Both round once in the half types; float32 and float64 may differ by the rounding of the products that
        # one compiled kernel fuses into multiply-adds and the other not: a few units of the last place of the
        # input's magnitude (a wrong weight or sample would be off by a tenth of it).
        eps = torch.finfo(dtype).eps
        torch.testing.assert_close(out[0], expected, rtol=2 * eps, atol=8 * eps * x.abs().max().item())
        _assert_values(out[0], x)


@requires_cuda
@pytest.mark.cuda
def test_cuda_runs_on_the_tensors_device_and_stream(gen):
    """On a side stream the kernel waits for nothing it should not: the values are right once the stream is."""
    x = torch.randn(1, 32, 64, 96, generator=gen).cuda().half().contiguous(memory_format=torch.channels_last)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = edsc_ext.upsample_bilinear2x(x)
    stream.synchronize()
    _assert_values(out, x)


def test_networks_upsampling_kernel_reaches_every_upsampling(gen):
    model = models_module.EDSC_s()
    upsamplings = [m for m in model.modules() if isinstance(m, models_module.Upsample2x)]
    assert model.upsampling_kernel == models_module.DEFAULT_UPSAMPLING_KERNEL == "edsc_ext"
    assert len(upsamplings) == 15 and all(m.kernel == "edsc_ext" for m in upsamplings)
    model.upsampling_kernel = "aten"
    assert all(m.kernel == "aten" for m in upsamplings) and "upsampling_kernel='aten'" in repr(model)
    with pytest.raises(ValueError, match="upsampling_kernel must be one of"):
        model.upsampling_kernel = "triton"
    # On the CPU either setting is F.interpolate.
    x = torch.randn(1, 4, 5, 6, generator=gen)
    assert torch.equal(models_module.upsample2x(x, kernel="edsc_ext"), models_module.upsample2x(x, kernel="aten"))


@requires_cuda
@pytest.mark.cuda
def test_cuda_networks_upsample_with_the_extension(gen):
    """On CUDA the networks' upsamplings run edsc_ext's kernel (float32, and half types under autocast with
    half_upsampling), with the values of ATen's: the whole EDSC_s in float16 autocast, eager and captured."""
    from test_models import cuda_case, random_edsc

    x = torch.randn(1, 8, 17, 24, generator=gen).cuda().half().contiguous(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.float16):
        names = _cuda_kernels(lambda: models_module.upsample2x(x, half=True))
        assert any("upsample2x_channels_last_cuda_kernel<c10::Half, 8>" in n for n in names), names
        # Without half_upsampling autocast's float32 result stays ATen's.
        assert models_module.upsample2x(x).dtype == torch.float32
    model = random_edsc(gen, False, dtype=torch.float32, head_layout="auto").cuda().eval()
    model = model.to(memory_format=torch.channels_last)
    args = cuda_case(gen, False, 1, 64, 96, channels_last=True)
    outputs = {}
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        for kernel in ("aten", "edsc_ext"):
            model.upsampling_kernel = kernel
            outputs[kernel] = model(*args).float()
            names = _cuda_kernels(lambda: model(*args))
            assert any("upsample2x_" in n for n in names) == (kernel == "edsc_ext"), names
    assert rel_error(outputs["edsc_ext"], outputs["aten"]) <= 2e-3
    captured = model.capture(*args, autocast_dtype=torch.float16)
    assert rel_error(captured(*args).float(), outputs["edsc_ext"]) <= 2e-3
