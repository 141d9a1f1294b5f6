"""Tests of the evaluation harness (fairseq_nat_ext.evaluation) and the table writer (benchmarks.tables).

Fast tests use hand-made strings and results; the one end-to-end test (marked slow) benchmarks the
shared Multi30K teacher on 20 test sentences and is skipped when ../shared is absent.
"""
import copy
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu

from fairseq_nat_ext.evaluation import decoding as dec
from fairseq_nat_ext.evaluation import provenance
from fairseq_nat_ext.evaluation import results as res
from fairseq_nat_ext.evaluation import scoring

from benchmarks import tables
from conftest import teacher_test_databin

REPO = Path(__file__).resolve().parents[1]


# ---- scoring -----------------------------------------------------------------------------------
BPE_HYPS = [
    "Ein Mann mit einem orang@@ efar@@ benen Hut , der etwas an@@ starrt .",
    "Ben &amp; Jerry verkaufen &quot; Eis &quot; .",
    "Zwei Hunde spielen im Schnee",
]
EXPECTED_DETOK = [
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    'Ben & Jerry verkaufen "Eis".',
    "Zwei Hunde spielen im Schnee",
]
RAW_REFS = [
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    'Ben & Jerry verkaufen "Eiscreme".',
    "Zwei Hunde spielen draußen im Schnee.",
]


def test_remove_bpe_matches_fairseq():
    assert scoring.remove_bpe("an@@ starr@@ t .") == "anstarrt ."
    assert scoring.remove_bpe("ab@@") == "ab"  # fairseq appends " " before removing "@@ "
    assert scoring.remove_bpe("a@@ ") == "a"


def test_bleu_pipeline_removes_bpe_detokenises_and_scores_against_raw_reference():
    scores = scoring.score_hypotheses(BPE_HYPS, RAW_REFS, "de")
    assert scores.detok_hyps == EXPECTED_DETOK
    direct = sacrebleu.corpus_bleu(EXPECTED_DETOK, [RAW_REFS])
    assert scores.bleu == pytest.approx(direct.score, abs=1e-9)
    assert scores.signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    tok_hyps = [scoring.remove_bpe(h) for h in BPE_HYPS]
    tok_refs = scoring.tokenize(RAW_REFS, "de")
    assert tok_refs[1] == "Ben &amp; Jerry verkaufen &quot; Eiscreme &quot; ."
    tok_direct = sacrebleu.corpus_bleu(tok_hyps, [tok_refs], tokenize="none")
    assert scores.tok_bleu == pytest.approx(tok_direct.score, abs=1e-9)
    assert 0 < scores.bleu < 100


def test_bleu_rejects_length_mismatch():
    with pytest.raises(ValueError, match="2 hypotheses but 3 reference"):
        scoring.sacrebleu_score(EXPECTED_DETOK[:2], RAW_REFS)


def test_read_lines_plain_and_gz(tmp_path):
    text = "erste Zeile\nzweite Zeile\n"
    (tmp_path / "r.txt").write_text(text, encoding="utf-8")
    with gzip.open(tmp_path / "r.txt.gz", "wt", encoding="utf-8") as f:
        f.write(text)
    assert scoring.read_lines(tmp_path / "r.txt") == ["erste Zeile", "zweite Zeile"]
    assert scoring.read_lines(str(tmp_path / "r.txt.gz")) == ["erste Zeile", "zweite Zeile"]


def test_repeat_rate_hand_made():
    assert scoring.repeat_rate(["a a b", "c c c", ""]) == pytest.approx(3 / 6)
    assert scoring.repeat_rate(["der Hund", "a b a b"]) == 0.0
    assert scoring.repeat_rate([]) == 0.0
    assert scoring.repeat_rate(["x"]) == 0.0
    # counted on words after BPE removal, within sentences only
    scores = scoring.score_hypotheses(
        ["das das Haus", "ein Ha@@ us Haus", "Haus@@ e Haus"], ["a", "b", "c"], "de"
    )
    assert scores.repeat_rate == pytest.approx(2 / 8)


# ---- decoding strings --------------------------------------------------------------------------
def test_decoding_parse_and_format():
    assert dec.parse_decoding("iter=10,len_beam=3") == {"iter": 10, "len_beam": 3}
    assert dec.format_decoding({"len_beam": 3, "iter": 10}) == "iter=10,len_beam=3"
    assert dec.canonical_decoding("len_beam=3,iter=10.0") == "iter=10,len_beam=3"
    assert dec.canonical_decoding("beam=5") == "beam=5"
    assert dec.canonical_decoding("iter=10,force=true") == "iter=10,force=1"
    assert dec.canonical_decoding("beam=4,lenpen=1.0") == "beam=4,lenpen=1"
    assert dec.canonical_decoding("beam=4,lenpen=0.6") == "beam=4,lenpen=0.6"
    assert dec.is_canonical_decoding("iter=10,len_beam=3")
    assert not dec.is_canonical_decoding("len_beam=3,iter=10")
    assert dec.decoding_kinds({"beam": 5}) == {"ar"}
    assert dec.decoding_kinds({"iter": 4, "len_beam": 3}) == {"nat"}


def test_descriptive_and_task_keys():
    opts = dec.parse_decoding("loss=binary_tree,iter=10,order=sequential,dir=de-en")
    assert dec.format_decoding(opts) == "iter=10,order=sequential,dir=de-en,loss=binary_tree"
    gen, task, info = dec.split_options(opts)
    assert gen == {"iter": 10} and task == {"insertion_decoding": "sequential"}
    assert info == {"dir": "de-en", "loss": "binary_tree"}
    assert dec.decoding_kinds(opts) == {"nat"}
    ns = dec.generation_options(opts)
    assert ns.iter_decode_max_iter == 10 and not hasattr(ns, "dir")


@pytest.mark.parametrize(
    "bad", ["", "beam", "beam=5 ", "beam=5,,iter=2", "beam=0", "beam=2.5", "foo=1",
            "beam=5,beam=4", "iter=10, len_beam=3", "force=maybe", "lenpen=nan", "dir=en/de",
            "loss=1x"],
)
def test_decoding_rejects(bad):
    with pytest.raises(ValueError):
        dec.parse_decoding(bad)


def test_generation_options_map_to_fairseq_names():
    ns = dec.generation_options({"iter": 10, "len_beam": 3, "force": True})
    assert (ns.iter_decode_max_iter, ns.iter_decode_with_beam, ns.iter_decode_force_max_iter) == (
        10, 3, True)
    assert ns.beam == 5 and ns.max_len_b == 200  # fairseq-generate's defaults otherwise
    assert dec.generation_options({"beam": 1}).beam == 1


# ---- results schema ----------------------------------------------------------------------------
def _row(**kw):
    row = dict(system="mask_predict", decoding="iter=10,len_beam=3", distilled=True, bleu=30.5,
               tok_bleu=30.1, latency_ms_b1=12.5, sent_per_s_b128=250.0, iterations=7.5,
               repeat_rate=0.012, train_updates=30000, train_wall_s=3600.0,
               hyp="benchmarks/results/mask_predict/mask_predict__iter=10,len_beam=3__distilled.txt")
    row.update(kw)
    return row


def _results(rows=None):
    r = res.new_results("mask_predict", "multi30k test_2016_flickr", "AMD EPYC, 2 cores", 2,
                        "bash examples/benchmark/mask_predict.sh",
                        "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3")
    r["rows"] = rows if rows is not None else [
        _row(), _row(system="fairseq:transformer", decoding="beam=5", distilled=False,
                     iterations=14.2, hyp="benchmarks/results/mask_predict/fairseq_transformer__beam=5.txt"),
        _row(system="reference", decoding="none", distilled=False, bleu=100.0, tok_bleu=100.0,
             latency_ms_b1=0.0, sent_per_s_b128=0.0, iterations=0.0, train_updates=0,
             train_wall_s=0.0, hyp="../shared/data/multi30k/test_2016_flickr.de.gz"),
    ]
    return r


def test_validator_accepts_good_results(tmp_path):
    good = _results()
    assert res.validate_results(good) == []
    path = tmp_path / "mask_predict.json"
    res.save_results(path, good)
    assert res.load_results(path) == good
    assert res.validate_results(json.loads(path.read_text())) == []


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r["rows"][0].update(repeat_rate=1.5), "repeat_rate"),
        (lambda r: r["rows"][0].update(repeat_rate=-0.1), "repeat_rate"),
        (lambda r: r["rows"][0].update(bleu=101.0), "bleu"),
        (lambda r: r["rows"][0].pop("latency_ms_b1"), "missing key 'latency_ms_b1'"),
        (lambda r: r.pop("sacrebleu_signature"), "missing key 'sacrebleu_signature'"),
        (lambda r: r.update(extra=1), "unexpected key 'extra'"),
        (lambda r: r["rows"][0].update(note="x"), "unexpected key 'note'"),
        (lambda r: r["rows"][0].update(train_updates=3.5), "train_updates"),
        (lambda r: r["rows"][0].update(distilled="yes"), "distilled"),
        (lambda r: r["rows"][0].update(bleu="30.5"), "bleu"),
        (lambda r: r["rows"][0].update(bleu=True), "bleu"),
        (lambda r: r.update(threads=2.0), "threads"),
        (lambda r: r["rows"][0].update(decoding="iter=10, len_beam=3"), "decoding"),
        (lambda r: r["rows"][0].update(decoding="len_beam=3,iter=10"), "decoding"),
        (lambda r: r["rows"][2].update(decoding="beam=5"), "decoding"),
        (lambda r: r["rows"].append(copy.deepcopy(r["rows"][0])), "duplicate"),
    ],
)
def test_validator_rejects_bad_results(mutate, message):
    bad = _results()
    mutate(bad)
    errors = res.validate_results(bad)
    assert errors and any(message in e for e in errors), errors
    with pytest.raises(res.ResultsSchemaError):
        res.check_results(bad)


def test_save_refuses_invalid_results(tmp_path):
    bad = _results()
    bad["rows"][0]["repeat_rate"] = 2.0
    with pytest.raises(res.ResultsSchemaError):
        res.save_results(tmp_path / "x.json", bad)
    assert not (tmp_path / "x.json").exists()


def test_upsert_replaces_same_key_and_keeps_other_rows():
    r = _results()
    before = copy.deepcopy(r["rows"])
    res.upsert_row(r, _row(bleu=31.0))  # same (system, decoding, distilled) as rows[0]
    assert len(r["rows"]) == 3
    assert r["rows"][0]["bleu"] == 31.0
    assert r["rows"][1:] == before[1:]
    res.upsert_row(r, _row(distilled=False))  # another key: appended
    assert len(r["rows"]) == 4 and r["rows"][:3][1:] == before[1:]
    assert res.validate_results(r) == []


def test_make_row_types_and_hyp_names():
    row = res.make_row("fairseq:transformer", "beam=5", 0, 33, 33.2, 50, 100, 14, 0.01, 1300.0,
                       5700, "x.txt")
    assert isinstance(row["bleu"], float) and isinstance(row["train_updates"], int)
    assert row["distilled"] is False
    with pytest.raises(res.ResultsSchemaError):
        res.make_row("m", "beam=5", False, 33, 33, 1, 1, 1, 1.2, 0, 0, "x.txt")
    assert res.hyp_filename("fairseq:transformer", "beam=5", False) == "fairseq_transformer__beam=5.txt"
    assert res.hyp_filename("mask_predict", "iter=4,len_beam=3", True) == (
        "mask_predict__iter=4,len_beam=3__distilled.txt")
    assert res.hyp_path("benchmarks/results/mask_predict.json", "mask_predict", "mask_predict",
                        "iter=4", False) == "benchmarks/results/mask_predict/mask_predict__iter=4.txt"


# ---- provenance --------------------------------------------------------------------------------
def test_training_stats_from_state_and_log(tmp_path):
    state = {"optimizer_history": [{"num_updates": 10}, {"num_updates": 1300}],
             "extra_state": {"previous_training_time": 5699.7}}
    assert provenance.training_stats_from_state(state) == (1300, 5699.7)
    metrics_only = {"optimizer_history": [{"num_updates": 5}],
                    "extra_state": {"metrics": {"default": [(790, "wall", "TimeMeter",
                                                             {"init": 42.0, "n": 0})]}}}
    assert provenance.training_stats_from_state(metrics_only) == (5, 42.0)
    log = tmp_path / "train.log"
    log.write_text(
        "2024 | INFO | train_inner | epoch 001:  10 / 60 loss=9.1, num_updates=10, wall=30\n"
        "2024 | INFO | train | epoch 011 | loss 4.2 | num_updates 1300 | lr 0.0005 | wall 5712\n"
        "2024 | INFO | valid | epoch 011 | valid on 'valid' subset | loss 4.6 | num_updates 1300\n"
        "2024 | INFO | fairseq_cli.train | done training in 5713.0 seconds\n"
    )
    assert provenance.training_stats_from_log(log) == (1300, 5712.0)
    with open(log, "a") as f:  # a later train_inner line (simple format uses '=')
        f.write("2024 | INFO | train_inner | epoch 012:  20 / 60 loss=4.1, num_updates=1320, wall=5790\n")
    assert provenance.training_stats_from_log(log) == (1320, 5790.0)
    json_log = tmp_path / "json.log"
    json_log.write_text('{"epoch": 3, "num_updates": "900", "wall": "1234"}\n')
    assert provenance.training_stats_from_log(json_log) == (900, 1234.0)
    # explicit values win; missing ones come from the state; nothing -> error naming the option
    assert provenance.resolve_training_stats(7, None, None, state) == (7, 5699.7)
    with pytest.raises(ValueError, match="--train-wall-s"):
        provenance.resolve_training_stats(None, None, None, {"optimizer_history": [{"num_updates": 1}]})


def test_arch_and_system_name():
    from argparse import Namespace

    assert provenance.arch_of_state({"cfg": {"model": Namespace(arch="transformer")}}) == "transformer"
    assert provenance.arch_of_state({"cfg": {"model": {"_name": "mask_predict"}}}) == "mask_predict"
    assert provenance.arch_of_state({"cfg": None, "args": Namespace(arch="cmlm_transformer")}) == (
        "cmlm_transformer")
    assert provenance.system_name("mask_predict", "fairseq_nat_ext.models.nat.mask_predict") == (
        "mask_predict")
    assert provenance.system_name("transformer", "fairseq.models.transformer.transformer_legacy") == (
        "fairseq:transformer")
    assert "cores" in provenance.hardware_description("cpu")


def test_portable_paths_name_no_machine(tmp_path, monkeypatch):
    """Results record paths relative to the repository root (``../shared/x`` next to it), never absolute."""
    repo = tmp_path / "checkout"
    (repo / ".git").mkdir(parents=True)
    (repo / "runs").mkdir()
    monkeypatch.chdir(repo / "runs")
    assert provenance.repository_root() == str(repo)
    assert provenance.portable_path(str(repo / "runs" / "data-bin")) == "runs/data-bin"
    assert provenance.portable_path("data-bin") == "runs/data-bin"  # a relative path is read from the cwd
    assert provenance.portable_path(str(tmp_path / "shared" / "t.pt")) == "../shared/t.pt"
    assert provenance.portable_path("") == ""
    words = ["--data-bin", str(repo / "runs" / "d"), "--system-ckpt", f"{repo}/a.pt:{repo}/b.pt",
             "--generation-option", f"npd_teacher={tmp_path}/shared/t.pt", f"--out={repo}/o.json",
             "--decoding", "iter=10,len_beam=3", "a b"]
    assert provenance.portable_command(words) == (
        "--data-bin runs/d --system-ckpt a.pt:b.pt --generation-option npd_teacher=../shared/t.pt "
        "--out=o.json --decoding iter=10,len_beam=3 'a b'")
    text = (f"training: INIT_FROM={tmp_path}/shared/t.pt (see {repo}/runs/x.) DATA_BIN={repo}/runs/d, "
            f"2 words/s, en->de, ratio 1 / 2; RAW_REF='{tmp_path}/shared/ref.gz'")
    assert provenance.portable_text(text) == (
        "training: INIT_FROM=../shared/t.pt (see runs/x.) DATA_BIN=runs/d, 2 words/s, en->de, ratio 1 / 2; "
        "RAW_REF='../shared/ref.gz'")
    assert provenance.portable_text(None) is None
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    monkeypatch.chdir(outside)
    if provenance.repository_root() is None:  # outside a checkout: relative to the current directory
        assert provenance.portable_path(str(outside / "x.json")) == "x.json"
        assert provenance.portable_path(str(tmp_path / "shared")) == "../shared"


# ---- tables and docs/benchmarks.md ---------------------------------------------------------------
def test_markdown_table_and_docs_markers(tmp_path, capsys):
    path = tmp_path / "mask_predict.json"
    res.save_results(path, _results())
    assert tables.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### mask_predict")
    assert "| `mask_predict` | `iter=10,len_beam=3` | yes | 30.50 | 30.10 | 12.5 |" in out
    assert "| `reference` | – | no | – | – | – | – | – | 1.20 |" in out
    hyp = "benchmarks/results/mask_predict/mask_predict__iter=10,len_beam=3__distilled.txt"
    assert f"[txt]({hyp})" in out  # printed: the path from the repository root, as in the JSON

    page = tmp_path / "benchmarks.md"
    original = "# Title\n\nintro\n<!-- results:begin -->\nold table\n<!-- results:end -->\n\nafter\n"
    page.write_text(original)
    assert tables.main([str(path), "--update-docs", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# Title\n\nintro\n<!-- results:begin -->\n### mask_predict")
    assert text.endswith("<!-- results:end -->\n\nafter\n")
    assert "old table" not in text
    link = os.path.relpath(REPO / hyp, tmp_path)
    assert f"[txt]({link})" in text  # written into the page: relative to the page's folder
    assert tables.main([str(path), "--update-docs", str(page)]) == 0  # idempotent
    assert page.read_text() == text
    capsys.readouterr()

    no_markers = tmp_path / "NOMARK.md"
    no_markers.write_text("# nothing here\n")
    assert tables.main([str(path), "--update-docs", str(no_markers)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "markers" in err
    assert no_markers.read_text() == "# nothing here\n"
    assert tables.main([str(path), "--update-docs", str(tmp_path / "missing.md")]) == 1
    assert not (tmp_path / "missing.md").exists()
    with pytest.raises(SystemExit):  # the README target is gone: tables go to docs/benchmarks.md
        tables.main([str(path), "--update-readme", str(page)])


def test_docs_page_links_are_relative_to_docs(tmp_path):
    """From docs/benchmarks.md a hypothesis file of benchmarks/results/ is ../benchmarks/results/...;
    the page itself is another engineer's (a temp copy with the markers stands in for it)."""
    path = tmp_path / "mask_predict.json"
    res.save_results(path, _results())
    text = tables.markdown_tables([str(path)], link_dir=str(REPO / "docs"))
    assert "[txt](../benchmarks/results/mask_predict/mask_predict__iter=10,len_beam=3__distilled.txt)" in text


def test_replace_between_markers_rejects_misordered():
    with pytest.raises(ValueError):
        tables.replace_between_markers("<!-- results:end -->\n<!-- results:begin -->\n", "x")


def test_markers_count_only_as_lines_of_their_own():
    """docs/benchmarks.md names the markers in its prose (in backquotes): only the marker lines count."""
    text = ("Rewrites the text between `<!-- results:begin -->` and `<!-- results:end -->`.\n\n"
            "<!-- results:begin -->\nold\n<!-- results:end -->\ntail\n")
    new = tables.replace_between_markers(text, "### t\n")
    assert new == ("Rewrites the text between `<!-- results:begin -->` and `<!-- results:end -->`.\n\n"
                   "<!-- results:begin -->\n### t\n<!-- results:end -->\ntail\n")
    with pytest.raises(ValueError):
        tables.replace_between_markers("only `<!-- results:begin -->` in prose\n<!-- results:end -->\n", "x")


def test_plot_writes_png(tmp_path):
    from benchmarks.plot import plot_results

    png = plot_results(_results(), str(tmp_path / "mask_predict.png"))
    assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- end to end: the shared teacher on 20 test sentences ---------------------------------------
E2E_LINES = range(2, 22)  # test_2016_flickr lines 2..21 (0-based)


@pytest.mark.slow
def test_end_to_end_teacher_beam1(tmp_path):
    teacher = teacher_test_databin(tmp_path, E2E_LINES)
    env = dict(os.environ, OMP_NUM_THREADS="2")
    out = tmp_path / "results" / "e2e.json"
    base = [sys.executable, "-m", "fairseq_nat_ext.evaluation.run", "--benchmark", "e2e",
            "--data-bin", str(tmp_path / "data-bin"), "--raw-ref", str(tmp_path / "raw.de"),
            "--src-lang", "en", "--tgt-lang", "de", "--system-ckpt", str(teacher / "teacher.pt"),
            "--train-wall-s", "5700", "--valid-subset", "test", "--out", str(out)]
    proc = subprocess.run(
        base + ["--decoding", "beam=1", "--decoding", "beam=1,dedup=1", "--no-distilled", "--threads", "2",
                "--latency-sentences", "5", "--warmup-sentences", "1", "--reference-row", "--valid-tune"],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = res.load_results(out)  # validates the schema
    assert str(tmp_path) not in results["command"] + results["data"]  # recorded relative, not absolute
    rows = {(r["system"], r["decoding"]): r for r in results["rows"]}
    assert set(rows) == {("fairseq:transformer", "beam=1"), ("fairseq:transformer", "beam=1,dedup=1"),
                         ("reference", "none")}
    row = rows["fairseq:transformer", "beam=1"]
    dedup = rows["fairseq:transformer", "beam=1,dedup=1"]
    assert dedup["bleu"] > 20 and dedup["hyp"] != row["hyp"]
    assert row["decoding"] == "beam=1" and row["train_updates"] == 1300
    assert row["bleu"] > 20, row
    assert 1 < row["iterations"] < 60 and row["latency_ms_b1"] > 0 and row["sent_per_s_b128"] > 0
    hyps = (tmp_path / row["hyp"]).read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 20 and all(hyps)
    refs = scoring.read_lines(tmp_path / "raw.de")
    assert row["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-3)
    assert not (tmp_path / "results" / "e2e.png").exists()  # the harness draws no plot (benchmarks.plot does)
    tune = json.loads((tmp_path / "results" / "e2e" / "valid_tune.json").read_text())["entries"]
    assert [(e["system"], e["decoding"], e["subset"], e["train_updates"]) for e in tune] == [
        ("fairseq:transformer", "beam=1", "test", 1300), ("fairseq:transformer", "beam=1,dedup=1", "test", 1300)]
    assert tune[0]["tok_bleu"] > 20 and 1 < tune[0]["iterations"] < 60
    # --valid-only: the valid scores only; the results file is left as it was (whatever --threads)
    before = out.read_text()
    again = subprocess.run(base + ["--decoding", "beam=2", "--threads", "1", "--valid-only"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert out.read_text() == before
    tune = json.loads((tmp_path / "results" / "e2e" / "valid_tune.json").read_text())["entries"]
    assert [e["decoding"] for e in tune] == ["beam=1", "beam=1,dedup=1", "beam=2"]


def test_descriptive_keys_are_checked_against_the_run():
    from types import SimpleNamespace

    from fairseq_nat_ext.evaluation.run import _check_info

    run = SimpleNamespace(src_lang="de", tgt_lang="en")
    model = SimpleNamespace(args=SimpleNamespace(insertion_loss="binary_tree", insertion_tau=1.0))
    _check_info({"dir": "de-en", "loss": "binary_tree"}, run, model, "d")
    with pytest.raises(SystemExit, match="dir=en-de but the run decodes de-en"):
        _check_info({"dir": "en-de"}, run, model, "d")
    with pytest.raises(SystemExit, match="loss=uniform but the checkpoint was trained with binary_tree slot weights"):
        _check_info({"loss": "uniform"}, run, model, "d")
    model.args.insertion_tau = 0.0
    _check_info({"loss": "uniform"}, run, model, "d")
    with pytest.raises(SystemExit, match="has none"):
        _check_info({"loss": "uniform"}, run, SimpleNamespace(args=SimpleNamespace()), "d")
    # rollin: ours from --levt-rollin, fairseq's levenshtein_transformer is "fairseq"
    _check_info({"rollin": "paper"}, run, SimpleNamespace(args=SimpleNamespace(levt_rollin="paper")), "d")
    with pytest.raises(SystemExit, match="rollin=paper but the checkpoint was trained with the fairseq roll-in"):
        _check_info({"rollin": "paper"}, run, SimpleNamespace(args=SimpleNamespace(levt_rollin="fairseq")), "d")
    from fairseq.models.nat.levenshtein_transformer import LevenshteinTransformerModel

    fs_levt = LevenshteinTransformerModel.__new__(LevenshteinTransformerModel)  # no weights needed
    _check_info({"rollin": "fairseq"}, run, fs_levt, "d")
    with pytest.raises(SystemExit, match="rollin=paper but the checkpoint was trained with the fairseq"):
        _check_info({"rollin": "paper"}, run, fs_levt, "d")
    with pytest.raises(SystemExit, match="names a Levenshtein roll-in but the model has none"):
        _check_info({"rollin": "paper"}, run, model, "d")
    assert dec.format_decoding(dec.parse_decoding("rollin=fairseq,iter=10")) == "iter=10,rollin=fairseq"
    # softmax: the checkpoint's --insertion-softmax (checkpoints from before the option: slot)
    _check_info({"softmax": "slot"}, run, model, "d")
    with pytest.raises(SystemExit, match="softmax=joint but the checkpoint was trained with the slot softmax"):
        _check_info({"softmax": "joint"}, run, model, "d")
    model.args.insertion_softmax = "joint"
    _check_info({"softmax": "joint", "loss": "uniform"}, run, model, "d")
    with pytest.raises(SystemExit, match="names an insertion softmax but the model has none"):
        _check_info({"softmax": "slot"}, run, SimpleNamespace(args=SimpleNamespace(levt_rollin="paper")), "d")
    with pytest.raises(ValueError, match="expected one of paper, fairseq"):
        dec.parse_decoding("iter=10,rollin=beta")


def test_training_wall_time_sums_the_runs_of_a_resumed_log(tmp_path):
    # two fairseq-train processes appended to one log; the second one's wall meter restarts (logs 0)
    log = tmp_path / "train.log"
    log.write_text(
        "2026-11-29 20:00:00 | INFO | fairseq_cli.train | {'_name': None, 'common': {}}\n"
        "2026-11-29 20:10:00 | INFO | train_inner | epoch 001:  10 / 60 num_updates=100, wall=600\n"
        "2026-11-29 20:20:00 | INFO | train_inner | epoch 002:  10 / 60 num_updates=200, wall=1200\n"
        "some line without a timestamp (a warning)\n"
        "2026-11-29 23:00:00 | INFO | fairseq_cli.train | {'_name': None, 'common': {}}\n"
        "2026-11-29 23:05:00 | INFO | train_inner | epoch 002:  30 / 60 num_updates=260, wall=0\n"
    )
    assert provenance.training_stats_from_log(log) == (260, 1200.0 + 300.0)


def test_training_wall_time_gives_a_process_preamble_to_its_own_run(tmp_path):
    # a run killed at 20:20, the next process starts hours later and logs an import line BEFORE its config
    log = tmp_path / "train.log"
    log.write_text(
        "2026-11-29 20:00:00 | INFO | fairseq_cli.train | {'_name': None, 'common': {}}\n"
        "2026-11-29 20:20:00 | INFO | train_inner | epoch 002:  10 / 60 num_updates=200, wall=1200\n"
        "2026-11-30 09:00:00 | INFO | fairseq.tasks.text_to_speech | Please install tensorboardX\n"
        "2026-11-30 09:00:02 | INFO | fairseq_cli.train | {'_name': None, 'common': {}}\n"
        "2026-11-30 09:10:00 | INFO | train_inner | epoch 002:  30 / 60 num_updates=260, wall=0\n"
    )
    assert provenance.training_stats_from_log(log) == (260, 1200.0 + 600.0)


def test_oracle_results_get_their_own_table(tmp_path):
    import json

    from benchmarks import tables

    path = tmp_path / "oracle.json"
    rows = [{"impl": "ours", "batch": 256, "device": "cpu", "ms_per_batch": 43.3, "same_edit_count": True},
            {"impl": "libnat", "batch": 256, "device": "cpu", "ms_per_batch": 9.4, "same_edit_count": False}]
    path.write_text(json.dumps({"benchmark": "oracle", "hardware": "cpu", "threads": 1, "command": "x",
                                "rows": rows}))
    text = tables.markdown_tables([str(path)])
    assert "| ours | 256 | cpu | 43.30 | yes |" in text and "| libnat | 256 | cpu | 9.40 | NO |" in text
    del rows[0]["ms_per_batch"]
    path.write_text(json.dumps({"benchmark": "oracle", "hardware": "cpu", "threads": 1, "command": "x",
                                "rows": rows}))
    with pytest.raises(ValueError, match=r"rows\[0\]: missing ms_per_batch"):
        tables.markdown_tables([str(path)])


def test_count_decoder_calls_counts_passes_of_edit_models_too():
    """An edit model's classifiers run the decoder through extract_features, not forward; both a
    forward-only decoder and one with extract_features are counted, and the class method is back after."""
    import torch

    from fairseq_nat_ext.evaluation.inference import count_decoder_calls

    class EditDecoder(torch.nn.Module):
        def extract_features(self, x):
            return x

        def forward(self, x):
            return self.extract_features(x)

        def word_del(self, x):  # a classifier head: one pass, not through forward
            return self.extract_features(x)

    class PlainDecoder(torch.nn.Module):
        def forward(self, x):
            return x

    class Model:
        def __init__(self, decoder):
            self.decoder = decoder

    class StackModel:  # KERMIT: one stack, no decoder
        def __init__(self):
            self.stack = PlainDecoder()

    edit, plain, single = Model(EditDecoder()), Model(PlainDecoder()), StackModel()
    with count_decoder_calls([edit]) as c:
        edit.decoder.word_del(1)
        edit.decoder(1)
    assert c.calls == 2
    with count_decoder_calls([plain]) as c:
        plain.decoder(1)
    assert c.calls == 1
    with count_decoder_calls([single]) as c:
        single.stack(1)
        single.stack(1)
    assert c.calls == 2
    assert "extract_features" not in vars(edit.decoder) and "forward" not in vars(plain.decoder)


def test_count_decoder_calls_counts_layer_passes_whatever_method_drives_them():
    """A decoder whose forward runs its own layer loop (nat_fertility, iterative_refinement) and never
    calls the extract_features it inherits: one pass per forward, counted on its first layer; the
    hook is gone afterwards."""
    import torch

    from fairseq_nat_ext.evaluation.inference import count_decoder_calls

    class OwnLoopDecoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])

        def extract_features(self, x):  # inherited in the real decoders, unused by their forward
            raise AssertionError("not called")

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    class Model:
        decoder = OwnLoopDecoder()

    m = Model()
    with count_decoder_calls([m]) as c:
        for _ in range(3):
            m.decoder(torch.zeros(1, 2))
    assert c.calls == 3
    assert not m.decoder.layers[0]._forward_pre_hooks
    m.decoder(torch.zeros(1, 2))
    assert c.calls == 3


def test_decode_seeds_torch_so_sampling_decoders_repeat_whatever_ran_before():
    """inference.decode seeds torch (SEED, fairseq-generate's default --seed) before decoding: a decoder
    that samples (NPD) gives the same hypotheses in every call of the harness (warm-up, batch 1, batch
    128), whatever consumed random numbers before; seed=None leaves the generator alone."""
    import torch

    from fairseq_nat_ext.evaluation import inference as inf

    class SamplingTask:
        def inference_step(self, generator, models, sample):
            return [[{"tokens": torch.multinomial(torch.ones(50), 3)}] for _ in sample["id"]]

    batches = [{"id": torch.tensor([0, 1])}, {"id": torch.tensor([2])}]

    def run(**kw):
        return {k: h["tokens"].tolist() for k, h in inf.decode(SamplingTask(), None, [], batches, **kw).items()}

    first = run()
    torch.rand(1000)  # other work in between
    assert run() == first and inf.SEED == 1
    torch.manual_seed(123)
    unseeded = run(seed=None)
    torch.manual_seed(123)
    assert run(seed=None) == unseeded and run(seed=7) != first


def test_count_decoder_calls_counts_packed_passes_of_the_fertility_decoder(toy_databin):
    """nat_fertility's NPD passes run packed_features (modules/packed.py reads the layers' parameters, never
    calls the layers): each is one counted pass, as a padded forward is; the wrapper is gone afterwards."""
    import torch

    from conftest import build_model_and_task
    from fairseq_nat_ext.evaluation.inference import count_decoder_calls

    task, model, _ = build_model_and_task(toy_databin[0], ["--arch", "nat_fertility_tiny", "--dropout", "0"])
    model.eval()
    src = torch.tensor([[5, 6, 7, 2]])
    fert = torch.tensor([[1, 2, 1, 0]])
    with torch.no_grad(), count_decoder_calls([model]) as c:
        enc = model.encoder(src, src_lengths=torch.tensor([4]))
        copied = model.decoder.copy_source(enc, fert)
        model.decoder.packed_features(enc, copied)
        model.decoder(enc, copied=copied, features_only=True)
    assert c.calls == 2
    assert "packed_features" not in vars(model.decoder)
