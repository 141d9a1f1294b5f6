"""Criterion ``insertion_loss``: the Insertion Transformer's slot loss (the model computes it from the
insertion oracle: balanced-binary-tree or uniform span weights, end-of-slot labels)."""
from fairseq.criterions import register_criterion

from .nat_base import NATLossBase, NATLossConfig


@register_criterion("insertion_loss", dataclass=NATLossConfig)
class InsertionLoss(NATLossBase):
    pass
