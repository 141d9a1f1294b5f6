"""Criterion ``classification_cross_entropy``: cross-entropy over ``model(**net_input)`` logits
(B, classes) against ``sample["target"]``; logs loss (bits) and accuracy."""

import math

import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion


@register_criterion("classification_cross_entropy")
class ClassificationCrossEntropy(FairseqCriterion):
    def forward(self, model, sample, reduce=True):
        logits = model(**sample["net_input"])
        target = sample["target"]
        loss = F.cross_entropy(logits.float(), target, reduction="sum")
        n = target.numel()
        log = {"loss": loss.data, "ntokens": sample["ntokens"], "nsentences": n, "sample_size": n,
               "ncorrect": (logits.argmax(-1) == target).sum().item()}
        return loss, n, log

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        loss = sum(log.get("loss", 0) for log in logging_outputs)
        n = sum(log.get("sample_size", 0) for log in logging_outputs)
        correct = sum(log.get("ncorrect", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss / max(n, 1) / math.log(2), n, round=3)
        metrics.log_scalar("accuracy", 100.0 * correct / max(n, 1), n, round=2)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
