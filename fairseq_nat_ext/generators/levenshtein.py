"""Levenshtein Transformer decoding (model ``levenshtein``), batched on tensors.  The insertion
model's generator (``generators/insertion.py``) subclasses it.

Start from ``<s> </s>`` and repeat, for at most ``--iter-decode-max-iter`` rounds:
1. delete: drop every token the deletion classifier marks (never ``<s>``/``</s>``);
2. insert placeholders: between every pair of neighbours, the argmax placeholder count after
   subtracting ``--iter-decode-eos-penalty`` from the log-probability of "0" (fairseq's placeholder
   penalty: > 0 makes outputs longer); rows never exceed the decoder's max positions;
3. fill: every placeholder gets its argmax token.
A row stops when a round changes nothing (adaptive; ``--iter-decode-force-max-iter`` runs every
round).  The encoder's keys / values of the cross-attentions are projected once per batch and read by
every pass of every round (the decoder's ``shared_kv``, modules/packed.py).  Hypotheses carry tokens
(without ``<s>``, ending in ``</s>``), score (mean token log-prob of the last prediction of every
token), positional_scores, alignment=None, steps (rounds run) and, with ``--retain-iter-history``, one
entry per operation: {"op": "delete"|"insert"|"fill", "tokens"}.
"""

import torch

from ..models.nat.edit_ops import (delete_tokens, fill_placeholders, insert_placeholders, rows_equal,
                                   spread_scores, trim)
from ..modules import cpu_linear, packed
from ..modules.vocab_projection import best_vocab_tokens
from .base import eval_mode


class EditGenerator:
    def __init__(self, models, tgt_dict, max_iter=10, placeholder_penalty=0.0, adaptive=True,
                 retain_history=False):
        if len(models) != 1:
            raise ValueError("levenshtein decoding does not support ensembles: pass one checkpoint to --path")
        self.models = models
        self.tgt_dict = tgt_dict
        self.max_iter = max(1, int(max_iter))
        self.penalty = float(placeholder_penalty)
        self.adaptive = adaptive
        self.retain_history = retain_history
        self.pad, self.bos, self.eos, self.unk = tgt_dict.pad(), tgt_dict.bos(), tgt_dict.eos(), tgt_dict.unk()
        self.mask = models[0].mask_idx
        self.symbols_to_strip_from_output = {self.bos, self.eos}
        self.max_len = models[0].decoder.max_positions()

    @classmethod
    def from_generation_args(cls, models, tgt_dict, args):
        return cls(models, tgt_dict, max_iter=getattr(args, "iter_decode_max_iter", 10),
                   placeholder_penalty=getattr(args, "iter_decode_eos_penalty", 0.0),
                   adaptive=not getattr(args, "iter_decode_force_max_iter", False),
                   retain_history=getattr(args, "retain_iter_history", False))

    def _round(self, model, tokens, scores, enc, history, kv=None):
        """One delete/insert/fill round on rows ``tokens`` (N, T) -> (tokens, scores); ``kv``: the
        decoder's ``shared_kv`` of these rows' sources (computed once per batch, not per pass)."""
        dec, pad = model.decoder, self.pad
        if tokens.size(1) > 2:
            dele = dec.forward_word_del(tokens, enc, kv=kv).argmax(-1).bool()
            content = tokens.ne(pad) & tokens.ne(self.bos) & tokens.ne(self.eos)
            dele &= content
            if dele.any():
                keep_scores = scores.masked_fill(dele, float("nan"))
                tokens = delete_tokens(tokens, dele, pad, self.bos, self.eos)
                scores = _close_up(keep_scores, tokens.size(1))
            self._log(history, "delete", tokens)
        lp = dec.forward_mask_ins(tokens, enc, normalize=True, kv=kv)
        lp[..., 0] -= self.penalty
        counts = lp.argmax(-1)
        if counts.any():
            grown = insert_placeholders(tokens, counts, pad, self.mask, max_len=self.max_len)
            scores = spread_scores(scores, tokens, grown, self.mask, pad)
            tokens = grown
            self._log(history, "insert", tokens)
            holes = tokens.eq(self.mask)
            if holes.any():
                # the best token of each placeholder without its (holes x V) log-probs
                h = dec.states(tokens, enc, kv)[holes]
                best_lp, best = best_vocab_tokens(dec, h, [self.pad, self.bos, self.eos, self.mask, self.unk])
                tokens = fill_placeholders(tokens, best, self.mask)
                scores = scores.clone()
                scores[holes] = best_lp.to(scores.dtype)
                self._log(history, "fill", tokens)
        return tokens, scores

    def _log(self, history, op, tokens, changed=None):
        if history is not None:
            for i, (row, toks) in enumerate(zip(history, tokens)):
                if changed is None or bool(changed[i]):
                    row.append({"op": op, "tokens": toks[toks.ne(self.pad)].clone()})

    @torch.no_grad()
    @cpu_linear.decodes
    def generate(self, models, sample, prefix_tokens=None, constraints=None, **unused):
        if constraints is not None or prefix_tokens is not None:
            raise NotImplementedError("levenshtein decoding: prefixes and constraints are not supported")
        model = (models or self.models)[0]
        eval_mode([model])
        net = sample["net_input"]
        src_tokens, src_lengths = net["src_tokens"], net["src_lengths"]
        B, dev = src_tokens.size(0), src_tokens.device
        enc = model.encoder(src_tokens, src_lengths=src_lengths)
        # every pass of every round reads the same encoder keys / values: projected once
        shared = getattr(model.decoder, "shared_kv", None)
        kv = shared(enc) if shared is not None else None
        tokens = src_tokens.new_tensor([self.bos, self.eos]).repeat(B, 1)
        scores = torch.zeros(B, 2, device=dev)
        steps = torch.zeros(B, dtype=torch.long, device=dev)
        history = [[] for _ in range(B)] if self.retain_history else None
        final_tok, final_sc = [None] * B, [None] * B
        active = torch.arange(B, device=dev)
        for _ in range(self.max_iter):
            if active.numel() == 0:
                break
            e = model.encoder.reorder_encoder_out(enc, active)
            hist = [history[i] for i in active.tolist()] if history is not None else None
            new_tok, new_sc = self._round(model, tokens, scores, e, hist, kv=packed.select_kv(kv, active))
            steps[active] += 1
            same = rows_equal(new_tok, tokens, self.pad)
            done = same if self.adaptive else torch.zeros_like(same)
            for j in done.nonzero().flatten().tolist():
                final_tok[int(active[j])], final_sc[int(active[j])] = new_tok[j], new_sc[j]
            keep = ~done
            tokens = trim(new_tok[keep], self.pad)
            scores, active = new_sc[keep][:, :tokens.size(1)], active[keep]
        for j, i in enumerate(active.tolist()):
            final_tok[i], final_sc[i] = tokens[j], scores[j]
        out = []
        for i in range(B):
            t, s = final_tok[i], final_sc[i]
            real = t.ne(self.pad)
            t, s = t[real][1:], s[real][1:]  # drop <s>; ends with </s>
            content = s[:-1]
            score = content.mean() if content.numel() else s.new_zeros(())
            hyp = {"tokens": t, "score": score, "positional_scores": s, "alignment": None,
                   "steps": int(steps[i])}
            if history is not None:
                hyp["history"] = [h["tokens"][1:] for h in history[i]]
                hyp["history_ops"] = [h["op"] for h in history[i]]
            out.append([hyp])
        return out


def _close_up(scores_with_nan, width):
    """Scores of the kept tokens (deleted ones are NaN) moved left, like delete_tokens."""
    gone = torch.isnan(scores_with_nan)
    order = torch.sort(gone.to(torch.uint8), dim=1, stable=True).indices
    return scores_with_nan.gather(1, order).nan_to_num(0.0)[:, :width]

