"""modules/cpu_linear.py: the prepacked oneDNN product against torch's F.linear."""
import gc

import pytest
import torch
import torch.nn.functional as F

from fairseq_nat_ext.modules import cpu_linear

needs_onednn = pytest.mark.skipif(not cpu_linear.available(), reason="this torch has no oneDNN prepacked linear")


@needs_onednn
@pytest.mark.parametrize("shape", [(1, 16), (7, 16), (3, 5, 16), (130, 16)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_equals_torch_linear(shape, bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 37, bias=bias)
    x = torch.randn(*shape)
    with torch.no_grad():
        got = cpu_linear.module(lin, x)
        want = x @ lin.weight.t() + (lin.bias if bias else 0)  # the definition, not F.linear's kernel
        assert cpu_linear.usable(x, lin.weight)
    assert got.shape == (*shape[:-1], 37)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


@needs_onednn
def test_strided_input():
    torch.manual_seed(1)
    w, b = torch.randn(9, 12), torch.randn(9)
    x = torch.randn(12, 6).t()  # (6, 12), not contiguous
    with torch.no_grad():
        assert torch.allclose(cpu_linear.linear(x, w, b), x @ w.t() + b, atol=1e-5)


def test_autograd_other_dtypes_and_empty_inputs_take_torchs_linear():
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    y = cpu_linear.module(lin, x)  # autograd on: F.linear, differentiable
    assert y.requires_grad and not cpu_linear.usable(x, lin.weight)
    y.sum().backward()
    assert lin.weight.grad is not None
    with torch.no_grad():
        xd = x.double()
        assert not cpu_linear.usable(xd, lin.weight.double())
        assert torch.allclose(cpu_linear.linear(xd, lin.weight.double()), xd @ lin.weight.double().t())
        assert cpu_linear.linear(torch.randn(0, 4), lin.weight, lin.bias).shape == (0, 3)


@needs_onednn
def test_packed_weight_follows_in_place_updates_and_leaves_with_the_weight():
    torch.manual_seed(2)
    lin = torch.nn.Linear(8, 5)
    x = torch.randn(3, 8)
    with torch.no_grad():
        before = cpu_linear.module(lin, x)
        lin.weight.mul_(-2.0)  # an optimizer step updates in place
        after = cpu_linear.module(lin, x)
        assert torch.allclose(after, x @ lin.weight.t() + lin.bias, atol=1e-5)
        assert not torch.allclose(after, before)
        lin.weight.data = torch.randn(5, 8)  # a new tensor under the same parameter
        assert torch.allclose(cpu_linear.module(lin, x), x @ lin.weight.t() + lin.bias, atol=1e-5)
    n = len(cpu_linear._PACKED)
    del lin
    gc.collect()
    assert len(cpu_linear._PACKED) < n


def test_without_onednn_everything_takes_torchs_linear(monkeypatch):
    monkeypatch.setattr(cpu_linear, "_available", False)
    w, x = torch.randn(3, 4), torch.randn(2, 4)
    with torch.no_grad():
        assert not cpu_linear.usable(x, w)
        assert torch.equal(cpu_linear.linear(x, w), F.linear(x, w))
