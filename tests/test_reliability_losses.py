"""Every translation arch of the plugin (reliability_utils.ARCHS): training steps of its task on toy
batches log only finite losses (the total and every named part) and give finite gradients.
(iterative_refinement once logged an infinite loss for every pass but the last -- the next pass'
argmax wrote -inf into the logits the loss read -- and fairseq-train went on silently.)"""
import math

import pytest
import torch

from conftest import build_model_and_task
from reliability_utils import ARCHS, arch_flags, small_dims


class _Backward:
    """What task.train_step needs of fairseq's optimizer."""

    def backward(self, loss):
        loss.backward()


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_training_steps_log_finite_losses_and_gradients(arch, toy_databin):
    torch.manual_seed(0)
    data_bin = toy_databin[0]
    task, model, args = build_model_and_task(data_bin, arch_flags(arch, data_bin) + small_dims(arch))
    criterion = task.build_criterion(args)
    task.load_dataset("train")
    ds = task.dataset("train")
    for start in (0, 8, 16):  # a few batches: the roll-ins and noises draw differently each time
        sample = ds.collater([ds[i] for i in range(start, min(start + 8, len(ds)))])
        model.zero_grad()
        loss, _, log = task.train_step(sample, model, criterion, _Backward(), update_num=start)
        losses = {k: v for k, v in log.items() if k in ("loss", "nll_loss") or k.endswith("-loss")}
        assert "loss" in losses and all(math.isfinite(float(v)) for v in losses.values()), (arch, losses)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads), arch
