"""Criterion ``ctc_nat_loss``: CTC (torch's ``ctc_loss``, blank from the dictionary) of the ``ctc_nat``
arch, averaged over the target tokens of the batch.

Infeasible pairs -- the upsampled length is shorter than the target plus its adjacent repeats, so
no alignment exists -- are left out of the loss and counted: ``ctc_filtered`` (pairs left out) and
``ctc_pairs`` (pairs seen) are summed in the logs (per log interval in ``train_inner`` lines, per
epoch in ``train`` lines: the epoch's count of filtered training pairs).  The loss is therefore
never a silent inf/NaN, and decoding filters nothing.  ``--label-smoothing eps`` mixes in eps times
the mean negative log-probability over the vocabulary at every alignment position.
"""
import torch
import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import register_criterion

from .glancing import GlancingLossConfig, GlancingMixin
from .nat_base import NATLossBase

COUNT_KEYS = ("ctc_filtered", "ctc_pairs")


def upcast(x):
    """float16/bfloat16 -> float32; float32/64 unchanged."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def ctc_nll(lprobs, input_lengths, targets, target_lengths, blank):
    """Summed CTC negative log-likelihood of the rows.  lprobs (B, T, V) log-probs."""
    return F.ctc_loss(upcast(lprobs).transpose(0, 1), targets, input_lengths, target_lengths,
                      blank=blank, reduction="sum", zero_infinity=False)


def smoothing_term(lprobs, positions):
    """Mean over the selected positions (bool (B, T)) of -mean_v log p(v)."""
    if not bool(positions.any()):
        return lprobs.sum() * 0.0
    return -lprobs[positions].mean(-1).mean()


class CTCLossBase(NATLossBase):
    def feasible_rows(self, part):
        """-> (keep bool (B,), extra log values)."""
        keep = part["feasible"]
        return keep, {"ctc_filtered": int((~keep).sum()), "ctc_pairs": int(keep.numel())}

    def part_loss(self, name, part):
        if "ctc_lprobs" not in part:
            return super().part_loss(name, part)
        keep, log = self.feasible_rows(part)
        lp = part["ctc_lprobs"]
        if not bool(keep.any()):
            zero = lp.sum() * 0.0  # keeps the graph: every pair of the batch was filtered
            return zero, zero, log
        lp, lengths = lp[keep], part["input_lengths"][keep]
        tgt, tgt_lengths = part["targets"][keep], part["target_lengths"][keep]
        nll = ctc_nll(lp, lengths, tgt, tgt_lengths, part["blank"]) / tgt_lengths.sum().clamp(min=1)
        loss = nll
        if self.eps > 0:
            inside = torch.arange(lp.size(1), device=lp.device).unsqueeze(0) < lengths.unsqueeze(1)
            loss = (1.0 - self.eps) * nll + self.eps * smoothing_term(lp, inside)
        return loss, nll, log

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        NATLossBase.reduce_metrics(logging_outputs)
        for key in COUNT_KEYS:
            if any(key in log for log in logging_outputs):
                metrics.log_scalar_sum(key, sum(log.get(key, 0) for log in logging_outputs))


@register_criterion("ctc_nat_loss", dataclass=GlancingLossConfig)
class CTCNATLoss(GlancingMixin, CTCLossBase):
    """``--glat-ratio-start/--glat-ratio-end``: glancing over the best CTC alignment (GLAT+CTC)."""

    def __init__(self, task, label_smoothing=0.1, glat_ratio_start=0.0, glat_ratio_end=None, max_update=0):
        super().__init__(task, label_smoothing)
        self.init_glancing("ctc_nat_loss", glat_ratio_start, glat_ratio_end, max_update)

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        GlancingMixin.reduce_glancing(logging_outputs)
