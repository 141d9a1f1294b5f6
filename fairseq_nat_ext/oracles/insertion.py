"""Insertion oracle of the Insertion Transformer (Stern et al. 2019), batched on tensors.

The canvas is a subsequence of the target, given by ``keep`` (B, m): True at the target positions
already on the canvas.  Slot s (0 <= s <= K, K = number of kept tokens) lies before the s-th kept
token (slot K after the last one); its *missing span* is the run of target tokens between the kept
tokens around it.  Every missing target position p gets

* ``slot[b, p]``: the slot it belongs to, and
* ``weight[b, p]``: its share of the slot's loss.  ``tau=None``: uniform over the span (1 / span
  length); otherwise balanced binary tree: softmax over the span of -|r - c| / tau, where r is the
  position inside the span (0-based) and c = (span length - 1) / 2 its centre, so the middle of every
  span is preferred and decoding fills spans in about log2(n) parallel steps.

Slots whose span is empty get the end-of-slot label: ``slot_done[b, s]`` (only slots 0..K exist;
``slot_valid`` marks them).  The loss of a model with slot-token log-probabilities logp[b, s, v] is
-sum_p weight[b, p] * logp[b, slot[b, p], tgt[b, p]] - sum_s slot_done[b, s] * logp_end[b, s]
(each slot's weights sum to 1), whether logp is normalised per slot, log p(v | s), or jointly over
the row's (slot, token) pairs, log p(v, s) (Stern et al.; ``--insertion-softmax``).
"""

from typing import NamedTuple, Optional

import torch

Tensor = torch.Tensor


class InsertionOracle(NamedTuple):
    slot: Tensor        # (B, m) slot of each target position (meaningful where ``missing``)
    weight: Tensor      # (B, m) loss weight of each missing target position (0 elsewhere)
    missing: Tensor     # (B, m) True at real target positions not on the canvas
    slot_done: Tensor   # (B, m + 1) True for existing slots with nothing left to insert
    slot_valid: Tensor  # (B, m + 1) True for slots 0..K


def insertion_oracle(tgt: Tensor, keep: Tensor, pad: int, tau: Optional[float] = 1.0) -> InsertionOracle:
    B, m = tgt.shape
    dev = tgt.device
    real = tgt.ne(pad)
    keep = keep & real
    missing = real & ~keep
    pos = torch.arange(m, device=dev).expand(B, m)
    slot = torch.cumsum(keep.long(), dim=1)  # kept tokens up to p (p itself is not kept when missing)
    last_kept = torch.cummax(torch.where(keep, pos, torch.full_like(pos, -1)), dim=1).values
    r = (pos - last_kept - 1).float()  # index inside the span
    span = torch.zeros(B, m + 1, dtype=torch.long, device=dev)
    span.scatter_add_(1, slot, missing.long())
    length = span.gather(1, slot).float()  # span length of each position's slot
    if tau is None:
        weight = torch.where(missing, 1.0 / length.clamp_min(1), torch.zeros_like(length))
    else:
        logits = -(r - (length - 1) / 2).abs() / tau
        logits = torch.where(missing, logits, torch.full_like(logits, float("-inf")))
        peak = torch.full((B, m + 1), float("-inf"), device=dev).scatter_reduce(1, slot, logits, "amax")
        e = torch.where(missing, torch.exp(logits - peak.gather(1, slot)), torch.zeros_like(logits))
        total = torch.zeros(B, m + 1, device=dev).scatter_add(1, slot, e)
        weight = e / total.gather(1, slot).clamp_min(1e-30)
    n_kept = keep.sum(1, keepdim=True)
    slot_valid = torch.arange(m + 1, device=dev).unsqueeze(0) <= n_kept
    slot_done = slot_valid & (span == 0)
    return InsertionOracle(slot, weight, missing, slot_done, slot_valid)
