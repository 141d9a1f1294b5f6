"""Insertion Transformer decoding (model ``insertion``), batched on tensors: the Levenshtein
generator's loop (``generators/levenshtein.py``) with one insertion round instead of delete/insert/fill."""
import torch

from ..models.nat.edit_ops import fill_placeholders, insert_placeholders, spread_scores
from ..models.nat.insertion import end_of_slot, insertion_softmax
from .levenshtein import EditGenerator


class InsertionGenerator(EditGenerator):
    """Insertion Transformer decoding.  ``--insertion-decoding parallel`` (default): every slot whose
    argmax is not end-of-slot (the checkpoint's ``--insertion-end-symbol``: ``<pad>``, or ``</s>`` for
    checkpoints from before the option; the other special symbols are never inserted) gets its argmax
    token, all slots at once, until no slot inserts (``--iter-decode-max-iter`` rounds at most).
    ``sequential``: greedy, one token per round, in the slot whose best token is the most probable; it
    runs until every slot ends (at most the decoder's max positions; ``--iter-decode-max-iter`` does not
    cut it).
    ``--iter-decode-eos-penalty`` is subtracted from the end-of-slot log-probability.

    A model trained with ``--insertion-softmax joint`` (read from the checkpoint's args) is decoded
    with its joint log-probabilities log p(c, l) (one distribution over every (slot, token) pair of a
    row): each slot's best content is argmax_c p(c, l) and the slot stays empty when that is the
    end-of-slot token (Stern et al.'s parallel decoding), the sequential order picks the most probable
    (slot, token) pair among the slots that insert, and the token scores are joint log-probabilities."""

    sequential = False

    def configure(self, task_cfg):
        mode = getattr(task_cfg, "insertion_decoding", "parallel")
        if mode not in ("parallel", "sequential"):
            raise ValueError(f"--insertion-decoding must be parallel or sequential, got '{mode}'")
        self.sequential = mode == "sequential"
        if self.sequential:
            self.max_iter = max(self.max_iter, self.max_len)

    def _round(self, model, tokens, scores, enc, history, kv=None):
        joint = insertion_softmax(getattr(model, "args", None)) == "joint"
        end = end_of_slot(getattr(model, "args", None), self.tgt_dict)
        lp = model.decoder.forward_slots(tokens, enc, normalize=True, joint=joint, kv=kv).float()  # (N, S, V)
        banned = [t for t in (self.pad, self.eos, self.bos, self.mask, self.unk) if t != end]
        lp[..., banned] = float("-inf")
        lp[..., end] -= self.penalty
        best_lp, best = lp.max(-1)
        slot_ok = torch.arange(lp.size(1), device=lp.device).unsqueeze(0) < (tokens.ne(self.pad).sum(1) - 1).unsqueeze(1)
        ins = (best != end) & slot_ok
        if self.sequential:  # only the most probable insertion of each row
            cand = best_lp.masked_fill(~ins, float("-inf"))
            top = cand.argmax(1, keepdim=True)
            ins = torch.zeros_like(ins).scatter_(1, top, True) & ins
        if ins.any():
            grown = insert_placeholders(tokens, ins.long(), self.pad, self.mask, max_len=self.max_len)
            placed = grown.eq(self.mask)
            scores = spread_scores(scores, tokens, grown, self.mask, self.pad)
            # slots cut by max_len insert nothing: keep the first predictions of each row in order
            take = ins & (torch.cumsum(ins.long(), 1) <= placed.sum(1, keepdim=True))
            tokens = fill_placeholders(grown, best[take], self.mask)
            scores[placed] = best_lp[take].to(scores.dtype)
            self._log(history, "insert", tokens, changed=placed.any(1))
        return tokens, scores
