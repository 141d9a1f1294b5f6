"""Post-processing of finished hypotheses (fairseq hypothesis dicts), shared by the task's
``--collapse-repeats`` option and the evaluation harness' ``dedup=1`` decoding key
(:mod:`fairseq_nat_ext.evaluation.decoding`).

Collapsing consecutive repeated tokens ("de-duplication") is a common last step of non-autoregressive
decoding: a NAT decoder predicts neighbouring positions independently and often emits the same token
twice in a row.  It works on the target dictionary's ids, i.e. on BPE units before ``--remove-bpe``
(``Karate@@ Karate@@ anzug`` -> ``Karate@@ anzug``).
"""
import torch


def collapse_repeats(hypo):
    """``hypo`` with every run of equal consecutive tokens reduced to its first token.

    ``positional_scores`` keeps the entries of the kept tokens; a token-aligned ``attention``
    (src x tgt) keeps their columns; ``alignment`` (pairs that would point at removed positions) is
    dropped.  ``score`` is left as the generator computed it (the hypothesis was chosen with it).
    Returns ``hypo`` itself when nothing repeats, else a shallow copy."""
    tokens = hypo["tokens"]
    n = tokens.numel()
    if n < 2:
        return hypo
    keep = torch.ones(n, dtype=torch.bool, device=tokens.device)
    keep[1:] = tokens[1:] != tokens[:-1]
    if bool(keep.all()):
        return hypo
    out = dict(hypo)
    out["tokens"] = tokens[keep]
    scores = hypo.get("positional_scores")
    if torch.is_tensor(scores) and scores.dim() == 1 and scores.numel() == n:
        out["positional_scores"] = scores[keep]
    attention = hypo.get("attention")
    if torch.is_tensor(attention) and attention.dim() == 2 and attention.size(1) == n:
        out["attention"] = attention[:, keep]
    if hypo.get("alignment") is not None:
        out["alignment"] = None
    return out


def collapse_all(hypos):
    """fairseq's generate() output (a list per sentence of hypothesis dicts), each hypothesis collapsed."""
    return [[collapse_repeats(h) for h in nbest] for nbest in hypos]
