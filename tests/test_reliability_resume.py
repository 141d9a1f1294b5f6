"""Crash and resume: SIGKILL a tiny fairseq-train of a plugin model, restart it, and check nothing is
lost: it continues from the last checkpoint with the same update count and, with the same seed,
reproduces the uninterrupted run exactly on CPU (every logged loss of the remaining updates, and the
final parameters bit for bit).  fairseq restores model, optimizer, scheduler and the position inside
the epoch from the checkpoint, and re-seeds torch with seed + update number before every update, so
the random masking and dropout of an update do not depend on where the run started.

fairseq copies each new checkpoint to checkpoint_last.pt non-atomically; a kill during that copy is
simulated by truncating checkpoint_last.pt: fairseq_nat_ext/checkpoint_resume.py (used by the recipes)
then resumes from the newest intact checkpoint and says so.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import PLUGIN_DIR, ROOT, cli_env, run_cli
from reliability_utils import checkpoint_params as _params, inner_logs as _inner_logs, popen_cli, train_args

from fairseq_nat_ext import checkpoint_resume

MAX_UPDATE = 40
KILL_AFTER_UPDATE = 7  # checkpoints every 3 updates: killed between two saves, some work is lost


def _args(data_bin, save_dir):
    return train_args(data_bin, "mask_predict", save_dir, "--max-tokens", "100", "--save-interval-updates", "3",
                      "--keep-interval-updates", "2", "--log-format", "json", "--log-interval", "1",
                      "--seed", "3", "--dropout", "0.1", updates=MAX_UPDATE)


def _updates(path):
    from fairseq import checkpoint_utils

    return checkpoint_utils.load_checkpoint_to_cpu(str(path))["optimizer_history"][-1]["num_updates"]


@pytest.fixture(scope="module")
def killed_run(toy_databin, tmp_path_factory):
    """An uninterrupted reference run and, started at the same time, a run SIGKILLed mid-epoch."""
    root = tmp_path_factory.mktemp("resume")
    data_bin = toy_databin[0]
    ref = popen_cli(["fairseq-train", *_args(data_bin, root / "ref")], root / "ref.log")
    killed, log = popen_cli(["fairseq-train", *_args(data_bin, root / "killed")], root / "killed.log")
    deadline = time.time() + 240
    try:
        while max(_inner_logs((root / "killed.log").read_text()), default=0) < KILL_AFTER_UPDATE:
            assert killed.poll() is None, \
                "the run ended before it could be killed:\n" + (root / "killed.log").read_text()[-3000:]
            assert time.time() < deadline, "timed out waiting for updates"
            time.sleep(0.02)
    finally:
        if killed.poll() is None:
            os.killpg(killed.pid, signal.SIGKILL)  # the kill under test (or clean-up after a failure)
        killed.wait()
        log.close()
    assert killed.returncode == -signal.SIGKILL, "the run must have been killed, not have finished"
    try:
        ref[0].wait(timeout=300)
    finally:
        if ref[0].poll() is None:
            os.killpg(ref[0].pid, signal.SIGKILL)
        ref[1].close()
    assert ref[0].returncode == 0, (root / "ref.log").read_text()[-3000:]
    return data_bin, root


def _resume_and_compare(data_bin, root, save, extra, expect_loaded):
    before = _inner_logs((root / "killed.log").read_text())
    start = _updates(expect_loaded)
    proc = run_cli(["fairseq-train", *_args(data_bin, save), *extra])
    out = proc.stdout + proc.stderr
    m = re.search(r"Loaded checkpoint (\S+) \(epoch 1 @ (\d+) updates\)", out)
    assert m, out[-3000:]
    resumed_from, at = m.group(1), int(m.group(2))
    assert os.path.abspath(resumed_from) == os.path.abspath(expect_loaded) and at == start
    assert 3 <= at < MAX_UPDATE and at % 3 == 0, "a mid-epoch interval checkpoint"
    logs = _inner_logs(out)
    assert min(logs) == at + 1 and max(logs) == MAX_UPDATE, "continues with the next update, up to the end"
    ref_logs = _inner_logs((root / "ref.log").read_text())
    for u in range(at + 1, MAX_UPDATE + 1):
        assert logs[u] == ref_logs[u], f"update {u}: resumed {logs[u]} != uninterrupted {ref_logs[u]}"
    for u in set(before) & set(ref_logs):
        assert before[u] == ref_logs[u], "the killed run was the same run until the kill"
    ours, ref = _params(save / "checkpoint_last.pt"), _params(root / "ref" / "checkpoint_last.pt")
    assert ours.keys() == ref.keys()
    for k in ref:
        assert torch.equal(ours[k], ref[k]), f"{k} differs from the uninterrupted run"
    return at


def test_sigkill_then_restart_continues_and_reproduces_the_uninterrupted_run(killed_run, tmp_path):
    data_bin, root = killed_run
    save = tmp_path / "save"
    shutil.copytree(root / "killed", save)
    _resume_and_compare(data_bin, root, save, [], expect_loaded=save / "checkpoint_last.pt")


def test_kill_during_the_checkpoint_last_copy_resumes_from_the_newest_intact_checkpoint(killed_run, tmp_path):
    data_bin, root = killed_run
    save = tmp_path / "save"
    shutil.copytree(root / "killed", save)
    last = save / "checkpoint_last.pt"
    newest = max((p for p in save.iterdir() if re.match(r"checkpoint_1_\d+\.pt$", p.name)), key=lambda p: _updates(p))
    data = last.read_bytes()
    assert data == newest.read_bytes(), "checkpoint_last.pt is a copy of the newest checkpoint"
    last.write_bytes(data[: len(data) // 2])  # the copy was cut short
    os.utime(last)  # it was written after the checkpoint it copies
    proc = subprocess.run([sys.executable, os.path.join(PLUGIN_DIR, "checkpoint_resume.py"), str(save)],
                          capture_output=True, text=True, env=cli_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["--restore-file", str(newest)]
    assert proc.stderr.startswith("[checkpoint_resume] checkpoint_last.pt is damaged (truncated")
    assert f"resuming from {newest} (newest intact checkpoint, update {_updates(newest)})" in proc.stderr
    _resume_and_compare(data_bin, root, save, proc.stdout.split(), expect_loaded=newest)


# ---- the helper and the recipes, without training ------------------------------------------------

def _zip_checkpoint(path, mtime):
    torch.save({"model": {"w": torch.zeros(3)}}, path)
    os.utime(path, (mtime, mtime))


def _save_dir(tmp_path, last="truncated", newest="checkpoint_1_6.pt"):
    save = tmp_path / "save"
    save.mkdir()
    t = time.time() - 100
    _zip_checkpoint(save / "checkpoint_1_3.pt", t)
    _zip_checkpoint(save / newest, t + 10)
    (save / "checkpoint_avg.pt").write_bytes(b"ignored: not a fairseq-train checkpoint name")
    (save / "init_from_at.pt").write_bytes(b"ignored too")
    if last == "truncated":
        data = (save / newest).read_bytes()
        (save / "checkpoint_last.pt").write_bytes(data[: len(data) - 50])
        os.utime(save / "checkpoint_last.pt", (t + 11, t + 11))
    elif last == "older":  # killed while copying checkpoint_best.pt: checkpoint_last.pt is the previous one
        _zip_checkpoint(save / "checkpoint_last.pt", t + 5)
    elif last == "newest":
        _zip_checkpoint(save / "checkpoint_last.pt", t + 11)
    return save


@pytest.mark.parametrize("last,expect_args,expect_msg", [
    ("newest", [], "resuming from {s}/checkpoint_last.pt (intact, newest)"),
    ("truncated", ["--restore-file", "{s}/checkpoint_1_6.pt"],
     "checkpoint_last.pt is damaged (truncated or not a torch checkpoint (no zip directory)): resuming from "
     "{s}/checkpoint_1_6.pt (newest intact checkpoint, update 6)"),
    ("older", ["--restore-file", "{s}/checkpoint_1_6.pt"],
     "checkpoint_last.pt is older: resuming from {s}/checkpoint_1_6.pt (newest intact checkpoint, update 6)"),
    ("missing", ["--restore-file", "{s}/checkpoint_1_6.pt"],
     "there is no checkpoint_last.pt: resuming from {s}/checkpoint_1_6.pt (newest intact checkpoint, update 6)"),
])
def test_checkpoint_resume_choice(tmp_path, last, expect_args, expect_msg):
    save = _save_dir(tmp_path, last)
    args, msg = checkpoint_resume.choose(str(save))
    assert args == [a.format(s=save) for a in expect_args]
    assert msg == expect_msg.format(s=save)


def test_checkpoint_resume_fresh_start_and_nothing_intact(tmp_path, capsys):
    assert checkpoint_resume.choose(str(tmp_path)) == ([], f"no checkpoint in {tmp_path}: training starts from scratch")
    (tmp_path / "checkpoint_last.pt").write_bytes(b"PK\x03\x04 cut")
    assert checkpoint_resume.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: no intact checkpoint in {tmp_path} (checkpoint_last.pt: ")


def _stub_fairseq_train(tmp_path):
    """A fake fairseq-train first on PATH that records its arguments (the recipes' wiring only)."""
    bin_dir = tmp_path / "stub"
    bin_dir.mkdir()
    record = tmp_path / "args.txt"
    stub = bin_dir / "fairseq-train"
    stub.write_text(f"#!/usr/bin/env bash\nprintf '%s\\n' \"$@\" > {record}\n")
    stub.chmod(0o755)
    env = cli_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["AVG"] = "0"
    return env, record


@pytest.mark.parametrize("recipe", ["train_mask_predict.sh", "train_teacher.sh", "train_levenshtein.sh"])
def test_recipes_resume_from_the_newest_intact_checkpoint_and_say_so(tmp_path, toy_databin, recipe):
    save = _save_dir(tmp_path, "truncated")
    env, record = _stub_fairseq_train(tmp_path)
    env["INIT_FROM"] = str(save / "checkpoint_1_3.pt")  # NAT recipes: must not add --finetune-from-model then
    proc = subprocess.run(["bash", os.path.join(ROOT, "examples", recipe), toy_databin[0], str(save)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    args = record.read_text().splitlines()
    i = args.index("--restore-file")
    assert args[i + 1] == f"{save}/checkpoint_1_6.pt" and "--finetune-from-model" not in args
    said = f"resuming from {save}/checkpoint_1_6.pt (newest intact checkpoint, update 6)"
    assert said in proc.stderr and said in (save / "train.log").read_text()


@pytest.mark.parametrize("recipe", ["train_mask_predict.sh", "train_teacher.sh"])
def test_recipes_stop_with_one_line_when_no_checkpoint_is_intact(tmp_path, toy_databin, recipe):
    save = tmp_path / "save"
    save.mkdir()
    (save / "checkpoint_last.pt").write_bytes(b"\0" * 100)
    env, record = _stub_fairseq_train(tmp_path)
    proc = subprocess.run(["bash", os.path.join(ROOT, "examples", recipe), toy_databin[0], str(save)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and not record.exists(), "fairseq-train is not started"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: no intact checkpoint in {save} (checkpoint_last.pt: truncated or not a torch "
                      "checkpoint (no zip directory)); move the damaged files away to start from scratch"]
