"""Imputer block decoding, batched on tensors.

Block size B = ``--iter-decode-max-iter`` (decoding string ``block=B``).  The alignment (``r`` x the
source length, ``--upsample-ratio``) starts all ``<mask>`` and is cut into blocks of B positions.  At
every step the decoder reads the current alignment; in every block that still has masked positions,
the masked position whose best symbol (token or ``<blank>``) is the most probable is filled with that
symbol (ties: the leftmost).  A block of B positions is complete after B steps, so decoding takes
exactly B decoder passes (fewer only when the whole alignment is shorter than B); B = 1 fills
everything at once (CTC greedy from an all-``<mask>`` input).  The alignment is then collapsed as in
CTC (merge repeats, drop blanks) and cut, as CTC's, at ``--max-target-positions`` - 2 tokens.

Hypotheses: tokens (ending in ``</s>``), score (per output token, ``</s>`` included) and
positional_scores from the log-probabilities the filled symbols had when they were filled (split
among the output tokens as in CTC greedy), alignment=None, steps (decoder passes), and with
``--retain-iter-history`` one entry per step whose tokens are the alignment after it (``<mask>`` and
``<blank>`` visible).  ``--path a.pt:b.pt`` averages the models' probabilities.  fairseq-generate's
``--beam`` is not used.
"""
import math

import torch

from ..modules import cpu_linear
from ..modules import nat_decoder_inference as fast
from ..modules.vocab_projection import best_vocab_tokens
from ..oracles.ctc_alignment import alignment_token_scores, ctc_collapse
from .base import eval_mode
from .ctc_nat import CTCGenerator

NEG_INF = float("-inf")


def block_fill_positions(confidence, masked, block):
    """The positions filled in one step: in every block of ``block`` positions with masked positions,
    the masked one of highest confidence (the leftmost on ties).

    confidence (N, L) float, masked bool (N, L) -> bool (N, L) with at most one True per block."""
    N, L = confidence.shape
    nb = -(-L // block)
    pad = nb * block - L
    conf = confidence.masked_fill(~masked, NEG_INF)
    if pad:
        conf = torch.cat([conf, conf.new_full((N, pad), NEG_INF)], 1)
        masked = torch.cat([masked, masked.new_zeros((N, pad))], 1)
    conf, masked = conf.view(N, nb, block), masked.view(N, nb, block)
    best = conf.argmax(-1, keepdim=True)  # first maximum
    pick = torch.zeros_like(masked).scatter_(-1, best, True) & masked.any(-1, keepdim=True)
    return pick.view(N, nb * block)[:, :L]


class ImputerGenerator(CTCGenerator):
    decoding_keys = ("block",)

    def __init__(self, models, tgt_dict, block=8, retain_history=False):
        super().__init__(models, tgt_dict, beam=1, retain_history=retain_history)
        self.block = max(1, int(block))

    @classmethod
    def from_generation_args(cls, models, tgt_dict, args):
        return cls(models, tgt_dict, block=getattr(args, "iter_decode_max_iter", 8),
                   retain_history=getattr(args, "retain_iter_history", False))

    @torch.no_grad()
    @cpu_linear.decodes
    def generate(self, models, sample, prefix_tokens=None, constraints=None, **unused):
        if constraints is not None or prefix_tokens is not None:
            raise NotImplementedError("imputer decoding: prefix and constrained decoding are not supported")
        models = models or self.models
        eval_mode(models)
        net = sample["net_input"]
        encs, ups, crosses = [], [], []
        for m in models:
            enc = m.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
            encs.append(enc)
            ups.append(m.decoder.upsample(enc))
            # every step reads the same encoder states: their cross-attention keys and values once
            crosses.append(fast.cross_kv(m.decoder, enc, checked=True) if fast.supported(m.decoder) else None)
        lengths, L = ups[0][1], ups[0][0].size(1)
        N = lengths.numel()
        alignment = models[0].full_mask_input(lengths, L)
        inside = alignment.ne(self.pad)
        pos_lp = torch.zeros((N, L), device=lengths.device)
        steps = torch.zeros(N, dtype=torch.long, device=lengths.device)
        history = [[] for _ in range(N)] if self.retain_history else None
        for _ in range(self.block):
            masked = alignment.eq(self.mask)
            if not bool(masked.any()):
                break
            best_lp, best = self._best(models, encs, ups, crosses, alignment, masked)  # masked positions only
            conf = torch.full((N, L), NEG_INF, device=best_lp.device).masked_scatter(masked, best_lp)
            sym = alignment.masked_scatter(masked, best)
            fill = block_fill_positions(conf, masked, self.block)
            alignment = torch.where(fill, sym, alignment)
            pos_lp = torch.where(fill, conf, pos_lp)
            steps += masked.any(1).long()
            if history is not None:
                for b in range(N):
                    history[b].append({"tokens": alignment[b, : int(lengths[b])].clone(),
                                       "filled": fill[b, : int(lengths[b])].clone()})

        tokens, out_lengths, _ = ctc_collapse(alignment, lengths, self.blank, self.pad)
        per_token = alignment_token_scores(pos_lp.masked_fill(~inside, 0.0), alignment, lengths, self.blank)
        finalized = []
        for b in range(N):
            n = int(out_lengths[b])
            toks, ps = self._cut(tokens[b, :n], per_token[b, : n + 1])
            hyp = {"tokens": toks, "score": ps.sum() / ps.numel(), "positional_scores": ps, "alignment": None,
                   "steps": int(steps[b]), "final_alignment": alignment[b, : int(lengths[b])].clone()}
            if history is not None:
                hyp["history"] = history[b]
            finalized.append([hyp])
        return finalized

    def _best(self, models, encs, ups, crosses, alignment, masked):
        """(log-prob (K,), symbol (K,)) of the best symbol at the K masked positions; one model: from
        its states through ``best_vocab_tokens`` (no (K, V) log-probs), an ensemble: from the
        averaged probabilities."""
        if len(models) == 1:
            m, e, u, c = models[0], encs[0], ups[0], crosses[0]
            feats = m.decoder.features(e, alignment=alignment, select=masked, upsampled=u, cross=c)
            return best_vocab_tokens(m.decoder, feats, self.forbidden)
        return self._lprobs(models, encs, ups, crosses, alignment, masked).max(-1)

    def _lprobs(self, models, encs, ups, crosses, alignment, masked):
        outs = [m.decoder(e, alignment=alignment, normalize=True, select=masked, upsampled=u, cross=c)
                for m, e, u, c in zip(models, encs, ups, crosses)]
        lp = outs[0] if len(outs) == 1 else torch.logsumexp(torch.stack(outs), 0) - math.log(len(outs))
        lp = lp.float()
        lp[..., self.forbidden] = NEG_INF
        return lp
