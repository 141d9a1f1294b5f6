"""The NAT training recipes (examples/train_*.sh, sharing examples/lib/train_nat.sh) run on a tiny
corpus with tiny sizes, print the checkpoint they made, and a rerun resumes instead of restarting."""
import os
import subprocess

import pytest

from conftest import ROOT, cli_env

RECIPES = [
    ("train_mask_predict.sh", {}),
    ("train_mask_predict.sh", {"IMPL": "fairseq"}),
    ("train_levenshtein.sh", {}),
    ("train_levenshtein.sh", {"IMPL": "fairseq"}),
    ("train_insertion.sh", {"LOSS": "uniform"}),
    ("train_insertion.sh", {"IMPL": "fairseq"}),
    ("train_kermit.sh", {"SRC": "src", "TGT": "tgt"}),
    ("train_ctc.sh", {}),
    ("train_ctc.sh", {"GLAT": "0.5-0.3"}),
    ("train_imputer.sh", {}),
    ("train_fertility.sh", {"FERTILITY": "aligner", "MAX_FERTILITY": "8"}),
    ("train_fertility.sh", {"IMPL": "fairseq"}),
    ("train_refinement.sh", {"STEPS": "2"}),
    ("train_refinement.sh", {"IMPL": "fairseq", "STEPS": "2"}),
    ("train_da_transformer.sh", {}),
    ("train_glat.sh", {}),
]


@pytest.mark.slow
@pytest.mark.parametrize("recipe,env", RECIPES, ids=[r + "-" + "-".join(e.values()) for r, e in RECIPES])
def test_recipe_trains_and_resumes(toy_databin, tmp_path, recipe, env):
    data_bin, _ = toy_databin
    save = tmp_path / "run"
    e = cli_env()
    e.update(env, LAYERS="1", DIM="32", FFN="64", HEADS="2", MAX_TOKENS="600", MAX_UPDATE="2", AVG="0",
             WARMUP="1", SAVE_INTERVAL_UPDATES="1", THREADS="1")
    cmd = ["bash", os.path.join(ROOT, "examples", recipe), data_bin, str(save)]
    if recipe != "train_kermit.sh":
        cmd += ["-s", "src", "-t", "tgt"]
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == str(save / "checkpoint_last.pt")
    assert (save / "checkpoint_last.pt").exists()
    e["MAX_UPDATE"] = "3"
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    log = (save / "train.log").read_text()
    assert "Loaded checkpoint" in log and "num_updates 3" in log.replace("num_updates=", "num_updates ")
    if recipe == "train_insertion.sh" and env.get("IMPL") == "fairseq":
        # the recipe's default LOSS=binary_tree reaches fairseq's insertion_transformer as --label-tau
        assert "label_tau=1.0" in log and "label_tau=None" not in log, log[:3000]


@pytest.mark.parametrize("recipe", sorted({r for r, _ in RECIPES} | {"fertility.sh", "train_teacher.sh",
                                                                   "prepare_data.sh", "distill.sh"}))
def test_usage_is_the_whole_header_comment_and_no_code(recipe):
    """Without arguments a recipe prints its header comment (every line of it, nothing after it)."""
    path = os.path.join(ROOT, "examples", recipe)
    with open(path) as f:
        lines = f.read().splitlines()[1:]
    header = []
    for line in lines:
        if not line.startswith("#"):
            break
        header.append(line[2:] if line.startswith("# ") else line[1:])
    p = subprocess.run(["bash", path], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.splitlines()[:len(header)] == header
    assert "set -euo" not in p.stderr


def test_fairseq_insertion_with_an_unknown_loss_is_a_one_line_error(tmp_path):
    """fairseq's insertion_transformer has two slot losses (--label-tau set or unset): another LOSS is an
    error naming the option, before anything trains."""
    e = cli_env()
    e.update(IMPL="fairseq", LOSS="binarytree")
    p = subprocess.run(["bash", os.path.join(ROOT, "examples", "train_insertion.sh"), str(tmp_path / "bin"),
                        str(tmp_path / "run")], env=e, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert p.stderr.strip() == "error: LOSS must be 'binary_tree' or 'uniform', got 'binarytree'"
    assert not (tmp_path / "run").exists()
