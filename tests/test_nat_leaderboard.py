"""The NAT leaderboard: its columns in the results schema, the harness's --leaderboard run (chrF, valid,
unseen test sets, the speed baseline of the same run), the table, the chart and the README block."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu

from fairseq_nat_ext.evaluation import provenance
from fairseq_nat_ext.evaluation import results as res

from benchmarks import leaderboard, tables
from conftest import teacher_test_databin

REPO = Path(__file__).resolve().parents[1]


def _row(**kw):
    row = {"system": "ctc_nat", "decoding": "beam=1", "distilled": True, "bleu": 30.0, "tok_bleu": 30.0,
           "latency_ms_b1": 10.0, "sent_per_s_b128": 200.0, "iterations": 1.0, "repeat_rate": 0.01,
           "train_updates": 1000, "train_wall_s": 3600.0, "hyp": "benchmarks/results/nat_leaderboard/x.txt",
           "chrf": 55.0, "valid_bleu": 31.0, "valid_chrf": 56.0, "decoder_passes": 1.0, "seed": 1,
           "max_tokens": 4096, "train_wps": 800.0, "init": "teacher", "trained_on": "CPU, 2 cores",
           "measured_on": "CPU, 2 cores", "run": "r1", "teacher_latency_ms_b1": 100.0, "teacher_sent_per_s_b128": 40.0,
           "blind": {"test_2017_flickr": "benchmarks/results/nat_leaderboard/blind/x.test_2017_flickr.txt"},
           "command": "examples/train_ctc.sh D S"}
    row.update(kw)
    return row


def _results(rows):
    return {"benchmark": "nat_leaderboard", "data": "d", "hardware": "h", "threads": 2, "command": "c",
            "sacrebleu_signature": "s", "rows": rows}


def test_rows_measured_on_two_machines_name_both_with_their_runs():
    """Speed-ups hold within a run; a table whose runs ran on two machines says which run ran where (the
    file's own "hardware" is only its latest run's)."""
    rows = [_row(), _row(decoding="beam=5", run="r2", measured_on="Other CPU, 2 cores")]
    results = _results(rows)
    assert res.validate_results(results) == []
    md = leaderboard.markdown_table(results)
    assert "- measured on: CPU, 2 cores (runs r1); Other CPU, 2 cores (runs r2), 2 torch threads" in md
    assert "measured on CPU, 2 cores; Other CPU, 2 cores)" in leaderboard.methods_table(results)
    one = leaderboard.markdown_table(_results([_row()]))
    assert "- measured on: CPU, 2 cores, 2 torch threads" in one and "(runs" not in one
    del rows[1]["measured_on"]
    assert res.validate_results(results) != []  # a leaderboard row without its machine is refused


def test_leaderboard_columns_all_or_none():
    assert res.validate_results(_results([_row()])) == []
    assert res.validate_results(_results([_row(train_wps=None)])) == []  # not known: null, not a made-up number
    partial = _row()
    del partial["chrf"]
    assert any("without 'chrf'" in e for e in res.validate_results(_results([partial])))
    assert any("valid_bleu" in e for e in res.validate_results(_results([_row(valid_bleu=101.0)])))
    assert any("blind" in e for e in res.validate_results(_results([_row(blind={"x": 3})])))
    plain = {k: v for k, v in _row().items() if k not in res.LEADERBOARD_ROW_FIELDS}
    assert res.validate_results(_results([plain])) == []  # the other tables keep their schema


def test_second_seed_is_a_row_of_its_own():
    results = _results([_row()])
    res.upsert_row(results, _row(seed=2, bleu=29.0))
    res.upsert_row(results, _row(bleu=30.5))  # the same key: replaced
    assert [(r["seed"], r["bleu"]) for r in results["rows"]] == [(1, 30.5), (2, 29.0)]
    assert res.validate_results(results) == []
    assert res.hyp_filename("ctc_nat", "beam=1", True, 1) == "ctc_nat__beam=1__distilled.txt"
    assert res.hyp_filename("ctc_nat", "beam=1", True, 2) == "ctc_nat__beam=1__distilled__seed2.txt"
    assert res.blind_path("benchmarks/results/nat_leaderboard.json", "nat_leaderboard",
                          "x/ctc_nat__beam=1__distilled.txt", "test_2017_mscoco") == os.path.join(
        "benchmarks/results", "nat_leaderboard", "blind", "ctc_nat__beam=1__distilled.test_2017_mscoco.txt")


def test_speedups_use_the_teacher_of_the_rows_own_run():
    assert leaderboard.speedups(_row()) == (10.0, 5.0)
    assert leaderboard.speedups(_row(teacher_latency_ms_b1=50.0, teacher_sent_per_s_b128=100.0)) == (5.0, 2.0)


def _dominated_by_loop(points):
    out = []
    for i, (s, b) in enumerate(points):
        beaten = False
        for j, (s2, b2) in enumerate(points):
            if j != i and s2 >= s and b2 >= b and (s2 > s or b2 > b):
                beaten = True
        if not beaten:
            out.append(i)
    return out


@pytest.mark.parametrize("points", [
    [(1.0, 33.0), (2.0, 30.0), (3.0, 31.0), (10.0, 25.0), (9.0, 24.0)],
    [(1.0, 30.0), (1.0, 30.0), (2.0, 20.0)],
    [(5.0, 1.0)],
])
def test_pareto_front(points):
    front = leaderboard.pareto_front(points)
    assert sorted(front) == _dominated_by_loop(points)
    assert [points[i][0] for i in front] == sorted(points[i][0] for i in front)


def test_table_and_methods_block(tmp_path):
    results = _results([_row(system="fairseq:transformer", decoding="beam=5", distilled=False, bleu=33.0,
                             latency_ms_b1=100.0, sent_per_s_b128=40.0, init="scratch", train_wps=None),
                        _row(), _row(seed=2, bleu=29.5)])
    text = leaderboard.markdown_table(results, link_dir=str(REPO / "docs"))
    lines = [ln for ln in text.splitlines() if ln.startswith("| `")]
    assert lines[0].startswith("| `fairseq:transformer` | `beam=5` | raw | 1 | scratch | 33.00")
    assert "| 1.00x | 1.00x |" in lines[0] and "| – |" in lines[0]  # the teacher itself; words/s unknown
    assert "| `ctc_nat` | `beam=1` | distilled | 1 | teacher | 30.00 | 55.00 | 31.00 | 56.00 | 10.00x | 5.00x" in lines[1]
    assert "../benchmarks/results/nat_leaderboard/blind/x.test_2017_flickr.txt" in lines[1]
    assert "| 2 |" in lines[2]
    methods = leaderboard.methods_table(results, link_dir=str(REPO))
    assert "| `ctc_nat` | `beam=1` | 1, 2 | 30.00 / 29.50 | 55.00 / 55.00 |" in methods and "1000 updates" in methods
    assert methods.index("`fairseq:transformer`") < methods.index("`ctc_nat`")  # by mean BLEU
    assert tables.leaderboard.is_leaderboard(results) and not leaderboard.is_leaderboard(_results([]))
    png = leaderboard.draw_chart(results, str(tmp_path / "c.png"))
    assert os.path.getsize(png) > 10000


def test_training_words_and_settings_from_log_and_checkpoint(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(
        "2026-01-01 00:00:00 | INFO | train | epoch 001 | loss 5 | wps 800 | wpb 3000.5 | bsz 200 | num_updates 100 | wall 10\n"
        "2026-01-01 00:01:00 | INFO | train | epoch 002 | loss 4 | wps 800 | wpb 2000 | bsz 200 | num_updates 150 | wall 20\n"
        "2026-01-01 00:02:00 | INFO | valid | epoch 002 | loss 4 | wps 9 | wpb 99 | bsz 2 | num_updates 150\n")
    assert provenance.training_words_from_log(str(log)) == pytest.approx(3000.5 * 100 + 2000 * 50)
    (tmp_path / "none.log").write_text("nothing\n")
    assert provenance.training_words_from_log(str(tmp_path / "none.log")) is None
    state = {"cfg": {"common": {"seed": 3}, "dataset": {"max_tokens": 4096}}}
    assert provenance.training_settings(state) == (3, 4096)


def test_harness_leaderboard_run(tmp_path):
    """The shared teacher on 12 test sentences: chrF, valid scores, an unseen source-only subset decoded
    line for line, the speed baseline read from the same run (and refused from another)."""
    teacher = teacher_test_databin(tmp_path, list(range(12)))
    bin_dir = tmp_path / "data-bin"
    for ext in ("bin", "idx"):  # valid = the same sentences, under the valid name
        for lang in ("en", "de"):
            shutil.copy(bin_dir / f"test.en-de.{lang}.{ext}", bin_dir / f"valid.en-de.{lang}.{ext}")
    blind_src = tmp_path / "blind.en"
    blind_src.write_text("\n".join((tmp_path / "test.en").read_text().splitlines()[:5]) + "\n")
    subprocess.run([sys.executable, "-m", "fairseq_cli.preprocess", "--only-source", "--source-lang", "en",
                    "--target-lang", "de", "--testpref", str(tmp_path / "blind"), "--destdir", str(tmp_path / "b"),
                    "--srcdict", str(teacher / "dict.txt"), "--workers", "1"], check=True, capture_output=True)
    for ext in ("bin", "idx"):
        shutil.copy(tmp_path / "b" / f"test.en-de.en.{ext}", bin_dir / f"unseen.en-de.en.{ext}")
    out = tmp_path / "results" / "lb.json"
    base = [sys.executable, "-m", "fairseq_nat_ext.evaluation.run", "--benchmark", "lb", "--data-bin", str(bin_dir),
            "--raw-ref", str(tmp_path / "raw.de"), "--src-lang", "en", "--tgt-lang", "de",
            "--system-ckpt", str(teacher / "teacher.pt"), "--train-wall-s", "5700", "--out", str(out),
            "--threads", "1", "--latency-sentences", "3", "--warmup-sentences", "1", "--leaderboard",
            "--valid-raw-ref", str(tmp_path / "raw.de"), "--blind", "unseen", "--init", "scratch",
            "--speed-baseline", "fairseq:transformer/beam=1", "--row-command", "train; measure"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(base + ["--decoding", "beam=1", "--run-id", "r1"], capture_output=True, text=True,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = res.load_results(out)["rows"][0]
    hyps = (tmp_path / row["hyp"]).read_text(encoding="utf-8").splitlines()
    refs = (tmp_path / "raw.de").read_text(encoding="utf-8").splitlines()
    assert row["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=1e-3)
    assert row["valid_bleu"] == pytest.approx(row["bleu"], abs=1e-3)  # valid holds the same sentences
    assert (row["seed"], row["max_tokens"], row["run"], row["init"]) == (1, 4096, "r1", "scratch")
    assert row["teacher_latency_ms_b1"] == row["latency_ms_b1"] and row["decoder_passes"] > 1
    blind = (tmp_path / row["blind"]["unseen"]).read_text(encoding="utf-8").splitlines()
    assert len(blind) == 5 and blind == hyps[:5]  # the same sentences, decoded with the same options
    again = subprocess.run(base + ["--decoding", "beam=2", "--run-id", "r1"], capture_output=True, text=True,
                           env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    row2 = next(r for r in res.load_results(out)["rows"] if r["decoding"] == "beam=2")
    assert row2["teacher_latency_ms_b1"] == row["latency_ms_b1"]  # the baseline row of the same run
    other = subprocess.run(base + ["--decoding", "beam=3", "--run-id", "r2"], capture_output=True, text=True,
                           env=env, cwd=tmp_path)
    assert other.returncode != 0 and "measure the speed baseline first" in other.stderr


def test_leaderboard_script_lists_rows_and_refuses_unknown_ones():
    script = REPO / "examples" / "benchmark" / "nat_leaderboard.sh"
    proc = subprocess.run(["bash", str(script), "list"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    names = [line.split()[0] for line in proc.stdout.splitlines()]
    assert names[:3] == ["teacher", "ctc", "imputer"] and "fs_nat" in names and "cmlm" in names
    bad = subprocess.run(["bash", str(script), "measure", "nope"], capture_output=True, text=True)
    assert bad.returncode == 1 and "unknown row 'nope'" in bad.stderr


def test_recipe_defaults_are_the_leaderboard_budget():
    text = (REPO / "examples" / "lib" / "train_nat.sh").read_text()
    assert 'MAX_UPDATE="${MAX_UPDATE:-1000}"' in text and 'MAX_TOKENS="${MAX_TOKENS:-4096}"' in text
    assert 'LR="${LR:-1e-3}"' in text and 'WARMUP="${WARMUP:-400}"' in text


def test_glat_and_dag_decoding_keys():
    from fairseq_nat_ext.evaluation import decoding as dec

    assert dec.canonical_decoding("beam=1,glat=0.5-0.3") == "glat=0.5-0.3,beam=1"
    gen, task, info = dec.split_options(dec.parse_decoding("glat=0.5-0.3,decoder=viterbi"))
    assert gen == {"decoder": "viterbi"} and info == {"glat": "0.5-0.3"} and task == {}
    assert dec.generation_options(gen).dag_decoder == "viterbi"
    for bad in ("glat=0.5", "glat=a-b", "decoder=fast"):
        with pytest.raises(ValueError):
            dec.parse_decoding(bad)
