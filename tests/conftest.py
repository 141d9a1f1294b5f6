import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN_DIR = os.path.join(ROOT, "fairseq_nat_ext")
SHARED_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")
VENV_BIN = os.path.dirname(sys.executable)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than ~20 s (run by make test, not test-fast)")


def cli_env():
    env = dict(os.environ)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env.setdefault("OMP_NUM_THREADS", "2")
    return env


def run_cli(args, cwd=None, check=True, timeout=600):
    """Run a console script of the venv (fairseq-train, ...) and return the CompletedProcess."""
    exe = shutil.which(args[0], path=VENV_BIN) or shutil.which(args[0])
    proc = subprocess.run([exe] + list(args[1:]), cwd=cwd, env=cli_env(), capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="session")
def shared_data():
    if not os.path.isdir(SHARED_DATA):
        pytest.skip("../shared/data is not present (fresh user clone)")
    return SHARED_DATA


def write_toy_corpus(path, n_train=400, n_valid=40, n_test=40, seed=0):
    """A word-substitution toy task: target word = source word upper-cased, lengths 3..8."""
    import random

    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(24)]
    os.makedirs(path, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        src, tgt = [], []
        for _ in range(n):
            words = [rng.choice(vocab) for _ in range(rng.randint(3, 8))]
            src.append(" ".join(words))
            tgt.append(" ".join(w.upper() for w in words))
        with open(os.path.join(path, f"{split}.src"), "w") as f:
            f.write("\n".join(src) + "\n")
        with open(os.path.join(path, f"{split}.tgt"), "w") as f:
            f.write("\n".join(tgt) + "\n")


@pytest.fixture(scope="session")
def toy_databin(tmp_path_factory):
    """A binarised toy corpus with a joined dictionary: (data_bin, raw_dir)."""
    root = tmp_path_factory.mktemp("toy")
    raw = str(root / "raw")
    write_toy_corpus(raw)
    out = str(root / "bin")
    run_cli(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
             "--trainpref", f"{raw}/train", "--validpref", f"{raw}/valid", "--testpref", f"{raw}/test",
             "--destdir", out, "--joined-dictionary", "--workers", "1"])
    return out, raw


def build_model_and_task(data_bin, arch_args):
    """Build a task + model in-process from fairseq-train style arguments."""
    import fairseq_nat_ext  # noqa: F401
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, [data_bin, "--task", "nat_translation", "--user-dir", PLUGIN_DIR] + arch_args
    )
    task = tasks.setup_task(args)
    model = task.build_model(args)
    return task, model, args


def train_then_generate(data_bin, save_dir, arch, criterion, gen_args, updates=4, max_tokens=800):
    """Tiny fairseq-train of a plugin NAT arch, then fairseq-generate on the test split; returns the
    generate process."""
    run_cli(["fairseq-train", data_bin, "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
             "--arch", arch, "--criterion", criterion, "--optimizer", "adam", "--lr", "1e-3",
             "--max-tokens", str(max_tokens), "--max-update", str(updates), "--save-dir", str(save_dir),
             "--no-epoch-checkpoints", "--num-workers", "0"])
    return run_cli(["fairseq-generate", data_bin, "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                    "--path", os.path.join(str(save_dir), "checkpoint_last.pt"),
                    "--max-tokens", str(max_tokens)] + list(gen_args))


@pytest.fixture(scope="session")
def tiny_checkpoints(toy_databin, tmp_path_factory):
    """arch name (a key of tests/reliability_utils.ARCHS) -> checkpoint_last.pt of a tiny model of that
    arch trained 2 updates on the toy corpus (trained in this process, on first use)."""
    from reliability_utils import train_args, train_inprocess

    root = tmp_path_factory.mktemp("tiny_ckpts")
    cache = {}

    def get(arch):
        if arch not in cache:
            train_inprocess(train_args(toy_databin[0], arch, root / arch, updates=2))
            cache[arch] = root / arch / "checkpoint_last.pt"
        return cache[arch]

    return get


def teacher_test_databin(tmp_path, line_ids):
    """Lines ``line_ids`` of Multi30K test_2016_flickr with the shared teacher's BPE and dictionary:
    writes raw.{en,de}, test.{en,de} (BPE) and data-bin/ under ``tmp_path`` -> the teacher's directory.
    Skips the test where ../shared or fastBPE is absent."""
    from pathlib import Path

    from fairseq_nat_ext.evaluation import scoring

    teacher, raw = Path(SHARED_DATA) / "multi30k-teacher", Path(SHARED_DATA) / "multi30k"
    if not (teacher / "teacher.pt").is_file() or not (raw / "test_2016_flickr.en.gz").is_file():
        pytest.skip("../shared (Multi30K teacher and data) is absent")
    fastBPE = pytest.importorskip("fastBPE")
    bpe = fastBPE.fastBPE(str(teacher / "bpe.codes"))
    for lang in ("en", "de"):
        lines = scoring.read_lines(raw / f"test_2016_flickr.{lang}.gz")
        lines = [lines[i] for i in line_ids]
        (tmp_path / f"raw.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
        bpe_lines = bpe.apply(scoring.tokenize(lines, lang))
        (tmp_path / f"test.{lang}").write_text("\n".join(bpe_lines) + "\n", encoding="utf-8")
    subprocess.run(
        [sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", "en", "--target-lang", "de",
         "--testpref", str(tmp_path / "test"), "--destdir", str(tmp_path / "data-bin"),
         "--srcdict", str(teacher / "dict.txt"), "--joined-dictionary", "--workers", "1"],
        check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="2"),
    )
    return teacher
