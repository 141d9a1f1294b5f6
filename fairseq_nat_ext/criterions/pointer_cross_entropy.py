"""Criterion ``pointer_cross_entropy``: cross-entropy of the pointer distribution (B, T, N + 1) against
``sample["target_slots"]`` (slot 0 = end, -1 = padding), summed over target tokens; logs loss and
nll in bits per token, token accuracy and whole-sequence accuracy under teacher forcing (argmax over
all slots, no validity masks)."""

import math

import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion

from ..compat import InputError
from ..tasks.pointer_geometry import TARGET_PAD_SLOT


@register_criterion("pointer_cross_entropy")
class PointerCrossEntropy(FairseqCriterion):
    def forward(self, model, sample, reduce=True):
        if "target_slots" not in sample:
            raise InputError("pointer_cross_entropy: the batch has no target_slots (use --task pointer_geometry)")
        logits = model(**sample["net_input"])  # (B, T, S)
        target = sample["target_slots"]  # (B, T)
        lprobs = F.log_softmax(logits.float(), -1)
        loss = F.nll_loss(lprobs.reshape(-1, lprobs.size(-1)), target.reshape(-1),
                          ignore_index=TARGET_PAD_SLOT, reduction="sum")
        real = target != TARGET_PAD_SLOT
        hit = (lprobs.argmax(-1) == target) & real
        ntokens = int(real.sum())
        log = {
            "loss": loss.data, "nll_loss": loss.data, "ntokens": ntokens, "nsentences": target.size(0),
            "sample_size": ntokens, "ncorrect": int(hit.sum()),
            "nseq_correct": int((hit | ~real).all(1).sum()),
        }
        return loss, ntokens, log

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        loss = sum(log.get("loss", 0) for log in logging_outputs)
        n = sum(log.get("sample_size", 0) for log in logging_outputs)
        nsent = sum(log.get("nsentences", 0) for log in logging_outputs)
        correct = sum(log.get("ncorrect", 0) for log in logging_outputs)
        seq = sum(log.get("nseq_correct", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss / max(n, 1) / math.log(2), n, round=3)
        metrics.log_scalar("nll_loss", loss / max(n, 1) / math.log(2), n, round=3)
        metrics.log_derived("ppl", lambda meters: 2 ** meters["nll_loss"].avg)
        metrics.log_scalar("accuracy", 100.0 * correct / max(n, 1), n, round=2)
        metrics.log_scalar("seq_accuracy", 100.0 * seq / max(nsent, 1), nsent, round=2)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
