"""The synthetic multi-modal corpus: determinism, grammar, and real multi-modality."""
import collections
import os
import subprocess
import sys

import pytest

from conftest import ROOT, cli_env
from fairseq_nat_ext.data import synthetic_corpus as sc

SIZES = {"train": 3000, "valid": 100, "test": 100}


@pytest.fixture(scope="module")
def corpus():
    return sc.generate_corpus(seed=1, sizes=SIZES)


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def test_cli_writes_byte_identical_files_for_same_seed(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    args = ["--train", "300", "--valid", "20", "--test", "20"]
    proc = subprocess.run(
        [sys.executable, "-m", "fairseq_nat_ext.data.synthetic_corpus", "--out", str(a), *args],
        cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert sc.main(["--out", str(b), "--seed", "1", *args]) == 0
    assert sc.main(["--out", str(c), "--seed", "2", *args]) == 0
    names = [f"{s}.{side}" for s in ("train", "valid", "test") for side in ("src", "tgt")]
    assert sorted(os.listdir(a)) == sorted(names)
    for name in names:
        assert _read(a / name) == _read(b / name), name
    assert _read(a / "train.src") != _read(c / "train.src")
    lines = _read(a / "train.src").decode("utf-8").split("\n")
    assert lines[-1] == "" and len(lines) == 301  # one sentence per line, final newline
    assert len(_read(a / "valid.tgt").decode().splitlines()) == 20


def test_lexicon_is_fixed_and_unambiguous():
    # every target form is unique and maps back to one (source word, style)
    forms = [f for fs in sc.LEXICON.values() for f in fs]
    assert len(forms) == len(set(forms)) == len(sc.REVERSE_LEXICON)
    assert all(len(fs) == sc.NUM_STYLES for fs in sc.LEXICON.values())
    assert not set(forms) & set(sc.WORD_CLASS)  # no target form is a source word
    assert sc._build_lexicon() == sc.LEXICON


def test_grammar_lengths_and_vocabulary(corpus):
    src_types, tgt_types = set(), set()
    for split, pairs in corpus.items():
        assert len(pairs) == SIZES[split]
        for src, tgt in pairs:
            words = src.split()
            assert words[-1] == "."
            assert sc.MIN_WORDS <= len(words) - 1 <= sc.MAX_WORDS
            assert len(tgt.split()) == len(words)
            sc.parse_source(src)  # raises when not in the language
            src_types.update(words)
            tgt_types.update(tgt.split())
    assert len(src_types) + len(tgt_types) < 600  # a few hundred types in all


def test_every_target_is_valid_and_all_modes_occur(corpus):
    modes = collections.Counter()
    for pairs in corpus.values():
        for src, tgt in pairs:
            assert sc.is_valid_translation(src, tgt), (src, tgt)
            assert tgt in sc.valid_targets(src)
    for src, tgt in corpus["train"]:
        sent = sc.parse_source(src)
        has_adj = any(np[1] for np in [sent.subj, sent.obj] + [p[1] for p in sent.pps] if np)
        movable_verb = sent.obj is not None or sent.pps or sent.adv
        if has_adj and movable_verb:  # all three choices are visible in the target
            modes[sc.analyse_translation(src, tgt)] += 1
    assert len(modes) == 12
    assert min(modes.values()) > 0.3 * max(modes.values())  # roughly balanced


def test_same_source_has_several_targets_in_train(corpus):
    targets = collections.defaultdict(set)
    for src, tgt in corpus["train"]:
        targets[src].add(tgt)
    repeated = [s for s, t in targets.items() if len(t) >= 3]
    assert len(repeated) >= 20
    src = repeated[0]
    assert targets[src] <= sc.valid_targets(src)


def test_mixed_modes_are_invalid():
    src = "the big dog sees a small red cat near the old tree today ."
    valid = sc.valid_targets(src)
    assert len(valid) == 12
    sent = sc.parse_source(src)
    base = sc.target_string(sent, 0, False, False)
    assert base in valid and sc.analyse_translation(src, base) == (0, False, False)
    # one word from another style: invalid
    words = base.split()
    src_word, style = sc.REVERSE_LEXICON[words[2]]
    words[2] = sc.LEXICON[src_word][1]
    assert not sc.is_valid_translation(src, " ".join(words))
    # adjectives after the noun in one noun phrase only: invalid
    mixed = base.split()
    mixed[1], mixed[2] = mixed[2], mixed[1]  # subject: DET NOUN ADJ, other NPs unchanged
    assert not sc.is_valid_translation(src, " ".join(mixed))
    flipped = sc.target_string(sent, 2, True, True)
    assert sc.analyse_translation(src, flipped) == (2, True, True)
    assert flipped.split()[-2] == sc.LEXICON["sees"][2]  # verb final
    # a source with no adjective and nothing after the verb has only 3 targets
    assert len(sc.valid_targets("the dog sleeps .")) == 3


def test_rejects_sentences_outside_the_language():
    for bad in ["dog the sleeps .", "the dog sleeps", "the dog sees .", "the dog sleeps . .", "the cow sleeps ."]:
        with pytest.raises(ValueError):
            sc.parse_source(bad)
        assert not sc.is_valid_translation(bad, "x")


def test_options_restrict_modes():
    corpus = sc.generate_corpus(seed=3, sizes={"train": 200}, styles=1, reorder_prob=0.0, repeat_frac=0.0)
    for src, tgt in corpus["train"]:
        assert sc.analyse_translation(src, tgt) == (0, False, False)
