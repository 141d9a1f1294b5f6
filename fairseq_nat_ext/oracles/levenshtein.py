"""Insertion/deletion edit-distance oracle, batched on tensors (CPU or CUDA): the expert of the
Levenshtein Transformer (Gu et al. 2019).

There is no substitution: the distance between hypothesis h (length n) and target t (length m) is
n + m - 2 * LCS(h, t), as in fairseq's libnat ``suggested_ed2_path``.  The optimal edits keep an
LCS of h in place, delete the other hypothesis tokens, and insert the missing target tokens into the
slots between kept tokens.

Algorithm.  The table D[i, j] = distance(h[:i], t[:j]) is filled one hypothesis row at a time for
the whole batch: with E[j] = min(D[i-1, j] + 1, D[i-1, j-1] if h[i] == t[j]) the row is
D[i, j] = min_{k <= j} E[k] + (j - k), i.e. a cumulative minimum of E[k] - k plus j, so every row is a
few vector operations over (batch, m) and no Python loop runs over target positions.  The backtrace
walks all sequences of the batch together.

Tie rule (documented, tested).  Walking back from (n, m): if h[i] == t[j] and D[i, j] == D[i-1, j-1]
the pair is KEPT (matched); otherwise, if deleting h[i] is optimal (D[i, j] == D[i-1, j] + 1) it is
deleted; otherwise t[j] is inserted.  So among optimal edit scripts the oracle prefers to match the
LATEST possible occurrences and, where it must choose, to delete before it inserts.
"""

from typing import NamedTuple

import torch

Tensor = torch.Tensor


class EditOracle(NamedTuple):
    """Expert edits for a batch (all tensors on the inputs' device).

    distance:   (B,) number of insertions + deletions
    del_labels: (B, n) 1 = delete this hypothesis token (0 at padding)
    keep_tgt:   (B, m) True where the target token is matched by a kept hypothesis token
    ins_counts: (B, m + 1) placeholders to insert in slot s of the expert-deleted sequence (slot s is
                before its s-th kept token; the last used slot is after the last kept token), 0 beyond
    masked_tgt: (B, m) the target with every inserted (unmatched) token replaced by ``mask``
    """

    distance: Tensor
    del_labels: Tensor
    keep_tgt: Tensor
    ins_counts: Tensor
    masked_tgt: Tensor


def edit_distance_table(hyp: Tensor, tgt: Tensor) -> Tensor:
    """(B, n+1, m+1) insertion/deletion distances D[b, i, j] between hyp[b, :i] and tgt[b, :j]
    (padding is compared like any token: read D at the real lengths)."""
    B, n = hyp.shape
    m = tgt.size(1)
    j = torch.arange(m + 1, device=hyp.device, dtype=torch.int32)
    # 0 where h[i] == t[j] (a diagonal move is free), n + m + 1 (never chosen) elsewhere
    diag_cost = torch.where(hyp.unsqueeze(2) == tgt.unsqueeze(1), 0, n + m + 1).to(torch.int32)  # (B, n, m)
    D = torch.empty(B, n + 1, m + 1, dtype=torch.int32, device=hyp.device)
    D[:, 0] = j  # only insertions
    for i in range(1, n + 1):
        prev = D[:, i - 1]
        E = prev + 1  # delete h[i]
        torch.minimum(E[:, 1:], prev[:, :-1] + diag_cost[:, i - 1], out=E[:, 1:])
        D[:, i] = torch.cummin(E - j, dim=1).values + j  # then insert t[k+1..j]
    return D


def levenshtein_oracle(hyp: Tensor, tgt: Tensor, pad: int, mask: int) -> EditOracle:
    """Expert edits turning each hypothesis into its target.  hyp (B, n), tgt (B, m), right-padded
    with ``pad`` (real tokens may be anything, including special symbols)."""
    B, n = hyp.shape
    m = tgt.size(1)
    dev = hyp.device
    W = m + 1
    hyp_len = hyp.ne(pad).sum(1)
    tgt_len = tgt.ne(pad).sum(1)
    Df = edit_distance_table(hyp, tgt).view(B, -1)  # flat: cell (i, j) at i * W + j
    # M[i, j] = h[i-1] == t[j-1] for i, j >= 1 (False on the borders)
    Mf = torch.zeros(B, n + 1, W, dtype=torch.bool, device=dev)
    Mf[:, 1:, 1:] = hyp.unsqueeze(2) == tgt.unsqueeze(1)
    Mf = Mf.view(B, -1)
    i, j = hyp_len.clone(), tgt_len.clone()
    distance = Df.gather(1, (i * W + j).unsqueeze(1)).squeeze(1).long()
    steps = int((hyp_len + tgt_len).max()) if B else 0
    matched_cells = []
    offsets = torch.tensor([0, -W - 1, -W], device=dev)
    for _ in range(steps):  # all sequences walk back together; finished ones stay at (0, 0)
        active = (i > 0) | (j > 0)
        idx = i * W + j
        vals = Df.gather(1, (idx.unsqueeze(1) + offsets).clamp_min(0))  # D[i,j], D[i-1,j-1], D[i-1,j]
        can_match = Mf.gather(1, idx.unsqueeze(1)).squeeze(1) & (vals[:, 1] == vals[:, 0])
        can_delete = (i > 0) & (vals[:, 2] + 1 == vals[:, 0])
        step_i = active & (can_match | can_delete)
        step_j = active & (can_match | ~can_delete)
        matched_cells.append(torch.where(active & can_match, idx, -1))
        i = i - step_i.long()
        j = j - step_j.long()
    keep_hyp = torch.zeros(B, n + 1, dtype=torch.bool, device=dev)
    keep_tgt = torch.zeros(B, W, dtype=torch.bool, device=dev)
    if matched_cells:
        cells = torch.stack(matched_cells, 1)  # (B, steps), -1 = no match at that step
        hit = cells >= 0
        ci = torch.where(hit, cells // W, 0)
        cj = torch.where(hit, cells % W, 0)
        keep_hyp.scatter_(1, ci, hit)
        keep_tgt.scatter_(1, cj, hit)
        keep_hyp[:, 0] = False
        keep_tgt[:, 0] = False
    keep_hyp, keep_tgt = keep_hyp[:, 1:], keep_tgt[:, 1:]  # cell i holds token i-1
    real_hyp = hyp.ne(pad)
    del_labels = (real_hyp & ~keep_hyp).long()
    # slot of each unmatched target token = number of kept target tokens before it
    slot = torch.cumsum(keep_tgt.long(), dim=1)
    inserted = tgt.ne(pad) & ~keep_tgt
    ins_counts = torch.zeros(B, m + 1, dtype=torch.long, device=dev)
    ins_counts.scatter_add_(1, slot, inserted.long())
    masked_tgt = torch.where(inserted, torch.full_like(tgt, mask), tgt)
    return EditOracle(distance, del_labels, keep_tgt, ins_counts, masked_tgt)


def apply_edits(hyp: Tensor, oracle: EditOracle, tgt: Tensor, pad: int):
    """Reference application of the oracle's edits (tests): delete, insert placeholders, fill.

    Returns the list of resulting token lists (should equal the targets)."""
    out = []
    for b in range(hyp.size(0)):
        kept = [int(x) for x, d, r in zip(hyp[b], oracle.del_labels[b], hyp[b].ne(pad)) if r and not d]
        tokens_to_fill = [int(x) for x, k, r in zip(tgt[b], oracle.keep_tgt[b], tgt[b].ne(pad)) if r and not k]
        seq = []
        for s in range(len(kept) + 1):
            seq += [None] * int(oracle.ins_counts[b, s])
            if s < len(kept):
                seq.append(kept[s])
        it = iter(tokens_to_fill)
        out.append([next(it) if x is None else x for x in seq])
    return out
