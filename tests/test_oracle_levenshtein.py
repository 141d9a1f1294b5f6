"""Levenshtein (insertion/deletion) oracle against a brute-force dynamic programme."""
from functools import lru_cache

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_nat_ext.oracles.levenshtein import apply_edits, levenshtein_oracle

PAD, MASK = 1, 99


def brute_distance(h, t):
    @lru_cache(maxsize=None)
    def d(i, j):
        if i == 0:
            return j
        if j == 0:
            return i
        best = min(d(i - 1, j) + 1, d(i, j - 1) + 1)
        if h[i - 1] == t[j - 1]:
            best = min(best, d(i - 1, j - 1))
        return best

    return d(len(h), len(t)), d


def brute_keep(h, t):
    """Pure-Python backtrace with the documented tie rule: match, else delete, else insert."""
    dist, d = brute_distance(h, t)
    i, j, keep_h, keep_t = len(h), len(t), set(), set()
    while i > 0 or j > 0:
        if i > 0 and j > 0 and h[i - 1] == t[j - 1] and d(i - 1, j - 1) == d(i, j):
            keep_h.add(i - 1)
            keep_t.add(j - 1)
            i, j = i - 1, j - 1
        elif i > 0 and d(i - 1, j) + 1 == d(i, j):
            i -= 1
        else:
            j -= 1
    return dist, keep_h, keep_t


def batch(seqs):
    width = max(1, max(len(s) for s in seqs))
    return torch.tensor([list(s) + [PAD] * (width - len(s)) for s in seqs])


seq = st.lists(st.integers(2, 6), min_size=0, max_size=9)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(seq, seq), min_size=1, max_size=6))
def test_oracle_is_minimal_exact_and_follows_the_tie_rule(pairs):
    hyps, tgts = batch([h for h, _ in pairs]), batch([t for _, t in pairs])
    o = levenshtein_oracle(hyps, tgts, PAD, MASK)
    rebuilt = apply_edits(hyps, o, tgts, PAD)
    for b, (h, t) in enumerate(pairs):
        dist, keep_h, keep_t = brute_keep(tuple(h), tuple(t))
        assert int(o.distance[b]) == dist
        assert rebuilt[b] == list(t), "applying the edits yields the target"
        n_del = int(o.del_labels[b].sum())
        n_ins = int(o.ins_counts[b].sum())
        assert n_del + n_ins == dist, "the script has exactly the minimal number of edits"
        assert {i for i in range(len(h)) if not o.del_labels[b, i]} == keep_h
        assert {j for j in range(len(t)) if o.keep_tgt[b, j]} == keep_t
        masked = [MASK if j not in keep_t else t[j] for j in range(len(t))]
        assert o.masked_tgt[b, :len(t)].tolist() == masked


def test_known_example_and_ties():
    # h = a b c, t = a c b: two optimal scripts (keep a b or keep a c).  Walking back from the end,
    # c != b and deleting c is optimal, so c is deleted ("delete before insert"), b is kept, and c is
    # inserted between a and b.
    o = levenshtein_oracle(torch.tensor([[2, 3, 4]]), torch.tensor([[2, 4, 3]]), PAD, MASK)
    assert o.distance.tolist() == [2]
    assert o.del_labels.tolist() == [[0, 0, 1]]
    assert o.ins_counts[0, :3].tolist() == [0, 1, 0]
    assert o.masked_tgt.tolist() == [[2, MASK, 3]]


def test_runs_on_the_inputs_device_and_long_batches():
    g = torch.Generator().manual_seed(0)
    hyp = torch.randint(2, 8, (64, 30), generator=g)
    tgt = torch.randint(2, 8, (64, 25), generator=g)
    hyp[::3, 20:] = PAD
    o = levenshtein_oracle(hyp, tgt, PAD, MASK)
    assert o.distance.device == hyp.device and o.del_labels.shape == hyp.shape
    assert (o.del_labels[::3, 20:] == 0).all(), "padding is never deleted"
    assert apply_edits(hyp, o, tgt, PAD) == [[int(x) for x in row if x != PAD] for row in tgt]


def test_bit_parallel_table_equals_the_row_minimum_table(monkeypatch):
    """Targets up to 62 tokens use bit-parallel LCS rows; longer ones the cumulative-minimum rows:
    both give the same table, and the oracle is exact on targets longer than one machine word."""
    import fairseq_nat_ext.oracles.levenshtein as lev

    g = torch.Generator().manual_seed(1)
    for n, m in ((7, 5), (40, 62), (3, 1)):
        hyp = torch.randint(2, 6, (9, n), generator=g)
        tgt = torch.randint(2, 6, (9, m), generator=g)
        fast = lev.edit_distance_table(hyp, tgt)
        monkeypatch.setattr(lev, "_BITS", 0)
        slow = lev.edit_distance_table(hyp, tgt)
        monkeypatch.undo()
        assert torch.equal(fast, slow)
        d = brute_distance(tuple(hyp[0].tolist()), tuple(tgt[0].tolist()))[1]
        assert fast[0].tolist() == [[d(i, j) for j in range(m + 1)] for i in range(n + 1)]
    hyp = torch.randint(2, 5, (4, 80), generator=g)
    tgt = torch.randint(2, 5, (4, 90), generator=g)
    tgt[1, 70:] = PAD
    o = levenshtein_oracle(hyp, tgt, PAD, MASK)
    assert apply_edits(hyp, o, tgt, PAD) == [[int(x) for x in row if x != PAD] for row in tgt]
    for b in range(4):
        t = tuple(x for x in tgt[b].tolist() if x != PAD)
        assert int(o.distance[b]) == brute_distance(tuple(hyp[b].tolist()), t)[0]


def test_bit_walk_equals_table_walk(monkeypatch):
    """The bit-word backtrace (targets <= 62 tokens) and the table backtrace give the same oracle,
    field by field, on random batches with ragged padding, up to the word boundary (m = 62)."""
    import fairseq_nat_ext.oracles.levenshtein as lev

    g = torch.Generator().manual_seed(2)
    for n, m, vocab in ((1, 1, 3), (12, 9, 3), (70, 62, 4), (30, 62, 2), (5, 40, 6)):
        hyp = torch.randint(2, 2 + vocab, (33, n), generator=g)
        tgt = torch.randint(2, 2 + vocab, (33, m), generator=g)
        hyp_len = torch.randint(0, n + 1, (33,), generator=g)
        tgt_len = torch.randint(0, m + 1, (33,), generator=g)
        hyp[torch.arange(n) >= hyp_len.unsqueeze(1)] = PAD
        tgt[torch.arange(m) >= tgt_len.unsqueeze(1)] = PAD
        bits = levenshtein_oracle(hyp, tgt, PAD, MASK)
        monkeypatch.setattr(lev, "_BITS", 0)
        table = levenshtein_oracle(hyp, tgt, PAD, MASK)
        monkeypatch.undo()
        for name, a, b in zip(bits._fields, bits, table):
            assert torch.equal(a, b), (n, m, name)
        assert apply_edits(hyp, bits, tgt, PAD) == [[int(x) for x in row if x != PAD] for row in tgt]
