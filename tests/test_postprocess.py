"""Collapsing consecutive repeated tokens (generators/postprocess.py): against a slow loop, through the
task's ``--collapse-repeats`` and through the harness' ``dedup`` decoding key."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_nat_ext.evaluation import decoding as dec
from fairseq_nat_ext.generators.postprocess import collapse_all, collapse_repeats


def slow_collapse(tokens, scores):
    out_t, out_s = [], []
    for t, s in zip(tokens, scores):
        if out_t and out_t[-1] == t:
            continue
        out_t.append(t)
        out_s.append(s)
    return out_t, out_s


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(4, 7), min_size=0, max_size=30))
def test_collapse_matches_a_slow_loop(body):
    tokens = torch.tensor(body + [2])  # ends in </s>, as fairseq's hypotheses do
    scores = torch.arange(len(body) + 1, dtype=torch.float) / 10
    hypo = {"tokens": tokens, "positional_scores": scores, "score": -1.5, "alignment": None, "steps": 3}
    out = collapse_repeats(hypo)
    want_t, want_s = slow_collapse(tokens.tolist(), scores.tolist())
    assert out["tokens"].tolist() == want_t
    assert out["positional_scores"].tolist() == pytest.approx(want_s)
    assert out["score"] == -1.5 and out["steps"] == 3
    assert hypo["tokens"] is tokens  # the input is not modified
    if want_t == tokens.tolist():
        assert out is hypo


def test_collapse_keeps_attention_columns_and_drops_alignment():
    tokens = torch.tensor([5, 5, 6, 6, 6, 2])
    attention = torch.arange(12, dtype=torch.float).view(2, 6)
    out = collapse_repeats({"tokens": tokens, "attention": attention, "alignment": torch.zeros(6, 2),
                            "positional_scores": torch.zeros(6), "score": 0.0})
    assert out["tokens"].tolist() == [5, 6, 2]
    assert out["attention"].tolist() == [[0, 2, 5], [6, 8, 11]]
    assert out["alignment"] is None


def test_task_option_collapses_what_the_generator_returns():
    from fairseq.data import Dictionary

    from fairseq_nat_ext.tasks.nat_translation import NATTranslationConfig, NATTranslationTask

    class StubGenerator:
        def generate(self, models, sample, prefix_tokens=None, constraints=None):
            return [[{"tokens": torch.tensor([7, 7, 8, 2]), "positional_scores": torch.zeros(4), "score": 0.0}]]

    d = Dictionary()
    for word in "abcd":
        d.add_symbol(word)
    for flag, want in ((False, [7, 7, 8, 2]), (True, [7, 8, 2])):
        task = NATTranslationTask(NATTranslationConfig(collapse_repeats=flag), d, d)
        hypos = task.inference_step(StubGenerator(), [], {})
        assert hypos[0][0]["tokens"].tolist() == want


def test_dedup_decoding_key():
    opts = dec.parse_decoding("dedup=1,iter=10")
    assert dec.format_decoding(opts) == "iter=10,dedup=1"
    gen, task, info = dec.split_options(opts)
    assert gen == {"iter": 10} and task == {} and info == {}
    assert dec.decoding_kinds(opts) == {"nat"}
    assert dec.decoding_kinds(dec.parse_decoding("beam=5,dedup=1")) == {"ar"}
    assert dec.post_processing(opts) is collapse_all
    assert dec.post_processing(dec.parse_decoding("iter=10,dedup=0")) is None
    assert dec.post_processing(dec.parse_decoding("iter=10")) is None
    assert not hasattr(dec.generation_options(opts), "collapse_repeats")
