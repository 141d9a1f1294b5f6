"""Criterion ``levenshtein_loss``: placeholder-count, token and deletion losses of the Levenshtein
Transformer (each a label-smoothed cross-entropy averaged over its positions, summed with weights)."""
from fairseq.criterions import register_criterion

from .nat_base import NATLossBase, NATLossConfig


@register_criterion("levenshtein_loss", dataclass=NATLossConfig)
class LevenshteinLoss(NATLossBase):
    pass
