"""benchmarks/train_route_speed.py: the log parsing and timing arithmetic against hand-written lines, and
one tiny run of each route on the toy corpus (the file it writes, both routes present)."""
import json

import pytest

from benchmarks.train_route_speed import main, parse_log, seconds_per_update

LOG = """\
2026-12-06 22:29:47 | INFO | train_inner | epoch 001:      5 / 111 word_del-loss=0.981, loss=9.945, nll_loss=9.16, ppl=985.6, wps=1836.8, num_updates=5, lr=5e-05, train_wall=39, wall=41
2026-12-06 22:29:49 | INFO | fairseq.trainer | something else wall=3
2026-12-06 22:30:23 | INFO | train_inner | epoch 001:     10 / 111 loss=7.695, nll_loss=6.643, ppl=207.17, num_updates=10, lr=0.0001, train_wall=35, wall=76
2026-12-06 22:30:57 | INFO | train_inner | epoch 002:      4 / 111 mask_ins-loss=7.9, loss=6.649, nll_loss=5.41, train_wall=35, num_updates=15, lr=0.00015, train_wall=35, wall=111.5
"""


def test_parse_log_reads_loss_update_and_wall_of_train_inner_lines_only():
    assert parse_log(LOG) == [(5, 9.945, 41.0), (10, 7.695, 76.0), (15, 6.649, 111.5)]


def test_seconds_per_update_leaves_out_the_first_updates():
    pts = parse_log(LOG)
    assert seconds_per_update(pts, 5) == pytest.approx((111.5 - 41.0) / 10)
    assert seconds_per_update(pts, 10) == pytest.approx((111.5 - 76.0) / 5)
    with pytest.raises(ValueError, match="update 7"):
        seconds_per_update(pts, 7)
    with pytest.raises(ValueError, match="stopped at update 15"):
        seconds_per_update(pts, 15)


def test_tiny_run_times_both_routes(toy_databin, tmp_path, monkeypatch):
    for k, v in dict(LAYERS="1", DIM="32", FFN="64", HEADS="2", MAX_TOKENS="800").items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "speed.json"
    main(["--data-bin", toy_databin[0], "--updates", "4", "--skip", "2", "--rounds", "1", "--threads", "1",
          "--out", str(out)])
    res = json.loads(out.read_text())
    assert sorted(r["route"] for r in res["runs"]) == ["fairseq", "packed"]
    # fairseq's wall clock has whole seconds: two tiny updates may take 0 of them on a fast machine
    assert all(r["s_per_update"] >= 0 and set(r["loss"]) == {"2", "4"} for r in res["runs"])
    sp = res["s_per_update"]
    assert res["fairseq_over_packed"] == (pytest.approx(sp["fairseq"] / sp["packed"]) if sp["packed"] > 0 else None)


def test_bad_data_bin_is_one_line_error(tmp_path):
    with pytest.raises(SystemExit, match="no dict"):
        main(["--data-bin", str(tmp_path), "--out", str(tmp_path / "x.json")])
