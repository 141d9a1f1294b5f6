"""Criterion ``mask_predict_loss``: label-smoothed CE on the masked target tokens plus the
length-classification loss weighted by the model's ``--length-loss-factor``."""
from fairseq.criterions import register_criterion

from .nat_base import NATLossBase, NATLossConfig


@register_criterion("mask_predict_loss", dataclass=NATLossConfig)
class MaskPredictLoss(NATLossBase):
    pass
