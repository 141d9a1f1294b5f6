"""Batched edit operations against list-based references."""
import random

import torch

from fairseq_nat_ext.models.nat.edit_ops import delete_tokens, fill_placeholders, insert_placeholders, random_delete

PAD, BOS, EOS, MASK = 1, 0, 2, 3


def rows(seqs):
    w = max(len(s) for s in seqs)
    return torch.tensor([s + [PAD] * (w - len(s)) for s in seqs])


def unpad(t):
    return [[x for x in r if x != PAD] for r in t.tolist()]


def random_rows(rng, n=6):
    return [[BOS] + [rng.randrange(4, 20) for _ in range(rng.randint(0, 8))] + [EOS] for _ in range(n)]


def test_delete_matches_reference():
    rng = random.Random(0)
    for _ in range(50):
        seqs = random_rows(rng)
        t = rows(seqs)
        dele = torch.rand(t.shape, generator=torch.Generator().manual_seed(rng.randrange(1000))) < 0.5
        got = unpad(delete_tokens(t, dele, PAD, BOS, EOS))
        want = [[x for j, x in enumerate(s) if not (dele[i, j] and x not in (BOS, EOS))] for i, s in enumerate(seqs)]
        assert got == want


def test_insert_and_fill_match_reference():
    rng = random.Random(1)
    for _ in range(50):
        seqs = random_rows(rng)
        t = rows(seqs)
        counts = torch.randint(0, 4, (t.size(0), t.size(1) - 1), generator=torch.Generator().manual_seed(rng.randrange(1000)))
        got = unpad(insert_placeholders(t, counts, PAD, MASK))
        want = []
        for i, s in enumerate(seqs):
            out = []
            for k, x in enumerate(s):
                out.append(x)
                if k < len(s) - 1:
                    out += [MASK] * int(counts[i, k])
            want.append(out)
        assert got == want
        grown = insert_placeholders(t, counts, PAD, MASK)
        filled = fill_placeholders(grown, torch.full_like(grown, 7), MASK)
        assert unpad(filled) == [[7 if x == MASK else x for x in r] for r in want]


def test_insert_respects_max_len_left_to_right():
    t = rows([[BOS, 5, 6, EOS]])
    out = insert_placeholders(t, torch.tensor([[3, 3, 3]]), PAD, MASK, max_len=9)
    assert unpad(out) == [[BOS, MASK, MASK, MASK, 5, MASK, MASK, 6, EOS]]


def test_insert_max_len_per_row():
    t = rows([[BOS, 5, 6, EOS], [BOS, 7, EOS]])
    counts = torch.tensor([[3, 3, 3], [4, 4, 0]])
    out = insert_placeholders(t, counts, PAD, MASK, max_len=torch.tensor([6, 9]))
    assert unpad(out) == [[BOS, MASK, MASK, 5, 6, EOS], [BOS, MASK, MASK, MASK, MASK, 7, MASK, MASK, EOS]]


def test_random_delete_keeps_an_ordered_subsequence_with_ends():
    g = torch.Generator().manual_seed(0)
    seqs = [[BOS] + list(range(4, 4 + n)) + [EOS] for n in (0, 1, 5, 12)] * 20
    out = unpad(random_delete(rows(seqs), PAD, BOS, EOS, generator=g))
    sizes = set()
    for s, o in zip(seqs, out):
        assert o[0] == BOS and o[-1] == EOS
        assert o[1:-1] == sorted(o[1:-1]) and set(o) <= set(s), "an ordered subsequence"
        if len(s) == 14:
            sizes.add(len(o))
    assert len(sizes) > 3, "the number of kept tokens is drawn per sentence"


def test_random_delete_kept_counts_paper_and_fairseq_ranges():
    """k kept of n = 4 content tokens: U{0..4} with keep_complete (Stern et al.), U{0..3} without
    (fairseq's translation_lev: cutoff = 2 + floor((len - 2) * u) of the <s> x </s> row)."""
    n, draws = 4, 4000
    seqs = [[BOS] + list(range(4, 4 + n)) + [EOS]] * draws
    for complete, support in ((True, range(n + 1)), (False, range(n))):
        g = torch.Generator().manual_seed(1)
        kept = [len(o) - 2 for o in unpad(random_delete(rows(seqs), PAD, BOS, EOS, generator=g,
                                                        keep_complete=complete))]
        counts = [kept.count(k) for k in range(n + 1)]
        assert set(kept) == set(support), counts
        for k in support:  # uniform: each count within 5 standard deviations of draws / |support|
            p = 1 / len(support)
            assert abs(counts[k] - draws * p) < 5 * (draws * p * (1 - p)) ** 0.5, counts
    g = torch.Generator().manual_seed(0)
    assert unpad(random_delete(rows([[BOS, EOS]]), PAD, BOS, EOS, generator=g, keep_complete=False)) == [[BOS, EOS]]


def test_pad_to_and_rows_equal():
    from fairseq_nat_ext.models.nat.edit_ops import pad_to, rows_equal

    a = torch.tensor([[0, 5, 2], [0, 2, 1]])
    assert pad_to(a, 5, 1).tolist() == [[0, 5, 2, 1, 1], [0, 2, 1, 1, 1]]
    assert pad_to(a.bool(), 4, False).tolist() == [[False, True, True, False], [False, True, True, False]]
    b = torch.tensor([[0, 5, 2, 1, 1], [0, 6, 2, 1, 1]])  # the same rows 0, wider padding
    assert rows_equal(a, b, pad=1).tolist() == [True, False]
    assert rows_equal(b, a, pad=1).tolist() == [True, False]
