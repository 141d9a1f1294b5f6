"""Mask-Predict decoding (Ghazvininejad et al., 2019), batched on tensors.

1. Length beam: the top-``l`` predicted lengths of every sentence become ``l`` candidates, decoded in
   parallel in one batch of ``B * l`` rows.
2. Iteration 0 predicts every position from an all-``<mask>`` input.  Iteration ``t = 1..T-1``
   re-masks the ``n_t = floor(N * (T - t) / T)`` lowest-probability tokens (linear decay) and
   predicts them again; unmasked tokens keep their tokens and probabilities.
3. Adaptive stopping (fairseq's default, off with ``--iter-decode-force-max-iter``) detects loops, as
   fairseq's ``is_a_loop`` does for its CMLM: a row is finished, and leaves the batch, when iteration t
   would re-mask exactly the positions iteration t-1 re-masked (its input would then equal t-1's input,
   so its output would equal t-1's output) or nothing at all (``n_t`` = 0).  Stopping as soon as an
   iteration re-predicts the same tokens (fairseq's criterion for models that rewrite every token) is
   NOT a loop here, because the next iteration re-masks fewer tokens and so reads more context: on
   Multi30K it stopped most sentences after the 90%-re-masking pass of T=10 and cost 3.8 BLEU on valid.
4. The candidate with the best average log-probability is returned.

Rows are processed in groups of similar length (``bucket_ratio``): a batch holds B * l candidates
whose lengths can differ a lot (an implausible 3rd length candidate of one sentence would otherwise
pad every row to its length); grouping changes no result, only the work.

Ensembles (``--path a.pt:b.pt``) average the models' probabilities (log-mean-exp of log-probs) for
tokens and lengths.  The hypotheses carry what ``fairseq-generate`` reads: tokens (ending in </s>),
score, positional_scores, alignment=None, steps (decoder passes), and history with
``--retain-iter-history`` (one entry per iteration: its input with <mask>s and its output).
"""
import math

import torch
import torch.nn.functional as F

from ..modules import cpu_linear
from ..modules import nat_decoder_inference as fast
from ..modules.vocab_projection import best_vocab_tokens, vocab_logits
from .base import NATGeneratorBase, eval_mode


def remask_counts(lengths, t, T):
    """Number of tokens to re-mask at iteration t (1 <= t < T) for rows of the given lengths."""
    return (lengths.float() * (T - t) / T).floor().long()


def lowest_prob_mask(probs, lengths, n):
    """(N, L) log-probs, (N,) lengths, (N,) counts -> bool (N, L): the n lowest positions per row."""
    L = probs.size(1)
    valid = torch.arange(L, device=probs.device).unsqueeze(0) < lengths.unsqueeze(1)
    scores = probs.masked_fill(~valid, float("inf"))
    ranks = scores.sort(dim=1, stable=True).indices.argsort(1)
    return (ranks < n.unsqueeze(1)) & valid


class MaskPredictGenerator(NATGeneratorBase):
    #: decode through modules/nat_decoder_inference (cross-attention keys and values once per
    #: sentence, the last feed-forward block only at re-masked positions); False: the decoder's own
    #: forward on every pass (the same hypotheses up to float rounding; kept for profiling and tests)
    fast_decoder = True

    def __init__(self, models, tgt_dict, max_iter=10, length_beam=1, adaptive=True,
                 retain_history=False, bucket_ratio=1.5):
        super().__init__(models, tgt_dict, retain_history)
        self.max_iter = max(1, int(max_iter))
        self.length_beam = max(1, int(length_beam))
        self.adaptive = adaptive
        self.bucket_ratio = bucket_ratio

    @classmethod
    def from_generation_args(cls, models, tgt_dict, args):
        return cls(
            models,
            tgt_dict,
            max_iter=getattr(args, "iter_decode_max_iter", 10),
            length_beam=getattr(args, "iter_decode_with_beam", 1),
            adaptive=not getattr(args, "iter_decode_force_max_iter", False),
            retain_history=getattr(args, "retain_iter_history", False),
        )

    # ------------------------------------------------------------------------------------------
    def _ensemble_lprobs(self, fn):
        outs = [fn(i, m) for i, m in enumerate(self.models)]
        if len(outs) == 1:
            return outs[0]
        return torch.logsumexp(torch.stack(outs, 0), 0) - math.log(len(outs))

    def _predict(self, tokens, rows, masked, src):
        """tokens (N, L) of the decoder rows ``rows``, masked bool (N, L) -> best token ids and
        log-probs at the masked positions (K,), ensemble-averaged; only masked positions are projected
        to the vocabulary.  ``src``: per model, the sentences' cached cross-attention keys and values
        (fast path) or their encoder output reordered to every row (the decoder's own forward)."""
        sent = src["sent"][rows]

        def features(m, cross):
            return fast.token_features(m.decoder, tokens, cross, sent, select=masked)

        def lprobs(i, m):
            if src["cross"] is None:
                enc = m.encoder.reorder_encoder_out(src["enc"][i], sent)
                return m.decoder(tokens, enc, normalize=True, select=masked).float()
            return F.log_softmax(vocab_logits(m.decoder, features(m, src["cross"][i])).float(), -1)

        if src["cross"] is not None and len(self.models) == 1:  # no (K, V) log-probs materialised
            m = self.models[0]
            best_lp, best_tok = best_vocab_tokens(m.decoder, features(m, src["cross"][0]), self.forbidden)
            return best_tok, best_lp
        lp = self._ensemble_lprobs(lprobs)
        lp[..., self.forbidden] = float("-inf")
        best_lp, best_tok = lp.max(-1)
        return best_tok, best_lp

    @torch.no_grad()
    @cpu_linear.decodes
    def generate(self, models, sample, prefix_tokens=None, constraints=None, **unused):
        if constraints is not None:
            raise NotImplementedError("mask_predict: constrained decoding is not supported")
        models = models or self.models
        eval_mode(models)
        net = sample["net_input"]
        src_tokens, src_lengths = net["src_tokens"], net["src_lengths"]
        B, l, T = src_tokens.size(0), self.length_beam, self.max_iter
        enc_outs = [m.encoder(src_tokens, src_lengths=src_lengths) for m in models]

        # --- length beam -------------------------------------------------------------------
        len_lp = self._ensemble_lprobs(
            lambda i, m: m.decoder.forward_length(enc_outs[i], normalize=True).float()
        )
        k = min(l, len_lp.size(1))
        top_cls = len_lp.topk(k, dim=-1).indices  # (B, k)
        lengths = models[0].decoder.class_to_length(top_cls, enc_outs[0])
        lengths = lengths.clamp(1, self.max_len).reshape(-1)  # (N,) N = B * k
        # every pass and every length candidate of a sentence reads the same encoder states: the
        # cross-attention keys and values are computed here, once per sentence (fast path)
        src = {"sent": torch.arange(B, device=src_tokens.device).repeat_interleave(k), "enc": enc_outs,
               "cross": None}
        if self.fast_decoder and all(fast.supported(m.decoder) for m in models):
            src["cross"] = [fast.cross_kv(m.decoder, e, checked=True) for m, e in zip(models, enc_outs)]

        N, L = lengths.numel(), int(lengths.max())
        pos = torch.arange(L, device=src_tokens.device).unsqueeze(0)
        valid = pos < lengths.unsqueeze(1)
        tokens = src_tokens.new_full((N, L), self.pad).masked_fill(valid, self.mask)
        probs = torch.zeros(N, L, device=src_tokens.device)
        steps = torch.zeros(N, dtype=torch.long, device=src_tokens.device)
        active = torch.arange(N, device=src_tokens.device)
        history = [[] for _ in range(N)] if self.retain_history else None
        last_masked = valid.clone()  # the positions each row re-masked in its last iteration

        ctx = (tokens, probs, lengths, valid, steps, src, history, last_masked)
        for t in range(T):
            if active.numel() == 0:
                break
            # rows of similar length run together: one absurd length candidate must not pad the batch
            active = torch.cat([self._iterate(t, rows, ctx) for rows in self._length_groups(active, lengths)])

        # --- pick the best length candidate per sentence -------------------------------------
        avg = (probs * valid).sum(1) / lengths.float()
        best = avg.view(B, k).argmax(1) + torch.arange(B, device=avg.device) * k
        passes = steps.view(B, k).max(1).values
        finalized = []
        for b in range(B):
            row = int(best[b])
            n = int(lengths[row])
            hyp = {
                "tokens": self._with_eos(tokens[row, :n]),
                "score": avg[row],
                "positional_scores": torch.cat([probs[row, :n], probs.new_zeros(1)]),
                "alignment": None,
                "steps": int(passes[b]),
            }
            if history is not None:
                hyp["history"] = history[row]
            finalized.append([hyp])
        return finalized

    def _length_groups(self, rows, lengths):
        """Split ``rows`` into groups of similar length (sorted; a group's longest row is at most
        ``bucket_ratio`` times its shortest, plus 4), so padding never dominates the work."""
        if rows.numel() == 0:
            return []
        lens, order = lengths[rows].sort(stable=True)
        rows = rows[order]
        bounds, start, lo = [], 0, int(lens[0])
        for i, n in enumerate(lens.tolist()):
            if i > start and n > self.bucket_ratio * lo + 4:
                bounds.append((start, i))
                start, lo = i, n
        bounds.append((start, rows.numel()))
        return [rows[a:b] for a, b in bounds]

    def _iterate(self, t, rows, ctx):
        """Iteration t on ``rows``; updates the shared state, returns the rows still active."""
        tokens, probs, lengths, valid, steps, src, history, last_masked = ctx
        T = self.max_iter
        L = int(lengths[rows].max())
        tok_a, prob_a, len_a = tokens[rows, :L], probs[rows, :L], lengths[rows]
        if t == 0:
            masked = valid[rows, :L]
        else:
            masked = lowest_prob_mask(prob_a, len_a, remask_counts(len_a, t, T))
        has_work = masked.any(1)
        if self.adaptive and t > 0:  # a loop: the same input as the last iteration, the same output
            has_work &= (masked != last_masked[rows, :L]).any(1)
        if self.adaptive and not bool(has_work.all()):
            keep = has_work.nonzero().squeeze(1)
            rows, tok_a, prob_a, masked = rows[keep], tok_a[keep], prob_a[keep], masked[keep]
            if rows.numel() == 0:
                return rows
        inp = tok_a.masked_fill(masked, self.mask)
        new_tok, new_lp = self._predict(inp, rows, masked, src)
        out_tok = tok_a.masked_scatter(masked, new_tok)
        out_lp = prob_a.masked_scatter(masked, new_lp)
        tokens[rows, :L], probs[rows, :L], last_masked[rows, :L] = out_tok, out_lp, masked
        steps[rows] += 1
        if history is not None:
            for r, row in enumerate(rows.tolist()):
                n = int(lengths[row])
                history[row].append(
                    {"input": self._with_eos(inp[r, :n]), "tokens": self._with_eos(out_tok[r, :n]),
                     "masked": masked[r, :n].clone(), "positional_scores": out_lp[r, :n].clone()}
                )
        return rows

    def _with_eos(self, toks):
        return torch.cat([toks, toks.new_full((1,), self.eos)])
