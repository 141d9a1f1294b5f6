"""Vocabulary projections of many decoder rows at once without materialising (rows, T, V) log-probs:
rows are projected in chunks of at most ``max_elements`` logits (the decoder stack itself ran once)."""
import math

import torch
import torch.nn.functional as F

#: logits per chunk (2^25 float32 = 128 MiB)
MAX_ELEMENTS = 1 << 25


def chunks(n_rows, row_elements, max_elements=MAX_ELEMENTS):
    step = max(1, max_elements // max(1, row_elements))
    return [(a, min(a + step, n_rows)) for a in range(0, n_rows, step)]


def ensemble_log_probs(features, output_layers, a, b):
    """Rows a:b of every model's features -> averaged log-probs (log-mean-exp), float32."""
    outs = [F.log_softmax(proj(f[a:b]).float(), -1) for f, proj in zip(features, output_layers)]
    if len(outs) == 1:
        return outs[0]
    return torch.logsumexp(torch.stack(outs), 0) - math.log(len(outs))


def best_tokens(features, output_layers, vocab_size, forbidden, max_elements=MAX_ELEMENTS):
    """features: one (N, T, C) tensor per model; output_layers: their vocabulary projections ->
    (argmax token (N, T), its log-prob (N, T)); ``forbidden`` symbols are never chosen."""
    N, T = features[0].shape[:2]
    tokens = torch.empty((N, T), dtype=torch.long, device=features[0].device)
    scores = torch.empty((N, T), dtype=torch.float, device=features[0].device)
    for a, b in chunks(N, T * vocab_size, max_elements):
        lp = ensemble_log_probs(features, output_layers, a, b)
        lp[..., forbidden] = float("-inf")
        scores[a:b], tokens[a:b] = lp.max(-1)
    return tokens, scores


def target_log_probs(features, output_layer, target, vocab_size, max_elements=MAX_ELEMENTS):
    """features (N, T, C), target (N, T) ids < vocab_size -> log p(target) (N, T) under
    ``output_layer`` (float32)."""
    N, T = target.shape
    out = torch.empty((N, T), dtype=torch.float, device=features.device)
    for a, b in chunks(N, T * vocab_size, max_elements):
        lp = F.log_softmax(output_layer(features[a:b]).float(), -1)
        out[a:b] = lp.gather(-1, target[a:b].unsqueeze(-1)).squeeze(-1)
    return out
