"""Vocabulary projections of many decoder rows at once without materialising (rows, T, V) log-probs:
positions are projected in chunks of at most ``max_elements`` logits (the decoder stack itself ran
once).  Given a ``keep`` mask, only those positions are projected: NAT candidates of one batch are
padded to the longest (a sampled fertility can make one candidate 3x the others), and the projection
onto the vocabulary is the costly part of a pass -- padding is never projected."""
import functools
import math

import torch
import torch.nn.functional as F

from ..modules.vocab_projection import first_max, vocab_logits

#: logits per chunk (2^25 float32 = 128 MiB)
MAX_ELEMENTS = 1 << 25


def chunks(n_rows, row_elements, max_elements=MAX_ELEMENTS):
    step = max(1, max_elements // max(1, row_elements))
    return [(a, min(a + step, n_rows)) for a in range(0, n_rows, step)]


def vocab_projection(decoder):
    """``decoder.output_layer`` as a function of the states, computed by
    :func:`modules.vocab_projection.vocab_logits`: at CPU decoding its product runs on oneDNN's
    prepacked weight (or as the faster transposed product), not torch's ``linear``, which is slow for
    the few dozen rows of a decoding pass; the same logits up to float rounding, and the decoder's own
    ``output_layer`` elsewhere (training, CUDA, adaptive softmax)."""
    return functools.partial(vocab_logits, decoder)


def ensemble_log_probs(features, output_layers, a, b):
    """Rows a:b of every model's features -> averaged log-probs (log-mean-exp), float32."""
    outs = [F.log_softmax(proj(f[a:b]).float(), -1) for f, proj in zip(features, output_layers)]
    if len(outs) == 1:
        return outs[0]
    return torch.logsumexp(torch.stack(outs), 0) - math.log(len(outs))


def _positions(features, keep):
    """(N, T, C) features -> (M, C) rows of the kept positions (all N * T when keep is None), as one
    contiguous 2-D block (a batched product against the vocabulary matrix is much slower on CPU).
    2-D features are already those rows (packed by the decoder, modules/packed.py)."""
    C = features.size(-1)
    if features.dim() == 2:
        return features
    return features.reshape(-1, C) if keep is None else features[keep]


def best_tokens(features, output_layers, vocab_size, forbidden, max_elements=MAX_ELEMENTS, keep=None):
    """features: one (N, T, C) tensor per model (or its (M, C) rows at ``keep``); output_layers: their
    vocabulary projections ->
    (argmax token (N, T), its log-prob (N, T)); ``forbidden`` symbols are never chosen.  ``keep``
    (bool (N, T), optional): only these positions are projected; the others get token 0, log-prob 0."""
    N, T = keep.shape if keep is not None else features[0].shape[:2]
    rows = [_positions(f, keep) for f in features]
    M = rows[0].size(0)
    tok = torch.zeros((M,), dtype=torch.long, device=features[0].device)
    lp_best = torch.zeros((M,), dtype=torch.float, device=features[0].device)
    for a, b in chunks(M, vocab_size, max_elements):
        lp = ensemble_log_probs(rows, output_layers, a, b)
        lp[..., forbidden] = float("-inf")
        lp_best[a:b], tok[a:b] = first_max(lp)
    return _unflatten(tok, keep, N, T), _unflatten(lp_best, keep, N, T)


def best_logits(features, output_layer, forbidden, keep=None):
    """ONE model's features (N, T, C) (or its (M, C) rows at ``keep``) and vocabulary projection ->
    (argmax token (N, T) of the logits, ``forbidden`` symbols never chosen (token 0 off ``keep``);
    the (M, V) float32 logits of the kept positions, row-major, ``forbidden`` values intact).

    For a caller that needs the log-probability of only a few rows' tokens (NPD: the returned candidate's):
    :func:`best_tokens`' log_softmax over every row is skipped, the tokens' log-probs are read later from
    their rows (:func:`row_log_probs`).  The argmax of the logits is that of the log-probs, which shift
    each row by one constant -- unless the shift rounds two different top logits to the same float32
    log-prob, where :func:`best_tokens` takes the lower symbol id and this the larger logit."""
    N, T = keep.shape if keep is not None else features.shape[:2]
    logits = output_layer(_positions(features, keep)).float()
    forbidden = torch.as_tensor(forbidden, dtype=torch.long, device=logits.device)
    saved = logits[:, forbidden]
    logits[:, forbidden] = float("-inf")
    _, tok = first_max(logits)
    logits[:, forbidden] = saved
    return _unflatten(tok, keep, N, T), logits


def row_log_probs(logits, rows, tokens):
    """logits (M, V), rows (K,) indices into them, tokens (K,) -> log p(token) (K,) under each row's
    softmax, float32 (the value :func:`best_tokens` returns for that row's token)."""
    lp = F.log_softmax(logits.index_select(0, rows), -1)
    return lp.gather(1, tokens.unsqueeze(1)).squeeze(1)


def target_log_probs(features, output_layer, target, vocab_size, max_elements=MAX_ELEMENTS, keep=None):
    """features (N, T, C) (or its (M, C) rows at ``keep``), target (N, T) ids < vocab_size -> log p(target) (N, T) under
    ``output_layer`` (float32); with ``keep`` (bool (N, T)) only those positions (0 elsewhere)."""
    N, T = target.shape
    rows = _positions(features, keep)
    tgt = target.reshape(-1) if keep is None else target[keep]
    out = torch.empty((rows.size(0),), dtype=torch.float, device=features.device)
    for a, b in chunks(rows.size(0), vocab_size, max_elements):
        lp = F.log_softmax(output_layer(rows[a:b]).float(), -1)
        out[a:b] = lp.gather(-1, tgt[a:b].unsqueeze(-1)).squeeze(-1)
    return _unflatten(out, keep, N, T)


def shared_target_log_probs(features, output_layer, node, target, vocab_size, max_elements=MAX_ELEMENTS):
    """features (K, C) of K distinct states, ``node`` (N, T) the state of every position (-1: none),
    target (N, T) -> log p(target) (N, T) (0 where node < 0): each state is projected once, however many
    positions share it (a prefix tree's nodes, modules/packed.tree_decoder_features)."""
    out = torch.zeros(target.shape, dtype=torch.float, device=features.device)
    keep = node.ge(0)
    idx, tgt = node[keep], target[keep]
    vals = torch.empty(idx.shape, dtype=torch.float, device=features.device)
    for a, b in chunks(features.size(0), vocab_size, max_elements):
        lp = F.log_softmax(output_layer(features[a:b]).float(), -1)
        sel = (idx >= a) & (idx < b)
        vals[sel] = lp[idx[sel] - a, tgt[sel]]
    out[keep] = vals
    return out


def _unflatten(values, keep, N, T):
    if keep is None:
        return values.view(N, T)
    full = values.new_zeros((N, T))
    full[keep] = values
    return full
