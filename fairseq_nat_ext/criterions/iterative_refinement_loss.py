"""Criterion ``iterative_refinement_loss`` of the ``iterative_refinement`` arch: the mean over the
training refinement passes of each pass' label-smoothed token cross-entropy (every pass predicts the
whole target), plus the length loss weighted by the model's ``--length-loss-factor``."""
from fairseq.criterions import register_criterion

from .nat_base import NATLossBase, NATLossConfig


@register_criterion("iterative_refinement_loss", dataclass=NATLossConfig)
class IterativeRefinementLoss(NATLossBase):
    pass
