"""The README's NAT overview chart (benchmarks.nat_chart) on the committed Multi30K results."""
import json

import pytest

from benchmarks import nat_chart


def test_points_use_their_own_runs_teacher():
    # ctc_imputer_mask_predict (a second mask_predict run, not a default) checks that a system is drawn once
    paths = nat_chart.default_paths() + [nat_chart.os.path.join(nat_chart.RESULTS, "ctc_imputer_mask_predict.json")]
    points, skipped = nat_chart.chart_points(paths)
    by_file = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
        by_file[results["benchmark"]] = results
    teachers = [p for p in points if (p["system"], p["decoding"]) == nat_chart.TEACHER]
    assert teachers and all(p["speedup"] == 1.0 for p in teachers)
    for p in points:
        rows = by_file[p["benchmark"]]["rows"]
        teacher = next(r for r in rows if (r["system"], r["decoding"]) == nat_chart.TEACHER)
        row = next(r for r in rows if (r["system"], r["decoding"]) == (p["system"], p["decoding"])
                   and r["latency_ms_b1"] == p["latency_ms_b1"])
        assert p["speedup"] == pytest.approx(teacher["latency_ms_b1"] / row["latency_ms_b1"])
        assert "dedup=1" not in p["decoding"] and p["system"] != "reference"
    # a system measured in several runs is drawn once (mask_predict: the first file's, mask_predict.json)
    mp = {p["benchmark"] for p in points if p["system"] == "mask_predict"}
    assert mp == {"mask_predict"}
    # files whose run has no teacher row are named, not compared with another run's teacher
    for name, _ in skipped:
        assert not any((r["system"], r["decoding"]) == nat_chart.TEACHER for r in by_file[name]["rows"])
    assert {p["benchmark"] for p in points}.isdisjoint(name for name, _ in skipped)


def test_chart_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "nat_overview.png"
    assert nat_chart.main(nat_chart.default_paths() + ["--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
