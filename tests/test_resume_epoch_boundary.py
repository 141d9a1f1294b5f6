"""A training resumed at an epoch boundary reproduces the uninterrupted run exactly (CPU): every logged
loss of the remaining updates and the final parameters bit for bit, for fairseq's ``transformer`` and
for a plugin NAT arch (``mask_predict``).

fairseq orders the training examples under ``numpy_seed(seed + epoch)`` and keeps the batches it
builds for the rest of the process: without the plugin's ``resume_batches`` shim (compat.py) a run
resumed at epoch e trains on batches built under seed + e, where the uninterrupted run still uses those
of epoch 1, and sentences of equal length change batches.  The toy corpus has many such ties.  The
kept tail batch (``keep_last_batch``) is part of every epoch of both runs.
"""
import re
import shutil

import pytest
import torch

from conftest import PLUGIN_DIR, run_cli
from reliability_utils import SMALL_DIMS, checkpoint_params as _model, inner_logs as _inner_logs

pytestmark = pytest.mark.slow  # four tiny trainings of three epochs each

FLAGS = {
    "transformer": ["--task", "translation", "--arch", "transformer", "--criterion",
                    "label_smoothed_cross_entropy", "--label-smoothing", "0.1"],
    "mask_predict": ["--task", "nat_translation", "--arch", "mask_predict", "--criterion", "mask_predict_loss"],
}


def _args(data_bin, arch, save_dir):
    return [data_bin, "--user-dir", PLUGIN_DIR, *FLAGS[arch], *SMALL_DIMS, "--optimizer", "adam",
            "--lr", "1e-3", "--max-tokens", "150", "--num-workers", "0", "--seed", "2", "--dropout", "0.1",
            "--max-epoch", "3", "--disable-validation", "--log-format", "json", "--log-interval", "1",
            "--save-dir", str(save_dir)]


@pytest.mark.parametrize("arch", sorted(FLAGS))
def test_resumed_at_an_epoch_boundary_equals_the_uninterrupted_run(arch, toy_databin, tmp_path):
    data_bin = toy_databin[0]
    ref = run_cli(["fairseq-train", *_args(data_bin, arch, tmp_path / "ref")])
    ref_logs = _inner_logs(ref.stdout + ref.stderr)
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    shutil.copy(tmp_path / "ref" / "checkpoint1.pt", resumed_dir / "checkpoint_last.pt")
    proc = run_cli(["fairseq-train", *_args(data_bin, arch, resumed_dir)])
    out = proc.stdout + proc.stderr
    m = re.search(r"Loaded checkpoint \S+ \(epoch [12] @ (\d+) updates\)", out)
    assert m, [line[:300] for line in out.splitlines() if "oaded" in line or "heckpoint_last" in line][:6]
    at = int(m.group(1))
    logs = _inner_logs(out)
    assert logs and min(logs) == at + 1 and max(logs) == max(ref_logs) > at, "epochs 2 and 3, to the end"
    for u in sorted(logs):
        assert logs[u] == ref_logs[u], f"update {u}: resumed {logs[u]} != uninterrupted {ref_logs[u]}"
    ours, theirs = _model(resumed_dir / "checkpoint_last.pt"), _model(tmp_path / "ref" / "checkpoint_last.pt")
    assert ours.keys() == theirs.keys()
    for k in theirs:
        assert torch.equal(ours[k], theirs[k]), f"{k} differs from the uninterrupted run"


def test_the_batches_of_a_resumed_epoch_are_the_uninterrupted_runs(toy_databin):
    """The iterator a run resumed at epoch 3 builds yields, in epoch 3, exactly the batches (same
    sentences, same order) that an iterator built at epoch 1 yields in its epoch 3."""
    from fairseq import options, tasks

    data_bin = toy_databin[0]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [data_bin, "--user-dir", PLUGIN_DIR, *FLAGS["transformer"],
                                                "--max-tokens", "150", "--seed", "2"])

    def epoch_batches(start_epoch, read_epoch):
        task = tasks.setup_task(args)
        task.load_dataset("train")
        itr = task.get_batch_iterator(task.dataset("train"), max_tokens=150, seed=2, epoch=start_epoch)
        while True:
            batches = [b["id"].tolist() for b in itr.next_epoch_itr(shuffle=True)]
            if itr.epoch == read_epoch:
                return batches

    continuous, resumed = epoch_batches(1, 3), epoch_batches(3, 3)
    ids = sorted(i for b in continuous for i in b)
    assert len(continuous) > 1 and ids == list(range(len(ids))), "every sentence once (the tail batch kept)"
    assert resumed == continuous
