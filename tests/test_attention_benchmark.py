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


def test_tiny_memory_limit_is_reported_as_oom(tmp_path):
    out = tmp_path / "oom.json"
    attention_speed.main(["--out", str(out), "--n", "256", "4096", "--variants", "full_explicit",
                          "--threads", "1", "--mem-limit-gb", "1.5"])
    small, big = json.loads(out.read_text())["rows"]
    assert small["oom"] is False and small["fwd_bwd_ms"] > 0, "the limit itself leaves room to run"
    assert big["oom"] is True and big["fwd_bwd_ms"] is None
