"""The quick start runs end to end (tiny budgets) and prints its tables."""
import json
import os
import subprocess

import pytest

from conftest import ROOT, cli_env


@pytest.mark.slow
def test_quickstart_script_runs_end_to_end(tmp_path):
    out = tmp_path / "qs"
    env = cli_env()
    env.update(TEACHER_UPDATES="100", NAT_UPDATES="100", CORPUS_TRAIN="2000", CORPUS_TEST="60",
               LATENCY_SENTENCES="10")
    proc = subprocess.run(["bash", os.path.join(ROOT, "examples", "quickstart.sh"), str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.load(open(out / "results.json"))
    systems = {(r["system"], r["decoding"], r["distilled"]) for r in res["rows"]}
    assert ("fairseq:transformer", "beam=5", False) in systems
    assert ("mask_predict", "iter=10,len_beam=3", True) in systems
    assert ("mask_predict", "iter=10,len_beam=3", False) in systems
    assert "| system |" in proc.stdout and "valid translations" in proc.stdout
