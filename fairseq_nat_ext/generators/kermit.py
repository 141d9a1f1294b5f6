"""KERMIT decoding (parallel insertion over the canvas ``<s> x </s> y </s>``), batched on tensors.

``--kermit-generate`` (task option) chooses what is generated; the target language is always the
side that is printed:

* ``translate``: the source sentence is given whole on its side (x when ``--source-lang`` is the
  model's x language, else y) and the other side is generated: both directions from one checkpoint.
* ``joint``: both sides are generated from empty canvases (the source line is ignored).
* ``marginal``: only the target side, the other one absent (unconditional generation).
* ``cloze``: the source line is a partial sentence of the target language in which ``<gap>`` marks
  every gap; tokens are inserted only into the gaps (a gap grows in place: the slots around each
  inserted token stay open), the other slots are closed, so a given token is never changed, moved
  apart or removed.

Every round, each open slot takes its argmax token unless that is ``</s>`` (end of slot;
``--iter-decode-eos-penalty`` is subtracted from its log-probability), all slots at once (with
``--kermit-temperature T`` > 0 each slot draws its token from the softmax of its log-probabilities / T
instead: sampling, for unconditional generation, whose argmax is one and the same output); a row
stops when no slot inserts or after ``--iter-decode-max-iter`` rounds.  Neither side grows beyond the
model's ``max_positions()`` (half of the ``--max-source-positions`` canvas, its ``</s>`` included: the
longest side the model was trained on), so neither does the canvas; the insertions that would pass it
are dropped from the right.  ``steps`` counts the decoder passes of each row.
"""

import torch

from ..compat import InputError
from ..models.nat.edit_ops import fill_placeholders, insert_placeholders, pad_to, spread_scores, trim
from ..models.nat.kermit import absent_like, first_eos, pair_canvas, parse_lang_pairs
from ..modules import cpu_linear
from .base import eval_mode

GAP_SYMBOL = "<gap>"
GENERATE_MODES = ("translate", "joint", "marginal", "cloze")


def right_pad(tokens, pad):
    """Move padding to the right (fairseq-interactive's batches are left-padded)."""
    order = torch.sort(tokens.eq(pad).to(torch.uint8), dim=1, stable=True).indices
    return trim(tokens.gather(1, order), pad)


class KermitGenerator:
    def __init__(self, models, tgt_dict, source_lang, target_lang, mode="translate", max_iter=10,
                 eos_penalty=0.0, retain_history=False, x_lang=None, temperature=0.0):
        if len(models) != 1:
            raise InputError("kermit decoding does not support ensembles: pass one checkpoint to --path")
        if mode not in GENERATE_MODES:
            raise InputError(f"--kermit-generate: unknown mode '{mode}' (choose from {', '.join(GENERATE_MODES)})")
        self.models = models
        self.tgt_dict = tgt_dict
        model = models[0]
        self.lang_ids = None
        if getattr(model, "langs", None):
            # multilingual: x is the first language of the direction's pair, as the model was trained
            x_lang = self._trained_x_lang(model, source_lang, target_lang, x_lang)
            self.target_is_x = target_lang == x_lang
            self.lang_ids = model.lang_ids(x_lang, source_lang if self.target_is_x else target_lang)
        else:  # bilingual: x is the model's training source language (the task's pairs do not apply)
            x_lang = getattr(model.args, "kermit_x_lang", None)
            self.target_is_x = target_lang is not None and target_lang == x_lang
        if mode == "translate" and source_lang == target_lang:
            raise InputError("kermit: --source-lang and --target-lang must differ for translation")
        self.mode = mode
        self.max_iter = max(1, int(max_iter))
        self.penalty = float(eos_penalty)
        self.retain_history = retain_history
        self.temperature = float(temperature)
        if self.temperature < 0:
            raise InputError(f"--kermit-temperature must be >= 0, got {temperature}")
        self.pad, self.bos, self.eos, self.unk = tgt_dict.pad(), tgt_dict.bos(), tgt_dict.eos(), tgt_dict.unk()
        self.mask = model.mask_idx
        self.gap = tgt_dict.index(GAP_SYMBOL)
        self.symbols_to_strip_from_output = {self.bos, self.eos}
        self.max_len = model.max_canvas()
        self.side_max = model.max_positions()  # (x, y), </s> included
        self.banned = sorted({self.pad, self.bos, self.mask, self.unk, self.gap})

    @staticmethod
    def _trained_x_lang(model, source_lang, target_lang, task_x_lang):
        """The x language of a multilingual model for source->target: from the pairs stored in the model
        (the training --lang-pairs), else from the decoding task's --lang-pairs (checkpoints trained
        before the model stored them); one-line errors when neither is known or they disagree."""
        pairs = parse_lang_pairs(getattr(model.args, "kermit_lang_pairs", None))
        pair = next((p for p in pairs if set(p) == {source_lang, target_lang}), None)
        if pairs and pair is None:
            raise InputError(f"kermit: -s {source_lang} -t {target_lang} is not a direction of the model's "
                             f"--lang-pairs {model.args.kermit_lang_pairs}")
        if pair is not None:
            if task_x_lang is not None and task_x_lang != pair[0]:
                raise InputError(f"kermit: --lang-pairs orders {source_lang}/{target_lang} differently from "
                                 f"training ({model.args.kermit_lang_pairs}): decode with the training string")
            return pair[0]
        if task_x_lang is None:
            raise InputError("kermit: a multilingual checkpoint decodes with --lang-pairs (the training "
                             "string) and -s/-t")
        return task_x_lang

    @classmethod
    def from_generation_args(cls, models, tgt_dict, args, source_lang, target_lang, mode="translate", x_lang=None,
                             temperature=0.0):
        return cls(models, tgt_dict, source_lang, target_lang, mode=mode,
                   max_iter=getattr(args, "iter_decode_max_iter", 10),
                   eos_penalty=getattr(args, "iter_decode_eos_penalty", 0.0),
                   retain_history=getattr(args, "retain_iter_history", False), x_lang=x_lang,
                   temperature=temperature)

    # ----- canvases ----------------------------------------------------------------------------
    def initial(self, src):
        """src (B, S) right-padded ``content </s>`` -> (canvas, open) where open[b, k] says whether
        the slot after canvas token k may receive insertions."""
        pad, eos = self.pad, self.eos
        B = src.size(0)
        empty = absent_like(src[:, :1], pad, eos)
        gap_after = None
        if self.mode == "translate":
            given, gen = src, empty
        elif self.mode in ("joint", "marginal"):
            given, gen = empty, empty
        else:  # cloze: the partial sentence is the generated side, gaps removed, open only there
            is_gap = src.eq(self.gap)
            # a gap opens the slot after the token before it
            gap_after = torch.zeros_like(is_gap)
            gap_after[:, :-1] = is_gap[:, 1:]
            keep = ~is_gap & src.ne(pad)
            order = torch.sort((~keep).to(torch.uint8), dim=1, stable=True).indices
            gen = trim(src.gather(1, order).masked_fill(~keep.gather(1, order), pad), pad)
            lead_gap = is_gap[:, 0]  # gap before the first token: slot after <s>
            gap_after = gap_after.gather(1, order) & keep.gather(1, order)
            gap_after = gap_after[:, :gen.size(1)]
            given = empty
        x, y = (gen, given) if self.target_is_x else (given, gen)
        canvas, _, sep = pair_canvas(x, y, pad, self.bos)
        T = canvas.size(1)
        pos = torch.arange(T, device=src.device).unsqueeze(0)
        length = canvas.ne(pad).sum(1, keepdim=True)
        x_slot = pos < sep.unsqueeze(1)  # slot after token k inserts into x when k < sep
        y_slot = ~x_slot & (pos < length - 1)
        open_ = torch.zeros_like(canvas, dtype=torch.bool)
        if self.mode == "joint":
            open_ = x_slot | y_slot
        elif self.mode in ("translate", "marginal"):
            open_ = x_slot if self.target_is_x else y_slot
        else:
            # canvas offset of the partial sentence: after <s> (x side) or after the separator (y)
            offset = torch.ones_like(sep) if self.target_is_x else sep + 1
            cols = offset.unsqueeze(1) + torch.arange(gap_after.size(1), device=src.device).unsqueeze(0)
            rows = torch.arange(B, device=src.device).unsqueeze(1).expand_as(cols)
            ok = gap_after & (cols < T)
            open_[rows[ok], cols[ok]] = True
            open_[torch.arange(B, device=src.device), offset - 1] |= lead_gap
        return canvas, open_

    # ----- decoding ----------------------------------------------------------------------------
    @torch.no_grad()
    @cpu_linear.decodes
    def generate(self, models, sample, prefix_tokens=None, constraints=None, **unused):
        if constraints is not None or prefix_tokens is not None:
            raise NotImplementedError("kermit decoding: prefixes and constraints are not supported")
        model = (models or self.models)[0]
        eval_mode([model])
        src = right_pad(sample["net_input"]["src_tokens"], self.pad)
        B, dev = src.size(0), src.device
        tokens, open_ = self.initial(src)
        scores = torch.zeros(tokens.shape, device=dev)
        steps = torch.zeros(B, dtype=torch.long, device=dev)
        history = [[] for _ in range(B)] if self.retain_history else None
        active = torch.ones(B, dtype=torch.bool, device=dev)
        for _ in range(self.max_iter):
            idx = active.nonzero().flatten()
            if idx.numel() == 0:
                break
            sub = trim(tokens[idx], self.pad)  # the active rows may all be shorter than the batch
            w0 = sub.size(1)
            t, o, s = self._round(model, sub, open_[idx, :w0], scores[idx, :w0])
            steps[idx] += 1
            grew = t.ne(self.pad).sum(1) > tokens[idx].ne(self.pad).sum(1)
            w = max(t.size(1), tokens.size(1))
            tokens, open_, scores = (pad_to(tokens, w, self.pad), pad_to(open_, w, False), pad_to(scores, w, 0.0))
            tokens[idx] = pad_to(t, w, self.pad)
            open_[idx] = pad_to(o, w, False)
            scores[idx] = pad_to(s, w, 0.0)
            active[idx] = grew
            if history is not None:
                for j, i in enumerate(idx.tolist()):
                    history[i].append(self._target_side(t[j])[0])
        out = []
        for i in range(B):
            toks, sc = self._target_side(tokens[i], scores[i])
            content = sc[:-1]
            hyp = {"tokens": toks, "score": content.mean() if content.numel() else sc.new_zeros(()),
                   "positional_scores": sc, "alignment": None, "steps": int(steps[i])}
            if self.mode == "joint":
                hyp["other_side"] = self._target_side(tokens[i], other=True)[0]
            if history is not None:
                hyp["history"] = history[i]
            out.append([hyp])
        return out

    def _round(self, model, tokens, open_, scores):
        which = open_[:, :-1]  # only open slots can insert: the others skip the vocabulary projection
        lp = model.slot_log_probs(tokens, which, langs=self.lang_ids)  # (M, V)
        lp[:, self.banned] = float("-inf")
        lp[:, self.eos] -= self.penalty
        if self.temperature > 0:
            top = torch.multinomial(torch.softmax(lp / self.temperature, -1), 1).squeeze(1)
            top_lp = lp.gather(1, top.unsqueeze(1)).squeeze(1)
        else:
            top_lp, top = lp.max(-1)
        best = torch.full(which.shape, self.eos, dtype=top.dtype, device=top.device).masked_scatter(which, top)
        best_lp = torch.zeros(which.shape, dtype=top_lp.dtype, device=top.device).masked_scatter(which, top_lp)
        ins = self._within_sides(tokens, best != self.eos)  # closed slots hold eos already
        if not ins.any():
            return tokens, open_, scores
        grown = insert_placeholders(tokens, ins.long(), self.pad, self.mask, max_len=self.max_len)
        placed = grown.eq(self.mask)
        new_open = spread_scores(open_, tokens, grown, self.mask, self.pad)
        new_open[placed] = True  # the slot after an inserted token stays open
        new_scores = spread_scores(scores, tokens, grown, self.mask, self.pad)
        take = ins & (torch.cumsum(ins.long(), 1) <= placed.sum(1, keepdim=True))  # cut by max_len
        grown = fill_placeholders(grown, best[take], self.mask)
        new_scores[placed] = best_lp[take].to(scores.dtype)
        return grown, new_open, new_scores

    def _within_sides(self, tokens, ins):
        """ins bool (N, T-1): the slots that insert -> only those (left to right) that keep each side
        within ``side_max``.  The x side (``x </s>``) holds ``sep`` tokens, the y side the rest but
        ``<s>``; slot k inserts into x when k < sep."""
        n = tokens.ne(self.pad).sum(1, keepdim=True)
        sep = first_eos(tokens, self.eos).unsqueeze(1)
        in_y = torch.arange(ins.size(1), device=ins.device).unsqueeze(0) >= sep
        keep = torch.zeros_like(ins)
        for side, room in ((~in_y, self.side_max[0] - sep), (in_y, self.side_max[1] - (n - 1 - sep))):
            side_ins = ins & side
            keep |= side_ins & (side_ins.long().cumsum(1) <= room)
        return keep

    def _target_side(self, row, scores=None, other=False):
        """Tokens (+ ``</s>``) of the printed side of one canvas row (and their scores)."""
        real = row.ne(self.pad)
        n = int(real.sum())
        sep = int(first_eos(row[:n].unsqueeze(0), self.eos))
        x_side = not other if self.target_is_x else other
        lo, hi = (1, sep) if x_side else (sep + 1, n - 1)
        toks = torch.cat([row[lo:hi], row.new_tensor([self.eos])])
        if scores is None:
            return toks, None
        return toks, torch.cat([scores[lo:hi], scores.new_zeros(1)])
