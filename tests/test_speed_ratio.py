"""benchmarks/speed_ratio.py: two systems timed interleaved in one process (the shared teacher against
itself with another beam: the script's bookkeeping, not a speed claim)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import teacher_test_databin

REPO = Path(__file__).resolve().parents[1]


def test_speed_ratio_times_both_systems_on_the_same_sentences(tmp_path):
    teacher = teacher_test_databin(tmp_path, range(12))
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONPATH=str(REPO))
    out = tmp_path / "ratio.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.speed_ratio", "--data-bin", str(tmp_path / "data-bin"),
         "--teacher", str(teacher / "teacher.pt"), "--teacher-decoding", "beam=5",
         "--path", str(teacher / "teacher.pt"), "--decoding", "beam=1", "--sentences", "12", "--rounds", "2",
         "--out", str(out)],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["sentences"] == 12 and r["rounds"] == 2 and len(r["ratio_per_round"]) == 2
    assert r["teacher"]["decoding"] == "beam=5" and r["system"]["decoding"] == "beam=1"
    # the ratio is the teacher's time over the system's, over all rounds
    assert r["ratio"] == pytest.approx(r["teacher"]["ms_per_sentence"] / r["system"]["ms_per_sentence"], rel=0.01)
    assert min(r["ratio_per_round"]) - 0.01 <= r["ratio"] <= max(r["ratio_per_round"]) + 0.01
    # deterministic decodings give the same hypotheses every round; greedy runs 1 decoder pass per token
    assert r["teacher"]["same_hypotheses_every_round"] and r["system"]["same_hypotheses_every_round"]
    assert r["system"]["decoder_passes_per_sentence"] > 1
    assert str(tmp_path) not in json.dumps(r)  # paths recorded relative
