"""Criterion ``glat_loss``: the Glancing Transformer's loss (Qian et al., ACL 2021), for the ``glat`` arch.

The label-smoothed cross-entropy of the positions *not* revealed by glancing (mean over them) plus the
length loss (weight ``--length-loss-factor``), summed like fairseq's NAT criterion; glancing options
``--glat-ratio-start/--glat-ratio-end`` (criterions/glancing.py; the paper anneals 0.5 -> 0.3).  With both
at 0 it is the vanilla NAT's loss.
"""
from fairseq.criterions import register_criterion

from .glancing import GlancingLossConfig, GlancingMixin
from .nat_base import NATLossBase


@register_criterion("glat_loss", dataclass=GlancingLossConfig)
class GLATLoss(GlancingMixin, NATLossBase):
    def __init__(self, task, label_smoothing=0.1, glat_ratio_start=0.0, glat_ratio_end=None, max_update=0):
        super().__init__(task, label_smoothing)
        self.init_glancing("glat_loss", glat_ratio_start, glat_ratio_end, max_update)

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        NATLossBase.reduce_metrics(logging_outputs)
        GlancingMixin.reduce_glancing(logging_outputs)
