"""CTC decoding of ``ctc_nat``: one decoder pass, then greedy or prefix beam search, batched on tensors.

Options (fairseq-generate's own):
* ``--beam 1``: greedy -- the argmax symbol of every alignment position, then merge repeats and drop
  blanks.  Score: the best path's log-probability; each output token's positional score is the sum
  over the positions it owns (its own and repeated positions and the blanks before it; blanks after
  the last token go to ``</s>``).
* ``--beam K`` (K > 1; fairseq-generate's default is 5): CTC prefix beam search.  A prefix keeps
  two log-probabilities, of the alignments of the positions so far that spell it and end in a blank
  (p_b) or in its last token (p_nb).  At every position each prefix may stay (a blank, or its last
  token repeated) or grow by a token c (from p_b only when c equals its last token); a grown prefix
  equal to another prefix in the beam is merged into it; the K most probable prefixes survive.
  Every row of the batch moves one position per step (rows shorter than the longest keep their
  state).  Score: log P(y | x) summed over the alignments that the search kept, spread evenly over
  the output tokens and ``</s>`` in positional_scores; ``--nbest`` up to K hypotheses per sentence.
* Length: an output holds at most ``--max-target-positions`` - 2 tokens before ``</s>`` (the longest
  target the model trains on, as for Mask-Predict), whatever the alignment length (r x the source
  length): greedy keeps the first ones (the scores of the cut tail go to ``</s>``), the beam search
  grows no prefix beyond it.
* ``--path a.pt:b.pt``: the models' per-position probabilities are averaged (log-mean-exp); they must
  share ``--upsample-ratio``.
* ``--retain-iter-history``: one ``E-`` line with the greedy alignment (``<blank>`` included).
``pad``, ``<s>``, ``</s>`` and ``<mask>`` are never emitted.  Hypotheses: tokens (ending in ``</s>``),
score (per output token, ``</s>`` included), positional_scores, alignment=None, steps=1 (one pass).
"""
import math

import torch

from ..compat import InputError
from ..modules import cpu_linear
from ..modules.vocab_projection import best_vocab_tokens
from ..oracles.ctc_alignment import alignment_token_scores, ctc_collapse
from .base import NATGeneratorBase, eval_mode

NEG_INF = float("-inf")


def ctc_greedy(lprobs, lengths, blank, pad):
    """lprobs (N, T, V), lengths (N,) -> (tokens (N, M), out_lengths (N,), alignment (N, T),
    position log-probs (N, T))."""
    best_lp, alignment = lprobs.max(-1)
    return ctc_greedy_best(best_lp, alignment, lengths, blank, pad)


def ctc_greedy_best(best_lp, alignment, lengths, blank, pad):
    """:func:`ctc_greedy` from every position's best symbol (N, T) and its log-prob (N, T)."""
    inside = torch.arange(alignment.size(1), device=alignment.device).unsqueeze(0) < lengths.unsqueeze(1)
    alignment = alignment.masked_fill(~inside, pad)
    tokens, out_lengths, _ = ctc_collapse(alignment, lengths, blank, pad)
    return tokens, out_lengths, alignment, best_lp.masked_fill(~inside, 0.0)


def ctc_prefix_beam_search(lprobs, lengths, beam, blank, pad, max_len=None):
    """CTC prefix beam search (see the module doc), every row of the batch at once.

    lprobs (N, T, V) log-probs (symbols never to emit at -inf; ``blank`` must not be), lengths (N,),
    beam K, ``max_len`` (no prefix grows beyond it; None: no limit) -> (prefixes (N, K, T) padded with
    ``pad``, prefix lengths (N, K), log-probs (N, K)), best first.  Slots the search could not fill
    (fewer than K prefixes exist) have score -inf."""
    N, T, V = lprobs.shape
    K, dev, dt = int(beam), lprobs.device, lprobs.dtype
    prefix = torch.full((N, K, T), pad, dtype=torch.long, device=dev)
    plen = torch.zeros((N, K), dtype=torch.long, device=dev)
    last = torch.full((N, K), -1, dtype=torch.long, device=dev)  # -1: empty prefix
    lpb = torch.full((N, K), NEG_INF, dtype=dt, device=dev)
    lpb[:, 0] = 0.0
    lpnb = torch.full((N, K), NEG_INF, dtype=dt, device=dev)
    vocab = torch.arange(V, device=dev)
    pos = torch.arange(T, device=dev)
    neg = torch.tensor(NEG_INF, dtype=dt, device=dev)

    for t in range(T):
        live = t < lengths  # (N,)
        if not bool(live.any()):
            break
        lt = lprobs[:, t]  # (N, V)
        total = torch.logaddexp(lpb, lpnb)  # (N, K)
        valid = total > NEG_INF
        has_last = last >= 0
        # stay: a blank after anything, or the last token repeated after a non-blank
        stay_b = total + lt[:, blank].unsqueeze(1)
        stay_nb = torch.where(has_last, lpnb + lt.gather(1, last.clamp(min=0)), neg)
        # grow by c: after a blank only when c repeats the last token
        same = vocab.view(1, 1, V) == last.unsqueeze(-1)  # (N, K, V)
        ext = torch.where(same, lpb.unsqueeze(-1), total.unsqueeze(-1)) + lt.unsqueeze(1)
        ext[..., blank] = NEG_INF
        if max_len is not None:
            ext = ext.masked_fill((plen >= max_len).unsqueeze(-1), NEG_INF)
        # merge: prefix i grown by last_j equals prefix j (both live beams, distinct prefixes)
        shorter = pos.view(1, 1, 1, T) >= plen.view(N, K, 1, 1)  # positions beyond prefix i
        agree = (prefix.unsqueeze(2) == prefix.unsqueeze(1)) | shorter  # (N, Ki, Kj, T)
        child = agree.all(-1) & (plen.unsqueeze(1) == plen.unsqueeze(2) + 1)
        child &= valid.unsqueeze(2) & valid.unsqueeze(1) & has_last.unsqueeze(1)
        idx = last.clamp(min=0).unsqueeze(1).expand(N, K, K)  # [n, i, j] = last_j
        moved = torch.where(child, ext.gather(2, idx), neg)  # mass of i -> j
        stay_nb = torch.logaddexp(stay_nb, torch.logsumexp(moved, dim=1))
        gone = torch.zeros((N, K, V), dtype=dt, device=dev).scatter_add_(2, idx, child.to(dt)) > 0
        ext = ext.masked_fill(gone, NEG_INF)
        # the K best of (K stays) + (K * V growths)
        cand = torch.cat([torch.logaddexp(stay_b, stay_nb), ext.view(N, K * V)], 1)
        _, top = cand.topk(K, dim=1)  # (N, K)
        is_stay = top < K
        src = torch.where(is_stay, top, (top - K) // V)
        tok = (top - K) % V
        new_prefix = prefix.gather(1, src.unsqueeze(-1).expand(N, K, T))
        new_plen = plen.gather(1, src)
        write = (~is_stay).unsqueeze(-1) & (pos.view(1, 1, T) == new_plen.unsqueeze(-1))
        new_prefix = torch.where(write, tok.unsqueeze(-1), new_prefix)
        new_plen = new_plen + (~is_stay).long()
        new_last = torch.where(is_stay, last.gather(1, src), tok)
        new_lpb = torch.where(is_stay, stay_b.gather(1, src), neg)
        new_lpnb = torch.where(is_stay, stay_nb.gather(1, src), ext.view(N, K * V).gather(1, (top - K).clamp(min=0)))
        keep = live.view(N, 1)
        prefix = torch.where(keep.unsqueeze(-1), new_prefix, prefix)
        plen, last = torch.where(keep, new_plen, plen), torch.where(keep, new_last, last)
        lpb, lpnb = torch.where(keep, new_lpb, lpb), torch.where(keep, new_lpnb, lpnb)

    score, order = torch.logaddexp(lpb, lpnb).sort(dim=1, descending=True, stable=True)
    prefix = prefix.gather(1, order.unsqueeze(-1).expand(N, K, T))
    return prefix, plen.gather(1, order), score


class CTCGenerator(NATGeneratorBase):
    #: the benchmark's decoding keys this generator reads (fairseq_nat_ext.evaluation.decoding)
    decoding_keys = ("beam",)

    def __init__(self, models, tgt_dict, beam=1, nbest=1, retain_history=False):
        if int(beam) < 1:
            raise InputError(f"ctc decoding: --beam must be >= 1, got {beam}")
        ratios = {m.upsample_ratio for m in models}
        if len(ratios) > 1:
            raise InputError(f"ctc decoding: ensembled models differ in --upsample-ratio ({sorted(ratios)})")
        super().__init__(models, tgt_dict, retain_history)
        self.beam = int(beam)
        self.nbest = max(1, min(int(nbest), self.beam))
        self.blank = models[0].blank_idx

    @classmethod
    def from_generation_args(cls, models, tgt_dict, args):
        return cls(models, tgt_dict, beam=getattr(args, "beam", 1), nbest=getattr(args, "nbest", 1),
                   retain_history=getattr(args, "retain_iter_history", False))

    def alignment_lprobs(self, models, src_tokens, src_lengths):
        """Ensemble-averaged per-position log-probs (N, L, V) and alignment lengths (N,)."""
        outs, lengths = [], None
        for m in models:
            enc = m.encoder(src_tokens, src_lengths=src_lengths)
            up = m.decoder.upsample(enc)
            lengths = up[1]
            outs.append(self.model_lprobs(m, enc, up))
        lp = outs[0] if len(outs) == 1 else torch.logsumexp(torch.stack(outs), 0) - math.log(len(outs))
        lp = lp.float()
        lp[..., self.forbidden] = NEG_INF
        return lp, lengths

    def model_lprobs(self, model, enc, up):
        return model.decoder(enc, normalize=True, upsampled=up)

    def _with_eos(self, toks):
        return torch.cat([toks, toks.new_full((1,), self.eos)])

    def _cut(self, tokens, scores):
        """A collapsed output (n,) and its scores (n + 1,) (the last for ``</s>``) cut to ``max_len``
        tokens; the scores of the cut tokens go to ``</s>``."""
        n = min(tokens.numel(), self.max_len)
        return self._with_eos(tokens[:n]), torch.cat([scores[:n], scores[n:].sum(0, keepdim=True)])

    @torch.no_grad()
    @cpu_linear.decodes
    def generate(self, models, sample, prefix_tokens=None, constraints=None, **unused):
        if constraints is not None or prefix_tokens is not None:
            raise NotImplementedError("ctc decoding: prefix and constrained decoding are not supported")
        models = models or self.models
        eval_mode(models)
        net = sample["net_input"]
        if self.beam == 1 and len(models) == 1 and type(self).model_lprobs is CTCGenerator.model_lprobs:
            return self._greedy(*self.best_symbols(models[0], net["src_tokens"], net["src_lengths"]))
        lp, lengths = self.alignment_lprobs(models, net["src_tokens"], net["src_lengths"])
        if self.beam == 1:
            best_lp, best = lp.max(-1)
            return self._greedy(best_lp, best, lengths)
        return self._beam(lp, lengths)

    def best_symbols(self, model, src_tokens, src_lengths):
        """One model's most probable symbol of every alignment position and its log-prob, without the
        (N, L, V) log-probs (``best_vocab_tokens``): (log-probs (N, L), symbols (N, L), lengths (N,)),
        equal to ``alignment_lprobs(...)[0].max(-1)`` up to float rounding; padding positions hold 0
        and ``pad``."""
        enc = model.encoder(src_tokens, src_lengths=src_lengths)
        up = model.decoder.upsample(enc)
        lengths, L = up[1], up[0].size(1)
        inside = torch.arange(L, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)
        feats = model.decoder.features(enc, select=inside, upsampled=up)
        lp, sym = best_vocab_tokens(model.decoder, feats, self.forbidden)
        best_lp = lp.new_zeros(inside.shape).masked_scatter(inside, lp)
        best = sym.new_full(inside.shape, self.pad).masked_scatter(inside, sym)
        return best_lp, best, lengths

    def _greedy(self, best_lp, best, lengths):
        tokens, out_lengths, alignment, pos_lp = ctc_greedy_best(best_lp, best, lengths, self.blank, self.pad)
        per_token = alignment_token_scores(pos_lp, alignment, lengths, self.blank)
        finalized = []
        for b in range(best.size(0)):
            n = int(out_lengths[b])
            toks, ps = self._cut(tokens[b, :n], per_token[b, : n + 1])
            hyp = {"tokens": toks, "score": ps.sum() / ps.numel(), "positional_scores": ps, "alignment": None,
                   "steps": 1}
            if self.retain_history:
                hyp["history"] = [{"tokens": alignment[b, : int(lengths[b])].clone()}]
            finalized.append([hyp])
        return finalized

    def _beam(self, lp, lengths):
        prefixes, plens, scores = ctc_prefix_beam_search(lp, lengths, self.beam, self.blank, self.pad,
                                                         max_len=self.max_len)
        history = None
        if self.retain_history:
            _, _, alignment, _ = ctc_greedy(lp, lengths, self.blank, self.pad)
            history = alignment
        finalized = []
        for b in range(lp.size(0)):
            hyps = []
            for k in range(self.nbest):
                if not torch.isfinite(scores[b, k]) and k > 0:
                    break
                n = int(plens[b, k])
                s = scores[b, k] / (n + 1)
                hyp = {"tokens": self._with_eos(prefixes[b, k, :n]), "score": s,
                       "positional_scores": s.expand(n + 1).clone(), "alignment": None, "steps": 1}
                if history is not None:
                    hyp["history"] = [{"tokens": history[b, : int(lengths[b])].clone()}]
                hyps.append(hyp)
            finalized.append(hyps)
        return finalized
