"""Checkpoint safety (torch weights_only allow-list) and import idempotence."""
import argparse
import os
import subprocess
import sys

import pytest
import torch

from conftest import PLUGIN_DIR, ROOT, cli_env

import fairseq_nat_ext  # noqa: F401  (applies compat)
from fairseq import checkpoint_utils
from fairseq_nat_ext.compat import UnsafeCheckpointError


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_fairseq_style_checkpoint_loads(tmp_path):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"model": {"_name": "transformer", "dropout": 0.1, "layers": [1, 2]},
                            "task": {"_name": "translation", "data": "x"}})
    path = tmp_path / "ok.pt"
    torch.save({"args": argparse.Namespace(arch="transformer", lr=[0.1]), "cfg": cfg,
                "model": {"w": torch.zeros(2)}, "extra_state": {"val_loss": 1.5},
                "optimizer_history": [{"criterion_name": "x", "optimizer_name": "adam",
                                       "lr_scheduler_state": {"best": 1.5}, "num_updates": 3}],
                "last_optimizer_state": None}, path)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert torch.equal(state["model"]["w"], torch.zeros(2))


def test_shared_teacher_checkpoint_loads(shared_data):
    state = checkpoint_utils.load_checkpoint_to_cpu(
        os.path.join(shared_data, "multi30k-teacher", "teacher.pt"))
    assert "model" in state


def test_foreign_pickled_object_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "args": _Evil(str(marker))}, path)
    with pytest.raises(UnsafeCheckpointError) as err:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "system" in msg
    assert not marker.exists(), "the pickled command must not have run"


def test_truncated_checkpoint_is_a_clear_error(tmp_path):
    path = tmp_path / "cut.pt"
    torch.save({"model": {"w": torch.zeros(1000)}}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(UnsafeCheckpointError) as err:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert "truncated or corrupted" in str(err.value) and str(path) in str(err.value)


def test_cli_refuses_evil_checkpoint_in_one_line(tmp_path, toy_databin):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "args": _Evil(str(marker))}, path)
    exe = os.path.join(os.path.dirname(sys.executable), "fairseq-generate")
    proc = subprocess.run([exe, toy_databin[0], "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                           "--path", str(path)], capture_output=True, text=True, env=cli_env())
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: refusing to load checkpoint") and str(path) in last
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


def test_import_user_module_twice_and_through_symlink(tmp_path):
    from fairseq import utils

    link = tmp_path / "fairseq_nat_ext"
    os.symlink(PLUGIN_DIR, link)
    utils.import_user_module(argparse.Namespace(user_dir=PLUGIN_DIR))
    utils.import_user_module(argparse.Namespace(user_dir=PLUGIN_DIR))
    utils.import_user_module(argparse.Namespace(user_dir=str(link)))


def test_user_dir_after_hub_import_in_fresh_process(tmp_path):
    other = tmp_path / "renamed_plugin"
    os.symlink(PLUGIN_DIR, other)
    code = (
        "import argparse, fairseq_nat_ext\n"
        "from fairseq import utils\n"
        f"utils.import_user_module(argparse.Namespace(user_dir={PLUGIN_DIR!r}))\n"
        f"utils.import_user_module(argparse.Namespace(user_dir={str(other)!r}))\n"
        "import importlib; importlib.reload(fairseq_nat_ext)\n"
        "from fairseq.models import ARCH_MODEL_REGISTRY\n"
        "assert 'mask_predict_small' in ARCH_MODEL_REGISTRY\n"
        "print('ok')\n"
    )
    assert _python(code).stdout.strip().endswith("ok")


def _python(code):
    """Run ``code`` in a fresh interpreter of the venv (from the repo root); it must exit 0."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env=cli_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_importing_the_plugin_leaves_the_root_logger_quiet():
    """fairseq's wav2vec2_classification sets the root logger to DEBUG on import; the plugin undoes it, so
    `python -m benchmarks.plot` does not print matplotlib's font search."""
    code = (
        "import logging, fairseq_nat_ext, matplotlib.pyplot as plt\n"
        "plt.figure(); plt.title('x'); plt.savefig(__import__('io').BytesIO())\n"
        "print(logging.getLevelName(logging.getLogger().level))\n"
    )
    proc = _python(code)
    assert proc.stdout.strip() == "WARNING"
    assert "DEBUG:matplotlib" not in proc.stderr
