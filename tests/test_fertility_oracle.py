"""Fertility targets from word alignments (with the BPE projection) and from teacher attention, on
hand-made examples; fertility files and their checks."""
import numpy as np
import pytest
import torch

from fairseq_nat_ext.data import fertility as ff
from fairseq_nat_ext.oracles.fertility import (bpe_fertility, fertility_from_attention, parse_pharaoh, spread,
                                               target_sources, word_fertility, word_piece_counts,
                                               words_from_pieces)


def test_parse_pharaoh():
    assert parse_pharaoh("0-0 2-1  3-10\n") == [(0, 0), (2, 1), (3, 10)]
    assert parse_pharaoh("") == []
    for bad in ("0-", "a-1", "1:2", "-1-2"):
        with pytest.raises(ValueError):
            parse_pharaoh(bad)


def test_bpe_words():
    p = "the hou@@ se is b@@ i@@ g".split()
    assert word_piece_counts(p) == [1, 2, 1, 3]
    assert words_from_pieces(p) == ["the", "house", "is", "big"]
    assert word_piece_counts(["a@@"]) == [1] and words_from_pieces(["a@@"]) == ["a"]  # dangling marker
    assert word_piece_counts([]) == [] and words_from_pieces([]) == []


def test_target_sources_rules():
    # several links: the smallest source; unlinked: left neighbour's source
    assert target_sources([(0, 0), (2, 0), (1, 2)], 3, 4).tolist() == [0, 0, 1, 1]
    # first target word unlinked: the first linked word on its right
    assert target_sources([(2, 1)], 3, 3).tolist() == [2, 2, 2]
    assert target_sources([(1, 2), (0, 0)], 2, 4).tolist() == [0, 0, 1, 1]
    # nothing linked: proportional positions
    assert target_sources([], 2, 4).tolist() == [0, 0, 1, 1]
    assert target_sources([], 3, 2).tolist() == [0, 1]
    assert target_sources([], 3, 0).tolist() == []
    with pytest.raises(ValueError):
        target_sources([(3, 0)], 3, 1)  # out of range
    with pytest.raises(ValueError):
        target_sources([], 0, 2)  # nothing to copy from


def test_word_fertility_counts_target_pieces():
    # target words 0,1 -> source 1; target word 2 -> source 0; target word 1 has 3 pieces
    assert word_fertility([(1, 0), (1, 1), (0, 2)], 3, 3).tolist() == [1, 2, 0]
    assert word_fertility([(1, 0), (1, 1), (0, 2)], 3, 3, tgt_weights=[1, 3, 2]).tolist() == [2, 4, 0]


def test_spread_over_pieces():
    assert spread([5, 0, 2], [2, 1, 3]).tolist() == [3, 2, 0, 1, 1, 0]
    assert spread([1, 4], [3, 2]).tolist() == [1, 0, 0, 2, 2]
    assert spread([], []).tolist() == []


def test_bpe_projection_end_to_end():
    src = "the hou@@ se is big".split()  # words: the house is big
    tgt = "das Ha@@ us ist sehr gro@@ ß".split()  # words: das Haus ist sehr groß
    links = parse_pharaoh("0-0 1-1 2-2 3-4")  # "sehr" unlinked -> left neighbour "ist" -> "is"
    f = bpe_fertility(links, src, tgt)
    # the:1 (das) | house:2 pieces of Haus, spread 1+1 | is: ist + sehr = 2 | big: gro@@ ß = 2
    assert f.tolist() == [1, 1, 1, 2, 2]
    assert f.sum() == len(tgt)
    # a source word with more pieces than copies: the first pieces get them
    f = bpe_fertility([(0, 0)], "un@@ be@@ lie@@ vable".split(), "unglaublich".split())
    assert f.tolist() == [1, 0, 0, 0]
    # empty target: all zero
    assert bpe_fertility([], "a b".split(), []).tolist() == [0, 0]


def test_fertility_from_attention_hand_made():
    # source: a b </s> <pad>; the third target token looks mostly at </s> (excluded) -> next best "b"
    attn = torch.tensor([[[0.7, 0.2, 0.1, 0.0],
                          [0.1, 0.8, 0.1, 0.0],
                          [0.1, 0.3, 0.6, 0.0],
                          [0.5, 0.1, 0.4, 0.0]]])  # last target row: </s> of the target, not counted
    src_mask = torch.tensor([[True, True, False, False]])
    tgt_mask = torch.tensor([[True, True, True, False]])
    assert fertility_from_attention(attn, src_mask, tgt_mask).tolist() == [[1, 2, 0, 0]]
    # batch of two with left padding on the source; ties go to the lowest position
    attn = torch.tensor([[[0.0, 0.5, 0.5], [0.0, 0.2, 0.8]],
                         [[0.3, 0.3, 0.4], [0.6, 0.2, 0.2]]])
    src_mask = torch.tensor([[False, True, True], [True, True, False]])
    tgt_mask = torch.tensor([[True, True], [True, False]])
    out = fertility_from_attention(attn, src_mask, tgt_mask)
    assert out.tolist() == [[0, 1, 1], [1, 0, 0]]
    assert out.sum(1).tolist() == tgt_mask.sum(1).tolist()
    with pytest.raises(ValueError):
        fertility_from_attention(attn, torch.zeros_like(src_mask), tgt_mask)


def test_fertility_files_roundtrip_and_errors(tmp_path):
    name = str(tmp_path / "train.fert")
    rows = [np.array([1, 0, 2]), np.array([], dtype=np.int64), np.array([3])]
    ff.write_fertility_file(name, rows)
    back = ff.read_fertility_file(name)
    assert [r.tolist() for r in back] == [[1, 0, 2], [], [3]]
    ff.check_fertility(back, [3, 0, 1], [3, 0, 3], name)
    with pytest.raises(ValueError, match=r"train\.fert line 3: 1 values for 2 source tokens"):
        ff.check_fertility(back, [3, 0, 2], [3, 0, 3], name)
    with pytest.raises(ValueError, match=r"line 1: values sum to 3, the target has 4 tokens"):
        ff.check_fertility(back, [3, 0, 1], [4, 0, 3], name)
    with pytest.raises(ValueError, match="has 3 lines, the split has 2"):
        ff.check_fertility(back, [3, 0], [3, 0], name)
    (tmp_path / "bad.fert").write_text("1 2\n1 -1\n")
    with pytest.raises(ValueError, match=r"bad\.fert line 2: '-1'"):
        ff.read_fertility_file(str(tmp_path / "bad.fert"))
    ff.write_method(str(tmp_path), "attention teacher x.pt")
    assert ff.fertility_method(str(tmp_path)) == "attention"
    assert ff.fertility_method(str(tmp_path / "none")) is None


def test_fertility_from_attention_matches_a_loop():
    g = torch.Generator().manual_seed(0)
    B, T, S = 4, 6, 5
    attn = torch.rand(B, T, S, generator=g)
    src_mask = torch.rand(B, S, generator=g) < 0.7
    src_mask[:, 0] = True
    tgt_mask = torch.rand(B, T, generator=g) < 0.8
    out = fertility_from_attention(attn, src_mask, tgt_mask)
    for b in range(B):
        ref = [0] * S
        for t in range(T):
            if tgt_mask[b, t]:
                allowed = [s for s in range(S) if src_mask[b, s]]
                ref[max(allowed, key=lambda s: (float(attn[b, t, s]), -s))] += 1
        assert out[b].tolist() == ref
