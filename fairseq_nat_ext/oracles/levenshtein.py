"""Insertion/deletion edit-distance oracle, batched on tensors (CPU or CUDA): the expert of the
Levenshtein Transformer (Gu et al. 2019).

There is no substitution: the distance between hypothesis h (length n) and target t (length m) is
n + m - 2 * LCS(h, t), as in fairseq's libnat ``suggested_ed2_path``.  The optimal edits keep an
LCS of h in place, delete the other hypothesis tokens, and insert the missing target tokens into the
slots between kept tokens.

Algorithm.  D[i, j] = i + j - 2 L[i, j] with L the LCS table, filled one hypothesis row at a time
for the whole batch.  Targets up to 62 tokens use bit-parallel rows (Allison-Dix / Hyyro): a row is
one int64 per sequence and costs four integer operations on a (batch,) tensor; the table is then
unpacked in one vectorised step.  Longer targets use L[i, j] = max_{k <= j} max(L[i-1, k],
L[i-1, k-1] + [h[i] == t[k]]), a cumulative max per row.  No Python loop runs over target positions
or sequences.

Backtrace.  With bit-parallel rows the walk needs no table at all: from V_{i-1} and V_i, two words
per sequence say in which columns of row i a match / a deletion is optimal (the vertical difference
L[i, j] - L[i-1, j] is the prefix parity of V_{i-1} xor V_i), and one step of the walk is "highest
allowed column <= j" on those words: about fifteen operations on (batch,) tensors per hypothesis row.
For longer targets the table is built and the next column precomputed for every cell, then one
gather per hypothesis row walks the whole batch.

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


_BITS = 62  # bit-parallel rows fit in an int64 up to this many target positions


def _match_bits(hyp: Tensor, tgt: Tensor) -> Tensor:
    """(B, n) int64: bit j set where hyp[b, i] == tgt[b, j] (m <= 62), without a (B, n, m) table:
    sort each target, find each hypothesis token's run of equal tokens (searchsorted), and sum the
    run's bits from prefix sums (distinct bits: the sum is the OR)."""
    srt, order = tgt.sort(1)
    bits = torch.ones(1, dtype=torch.int64, device=tgt.device) << order
    csum = torch.nn.functional.pad(bits.cumsum(1), (1, 0))  # (B, m + 1)
    hyp = hyp.contiguous()
    lo = torch.searchsorted(srt, hyp, side="left")
    hi = torch.searchsorted(srt, hyp, side="right")
    return csum.gather(1, hi) - csum.gather(1, lo)


def _bit_rows(match_bits: Tensor, m: int) -> Tensor:
    """(B, n+1) bit-parallel rows V_0..V_n (bits 0..m-1) for ``match_bits`` (B, n) of
    :func:`_match_bits`.  Carries past bit m-1 never flow back down, so they are masked off once."""
    full = (1 << m) - 1
    V = torch.full((match_bits.size(0),), full, dtype=torch.int64, device=match_bits.device)
    rows = [V]
    for M in match_bits.unbind(1):
        U = V & M
        V = (V + U) | (V - U)
        rows.append(V)
    return torch.stack(rows, 1) & full


def _lcs_table_bitparallel(hyp: Tensor, tgt: Tensor) -> Tensor:
    """(B, n+1, m+1) LCS lengths L[b, i, j] of hyp[b, :i] and tgt[b, :j] for m <= 62.

    Bit-parallel rows (Allison-Dix / Hyyro): bit j of V_i is 0 where the LCS grows at target position
    j, so L[i, j] = number of zero bits of V_i below j.  Each hypothesis token costs four integer
    operations on a (B,) tensor: V = ((V + U) | (V - U)) with U = V & match_bits(h_i)."""
    B, n = hyp.shape
    m = tgt.size(1)
    Vs = _bit_rows(_match_bits(hyp, tgt), m)
    bit = torch.ones(1, dtype=torch.int64, device=hyp.device) << torch.arange(m, device=hyp.device)
    zero = (Vs.unsqueeze(2) & bit) == 0  # (B, n+1, m)
    L = torch.zeros(B, n + 1, m + 1, dtype=torch.int16, device=hyp.device)
    torch.cumsum(zero, dim=2, dtype=torch.int16, out=L[:, :, 1:])
    return L


def lcs_table(hyp: Tensor, tgt: Tensor) -> Tensor:
    """(B, n+1, m+1) int16 LCS lengths of hyp[b, :i] and tgt[b, :j] (padding compared like any token:
    read the table at the real lengths)."""
    if tgt.size(1) <= _BITS:
        return _lcs_table_bitparallel(hyp, tgt)
    return _lcs_table_rows(hyp.unsqueeze(2) == tgt.unsqueeze(1))


def _lcs_table_rows(eq: Tensor) -> Tensor:
    """The same table for any m, one row per hypothesis token:
    L[i, j] = max_{k <= j} max(L[i-1, k], L[i-1, k-1] + eq)."""
    B, n, m = eq.shape
    L = torch.zeros(B, n + 1, m + 1, dtype=torch.int16, device=eq.device)
    for i in range(1, n + 1):
        prev = L[:, i - 1]
        E = prev.clone()
        torch.maximum(E[:, 1:], prev[:, :-1] + eq[:, i - 1], out=E[:, 1:])
        L[:, i] = torch.cummax(E, dim=1).values
    return L


def edit_distance_table(hyp: Tensor, tgt: Tensor) -> Tensor:
    """(B, n+1, m+1) insertion/deletion distances D[b, i, j] = i + j - 2 LCS(hyp[b, :i], tgt[b, :j])."""
    n, m = hyp.size(1), tgt.size(1)
    i = torch.arange(n + 1, device=hyp.device, dtype=torch.int32).view(1, -1, 1)
    j = torch.arange(m + 1, device=hyp.device, dtype=torch.int32).view(1, 1, -1)
    return i + j - 2 * lcs_table(hyp, tgt).to(torch.int32)


def levenshtein_oracle(hyp: Tensor, tgt: Tensor, pad: int, mask: int) -> EditOracle:
    """Expert edits turning each hypothesis into its target.  hyp (B, n), tgt (B, m), right-padded
    with ``pad`` (real tokens may be anything, including special symbols).

    The backtrace visits one hypothesis row per step: in row i the walk moves left (insertions) from
    its column j to the nearest column k <= j where a match or a deletion is optimal, then matches
    (to row i-1, column k-1) or deletes (to row i-1, column k).  For targets up to 62 tokens a step
    works on two bit words per sequence (``_walk_bitparallel``); longer targets precompute the next
    column for every cell of the table and take one gather per row (``_walk_table``)."""
    B, n = hyp.shape
    m = tgt.size(1)
    dev = hyp.device
    W = m + 1
    hyp_len = hyp.ne(pad).sum(1)
    tgt_len = tgt.ne(pad).sum(1)
    if m <= _BITS:
        keep_hyp, match_col = _walk_bitparallel(_match_bits(hyp, tgt), m, hyp_len, tgt_len)
    else:
        keep_hyp, match_col = _walk_table(hyp.unsqueeze(2) == tgt.unsqueeze(1), hyp_len, tgt_len)
    distance = hyp_len + tgt_len - 2 * keep_hyp.sum(1)
    keep_tgt = torch.zeros(B, W, dtype=torch.bool, device=dev)
    keep_tgt.scatter_(1, torch.where(keep_hyp, match_col, 0), keep_hyp)
    keep_tgt = keep_tgt[:, 1:]  # column j holds target token j-1
    real_hyp = hyp.ne(pad)
    del_labels = (real_hyp & ~keep_hyp).long()
    # slot of each unmatched target token = number of kept target tokens before it
    slot = torch.cumsum(keep_tgt.long(), dim=1)
    inserted = tgt.ne(pad) & ~keep_tgt
    ins_counts = torch.zeros(B, m + 1, dtype=torch.long, device=dev)
    ins_counts.scatter_add_(1, slot, inserted.long())
    masked_tgt = torch.where(inserted, torch.full_like(tgt, mask), tgt)
    return EditOracle(distance, del_labels, keep_tgt, ins_counts, masked_tgt)


def _walk_bitparallel(match_bits: Tensor, m: int, hyp_len: Tensor, tgt_len: Tensor):
    """(keep_hyp (B, n) bool, match_col (B, n) long: 1-based target column of each kept token) for
    m <= 62 from the (B, n) match words of :func:`_match_bits`; no (B, n, m) tensor at all.

    Row i (hypothesis token i, 1-based) in bits, with z_i = zero bits of V_i (L grows there):
      dv = prefix parity of V_{i-1} ^ V_i: bit j-1 = L[i, j] - L[i-1, j]            (0 or 1)
      deletion optimal at column j  <=>  dv bit j-1 is 0, or j = 0                 -> bit j of ``dele``
      match optimal at column j     <=>  h_i == t_j and L[i, j] = L[i-1, j-1] + 1,
                                         i.e. bit j-1 of  M_i & (dv | z_{i-1})     -> column j
    The walk enters row i at column j, goes left to the highest column k <= j where either holds,
    matches there if it can (to column k-1), else deletes (stays at column k).  Rows past a
    hypothesis's end delete everywhere and match nowhere, so the walk passes them unchanged.  The
    state is e = j + 1 (columns 0..j are the bits below e); the highest set bit is read from the
    float64 exponent field (exact below 2^53, one correction step above): a handful of in-place
    operations on (B,) tensors per row."""
    B, n = match_bits.shape
    dev = match_bits.device
    Vs = _bit_rows(match_bits, m)
    full = (1 << m) - 1
    dv = Vs[:, 1:] ^ Vs[:, :-1]
    for shift in (1, 2, 4, 8, 16, 32):  # shifts wrap (int64): bits past m are masked off below
        dv = dv ^ (dv << shift)
    dv = dv & full
    active = torch.arange(n, device=dev) < hyp_len.unsqueeze(1)  # (B, n): row within the hypothesis
    dele = torch.where(active, ((full ^ dv) << 1) | 1, -1)
    # match column j sits at bit j + 1 of ``match`` (so ``>> e`` reads column e - 1), at bit j of ``stop``
    match = torch.where(active, (match_bits & (dv | ~Vs[:, :-1])) << 2, 0)
    stop, match = (dele | (match >> 1)).unbind(1), match.unbind(1)
    below = (torch.ones(1, dtype=torch.int64, device=dev) << torch.arange(m + 2, device=dev)) - 1  # below[e]: bits < e
    exact = m + 1 <= 53
    as_float = torch.empty(B, dtype=torch.float64, device=dev)
    e = tgt_len + 1
    keep, entry = [None] * n, [None] * n
    for i in range(n - 1, -1, -1):
        x = torch.bitwise_and(stop[i], torch.take(below, e))
        k1 = torch.bitwise_right_shift(as_float.copy_(x).view(torch.int64), 52).sub_(1022)  # top bit + 1
        if not exact:
            k1.sub_(torch.bitwise_right_shift(x, k1 - 1).eq(0).long())
        keep[i] = torch.bitwise_right_shift(match[i], k1).bitwise_and_(1)
        e = entry[i] = k1.sub_(keep[i])
    keep = torch.stack(keep, 1)
    return keep.bool(), torch.stack(entry, 1) + keep - 1


def _walk_table(eq: Tensor, hyp_len: Tensor, tgt_len: Tensor):
    """The same walk over the full LCS table (any target length)."""
    B, n, m = eq.shape
    dev = eq.device
    W = m + 1
    L = _lcs_table_rows(eq)  # (B, n+1, W); distance D = i + j - 2 L
    # can_match[i-1, j] (cells i >= 1): h[i] == t[j] and the diagonal keeps the distance (L grows)
    can_match = torch.zeros(B, n, W, dtype=torch.bool, device=dev)
    can_match[:, :, 1:] = eq & (L[:, :-1, :-1] != L[:, 1:, 1:])
    can_delete = L[:, :-1] == L[:, 1:]  # (B, n, W): D grows by one; always true at j = 0
    # k(i, j): nearest column <= j of row i where the walk stops (always exists: column 0 deletes).
    # With cnt = running count of stop columns, k(i, j) is the cnt[j]-th stop column of the row.
    stop = can_match | can_delete
    cnt = torch.cumsum(stop, dim=2)  # (B, n, W), >= 1
    cols = torch.arange(W, device=dev).expand_as(cnt)
    nth_stop = torch.zeros(B, n, W + 1, dtype=torch.long, device=dev)
    nth_stop.scatter_(2, torch.where(stop, cnt, 0), cols)  # index 0 collects the non-stops
    k = nth_stop.gather(2, cnt)  # (B, n, W)
    matched_at = can_match.gather(2, k)
    # next column when entering row i at column j; rows beyond a hypothesis's length keep j
    rows = torch.arange(1, n + 1, device=dev)
    beyond = (rows.view(1, -1) > hyp_len.view(-1, 1)).unsqueeze(2)
    nxt = torch.where(beyond, cols, k - matched_at.long())
    j = tgt_len.unsqueeze(1)
    entry = [j] * (n + 1)  # entry[i]: column at which the walk enters row i
    for i in range(n, 0, -1):
        j = nxt[:, i - 1].gather(1, j)
        entry[i - 1] = j
    entry_col = torch.cat(entry[1:], 1).unsqueeze(2)  # (B, n, 1)
    keep_hyp = matched_at.gather(2, entry_col).squeeze(2) & ~beyond.squeeze(2)
    return keep_hyp, k.gather(2, entry_col).squeeze(2)


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
