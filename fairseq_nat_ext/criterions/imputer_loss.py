"""Criterion ``imputer_loss`` for the ``imputer`` arch, averaged over the masked alignment positions.

``--imputer-loss marginal`` (default): -log of the sum, over every alignment that spells the target
and agrees with the observed (unmasked) positions, of the product of the model's probabilities at
the masked positions -- torch's CTC over the lattice restricted by the observation
(``oracles.ctc_alignment.restrict_to_observed``).  ``--imputer-loss best_alignment``: cross-entropy
of the masked positions against the imputed best alignment.  ``--label-smoothing`` applies to the
masked positions.  Infeasible pairs are left out and counted as in ``ctc_nat_loss``
(``ctc_filtered``, ``ctc_pairs``).
"""
from dataclasses import dataclass, field

import torch
from fairseq.criterions import register_criterion
from fairseq.dataclass import ChoiceEnum

from ..oracles.ctc_alignment import restrict_to_observed
from .ctc_nat_loss import CTCLossBase, ctc_nll, smoothing_term, upcast
from .nat_base import NATLossConfig, label_smoothed_nll

IMPUTER_LOSSES = ChoiceEnum(["marginal", "best_alignment"])


@dataclass
class ImputerLossConfig(NATLossConfig):
    imputer_loss: IMPUTER_LOSSES = field(
        default="marginal",
        metadata={"help": "marginal: CTC over the alignments consistent with the observed positions; "
                          "best_alignment: cross-entropy on the imputed alignment's masked positions"},
    )


def imputer_marginal_nll(lprobs, alignment, masked, input_lengths, targets, target_lengths, blank):
    """Summed -log sum_{a consistent} prod_{masked t} p(a_t) of the rows (see the module doc)."""
    inside = torch.arange(lprobs.size(1), device=lprobs.device).unsqueeze(0) < input_lengths.unsqueeze(1)
    restricted = restrict_to_observed(upcast(lprobs), alignment, inside & ~masked)
    return ctc_nll(restricted, input_lengths, targets, target_lengths, blank)


@register_criterion("imputer_loss", dataclass=ImputerLossConfig)
class ImputerLoss(CTCLossBase):
    def __init__(self, task, label_smoothing=0.1, imputer_loss="marginal"):
        super().__init__(task, label_smoothing)
        self.imputer_loss = str(imputer_loss)

    def part_loss(self, name, part):
        if "alignment" not in part:
            return super().part_loss(name, part)
        keep, log = self.feasible_rows(part)
        lp = part["ctc_lprobs"]
        masked = part["masked"] & keep.unsqueeze(1)
        if not bool(masked.any()):
            zero = lp.sum() * 0.0
            return zero, zero, log
        if self.imputer_loss == "best_alignment":
            loss, nll = label_smoothed_nll(lp, part["alignment"], masked, self.eps)
            return loss, nll, log
        lp, masked = lp[keep], masked[keep]
        n_masked = masked.sum()
        nll = imputer_marginal_nll(lp, part["alignment"][keep], masked, part["input_lengths"][keep],
                                   part["targets"][keep], part["target_lengths"][keep],
                                   part["blank"]) / n_masked
        loss = nll
        if self.eps > 0:
            loss = (1.0 - self.eps) * nll + self.eps * smoothing_term(lp, masked)
        return loss, nll, log
