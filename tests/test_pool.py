"""edsc_ext.avg_pool2x, the EDSC networks' 2x2 average pooling with stride 2: its values against F.avg_pool2d in
float64 and, on CUDA, bit for bit against ATen's own kernel in the same dtype; the output's memory format; the
gradient (gradcheck, and ATen's); each CUDA kernel path, asserted to have run (the profiler names the kernel); the
argument errors; and the networks' pooling_kernel switch. opcheck: tests/test_opcheck.py; the kernels on the CPU:
tests/test_cuda_emulation.py."""

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
# One rounding of the output (the sum of four values in the accumulation type is exact but for its last bit).
TOLERANCES = {torch.float64: 1e-14, torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}
SIZES = [(2, 16, 6, 8), (1, 8, 2, 2), (1, 3, 7, 5), (3, 5, 9, 4), (2, 24, 3, 34)]


def _assert_values(out: torch.Tensor, x: torch.Tensor) -> None:
    tol = TOLERANCES[x.dtype]
    torch.testing.assert_close(out.double(), F.avg_pool2d(x.double(), 2), rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_values_and_memory_format_are_f_avg_pool2ds(gen, device, layout, dtype):
    for size in SIZES:
        x = torch.randn(size, generator=gen).to(device, dtype).contiguous(memory_format=memory_format(layout))
        out = edsc_ext.avg_pool2x(x)
        expected = F.avg_pool2d(x, 2)
        assert out.shape == expected.shape and out.dtype == dtype and out.device == x.device
        assert out.stride() == expected.stride(), (size, out.stride(), expected.stride())
        _assert_values(out, x)
        if device == "cuda":  # the same sums in the same order as ATen's CUDA kernels
            assert torch.equal(out, expected), (size, (out - expected).abs().max())


@pytest.mark.parametrize("device", DEVICES)
def test_views_are_read_in_place_or_copied(gen, device):
    """A channel slice of a channels_last tensor gives a channels_last output, as F.avg_pool2d's; a transposed
    view and an offset view give the right values."""
    base = torch.randn(2, 12, 6, 8, generator=gen).to(device).contiguous(memory_format=torch.channels_last)
    flat = torch.randn(2 * 11 * 6 * 8 + 1, generator=gen).to(device)
    offset = flat[1:].as_strided((2, 11, 6, 8), (528, 1, 88, 11))  # channels_last, one element into its storage
    for x in (base[:, 2:7], base[:, :, 1:], base.transpose(2, 3), offset):
        out = edsc_ext.avg_pool2x(x)
        expected = F.avg_pool2d(x, 2)
        assert out.stride() == expected.stride(), (x.stride(), out.stride(), expected.stride())
        _assert_values(out, x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradient_is_f_avg_pool2ds(gen, device, layout):
    fmt = memory_format(layout)
    for size in ((2, 3, 4, 6), (1, 2, 5, 7)):  # even, and odd (a last row and column outside every block)
        x = torch.randn(size, generator=gen, dtype=torch.float64).to(device).contiguous(memory_format=fmt)
        x.requires_grad_()
        assert torch.autograd.gradcheck(edsc_ext.avg_pool2x, (x,))
        grad = torch.randn(F.avg_pool2d(x, 2).shape, generator=gen, dtype=torch.float64).to(device)
        ours = torch.autograd.grad(edsc_ext.avg_pool2x(x), x, grad)[0]
        expected = torch.autograd.grad(F.avg_pool2d(x, 2), x, grad)[0]
        torch.testing.assert_close(ours, expected, rtol=0, atol=0)
        assert ours.stride() == expected.stride()


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch_and_channels(device):
    for size in ((0, 3, 4, 5), (2, 0, 4, 5)):
        out = edsc_ext.avg_pool2x(torch.zeros(size, device=device))
        assert out.shape == (size[0], size[1], 2, 2)


@pytest.mark.parametrize("bad, error, words", [
    (torch.zeros(3, 4, 5), ValueError, "must be 4-D (N, C, H, W), got shape (3, 4, 5)"),
    (torch.zeros(1, 3, 4, 5, dtype=torch.int64), TypeError, "float64, float32, float16 or bfloat16, got torch.int64"),
    (torch.zeros(1, 3, 1, 5), ValueError, "height and width must be at least 2, got shape (1, 3, 1, 5)"),
    ([[1.0]], TypeError, "input must be a Tensor, got list"),
])
def test_bad_input_is_named(bad, error, words):
    with pytest.raises(error) as caught:
        edsc_ext.avg_pool2x(bad)
    assert words in str(caught.value)


def test_the_compiled_op_checks_too():
    """The op itself (torch.ops, past the Python checks) refuses what it cannot pool with a message, not a crash."""
    with pytest.raises(RuntimeError, match=re.escape("avg_pool2x: input must be 4-D (N, C, H, W), got shape [3, 4,")):
        torch.ops.edsc_ext.avg_pool2x(torch.zeros(3, 4, 5))
    with pytest.raises(RuntimeError, match=re.escape("height and width must be at least 2, got shape [1, 3, 4, 1]")):
        torch.ops.edsc_ext.avg_pool2x(torch.zeros(1, 3, 4, 1))


def _cuda_kernels(fn) -> list:
    return cuda_kernel_names(fn, "pool")


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype, vec", [(torch.float16, 8), (torch.bfloat16, 8), (torch.float32, 4),
                                        (torch.float64, 2)], ids=["f16", "bf16", "f32", "f64"])
def test_cuda_each_kernel_path_runs_and_matches_aten(gen, dtype, vec):
    """Each path of the launcher (16-byte or one-value threads, channels_last or NCHW) runs where the
    launcher says (the profiler names the kernel) and gives ATen's CUDA kernel's values bit for bit."""
    value = {torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16", torch.float32: "float",
             torch.float64: "double"}[dtype]
    cases = [  # size, channels_last, offset view (misaligned), expected kernel
        ((1, 4 * vec, 9, 10), True, False, f"avg_pool2x_channels_last_cuda_kernel<{value}, {vec}>"),
        ((2, 5, 9, 10), True, False, f"avg_pool2x_channels_last_cuda_kernel<{value}, 1>"),
        ((1, 4 * vec, 9, 10), True, True, f"avg_pool2x_channels_last_cuda_kernel<{value}, 1>"),
        ((2, 3, 7, 4 * vec), False, False, f"avg_pool2x_nchw_cuda_kernel<{value}, {vec}>"),
        ((2, 3, 7, 4 * vec + 1), False, False, f"avg_pool2x_nchw_cuda_kernel<{value}, {vec}>"),
        ((2, 3, 7, 4 * vec), False, True, f"avg_pool2x_nchw_cuda_kernel<{value}, 1>"),
        ((2, 3, 7, 6), False, False, f"avg_pool2x_nchw_cuda_kernel<{value}, {vec if 3 % vec == 0 else 1}>"),
    ]
    for size, channels_last, offset, kernel in cases:
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        x = torch.randn(size, generator=gen).cuda().to(dtype).contiguous(memory_format=fmt)
        if offset:  # the same values one element into a larger storage: not 16-byte aligned
            storage = torch.empty(x.numel() + 1, dtype=dtype, device="cuda")
            x = storage[1:].as_strided(x.shape, x.stride()).copy_(x)
        out = []
        names = _cuda_kernels(lambda x=x, out=out: out.append(edsc_ext.avg_pool2x(x)))
        assert any(kernel in name for name in names), (kernel, names)
        expected = F.avg_pool2d(x, 2)
        assert out[0].stride() == expected.stride()
        assert torch.equal(out[0], expected), (size, (out[0] - expected).abs().max())
        _assert_values(out[0], x)


@requires_cuda
@pytest.mark.cuda
def test_cuda_runs_on_the_tensors_device_and_stream(gen):
    """On a side stream the kernel waits for nothing it should not: the values are right once the stream is."""
    x = torch.randn(1, 32, 64, 96, generator=gen).cuda().half().contiguous(memory_format=torch.channels_last)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = edsc_ext.avg_pool2x(x)
    stream.synchronize()
    _assert_values(out, x)


def test_networks_pooling_kernel_switch(gen):
    model = models_module.EDSC_s()
    assert model.pooling_kernel == models_module.DEFAULT_POOLING_KERNEL == "edsc_ext"
    model.pooling_kernel = "aten"
    assert "pooling_kernel='aten'" in repr(model)
    with pytest.raises(ValueError, match="pooling_kernel must be one of"):
        model.pooling_kernel = "triton"
    with pytest.raises(ValueError, match="kernel must be one of"):
        models_module.downsample2x(torch.zeros(1, 1, 2, 2), kernel="triton")
    # On the CPU either setting is F.avg_pool2d.
    x = torch.randn(1, 4, 6, 8, generator=gen)
    assert torch.equal(models_module.downsample2x(x, kernel="edsc_ext"), F.avg_pool2d(x, 2))


@requires_cuda
@pytest.mark.cuda
def test_cuda_networks_pool_with_the_extension(gen):
    """On CUDA the U-Net's five poolings run edsc_ext's kernel (ATen's values bit for bit: the kernel test above):
    the whole EDSC_s in float16 autocast gives ATen's output with either kernel, eager and captured, within the
    upsampling test's tolerance (a first call may run cuDNN engines that later calls do not, so the network is
    warmed up first, and a half-precision engine change would move the output by about 1e-3)."""
    from test_models import cuda_case, random_edsc

    model = random_edsc(gen, False, dtype=torch.float32, head_layout="auto").cuda().eval()
    model = model.to(memory_format=torch.channels_last)
    args = cuda_case(gen, False, 1, 64, 96, channels_last=True)
    outputs = {}
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        model(*args)
        for kernel in ("aten", "edsc_ext"):
            model.pooling_kernel = kernel
            outputs[kernel] = model(*args)
            names = _cuda_kernels(lambda: model(*args))
            ours = [n for n in names if "avg_pool2x_" in n]
            assert len(ours) == (5 if kernel == "edsc_ext" else 0), names
    assert rel_error(outputs["edsc_ext"].float(), outputs["aten"].float()) <= 2e-3
    captured = model.capture(*args, autocast_dtype=torch.float16)
    assert rel_error(captured(*args).float(), outputs["edsc_ext"].float()) <= 2e-3
