"""Insertion Transformer (Stern et al. 2019), arch ``insertion`` (+ ``insertion_small``, ``_tiny``).

A non-causal decoder reads the canvas ``<s> ... </s>``; slot k (between tokens k and k+1) is
represented by a linear map of the concatenated neighbour states, and the output layer gives, per
slot, a distribution over the vocabulary in which ``</s>`` means "nothing more to insert here"
(the end-of-slot label).  Training: the canvas is a random subsequence of the target (fairseq's
random deletion noise); the loss of every slot is the oracle's (``fairseq_nat_ext.oracles.insertion``)
weighted cross-entropy over its missing span -- ``--insertion-loss binary_tree`` (temperature
``--insertion-tau``) or ``uniform`` -- or the end-of-slot label when the span is
empty; slot losses are averaged.  Decoding (``generators/insertion.py``) inserts the argmax token in
every slot whose argmax is not end-of-slot, in parallel, until no slot inserts.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.models import register_model, register_model_architecture
from fairseq.models.nat import FairseqNATDecoder
from fairseq.models.transformer import base_architecture as transformer_base_architecture

from ...oracles.insertion import insertion_oracle
from ...oracles.levenshtein import levenshtein_oracle
from ...tasks.nat_translation import MASK_SYMBOL
from .base import SMALL, TINY, EditNATModel, arch_defaults
from .edit_ops import with_bos


class InsertionDecoder(FairseqNATDecoder):
    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=False)
        d = args.decoder_embed_dim
        self.mask_idx = dictionary.index(MASK_SYMBOL)
        self.slot_proj = nn.Linear(2 * d, d)

    def forward_slots(self, tokens, encoder_out, normalize=False):
        """tokens (B, T) -> (B, T-1, V) per-slot token logits (``</s>`` = end of slot)."""
        h, _ = self.extract_features(tokens, encoder_out=encoder_out, full_context_alignment=True)
        slots = self.slot_proj(torch.cat([h[:, :-1], h[:, 1:]], -1))
        out = self.output_layer(slots)
        return F.log_softmax(out, -1) if normalize else out

    def forward(self, tokens, encoder_out, **unused):
        return self.forward_slots(tokens, encoder_out)


@register_model("insertion")
class InsertionModel(EditNATModel):
    decoder_class = InsertionDecoder

    @property
    def generator_class(self):
        from ...generators.insertion import InsertionGenerator

        return InsertionGenerator

    @staticmethod
    def add_args(parser):
        EditNATModel.add_args(parser)
        parser.add_argument("--insertion-loss", choices=["binary_tree", "uniform"],
                            help="span weights of the slot loss: balanced binary tree (softmax of -distance "
                                 "to the span centre / tau) or uniform")
        parser.add_argument("--insertion-tau", type=float,
                            help="balanced-binary-tree temperature (0 also means uniform)")

    def span_tau(self):
        return span_tau(self.args)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, tgt_tokens, **kwargs):
        pad = self.pad
        tgt = with_bos(tgt_tokens, self.bos)
        canvas = prev_output_tokens
        enc = self.encoder(src_tokens, src_lengths=src_lengths)
        # which target tokens are on the canvas: the oracle's alignment (a subsequence keeps all)
        keep = levenshtein_oracle(canvas, tgt, pad, self.mask_idx).keep_tgt
        o = insertion_oracle(tgt, keep, pad, tau=self.span_tau())
        lp = self.decoder.forward_slots(canvas, enc, normalize=True).float()  # (B, S, V)
        S = lp.size(1)
        # slot s of the oracle is "before kept token s": canvas slot k (after token k) = oracle slot k+1
        slot = (o.slot - 1).clamp(0, S - 1)
        per_pos = lp[torch.arange(tgt.size(0), device=tgt.device).unsqueeze(1), slot, tgt]  # (B, m)
        span_loss = -(o.weight * per_pos).masked_fill(~o.missing, 0.0)  # (B, m)
        slot_loss = torch.zeros(lp.shape[:2], device=lp.device).scatter_add(1, slot, span_loss)
        valid = torch.arange(S, device=lp.device).unsqueeze(0) < (canvas.ne(pad).sum(1) - 1).unsqueeze(1)
        done = o.slot_done[:, 1:S + 1] & valid
        slot_loss = slot_loss + torch.where(done, -lp[..., self.eos], torch.zeros_like(slot_loss))
        n = valid.sum().clamp_min(1)
        loss = slot_loss.masked_fill(~valid, 0.0).sum() / n
        return {"insertion": {"loss": loss, "nll_loss": loss.detach(), "factor": 1.0}}


def span_tau(args):
    """The oracle's tau: None (uniform) for --insertion-loss uniform or --insertion-tau 0."""
    tau = getattr(args, "insertion_tau", 1.0)
    if getattr(args, "insertion_loss", "binary_tree") == "uniform" or not tau or tau <= 0:
        return None
    return tau


@register_model_architecture("insertion", "insertion")
def insertion_base(args):
    arch_defaults(args, insertion_loss="binary_tree", insertion_tau=1.0, share_all_embeddings=True, dropout=0.3, apply_bert_init=True)
    transformer_base_architecture(args)


@register_model_architecture("insertion", "insertion_small")
def insertion_small(args):
    arch_defaults(args, **SMALL)
    insertion_base(args)


@register_model_architecture("insertion", "insertion_tiny")
def insertion_tiny(args):
    arch_defaults(args, **TINY)
    insertion_base(args)
