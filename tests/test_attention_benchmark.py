"""The attention speed/memory harness writes well-formed rows (no timing is asserted here)."""
import json
import os

from benchmarks import attention_speed


def test_speed_harness_writes_rows_with_the_issue_schema(tmp_path):
    out = tmp_path / "speed.json"
    attention_speed.main(["--out", str(out), "--n", "300", "--variants", "local", "routing", "full_explicit",
                          "--threads", "1", "--timeout", "300"])
    res = json.loads(out.read_text())
    assert {"benchmark", "hardware", "threads", "command", "rows"} <= set(res)
    assert [r["variant"] for r in res["rows"]] == ["local", "routing", "full_explicit"]
    for row in res["rows"]:
        assert set(row) >= {"variant", "impl", "options", "n", "device", "fwd_bwd_ms", "peak_mem_mb", "oom"}
        assert row["impl"] == "ours" and row["n"] == 300 and row["oom"] is False
        assert row["fwd_bwd_ms"] > 0 and row["peak_mem_mb"] >= 0
    assert res["rows"][0]["options"] == {"attention_window": 256}
    # --update replaces only what it measures and keeps the rest, with both commands
    attention_speed.main(["--out", str(out), "--n", "300", "--variants", "routing", "--threads", "1", "--update"])
    again = json.loads(out.read_text())
    assert [r["variant"] for r in again["rows"]] == ["local", "routing", "full_explicit"], "replaced in place"
    assert [again["rows"][0], again["rows"][2]] == [res["rows"][0], res["rows"][2]]
    assert again["command"].startswith(res["command"] + "; then ") and again["command"].endswith("--update")


def test_tiny_memory_limit_is_reported_as_oom(tmp_path):
    out = tmp_path / "oom.json"
    attention_speed.main(["--out", str(out), "--n", "256", "4096", "--variants", "full_explicit",
                          "--threads", "1", "--mem-limit-gb", "1.5"])
    small, big = json.loads(out.read_text())["rows"]
    assert small["oom"] is False and small["fwd_bwd_ms"] > 0, "the limit itself leaves room to run"
    assert big["oom"] is True and big["fwd_bwd_ms"] is None


def _speed_row(variant, n, ms, mb, impl="ours", oom=False):
    return {"variant": variant, "impl": impl, "options": {}, "n": n, "device": "cpu",
            "fwd_bwd_ms": None if oom else ms, "peak_mem_mb": None if oom else mb, "oom": oom}


def test_speed_rounds_report_the_median_pass(tmp_path, monkeypatch):
    """--rounds R measures every (variant, N) in R whole passes, one after the other (not R times in a row),
    and writes one row each: the median time and memory of the passes, their times in round_ms; a pass out
    of memory makes the row OOM; a row whose passes all ran past the timeout stays a timeout."""
    from benchmarks import attention_speed, tables

    order, times = [], {("full", 512): [30.0, 10.0, 20.0], ("local", 512): [5.0, 7.0, 6.0],
                        ("lsh", 512): [4.0, None, 4.0]}

    def fake_run_one(variant, n, args):
        order.append(variant)
        ms = times[(variant, n)][sum(v == variant for v in order) - 1]
        if variant == "lsh" and ms is None:
            return _speed_row(variant, n, 0, 0, oom=True)
        return _speed_row(variant, n, ms, ms * 2)

    monkeypatch.setattr(attention_speed, "run_one", fake_run_one)
    out = tmp_path / "speed.json"
    attention_speed.main(["--out", str(out), "--n", "512", "--variants", "full", "local", "lsh", "--rounds", "3"])
    assert order == ["full", "local", "lsh"] * 3
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["full"]["fwd_bwd_ms"] == 20.0 and rows["full"]["round_ms"] == [30.0, 10.0, 20.0]
    assert rows["full"]["peak_mem_mb"] == 40.0 and rows["local"]["fwd_bwd_ms"] == 6.0
    assert rows["lsh"]["oom"] is True and rows["lsh"]["fwd_bwd_ms"] is None
    assert "--rounds 3" in json.loads(out.read_text())["command"]
    md = tables.markdown_tables([str(out)])  # the extra key passes the results check
    assert "each cell the median of 3 passes" in md
    timeout = {"variant": "x", "impl": "ours", "options": {}, "n": 8, "device": "cpu", "fwd_bwd_ms": None,
               "peak_mem_mb": None, "oom": False, "timeout_s": 900}
    assert attention_speed.combine_rounds([timeout, dict(timeout)])["timeout_s"] == 900
    mixed = attention_speed.combine_rounds([timeout, _speed_row("x", 8, 3.0, 1.0)])
    assert mixed["fwd_bwd_ms"] == 3.0 and "timeout_s" not in mixed


def test_speed_table_and_bar_ratios(tmp_path):
    """The README table of the speed study: one line per (impl, variant), OOM cells, and the bar
    ratios computed from the rows (speed-up, memory ratios, growth, peer / ours)."""
    from benchmarks import tables

    rows = [_speed_row("full", 4096, 1000, 50), _speed_row("full", 8192, 4000, 100),
            _speed_row("full", 16384, 16000, 200),
            _speed_row("full_explicit", 8192, 9000, 4000), _speed_row("full_explicit", 16384, 0, 0, oom=True),
            _speed_row("local", 4096, 200, 20), _speed_row("local", 8192, 500, 150),
            _speed_row("local", 16384, 1100, 300),
            _speed_row("local", 4096, 300, 25, impl="peer:local-attention")]
    path = tmp_path / "attention_speed.json"
    path.write_text(json.dumps({"benchmark": "attention_speed", "hardware": "cpu", "threads": 2,
                                "command": "python -m benchmarks.attention_speed", "rows": rows}))
    text = tables.markdown_tables([str(path)])
    assert "| ours | `full_explicit` | – | 9000 (4000) | OOM |" in text
    assert "| peer:local-attention | `local` | 300 (25) | – | – |" in text
    # local: 4000/500 = 8.0x, 16000/1100 = 14.5x, 4000/150 = 26.7x, 150/100 = 1.50, 1100/500 = 2.20,
    # peer 300/200 = 1.50
    assert "| `local` | 8.0x | 14.5x | 26.7x | 1.50 | 2.20 | 1.50 |" in text
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"benchmark": "attention_speed", "hardware": "cpu", "threads": 2, "command": "x",
                               "rows": [{"variant": "local"}]}))
    try:
        tables.markdown_tables([str(bad)])
    except ValueError as err:
        assert "rows[0]: missing" in str(err)
    else:
        raise AssertionError("a row without its fields must be refused")


def test_speed_ratio_of_a_row_re_measured_later_uses_its_own_run_s_full(tmp_path):
    """A row re-measured in a later --update run carries the ``full`` times of that run
    (``same_run_full_ms``): its speed-ups are against those, the other rows' against the file's ``full``."""
    from benchmarks import tables

    later = [dict(_speed_row("sinkhorn", n, ms, 10), same_run_full_ms=full)
             for n, ms, full in ((8192, 300, 3000), (16384, 700, 12600))]
    rows = [_speed_row("full", 8192, 4000, 100), _speed_row("full", 16384, 16000, 200),
            _speed_row("local", 8192, 500, 150), _speed_row("local", 16384, 1100, 300)] + later
    path = tmp_path / "attention_speed.json"
    path.write_text(json.dumps({"benchmark": "attention_speed", "hardware": "cpu", "threads": 2,
                                "command": "python -m benchmarks.attention_speed", "rows": rows,
                                "notes": "sinkhorn re-measured later"}))
    text = tables.markdown_tables([str(path)])
    assert "| `local` | 8.0x | 14.5x |" in text  # 4000 / 500, 16000 / 1100
    assert "| `sinkhorn` | 10.0x | 18.0x |" in text  # 3000 / 300, 12600 / 700 (not 13.3x, 22.9x)
    assert "Note: sinkhorn re-measured later" in text


def test_speed_curves_are_drawn(tmp_path):
    from benchmarks import attention_plots

    path = tmp_path / "speed.json"
    path.write_text(json.dumps({"rows": [_speed_row("full", n, n / 10, n / 100) for n in (512, 1024)]
                                + [_speed_row("local", 512, 0, 0, oom=True)]}))
    attention_plots.main(["curves", str(path), str(tmp_path / "curves.png")])
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_listops_table_and_train_seconds(tmp_path):
    """The ListOps results render as a README table (accuracy, majority rate, margin in points, the
    no-brackets ablation named), fractions outside [0, 1] are refused, and the seconds per update come
    from the sum of fairseq's per-epoch train_wall, not from the last epoch's alone (an epoch
    logged again by a resumed run counts once)."""
    from benchmarks import tables
    from benchmarks.attention_listops import _train_seconds

    log = tmp_path / "train.log"
    log.write_text(
        "2026-11-30 20:44:33 | INFO | train_inner | epoch 001:     50 / 625 loss=3.3, train_wall=13, wall=16\n"
        "2026-11-30 20:47:17 | INFO | train | epoch 001 | loss 2.6 | num_updates 625 | train_wall 173 | wall 180\n"
        "2026-11-30 20:50:18 | INFO | train | epoch 002 | loss 2.4 | num_updates 1250 | train_wall 176 | wall 360\n"
        "2026-11-30 20:51:30 | INFO | train | epoch 003 | loss 2.3 | num_updates 1500 | train_wall 74 | wall 436\n"
        "2026-11-30 20:59:45 | INFO | train | epoch 003 | loss 2.3 | num_updates 1501 | train_wall 74 | wall 0\n")
    assert _train_seconds(str(log)) == 173 + 176 + 74
    rows = [{"variant": "full", "options": {}, "max_length": 513, "accuracy": 0.376, "majority_rate": 0.179,
             "train_updates": 1500, "sec_per_update": 0.282},
            {"variant": "local", "options": {"attention_window": 64}, "max_length": 513, "accuracy": 0.25,
             "majority_rate": 0.179, "train_updates": 1500, "sec_per_update": None},
            {"variant": "full", "options": {"brackets": False}, "max_length": 513, "accuracy": 0.2,
             "majority_rate": 0.18, "train_updates": 1500, "sec_per_update": 0.3}]
    path = tmp_path / "attention_listops.json"
    top = {"benchmark": "attention_listops", "hardware": "cpu", "threads": 2, "command": "x"}
    path.write_text(json.dumps(dict(top, rows=rows)))
    text = tables.markdown_tables([str(path)])
    assert "| `full` | – | 513 | 37.6 | 17.9 | +19.7 | 1500 | 0.282 |" in text
    assert "| `local` | attention_window=64 | 513 | 25.0 | 17.9 | +7.1 | 1500 | – |" in text
    assert "| `full` | no brackets (ablation) | 513 | 20.0 | 18.0 | +2.0 | 1500 | 0.300 |" in text
    path.write_text(json.dumps(dict(top, rows=[dict(rows[0], accuracy=37.6)])))  # a percentage, not a fraction
    try:
        tables.markdown_tables([str(path)])
    except ValueError as err:
        assert "rows[0].accuracy" in str(err) and "attention_listops.json" in str(err)
    else:
        raise AssertionError("an accuracy outside [0, 1] must be refused")


def test_listops_study_apart_deeper_classifier(tmp_path, monkeypatch):
    """--encoder-layers reaches fairseq-train and the row's options (the ablation row keeps it beside
    brackets=False); --benchmark attention_listops_<name> writes a study apart, rendered as its own table."""
    import subprocess

    from benchmarks import attention_listops, tables

    for name in ("b", "nb"):
        d = tmp_path / name
        d.mkdir()
        for split in ("train", "valid", "test"):
            (d / f"{split}.src").write_text("[MAX 1 2 ]\n[MIN 3 4 ]\n")
            (d / f"{split}.label").write_text("2\n3\n")
    trains = []

    def fake_run(cmd, **kwargs):
        if cmd[0] == "fairseq-train":
            trains.append(cmd)
            save = cmd[cmd.index("--save-dir") + 1]
            with open(os.path.join(save, "checkpoint_last.pt"), "wb"):
                pass
            with open(os.path.join(save, "train.log"), "a") as f:
                f.write("2026-12-03 | INFO | train | epoch 001 | loss 2.3 | num_updates 20 | train_wall 4 | wall 5\n")
        return subprocess.CompletedProcess(cmd, 0, stdout="| test | accuracy 40.0 |", stderr="")

    monkeypatch.setattr(attention_listops.subprocess, "run", fake_run)
    out = tmp_path / "attention_listops_brackets.json"
    attention_listops.main(["--data", str(tmp_path / "b"), "--no-brackets-data", str(tmp_path / "nb"), "--out",
                            str(out), "--work", str(tmp_path / "w"), "--max-update", "20", "--variants", "full",
                            "--encoder-layers", "4", "--benchmark", "attention_listops_brackets"])
    assert len(trains) == 2 and all(c[c.index("--encoder-layers") + 1] == "4" for c in trains)
    res = json.loads(out.read_text())
    assert res["benchmark"] == "attention_listops_brackets"
    assert [r["options"] for r in res["rows"]] == [{"encoder_layers": 4}, {"encoder_layers": 4, "brackets": False}]
    text = tables.markdown_tables([str(out)])
    assert "### attention_listops_brackets" in text
    assert "| `full` | encoder_layers=4 | 5 | 40.0 |" in text
    assert "| `full` | no brackets (ablation), encoder_layers=4 | 5 | 40.0 |" in text
    try:
        attention_listops.main(["--data", str(tmp_path / "b"), "--out", str(out), "--work", str(tmp_path / "w"),
                                "--benchmark", "pointer"])
    except SystemExit as err:
        assert err.code == 2
    else:
        raise AssertionError("a --benchmark name outside attention_listops* must be refused")


def test_listops_table_rows_from_two_machines(tmp_path):
    """Rows trained on different machines get a machine column (their seconds per update do not
    compare), each distinct command is listed, and a row's note becomes a numbered footnote."""
    from benchmarks import tables

    row = {"variant": "full", "options": {}, "max_length": 513, "accuracy": 0.376, "majority_rate": 0.179,
           "train_updates": 1500, "sec_per_update": 0.282, "hardware": "Intel", "command": "run one"}
    rows = [row, dict(row, variant="sinkhorn", hardware="AMD", command="run two", note="slowed by a job")]
    path = tmp_path / "attention_listops.json"
    path.write_text(json.dumps({"benchmark": "attention_listops", "hardware": "Intel; AMD", "threads": 2,
                                "command": "run two", "rows": rows}))
    text = tables.markdown_tables([str(path)])
    assert "- machine A: Intel, 2 torch thread(s)" in text and "- machine B: AMD, 2 torch thread(s)" in text
    assert "  - `run one`" in text and "  - `run two`" in text
    assert "| `full` | – | 513 | 37.6 | 17.9 | +19.7 | 1500 | 0.282 | A |" in text
    assert "| `sinkhorn` | – | 513 | 37.6 | 17.9 | +19.7 | 1500 | 0.282 [1] | B |" in text
    assert "[1] slowed by a job" in text
    path.write_text(json.dumps({"benchmark": "attention_listops", "hardware": "Intel", "threads": 2,
                                "command": "run one", "rows": [row]}))
    text = tables.markdown_tables([str(path)])
    assert "machine" not in text and "- hardware: Intel, 2 torch thread(s)" in text and "`run one`" in text


def test_listops_finished_variant_is_not_trained_again(tmp_path, monkeypatch):
    """fairseq-train on a finished checkpoint makes one more update (1,501 of a 1,500 budget): a variant
    whose log shows the budget reached is only validated."""
    import argparse
    import subprocess

    from benchmarks import attention_listops

    save = tmp_path / "full"
    save.mkdir()
    (save / "checkpoint_last.pt").write_bytes(b"")
    (save / "train.log").write_text(
        "2026-11-30 20:51:30 | INFO | train | epoch 003 | loss 2.3 | num_updates 1500 | train_wall 74 | wall 436\n")
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd[0])
        return subprocess.CompletedProcess(cmd, 0, stdout="| test | accuracy 37.6 |", stderr="")

    monkeypatch.setattr(attention_listops.subprocess, "run", fake_run)
    args = argparse.Namespace(batch_size=32, threads=1, lr=1e-3, max_update=1500)
    row = attention_listops.run_variant("full", {}, str(tmp_path), str(save), args, 513)
    assert calls == ["fairseq-validate"] and row["accuracy"] == 0.376 and row["train_updates"] == 1500
    args.max_update = 2000  # a larger budget trains on
    attention_listops.run_variant("full", {}, str(tmp_path), str(save), args, 513)
    assert calls[1:] == ["fairseq-train", "fairseq-validate"]


def test_listops_bubble_chart_maps_linear_to_its_feature_map(tmp_path, capsys):
    """The LRA-style chart finds linear attention's speed row by its feature map (linear_elu) and says
    which rows it could not place."""
    from benchmarks.attention_plots import draw_bubble

    speed = tmp_path / "speed.json"
    speed.write_text(json.dumps({"rows": [_speed_row("full", 4096, 1000, 50), _speed_row("linear_elu", 4096, 200, 30)]}))
    acc = tmp_path / "listops.json"
    row = {"max_length": 513, "accuracy": 0.37, "majority_rate": 0.18, "train_updates": 10, "sec_per_update": 0.1}
    acc.write_text(json.dumps({"rows": [dict(row, variant="full", options={}),
                                        dict(row, variant="linear", options={"feature_map": "elu"}),
                                        dict(row, variant="lsh", options={})]}))
    out = tmp_path / "bubble.png"
    draw_bubble(str(speed), str(acc), str(out))
    assert out.stat().st_size > 0
    err = capsys.readouterr().err
    assert "lsh: no speed row" in err and "linear_elu" not in err


def test_speed_peers_can_be_named(tmp_path, monkeypatch):
    """--peers alone times every installed peer; --peers NAME ... only those (a re-measure of one pair with
    --update); an unknown name is refused before anything runs."""
    import pytest

    from benchmarks import attention_peers, attention_speed

    ran = []
    monkeypatch.setattr(attention_peers, "available_peers", lambda: ["linformer", "routing-transformer"])
    monkeypatch.setattr(attention_speed, "run_one",
                        lambda variant, n, args: ran.append(variant) or _speed_row(variant.split(":")[-1], n, 1.0, 1.0))
    out = str(tmp_path / "speed.json")
    attention_speed.main(["--out", out, "--n", "512", "--variants", "routing", "--peers"])
    assert ran == ["routing", "peer:linformer", "peer:routing-transformer"]
    ran.clear()
    attention_speed.main(["--out", out, "--n", "512", "--variants", "routing", "--peers", "routing-transformer"])
    assert ran == ["routing", "peer:routing-transformer"]
    with pytest.raises(SystemExit):
        attention_speed.main(["--out", out, "--n", "512", "--variants", "routing", "--peers", "routing"])
