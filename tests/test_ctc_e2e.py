"""Tiny end-to-end runs of ctc_nat and imputer through fairseq's command-line tools (--user-dir)."""
import os
import re

import pytest

from conftest import PLUGIN_DIR, run_cli


def _train(data, save, arch, criterion, *extra, updates=4):
    return run_cli(["fairseq-train", data, "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                    "--arch", arch, "--criterion", criterion, "--optimizer", "adam", "--lr", "1e-3",
                    "--max-tokens", "800", "--max-update", str(updates), "--save-dir", save,
                    "--no-epoch-checkpoints", "--num-workers", "0", "--seed", "1",
                    "--log-format", "simple", "--log-interval", "1", *extra])


def _generate(data, ckpt, *extra):
    return run_cli(["fairseq-generate", data, "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                    "--path", ckpt, "--gen-subset", "test", "--batch-size", "16", *extra])


def _hyps(out):
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^H-(\d+)\t\S+\t(.*)$", out, re.M)}


@pytest.fixture(scope="module")
def ctc_ckpt(toy_databin, tmp_path_factory):
    save = str(tmp_path_factory.mktemp("ctc_ckpt"))
    proc = _train(toy_databin[0], save, "ctc_nat_tiny", "ctc_nat_loss")
    log = proc.stdout + proc.stderr
    # the counts are logged (summed) every interval; the toy targets always fit at ratio 2
    assert re.search(r"ctc_filtered=0\b", log) and re.search(r"ctc_pairs=\d+", log), log[-2000:]
    return os.path.join(save, "checkpoint_last.pt")


def test_ctc_train_then_generate_with_prefix_beam_search(toy_databin, ctc_ckpt):
    # (greedy decoding is tested in-process: tests/test_ctc_decoding.py, test_ctc_model.py)
    beam = _generate(toy_databin[0], ctc_ckpt, "--beam", "3", "--nbest", "2", "--retain-iter-history")
    assert sorted(_hyps(beam.stdout)) == list(range(40)), "hypotheses for every test sentence"
    assert len(re.findall(r"^H-0\t", beam.stdout, re.M)) == 2, "--nbest 2 prints two hypotheses"
    assert re.search(r"^E-0_0\t", beam.stdout, re.M), "the greedy alignment is printed as a trace"
    assert "BLEU4" in beam.stdout


def test_imputer_from_ctc_teacher_train_then_block_decode(toy_databin, ctc_ckpt, tmp_path):
    data, save = toy_databin[0], str(tmp_path / "imp")
    # initialised from the CTC checkpoint (same parameters) and learning its Viterbi alignments
    _train(data, save, "imputer_tiny", "imputer_loss", "--imputer-ctc-path", ctc_ckpt,
           "--finetune-from-model", ctc_ckpt, updates=3)
    proc = _generate(data, os.path.join(save, "checkpoint_last.pt"), "--iter-decode-max-iter", "4",
                     "--retain-iter-history")
    assert sorted(_hyps(proc.stdout)) == list(range(40))
    # block size 4: every sentence (alignment >= 8 positions) takes exactly 4 steps
    for i in range(40):
        assert len(re.findall(rf"^E-{i}_\d+\t", proc.stdout, re.M)) == 4
