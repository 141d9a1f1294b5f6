"""Pointer benchmark: the results schema, its README table next to the BLEU benchmarks, the scoring
of a test file, and one-line errors for bad options."""
import json

import numpy as np
import pytest

from benchmarks import pointer as bench
from benchmarks import pointer_results as pr
from benchmarks import tables
from fairseq_nat_ext.data import pointer_geometry as geo
from fairseq_nat_ext.data.pointer_format import read_pointer_file


def rows():
    return [
        pr.make_row("convex_hull", "pointer_lstm", "50", 50, "beam=1", 0.7, 100, 36.0, area_coverage=0.999),
        pr.make_row("delaunay", "pointer_transformer", "5", 5, "beam=5", 0.8, 100, 36.0, triangle_coverage=0.93),
        pr.make_row("tsp", "pointer_lstm", "5-20", 20, "beam=5", 0.1, 100, 36.0, tour_length=3.9,
                    reference_tour_length=3.8, reference="lkh"),
    ]


def test_schema_accepts_valid_rows_and_names_each_problem():
    res = pr.new_results("cpu", 2, "cmd")
    for r in rows():
        pr.upsert_row(res, r)
    assert pr.validate_results(res) == []
    pr.upsert_row(res, dict(rows()[0], accuracy=0.5))  # same key: replaced
    assert len(res["rows"]) == 3 and res["rows"][0]["accuracy"] == 0.5
    bad = [
        (dict(rows()[0], triangle_coverage=0.5), "triangle_coverage: must be null"),
        (dict(rows()[0], area_coverage=None), "area_coverage: expected a number"),
        (dict(rows()[0], accuracy=1.5), "accuracy: 1.5 outside [0, 1]"),
        (dict(rows()[2], reference="optimal"), "expected 'exact' or 'lkh'"),
        (dict(rows()[0], decoding="greedy"), "not canonical"),
        (dict(rows()[0], problem="knapsack"), "is not one of"),
        (dict(rows()[0], extra=1), "unexpected key 'extra'"),
    ]
    for row, message in bad:
        errors = pr.validate_row(row)
        assert any(message in e for e in errors), (message, errors)
    with pytest.raises(pr.PointerResultsError):
        pr.check_results(dict(res, rows=res["rows"] + [res["rows"][0]]))  # duplicate key


def test_tables_render_pointer_next_to_bleu_results(tmp_path):
    res = pr.new_results("cpu", 2, "cmd")
    for r in rows():
        pr.upsert_row(res, r)
    pr.save_results(str(tmp_path / "pointer.json"), res)
    text = tables.markdown_tables([str(tmp_path / "pointer.json"), "benchmarks/results/mask_predict.json"])
    assert "### mask_predict" in text and "### pointer" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("| `tsp`"))
    assert "3.900 | 3.800 | 2.63 | lkh" in line  # gap = 3.9 / 3.8 - 1
    line = next(ln for ln in text.splitlines() if ln.startswith("| `convex_hull`"))
    assert "| 70.0 | 99.9 | – |" in line
    (tmp_path / "pointer.json").write_text(json.dumps(dict(res, threads=0)))
    assert tables.main([str(tmp_path / "pointer.json")]) == 1


def test_rows_from_several_evaluation_runs_name_their_commands():
    res = pr.new_results("cpu", 2, "run B")
    for r in rows():
        pr.upsert_row(res, r)
    assert "- command: `run B`" in pr.markdown_table(res)  # rows without their own: the file's command
    res["rows"][0]["command"] = "run A"
    res["rows"][1]["command"] = "run B"
    assert pr.validate_results(res) == []
    text = pr.markdown_table(res)
    assert "- commands (" in text and "  - `run A`" in text and "  - `run B`" in text
    assert text.count("`run B`") == 1
    assert any("command: expected a non-empty string" in e for e in pr.validate_row(dict(rows()[0], command="")))


def test_beam_widths_are_listed_in_numeric_order():
    res = pr.new_results("cpu", 2, "cmd")
    base = next(r for r in rows() if r["problem"] == "tsp")
    for beam in (10, 1, 5):
        pr.upsert_row(res, dict(base, decoding=f"beam={beam}"))
    lines = [ln for ln in pr.markdown_table(res).splitlines() if ln.startswith("| `tsp`")]
    assert [ln.split("`beam=")[1].split("`")[0] for ln in lines] == ["1", "5", "10"]


def test_a_subset_remeasured_elsewhere_is_its_own_benchmark(tmp_path, capsys):
    """``--benchmark pointer_<name>``: its own file and README table next to ``pointer``; a file of one name
    is never upserted as another, and a name outside the pattern is refused."""
    for name in ("pointer", "pointer_tsp_beam"):
        res = pr.new_results("cpu", 2, "cmd", benchmark=name)
        pr.upsert_row(res, rows()[2])
        pr.save_results(str(tmp_path / f"{name}.json"), res)
    text = tables.markdown_tables([str(tmp_path / "pointer.json"), str(tmp_path / "pointer_tsp_beam.json")])
    assert "### pointer\n" in text and "### pointer_tsp_beam\n" in text
    with pytest.raises(pr.PointerResultsError):
        pr.new_results("cpu", 2, "cmd", benchmark="tsp")
    assert pr.validate_results(dict(res, benchmark="pointer-2")) != []
    assert bench.main(["--benchmark", "Pointer", "--stages", "eval"]) == 1
    assert "--benchmark 'Pointer'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="holds benchmark 'pointer_tsp_beam'"):
        bench.main(["--stages", "eval", "--experiments", "tsp5-20", "--work-dir", str(tmp_path / "w"),
                    "--out", str(tmp_path / "pointer_tsp_beam.json")])


@pytest.mark.parametrize("problem", ["convex_hull", "delaunay", "tsp"])
def test_scoring_a_test_file(tmp_path, problem):
    path = str(tmp_path / "test_n7.txt")
    assert geo.main(["--problem", problem, "--n", "7", "--count", "6", "--out", path]) == 0
    data = read_pointer_file(path, problem)
    refs = [data.output_of(i).tolist() for i in range(len(data))]
    perfect = bench.score(problem, data, refs)
    assert perfect["accuracy"] == 1.0
    if problem == "convex_hull":
        assert perfect["area_coverage"] == pytest.approx(1.0)
        half = bench.score(problem, data, refs[:3] + [[0, 1, 0]] * 3)  # 3 invalid polygons
        assert half["accuracy"] == 0.5 and half["area_coverage"] == pytest.approx(0.5)
    elif problem == "delaunay":
        assert perfect["triangle_coverage"] == 1.0
    else:
        assert perfect["tour_length"] == pytest.approx(perfect["reference_tour_length"])
        assert perfect["reference"] == "exact"
        worse = bench.score(problem, data, [list(range(7)) + [0]] * 6)
        assert worse["tour_length"] >= perfect["reference_tour_length"]
        with pytest.raises(SystemExit, match="1 emitted tours are invalid"):
            bench.score(problem, data, refs[:5] + [[0, 1, 1, 2, 3, 4, 5, 0]])


def test_cli_rejects_unknown_experiment_arch_and_beam(capsys):
    assert bench.main(["--experiments", "hull7", "--archs", "lstm", "--beams", "x", "--stages", "eval"]) == 1
    err = capsys.readouterr().err
    assert "unknown experiment 'hull7'" in err and "unknown arch 'lstm'" in err and "--beams 'x'" in err
    assert err.count("\n") == 1


def test_finished_training_is_not_started_again(tmp_path):
    """fairseq-train on a finished checkpoint makes one more update: the train stage keeps a model whose
    last run ended ("done training") under the same budget, and trains a killed run or a larger budget on."""
    from benchmarks.pointer import finished

    save = tmp_path / "ckpt"
    save.mkdir()
    log = save / "train.log"
    head = "# train_pointer.sh PROBLEM=tsp ARCH=pointer_lstm MAX_UPDATE=20000 STOP_TIME_HOURS=0.6 BATCH_SIZE=128\n"
    log.write_text(head + "2026-11-30 20:42:23 | INFO | fairseq_cli.train | done training in 2156.4 seconds\n")
    budget = "MAX_UPDATE=20000 STOP_TIME_HOURS=0.6"
    assert not finished(str(save), budget), "no checkpoint_last.pt"
    (save / "checkpoint_last.pt").write_bytes(b"")
    assert finished(str(save), budget)
    assert not finished(str(save), "MAX_UPDATE=20000 STOP_TIME_HOURS=1.0"), "a larger budget trains on"
    assert not finished(str(save), "MAX_UPDATE=2000 STOP_TIME_HOURS=0.6")
    log.write_text(log.read_text() + head + "2026-11-30 21:00:00 | INFO | train_inner | num_updates=100\n")
    assert not finished(str(save), budget), "the last run was killed"
