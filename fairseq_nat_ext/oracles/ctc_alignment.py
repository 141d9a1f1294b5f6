"""The CTC lattice on tensors (CPU or CUDA): feasibility, best (Viterbi) alignment, collapse, and the
restriction of a lattice to a partially observed alignment (the Imputer's loss).

Notation.  An *alignment* a of length T over the vocabulary plus ``blank`` spells the target y when
collapsing it -- merge adjacent repeats, then drop blanks -- gives y.  The lattice runs over the
extended label sequence l' = (blank, y1, blank, y2, ..., yS, blank) of length 2S + 1: at every step a
path stays on its state, moves to the next one, or skips a blank between two *different* tokens.

Feasibility.  An alignment of y needs at least S + R positions, R = number of adjacent repeats in y
(``y_i == y_{i-1}``), because a blank must separate two equal neighbours.  Shorter inputs have no
alignment: torch's ``ctc_loss`` returns inf for them; callers filter with :func:`ctc_feasible`.

Viterbi (:func:`ctc_best_alignment`).  delta[t, s] = lp[t, l'_s] + max(delta[t-1, s], delta[t-1, s-1],
delta[t-1, s-2] when l'_s is a token different from l'_{s-2}); the whole batch moves one time step per
iteration (the only Python loop is over time), rows shorter than the longest keep their state, and
the backtrace walks every row together.  Ties between predecessors go to the lowest shift (stay, then
step, then skip) and between the two final states to the one ending in blank.
"""

import torch

Tensor = torch.Tensor


def target_repeats(targets: Tensor, target_lengths: Tensor) -> Tensor:
    """targets (B, S) right-padded, target_lengths (B,) -> (B,) number of i with y_i == y_{i-1}."""
    if targets.size(1) < 2:
        return target_lengths.new_zeros(target_lengths.shape)
    pos = torch.arange(1, targets.size(1), device=targets.device)
    inside = pos.unsqueeze(0) < target_lengths.unsqueeze(1)  # (B, S-1)
    return ((targets[:, 1:] == targets[:, :-1]) & inside).sum(1)


def ctc_min_input_length(targets: Tensor, target_lengths: Tensor) -> Tensor:
    """(B,) the shortest alignment of each target: S + number of adjacent repeats."""
    return target_lengths + target_repeats(targets, target_lengths)


def ctc_feasible(input_lengths: Tensor, targets: Tensor, target_lengths: Tensor) -> Tensor:
    """bool (B,): True where an alignment of ``input_lengths`` positions can spell the target."""
    return input_lengths >= ctc_min_input_length(targets, target_lengths)


def extended_labels(targets: Tensor, target_lengths: Tensor, blank: int):
    """-> (labels (B, 2S+1): blank, y1, blank, ..., yS, blank; skip (B, 2S+1) bool: a path may come
    from s-2 (l'_s is a token different from l'_{s-2}); valid (B, 2S+1): s <= 2 * S_b)."""
    B, S = targets.shape
    labels = targets.new_full((B, 2 * S + 1), blank)
    labels[:, 1::2] = targets
    pos = torch.arange(2 * S + 1, device=targets.device).unsqueeze(0)
    valid = pos <= 2 * target_lengths.unsqueeze(1)
    labels = labels.masked_fill(~valid, blank)
    skip = torch.zeros_like(valid)
    if S > 1:
        skip[:, 2:] = (labels[:, 2:] != blank) & (labels[:, 2:] != labels[:, :-2])
    return labels, skip & valid, valid


def ctc_best_alignment(lprobs: Tensor, input_lengths: Tensor, targets: Tensor, target_lengths: Tensor,
                       blank: int, pad: int = None):
    """Best alignment of every target under per-position log-probabilities.

    lprobs (B, T, V) log-probabilities (any real scores work: the path score is their sum);
    input_lengths (B,) <= T; targets (B, S) right-padded; target_lengths (B,).
    Returns (alignment (B, T) long -- ``pad`` (default ``blank``) beyond each input length --,
    score (B,) = the best path's summed log-probability; -inf for infeasible rows, whose alignment
    is meaningless: filter them with :func:`ctc_feasible`)."""
    B, T, _ = lprobs.shape
    dev = lprobs.device
    pad = blank if pad is None else pad
    labels, skip, valid = extended_labels(targets, target_lengths, blank)
    S2 = labels.size(1)
    neg = torch.tensor(float("-inf"), dtype=lprobs.dtype, device=dev)
    emit = lprobs.gather(2, labels.unsqueeze(1).expand(B, T, S2))  # (B, T, 2S+1)

    delta = torch.full((B, S2), float("-inf"), dtype=lprobs.dtype, device=dev)
    delta[:, 0] = emit[:, 0, 0]
    if S2 > 1:
        delta[:, 1] = torch.where(target_lengths > 0, emit[:, 0, 1], neg)
    back = torch.zeros((T, B, S2), dtype=torch.uint8, device=dev)  # 0 stay, 1 step, 2 skip
    for t in range(1, T):
        step = torch.cat([delta.new_full((B, 1), float("-inf")), delta[:, :-1]], 1)
        jump = torch.cat([delta.new_full((B, 2), float("-inf")), delta[:, :-2]], 1)[:, :S2]
        jump = torch.where(skip, jump, neg)
        best, choice = torch.stack([delta, step, jump], -1).max(-1)  # first max on ties
        new = torch.where(valid, best + emit[:, t], neg)
        live = (t < input_lengths).unsqueeze(1)
        delta = torch.where(live, new, delta)
        back[t] = torch.where(live, choice, torch.zeros_like(choice)).to(torch.uint8)

    rows = torch.arange(B, device=dev)
    last_blank = 2 * target_lengths
    last_token = (last_blank - 1).clamp(min=0)
    end_blank = delta[rows, last_blank]
    end_token = torch.where(target_lengths > 0, delta[rows, last_token], neg)
    take_token = end_token > end_blank
    state = torch.where(take_token, last_token, last_blank)
    score = torch.maximum(end_blank, end_token)

    alignment = labels.new_empty((B, T))
    for t in range(T - 1, -1, -1):
        alignment[:, t] = labels[rows, state]
        if t > 0:
            state = state - back[t, rows, state].long()
    inside = torch.arange(T, device=dev).unsqueeze(0) < input_lengths.unsqueeze(1)
    return alignment.masked_fill(~inside, pad), score


def ctc_collapse(alignment: Tensor, lengths: Tensor, blank: int, pad: int):
    """Merge adjacent repeats, then drop blanks.

    alignment (B, T), lengths (B,) -> (tokens (B, M) right-padded with ``pad``, out_lengths (B,),
    emitted (B, T) bool: the positions whose token is kept)."""
    B, T = alignment.shape
    inside = torch.arange(T, device=alignment.device).unsqueeze(0) < lengths.unsqueeze(1)
    prev = torch.cat([alignment.new_full((B, 1), -1), alignment[:, :-1]], 1)
    emitted = inside & alignment.ne(blank) & alignment.ne(prev)
    out_lengths = emitted.sum(1)
    M = int(out_lengths.max()) if B > 0 else 0
    tokens = alignment.new_full((B, M), pad)
    slot = emitted.long().cumsum(1) - 1
    rows = torch.arange(B, device=alignment.device).unsqueeze(1).expand(B, T)
    tokens[rows[emitted], slot[emitted]] = alignment[emitted]
    return tokens, out_lengths, emitted


def alignment_token_scores(position_scores: Tensor, alignment: Tensor, lengths: Tensor, blank: int):
    """Split an alignment's per-position scores among the tokens it spells.

    Position t goes to the token it emits or repeats; a blank goes to the next emitted token, and
    blanks after the last token go to the end (``</s>``).  Returns (B, M + 1) summing to the
    alignment's total score; row b's scores are ``out[b, :n_b + 1]`` (n_b tokens, then ``</s>``;
    M = the longest collapsed output of the batch)."""
    B, T = alignment.shape
    inside = torch.arange(T, device=alignment.device).unsqueeze(0) < lengths.unsqueeze(1)
    _, out_lengths, emitted = ctc_collapse(alignment, lengths, blank, pad=0)
    count = emitted.long().cumsum(1)  # tokens emitted up to and including t
    owner = torch.where(alignment.eq(blank), count, count - 1).clamp(min=0)
    M = int(out_lengths.max()) if B > 0 else 0
    out = position_scores.new_zeros((B, M + 1))
    out.scatter_add_(1, owner, position_scores.masked_fill(~inside, 0))
    return out


def restrict_to_observed(lprobs: Tensor, alignment: Tensor, observed: Tensor, neg: float = -1e4):
    """The lattice of the alignments that agree with ``alignment`` where ``observed``.

    lprobs (B, T, V), alignment (B, T) (ids < V where observed), observed bool (B, T) -> (B, T, V) with, at observed
    positions, 0 for the observed token and ``neg`` elsewhere (a constant: no gradient reaches the
    model there).  CTC over the result sums, over the alignments that spell the target *and* agree
    with the observation, the product of the model's probabilities at the unobserved positions.
    ``neg`` is finite (exp underflows to exactly 0 in float16/32/64) so that no -inf - -inf = NaN
    appears in torch's CTC backward."""
    fixed = torch.full_like(lprobs, neg)
    index = torch.where(observed, alignment, torch.zeros_like(alignment))  # padding may be any id
    fixed.scatter_(2, index.unsqueeze(-1), 0.0)
    return torch.where(observed.unsqueeze(-1), fixed, lprobs)
