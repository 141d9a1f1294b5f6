"""Insertion Transformer (Stern et al. 2019), arch ``insertion`` (+ ``insertion_small``, ``_tiny``).

A non-causal decoder reads the canvas ``<s> ... </s>``; slot k (between tokens k and k+1) is
represented by a linear map of the concatenated neighbour states, and the output layer gives, per
slot, a distribution over the vocabulary in which one symbol means "nothing more to insert here" (the
end-of-slot label, ``--insertion-end-symbol``: ``<pad>`` for new models, as fairseq's
``insertion_transformer``; ``</s>`` for checkpoints saved before the option).  ``--insertion-softmax`` chooses how the (slot, token) logits are
normalised: ``slot`` (default; one softmax over the vocabulary per slot, p(c | l)) or ``joint``
(Stern et al.'s p(c, l): one softmax over every (slot, token) pair of a sentence, the slots of its
padding excluded).

Training: the canvas is a random subsequence of the target (``--deletion-noise``); the loss
of every slot is the oracle's (``fairseq_nat_ext.oracles.insertion``) weighted cross-entropy over its
missing span -- ``--insertion-loss binary_tree`` (temperature ``--insertion-tau``) or ``uniform`` --
or the end-of-slot label when the span is empty.  ``slot``: slot losses are averaged over all slots of
the batch; ``joint``: the paper's loss, the mean over a sentence's k+1 slots, averaged over the
sentences.  The criterion's ``--label-smoothing`` eps mixes in the cross-entropy against the uniform
distribution over the same support: every token of each slot (``slot``), every (slot, token) pair of
the sentence (``joint``).  Decoding (``generators/insertion.py``) inserts the argmax token in every
slot whose argmax is not end-of-slot, in parallel, until no slot inserts (the per-slot argmax of the
joint log-probabilities is that of the logits, so both normalisations choose the same tokens from the
same logits; the scores differ).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.models import register_model, register_model_architecture
from fairseq.models.nat import FairseqNATDecoder
from fairseq.models.transformer import base_architecture as transformer_base_architecture

from ...modules import cpu_linear, packed
from ...modules.vocab_projection import vocab_logits
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

    def shared_kv(self, encoder_out):
        """The cross-attentions' encoder keys / values, for the decoding rounds over the same sources
        (``kv`` of :meth:`forward_slots`); None where modules/packed.py does not apply."""
        return packed.shared_cross_kv(self, encoder_out)

    def states(self, tokens, encoder_out, kv=None):
        """(B, T, C) decoder states.  In eval mode without autograd through modules/packed.py (the same
        maths on the real positions only, encoder keys / values ``kv`` when given; zeros at padding);
        training keeps fairseq's forward (and its dropout draws)."""
        if not self.training and not torch.is_grad_enabled() and packed.supports_decoder(self):
            return packed.nat_decoder_features(self, tokens, encoder_out, kv=kv)
        h, _ = self.extract_features(tokens, encoder_out=encoder_out, full_context_alignment=True)
        return h

    def forward_slots(self, tokens, encoder_out, normalize=False, joint=False, kv=None):
        """tokens (B, T) -> (B, T-1, V) per-slot token logits (the end-of-slot label: :func:`end_of_slot`).  normalize:
        log-probabilities, per slot (``joint=False``: log p(c | l)) or over every (slot, token) pair
        of a row (``joint=True``: log p(c, l), float32; the slots past the row's last token get -inf).
        ``kv``: :meth:`shared_kv` of these rows' sources (decoding)."""
        h = self.states(tokens, encoder_out, kv)
        slots = cpu_linear.module(self.slot_proj, torch.cat([h[:, :-1], h[:, 1:]], -1))
        out = vocab_logits(self, slots)
        if not normalize:
            return out
        if joint:
            return joint_log_softmax(out, slot_mask(tokens, self.padding_idx))
        return F.log_softmax(out, -1)

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
        parser.add_argument("--insertion-end-symbol", choices=["pad", "eos"],
                            help="the end-of-slot label: pad (default, as fairseq's insertion_transformer: "
                                 "an output-only row of the shared embedding matrix) or eos (</s>, also "
                                 "every source's and canvas' last input token; checkpoints from before "
                                 "the option)")
        parser.add_argument("--insertion-span-targets", choices=["sum", "fairseq"],
                            help="a token repeated within a missing span: its weights add up (sum, the "
                                 "default: Stern et al.'s loss) or only its last occurrence's counts "
                                 "(fairseq: insertion_transformer's scatter_ overwrites, so the span's "
                                 "target sums to less than 1)")
        parser.add_argument("--insertion-alignment", choices=["rightmost", "leftmost"],
                            help="a canvas token that occurs more than once in the target is aligned to "
                                 "its rightmost possible occurrence (default) or its leftmost one "
                                 "(fairseq: libnat's edit path prefers insertions); both are exact oracles "
                                 "and differ only in which slot a missing repeated token is assigned to")
        parser.add_argument("--insertion-softmax", choices=["slot", "joint"],
                            help="slot: one softmax over the vocabulary per slot, p(c | l) (default); "
                                 "joint: Stern et al.'s p(c, l), one softmax over every (slot, token) "
                                 "pair of a sentence, and the paper's loss (mean over the sentence's "
                                 "slots, then over sentences)")

    #: values that checkpoints saved before an option existed were trained with (compat.build_model
    #: applies them when such a checkpoint is loaded, before the arch's defaults for new models)
    checkpoint_defaults = {"insertion_end_symbol": "eos"}

    def span_tau(self):
        return span_tau(self.args)

    @property
    def end_of_slot(self):
        """The end-of-slot label's index (``--insertion-end-symbol``)."""
        return end_of_slot(self.args, self.decoder.dictionary)

    @property
    def joint_softmax(self):
        return insertion_softmax(self.args) == "joint"

    def forward(self, src_tokens, src_lengths, prev_output_tokens, tgt_tokens, **kwargs):
        pad = self.pad
        tgt = with_bos(tgt_tokens, self.bos)
        canvas = prev_output_tokens
        enc = self.encoder(src_tokens, src_lengths=src_lengths)
        # which target tokens are on the canvas: the oracle's alignment (a subsequence keeps all)
        if getattr(self.args, "insertion_alignment", None) == "leftmost":
            keep = leftmost_keep(canvas, tgt, pad, self.mask_idx)
        else:
            keep = levenshtein_oracle(canvas, tgt, pad, self.mask_idx).keep_tgt
        o = insertion_oracle(tgt, keep, pad, tau=self.span_tau())
        joint = self.joint_softmax
        lp = self.decoder.forward_slots(canvas, enc, normalize=True, joint=joint).float()  # (B, S, V)
        S = lp.size(1)
        valid = slot_mask(canvas, pad)  # (B, S) the slots of each canvas
        lp = lp.masked_fill(~valid.unsqueeze(-1), 0.0)  # padding slots (-inf under joint): never read
        # slot s of the oracle is "before kept token s": canvas slot k (after token k) = oracle slot k+1
        slot = (o.slot - 1).clamp(0, S - 1)
        per_pos = lp[torch.arange(tgt.size(0), device=tgt.device).unsqueeze(1), slot, tgt]  # (B, m)
        weight = o.weight
        if getattr(self.args, "insertion_span_targets", None) == "fairseq":
            weight = weight.masked_fill(overwritten(slot, tgt, o.missing), 0.0)
        span_loss = -(weight * per_pos).masked_fill(~o.missing, 0.0)  # (B, m)
        slot_loss = torch.zeros(lp.shape[:2], device=lp.device).scatter_add(1, slot, span_loss)
        done = o.slot_done[:, 1:S + 1] & valid
        slot_loss = slot_loss + torch.where(done, -lp[..., self.end_of_slot], torch.zeros_like(slot_loss))
        slot_loss = slot_loss.masked_fill(~valid, 0.0)
        # label smoothing's term: cross-entropy against the uniform distribution over the support
        smooth = (-lp.mean(-1)).masked_fill(~valid, 0.0)  # (B, S)
        if joint:  # the paper: mean over the sentence's slots (support: all its (slot, token) pairs)
            n_b = valid.sum(1).clamp_min(1)
            loss = (slot_loss.sum(1) / n_b).mean()
            smooth = (smooth.sum(1) / n_b).mean()
        else:  # mean over every slot of the batch
            n = valid.sum().clamp_min(1)
            loss = slot_loss.sum() / n
            smooth = smooth.sum() / n
        return {"insertion": {"loss": loss, "nll_loss": loss.detach(), "smooth": smooth, "factor": 1.0}}


def flip_padded(x, pad):
    """x (B, T) right-padded with ``pad`` -> each row's real tokens in reverse order, padding kept."""
    T = x.size(1)
    n = x.ne(pad).sum(1, keepdim=True)
    i = torch.arange(T, device=x.device).unsqueeze(0)
    return x.gather(1, torch.where(i < n, n - 1 - i, i))


def leftmost_keep(canvas, tgt, pad, mask):
    """bool (B, m): the target positions of the canvas tokens, each aligned to its leftmost possible
    occurrence (for a canvas that is a subsequence of the target, as in training, this is the greedy
    left-to-right embedding and libnat's ``suggested_ed2_path``, whose backtrace prefers insertions).
    :func:`levenshtein_oracle` aligns to the rightmost one; reversing both sequences turns one into the
    other."""
    keep = levenshtein_oracle(flip_padded(canvas, pad), flip_padded(tgt, pad), pad, mask).keep_tgt
    return flip_padded(torch.where(tgt.ne(pad), keep.long(), -1), -1).eq(1)


def overwritten(slot, tgt, missing):
    """bool (B, m): missing target positions whose token occurs again later in the same slot's missing
    span -- the weights fairseq's ``_get_ins_targets`` loses (``scatter_`` writes every occurrence into
    one (slot, token) cell, the last one staying)."""
    m = slot.size(1)
    same = (slot.unsqueeze(2) == slot.unsqueeze(1)) & (tgt.unsqueeze(2) == tgt.unsqueeze(1))
    later = torch.ones(m, m, dtype=torch.bool, device=slot.device).triu(1)
    return (same & later & missing.unsqueeze(1)).any(-1) & missing


def slot_mask(tokens, pad):
    """tokens (B, T) right-padded -> bool (B, T-1): slot k (between tokens k and k+1) exists."""
    T = tokens.size(1)
    return torch.arange(T - 1, device=tokens.device).unsqueeze(0) < (tokens.ne(pad).sum(1) - 1).unsqueeze(1)


def joint_log_softmax(logits, valid):
    """logits (B, S, V), valid bool (B, S) -> float32 log p(c, l): one log-softmax over the S' x V
    (slot, token) pairs of each row's valid slots; invalid slots get -inf."""
    B, S, V = logits.shape
    x = logits.float().masked_fill(~valid.unsqueeze(-1), float("-inf"))
    return F.log_softmax(x.reshape(B, S * V), -1).view(B, S, V)


def insertion_softmax(args):
    """``slot`` or ``joint`` (checkpoints from before the option: ``slot``)."""
    return getattr(args, "insertion_softmax", None) or "slot"


def end_of_slot(args, dictionary):
    """The end-of-slot label of ``--insertion-end-symbol``: ``pad`` or ``eos`` (``</s>``)."""
    sym = getattr(args, "insertion_end_symbol", None) or "pad"
    if sym not in ("pad", "eos"):
        raise ValueError(f"--insertion-end-symbol must be pad or eos, got {sym!r}")
    return dictionary.pad() if sym == "pad" else dictionary.eos()


def span_tau(args):
    """The oracle's tau: None (uniform) for --insertion-loss uniform or --insertion-tau 0."""
    tau = getattr(args, "insertion_tau", 1.0)
    if getattr(args, "insertion_loss", "binary_tree") == "uniform" or not tau or tau <= 0:
        return None
    return tau


@register_model_architecture("insertion", "insertion")
def insertion_base(args):
    arch_defaults(args, insertion_loss="binary_tree", insertion_tau=1.0, insertion_softmax="slot",
                  insertion_end_symbol="pad", deletion_noise="paper", insertion_span_targets="sum",
                  insertion_alignment="rightmost",
                  share_all_embeddings=True, dropout=0.3, apply_bert_init=True)
    transformer_base_architecture(args)


@register_model_architecture("insertion", "insertion_small")
def insertion_small(args):
    arch_defaults(args, **SMALL)
    insertion_base(args)


@register_model_architecture("insertion", "insertion_tiny")
def insertion_tiny(args):
    arch_defaults(args, **TINY)
    insertion_base(args)
