"""distill_filter: the vectorised run lengths and the drop rule against slow loops."""
import numpy as np
from hypothesis import given, settings, strategies as st

from fairseq_nat_ext.data.distill_filter import degenerate, describe, max_runs, parse_max_len


def slow_max_run(seq):
    best, i = 0, 0
    while i < len(seq):
        j = i
        while j < len(seq) and seq[j] == seq[i]:
            j += 1
        best, i = max(best, j - i), j
    return best


seqs = st.lists(st.lists(st.integers(0, 3), max_size=12), max_size=8)


@settings(max_examples=200, deadline=None)
@given(seqs)
def test_max_runs_matches_a_loop(items):
    got = max_runs([np.array(x, dtype=np.int64) for x in items])
    assert got.tolist() == [slow_max_run(x) for x in items]


@settings(max_examples=200, deadline=None)
@given(seqs, st.integers(0, 3), st.sampled_from([None, (2.0, 10.0), (1.0, 0.0), (0.5, 1.0)]), st.data())
def test_degenerate_matches_the_rule(items, max_repeat, max_len, data):
    src = [data.draw(st.integers(0, 10)) for _ in items]
    looping, too_long = degenerate(np.array(src), [np.array(x, dtype=np.int64) for x in items], max_repeat, max_len)
    for i, x in enumerate(items):
        assert looping[i] == (max_repeat > 0 and slow_max_run(x) > max_repeat)
        assert too_long[i] == (max_len is not None and len(x) > max_len[0] * src[i] + max_len[1])


def test_runs_never_cross_sentences():
    assert max_runs([np.array([5, 5]), np.array([5, 5, 1])]).tolist() == [2, 2]
    assert max_runs([np.array([], dtype=np.int64), np.array([1])]).tolist() == [0, 1]


def test_options_and_message():
    assert parse_max_len("off") is None and parse_max_len("2,10") == (2.0, 10.0)
    counts = {"pairs": 10, "kept": 7, "looping": 2, "too_long": 2}
    assert describe(counts, 2, (2.0, 10.0)) == (
        "kept 7 of 10 pairs (2 repeat a token more than 2 times in a row; 2 are longer than 2 x source + 10)")
    assert describe(counts, 0, None) == "kept 7 of 10 pairs (no filter)"


def test_dropping_every_pair_is_an_error(tmp_path):
    """A split whose every target is degenerate gives a clear error instead of an empty dataset."""
    import pytest
    import torch
    from fairseq.data import Dictionary, indexed_dataset

    from fairseq_nat_ext.data.distill_filter import filter_split

    d = Dictionary()
    for w in "abc":
        d.add_symbol(w)
    for lang in ("en", "de"):
        d.save(str(tmp_path / f"dict.{lang}.txt"))
        builder = indexed_dataset.make_builder(str(tmp_path / f"train.en-de.{lang}.bin"), impl="mmap",
                                               vocab_size=len(d))
        for _ in range(3):
            builder.add_item(torch.IntTensor([d.index("a")] * (3 if lang == "de" else 1) + [d.eos()]))
        builder.finalize(str(tmp_path / f"train.en-de.{lang}.idx"))
    with pytest.raises(ValueError, match="would drop all 3 pairs .3 looping"):
        filter_split(str(tmp_path), "en", "de", max_repeat=2)
    counts = filter_split(str(tmp_path), "en", "de", max_repeat=3)
    assert counts == {"pairs": 3, "kept": 3, "looping": 0, "too_long": 0}
