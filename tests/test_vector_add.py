"""vector_add: the smallest end-to-end example of the build, dispatch and device handling."""

from __future__ import annotations

import pytest
import torch

import edsc_ext

from conftest import requires_cuda, requires_two_gpus

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]


def _random(shape, dtype, gen, device="cpu"):
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=gen, dtype=torch.float64)
    else:
        t = torch.randint(-1000, 1000, shape, generator=gen)
    return t.to(device=device, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (1000003,), (3, 5, 7), ()], ids=str)
def test_matches_plus(gen, dtype, shape):
    a, b = _random(shape, dtype, gen), _random(shape, dtype, gen)
    out = edsc_ext.vector_add(a, b)
    assert out.dtype == dtype and out.shape == a.shape and out.is_contiguous()
    assert torch.equal(out, a + b)


def test_non_contiguous(gen):
    a = _random((64, 33), torch.float32, gen).t()
    b = _random((33, 128), torch.float32, gen)[:, ::2]
    assert not a.is_contiguous() and not b.is_contiguous()
    assert torch.equal(edsc_ext.vector_add(a, b), a + b)
    c = _random((1, 33), torch.float32, gen).expand(33, 33)  # stride 0
    d = _random((33, 33), torch.float32, gen)
    assert torch.equal(edsc_ext.vector_add(c, d), c + d)


def test_inputs_not_modified(gen):
    a, b = _random((100,), torch.float32, gen), _random((100,), torch.float32, gen)
    a0, b0 = a.clone(), b.clone()
    out = edsc_ext.vector_add(a, b)
    assert torch.equal(a, a0) and torch.equal(b, b0)
    assert out.data_ptr() not in (a.data_ptr(), b.data_ptr())


def test_autograd(gen):
    a = _random((5, 6), torch.float64, gen).requires_grad_()
    b = _random((5, 6), torch.float64, gen).requires_grad_()
    out = edsc_ext.vector_add(a, b)
    grad = _random((5, 6), torch.float64, gen)
    out.backward(grad)
    assert torch.equal(a.grad, grad) and torch.equal(b.grad, grad)
    assert torch.autograd.gradcheck(edsc_ext.vector_add, (a.detach().requires_grad_(), b.detach()))


@pytest.mark.parametrize("a, b, exc, match", [
    (torch.zeros(3), torch.zeros(4), ValueError, "shape"),
    (torch.zeros(2, 3), torch.zeros(3, 2), ValueError, "shape"),
    (torch.zeros(3), torch.zeros(3, dtype=torch.float64), TypeError, "dtype"),
    (torch.zeros(3, dtype=torch.int32), torch.zeros(3), TypeError, "dtype"),
    (torch.zeros(3), torch.zeros(3, device="meta"), ValueError, "device"),
    (torch.zeros(3), [0.0, 0.0, 0.0], TypeError, "b"),
    (None, torch.zeros(3), TypeError, "a"),
], ids=["length", "2d-shape", "dtype", "int-vs-float", "device", "list", "none"])
def test_bad_arguments(a, b, exc, match):
    with pytest.raises(exc, match=match):
        edsc_ext.vector_add(a, b)


def test_build_info():
    info = edsc_ext.build_info()
    assert isinstance(info, dict)
    assert isinstance(info["with_cuda"], bool)
    if torch.cuda.is_available():
        assert info["with_cuda"], "a GPU is present but the extension was built without CUDA"


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_matches_plus(gen, dtype):
    for shape in [(0,), (1,), (1000003,), (3, 5, 7)]:
        a, b = _random(shape, dtype, gen, "cuda"), _random(shape, dtype, gen, "cuda")
        out = edsc_ext.vector_add(a, b)
        assert out.device == a.device and out.dtype == dtype
        assert torch.equal(out, a + b)


@pytest.mark.cuda
@requires_cuda
def test_cuda_non_contiguous_and_autograd(gen):
    a = _random((64, 33), torch.float32, gen, "cuda").t().requires_grad_()
    b = _random((33, 128), torch.float32, gen, "cuda")[:, ::2]
    out = edsc_ext.vector_add(a, b)
    assert torch.equal(out, a + b)
    out.sum().backward()
    assert torch.equal(a.grad, torch.ones_like(a))


@pytest.mark.cuda
@requires_cuda
def test_cuda_errors(gen):
    a = torch.zeros(3, device="cuda")
    with pytest.raises(ValueError, match="device"):
        edsc_ext.vector_add(a, torch.zeros(3))
    with pytest.raises(ValueError, match="shape"):
        edsc_ext.vector_add(a, torch.zeros(4, device="cuda"))


@pytest.mark.cuda
@requires_cuda
def test_cuda_side_stream(gen):
    base_a = _random((1 << 20,), torch.float32, gen, "cuda")
    base_b = _random((1 << 20,), torch.float32, gen, "cuda")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(20_000_000)  # if the kernel ran on another stream it would read a, b too early
        a, b = base_a * 2, base_b * 3
        out = edsc_ext.vector_add(a, b)
    s.synchronize()
    assert torch.equal(out, base_a * 2 + base_b * 3)


@pytest.mark.multi_gpu
@requires_two_gpus
def test_cuda_other_device(gen):
    a = _random((1000,), torch.float32, gen, "cuda:1")
    b = _random((1000,), torch.float32, gen, "cuda:1")
    with torch.cuda.device(0):
        out = edsc_ext.vector_add(a, b)
    assert out.device == torch.device("cuda:1")
    assert torch.equal(out, a + b)
