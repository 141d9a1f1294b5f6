"""Multi-process training with fairseq's own distributed code, on CPU:

    torchrun --nproc_per_node 2 $(which fairseq-train) ... --distributed-backend gloo --ddp-backend legacy_ddp

trains a plugin model with 2 processes.  Both ranks must hold identical parameters after the updates
(fairseq checkpoints rank 0 only, so tests/helpers/rank_dump/sitecustomize.py dumps every rank's
parameters when the process exits), and the result must match single-process training with the same
effective batch (--update-freq 2: rank r of update k sees batch 2k + r, the single process sees
batches 2k and 2k + 1) within TOLERANCE.  The arch trains without randomness (no dropout, no noise),
so the two runs compute the same sums in a different order: their difference is float rounding.
Plain SGD keeps it there: Adam's first steps divide each gradient by its own magnitude, so a coordinate
whose gradient is ~0 turns a rounding difference into a step of up to lr (CI saw 8e-6 with Adam).
"""
import os
import socket
import subprocess

import torch

from conftest import ROOT, VENV_BIN, cli_env
from reliability_utils import train_args, train_inprocess

TOLERANCE = 1e-6  # max |difference| of any parameter, distributed vs single process, after 3 updates
ARCH = "efficient_transformer"  # local attention; deterministic training step
UPDATES = 3


def _args(data_bin, save, *extra):
    return train_args(data_bin, ARCH, save, "--max-tokens", "200", "--dropout", "0", "--attention-dropout", "0",
                      "--optimizer", "sgd", "--lr", "0.5", *extra, updates=UPDATES)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model(path):
    from fairseq import checkpoint_utils

    return checkpoint_utils.load_checkpoint_to_cpu(str(path))["model"]


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def test_torchrun_two_cpu_processes_match_each_other_and_single_process(toy_databin, tmp_path):
    data_bin = toy_databin[0]
    dump = tmp_path / "dump"
    dump.mkdir()
    env = cli_env()
    env.update(OMP_NUM_THREADS="1", RANK_DUMP_DIR=str(dump),
               PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(ROOT, "tests", "helpers", "rank_dump"),
                                                        env.get("PYTHONPATH")])))
    cmd = [os.path.join(VENV_BIN, "torchrun"), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), os.path.join(VENV_BIN, "fairseq-train"),
           *_args(data_bin, tmp_path / "dist", "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "distributed init (rank 1)" in out and "training on 2 devices" in out, "2 processes, one job"

    ranks = [torch.load(dump / f"rank{r}.pt") for r in (0, 1)]
    assert [r["num_updates"] for r in ranks] == [UPDATES, UPDATES]
    for k in ranks[0]["params"]:
        assert torch.equal(ranks[0]["params"][k], ranks[1]["params"][k]), f"ranks differ in {k}"
    dist = _model(tmp_path / "dist" / "checkpoint_last.pt")
    assert _max_diff(dist, ranks[0]["params"]) == 0.0, "the checkpoint holds rank 0's parameters"

    train_inprocess(_args(data_bin, tmp_path / "single", "--update-freq", "2"))
    single = _model(tmp_path / "single" / "checkpoint_last.pt")
    print("max |distributed - single| =", _max_diff(dist, single))
    assert _max_diff(dist, single) <= TOLERANCE

    # the comparison can fail: half the effective batch gives clearly different parameters
    train_inprocess(_args(data_bin, tmp_path / "half"))
    half = _max_diff(_model(tmp_path / "half" / "checkpoint_last.pt"), single)
    print("max |half batch - single| =", half)
    assert half > 100 * TOLERANCE
