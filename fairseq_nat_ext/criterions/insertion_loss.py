"""Criterion ``insertion_loss``: the Insertion Transformer's slot loss (the model computes it from the
insertion oracle: balanced-binary-tree or uniform span weights, end-of-slot labels, per-slot or joint
softmax).  ``--label-smoothing`` eps gives ``(1 - eps) * loss + eps * smooth``, ``smooth`` being the
model's cross-entropy against the uniform distribution over the same support (as fairseq's ``nat_loss``
does for its ``insertion_transformer``); ``nll_loss`` is the unsmoothed loss."""
from fairseq.criterions import register_criterion

from .nat_base import NATLossBase, NATLossConfig


@register_criterion("insertion_loss", dataclass=NATLossConfig)
class InsertionLoss(NATLossBase):
    def part_loss(self, name, part):
        if "smooth" not in part:
            return super().part_loss(name, part)
        nll = part["loss"]
        loss = (1.0 - self.eps) * nll + self.eps * part["smooth"] if self.eps > 0 else nll
        return loss, nll.detach()
