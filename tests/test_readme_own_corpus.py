"""README's "your own corpus" commands run as written (tiny budgets), so the README cannot drift from the
recipes.

The block between ``<!-- own-corpus:begin -->`` and ``<!-- own-corpus:end -->`` is read from README.md and
each command is run in a temporary directory that links the repository's ``examples/`` and
``fairseq_nat_ext/`` (the commands are written relative to the repository root).  Budgets come from the
recipes' environment variables (LAYERS, DIM, MAX_UPDATE, ...); where a recipe takes its size from options
only, the options in EXTRA_ARGS are appended to that command (a corpus of 200 sentences; a 1-beam
distillation capped at source length + 2 that keeps every pair: an 8-update teacher loops).
"""
import os
import re
import shlex
import subprocess

import pytest

from conftest import ROOT, cli_env

BEGIN, END = "<!-- own-corpus:begin -->", "<!-- own-corpus:end -->"
#: the recipes' environment for tiny runs
ENV = {"LAYERS": "1", "DIM": "32", "HEADS": "2", "MAX_UPDATE": "8", "WARMUP": "4", "MAX_TOKENS": "2048",
       "SAVE_INTERVAL_UPDATES": "4", "AVG": "2", "VALIDATE_INTERVAL": "100", "THREADS": "2"}
#: command (script or module) -> options appended (what the recipe has no environment variable for)
EXTRA_ARGS = {
    "fairseq_nat_ext.data.synthetic_corpus": ["--train", "200", "--valid", "20", "--test", "20"],
    "examples/distill.sh": ["--beam", "1", "--max-repeat", "0", "--max-len", "off", "--",
                            "--max-len-a", "1", "--max-len-b", "2"],
    "examples/translate.sh": ["--iter", "2", "--len-beam", "2"],
}
SCORE_LINE = re.compile(r"^BLEU\|nrefs:1\|.*\|version:[0-9.]+ = \d+\.\d+ ")


def readme_commands():
    path = os.path.join(ROOT, "README.md")
    text = open(path, encoding="utf-8").read() if os.path.isfile(path) else ""
    if BEGIN not in text or END not in text:
        pytest.skip(f"README.md has no {BEGIN} ... {END} block")
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    lines = [line for line in block.splitlines() if line.strip() and not line.strip().startswith("```")]
    return [shlex.split(line, comments=True) for line in lines]


def _key(argv):
    return argv[2] if argv[:2] == ["python", "-m"] else argv[0]


def test_readme_block_is_the_own_corpus_sequence():
    cmds = readme_commands()
    keys = [_key(c) for c in cmds]
    assert keys == ["fairseq_nat_ext.data.synthetic_corpus", "examples/prepare_data.sh", "examples/train_teacher.sh",
                    "examples/distill.sh", "examples/train_mask_predict.sh", "examples/translate.sh"], keys
    for argv in cmds:  # every path the README names is the repository's
        if argv[0].startswith("examples/"):
            assert os.path.isfile(os.path.join(ROOT, argv[0])), argv[0]


@pytest.mark.slow
def test_readme_own_corpus_commands_run(tmp_path):
    cmds = readme_commands()
    for name in ("examples", "fairseq_nat_ext"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    env = cli_env()
    env.update(ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    proc = None
    for argv in cmds:
        argv = argv + EXTRA_ARGS.get(_key(argv), [])
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{shlex.join(argv)} failed:\n{proc.stderr[-3000:]}"
    # the last command: translate.sh DATA_BIN CKPT SPLIT
    data_bin, ckpt, split = cmds[-1][1:4]
    score = [line for line in proc.stdout.splitlines() if SCORE_LINE.match(line)]
    assert len(score) == 1, proc.stdout + proc.stderr[-2000:]
    hyp_file = tmp_path / (ckpt[:-3] + f".{split}.tgt")
    raw_test = tmp_path / cmds[0][-1] / f"{split}.tgt"  # synthetic_corpus's output directory
    n_test = len(raw_test.read_text().splitlines())
    assert f"wrote {n_test} hypotheses" in proc.stderr
    assert len(hyp_file.read_text().splitlines()) == n_test
