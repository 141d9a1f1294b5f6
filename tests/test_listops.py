"""ListOps generator (LRA spec, brackets kept), task input checks, classifier end to end."""
import os
import random

import pytest

from conftest import PLUGIN_DIR, run_cli

import fairseq_nat_ext  # noqa: F401
from fairseq_nat_ext.data import listops


def eval_tokens(tokens):
    """Independent reference: evaluate the bracketed token string with an explicit stack."""
    stack = [[]]
    ops = []
    for tok in tokens:
        if tok.startswith("["):
            ops.append(tok[1:])
            stack.append([])
        elif tok == "]":
            args = sorted(stack.pop())
            op = ops.pop()
            if op == "MAX":
                v = args[-1]
            elif op == "MIN":
                v = args[0]
            elif op == "SM":
                v = sum(args) % 10
            else:  # median, truncated like int(np.median(...))
                n = len(args)
                v = args[n // 2] if n % 2 else int((args[n // 2 - 1] + args[n // 2]) / 2)
            stack[-1].append(v)
        else:
            stack[-1].append(int(tok))
    assert len(stack) == 1 and len(stack[0]) == 1
    return stack[0][0]


def test_labels_match_an_independent_stack_evaluator():
    rng = random.Random(0)
    for _ in range(300):
        tree, length = listops.generate_tree(rng)
        tokens = listops.to_tokens(tree)
        assert len(tokens) == length
        assert listops.evaluate(tree) == eval_tokens(tokens)


def test_generation_is_deterministic_in_range_and_distinct():
    a = list(listops.generate(60, 20, 80, seed=3))
    b = list(listops.generate(60, 20, 80, seed=3))
    seqs = [tuple(listops.to_tokens(t)) for t, _ in a]
    assert seqs == [tuple(listops.to_tokens(t)) for t, _ in b]
    assert len(set(seqs)) == 60
    assert all(20 <= len(s) <= 80 for s in seqs)
    assert {lab for _, lab in a} <= set(range(10))


def test_depth_and_arguments_follow_the_spec():
    def check(tree, depth=1):
        if isinstance(tree, int):
            return
        op, args = tree
        assert op in listops.OPERATORS and 2 <= len(args) <= listops.MAX_ARGS and depth < listops.MAX_DEPTH
        for a in args:
            check(a, depth + 1)

    rng = random.Random(1)
    for _ in range(500):
        check(listops.generate_tree(rng)[0])


def test_cli_writes_splits_and_no_brackets_ablation(tmp_path):
    listops.main(["--out", str(tmp_path / "b"), "--train", "20", "--valid", "5", "--test", "5",
                  "--min-length", "10", "--max-length", "60"])
    listops.main(["--out", str(tmp_path / "nb"), "--train", "20", "--valid", "5", "--test", "5",
                  "--min-length", "10", "--max-length", "60", "--no-brackets"])
    with_b = (tmp_path / "b" / "train.src").read_text().splitlines()
    without = (tmp_path / "nb" / "train.src").read_text().splitlines()
    assert len(with_b) == 20 and "]" in with_b[0]
    assert without[0] == " ".join(t.lstrip("[") for t in with_b[0].split() if t != "]")
    labels = (tmp_path / "b" / "train.label").read_text().split()
    assert [int(x) for x in labels] == [eval_tokens(line.split()) for line in with_b]


@pytest.fixture(scope="module")
def listops_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("listops")
    listops.main(["--out", str(out), "--train", "64", "--valid", "16", "--test", "16",
                  "--min-length", "10", "--max-length", "60", "--seed", "2"])
    return str(out)


@pytest.mark.parametrize("src,label,msg", [
    ("[MAX 1 2 ]\n\n", "2\n2\n", "train.src:2: empty line"),
    ("[MAX 1 2 ]\n[FOO 1 ]\n", "2\n1\n", "train.src:2: unknown token '[FOO'"),
    ("[MAX 1 2 ]\n", "12\n", "train.label:1: label '12' is not 0-9"),
    ("[MAX 1 2 ]\n[MIN 1 2 ]\n", "2\n", "has 2 lines but"),
    ("[MAX " + "1 " * 70 + "]\n", "1\n", "train.src:1: 73 tokens (with <s>) exceed --max-positions 64"),
])
def test_bad_input_is_a_one_line_error_naming_file_and_line(tmp_path, src, label, msg):
    (tmp_path / "train.src").write_text(src)
    (tmp_path / "train.label").write_text(label)
    (tmp_path / "valid.src").write_text("[MIN 3 4 ]\n")
    (tmp_path / "valid.label").write_text("3\n")
    proc = run_cli(["fairseq-train", str(tmp_path), "--user-dir", PLUGIN_DIR, "--task", "listops",
                    "--arch", "efficient_classifier", "--criterion", "classification_cross_entropy",
                    "--max-positions", "64", "--batch-size", "2", "--max-update", "1", "--optimizer", "adam",
                    "--lr", "1e-3", "--save-dir", str(tmp_path / "ck"), "--num-workers", "0"], check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: listops: ") and msg in last, last
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("attention", [["--encoder-attention-type", "full"],
                                       ["--encoder-attention-type", "mix", "--encoder-attention-mix",
                                        "local:2,linformer:1,bigbird:1", "--block-size", "8"]])
def test_train_then_validate_through_the_cli(listops_dir, tmp_path, attention):
    save = tmp_path / "ck"
    common = ["--user-dir", PLUGIN_DIR, "--task", "listops", "--criterion", "classification_cross_entropy",
              "--max-positions", "64", "--batch-size", "16", "--num-workers", "0"]
    run_cli(["fairseq-train", listops_dir, "--arch", "efficient_classifier", "--optimizer", "adam", "--lr", "1e-3",
             "--max-update", "4", "--save-dir", str(save), "--no-epoch-checkpoints", "--linformer-k", "16",
             "--attention-window", "4", "--pooling", "cls"] + common + attention)
    proc = run_cli(["fairseq-validate", listops_dir, "--path", str(save / "checkpoint_last.pt"),
                    "--valid-subset", "test"] + common)
    assert "accuracy" in proc.stdout + proc.stderr


def test_generator_module_runs_without_runpy_warning(tmp_path):
    """`python -m fairseq_nat_ext.data.listops` used to print runpy's RuntimeWarning (the package's listops
    task imported the module first); a RuntimeWarning is an error here."""
    import subprocess
    import sys

    from conftest import ROOT, cli_env

    proc = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "fairseq_nat_ext.data.listops",
                           "--out", str(tmp_path / "d"), "--train", "3", "--valid", "2", "--test", "2",
                           "--min-length", "5", "--max-length", "30"],
                          capture_output=True, text=True, cwd=ROOT, env=cli_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "RuntimeWarning" not in proc.stderr and (tmp_path / "d" / "test.label").exists()
