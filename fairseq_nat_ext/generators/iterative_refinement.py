"""Decoding of ``iterative_refinement`` (Lee et al., 2018), batched on tensors.

1. Length: the top ``--iter-decode-with-beam`` l predicted lengths of every sentence become l
   candidates (B * l rows, decoded together).
2. Pass 1 reads the source copied uniformly to the candidate's length and predicts every position
   (argmax); pass k + 1 reads the output of pass k.
3. Adaptive stop (fairseq's default; off with ``--iter-decode-force-max-iter``): a row whose pass
   returned its input unchanged is finished and leaves the batch; no row takes more than
   ``--iter-decode-max-iter`` T passes (T = 1: the initial pass only).  ``steps`` of a hypothesis =
   the decoder passes its sentence took (with a length beam, the most any of its candidates took).
4. The candidate with the best mean log-probability (of its last pass) is returned.

One model whose layers modules/nat_decoder_inference.py supports: the encoder's cross-attention keys
and values are computed once per sentence and read by every pass and length candidate, the layers run
through that module, and each position's best token comes from ``best_vocab_tokens`` (no
(positions x V) log-probs).
``--path a.pt:b.pt`` averages the models' probabilities (log-mean-exp).  ``--retain-iter-history``:
one ``E-`` line per pass of the returned candidate.  Hypotheses: tokens (ending in ``</s>``), score,
positional_scores (0 for ``</s>``), alignment=None, steps.
"""
import math

import torch

from ..modules import cpu_linear
from ..modules import nat_decoder_inference as fast
from ..modules.vocab_projection import best_vocab_tokens
from .base import NATGeneratorBase, eval_mode
from .projection import best_tokens, vocab_projection


class RefinementGenerator(NATGeneratorBase):
    #: the benchmark's decoding keys this generator reads (fairseq_nat_ext.evaluation.decoding)
    decoding_keys = ("iter", "len_beam", "force")

    def __init__(self, models, tgt_dict, max_iter=10, length_beam=1, adaptive=True, retain_history=False):
        super().__init__(models, tgt_dict, retain_history)
        self.max_iter = max(1, int(max_iter))
        self.length_beam = max(1, int(length_beam))
        self.adaptive = adaptive

    @classmethod
    def from_generation_args(cls, models, tgt_dict, args):
        return cls(models, tgt_dict, max_iter=getattr(args, "iter_decode_max_iter", 10),
                   length_beam=getattr(args, "iter_decode_with_beam", 1),
                   adaptive=not getattr(args, "iter_decode_force_max_iter", False),
                   retain_history=getattr(args, "retain_iter_history", False))

    def _pass(self, models, enc, inp, first, cached=None):
        """One decoder pass of every model on rows ``inp`` (N, T) -> (tokens, log-probs) (N, T).
        ``cached`` (one model): (its cross-attention keys/values per sentence, the sentence of every
        row): the layers read those, and each position's best token comes from ``best_vocab_tokens``
        (no (positions x V) log-probs); ``enc`` is then only read by the first pass (copy_source)."""
        valid = inp.ne(self.pad)
        if cached is not None:
            m, (cross, sent) = models[0], cached
            feats = m.decoder(inp, enc[0], copy_source=first, features_only=True, cross=cross, sent=sent,
                              select=valid)
            lp, tok = best_vocab_tokens(m.decoder, feats, self.forbidden)
            return (inp.new_full(inp.shape, self.pad).masked_scatter(valid, tok),
                    lp.new_zeros(inp.shape).masked_scatter(valid, lp))
        feats = [m.decoder(inp, e, copy_source=first, features_only=True) for m, e in zip(models, enc)]
        valid = inp.ne(self.pad)
        tokens, lp = best_tokens(feats, [vocab_projection(m.decoder) for m in models], len(self.tgt_dict),
                                 self.forbidden, keep=valid)
        return tokens.masked_fill(~valid, self.pad), lp  # lp is 0 off ``valid`` (not projected)

    @torch.no_grad()
    @cpu_linear.decodes
    def generate(self, models, sample, prefix_tokens=None, constraints=None, **unused):
        if constraints is not None or prefix_tokens is not None:
            raise NotImplementedError("iterative_refinement: prefix and constrained decoding are not supported")
        models = models or self.models
        eval_mode(models)
        net = sample["net_input"]
        src_tokens, src_lengths = net["src_tokens"], net["src_lengths"]
        dev = src_tokens.device
        B = src_tokens.size(0)
        enc = [m.encoder(src_tokens, src_lengths=src_lengths) for m in models]
        len_lp = [m.decoder.forward_length(e, normalize=True).float() for m, e in zip(models, enc)]
        len_lp = len_lp[0] if len(models) == 1 else torch.logsumexp(torch.stack(len_lp), 0) - math.log(len(models))
        k = min(self.length_beam, len_lp.size(1))
        top = len_lp.topk(k, dim=-1).indices
        lengths = models[0].decoder.class_to_length(top, enc[0]).clamp(1, self.max_len).reshape(-1)  # (N,)
        order = torch.arange(B, device=dev).repeat_interleave(k)
        # one model with supported layers: every pass and length candidate of a sentence reads its
        # cross-attention keys and values, computed once here
        cross = fast.cross_kv(models[0].decoder, enc[0], checked=True) \
            if len(models) == 1 and fast.supported(models[0].decoder) else None
        enc = [m.encoder.reorder_encoder_out(e, order) for m, e in zip(models, enc)]
        N, T = lengths.numel(), int(lengths.max())
        valid = torch.arange(T, device=dev).unsqueeze(0) < lengths.unsqueeze(1)
        placeholder = torch.full((N, T), self.pad, dtype=torch.long, device=dev).masked_fill(valid, self.mask)
        tokens, lprobs = self._pass(models, enc, placeholder, first=True,
                                    cached=None if cross is None else (cross, order))
        steps = torch.ones(N, dtype=torch.long, device=dev)
        history = [[{"tokens": self._with_eos(tokens[r, : int(lengths[r])])}] for r in range(N)] \
            if self.retain_history else None
        active = torch.arange(N, device=dev)
        for _ in range(1, self.max_iter):
            if active.numel() == 0:
                break
            inp = tokens[active]
            if cross is not None:
                new_tok, new_lp = self._pass(models, enc, inp, first=False, cached=(cross, order[active]))
            else:
                sub = [m.encoder.reorder_encoder_out(e, active) for m, e in zip(models, enc)]
                new_tok, new_lp = self._pass(models, sub, inp, first=False)
            changed = (new_tok != inp).any(1)
            tokens[active], lprobs[active] = new_tok, new_lp
            steps[active] += 1
            if history is not None:
                for i, r in enumerate(active.tolist()):
                    history[r].append({"tokens": self._with_eos(new_tok[i, : int(lengths[r])])})
            if self.adaptive:
                active = active[changed]
        avg = lprobs.sum(1) / lengths.float()
        best = avg.view(B, k).argmax(1) + torch.arange(B, device=dev) * k
        passes = steps.view(B, k).max(1).values
        finalized = []
        for b in range(B):
            row, n = int(best[b]), int(lengths[int(best[b])])
            hyp = {"tokens": self._with_eos(tokens[row, :n]), "score": avg[row],
                   "positional_scores": torch.cat([lprobs[row, :n], lprobs.new_zeros(1)]),
                   "alignment": None, "steps": int(passes[b])}
            if history is not None:
                hyp["history"] = history[row]
            finalized.append([hyp])
        return finalized

    def _with_eos(self, toks):
        return torch.cat([toks, toks.new_full((1,), self.eos)])
