"""fairseq-nat-translate / examples/translate.sh, and fairseq's hub on raw text (moses + fastbpe).

A tiny BPE corpus is prepared once with examples/prepare_data.sh (so DATA_BIN/../raw holds the untokenised
reference, as for a user), then tiny models are trained in this process for a few updates: their
translations are noise, but every path (arch -> generation options, BPE removal, detokenisation, order,
scoring) is the one a trained model takes.
"""
import os
import re
import shutil
import subprocess

import pytest

from conftest import PLUGIN_DIR, ROOT, cli_env, run_cli

N_TEST = 20
SCORE_LINE = re.compile(r"^BLEU\|nrefs:1\|case:mixed\|eff:no\|tok:13a\|smooth:exp\|version:[0-9.]+ = \d+\.\d+ ")
FAST_NAT = ["--iter", "2", "--len-beam", "2"]
FAST_NAT_FLAGS = "--iter-decode-max-iter 2 --iter-decode-with-beam 2"
TINY = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2"]
TRAIN = ["--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "2000", "--num-workers", "0", "--seed", "1",
         "--no-epoch-checkpoints", "--disable-validation", "--log-format", "simple", "--max-update", "3"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """(data_bin, prep_dir) of a 300/20/20 synthetic corpus with 100 BPE merges (words really split)."""
    from fairseq_nat_ext.data import synthetic_corpus

    root = tmp_path_factory.mktemp("translate")
    raw = root / "corpus"
    assert synthetic_corpus.main([str(raw), "--train", "300", "--valid", "20", "--test", str(N_TEST)]) == 0
    prep = root / "prep"
    proc = subprocess.run(["bash", os.path.join(ROOT, "examples", "prepare_data.sh"), str(raw), "src", "tgt",
                           str(prep), "--bpe-merges", "100"], env=cli_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "@@ " in (prep / "bpe" / "test.tgt").read_text()
    return str(prep / "data-bin"), prep


def _train(data_bin, save, flags):
    from reliability_utils import train_inprocess

    train_inprocess([data_bin, "--user-dir", PLUGIN_DIR, *flags, *TINY, *TRAIN, "--save-dir", str(save)])
    return str(save / "checkpoint_last.pt")


@pytest.fixture(scope="module")
def mask_predict_ckpt(prepared):
    return _train(prepared[0], prepared[1] / "mp", ["--task", "nat_translation", "--arch", "mask_predict_tiny",
                                                    "--criterion", "mask_predict_loss"])


@pytest.fixture(scope="module")
def transformer_ckpt(prepared):
    return _train(prepared[0], prepared[1] / "at", ["--task", "translation", "--arch", "transformer",
                                                    "--criterion", "cross_entropy", "--share-all-embeddings"])


def _main(argv, capsys):
    from fairseq_nat_ext.evaluation import translate

    assert translate.main([str(a) for a in argv]) == 0
    return capsys.readouterr()


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


# ---- options -> decoding strings -> fairseq flags -------------------------------------------------------

def test_overrides_replace_one_key_and_iter_block_exclude_each_other():
    from fairseq_nat_ext.evaluation.translate import apply_overrides, default_decoding, generate_flags

    assert apply_overrides("iter=10,len_beam=3", {"iter": "4"}) == "iter=4,len_beam=3"
    assert apply_overrides("block=4", {"iter": "2"}) == "iter=2"
    assert apply_overrides("iter=10", {"block": "2", "dedup": "1"}) == "block=2,dedup=1"
    assert apply_overrides("beam=5", {}) == "beam=5"
    with pytest.raises(ValueError):
        apply_overrides("beam=5", {"beam": "0"})
    assert generate_flags("iter=10,len_beam=3,dedup=1") == \
        "--iter-decode-max-iter 10 --iter-decode-with-beam 3 --collapse-repeats"
    assert generate_flags("beam=5,lenpen=1.2") == "--beam 5 --lenpen 1.2"
    assert generate_flags("npd=10,fertility=aligner") == "--npd-samples 10"
    assert default_decoding("mask_predict", False) == "iter=10,len_beam=3"
    assert default_decoding("transformer", True) == "beam=5"
    assert default_decoding("lstm", True) == "beam=5"


def test_every_translation_model_of_the_plugin_has_a_default_decoding():
    import fairseq_nat_ext  # noqa: F401
    from fairseq.models import MODEL_REGISTRY
    from fairseq_nat_ext.evaluation import decoding as dec
    from fairseq_nat_ext.evaluation.translate import DEFAULT_DECODING

    ours = {name for name, cls in MODEL_REGISTRY.items() if cls.__module__.startswith("fairseq_nat_ext.models.nat.")}
    assert {"mask_predict", "levenshtein", "insertion", "kermit", "ctc_nat", "imputer", "nat_fertility",
            "iterative_refinement"} <= ours
    assert ours <= set(DEFAULT_DECODING), f"no default decoding for {ours - set(DEFAULT_DECODING)}"
    for name, text in DEFAULT_DECODING.items():
        assert dec.canonical_decoding(text) == text, name


def test_language_pair_and_reference_are_found_beside_the_data_bin(prepared):
    from fairseq_nat_ext.evaluation.translate import find_reference, language_pair

    data_bin, prep = prepared
    assert language_pair(data_bin, "test") == ("src", "tgt")
    assert find_reference(data_bin, "test", "tgt") == str(prep / "raw" / "test.tgt")
    assert find_reference(data_bin + "/", "valid", "src") == str(prep / "raw" / "valid.src")
    assert find_reference(data_bin, "test", "xx") is None


# ---- the command ---------------------------------------------------------------------------------------

def test_translate_sh_decodes_every_sentence_and_prints_sacrebleu(prepared, mask_predict_ckpt):
    data_bin, prep = prepared
    proc = subprocess.run(["bash", os.path.join(ROOT, "examples", "translate.sh"), data_bin, mask_predict_ckpt,
                           "test", *FAST_NAT], cwd=str(prep), env=cli_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out_lines = proc.stdout.splitlines()
    assert len(out_lines) == 1 and SCORE_LINE.match(out_lines[0]), proc.stdout
    assert f"decoding iter=2,len_beam=2 (fairseq-generate {FAST_NAT_FLAGS})" in proc.stderr
    hyp_file = mask_predict_ckpt[:-3] + ".test.tgt"
    assert f"wrote {N_TEST} hypotheses to {hyp_file}" in proc.stderr
    assert len(_lines(hyp_file)) == N_TEST


def test_translate_matches_fairseq_generate_with_the_printed_flags(prepared, mask_predict_ckpt, tmp_path, capsys):
    """Same hypotheses as fairseq-generate given the flags translate printed, BPE removed and detokenised,
    in the order of the test set; the score is sacreBLEU's on those lines against raw/test.tgt."""
    from sacrebleu.metrics import BLEU

    from fairseq_nat_ext.evaluation import scoring

    data_bin, prep = prepared
    out = tmp_path / "hyp.txt"
    res = _main([data_bin, mask_predict_ckpt, "--out", out, *FAST_NAT], capsys)
    ours = _lines(out)
    gen = run_cli(["fairseq-generate", data_bin, "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                   "--path", mask_predict_ckpt, "--gen-subset", "test", "--batch-size", "7", "--remove-bpe",
                   *FAST_NAT_FLAGS.split()])
    hyps = {int(m.group(1)): m.group(2) for m in re.finditer(r"^H-(\d+)\t\S+\t(.*)$", gen.stdout, re.M)}
    assert sorted(hyps) == list(range(N_TEST))
    assert ours == scoring.detokenize([hyps[i] for i in range(N_TEST)], "tgt")
    refs = _lines(prep / "raw" / "test.tgt")
    expected = BLEU().corpus_score(ours, [refs])
    assert res.out.strip().split(" = ")[1].startswith(f"{expected.score:.2f} ")


def test_fairseq_transformer_gets_beam_search_and_overrides(prepared, transformer_ckpt, tmp_path, capsys):
    data_bin, _ = prepared
    out = tmp_path / "at.txt"
    res = _main([data_bin, transformer_ckpt, "--out", out, "--max-len-b", "5", "--cpu"], capsys)
    assert "fairseq:transformer (arch transformer)" in res.err
    assert "decoding beam=5,max_len_b=5 (fairseq-generate --beam 5 --max-len-b 5)" in res.err
    assert SCORE_LINE.match(res.out) and len(_lines(out)) == N_TEST


def test_without_reference_hypotheses_are_written_and_not_scored(prepared, mask_predict_ckpt, tmp_path, capsys):
    data_bin, _ = prepared
    alone = tmp_path / "elsewhere" / "data-bin"
    shutil.copytree(data_bin, alone)
    out = tmp_path / "h.txt"
    res = _main([alone, mask_predict_ckpt, "--out", out, *FAST_NAT], capsys)
    assert res.out == "" and "no reference" in res.err and len(_lines(out)) == N_TEST


def test_wrong_options_are_one_line_errors(prepared, mask_predict_ckpt, tmp_path):
    from fairseq_nat_ext.evaluation import translate

    data_bin, prep = prepared
    with pytest.raises(SystemExit, match="sets autoregressive options but mask_predict_tiny uses"):
        translate.main([data_bin, mask_predict_ckpt, "--beam", "2", "--out", str(tmp_path / "a")])
    short = tmp_path / "ref.txt"
    short.write_text("a\nb\nc\nd\ne\n")
    with pytest.raises(SystemExit, match="ref.txt has 5 lines but valid of .* has 20 sentences"):
        translate.main([data_bin, mask_predict_ckpt, "--split", "valid", "--ref", str(short), *FAST_NAT,
                        "--out", str(tmp_path / "b")])


# ---- fairseq's hub on raw text ---------------------------------------------------------------------------

def test_from_pretrained_translates_raw_text_with_moses_and_fastbpe(prepared, mask_predict_ckpt, tmp_path, capsys):
    """The documented raw-text path: fairseq's hub interface with tokenizer="moses", bpe="fastbpe" (the
    codes prepare_data.sh learnt) calls the plugin's generator and gives what the command gives."""
    pytest.importorskip("fastBPE")
    import fairseq_nat_ext
    from fairseq.models import ARCH_MODEL_REGISTRY

    data_bin, prep = prepared
    hub = ARCH_MODEL_REGISTRY["mask_predict"].from_pretrained(
        os.path.dirname(mask_predict_ckpt), checkpoint_file=os.path.basename(mask_predict_ckpt),
        data_name_or_path=data_bin, tokenizer="moses", bpe="fastbpe", bpe_codes=str(prep / "bpe.codes"),
        source_lang="src", target_lang="tgt", user_dir=fairseq_nat_ext.__path__[0])
    hub.eval()
    generator = hub.task.build_generator(hub.models, hub.cfg.generation)
    assert type(generator).__module__.startswith("fairseq_nat_ext.generators."), type(generator)
    raw = _lines(prep / "raw" / "test.src")[:3]
    assert hub.encode(raw[0]).tolist() == [hub.task.source_dictionary.index(t) for t in
                                            _lines(prep / "bpe" / "test.src")[0].split()] + [2]
    translations = hub.translate(raw, iter_decode_max_iter=2, iter_decode_with_beam=2)
    out = tmp_path / "cli.txt"
    _main([data_bin, mask_predict_ckpt, "--out", out, *FAST_NAT], capsys)
    assert translations == _lines(out)[:3]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["mask_predict", "levenshtein", "insertion", "ctc_nat", "imputer",
                                  "iterative_refinement", "nat_fertility", "kermit", "efficient_transformer"])
def test_every_arch_translates_with_its_default_decoding(arch, tiny_checkpoints, toy_databin, tmp_path, capsys):
    """Each of the plugin's translation archs (2-update checkpoints of tests/reliability_utils.ARCHS on the
    toy corpus, whose untokenised files lie in DATA_BIN/../raw) through its default generation options."""
    from fairseq_nat_ext.evaluation.translate import DEFAULT_DECODING

    data_bin, raw = toy_databin
    out = tmp_path / "hyp.txt"
    short = ["--max-len-b", "10"] if arch not in DEFAULT_DECODING else []  # an untrained AR model: 200 tokens
    res = _main([data_bin, tiny_checkpoints(arch), "--out", out, "--cpu", *short], capsys)
    assert SCORE_LINE.match(res.out), res.err[-2000:]
    expected = DEFAULT_DECODING.get(arch, "beam=5,max_len_b=10")
    assert f"decoding {expected} (fairseq-generate" in res.err
    assert len(_lines(out)) == len(_lines(os.path.join(raw, "test.tgt")))
