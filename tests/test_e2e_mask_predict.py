"""Tiny end-to-end runs through fairseq's own command-line tools with --user-dir."""
import os
import re

import pytest

from conftest import PLUGIN_DIR, run_cli

TRAIN = [
    "--user-dir", PLUGIN_DIR, "--task", "nat_translation", "--arch", "mask_predict_tiny",
    "--criterion", "mask_predict_loss", "--optimizer", "adam", "--lr", "1e-3",
    "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10", "--max-tokens", "1024",
    "--num-workers", "0", "--seed", "1", "--log-format", "simple", "--log-interval", "10",
    "--no-epoch-checkpoints",
]


@pytest.fixture(scope="module")
def trained(toy_databin, tmp_path_factory):
    save = str(tmp_path_factory.mktemp("mp_ckpt"))
    proc = run_cli(["fairseq-train", toy_databin[0], *TRAIN, "--max-update", "40", "--save-dir", save])
    assert "done training" in proc.stderr + proc.stdout
    return toy_databin[0], save


def _hyps(out):
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^H-(\d+)\t\S+\t(.*)$", out, re.M)}


def test_train_then_generate(trained):
    data, save = trained
    ckpt = os.path.join(save, "checkpoint_last.pt")
    proc = run_cli(["fairseq-generate", data, "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                    "--path", ckpt, "--gen-subset", "test", "--batch-size", "16",
                    "--iter-decode-max-iter", "4", "--iter-decode-with-beam", "3",
                    "--retain-iter-history"])
    hyps = _hyps(proc.stdout)
    assert sorted(hyps) == list(range(40)), "one hypothesis per test sentence"
    assert all(h.strip() for h in hyps.values())
    assert re.search(r"^E-0_0\t", proc.stdout, re.M), "the per-iteration trace is printed"
    assert "BLEU4" in proc.stdout


def test_ensemble_of_two_checkpoints(trained, tmp_path):
    data, save = trained
    a = os.path.join(save, "checkpoint_last.pt")
    proc = run_cli(["fairseq-generate", data, "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                    "--path", f"{a}:{a}", "--gen-subset", "test", "--batch-size", "16",
                    "--iter-decode-max-iter", "2"])
    single = run_cli(["fairseq-generate", data, "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                      "--path", a, "--gen-subset", "test", "--batch-size", "16",
                      "--iter-decode-max-iter", "2"])
    assert _hyps(proc.stdout) == _hyps(single.stdout), "a model ensembled with itself is itself"


def test_generate_keeps_every_sentence_with_odd_batch_sizes(trained):
    # fairseq drops the last batch when its size is not a multiple of 8 (fairseq issue #5036)
    data, save = trained
    proc = run_cli(["fairseq-generate", data, "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                    "--path", os.path.join(save, "checkpoint_last.pt"), "--gen-subset", "test",
                    "--batch-size", "7", "--iter-decode-max-iter", "1"])
    assert sorted(_hyps(proc.stdout)) == list(range(40))


def test_unknown_option_value_is_one_line_error(toy_databin):
    proc = run_cli(["fairseq-train", toy_databin[0], *TRAIN[:6], "--criterion", "no_such_loss"],
                   check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "--criterion" in last and "invalid choice" in last and "no_such_loss" in last


def test_collapse_repeats_option_through_fairseq_generate(trained):
    data, save = trained
    common = ["fairseq-generate", data, "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
              "--path", os.path.join(save, "checkpoint_last.pt"), "--gen-subset", "test",
              "--batch-size", "16", "--iter-decode-max-iter", "1"]
    plain = _hyps(run_cli(common).stdout)
    collapsed = _hyps(run_cli(common + ["--collapse-repeats"]).stdout)

    def slow(text):
        out = []
        for w in text.split():
            if not out or out[-1] != w:
                out.append(w)
        return " ".join(out)

    assert any(slow(h) != h for h in plain.values()), "a 40-update model repeats tokens"
    assert collapsed == {i: slow(h) for i, h in plain.items()}
