"""Bad input, one test per case: each stops with ONE line naming the file/line/option, and nothing is
written half-way (no checkpoint, no output directory).

Most cases run fairseq-train's own main() in this process (``train_inprocess``): the error is a
``UserFacingError``, which the plugin's excepthook prints as ``error: <message>`` and nothing else;
the ``*_cli`` tests check that final form through the real command-line tools.
Not here yet (other branches): NaN/inf coordinates in pointer data, CTC upsampled length vs target.
"""
import os
import subprocess

import pytest

from conftest import PLUGIN_DIR, ROOT, cli_env, run_cli
from reliability_utils import ARCHS, files_in, one_error_line, train_args, train_inprocess

import fairseq_nat_ext  # noqa: F401
from fairseq_nat_ext.compat import InputError, UnsafeCheckpointError, UserFacingError


def binarise(raw_dir, out_dir, srcdict):
    """fairseq-preprocess (in this process) of RAW/{train,valid,test}.{src,tgt} with a given joined dict."""
    from fairseq import options
    from fairseq_cli import preprocess

    parser = options.get_preprocessing_parser()
    args = parser.parse_args(["--source-lang", "src", "--target-lang", "tgt", "--trainpref", f"{raw_dir}/train",
                              "--validpref", f"{raw_dir}/valid", "--testpref", f"{raw_dir}/test",
                              "--destdir", str(out_dir), "--joined-dictionary", "--srcdict", srcdict,
                              "--workers", "1"])
    preprocess.main(args)
    return str(out_dir)


def corpus_with(tmp_path, toy_databin, split, side, line_no, text=None, drop=False):
    """A copy of the toy corpus where line ``line_no`` of SPLIT.SIDE is replaced by ``text`` (or dropped),
    binarised with the toy dictionary -> (data_bin, raw_dir)."""
    _, raw = toy_databin
    new_raw = tmp_path / "raw"
    new_raw.mkdir()
    for name in os.listdir(raw):
        with open(os.path.join(raw, name), encoding="utf-8") as f:
            lines = f.read().splitlines()
        if name == f"{split}.{side}":
            if drop:
                del lines[line_no - 1]
            else:
                lines[line_no - 1] = text
        (new_raw / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return binarise(new_raw, tmp_path / "bin", os.path.join(toy_databin[0], "dict.src.txt")), str(new_raw)


def expect_train_error(argv, save_dir, *needles, exc=UserFacingError):
    with pytest.raises(exc) as err:
        train_inprocess(argv)
    msg = str(err.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    assert files_in(save_dir) == [], "nothing may be written"
    return msg


def _bash(script, *args):
    return subprocess.run(["bash", os.path.join(ROOT, "examples", script), *map(str, args)], cwd=ROOT,
                          env=cli_env(), capture_output=True, text=True, timeout=120)


def _raw_pair(tmp_path, src: bytes, tgt: bytes):
    raw = tmp_path / "raw_in"
    raw.mkdir()
    for split in ("train", "valid", "test"):
        (raw / f"{split}.src").write_bytes(src if split == "train" else b"a b\n")
        (raw / f"{split}.tgt").write_bytes(tgt if split == "train" else b"A B\n")
    return raw


# ---- parallel files with different line counts ------------------------------------------------

def test_different_line_counts_raw_text_stops_prepare_data_before_writing(tmp_path):
    raw = _raw_pair(tmp_path, b"a b\nc d\ne f\n", b"A B\nC D\n")
    out = tmp_path / "out"
    proc = _bash("prepare_data.sh", raw, "src", "tgt", out, "--workers", "1")
    assert proc.returncode == 1
    assert one_error_line(proc.stderr) == f"error: {raw}/train.src has 3 lines but {raw}/train.tgt has 2"
    assert not out.exists(), "prepare_data.sh must not create OUT_DIR before the input is validated"


def test_different_line_counts_binarised(tmp_path, toy_databin):
    data_bin, _ = corpus_with(tmp_path, toy_databin, "train", "tgt", 7, drop=True)
    save = tmp_path / "ck"
    expect_train_error(train_args(data_bin, "mask_predict", save), save,
                       f"{data_bin}/train.src-tgt.src and {data_bin}/train.src-tgt.tgt differ in number of sentences")


# ---- an empty line ---------------------------------------------------------------------------

def test_empty_line_raw_text_stops_prepare_data_before_writing(tmp_path):
    raw = _raw_pair(tmp_path, b"a b\nc d\n", b"A B\n\n")
    out = tmp_path / "out"
    proc = _bash("prepare_data.sh", raw, "src", "tgt", out, "--workers", "1")
    assert proc.returncode == 1
    assert one_error_line(proc.stderr) == f"error: {raw}/train.tgt line 2: empty line"
    assert not out.exists()


def test_empty_line_binarised_cli(tmp_path, toy_databin):
    """fairseq-preprocess accepts an empty line (it becomes a lone </s>); fairseq-train must not."""
    data_bin, _ = corpus_with(tmp_path, toy_databin, "train", "tgt", 3, text="")
    save = tmp_path / "ck"
    proc = run_cli(["fairseq-train", *train_args(data_bin, "mask_predict", save)], check=False)
    assert proc.returncode != 0
    assert one_error_line(proc.stderr) == (
        f"error: nat_translation: {data_bin}/train.src-tgt.tgt line 3: empty sentence")
    assert files_in(save) == []


# ---- a line of only unknown tokens -----------------------------------------------------------

@pytest.mark.parametrize("split", ["train", "valid"])
def test_line_of_only_unknown_tokens(tmp_path, toy_databin, split):
    data_bin, _ = corpus_with(tmp_path, toy_databin, split, "src", 2, text="zzz qqq xyz")
    save = tmp_path / "ck"
    argv = [a for a in train_args(data_bin, "mask_predict", save) if a != "--disable-validation"]
    expect_train_error(argv, save,
                       f"nat_translation: {data_bin}/{split}.src-tgt.src line 2: only unknown tokens (<unk>)",
                       "dict.")


# ---- a target longer than the model can produce -----------------------------------------------

@pytest.mark.parametrize("arch,flags,limit,option", [
    ("mask_predict", ["--length-classes", "6"], 6, "--length-classes 6"),
    ("levenshtein", ["--max-target-positions", "7"], 6, "--max-target-positions 7"),
    ("insertion", ["--max-target-positions", "7"], 6, "--max-target-positions 7"),
])
def test_target_longer_than_the_model_can_produce(tmp_path, toy_databin, arch, flags, limit, option):
    data_bin, raw = toy_databin
    save = tmp_path / "ck"
    msg = expect_train_error(train_args(data_bin, arch, save, *flags), save,
                             f"nat_translation: {data_bin}/train.src-tgt.tgt line ", option,
                             "--skip-invalid-size-train")
    line = int(msg.split(" line ")[1].split(":")[0])
    with open(os.path.join(raw, "train.tgt"), encoding="utf-8") as f:
        words = f.read().splitlines()[line - 1].split()
    assert len(words) + 1 > limit, "the named line is one that does not fit"
    assert f"target of {len(words) + 1} tokens" in msg


def test_skip_invalid_size_train_restores_fairseqs_skipping(tmp_path, toy_databin):
    save = tmp_path / "ck"
    train_inprocess(train_args(toy_databin[0], "mask_predict", save, "--length-classes", "6",
                               "--skip-invalid-size-train", updates=1))
    assert "checkpoint_last.pt" in files_in(save)


# ---- attention type and option combinations ---------------------------------------------------

def _listops_dir(tmp_path, src=b"[MAX 1 2 ]\n[MIN 3 4 ]\n" * 4, labels=b"2\n3\n" * 4):
    d = tmp_path / "listops"
    d.mkdir()
    (d / "train.src").write_bytes(src)
    (d / "train.label").write_bytes(labels)
    (d / "valid.src").write_bytes(b"[MIN 3 4 ]\n" * 8)  # a full batch: fairseq drops partial ones
    (d / "valid.label").write_bytes(b"3\n" * 8)
    return str(d)


def _listops_args(data, save, *extra):
    return [data, "--user-dir", PLUGIN_DIR, "--task", "listops", "--arch", "efficient_classifier",
            "--criterion", "classification_cross_entropy", "--max-positions", "64", "--batch-size", "8",
            "--max-update", "1", "--optimizer", "adam", "--lr", "1e-3", "--save-dir", str(save),
            "--num-workers", "0", "--encoder-layers", "1", "--encoder-embed-dim", "16",
            "--encoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", *extra]


@pytest.mark.parametrize("arch", sorted(ARCHS) + ["efficient_classifier"])
def test_unknown_attention_type(tmp_path, toy_databin, arch):
    save = tmp_path / "ck"
    bad = ["--encoder-attention-type", "sparse_magic"]
    if arch == "efficient_classifier":
        argv = _listops_args(_listops_dir(tmp_path), save, *bad)
    else:
        argv = train_args(toy_databin[0], arch, save, *bad)  # the last --encoder-attention-type wins
    expect_train_error(argv, save, "--encoder-attention-type", "unknown attention type 'sparse_magic'",
                       "known: ", exc=InputError)


@pytest.mark.parametrize("arch", ["mask_predict", "efficient_transformer"])
def test_linformer_with_inputs_longer_than_its_projection(tmp_path, toy_databin, arch):
    data_bin, raw = toy_databin
    save = tmp_path / "ck"
    argv = train_args(data_bin, arch, save, "--encoder-attention-type", "linformer", "--linformer-k", "4",
                      "--max-positions", "6")
    msg = expect_train_error(argv, save, f"nat_translation: {data_bin}/train.src-tgt.src line ",
                             "longer than the model accepts (6: --max-positions 6 of linformer attention)")
    line = int(msg.split(" line ")[1].split(":")[0])
    with open(os.path.join(raw, "train.src"), encoding="utf-8") as f:
        assert len(f.read().splitlines()[line - 1].split()) + 1 > 6


def test_attention_mix_that_cannot_work(tmp_path, toy_databin):
    save = tmp_path / "ck"
    argv = train_args(toy_databin[0], "mask_predict", save, "--encoder-attention-type", "mix",
                      "--encoder-attention-mix", "local:1,linear:2")
    expect_train_error(argv, save, "--encoder-attention-mix local:1,linear:2 assigns 3 heads but the layer has 2",
                       exc=InputError)


# ---- a checkpoint of another arch -------------------------------------------------------------

def test_resuming_into_a_save_dir_of_another_arch(tmp_path, toy_databin):
    save = tmp_path / "ck"
    train_inprocess(train_args(toy_databin[0], "levenshtein", save, updates=1))
    before = {n: (save / n).read_bytes() for n in files_in(save)}
    with pytest.raises(InputError) as err:
        train_inprocess(train_args(toy_databin[0], "mask_predict", save, updates=2))
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"checkpoint {save}/checkpoint_last.pt holds a 'levenshtein_tiny' model "
                          "(task nat_translation) whose parameters do not fit the 'mask_predict_tiny' model"), msg
    assert "parameters (e.g." in msg or "has shape" in msg
    assert {n: (save / n).read_bytes() for n in files_in(save)} == before, "the checkpoint is left as it was"


def test_generate_with_a_checkpoint_of_another_arch(tmp_path, toy_databin):
    """fairseq-generate's main() with --path of a ListOps classifier (the one-line CLI form of an
    InputError from --path: tests/test_compat.py::test_cli_refuses_evil_checkpoint_in_one_line)."""
    from fairseq import options
    from fairseq_cli import generate

    save = tmp_path / "cls"
    train_inprocess(_listops_args(_listops_dir(tmp_path), save, "--no-epoch-checkpoints"))
    ckpt = save / "checkpoint_last.pt"
    args = options.parse_args_and_arch(options.get_generation_parser(), [
        toy_databin[0], "--user-dir", PLUGIN_DIR, "--task", "nat_translation", "--path", str(ckpt),
        "--max-tokens", "400", "--results-path", str(tmp_path / "out")])
    with pytest.raises(InputError) as err:
        generate.main(args)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(
        f"--path {ckpt} holds a 'efficient_classifier' model (task listops), which cannot be loaded for task "
        "nat_translation"), msg
    assert not os.path.exists(tmp_path / "out" / "generate-test.txt") or \
        "H-" not in (tmp_path / "out" / "generate-test.txt").read_text()


# ---- a corrupted or truncated checkpoint ------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_checkpoint(tiny_checkpoints):
    return tiny_checkpoints("mask_predict").parent


@pytest.mark.parametrize("damage", ["truncated", "bytes_flipped", "garbage"])
def test_corrupted_or_truncated_checkpoint(tmp_path, tiny_checkpoint, damage):
    from fairseq import checkpoint_utils

    data = (tiny_checkpoint / "checkpoint_last.pt").read_bytes()
    if damage == "truncated":
        data = data[: len(data) * 2 // 3]
    elif damage == "bytes_flipped":  # inside a tensor: torch alone would load wrong weights silently
        data = data[: len(data) // 2] + bytes(b ^ 0xFF for b in data[len(data) // 2: len(data) // 2 + 32]) \
            + data[len(data) // 2 + 32:]
    else:
        data = b"not a checkpoint at all\n" * 10
    path = tmp_path / "checkpoint_last.pt"
    path.write_bytes(data)
    with pytest.raises(UnsafeCheckpointError) as err:
        checkpoint_utils.load_model_ensemble([str(path)])
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"cannot read checkpoint {path}: it is truncated or corrupted")
    assert "checkpoint_resume.py" in msg, "checkpoint_last.pt errors say how to resume"


def test_training_does_not_start_from_a_truncated_checkpoint_last(tmp_path, tiny_checkpoint, toy_databin):
    save = tmp_path / "ck"
    save.mkdir()
    data = (tiny_checkpoint / "checkpoint_last.pt").read_bytes()
    (save / "checkpoint_last.pt").write_bytes(data[: len(data) // 3])
    with pytest.raises(UnsafeCheckpointError) as err:
        train_inprocess(train_args(toy_databin[0], "mask_predict", save, updates=3))
    assert str(err.value).startswith(f"cannot read checkpoint {save}/checkpoint_last.pt: it is truncated")
    assert files_in(save) == ["checkpoint_last.pt"]


# ---- non-UTF-8 bytes in input text ------------------------------------------------------------

def test_non_utf8_raw_text_stops_prepare_data_before_writing(tmp_path):
    raw = _raw_pair(tmp_path, b"a b\nc \xff d\n", b"A B\nC D\n")
    out = tmp_path / "out"
    proc = _bash("prepare_data.sh", raw, "src", "tgt", out, "--workers", "1")
    assert proc.returncode == 1
    assert one_error_line(proc.stderr) == f"error: {raw}/train.src line 2: not valid UTF-8"
    assert not out.exists()


def test_non_utf8_listops_input(tmp_path):
    data = _listops_dir(tmp_path, src=b"[MAX 1 2 ]\n[MIN 3 \xe9 ]\n")
    save = tmp_path / "ck"
    expect_train_error(_listops_args(data, save), save, f"listops: {data}/train.src:2: not valid UTF-8 (byte 0xe9",
                       exc=InputError)


def test_non_utf8_on_interactive_stdin_cli(tiny_checkpoint, toy_databin):
    """The first line is translated (stdin is streamed), the bad one stops with one line."""
    exe = os.path.join(os.path.dirname(os.path.abspath(__import__("sys").executable)), "fairseq-interactive")
    proc = subprocess.run([exe, toy_databin[0], "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                           "--path", str(tiny_checkpoint / "checkpoint_last.pt"), "--iter-decode-max-iter", "1"],
                          input=b"w1 w2 w3\nw4 \xff w5\nw6\n", capture_output=True, env=cli_env(), timeout=300)
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode != 0
    assert one_error_line(stderr) == "error: fairseq-interactive: <stdin> line 2: not valid UTF-8 (byte 0xff at byte 4)"
    out = proc.stdout.decode()
    assert "H-0\t" in out and "H-1\t" not in out and "H-2\t" not in out

