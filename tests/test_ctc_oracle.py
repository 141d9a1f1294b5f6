"""The CTC lattice oracle against brute-force enumeration of every alignment."""
import itertools
import math

import pytest
import torch

from fairseq_nat_ext.oracles.ctc_alignment import (
    alignment_token_scores,
    ctc_best_alignment,
    ctc_collapse,
    ctc_feasible,
    ctc_min_input_length,
    restrict_to_observed,
)

BLANK, PAD = 0, 9


def slow_collapse(seq, blank=BLANK):
    out, prev = [], None
    for s in seq:
        if s != prev and s != blank:
            out.append(s)
        prev = s
    return out


def alignments_of(target, T, V):
    """Every alignment of length T over symbols 0..V-1 (0 = blank) that spells ``target``."""
    return [a for a in itertools.product(range(V), repeat=T) if slow_collapse(a) == list(target)]


def pad_targets(targets):
    S = max([len(t) for t in targets] + [1])
    out = torch.full((len(targets), S), PAD, dtype=torch.long)
    for i, t in enumerate(targets):
        out[i, : len(t)] = torch.tensor(t, dtype=torch.long)
    return out, torch.tensor([len(t) for t in targets])


def test_collapse_against_slow_reference():
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        a = torch.randint(0, 4, (5, 9), generator=g)
        lengths = torch.randint(1, 10, (5,), generator=g)
        toks, n, emitted = ctc_collapse(a, lengths, BLANK, PAD)
        for b in range(5):
            want = slow_collapse(a[b, : int(lengths[b])].tolist())
            assert toks[b, : int(n[b])].tolist() == want
            assert (toks[b, int(n[b]):] == PAD).all()
            assert int(emitted[b].sum()) == len(want)
    # the textbook cases: repeats merge unless a blank separates them
    a = torch.tensor([[1, 1, 0, 1, 2, 2, 0, 0, 2]])
    assert ctc_collapse(a, torch.tensor([9]), BLANK, PAD)[0].tolist() == [[1, 1, 2, 2]]


@pytest.mark.parametrize("target,T", [([1, 1, 2], 3), ([1, 1, 2], 4), ([1, 2, 3], 3), ([2, 2, 2], 5),
                                      ([2, 2, 2], 4), ([], 1)])
def test_feasibility_matches_enumeration(target, T):
    tg, tl = pad_targets([target])
    exists = len(alignments_of(target, T, 4)) > 0
    assert bool(ctc_feasible(torch.tensor([T]), tg, tl)[0]) == exists
    assert int(ctc_min_input_length(tg, tl)[0]) == len(target) + sum(
        1 for i in range(1, len(target)) if target[i] == target[i - 1])


def test_viterbi_against_enumeration():
    g = torch.Generator().manual_seed(1)
    V, T = 4, 6
    targets = [[1, 2], [1, 1], [3], [], [2, 2, 3], [1, 2, 1, 3], [3, 3, 3], [1, 1, 1, 1]]
    for trial in range(6):
        B = len(targets)
        lp = torch.randn(B, T, V, generator=g, dtype=torch.float64).log_softmax(-1)
        lengths = torch.randint(2, T + 1, (B,), generator=g)
        lengths[0] = T
        tg, tl = pad_targets(targets)
        align, score = ctc_best_alignment(lp, lengths, tg, tl, BLANK, pad=PAD)
        feasible = ctc_feasible(lengths, tg, tl)
        for b, target in enumerate(targets):
            n = int(lengths[b])
            cands = alignments_of(target, n, V)
            assert bool(feasible[b]) == bool(cands)
            if not cands:
                assert score[b] == float("-inf")
                continue
            scored = [(sum(lp[b, t, a[t]].item() for t in range(n)), a) for a in cands]
            best_score, best = max(scored)
            assert math.isclose(score[b].item(), best_score, rel_tol=0, abs_tol=1e-9), (trial, b)
            assert align[b, :n].tolist() == list(best), (trial, b)
            assert (align[b, n:] == PAD).all()


def test_viterbi_on_cuda_or_cpu_is_device_agnostic():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    lp = torch.randn(2, 5, 4).log_softmax(-1).to(dev)
    tg, tl = pad_targets([[1, 2], [3]])
    a, s = ctc_best_alignment(lp, torch.tensor([5, 4], device=dev), tg.to(dev), tl.to(dev), BLANK)
    assert a.device.type == dev and torch.isfinite(s).all()


def test_alignment_token_scores_split_the_path_score():
    g = torch.Generator().manual_seed(2)
    for _ in range(20):
        a = torch.randint(0, 4, (4, 8), generator=g)
        lengths = torch.randint(1, 9, (4,), generator=g)
        ps = torch.randn(4, 8, generator=g, dtype=torch.float64)
        out = alignment_token_scores(ps, a, lengths, BLANK)
        _, n, _ = ctc_collapse(a, lengths, BLANK, PAD)
        for b in range(4):
            L, k = int(lengths[b]), int(n[b])
            # slow: walk the alignment, blanks wait for the next token, repeats join the previous
            want, pending, prev = [0.0] * (k + 1), 0.0, None
            idx = -1
            for t in range(L):
                s, v = int(a[b, t]), ps[b, t].item()
                if s == BLANK:
                    pending += v
                elif s != prev:
                    idx += 1
                    want[idx] += pending + v
                    pending = 0.0
                else:
                    want[idx] += v
                prev = s
            want[k] += pending
            assert torch.allclose(out[b, : k + 1], torch.tensor(want, dtype=torch.float64))
            assert torch.all(out[b, k + 1:] == 0)


def slow_restricted_nll(lp, target, alignment, observed):
    """-log sum over alignments spelling ``target`` and agreeing with the observed positions of
    the product of p over the unobserved positions (explicit enumeration)."""
    T, V = lp.shape
    total = 0.0
    for a in alignments_of(target, T, V):
        if any(observed[t] and a[t] != alignment[t] for t in range(T)):
            continue
        total += math.exp(sum(lp[t, a[t]].item() for t in range(T) if not observed[t]))
    return -math.log(total)


def test_restricted_ctc_equals_explicit_sum_over_consistent_alignments():
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(3)
    V, T = 4, 6
    for target in ([1, 2], [1, 1, 3], [2], [3, 3]):
        for _ in range(4):
            lp = torch.randn(T, V, generator=g, dtype=torch.float64).log_softmax(-1)
            # an observation taken from a real alignment of the target
            cands = alignments_of(target, T, V)
            align = list(cands[int(torch.randint(len(cands), (1,), generator=g))])
            observed = (torch.rand(T, generator=g) < 0.5).tolist()
            r = restrict_to_observed(lp.unsqueeze(0), torch.tensor([align]), torch.tensor([observed]))
            got = F.ctc_loss(r.transpose(0, 1), torch.tensor([target]), torch.tensor([T]),
                             torch.tensor([len(target)]), blank=BLANK, reduction="sum")
            want = slow_restricted_nll(lp, target, align, observed)
            assert math.isclose(got.item(), want, rel_tol=1e-9, abs_tol=1e-9)
    # nothing observed: the plain CTC loss
    lp = torch.randn(T, V, generator=g, dtype=torch.float64).log_softmax(-1)
    r = restrict_to_observed(lp.unsqueeze(0), torch.zeros(1, T, dtype=torch.long), torch.zeros(1, T, dtype=torch.bool))
    assert torch.equal(r[0], lp)
