"""Shared loss for NAT models that return named outputs.

``model(**net_input, prev_output_tokens=..., tgt_tokens=...)`` returns ``{name: part}`` where part is
either ``{"out": logits (..., V), "tgt": (...), "mask": bool (...) or None, "factor": w}`` (a
label-smoothed cross-entropy over the selected positions, averaged over them) or a precomputed
``{"loss": scalar, "nll_loss": scalar, "factor": w}``.  Like fairseq's NAT criterion the total is a
weighted sum of per-part means with ``sample_size = 1``.  A subclass' ``part_loss`` may return a third
element, a dict of extra logging values (e.g. counts, summed by its ``reduce_metrics``).  A part's
``glat_revealed`` (glancing) is copied to the log.
"""
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fairseq import metrics, utils
from fairseq.criterions import FairseqCriterion
from fairseq.dataclass import FairseqDataclass


@dataclass
class NATLossConfig(FairseqDataclass):
    label_smoothing: float = field(
        default=0.1, metadata={"help": "epsilon for label smoothing, 0 means no label smoothing"}
    )


def label_smoothed_nll(logits, target, mask=None, eps=0.0):
    """Mean label-smoothed CE over the masked positions.

    logits (N..., V), target (N...), mask bool (N...) -> (loss, nll_loss) scalars."""
    if mask is not None:
        logits, target = logits[mask], target[mask]
    if target.numel() == 0:
        zero = logits.sum() * 0.0  # keeps the graph; no positions selected
        return zero, zero
    lprobs = F.log_softmax(logits.float(), dim=-1)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    nll_loss = nll.mean()
    if eps > 0:
        smooth = -lprobs.mean(-1)
        loss = ((1.0 - eps) * nll + eps * smooth).mean()
    else:
        loss = nll_loss
    return loss, nll_loss


class NATLossBase(FairseqCriterion):
    def __init__(self, task, label_smoothing=0.1):
        super().__init__(task)
        self.eps = label_smoothing

    def model_inputs(self, sample):
        net = sample["net_input"]
        return dict(
            src_tokens=net["src_tokens"],
            src_lengths=net["src_lengths"],
            prev_output_tokens=sample["prev_target"],
            tgt_tokens=sample["target"],
        )

    def part_loss(self, name, part):
        if "loss" in part:
            return part["loss"], part.get("nll_loss", part["loss"])
        eps = part.get("ls", self.eps) if name != "length" else 0.0
        return label_smoothed_nll(part["out"], part["tgt"], part.get("mask"), eps)

    def part_factor(self, name, part):
        """The weight of a named output in the total (the model's ``factor``; subclasses may override)."""
        return part.get("factor", 1.0)

    def forward(self, model, sample, reduce=True):
        if "prev_target" not in sample:
            raise KeyError(
                f"{type(self).__name__}: sample has no 'prev_target'; train with --task nat_translation"
            )
        outputs = model(**self.model_inputs(sample))
        total, total_nll = 0.0, 0.0
        log = {}
        for name, part in outputs.items():
            loss, nll, *extra = self.part_loss(name, part)
            if extra:
                log.update(extra[0])
            if "glat_revealed" in part:  # glancing (criterions/glancing.py): positions revealed
                log["glat_revealed"] = log.get("glat_revealed", 0) + int(part["glat_revealed"])
            factor = self.part_factor(name, part)
            total = total + factor * loss
            total_nll = total_nll + factor * nll
            log[f"{name}-loss"] = utils.item(loss.data)
        nsentences = sample["target"].size(0)
        ntokens = sample["ntokens"]
        log.update(
            loss=utils.item(total.data), nll_loss=utils.item(total_nll.data),
            ntokens=ntokens, nsentences=nsentences, sample_size=1,
        )
        return total, 1, log

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        for key in sorted({k for log in logging_outputs for k in log if k == "loss" or k.endswith("loss")}):  # one log order
            val = sum(log.get(key, 0) for log in logging_outputs)
            metrics.log_scalar(key, val / max(sample_size, 1) / math.log(2), sample_size, round=3)
        metrics.log_derived(
            "ppl", lambda meters: utils.get_perplexity(meters["loss"].avg) if "loss" in meters else 0
        )

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
