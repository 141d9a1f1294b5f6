"""iterative_refinement end to end: fairseq-train (with the denoising corruption on) and fairseq-generate
with adaptive refinement through fairseq's command-line tools."""
import os
import re

from conftest import PLUGIN_DIR, run_cli


def test_iterative_refinement_train_then_generate(toy_databin, tmp_path):
    data, save = toy_databin[0], str(tmp_path / "ckpt")
    train = run_cli(["fairseq-train", data, "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                     "--arch", "iterative_refinement_tiny", "--criterion", "iterative_refinement_loss",
                     "--train-refine-steps", "3", "--dae-ratio", "0.5", "--corrupt-replace", "0.1",
                     "--corrupt-repeat", "0.1", "--corrupt-swap", "0.1", "--optimizer", "adam", "--lr", "1e-3",
                     "--max-tokens", "800", "--max-update", "3", "--save-dir", save, "--no-epoch-checkpoints",
                     "--num-workers", "0", "--seed", "1", "--log-format", "simple", "--log-interval", "1"])
    log = train.stdout + train.stderr
    assert re.search(r"word_ins_2-loss[ =]", log), log[-2000:]  # one loss per training pass
    proc = run_cli(["fairseq-generate", data, "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                    "--path", os.path.join(save, "checkpoint_last.pt"), "--gen-subset", "test",
                    "--batch-size", "16", "--iter-decode-max-iter", "4", "--iter-decode-with-beam", "2",
                    "--retain-iter-history"])
    hyps = {int(m.group(1)) for m in re.finditer(r"^H-(\d+)\t", proc.stdout, re.M)}
    assert hyps == set(range(40))
    for i in range(40):  # one trace line per pass, at most --iter-decode-max-iter
        assert 1 <= len(re.findall(rf"^E-{i}_\d+\t", proc.stdout, re.M)) <= 4
    assert "BLEU4" in proc.stdout
