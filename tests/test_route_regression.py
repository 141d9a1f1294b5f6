"""benchmarks/route_regression.py: one decoding timed with two versions of the plugin, processes alternating
(here HEAD against itself: the script's bookkeeping, not a speed claim)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import teacher_test_databin

from benchmarks.route_regression import compare

REPO = Path(__file__).resolve().parents[1]


def _round(ms, tokens, strings=None):
    return {"ms_per_sentence": ms, "tokens": tokens, "strings": strings or [" ".join(map(str, t)) for t in tokens],
            "sentences": len(tokens), "plugin": "x"}


def test_compare_ratio_tolerance_and_identity():
    before = [_round(10.0, [[1, 2]]), _round(12.0, [[1, 2]])]
    after = [_round(11.0, [[1, 2]]), _round(12.0, [[1, 2]])]
    s = compare(before, after, 0.05)
    assert s["before_ms_per_sentence"] == 11.0 and s["after_ms_per_sentence"] == 11.5
    assert s["ratio_after_over_before"] == pytest.approx(11.5 / 11.0, abs=1e-3)
    assert s["within_tolerance"]  # 4.5% slower
    assert not compare(before, [_round(12.0, [[1, 2]])], 0.05)["within_tolerance"]  # 9% slower
    assert s["identical_hypotheses"]
    assert not compare(before, [_round(11.0, [[1, 3]])], 0.05)["identical_hypotheses"]
    # one round of one version differing is enough (e.g. a sampling decoder drawing differently)
    assert not compare(before + [_round(11.0, [[2, 2]])], after, 0.05)["identical_hypotheses"]
    assert not compare(before, [_round(11.0, [[1, 2]], ["1 2 "])], 0.05)["identical_hypotheses"]


def _run(tmp_path, *args):
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "benchmarks.route_regression", *args],
                          capture_output=True, text=True, env=env, cwd=tmp_path)


def test_route_regression_decodes_with_both_trees(tmp_path):
    teacher = teacher_test_databin(tmp_path, range(12))
    out = tmp_path / "rr.json"
    proc = _run(tmp_path, "--before", "HEAD", "--data-bin", str(tmp_path / "data-bin"),
                "--system", "t1", str(teacher / "teacher.pt"), "beam=1", "--sentences", "12", "--rounds", "2",
                "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    s = r["systems"]["t1"]
    assert r["rounds"] == 2 and len(s["before_ms_per_round"]) == 2 and len(s["after_ms_per_round"]) == 2
    assert s["sentences"] == 12 and s["decoding"] == "beam=1"
    assert s["identical_hypotheses"]  # the same code and a deterministic decoder
    assert s["ratio_after_over_before"] == pytest.approx(s["after_ms_per_sentence"] / s["before_ms_per_sentence"],
                                                         rel=0.01)
    assert str(tmp_path) not in json.dumps(r)  # paths recorded relative
    # the temporary worktree is gone
    trees = subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True).stdout
    assert "route_regression_" not in trees


def test_route_regression_refuses_bad_input(tmp_path):
    proc = _run(tmp_path, "--before", "no-such-ref-xyz", "--data-bin", str(tmp_path), "--system", "a",
                str(tmp_path / "missing.pt"), "beam=1", "--out", str(tmp_path / "o.json"))
    assert proc.returncode == 2 and "missing.pt not found" in proc.stderr
    ck = tmp_path / "c.pt"
    ck.write_bytes(b"x")
    proc = _run(tmp_path, "--before", "no-such-ref-xyz", "--data-bin", str(tmp_path), "--system", "a",
                str(ck), "beam=1", "--out", str(tmp_path / "o.json"))
    assert proc.returncode == 2 and "--before no-such-ref-xyz: not a commit" in proc.stderr
    proc = _run(tmp_path, "--before", "HEAD", "--data-bin", str(tmp_path), "--system", "a", str(ck), "beam=1",
                "--system-option", "b", "npd=1", "--out", str(tmp_path / "o.json"))
    assert proc.returncode == 2 and "--system-option b: no --system of that name" in proc.stderr
    assert not (tmp_path / "o.json").exists()
