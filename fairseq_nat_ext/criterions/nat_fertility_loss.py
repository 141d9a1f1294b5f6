"""Criterion ``nat_fertility_loss`` of the ``nat_fertility`` arch: label-smoothed token cross-entropy on
the positions copied by the reference fertilities, plus ``--fertility-loss-factor`` times the fertility
classifier's cross-entropy (no label smoothing), plus -- when the model is fine-tuned with
``--fertility-reinforce`` -- ``--fertility-reinforce-factor`` times its REINFORCE loss.  The reference
fertilities come from the batch (``sample["fertility"]``, task option ``--fertility-path``)."""
from dataclasses import dataclass, field

from fairseq.criterions import register_criterion

from ..compat import InputError
from .nat_base import NATLossBase, NATLossConfig


@dataclass
class FertilityLossConfig(NATLossConfig):
    fertility_loss_factor: float = field(
        default=1.0, metadata={"help": "weight of the fertility classifier's cross-entropy"})
    fertility_reinforce_factor: float = field(
        default=1.0, metadata={"help": "weight of the REINFORCE loss (with the model's --fertility-reinforce)"})


@register_criterion("nat_fertility_loss", dataclass=FertilityLossConfig)
class FertilityNATLoss(NATLossBase):
    def __init__(self, task, label_smoothing=0.1, fertility_loss_factor=1.0, fertility_reinforce_factor=1.0):
        super().__init__(task, label_smoothing)
        self.factors = {"fertility": fertility_loss_factor, "fertility_reinforce": fertility_reinforce_factor}

    def model_inputs(self, sample):
        inputs = super().model_inputs(sample)
        inputs["tgt_fertility"] = sample.get("fertility")
        if inputs["tgt_fertility"] is None:
            self._no_fertility()
        return inputs

    def _no_fertility(self):
        """One line naming what is missing: the split's ``.fert`` file (the task loaded it without),
        or ``--fertility-path`` itself."""
        missing = getattr(self.task, "missing_fertility", lambda: {})()
        if missing:
            names = ", ".join(sorted(missing.values()))
            raise InputError(f"nat_fertility_loss: the batch has no fertility targets: {names} not found "
                             "(make train and valid fertilities with examples/fertility.sh; decoding needs none)")
        raise InputError("nat_fertility_loss: the batch has no fertility targets; train with --task "
                         "nat_translation --fertility-path DIR (DIR/{train,valid}.fert from examples/fertility.sh)")

    def part_factor(self, name, part):
        return self.factors.get(name, part.get("factor", 1.0))
