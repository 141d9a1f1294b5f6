"""Pointer decoding: greedy (``--beam 1``) and beam search over batch * beam rows at once, with the
validity masks of :mod:`.pointer_constraints`.

Loop (one interface with the other generators: initial state -> steps -> finished hypotheses):

1. every model encodes the batch once; rows are repeated ``beam`` times (row = sentence * beam + k);
2. each step, the models' log-probs over the N + 1 slots (ensembles: log of the mean probability)
   are masked by the constraint; a finished row may only repeat the end at cost 0, so it keeps its
   score and stays in the beam; the ``beam`` best (row, slot) extensions of each sentence by total
   log-probability are kept and every state (model, constraint, tokens) is reordered to them;
3. the loop ends when every row has emitted the end (the constraints bound the length).

The hypothesis chosen is the one with the best model score, the sum of the token log-probabilities
(no length normalisation; fairseq's ``--lenpen`` is not used).  Hypotheses are what fairseq-generate
reads: ``tokens`` (position-dictionary ids ending in ``</s>``), ``score``, ``positional_scores``,
``alignment`` None, ``steps`` (decoder steps).  Nothing assumes a device: tensors follow the input.
"""
import math

import torch

from ..compat import InputError
from .pointer_constraints import build_constraint


class PointerGenerator:
    def __init__(self, models, tgt_dict, problem, beam=1, nbest=1, constrained=True):
        if beam < 1 or nbest < 1 or nbest > beam:
            raise InputError(f"pointer generator: need 1 <= --nbest ({nbest}) <= --beam ({beam})")
        self.models = models
        self.tgt_dict = tgt_dict
        self.problem = problem
        self.beam = int(beam)
        self.nbest = int(nbest)
        self.constrained = constrained
        self.eos = tgt_dict.eos()
        self.offset = tgt_dict.nspecial - 1  # point slot s >= 1 has id s + offset
        self.symbols_to_strip_from_output = {self.eos}

    @classmethod
    def from_generation_args(cls, models, tgt_dict, args, problem, constrained=True):
        if getattr(args, "sampling", False):
            raise InputError("pointer generator: --sampling is not supported (greedy or beam search)")
        return cls(models, tgt_dict, problem, beam=getattr(args, "beam", 1) or 1,
                   nbest=getattr(args, "nbest", 1) or 1, constrained=constrained)

    def _lprobs(self, models, encs, prev, states):
        outs = [m.decode_step(e, prev, s) for m, e, s in zip(models, encs, states)]
        lps = [o[0] for o in outs]
        lp = lps[0] if len(lps) == 1 else torch.logsumexp(torch.stack(lps), 0) - math.log(len(lps))
        return lp, [o[1] for o in outs]

    @torch.no_grad()
    def search(self, models, coords, lengths, beam=None):
        """coords (B, N, 2), lengths (B,) -> dict of (B, K, ...) tensors sorted best first per sentence:
        ``slots`` (B, K, T) (0 = end, then 0 padding), ``pos_scores`` (B, K, T), ``scores`` (B, K),
        ``lengths`` (B, K) (end included; 0 for a beam row that holds no valid hypothesis)."""
        K = self.beam if beam is None else beam
        B, N, _ = coords.shape
        S, R, dev = N + 1, B * K, coords.device
        if B == 0:
            raise InputError("pointer generator: empty batch")
        lengths = lengths.to(dev)
        if int(lengths.min()) < 3:
            raise InputError("pointer generator: every input needs at least 3 points")
        for m in models:
            m.eval()
        rows = torch.arange(B, device=dev).repeat_interleave(K)
        encs = [m.reorder_encoder_out(m.encode(coords, lengths), rows) for m in models]
        states = [m.init_state(e) for m, e in zip(models, encs)]
        cons = build_constraint(self.problem, lengths[rows], S, self.constrained)
        T = int(cons.max_steps.max())
        scores = torch.zeros(B, K, device=dev)
        scores[:, 1:] = float("-inf")  # the beam starts as one hypothesis
        scores = scores.view(R)
        finished = torch.zeros(R, dtype=torch.bool, device=dev)
        slots = torch.zeros(R, T, dtype=torch.long, device=dev)
        pos_scores = torch.zeros(R, T, device=dev)
        out_len = torch.zeros(R, dtype=torch.long, device=dev)
        prev = torch.zeros(R, dtype=torch.long, device=dev)
        end_only = torch.full((1, S), float("-inf"), device=dev)
        end_only[0, 0] = 0.0
        base = (torch.arange(B, device=dev) * K).unsqueeze(1)
        for t in range(T):
            lp, states = self._lprobs(models, encs, prev, states)
            lp = lp.masked_fill(~cons.allowed(), float("-inf"))
            lp = torch.where(finished.unsqueeze(1), end_only, lp)
            cand = (scores.unsqueeze(1) + lp).view(B, K * S)
            top, flat = cand.topk(K, dim=1)  # (B, K), sorted
            src = (base + torch.div(flat, S, rounding_mode="floor")).view(R)
            slot = (flat % S).view(R)
            step_lp = lp.view(B, K * S).gather(1, flat).view(R)
            slots, pos_scores = slots[src], pos_scores[src]
            finished, out_len = finished[src], out_len[src]
            states = [m.reorder_state(s, src) for m, s in zip(models, states)]
            cons.reorder(src)
            active = ~finished
            slots[:, t] = torch.where(active, slot, slots[:, t])
            pos_scores[:, t] = torch.where(active, step_lp, pos_scores[:, t])
            out_len = out_len + active.long()
            cons.advance(slot, active)
            scores = top.view(R)
            finished = finished | (slot == 0) | torch.isinf(scores)
            prev = slot
            if bool(finished.all()):
                break
        out_len = torch.where(torch.isinf(scores), torch.zeros_like(out_len), out_len)
        return {"slots": slots.view(B, K, T), "pos_scores": pos_scores.view(B, K, T),
                "scores": scores.view(B, K), "lengths": out_len.view(B, K)}

    @torch.no_grad()
    def generate(self, models, sample, prefix_tokens=None, constraints=None, **unused):
        if prefix_tokens is not None or constraints is not None:
            raise InputError("pointer generator: --prefix-size and --constraints are not supported")
        models = models or self.models
        net = sample["net_input"]
        res = self.search(models, net["src_coords"], net["src_lengths"])
        B, K, _ = res["slots"].shape
        scores, lengths = res["scores"].cpu(), res["lengths"].cpu()
        hypos = []
        for b in range(B):
            hyps = []
            for k in range(K):
                L = int(lengths[b, k])
                if L == 0 or len(hyps) == self.nbest:
                    continue
                s = res["slots"][b, k, :L]
                tokens = torch.where(s == 0, torch.full_like(s, self.eos), s + self.offset)
                hyps.append({"tokens": tokens, "score": float(scores[b, k]),
                             "positional_scores": res["pos_scores"][b, k, :L], "alignment": None,
                             "steps": L})
            hypos.append(hyps)
        return hypos
