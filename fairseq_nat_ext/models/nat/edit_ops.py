"""Batched edit operations on right-padded token tensors (shared by edit-based models and decoders).

Every row is ``<s> ... </s>`` followed by padding.  Nothing here loops over tokens.
"""

import torch

Tensor = torch.Tensor


def with_bos(target: Tensor, bos: int) -> Tensor:
    """Dataset target (B, T) ``... </s>`` -> ``<s> ... </s>``."""
    return torch.cat([target.new_full((target.size(0), 1), bos), target], 1)


def trim(tokens: Tensor, pad: int) -> Tensor:
    """Drop all-padding columns on the right."""
    width = int(tokens.ne(pad).sum(1).max()) if tokens.numel() else 0
    return tokens[:, :max(width, 1)]


def delete_tokens(tokens: Tensor, delete: Tensor, pad: int, bos: int, eos: int) -> Tensor:
    """Remove the tokens where ``delete`` is True (``<s>``, ``</s>`` and padding are never removed);
    the kept tokens close up to the left in order."""
    keep = tokens.ne(pad) & ~(delete & tokens.ne(bos) & tokens.ne(eos))
    order = torch.sort((~keep).to(torch.uint8), dim=1, stable=True).indices
    out = tokens.gather(1, order).masked_fill(~keep.gather(1, order), pad)
    return trim(out, pad)


def pad_to(t: Tensor, width: int, value) -> Tensor:
    """(B, T) -> (B, width): right-padded with ``value`` (width >= T)."""
    return torch.nn.functional.pad(t, (0, width - t.size(1)), value=value)


def rows_equal(a: Tensor, b: Tensor, pad: int) -> Tensor:
    """bool (B,): row b of ``a`` holds the same tokens as row b of ``b`` (right padding of any width)."""
    w = max(a.size(1), b.size(1))
    return pad_to(a, w, pad).eq(pad_to(b, w, pad)).all(1)


def insert_placeholders(tokens: Tensor, counts: Tensor, pad: int, mask: int, max_len: int = None) -> Tensor:
    """Insert ``counts[b, k]`` placeholders (``mask``) between token k and k+1 of each row.

    tokens (B, T), counts (B, T-1) (slots past the row's last token are ignored).  With ``max_len``
    (an int, or a (B,) tensor of per-row limits) the insertions are cut, left to right, so that no row
    grows beyond ``max_len`` tokens."""
    B, T = tokens.shape
    real = tokens.ne(pad)
    length = real.sum(1)
    slot_ok = torch.arange(T - 1, device=tokens.device).unsqueeze(0) < (length - 1).unsqueeze(1)
    counts = counts.clamp_min(0) * slot_ok
    if max_len is not None:
        budget = (max_len - length).clamp_min(0).unsqueeze(1)
        before = torch.cumsum(counts, 1) - counts
        counts = torch.minimum(counts, (budget - before).clamp_min(0))
    shift = torch.cat([counts.new_zeros(B, 1), torch.cumsum(counts, 1)], 1)  # before token k
    new_pos = torch.arange(T, device=tokens.device).unsqueeze(0) + shift
    new_len = length + counts.sum(1)
    width = int(new_len.max()) if B else 1
    out = torch.full((B, width), pad, dtype=tokens.dtype, device=tokens.device)
    out.masked_fill_(torch.arange(width, device=tokens.device).unsqueeze(0) < new_len.unsqueeze(1), mask)
    rows = torch.arange(B, device=tokens.device).unsqueeze(1).expand(B, T)
    out[rows[real], new_pos[real]] = tokens[real]
    return out


def fill_placeholders(tokens: Tensor, predicted: Tensor, mask: int) -> Tensor:
    """Replace every ``mask`` by the prediction at that position (predicted: (B, T) or the (K,)
    predictions of the K masked positions in row-major order)."""
    where = tokens.eq(mask)
    out = tokens.clone()
    out[where] = predicted[where] if predicted.shape == tokens.shape else predicted
    return out


def random_delete(tokens: Tensor, pad: int, bos: int, eos: int, generator=None, keep_complete=True) -> Tensor:
    """Random deletion noise: each row keeps a uniformly drawn number k of its n content tokens, a
    uniformly random subset of that size, in order.  ``keep_complete``: k ~ U{0..n} (Stern et al.
    2019's canvas); otherwise k ~ U{0..n-1} as fairseq's ``translation_lev`` (never the complete
    target; a row without content keeps nothing either way)."""
    content = tokens.ne(pad) & tokens.ne(bos) & tokens.ne(eos)
    n = content.sum(1)
    span = n + 1 if keep_complete else n
    keep_n = (torch.rand(n.shape, device=tokens.device, generator=generator) * span.float()).floor().long()
    score = torch.rand(tokens.shape, device=tokens.device, generator=generator).masked_fill(~content, 2.0)
    rank = score.argsort(1).argsort(1)  # content tokens get ranks 0..n-1 in random order
    delete = content & (rank >= keep_n.unsqueeze(1))
    return delete_tokens(tokens, delete, pad, bos, eos)


def spread_scores(scores: Tensor, old: Tensor, new: Tensor, mask: int, pad: int) -> Tensor:
    """Per-token scores of ``old`` (N, T) follow their tokens into ``new``, the rows grown by
    ``insert_placeholders`` (placeholders and padding get 0 until filled)."""
    out = scores.new_zeros(new.shape)
    kept = new.ne(mask) & new.ne(pad)
    out[kept] = scores[old.ne(pad)]
    return out
