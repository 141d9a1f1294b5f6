"""Levenshtein Transformer (Gu et al. 2019), arch ``levenshtein`` (+ ``levenshtein_small``, ``_tiny``).

One non-causal decoder, three classifiers on its states:
* deletion (``word_del``): keep / delete each token;
* placeholders (``mask_ins``): how many tokens to insert between two neighbours (0..--max-placeholders),
  from the concatenated states of the pair;
* tokens (``word_ins``): the token of every placeholder.

Training imitates the expert of ``fairseq_nat_ext.oracles.levenshtein`` (our batched edit-distance
oracle; no libnat).  y0 = the target with random deletions (fairseq's noise); then, per sentence:
* insertion policy: its input is the expert-deleted y0, or with probability --levt-beta the model's
  own deletion of y0 (roll-in); placeholder counts and tokens come from the oracle (input -> target);
* deletion policy (``--levt-rollin paper``, default): its input is y0 with probability --levt-alpha,
  else the model's own insertion output on y0 (placeholders then tokens, greedy; each row cut at
  ``ROLLIN_MAX_RATIO`` times its target's length); labels from the oracle.  ``--levt-rollin fairseq``
  is fairseq's shortcut: the deletion policy reads the target with its placeholders filled by the
  model's token predictions.
Roll-in passes run on the rolled-in rows only (with their encoder states), not on the whole batch,
without gradient; where the insertion policy's own (training) pass already read y0, its placeholder
predictions are the deletion roll-in's first step (no second pass over the same rows).  Sequences
carry ``<s>`` ... ``</s>``; the dataset target has no ``<s>``, the model adds it.

Every decoder pass runs on the real positions of its rows only (``modules/packed.py``; y0 keeps a uniform
share of the target, so about half of the placeholder and deletion inputs' positions are padding), and the
passes of one step share each cross-attention's encoder keys / values (projected once).  Tested equal to
fairseq's padded decoder forward.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.models import register_model, register_model_architecture
from fairseq.models.nat import FairseqNATDecoder
from fairseq.models.transformer import base_architecture as transformer_base_architecture

from ...compat import InputError
from ...modules import packed
from ...oracles.levenshtein import levenshtein_oracle
from ...tasks.nat_translation import MASK_SYMBOL
from .base import SMALL, TINY, EditNATModel, arch_defaults
from .edit_ops import (delete_tokens, fill_placeholders, insert_placeholders, pad_to, rows_equal, trim,
                       with_bos)

#: paper roll-in: the model's own insertion output is cut at this multiple of the target's length
ROLLIN_MAX_RATIO = 2


class LevenshteinDecoder(FairseqNATDecoder):
    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=False)
        self.mask_idx = dictionary.index(MASK_SYMBOL)
        if self.mask_idx == dictionary.unk():
            raise InputError(f"levenshtein: the target dictionary has no {MASK_SYMBOL}; use --task nat_translation")
        d = args.decoder_embed_dim
        self.max_placeholders = args.max_placeholders
        self.mask_ins_proj = nn.Linear(2 * d, args.max_placeholders + 1)
        self.word_del_proj = nn.Linear(d, 2)

    def shared_kv(self, encoder_out):
        """The cross-attentions' encoder keys / values for several passes over the same sources (None where
        the packed path does not apply)."""
        return packed.shared_cross_kv(self, encoder_out)

    def states(self, tokens, encoder_out, kv=None):
        """(B, T, C) states; at padding zeros (packed path) or fairseq's unused values."""
        if packed.supports_decoder(self):
            return packed.nat_decoder_features(self, tokens, encoder_out, kv=kv)
        feats, _ = self.extract_features(tokens, encoder_out=encoder_out, full_context_alignment=True)
        return feats

    def forward_word_del(self, tokens, encoder_out, normalize=False, kv=None):
        out = self.word_del_proj(self.states(tokens, encoder_out, kv))
        return F.log_softmax(out, -1) if normalize else out

    def forward_mask_ins(self, tokens, encoder_out, normalize=False, kv=None):
        h = self.states(tokens, encoder_out, kv)
        out = self.mask_ins_proj(torch.cat([h[:, :-1], h[:, 1:]], -1))  # (B, T-1, M+1)
        return F.log_softmax(out, -1) if normalize else out

    def forward_word_ins(self, tokens, encoder_out, normalize=False, select=None, kv=None):
        h = self.states(tokens, encoder_out, kv)
        if select is not None:
            h = h[select]
        out = self.output_layer(h)
        return F.log_softmax(out, -1) if normalize else out

    def forward(self, tokens, encoder_out, **unused):
        return self.forward_word_ins(tokens, encoder_out)


@register_model("levenshtein")
class LevenshteinModel(EditNATModel):
    decoder_class = LevenshteinDecoder

    @property
    def generator_class(self):
        from ...generators.levenshtein import EditGenerator

        return EditGenerator

    @staticmethod
    def add_args(parser):
        EditNATModel.add_args(parser)
        parser.add_argument("--max-placeholders", type=int, help="largest number of placeholders per slot")
        parser.add_argument("--levt-rollin", choices=["paper", "fairseq"],
                            help="deletion roll-in: the paper's mixture, or fairseq's filled-target shortcut")
        parser.add_argument("--levt-alpha", type=float,
                            help="paper roll-in: probability that the deletion policy reads y0")
        parser.add_argument("--levt-beta", type=float,
                            help="probability that the insertion policy reads the model's own deletion of y0")

    # ------------------------------------------------------------------------------------------
    def _coin(self, p, n, device):
        return torch.rand(n, device=device) < p

    @torch.no_grad()
    def _replace_rows(self, base, take, policy, encoder_out, kv, **kwargs):
        """``base`` with the rows where ``take`` holds replaced by ``policy(those rows, their encoder
        states, their shared keys / values, **kwargs)``: the roll-in passes (no gradient) run on the chosen
        rows only, not on the whole batch."""
        idx = take.nonzero(as_tuple=True)[0]
        if idx.numel() == 0:
            return base
        pad = self.pad
        new = policy(trim(base[idx], pad), self.encoder.reorder_encoder_out(encoder_out, idx),
                     packed.select_kv(kv, idx), **kwargs)
        w = max(base.size(1), new.size(1))
        out = pad_to(base, w, pad)
        out[idx] = pad_to(new, w, pad)
        return trim(out, pad)

    @torch.no_grad()
    def _model_delete(self, tokens, encoder_out, kv=None):
        dele = self.decoder.forward_word_del(tokens, encoder_out, kv=kv).argmax(-1).bool()
        return delete_tokens(tokens, dele, self.pad, self.bos, self.eos)

    @torch.no_grad()
    def _model_insert(self, tokens, encoder_out, kv=None, max_len=None, counts=None):
        """The model's greedy insertion (placeholders, then tokens); rows grow to at most ``max_len``
        (an int or a (B,) tensor; default the decoder's max positions).  ``counts`` (B, >= T-1): the
        placeholder counts when a pass over these very rows already predicted them."""
        if counts is None:
            counts = self.decoder.forward_mask_ins(tokens, encoder_out, kv=kv).argmax(-1)
        else:
            counts = counts[:, : tokens.size(1) - 1]
        limit = self.decoder.max_positions()
        max_len = limit if max_len is None else torch.as_tensor(max_len, device=tokens.device).clamp(max=limit)
        out = insert_placeholders(tokens, counts, self.pad, self.mask_idx, max_len=max_len)
        holes = out.eq(self.mask_idx)
        if holes.any():
            pred = self.decoder.forward_word_ins(out, encoder_out, select=holes, kv=kv).argmax(-1)
            out = fill_placeholders(out, pred, self.mask_idx)
        return out

    def forward(self, src_tokens, src_lengths, prev_output_tokens, tgt_tokens, **kwargs):
        a = self.args
        pad, mask = self.pad, self.mask_idx
        tgt = with_bos(tgt_tokens, self.bos)
        y0 = prev_output_tokens
        if y0.size(1) < 2 or not bool((y0[:, 0] == self.bos).all()):
            raise ValueError("levenshtein: the decoder input must start with <s>; build it with model.inject_noise "
                             "(task nat_translation does)")
        enc = self.encoder(src_tokens, src_lengths=src_lengths)
        kv = self.decoder.shared_kv(enc)  # every pass below reads the same sources
        B, dev = tgt.size(0), tgt.device

        # ---- insertion policy: expert-deleted y0, or the model's own deletion (prob beta) ----------
        ins_in = y0
        if a.levt_beta > 0:
            ins_in = self._replace_rows(y0, self._coin(a.levt_beta, B, dev), self._model_delete, enc, kv)
        # the expert deletes what is not in the target: the insertion input is a subsequence of it
        # (y0 and the model's deletions of it already are, unless another noise made y0)
        o = levenshtein_oracle(ins_in, tgt, pad, mask)
        if bool(o.del_labels.any()):
            ins_in = delete_tokens(ins_in, o.del_labels.bool(), pad, self.bos, self.eos)
            o = levenshtein_oracle(ins_in, tgt, pad, mask)
        T_in = ins_in.size(1)
        slots = torch.arange(T_in - 1, device=dev).unsqueeze(0) < (ins_in.ne(pad).sum(1) - 1).unsqueeze(1)
        mask_ins_tgt = o.ins_counts[:, 1:T_in].clamp(max=self.decoder.max_placeholders)
        mask_ins_out = self.decoder.forward_mask_ins(ins_in, enc, kv=kv)
        holes = o.masked_tgt.eq(mask)
        word_ins_out = self.decoder.forward_word_ins(o.masked_tgt, enc, select=holes, kv=kv)

        # ---- deletion policy -------------------------------------------------------------------
        if a.levt_rollin == "fairseq":
            filled = fill_placeholders(o.masked_tgt, word_ins_out.detach().argmax(-1), mask)
            del_in = filled
        else:
            del_in = y0
            if a.levt_alpha < 1:
                mine = ~self._coin(a.levt_alpha, B, dev)
                # roll-in rows grow to at most ROLLIN_MAX_RATIO x their target's length: an
                # untrained placeholder classifier asks for up to --max-placeholders per slot,
                # and rows of max-positions tokens exhaust memory (and fill nothing worth deleting)
                cap = ROLLIN_MAX_RATIO * tgt.ne(pad).sum(1)
                # where the insertion policy read y0 itself (rows not rolled in by beta), its
                # placeholder pass is the model's own on y0 (training mode, like a roll-in pass):
                # reuse its argmax instead of a second pass; the other rows get their own pass
                reuse = mine & rows_equal(ins_in, y0, pad)
                counts = mask_ins_out.detach().argmax(-1)
                del_in = self._replace_rows(y0, reuse, self._model_insert, enc, kv, max_len=cap[reuse],
                                            counts=counts[reuse])
                fresh = mine & ~reuse
                del_in = self._replace_rows(del_in, fresh, self._model_insert, enc, kv, max_len=cap[fresh])
        od = levenshtein_oracle(del_in, tgt, pad, mask)
        del_mask = del_in.ne(pad) & del_in.ne(self.bos) & del_in.ne(self.eos)
        word_del_out = self.decoder.forward_word_del(del_in, enc, kv=kv)
        return {
            "mask_ins": {"out": mask_ins_out, "tgt": mask_ins_tgt, "mask": slots, "ls": 0.01, "factor": 1.0},
            "word_ins": {"out": word_ins_out, "tgt": tgt[holes], "mask": None, "factor": 1.0},
            "word_del": {"out": word_del_out, "tgt": od.del_labels, "mask": del_mask, "factor": 1.0},
        }


@register_model_architecture("levenshtein", "levenshtein")
def levenshtein_base(args):
    arch_defaults(args, max_placeholders=255, levt_rollin="paper", levt_alpha=0.5, levt_beta=0.2,
                  deletion_noise="fairseq", share_all_embeddings=True, dropout=0.3, apply_bert_init=True)
    transformer_base_architecture(args)


@register_model_architecture("levenshtein", "levenshtein_small")
def levenshtein_small(args):
    arch_defaults(args, **SMALL)
    levenshtein_base(args)


@register_model_architecture("levenshtein", "levenshtein_tiny")
def levenshtein_tiny(args):
    arch_defaults(args, max_placeholders=64, **TINY)
    levenshtein_base(args)
