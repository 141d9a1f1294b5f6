"""Decoder states -> vocabulary logits, computed the fast way round on CPU at inference.

NAT decoding projects a few rows at a time (the masked positions of a handful of candidates) onto a
large vocabulary.  On CPU, torch's ``linear`` (x @ W^T, x (M, d), W (V, d)) is markedly slower there
than the same product computed as (W @ x^T)^T: measured here with 2 threads, V = 9,817, d = 256:
M = 20: 4.0 vs 2.4 ms, M = 256: 26 vs 14 ms, M = 4,096: 379 vs 307 ms; Mask-Predict iter=10 at batch 1
went from 196 to 163 ms per sentence.  The logits come back as the transposed view of that product
(no copy; softmax over the last dimension reads it through its strides).  Where oneDNN's prepacked product is
available (:mod:`.cpu_linear`, faster still for few rows) it is used instead.  Training (autograd on),
CUDA and adaptive softmax keep the decoder's own ``output_layer``.
"""

import torch
from torch import Tensor, nn

from . import cpu_linear


def vocab_logits(decoder, feats: Tensor) -> Tensor:
    """(..., d) decoder states -> (..., V) logits, equal to ``decoder.output_layer(feats)``."""
    proj = getattr(decoder, "output_projection", None)
    if (getattr(decoder, "adaptive_softmax", None) is not None or not isinstance(proj, nn.Linear)
            or feats.device.type != "cpu" or torch.is_grad_enabled() or feats.dim() < 1):
        return decoder.output_layer(feats)
    W = proj.weight
    x = feats.reshape(-1, feats.size(-1))
    if cpu_linear.usable(x, W):
        return cpu_linear.linear(x, W, proj.bias).reshape(*feats.shape[:-1], W.size(0))
    if proj.bias is not None:
        y = torch.addmm(proj.bias.unsqueeze(1), W, x.t())
    else:
        y = torch.mm(W, x.t())
    return y.t().reshape(*feats.shape[:-1], W.size(0))


#: values per group of :func:`first_max`; rows below which it keeps torch's ``max``
FIRST_MAX_GROUP, FIRST_MAX_ROWS = 128, 64


def first_max(values: Tensor, group: int = FIRST_MAX_GROUP):
    """``values.max(-1)`` of a 2-D float tensor (M, V) -> (maximum (M,), index (M,)): the first index
    among equal maxima, as torch documents for ``max``.

    On CPU torch's maximum-with-index reduction is slow -- measured on the benchmark machine (2 threads,
    V = 9,817): 625 us for 150 rows, against 51 us for the maximum alone (``amax``).  Here: the maxima of
    consecutive groups of ``group`` values (``amax``), the first group holding the row's maximum, and the
    first position inside it that equals the maximum -- the same value and index (193 us for those 150
    rows).  Fewer than ``FIRST_MAX_ROWS`` rows (a Mask-Predict pass at batch 1: its ten more operations
    cost what they save; measured in one process over 200 sentences, no gain), fewer than ``2 * group``
    columns, rows holding a NaN, values that need a gradient (``amax`` spreads it over tied maxima),
    CUDA and other layouts: torch's ``max``."""
    if (values.dim() != 2 or values.device.type != "cpu" or values.size(1) < 2 * group
            or values.size(0) < FIRST_MAX_ROWS or values.requires_grad):
        return values.max(-1)
    M, V = values.shape
    whole = V // group * group
    groups = values[:, :whole].reshape(M, whole // group, group).amax(-1)
    if whole < V:
        groups = torch.cat([groups, values[:, whole:].amax(-1, keepdim=True)], 1)
    best = groups.amax(-1, keepdim=True)  # (M, 1)
    if bool(best.isnan().any()):
        return values.max(-1)
    start = (groups == best).to(torch.uint8).argmax(-1) * group  # the first group holding the maximum
    at = (start.unsqueeze(1) + torch.arange(group, device=values.device)).clamp_(max=V - 1)
    first = (values.gather(1, at) == best).to(torch.uint8).argmax(-1)
    return best.squeeze(1), start + first


#: decoder states per block in :func:`best_vocab_tokens`: a (V, 64) block of logits stays in cache
BEST_TOKEN_BLOCK = 64


def best_vocab_tokens(decoder, feats: Tensor, forbidden, block=BEST_TOKEN_BLOCK):
    """(M, d) decoder states -> (log-prob (M,) float32, token (M,)) of each state's most probable
    token other than ``forbidden``; the log-probs are normalised over the whole vocabulary, as
    ``log_softmax(logits).max(-1)`` after setting ``forbidden`` to -inf.

    Decoding needs only these two numbers, so the (M, V) log-probs are never materialised: the states
    are projected in blocks of ``block`` (the logits of a block stay in cache; on a (M, V) tensor,
    log_softmax and max each read and write all M * V values in memory; measured here, V = 9,817,
    d = 256, 2,000 states: 147 ms instead of 245-289 ms), each block reduced by torch's own
    ``log_softmax`` over its last dimension (measured on the benchmark machine, 18 states: 142 us with
    torch's ``max``, against 196 us for a separate maximum-with-index and exp-sum over the block) and
    :func:`first_max` (torch's maximum-with-index, the slow part: 269 us for a block of 64 states,
    :func:`first_max` 113 us).  Without autograd on CPU with a plain projection; otherwise the same
    through :func:`vocab_logits`."""
    proj = getattr(decoder, "output_projection", None)
    forbidden = torch.as_tensor(forbidden, dtype=torch.long, device=feats.device)
    if (getattr(decoder, "adaptive_softmax", None) is not None or not isinstance(proj, nn.Linear)
            or feats.device.type != "cpu" or torch.is_grad_enabled() or feats.dim() != 2):
        lp = torch.log_softmax(vocab_logits(decoder, feats).float(), -1)
        lp[..., forbidden] = float("-inf")
        return lp.max(-1)
    W, b = proj.weight, proj.bias
    M = feats.size(0)
    best_lp = torch.empty(M, dtype=torch.float, device=feats.device)
    best_tok = torch.empty(M, dtype=torch.long, device=feats.device)
    packed = cpu_linear.usable(feats, W)
    for a in range(0, M, block):
        x = feats[a:a + block]
        if packed:  # (m, V) from the prepacked product
            y = cpu_linear.linear(x, W, b)
        else:  # the faster transposed product (V, m), read as (m, V)
            y = (torch.addmm(b.unsqueeze(1), W, x.t()) if b is not None else torch.mm(W, x.t())).t()
        lp = torch.log_softmax(y.float(), -1)
        lp[:, forbidden] = float("-inf")
        best_lp[a:a + block], best_tok[a:a + block] = first_max(lp)
    return best_lp, best_tok
