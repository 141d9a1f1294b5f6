"""CTC greedy decoding and prefix beam search against slow references."""
import itertools
import math
from collections import defaultdict

import pytest
import torch

from fairseq_nat_ext.generators.ctc_nat import ctc_greedy, ctc_prefix_beam_search
from test_ctc_oracle import slow_collapse

BLANK, PAD = 0, 7


def lae(a, b):
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    m = max(a, b)
    return m + math.log(math.exp(a - m) + math.exp(b - m))


def exact_output_distribution(lp):
    """{output: log P(output)} summing every alignment (T, V) explicitly."""
    T, V = lp.shape
    out = defaultdict(lambda: -math.inf)
    for a in itertools.product(range(V), repeat=T):
        y = tuple(slow_collapse(a))
        out[y] = lae(out[y], sum(lp[t, a[t]].item() for t in range(T)))
    return dict(out)


def slow_prefix_beam_search(lp, K, allowed):
    """The textbook dictionary-based CTC prefix beam search (one sentence)."""
    beams = {(): (0.0, -math.inf)}
    for t in range(lp.shape[0]):
        new = defaultdict(lambda: [-math.inf, -math.inf])
        for prefix, (pb, pnb) in beams.items():
            tot = lae(pb, pnb)
            new[prefix][0] = lae(new[prefix][0], tot + lp[t, BLANK].item())
            if prefix:
                new[prefix][1] = lae(new[prefix][1], pnb + lp[t, prefix[-1]].item())
            for c in allowed:
                grown = prefix + (c,)
                src = pb if prefix and c == prefix[-1] else tot
                new[grown][1] = lae(new[grown][1], src + lp[t, c].item())
        ranked = sorted(new.items(), key=lambda kv: -lae(*kv[1]))[:K]
        beams = {p: tuple(v) for p, v in ranked if lae(*v) > -math.inf}
    return sorted(((p, lae(*v)) for p, v in beams.items()), key=lambda x: -x[1])


def test_greedy_is_argmax_then_collapse():
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(6, 10, 5, generator=g).log_softmax(-1)
    lengths = torch.tensor([10, 3, 7, 1, 10, 5])
    toks, n, align, pos = ctc_greedy(lp, lengths, BLANK, PAD)
    for b in range(6):
        L = int(lengths[b])
        best = lp[b, :L].argmax(-1).tolist()
        assert align[b, :L].tolist() == best and (align[b, L:] == PAD).all()
        assert toks[b, : int(n[b])].tolist() == slow_collapse(best)
        assert math.isclose(pos[b].sum().item(), lp[b, :L].max(-1).values.sum().item(), rel_tol=1e-6)


def test_prefix_beam_search_with_a_full_beam_is_exact():
    # every output of T=4 over 2 tokens fits in a beam of 31: the search must find the exact argmax
    # of P(y|x) = sum over all alignments, and the exact probabilities of the top outputs
    g = torch.Generator().manual_seed(1)
    for _ in range(8):
        lp = (torch.randn(4, 3, generator=g, dtype=torch.float64) * 2).log_softmax(-1)
        exact = sorted(exact_output_distribution(lp).items(), key=lambda kv: -kv[1])
        pref, plen, score = ctc_prefix_beam_search(lp.unsqueeze(0), torch.tensor([4]), 31, BLANK, PAD)
        got = [(tuple(pref[0, k, : int(plen[0, k])].tolist()), score[0, k].item())
               for k in range(31) if score[0, k] > -math.inf]
        assert len(got) == len(exact)
        for (gy, gs), (wy, ws) in zip(got, exact):
            assert gy == wy and math.isclose(gs, ws, abs_tol=1e-9)


@pytest.mark.parametrize("K", [1, 2, 3, 5])
def test_prefix_beam_search_against_slow_reference(K):
    g = torch.Generator().manual_seed(10 + K)
    N, T, V = 5, 9, 5
    lp = (torch.randn(N, T, V, generator=g, dtype=torch.float64) * 2).log_softmax(-1)
    lp[..., 4] = -math.inf  # a forbidden symbol (like <mask>) is never emitted
    lengths = torch.tensor([9, 4, 7, 1, 9])
    pref, plen, score = ctc_prefix_beam_search(lp, lengths, K, BLANK, PAD)
    for b in range(N):
        want = slow_prefix_beam_search(lp[b, : int(lengths[b])], K, allowed=[1, 2, 3])
        got = [(tuple(pref[b, k, : int(plen[b, k])].tolist()), score[b, k].item())
               for k in range(K) if score[b, k] > -math.inf]
        assert [p for p, _ in got] == [p for p, _ in want], b
        for (_, gs), (_, ws) in zip(got, want):
            assert math.isclose(gs, ws, abs_tol=1e-9)
        assert all(4 not in p for p, _ in got)


def test_beam_scores_are_lower_bounds_of_the_exact_probability():
    # the beam drops alignments, never adds any: a kept prefix scores at most its exact log P(y|x)
    g = torch.Generator().manual_seed(4)
    for _ in range(5):
        lp = torch.randn(5, 3, generator=g, dtype=torch.float64).log_softmax(-1)
        exact = exact_output_distribution(lp)
        pref, plen, score = ctc_prefix_beam_search(lp.unsqueeze(0), torch.tensor([5]), 2, BLANK, PAD)
        for k in range(2):
            y = tuple(pref[0, k, : int(plen[0, k])].tolist())
            assert score[0, k].item() <= exact[y] + 1e-9
