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


# ---- the shim list: versions, scope, and shims that turn themselves off ------------------------------

def test_every_shim_states_its_target_and_scope_and_was_applied_only_if_needed():
    from fairseq_nat_ext import compat

    assert len({s.name for s in compat.SHIMS}) == len(compat.SHIMS)
    for shim in compat.SHIMS:
        assert shim.targets and shim.scope in ("plugin", "fairseq"), shim
        assert shim.name in compat.APPLIED or not shim.needed(), shim.name


def test_source_check_turns_a_shim_off_once_fairseq_has_the_fix():
    from fairseq_nat_ext.compat import source_contains

    def fixed(b):
        return b

    def unfixed(b):
        b = b[:-1]
        return b

    assert source_contains(unfixed, "b = b[:-1]") and not source_contains(fixed, "b = b[:-1]")


# ---- interactive input: fairseq's lines for every input fairseq read, one line for a bad byte --------

INTERACTIVE_TEXT = "ein Haus .\r\nzwei  Häuser\rdrei\n\nvier ü\x0csechs\rsieben\n  fünf  "


def _fairseq_lines(path_or_dash, buffer_size=2):
    import fairseq_nat_ext  # noqa: F401
    import fairseq_cli.interactive as interactive

    return list(interactive.buffered_read.__wrapped__(path_or_dash, buffer_size))


def test_interactive_reads_a_file_exactly_as_fairseq(tmp_path):
    from fairseq_nat_ext.compat import buffered_read_utf8

    path = tmp_path / "in.txt"
    path.write_bytes(INTERACTIVE_TEXT.encode("utf-8"))
    for size in (1, 2, 5):
        assert list(buffered_read_utf8(str(path), size)) == _fairseq_lines(str(path), size)


def test_interactive_reads_a_text_only_stdin_as_fairseq(monkeypatch):
    """A StringIO on stdin (no .buffer): fairseq's own tests feed fairseq-interactive this way."""
    import io

    from fairseq_nat_ext.compat import buffered_read_utf8

    monkeypatch.setattr("sys.stdin", io.StringIO(INTERACTIVE_TEXT))
    expected = _fairseq_lines("-")
    monkeypatch.setattr("sys.stdin", io.StringIO(INTERACTIVE_TEXT))
    assert list(buffered_read_utf8("-", 2)) == expected
    assert expected[0] == ["ein Haus .", "zwei  Häuser\rdrei"]  # a StringIO splits on \n only


def test_interactive_reads_a_binary_backed_stdin_as_fairseq(monkeypatch):
    import io

    from fairseq_nat_ext.compat import buffered_read_utf8

    def stdin():
        return io.TextIOWrapper(io.BytesIO(INTERACTIVE_TEXT.encode("utf-8")), encoding="utf-8")

    monkeypatch.setattr("sys.stdin", stdin())
    expected = _fairseq_lines("-")
    monkeypatch.setattr("sys.stdin", stdin())
    assert list(buffered_read_utf8("-", 2)) == expected


def test_interactive_bad_byte_is_one_line_naming_file_and_line(tmp_path):
    from fairseq_nat_ext.compat import InputError, buffered_read_utf8

    path = tmp_path / "in.txt"
    path.write_bytes(b"gut\nauch gut\nschlecht \xff\n")
    with pytest.raises(InputError, match=r"in.txt line 3: not valid UTF-8 \(byte 0xff at byte 10\)"):
        list(buffered_read_utf8(str(path), 100))


# ---- numpy.compat (removed in numpy 2, still used by fairseq 0.12) -----------------------------------

def test_numpy_compat_long_for_fairseqs_token_block_dataset():
    import fairseq_nat_ext  # noqa: F401
    import numpy as np
    import torch
    from fairseq.data import TokenBlockDataset

    assert np.compat.long is int
    items = [torch.tensor([4, 5, 2]), torch.tensor([6, 2])]

    class Listed(torch.utils.data.Dataset):
        sizes = np.array([3, 2])

        def __getitem__(self, i):
            return items[i]

        def __len__(self):
            return 2

    ds = TokenBlockDataset(Listed(), Listed.sizes, block_size=None, pad=1, eos=2, break_mode="eos")
    assert [ds[i].tolist() for i in range(len(ds))] == [[4, 5, 2], [6, 2]]


# ---- fairseq's insertion_transformer with --label-tau ------------------------------------------------

def test_fairseq_insertion_label_tau_targets_are_the_binary_tree_weights():
    """fairseq's _get_ins_targets with tau (--label-tau) crashed on a float64 scatter; with the shim its
    float32 targets hold, for every slot, exp(-|k - (L-1)/2| / tau) normalised over the slot's L missing
    tokens (written here as a plain loop), and tau=None keeps the uniform 1/L."""
    import math

    import fairseq_nat_ext  # noqa: F401
    from fairseq.models.nat.insertion_transformer import _get_ins_targets

    pad, unk, V = 1, 3, 12
    inp = torch.tensor([[0, 5, 2, pad], [0, 2, pad, pad]])
    out = torch.tensor([[0, 6, 5, 7, 8, 9, 2], [0, 10, 11, 2, pad, pad, pad]])
    spans = {(0, 0): [6], (0, 1): [7, 8, 9], (1, 0): [10, 11]}  # (row, slot) -> tokens to insert
    for tau in (1.0, 0.5, None):
        got = _get_ins_targets(inp, out, pad, unk, V, tau=tau)
        assert got.dtype == torch.float32
        for (b, slot), toks in spans.items():
            L = len(toks)
            if tau is None:
                w = [1 / L] * L
            else:
                raw = [math.exp(-abs(k - (L - 1) / 2) / tau) for k in range(L)]
                w = [r / sum(raw) for r in raw]
            expect = torch.zeros(V)
            for k, t in enumerate(toks):
                expect[t] += w[k]
            assert torch.allclose(got[b, slot], expect, atol=1e-6), (tau, b, slot)
        assert float(got[0, 2].sum()) == 0.0  # a complete slot has no insertion target
