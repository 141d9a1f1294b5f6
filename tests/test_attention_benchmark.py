"""The attention speed/memory harness writes well-formed rows (no timing is asserted here)."""
import json

from fairseq_nat_ext.benchmark import attention_speed


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


def test_speed_table_and_bar_ratios(tmp_path):
    """The README table of the speed study: one line per (impl, variant), OOM cells, and the bar
    ratios computed from the rows (speed-up, memory ratios, growth, peer / ours)."""
    from fairseq_nat_ext.benchmark import tables

    rows = [_speed_row("full", 4096, 1000, 50), _speed_row("full", 8192, 4000, 100),
            _speed_row("full", 16384, 16000, 200),
            _speed_row("full_explicit", 8192, 9000, 4000), _speed_row("full_explicit", 16384, 0, 0, oom=True),
            _speed_row("local", 4096, 200, 20), _speed_row("local", 8192, 500, 150),
            _speed_row("local", 16384, 1100, 300),
            _speed_row("local", 4096, 300, 25, impl="peer:local-attention")]
    path = tmp_path / "attention_speed.json"
    path.write_text(json.dumps({"benchmark": "attention_speed", "hardware": "cpu", "threads": 2,
                                "command": "python -m fairseq_nat_ext.benchmark.attention_speed", "rows": rows}))
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


def test_speed_curves_are_drawn(tmp_path):
    from fairseq_nat_ext.benchmark import attention_plots

    path = tmp_path / "speed.json"
    path.write_text(json.dumps({"rows": [_speed_row("full", n, n / 10, n / 100) for n in (512, 1024)]
                                + [_speed_row("local", 512, 0, 0, oom=True)]}))
    attention_plots.main(["curves", str(path), str(tmp_path / "curves.png")])
    assert (tmp_path / "curves.png").stat().st_size > 10_000
