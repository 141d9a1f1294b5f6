"""Insertion oracle (uniform and balanced-binary-tree weights) against a per-slot Python reference."""
import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_nat_ext.oracles.insertion import insertion_oracle

PAD = 1


def reference(tgt, keep, tau):
    """Per sequence: walk the target, cut the missing spans, weight each span explicitly."""
    slots, weights, done = {}, {}, []
    kept_so_far, span = 0, []

    def close(span, s):
        if not span:
            done.append(s)
            return
        L = len(span)
        if tau is None:
            w = [1.0 / L] * L
        else:
            c = (L - 1) / 2
            e = [math.exp(-abs(r - c) / tau) for r in range(L)]
            w = [x / sum(e) for x in e]
        for p, x in zip(span, w):
            slots[p], weights[p] = s, x

    for p, k in enumerate(keep):
        if k:
            close(span, kept_so_far)
            span = []
            kept_so_far += 1
        else:
            span.append(p)
    close(span, kept_so_far)
    return slots, weights, done


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=1, max_size=12), min_size=1, max_size=5),
       st.sampled_from([None, 0.5, 1.0, 3.0]))
def test_matches_reference(keeps, tau):
    m = max(len(k) for k in keeps)
    tgt = torch.tensor([[5] * len(k) + [PAD] * (m - len(k)) for k in keeps])
    keep = torch.tensor([k + [False] * (m - len(k)) for k in keeps])
    o = insertion_oracle(tgt, keep, PAD, tau)
    for b, k in enumerate(keeps):
        slots, weights, done = reference(tgt[b, :len(k)].tolist(), k, tau)
        for p in range(len(k)):
            assert bool(o.missing[b, p]) == (p in slots)
            if p in slots:
                assert int(o.slot[b, p]) == slots[p]
                assert abs(float(o.weight[b, p]) - weights[p]) < 1e-6
            else:
                assert float(o.weight[b, p]) == 0.0
        assert [s for s in range(m + 1) if o.slot_done[b, s]] == done
        assert int(o.slot_valid[b].sum()) == sum(k) + 1


def test_balanced_tree_prefers_the_centre_and_sums_to_one():
    tgt = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    keep = torch.tensor([[True, False, False, False, False, False, True]])
    o = insertion_oracle(tgt, keep, PAD, tau=1.0)
    w = o.weight[0, 1:6]
    assert int(w.argmax()) == 2 and torch.allclose(w, w.flip(0))
    assert abs(float(w.sum()) - 1.0) < 1e-6
    assert o.slot_done[0].tolist()[:3] == [True, False, True]
