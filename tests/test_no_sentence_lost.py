"""No sentence is lost by batching (issue: fairseq's batch_by_size drops the last batch when its size is
not a multiple of --required-batch-size-multiple; fairseq issues #5036, #5351, #5094).

The plugin's ``keep_last_batch`` shim (fairseq_nat_ext/compat.py) keeps that tail as one last, smaller
batch.  Checked here: the batcher against fairseq's own (every batch the same, plus the tail), the
generation path (fairseq-generate's main() with the default multiple of 8) on splits of 1, 3 and 9
sentences, the validation path (task.get_batch_iterator with the multiple) on the same splits, and
the shared Multi30K teacher (fairseq's own ``translation`` task) on 3 and 461 sentences from the CLI.
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import PLUGIN_DIR, SHARED_DATA, cli_env
from reliability_utils import task_args

SIZES = (1, 3, 9)
#: decoding flags of the tiny untrained models (short outputs: decoding an untrained model is slow)
DECODE = ["--max-len-b", "12", "--beam", "1"]


def _hyp_ids(text):
    return sorted(int(m) for m in re.findall(r"^H-(\d+)\t", text, flags=re.M))


# ---- the batcher itself ----------------------------------------------------------------------------

@pytest.mark.parametrize("multiple", [1, 3, 8])
@pytest.mark.parametrize("max_tokens", [None, 40, 200])
def test_batch_by_size_keeps_the_tail_and_nothing_else_changes(multiple, max_tokens):
    import fairseq_nat_ext  # noqa: F401  (applies the shim)
    from fairseq.data import data_utils

    original = data_utils.batch_by_size.__wrapped__  # fairseq's own function
    rng = np.random.default_rng(multiple * 1000 + (max_tokens or 0))
    for n in (1, 3, 9, 50, 203):
        sizes = rng.integers(1, 12, size=n)
        indices = np.argsort(sizes, kind="stable").astype(np.int64)
        kwargs = dict(num_tokens_vec=sizes[indices], max_tokens=max_tokens,
                      max_sentences=None if max_tokens else 16, required_batch_size_multiple=multiple)
        ours = data_utils.batch_by_size(indices, lambda i: int(sizes[i]), **kwargs)
        theirs = original(indices, lambda i: int(sizes[i]), **kwargs)
        # every index once, in the order given
        assert np.concatenate(ours).tolist() == indices.tolist()
        # fairseq's batches are unchanged; at most one more (the tail fairseq dropped), smaller than N
        assert [b.tolist() for b in ours[: len(theirs)]] == [b.tolist() for b in theirs]
        assert len(ours) - len(theirs) in (0, 1)
        if len(ours) > len(theirs):
            assert 0 < len(ours[-1]) < multiple


def test_shim_is_listed_and_applied():
    from fairseq_nat_ext import compat

    assert "keep_last_batch" in compat.APPLIED
    assert {s.name for s in compat.SHIMS} >= {"keep_last_batch", "numpy_compat", "interactive_utf8"}


# ---- splits of 1, 3 and 9 sentences ------------------------------------------------------------------

@pytest.fixture(scope="module")
def sized_bin(toy_databin, tmp_path_factory):
    """The toy data-bin's dictionary with splits test (1 sentence), test1 (3) and test2 (9)."""
    from fairseq import options
    from fairseq_cli import preprocess

    data_bin, raw = toy_databin
    root = tmp_path_factory.mktemp("sized")
    prefixes = []
    for n in SIZES:
        for lang in ("src", "tgt"):
            with open(os.path.join(raw, f"test.{lang}"), encoding="utf-8") as f:
                (root / f"n{n}.{lang}").write_text("\n".join(f.read().splitlines()[:n]) + "\n", encoding="utf-8")
        prefixes.append(str(root / f"n{n}"))
    args = options.get_preprocessing_parser().parse_args([
        "--source-lang", "src", "--target-lang", "tgt", "--testpref", ",".join(prefixes), "--destdir",
        str(root / "bin"), "--joined-dictionary", "--srcdict", os.path.join(data_bin, "dict.src.txt"),
        "--workers", "1"])
    preprocess.main(args)
    return str(root / "bin")


def _subset(n):
    i = SIZES.index(n)
    return "test" if i == 0 else f"test{i}"


@pytest.mark.parametrize("arch", ["mask_predict", "efficient_transformer"])
@pytest.mark.parametrize("n", SIZES)
def test_generate_translates_every_sentence(arch, n, tiny_checkpoints, sized_bin, tmp_path):
    from fairseq import options
    from fairseq_cli import generate

    parser = options.get_generation_parser()
    args = options.parse_args_and_arch(parser, [
        sized_bin, "--user-dir", PLUGIN_DIR, *task_args(arch), "--path", str(tiny_checkpoints(arch)),
        "--gen-subset", _subset(n), "--max-tokens", "4000", "--required-batch-size-multiple", "8",
        "--results-path", str(tmp_path), *DECODE])
    generate.main(args)
    out = (tmp_path / f"generate-{_subset(n)}.txt").read_text()
    assert _hyp_ids(out) == list(range(n))


@pytest.mark.parametrize("task_name", ["translation", "nat_translation"])
def test_validation_batches_hold_every_sentence(task_name, sized_bin):
    """The validation loop's batches (fairseq_cli/train.py validate(): task.get_batch_iterator with
    --required-batch-size-multiple) hold every sentence of the split."""
    import fairseq_nat_ext  # noqa: F401
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        sized_bin, "--user-dir", PLUGIN_DIR, "--task", task_name, "--arch", "transformer",
        "-s", "src", "-t", "tgt"])
    task = tasks.setup_task(args)
    for n in SIZES:
        task.load_dataset(_subset(n))
        itr = task.get_batch_iterator(dataset=task.dataset(_subset(n)), max_tokens=4000,
                                      required_batch_size_multiple=8).next_epoch_itr(shuffle=False)
        ids = sorted(i for batch in itr for i in batch["id"].tolist())
        assert ids == list(range(n)), f"{task_name}: {len(ids)} of {n} sentences batched"


# ---- the shared Multi30K teacher (fairseq's own translation task) from the command line -------------

@pytest.mark.slow
def test_shared_teacher_generate_prints_every_hypothesis(tmp_path):
    teacher = os.path.join(SHARED_DATA, "multi30k-teacher")
    raw = os.path.join(SHARED_DATA, "multi30k")
    if not os.path.isfile(os.path.join(teacher, "teacher.pt")):
        pytest.skip("../shared (Multi30K teacher and data) is absent")
    fastBPE = pytest.importorskip("fastBPE")
    from fairseq_nat_ext.evaluation import scoring

    bpe = fastBPE.fastBPE(os.path.join(teacher, "bpe.codes"))
    prefixes = []
    for n in (3, 461):
        for lang in ("en", "de"):
            lines = scoring.read_lines(os.path.join(raw, f"test_2016_flickr.{lang}.gz"))[:n]
            (tmp_path / f"n{n}.{lang}").write_text(
                "\n".join(bpe.apply(scoring.tokenize(lines, lang))) + "\n", encoding="utf-8")
        prefixes.append(str(tmp_path / f"n{n}"))
    env = cli_env()
    subprocess.run([sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", "en", "--target-lang", "de",
                    "--testpref", ",".join(prefixes), "--destdir", str(tmp_path / "bin"),
                    "--srcdict", os.path.join(teacher, "dict.txt"), "--joined-dictionary", "--workers", "1"],
                   check=True, capture_output=True, env=env)
    for n, subset in ((3, "test"), (461, "test1")):
        proc = subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), "fairseq-generate"), str(tmp_path / "bin"),
             "--user-dir", PLUGIN_DIR, "--path", os.path.join(teacher, "teacher.pt"), "--gen-subset", subset,
             "--max-tokens", "4000", "--beam", "1", "--remove-bpe"],
            capture_output=True, text=True, env=env, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert _hyp_ids(proc.stdout) == list(range(n)), f"{len(_hyp_ids(proc.stdout))} of {n} hypotheses"
