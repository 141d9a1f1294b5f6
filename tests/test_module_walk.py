"""module_walk's fast walks against torch's own ``modules()`` / ``parameters()``."""
import torch
from torch import nn

from fairseq_nat_ext.modules import module_walk


def _model():
    from fairseq.modules import FairseqDropout

    shared = nn.Linear(4, 4)
    net = nn.Sequential(nn.Linear(4, 4), nn.Sequential(shared, nn.ReLU(), FairseqDropout(0.3)), shared)
    net.extra = nn.ModuleDict({"a": nn.LayerNorm(4), "b": nn.Sequential()})
    net.register_module("empty", None)
    return net


def test_submodules_are_torchs_modules_each_once():
    net = _model()
    assert {id(m) for m in module_walk.submodules(net)} == {id(m) for m in net.modules()}
    assert len(module_walk.submodules(net)) == len(list(net.modules()))


def test_training_grads_and_dropout_at_inference_as_torch_sees_them():
    net = _model()
    assert module_walk.any_training(net)
    net.eval()
    assert not module_walk.any_training(net)
    net.extra["a"].train()
    assert module_walk.any_training(net)
    assert not module_walk.any_grad(net)
    net[0](torch.randn(2, 4)).sum().backward()
    assert module_walk.any_grad(net) == any(p.grad is not None for p in net.parameters())
    assert not module_walk.dropout_at_inference(net)
    net[1][2].apply_during_inference = True  # fairseq's --retain-dropout
    assert module_walk.dropout_at_inference(net)
    net[1][2].p = 0.0  # a dropout of 0 drops nothing
    assert not module_walk.dropout_at_inference(net)
