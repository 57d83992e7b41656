"""vector_add: the smallest end-to-end example of the build, dispatch and device handling. Tests
that take a ``device`` run on the CPU and, where a GPU is present, on CUDA (those cases carry the
``cuda`` mark and skip cleanly without a GPU); opcheck: test_opcheck.py."""

from __future__ import annotations

import pytest
import torch

import edsc_ext

from conftest import DEVICES, cases, per_device, requires_cuda, requires_two_gpus

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]


def _random(shape, dtype, gen, device="cpu"):
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=gen, dtype=torch.float64)
    else:
        t = torch.randint(-1000, 1000, shape, generator=gen)
    return t.to(device=device, dtype=dtype)


DTYPE_AXIS = {str(d): d for d in DTYPES}
SHAPES = {str(s): s for s in [(0,), (1,), (7,), (1000003,), (3, 5, 7), ()]}


@pytest.mark.parametrize("device, shape, dtype", per_device(
    cpu=cases(SHAPES, DTYPE_AXIS),
    cuda=cases({k: SHAPES[k] for k in ("(0,)", "(1,)", "(1000003,)", "(3, 5, 7)")}, DTYPE_AXIS)))
def test_matches_plus(gen, device, shape, dtype):
    a, b = _random(shape, dtype, gen, device), _random(shape, dtype, gen, device)
    out = edsc_ext.vector_add(a, b)
    assert out.device == a.device and out.dtype == dtype and out.shape == a.shape and out.is_contiguous()
    assert torch.equal(out, a + b)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous(gen, device):
    a = _random((64, 33), torch.float32, gen, device).t().requires_grad_()
    b = _random((33, 128), torch.float32, gen, device)[:, ::2]
    assert not a.is_contiguous() and not b.is_contiguous()
    out = edsc_ext.vector_add(a, b)
    assert torch.equal(out, a + b)
    out.sum().backward()
    assert torch.equal(a.grad, torch.ones_like(a))
    c = _random((1, 33), torch.float32, gen, device).expand(33, 33)  # stride 0
    d = _random((33, 33), torch.float32, gen, device)
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


# name -> (the arguments on a device, the exception, what its message names)
BAD_ARGUMENTS = {
    "length": (lambda d: (torch.zeros(3, device=d), torch.zeros(4, device=d)), ValueError, "shape"),
    "2d-shape": (lambda d: (torch.zeros(2, 3, device=d), torch.zeros(3, 2, device=d)), ValueError, "shape"),
    "dtype": (lambda d: (torch.zeros(3, device=d), torch.zeros(3, dtype=torch.float64, device=d)), TypeError,
              "dtype"),
    "int-vs-float": (lambda d: (torch.zeros(3, dtype=torch.int32, device=d), torch.zeros(3, device=d)), TypeError,
                     "dtype"),
    # Another device: a meta tensor with a CPU one, a CPU tensor with a CUDA one.
    "device": (lambda d: (torch.zeros(3, device=d), torch.zeros(3, device="meta" if d == "cpu" else "cpu")),
               ValueError, "device"),
    "list": (lambda d: (torch.zeros(3, device=d), [0.0, 0.0, 0.0]), TypeError, "b"),
    "none": (lambda d: (None, torch.zeros(3, device=d)), TypeError, "a"),
}


@pytest.mark.parametrize("device, arguments, exc, match", per_device(
    cpu=BAD_ARGUMENTS, cuda={name: BAD_ARGUMENTS[name] for name in ("length", "device")}))
def test_bad_arguments(device, arguments, exc, match):
    a, b = arguments(device)
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
