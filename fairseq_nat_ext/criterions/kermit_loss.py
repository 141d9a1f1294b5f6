"""Criterion ``kermit_loss``: KERMIT's insertion loss over the generated sides of each sampled mode
(the model computes it from the insertion oracle; see ``models/nat/kermit.py``)."""
from fairseq.criterions import register_criterion

from .nat_base import NATLossBase, NATLossConfig


@register_criterion("kermit_loss", dataclass=NATLossConfig)
class KermitLoss(NATLossBase):
    def model_inputs(self, sample):
        net = sample["net_input"]
        out = dict(src_tokens=net["src_tokens"], src_lengths=net["src_lengths"], tgt_tokens=sample["target"])
        if "src_lang" in net:  # multilingual (task kermit with --lang-pairs): the pair's languages
            out.update(src_lang=net["src_lang"], tgt_lang=net["tgt_lang"])
        return out

    def forward(self, model, sample, reduce=True):
        sample.setdefault("prev_target", None)  # KERMIT builds its own canvases
        return super().forward(model, sample, reduce)
