"""modules/cpu_linear.py: the prepacked oneDNN product against the definition, and its scope."""
import gc

import pytest
import torch
import torch.nn.functional as F

from fairseq_nat_ext.modules import cpu_linear
from fairseq_nat_ext.modules.attention.mix import stacked_qkv_weight

needs_onednn = pytest.mark.skipif(not cpu_linear.available(), reason="this torch has no oneDNN prepacked linear")


@needs_onednn
@pytest.mark.parametrize("shape", [(1, 16), (7, 16), (3, 5, 16), (130, 16)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_equals_the_definition_inside_a_decoding_scope(shape, bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 37, bias=bias)
    x = torch.randn(*shape)
    with torch.no_grad(), cpu_linear.decoding([lin]):
        assert cpu_linear.usable(x, lin.weight)
        got = cpu_linear.module(lin, x)
        want = x @ lin.weight.t() + (lin.bias if bias else 0)  # the definition, not F.linear's kernel
    assert got.shape == (*shape[:-1], 37)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


@needs_onednn
def test_strided_input():
    torch.manual_seed(1)
    w, b = torch.randn(9, 12), torch.randn(9)
    x = torch.randn(12, 6).t()  # (6, 12), not contiguous
    with torch.no_grad(), cpu_linear.decoding():
        assert torch.allclose(cpu_linear.linear(x, w, b), x @ w.t() + b, atol=1e-5)


def test_outside_decoding_scopes_it_is_torchs_linear_and_caches_nothing():
    """Training, its no-grad passes and validation compute exactly what they did without the module."""
    cpu_linear.clear()
    lin = torch.nn.Linear(8, 5)
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert not cpu_linear.usable(x, lin.weight)
        assert torch.equal(cpu_linear.module(lin, x), F.linear(x, lin.weight, lin.bias))
    y = cpu_linear.module(lin, x)  # autograd on
    y.sum().backward()
    assert lin.weight.grad is not None
    assert len(cpu_linear._PACKED) == 0


def test_other_dtypes_empty_inputs_and_autograd_inside_a_scope_take_torchs_linear():
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with cpu_linear.decoding([lin]):
        assert not cpu_linear.usable(x, lin.weight)  # autograd on
        with torch.no_grad():
            xd, wd = x.double(), lin.weight.double()
            assert not cpu_linear.usable(xd, wd)
            assert torch.allclose(cpu_linear.linear(xd, wd), xd @ wd.t())
            assert cpu_linear.linear(torch.randn(0, 4), lin.weight, lin.bias).shape == (0, 3)
        with torch.inference_mode():
            assert not cpu_linear.caching()


@needs_onednn
def test_packed_weight_follows_updates_and_leaves_with_the_weight():
    torch.manual_seed(2)
    lin = torch.nn.Linear(8, 5)
    x = torch.randn(3, 8)
    with torch.no_grad(), cpu_linear.decoding([lin]):
        before = cpu_linear.module(lin, x)
        lin.weight.mul_(-2.0)  # in place on the parameter: its version changes
        after = cpu_linear.module(lin, x)
        assert torch.allclose(after, x @ lin.weight.t() + lin.bias, atol=1e-5)
        assert not torch.allclose(after, before)
        lin.weight.data = torch.randn(5, 8)  # a new storage under the same parameter
        assert torch.allclose(cpu_linear.module(lin, x), x @ lin.weight.t() + lin.bias, atol=1e-5)
        lin.weight.data.mul_(3.0)  # through .data: no version change; clear() is the documented remedy
        cpu_linear.clear()
        assert torch.allclose(cpu_linear.module(lin, x), x @ lin.weight.t() + lin.bias, atol=1e-5)
    n = len(cpu_linear._PACKED)
    del lin
    gc.collect()
    assert len(cpu_linear._PACKED) < n


@needs_onednn
def test_models_being_trained_get_no_cache():
    """fairseq's optimizers update weights through .data (no version change): a model whose parameters
    hold gradients is decoded without any cached weight, so an optimizer step is always seen."""
    torch.manual_seed(3)
    mha = torch.nn.Module()
    mha.q_proj, mha.k_proj, mha.v_proj = (torch.nn.Linear(8, 8) for _ in range(3))
    x = torch.randn(4, 8)
    mha.q_proj(x).sum().backward()  # a training step's gradients
    opt = torch.optim.SGD(mha.parameters(), lr=1.0)
    for _ in range(2):
        with torch.no_grad(), cpu_linear.decoding([mha]):
            assert not cpu_linear.caching()
            w, _ = stacked_qkv_weight(mha)
            assert torch.equal(w[:8], mha.q_proj.weight)
            assert torch.equal(cpu_linear.module(mha.q_proj, x), F.linear(x, mha.q_proj.weight, mha.q_proj.bias))
        for p in mha.parameters():
            if p.grad is not None:
                p.data.add_(p.grad, alpha=-1.0)  # an update the version counter does not see
        opt.zero_grad(set_to_none=False)
        mha.q_proj(x).sum().backward()


def test_without_onednn_everything_takes_torchs_linear(monkeypatch):
    monkeypatch.setattr(cpu_linear, "_available", False)
    w, x = torch.randn(3, 4), torch.randn(2, 4)
    with torch.no_grad(), cpu_linear.decoding():
        assert not cpu_linear.usable(x, w)
        assert torch.equal(cpu_linear.linear(x, w), F.linear(x, w))


def test_the_availability_check_draws_nothing_from_torchs_random_generator(monkeypatch):
    """The check runs at a process's first decoding product: drawing from the global generator there
    shifted every later sample (a seeded NPD run's fertilities differed between its first and second
    decoding of the same input)."""
    monkeypatch.setattr(cpu_linear, "_available", None)  # check again
    torch.manual_seed(11)
    want = torch.rand(3)
    torch.manual_seed(11)
    cpu_linear.available()
    assert torch.equal(torch.rand(3), want)


def test_fused_relu_and_residual_products_equal_the_separate_operations():
    if not cpu_linear.fused_available():
        pytest.skip("no oneDNN fused products")
    g = torch.Generator().manual_seed(3)
    w, b, x, r = (torch.randn(*shape, generator=g) for shape in ((48, 32), (48,), (7, 32), (7, 48)))
    with torch.no_grad(), cpu_linear.decoding():
        pw = cpu_linear.packed_weight(w)
        y = cpu_linear.prepacked(x, pw, b)
        assert torch.allclose(y, x @ w.t() + b, atol=1e-5)
        assert torch.equal(cpu_linear.prepacked(x, pw, b, relu=True), torch.relu(y))
        assert torch.equal(cpu_linear.prepacked_add(x, pw, b, r), y + r)
        assert torch.equal(cpu_linear.prepacked_add(x, pw, None, r), cpu_linear.prepacked(x, pw) + r)
