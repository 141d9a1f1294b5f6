"""Safe checkpoints: loading never executes code from a checkpoint.

A crafted checkpoint whose pickle would run a command (touch a marker file) is refused, with one line
naming the file and the pickled object, by every way the plugin or fairseq loads a checkpoint
(--path, the hub, resuming training, --finetune-from-model, init_from_at, checkpoint averaging); the
marker proves the command did not run, and the same file loaded unsafely does run it (so the payload
is live).  Genuine checkpoints (every plugin arch, fairseq's own transformer and cmlm_transformer)
load.  (One-line CLI form: tests/test_compat.py::test_cli_refuses_evil_checkpoint_in_one_line.)
"""
import os
import subprocess
import sys

import pytest
import torch

from conftest import PLUGIN_DIR, cli_env
from reliability_utils import ARCHS, SMALL_DIMS, TRAIN_BASE, train_args, train_inprocess

import fairseq_nat_ext  # noqa: F401
from fairseq import checkpoint_utils
from fairseq_nat_ext.compat import UnsafeCheckpointError


class _Call:
    """Pickles as a call of ``func(*args)``: what a malicious checkpoint carries."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _payloads(marker):
    cmd = f"touch {marker}"
    return {
        "os.system": _Call(os.system, cmd),
        "subprocess.call": _Call(subprocess.call, ["touch", str(marker)]),
        "builtins.exec": _Call(exec, f"open({str(marker)!r}, 'w').close()"),
        "builtins.eval": _Call(eval, f"open({str(marker)!r}, 'w').close()"),
    }


def _evil_checkpoint(path, genuine, payload, where):
    """A copy of a genuine checkpoint with ``payload`` hidden at ``where``."""
    state = torch.load(genuine)  # the safe loader: a genuine checkpoint holds only allow-listed types
    if where == "args":
        state["args"] = payload
    elif where == "extra_state":
        state["extra_state"]["hook"] = {"nested": [1, payload]}
    elif where == "model":
        state["model"]["decoder.evil"] = payload
    torch.save(state, path)
    return path


@pytest.fixture(scope="module")
def genuine(tiny_checkpoints):
    return tiny_checkpoints("mask_predict")


def test_the_payload_is_live_when_loaded_unsafely(tmp_path, genuine):
    marker = tmp_path / "ran"
    path = _evil_checkpoint(tmp_path / "evil.pt", genuine, _payloads(marker)["os.system"], "args")
    code = f"import torch; torch.load({str(path)!r}, weights_only=False)"
    subprocess.run([sys.executable, "-c", code], check=True, env=cli_env(), timeout=120)
    assert marker.exists(), "the crafted checkpoint runs its command under an unsafe load"


@pytest.mark.parametrize("where", ["args", "extra_state", "model"])
@pytest.mark.parametrize("kind", ["os.system", "subprocess.call", "builtins.exec", "builtins.eval"])
def test_crafted_checkpoint_is_refused_by_the_loader(tmp_path, genuine, kind, where):
    marker = tmp_path / "ran"
    path = _evil_checkpoint(tmp_path / "evil.pt", genuine, _payloads(marker)[kind], where)
    with pytest.raises(UnsafeCheckpointError) as err:
        checkpoint_utils.load_model_ensemble([str(path)])
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"refusing to load checkpoint {path}: it contains the pickled object")
    assert kind.split(".")[1] in msg, msg
    assert not marker.exists(), "the pickled command must not run"


def _refused(marker, fn, exc=UnsafeCheckpointError, needle="refusing to load checkpoint"):
    with pytest.raises(exc) as err:
        fn()
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not marker.exists()


def test_crafted_checkpoint_is_refused_by_every_loading_path(tmp_path, genuine, toy_databin):
    from fairseq.models import ARCH_MODEL_REGISTRY

    from fairseq_nat_ext import checkpoint_average, init_from_at

    data_bin = toy_databin[0]
    marker = tmp_path / "ran"
    evil = _evil_checkpoint(tmp_path / "evil.pt", genuine, _payloads(marker)["os.system"], "args")
    # the hub interface
    _refused(marker, lambda: ARCH_MODEL_REGISTRY["mask_predict_tiny"].from_pretrained(
        str(tmp_path), checkpoint_file="evil.pt", data_name_or_path=data_bin, user_dir=PLUGIN_DIR))
    # resuming training from checkpoint_last.pt, and --restore-file
    save = tmp_path / "resume"
    save.mkdir()
    (save / "checkpoint_last.pt").write_bytes(evil.read_bytes())
    _refused(marker, lambda: train_inprocess(train_args(data_bin, "mask_predict", save, updates=1)))
    _refused(marker, lambda: train_inprocess(train_args(data_bin, "mask_predict", tmp_path / "r2", "--restore-file",
                                                        str(evil), updates=1)))
    # --finetune-from-model
    _refused(marker, lambda: train_inprocess(train_args(data_bin, "mask_predict", tmp_path / "ft",
                                                        "--finetune-from-model", str(evil), updates=1)))
    # init_from_at --teacher
    _refused(marker, lambda: init_from_at.make_init_checkpoint(
        str(evil), str(tmp_path / "init.pt"), train_args(data_bin, "mask_predict", tmp_path / "x")))
    # checkpoint averaging
    avg = tmp_path / "avg"
    avg.mkdir()
    (avg / "checkpoint1.pt").write_bytes(evil.read_bytes())
    (avg / "checkpoint2.pt").write_bytes(genuine.read_bytes())
    _refused(marker, lambda: checkpoint_average.average_checkpoints(checkpoint_average.last_checkpoints(str(avg), 2)),
             exc=ValueError)
    assert not (tmp_path / "init.pt").exists()


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_genuine_plugin_checkpoints_load(arch, tiny_checkpoints, toy_databin):
    models, cfg = checkpoint_utils.load_model_ensemble([str(tiny_checkpoints(arch))],
                                                       arg_overrides={"data": toy_databin[0]})
    assert type(models[0]).__module__.startswith("fairseq_nat_ext.")
    assert cfg.model.arch == ARCHS[arch][ARCHS[arch].index("--arch") + 1]


@pytest.mark.parametrize("flags", [
    ["--task", "translation", "--arch", "transformer", "--criterion", "label_smoothed_cross_entropy"],
    ["--task", "translation_lev", "--noise", "random_mask", "--arch", "cmlm_transformer", "--criterion", "nat_loss"],
], ids=["transformer", "cmlm_transformer"])
def test_genuine_fairseq_checkpoints_load(flags, tmp_path, toy_databin):
    save = tmp_path / "ck"
    train_inprocess([toy_databin[0], "--user-dir", PLUGIN_DIR, *flags, *SMALL_DIMS, *TRAIN_BASE,
                     "--max-update", "1", "--save-dir", str(save)])
    models, cfg = checkpoint_utils.load_model_ensemble([str(save / "checkpoint_last.pt")],
                                                       arg_overrides={"data": toy_databin[0]})
    assert type(models[0]).__module__.startswith("fairseq.models")
    assert cfg.model.arch == flags[flags.index("--arch") + 1]
