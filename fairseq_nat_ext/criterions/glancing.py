"""Glancing schedule shared by the criteria that train with GLAT (``glat_loss``, ``ctc_nat_loss``,
``dag_loss``): ``--glat-ratio-start R0 --glat-ratio-end R1`` (default 0: off), the ratio going linearly
from R0 to R1 over ``--max-update`` (R0 throughout without one).  The criterion passes the ratio of the
current update to the model as ``glat_ratio`` (training only: validation and decoding never glance);
the model reports the revealed positions as ``glat_revealed`` in one of its outputs.  Logged:
``glat_ratio`` (the ratio of the log interval's updates), ``glat_revealed`` (positions revealed,
summed) and ``glat_share`` (positions revealed per target token of the interval's batches: GLAT's and the
DAG's reveal target positions, so it is the share of the reference shown; GLAT+CTC reveals alignment
positions, up to ratio x the upsampled length, so it can exceed the share of distinct tokens).  Models: ``models/nat/glancing.py``."""
from dataclasses import dataclass, field
from typing import Optional

from fairseq import metrics
from omegaconf import II

from ..compat import InputError
from .nat_base import NATLossConfig


@dataclass
class GlancingLossConfig(NATLossConfig):
    glat_ratio_start: float = field(
        default=0.0, metadata={"help": "glancing: share of the first pass' wrong positions revealed at the "
                                       "first update (0 = no glancing)"}
    )
    glat_ratio_end: Optional[float] = field(
        default=None, metadata={"help": "glancing: the share at --max-update (linear; default: the start "
                                        "value throughout)"}
    )
    max_update: int = II("optimization.max_update")


class GlancingMixin:
    """Put before the loss class: ``class X(GlancingMixin, NATLossBase)``; call :meth:`init_glancing`."""

    def init_glancing(self, name, glat_ratio_start=0.0, glat_ratio_end=None, max_update=0):
        end = glat_ratio_start if glat_ratio_end is None else glat_ratio_end
        for opt, v in (("--glat-ratio-start", glat_ratio_start), ("--glat-ratio-end", end)):
            if not 0.0 <= float(v) <= 1.0:
                raise InputError(f"{name}: {opt} must be in [0, 1], got {v}")
        self.glat_start, self.glat_end = float(glat_ratio_start), float(end)
        self.max_update = int(max_update or 0)
        self.num_updates = 0

    @property
    def glancing(self):
        return self.glat_start > 0 or self.glat_end > 0

    def glat_ratio(self):
        """The glancing ratio at the current update (linear from start to end over --max-update)."""
        if self.max_update <= 0:
            return self.glat_start
        t = min(1.0, self.num_updates / self.max_update)
        return self.glat_start + t * (self.glat_end - self.glat_start)

    def forward(self, model, sample, reduce=True):
        self.num_updates = int(getattr(model, "num_updates", 0) or 0)  # the task sets it on the model
        loss, sample_size, log = super().forward(model, sample, reduce=reduce)
        if self.glancing and self.training:
            log["glat_ratio"] = self.glat_ratio() * log["nsentences"]  # summable: divided back below
            log.setdefault("glat_revealed", 0)
        return loss, sample_size, log

    def model_inputs(self, sample):
        inputs = super().model_inputs(sample)
        ratio = self.glat_ratio()
        if ratio > 0 and self.training:
            inputs["glat_ratio"] = ratio
        return inputs

    @staticmethod
    def reduce_glancing(logging_outputs):
        if any("glat_ratio" in log for log in logging_outputs):
            sents = sum(log.get("nsentences", 0) for log in logging_outputs if "glat_ratio" in log)
            ratio = sum(log.get("glat_ratio", 0) for log in logging_outputs)
            metrics.log_scalar("glat_ratio", ratio / max(sents, 1), sents, round=3)
        if any("glat_revealed" in log for log in logging_outputs):
            revealed = sum(log.get("glat_revealed", 0) for log in logging_outputs)
            ntokens = sum(log.get("ntokens", 0) for log in logging_outputs if "glat_revealed" in log)
            metrics.log_scalar_sum("glat_revealed", revealed)
            metrics.log_scalar("glat_share", revealed / max(ntokens, 1), ntokens, round=3)
