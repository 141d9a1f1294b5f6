"""Building blocks shared by the attention variants.

A *partial* attention is the softmax attention of every query over one subset of keys, returned as
``(out, lse)``: ``out`` (B, H, N, d) normalised within the subset and ``lse`` (B, H, N) the
log-sum-exp of the subset's scores (-inf where a query has no key in it).  Partials over DISJOINT key
subsets combine exactly into the softmax over their union with :func:`merge_partials`; that is how a
window, global keys, random blocks, ... form one attention distribution without an N x N tensor.
"""

import math
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def valid_keys(lengths: Tensor, n: int) -> Tensor:
    """(B, n) bool, True at real (non-padding) positions of a right-aligned batch."""
    return torch.arange(n, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


def masked_softmax(scores: Tensor, allowed: Tensor, dropout: float = 0.0, training: bool = False
                   ) -> Tuple[Tensor, Tensor]:
    """Softmax over the last dim restricted to ``allowed``; returns (probs, lse).

    Rows without any allowed entry get all-zero probabilities and lse = -inf (and no NaN in the
    backward pass).  Computed in float32 for half-precision inputs.
    """
    dtype = scores.dtype
    s = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    safe = lse.masked_fill(torch.isinf(lse), 0.0)
    probs = torch.exp(s - safe.unsqueeze(-1)).masked_fill(~allowed, 0.0)
    if dropout > 0.0 and training:
        probs = F.dropout(probs, p=dropout, training=True)
    return probs.to(dtype), lse


def merge_partials(parts: List[Tuple[Tensor, Tensor]]) -> Tensor:
    """Exact softmax attention over the union of the disjoint key subsets of ``parts``."""
    if len(parts) == 1:
        return parts[0][0]
    lses = torch.stack([lse for _, lse in parts])  # (P, B, H, N)
    total = torch.logsumexp(lses, dim=0)
    safe = total.masked_fill(torch.isinf(total), 0.0)
    weights = torch.exp(lses - safe.unsqueeze(0))
    out = 0
    for w, (o, _) in zip(weights, parts):
        out = out + w.unsqueeze(-1).to(o.dtype) * o
    return out


def dense_partial(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, dropout: float = 0.0,
                  training: bool = False) -> Tuple[Tensor, Tensor]:
    """q (B, H, N, d) over a SMALL key set k, v (B, H, M, d); ``allowed`` broadcasts to (B, H, N, M)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    probs, lse = masked_softmax(scores, allowed, dropout, training)
    return torch.matmul(probs, v), lse


def local_partial(q: Tensor, k: Tensor, v: Tensor, lengths: Tensor, radius: int, min_key: int = 0,
                  dropout: float = 0.0, training: bool = False) -> Tuple[Tensor, Tensor]:
    """Each query i over the keys j with |i - j| <= radius, j >= min_key, j < length (blocked).

    The sequence is cut into blocks of w = radius positions; query block b reads key blocks b-1, b, b+1
    (3w keys), so time and memory are O(N * 3w) and no N x N tensor is built.
    """
    B, H, N, d = q.shape
    w = max(1, min(radius, N))
    nb = -(-N // w)
    L = nb * w
    qb = F.pad(q, (0, 0, 0, L - N)).view(B, H, nb, w, d)
    kw = F.pad(k, (0, 0, w, L - N + w)).unfold(2, 3 * w, w)  # (B, H, nb, d, 3w)
    vw = F.pad(v, (0, 0, w, L - N + w)).unfold(2, 3 * w, w)
    scores = torch.einsum("bhnid,bhndj->bhnij", qb, kw) / math.sqrt(d)  # (B, H, nb, w, 3w)
    allowed = window_mask(lengths, N, w, radius, min_key)  # (B, nb, w, 3w)
    probs, lse = masked_softmax(scores, allowed.unsqueeze(1), dropout, training)
    out = torch.einsum("bhnij,bhndj->bhnid", probs, vw).reshape(B, H, L, d)[:, :, :N]
    return out, lse.reshape(B, H, L)[:, :, :N]


def fused_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, dropout: float = 0.0,
                    training: bool = False) -> Tensor:
    """softmax(q k^T / sqrt(d)) v over the ``allowed`` keys by torch's fused kernel (no score matrix is
    kept: memory O(queries * d) on CPU and CUDA).  q (X, Y, Nq, d), k/v (X, Y, M, d), ``allowed``
    bool broadcasting to (X, Y, Nq, M), or None for all keys.  Every query row must allow at least
    one key (a fully masked row is NaN in the fused kernels)."""
    # the fused kernels need unit stride on the last dim; otherwise torch silently takes its math path,
    # which builds the whole score matrix
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout if training else 0.0)


def with_a_key_per_row(allowed: Tensor) -> Tensor:
    """``allowed`` (..., M) with every row that allows no key opened to all its keys: such rows belong
    to padding queries, whose output is discarded, and the fused kernels need one key per row."""
    return allowed | ~allowed.any(-1, keepdim=True)


def to_blocks(x: Tensor, w: int) -> Tensor:
    """(B, H, N, d) -> (B * nb, H, w, d), blocks of w positions (the last one zero-padded)."""
    B, H, N, d = x.shape
    nb = -(-N // w)
    return F.pad(x, (0, 0, 0, nb * w - N)).view(B, H, nb, w, d).transpose(1, 2).reshape(B * nb, H, w, d)


def from_blocks(y: Tensor, B: int, N: int) -> Tensor:
    """Inverse of :func:`to_blocks`: (B * nb, H, w, d) -> (B, H, N, d)."""
    _, H, w, d = y.shape
    return y.view(B, -1, H, w, d).transpose(1, 2).reshape(B, H, -1, d)[:, :, :N]


def window_blocks(x: Tensor, w: int, reach: int = 1) -> Tensor:
    """(B, H, N, d) -> (B * nb, H, (2 reach + 1) w, d): for query block b the keys of blocks
    b - reach .. b + reach (zeros outside the sequence); (2 reach + 1)x the input's memory, never N x N."""
    B, H, N, d = x.shape
    nb = -(-N // w)
    span = (2 * reach + 1) * w
    win = F.pad(x, (0, 0, reach * w, nb * w - N + reach * w)).unfold(2, span, w)  # (B, H, nb, d, span)
    return win.permute(0, 2, 1, 4, 3).reshape(B * nb, H, span, d)


def window_parts(lengths: Tensor, n: int, w: int, radius: int, min_key: int = 0, reach: int = 1):
    """The pieces of :func:`window_mask`, never (nb, w, span) integers: the band (w, span) bool, the same for
    every block (|i - j| <= radius); key_ok (B, nb, span), min_key <= j < length; pad_query (B, nb, w), i >= length."""
    nb = -(-n // w)
    dev = lengths.device
    span = (2 * reach + 1) * w
    i, j = torch.arange(w, device=dev), torch.arange(span, device=dev)
    band = (j.view(1, span) - reach * w - i.view(w, 1)).abs() <= radius
    kpos = (torch.arange(nb, device=dev) * w - reach * w).view(nb, 1) + j.view(1, span)  # (nb, span)
    length = lengths.view(-1, 1, 1)
    key_ok = (kpos >= max(min_key, 0)).unsqueeze(0) & (kpos.unsqueeze(0) < length)
    pad_query = torch.arange(nb * w, device=dev).view(1, nb, w) >= length
    return band, key_ok, pad_query


def window_mask(lengths: Tensor, n: int, w: int, radius: int, min_key: int = 0, reach: int = 1) -> Tensor:
    """(B, nb, w, (2 reach + 1) w) bool for :func:`window_blocks`: query i sees key j when
    |i - j| <= radius, min_key <= j < length.  A padding query sees its whole window (its output is
    discarded; the fused kernels need one allowed key per row)."""
    band, key_ok, pad_query = window_parts(lengths, n, w, radius, min_key, reach)
    return (band[None, None] & key_ok.unsqueeze(2)) | pad_query.unsqueeze(-1)


def window_layout(radius: int, n: int, block: int = 0):
    """(block size w, reach) covering |i - j| <= radius: w = ``block`` (default radius / 4, at least 1),
    reach = ceil(radius / w) key blocks on each side.  A query block reads (2 reach + 1) w keys for the
    2 radius + 1 it needs: w = radius / 4 reads 9/8 of them, radius / 2 5/4 (N = 16384, radius 256, CPU:
    the window's kernel calls 0.73-0.83 s vs 0.82-0.94 s forward + backward; radius / 8 was slower)."""
    w = max(1, min(block or -(-radius // 4), n))
    return w, -(-radius // w) if radius > 0 else 0


def gather_positions(x: Tensor, index: Tensor) -> Tensor:
    """x (B, H, N, d), index (B, H, M) -> (B, H, M, d)."""
    return x.gather(2, index.unsqueeze(-1).expand(*index.shape, x.size(-1)))


def scatter_positions(values: Tensor, index: Tensor, n: int) -> Tensor:
    """Inverse of :func:`gather_positions` for a permutation ``index`` of 0..n-1 (M == n)."""
    out = values.new_zeros(*values.shape[:2], n, values.size(-1))
    return out.scatter(2, index.unsqueeze(-1).expand_as(values), values)


def in_recomputation() -> bool:
    """True while autograd runs a backward pass.  The one forward that runs then in fairseq is activation
    checkpointing (fairseq's ``--checkpoint-activations`` or ``torch.utils.checkpoint``, reentrant or not)
    recomputing a layer; a forward called from a backward hook or a custom ``Function.backward`` would count
    as a recomputation too.  Variants
    with state (routing's centroids, the Performer's redraw counter) change it only outside such a
    recomputation, so the recomputed forward sees the state the original forward saw and the state
    advances once per training forward."""
    return torch._C._current_graph_task_id() != -1


def check_max_positions(n: int, max_positions: int, name: str) -> None:
    if n > max_positions:
        from fairseq_nat_ext.compat import InputError

        raise InputError(
            f"{name} attention: input of {n} tokens is longer than --max-positions {max_positions} "
            "(its parameters are tied to positions); raise --max-positions or shorten the input")
