"""Data recipes: validate_parallel, prepare_data.sh, checkpoint averaging, distill.sh."""
import gzip
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, cli_env
from fairseq_nat_ext import checkpoint_average as ca
from fairseq_nat_ext.data import distill_utils, synthetic_corpus
from fairseq_nat_ext.data.validate_parallel import main as validate_main
from fairseq_nat_ext.data.validate_parallel import validate_parallel

EXAMPLES = os.path.join(ROOT, "examples")


def _bash(script, *args, env_extra=None, timeout=600):
    env = cli_env()
    env.update(env_extra or {})
    return subprocess.run(["bash", os.path.join(EXAMPLES, script), *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _write(path, data: bytes, gz=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(data)
    return str(path)


def _error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("error:")]


# ---- validate_parallel ----------------------------------------------------------------

@pytest.mark.parametrize(
    "src, tgt, gz, expected",
    [
        (b"a\nb\nc\n", b"x\ny\n", False, "error: {s} has 3 lines but {t} has 2"),
        (b"a\nb\n", b"x\ny\nz", True, "error: {s} has 2 lines but {t} has 3"),
        (b"a\nb\nc\n", b"x\n \nz\n", False, "error: {t} line 2: empty line"),
        (b"a\nb\nc\n", b"x\ny\n\n", True, "error: {t} line 3: empty line"),
        (b"a\n\xff\xfeb\n", b"x\ny\n", False, "error: {s} line 2: not valid UTF-8"),
        (b"a\nb\rc\n", b"x\ny\n", False, "error: {s} line 2: carriage return inside the line"),
        (b"", b"", False, "error: {s} and {t} are empty"),
    ],
)
def test_validate_parallel_errors_are_one_line(tmp_path, capsys, src, tgt, gz, expected):
    s = _write(tmp_path / "train.en", src)
    t = _write(tmp_path / ("train.de.gz" if gz else "train.de"), tgt, gz=gz)
    expected = expected.format(s=s, t=t)
    assert validate_main([s, t]) == 1
    assert capsys.readouterr().err == expected + "\n"
    with pytest.raises(ValueError) as exc:
        validate_parallel(s, t)
    assert "error: " + str(exc.value) == expected


def test_validate_parallel_accepts_good_pairs(tmp_path, capsys):
    s = _write(tmp_path / "a.en", "ein Bär\nzwei\r\n".encode())  # UTF-8, CRLF line end
    t = _write(tmp_path / "a.de.gz", b"one bear\ntwo", gz=True)  # no final newline
    assert validate_parallel(s, t) == 2
    assert validate_main([s, t]) == 0
    assert capsys.readouterr().err == ""
    assert validate_main([s, str(tmp_path / "missing.de")]) == 1
    assert capsys.readouterr().err == f"error: {tmp_path}/missing.de: no such file\n"


def test_validate_parallel_cli(tmp_path):
    # run as a plain script, as prepare_data.sh does (python -m would first import the package,
    # i.e. fairseq, whose import logs an INFO line to stderr)
    s = _write(tmp_path / "x.en", b"a\nb\n")
    t = _write(tmp_path / "x.de", b"a\n")
    cmd = [sys.executable, os.path.join(ROOT, "fairseq_nat_ext", "data", "validate_parallel.py")]
    proc = subprocess.run(cmd + [s, t], cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == f"error: {s} has 2 lines but {t} has 1\n"
    proc = subprocess.run(cmd + [s, s], cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == proc.stderr == ""


# ---- prepare_data.sh ------------------------------------------------------------------

@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("prep")
    raw = root / "raw"
    corpus = synthetic_corpus.generate_corpus(seed=1, sizes={"train": 300, "valid": 40, "test": 40})
    synthetic_corpus.write_corpus(str(raw), corpus)
    out = root / "out"
    proc = _bash("prepare_data.sh", raw, "src", "tgt", out, "--bpe-merges", "100", "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return raw, out, proc


def _decode(data_bin, split, lang, pair="src-tgt"):
    from fairseq.data import Dictionary, data_utils

    d = Dictionary.load(os.path.join(data_bin, f"dict.{lang}.txt"))
    ds = data_utils.load_indexed_dataset(os.path.join(data_bin, f"{split}.{pair}.{lang}"), d)
    return [d.string(ds[i]) for i in range(len(ds))]


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def test_prepare_data_end_to_end(prepared):
    raw, out, proc = prepared
    bin_dir = out / "data-bin"
    for split in ("train", "valid", "test"):
        for lang in ("src", "tgt"):
            assert (bin_dir / f"{split}.src-tgt.{lang}.bin").is_file()
            assert (out / "raw" / f"{split}.{lang}").read_bytes() == (raw / f"{split}.{lang}").read_bytes()
            assert len(_lines(out / "tok" / f"{split}.{lang}")) == len(_lines(raw / f"{split}.{lang}"))
    # joined dictionary, BPE learnt with the requested merges
    assert (bin_dir / "dict.src.txt").read_text() == (bin_dir / "dict.tgt.txt").read_text()
    assert len(_lines(out / "bpe.codes")) == 100
    # the binarised text is the BPE text; removing BPE gives back the raw (already tokenised) corpus
    assert _decode(str(bin_dir), "valid", "tgt") == _lines(out / "bpe" / "valid.tgt")
    unbpe = [line.replace("@@ ", "") for line in _lines(out / "bpe" / "test.tgt")]
    assert unbpe == _lines(raw / "test.tgt")
    assert "raw reference" in proc.stderr


def test_prepare_data_rerun_is_cheap_and_codes_reusable(prepared, tmp_path):
    raw, out, _ = prepared
    before = (out / "data-bin" / "train.src-tgt.tgt.bin").stat().st_mtime_ns
    proc = _bash("prepare_data.sh", raw, "src", "tgt", out, "--bpe-merges", "100", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    assert "up to date" in proc.stderr and "tokenising" not in proc.stderr.lower()
    assert (out / "data-bin" / "train.src-tgt.tgt.bin").stat().st_mtime_ns == before


def test_prepare_data_with_more_merges_than_the_corpus_allows(tmp_path):
    # fastBPE pads the codes with zero-count merges its own applybpe rejects; we drop them
    raw = tmp_path / "raw"
    corpus = synthetic_corpus.generate_corpus(seed=2, sizes={"train": 100, "valid": 10, "test": 10})
    synthetic_corpus.write_corpus(str(raw), corpus)
    proc = _bash("prepare_data.sh", raw, "src", "tgt", tmp_path / "out", "--bpe-merges", "100000",
                 "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = _lines(tmp_path / "out" / "bpe.codes")
    assert 0 < len(codes) < 100000 and all(int(c.split()[2]) > 0 for c in codes)
    assert "allows only" in proc.stderr


def test_prepare_data_fails_fast_with_validator_line(tmp_path):
    # Multi30K file names (val, test_2016_flickr, .gz) are found without --splits
    raw = tmp_path / "m30k"
    for name, text in [("train.en", b"a b\nc d\n"), ("train.de", b"x y\nz w\n"), ("val.en", b"a\nb\n"),
                       ("val.de", b"x\n\n"), ("test_2016_flickr.en", b"a\n"), ("test_2016_flickr.de", b"x\n")]:
        _write(raw / (name + ".gz"), text, gz=True)
    proc = _bash("prepare_data.sh", raw, "en", "de", tmp_path / "out", "--workers", "1")
    assert proc.returncode == 1
    assert _error_lines(proc.stderr) == [f"error: {raw}/val.de.gz line 2: empty line"]
    assert "valid=val test=test_2016_flickr" in proc.stderr
    proc = _bash("prepare_data.sh", tmp_path / "nowhere", "en", "de", tmp_path / "out")
    assert proc.returncode == 1 and len(_error_lines(proc.stderr)) == 1


# ---- checkpoint averaging --------------------------------------------------------------

def _fake_checkpoint(path, seed, updates):
    g = torch.Generator().manual_seed(seed)
    state = {
        "model": {
            "w": torch.randn(3, 4, generator=g),
            "b": torch.randn(4, generator=g).half(),
            "version": torch.tensor([seed]),
        },
        "args": None,
        "cfg": {"common": {"seed": seed}},
        "optimizer_history": [{"criterion_name": "c", "optimizer_name": "o",
                               "lr_scheduler_state": {"best": 1.0}, "num_updates": updates}],
        "extra_state": {"train_iterator": {"epoch": 1}, "marker": seed},
        "last_optimizer_state": {"state": {}},
    }
    torch.save(state, path)
    return state


def test_checkpoint_average_matches_manual_mean(tmp_path, capsys):
    save = tmp_path / "ckpts"
    save.mkdir()
    states = {}
    for epoch in (1, 2, 9, 10):  # numeric, not lexical, order: the last two are 9 and 10
        states[epoch] = _fake_checkpoint(save / f"checkpoint{epoch}.pt", epoch, epoch * 10)
    _fake_checkpoint(save / "checkpoint_best.pt", 99, 0)
    _fake_checkpoint(save / "checkpoint_last.pt", 98, 0)
    out = tmp_path / "avg.pt"
    assert ca.main([str(save), "2", str(out)]) == 0
    avg = torch.load(out)  # the safe (weights_only) loader: averaging writes no foreign objects
    a, b = states[9]["model"], states[10]["model"]
    assert torch.allclose(avg["model"]["w"], (a["w"] + b["w"]) / 2, atol=1e-6)
    assert avg["model"]["b"].dtype == torch.float16
    assert torch.allclose(avg["model"]["b"].float(), (a["b"].float() + b["b"].float()) / 2, atol=1e-3)
    assert torch.equal(avg["model"]["version"], b["version"])  # non-float: newest checkpoint
    assert avg["extra_state"]["marker"] == 10 and avg["cfg"]["common"]["seed"] == 10
    assert avg["last_optimizer_state"] is None
    assert avg["extra_state"]["averaged_checkpoints"] == ["checkpoint9.pt", "checkpoint10.pt"]
    # fewer than N: one line, exit 1
    capsys.readouterr()
    assert ca.main([str(save), "5", str(tmp_path / "x.pt")]) == 1
    err = capsys.readouterr().err
    assert err == (f"error: {save} has 4 auto checkpoints (checkpointE.pt or checkpoint_E_U.pt), "
                   "fewer than the 5 asked for\n")
    assert not (tmp_path / "x.pt").exists()


def test_checkpoint_average_merges_epoch_and_update_checkpoints(tmp_path):
    # fairseq writes checkpoint2.pt instead of checkpoint_2_200.pt when update 200 ends epoch 2
    for name, seed, upd in [("checkpoint_1_100.pt", 1, 100), ("checkpoint2.pt", 2, 200),
                            ("checkpoint_3_300.pt", 3, 300), ("checkpoint1.pt", 4, 150)]:
        _fake_checkpoint(tmp_path / name, seed, upd)
    assert [os.path.basename(p) for p in ca.last_checkpoints(str(tmp_path), 3)] == [
        "checkpoint1.pt", "checkpoint2.pt", "checkpoint_3_300.pt"]


def test_checkpoint_average_orders_by_updates(tmp_path):
    for name, seed, upd in [("checkpoint3.pt", 1, 700), ("checkpoint_2_900.pt", 2, 900),
                            ("checkpoint_3_1000.pt", 3, 1000), ("checkpoint_1_80.pt", 4, 80)]:
        _fake_checkpoint(tmp_path / name, seed, upd)
    assert [os.path.basename(p) for p in ca.last_checkpoints(str(tmp_path), 2)] == [
        "checkpoint_2_900.pt", "checkpoint_3_1000.pt"]
    assert [os.path.basename(p) for p in ca.last_checkpoints(str(tmp_path), 1, kind="epoch")] == [
        "checkpoint3.pt"]


def test_checkpoint_average_rejects_mismatched_params(tmp_path):
    s1 = _fake_checkpoint(tmp_path / "checkpoint1.pt", 1, 1)
    s1["model"]["w"] = torch.zeros(2, 2)
    torch.save(s1, tmp_path / "checkpoint1.pt")
    _fake_checkpoint(tmp_path / "checkpoint2.pt", 2, 2)
    with pytest.raises(ValueError, match="w has shape"):
        ca.average_checkpoints(ca.last_checkpoints(str(tmp_path), 2))


def test_average_checkpoints_sh(tmp_path):
    _fake_checkpoint(tmp_path / "checkpoint1.pt", 1, 1)
    _fake_checkpoint(tmp_path / "checkpoint2.pt", 2, 2)
    proc = _bash("average_checkpoints.sh", tmp_path, 2, tmp_path / "avg.pt")
    assert proc.returncode == 0, proc.stderr
    assert "averaged 2 checkpoints (checkpoint1.pt, checkpoint2.pt)" in proc.stderr
    assert (tmp_path / "avg.pt").is_file()


# ---- distillation ----------------------------------------------------------------------

def test_collect_hypotheses_restores_order():
    gen = ["S-1\tb", "H-1\t-0.1\tsecond", "P-1\t-0.1", "H-0\t-0.2\tfirst  ", "H-0\t-0.9\tfirst nbest 2",
           "H-2\t-0.3\t"]
    assert distill_utils.collect_hypotheses(gen, 3) == ["first", "second", ""]
    with pytest.raises(ValueError, match="1 of 4 sentences have no hypothesis .first missing id 3"):
        distill_utils.collect_hypotheses(gen, 4)
    with pytest.raises(ValueError, match="outside"):
        distill_utils.collect_hypotheses(gen, 2)


def test_distill_with_given_distilled_file(prepared, tmp_path):
    _, out, _ = prepared
    data_bin = out / "data-bin"
    # a "teacher output": the reference with the last two BPE tokens of each line dropped
    distilled = [" ".join(line.split()[:-2]) for line in _lines(out / "bpe" / "train.tgt")]
    gz = _write(tmp_path / "train.distill.tgt.bpe.gz", ("\n".join(distilled) + "\n").encode(), gz=True)
    kd = tmp_path / "kd"
    proc = _bash("distill.sh", data_bin, "-", kd, "--distilled", gz, "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _lines(kd / "train.distill.tgt") == distilled
    kd_bin = kd / "data-bin"
    assert _decode(str(kd_bin), "train", "tgt") == distilled
    for name in os.listdir(data_bin):
        if name.startswith(("valid.", "test.", "dict.", "train.src-tgt.src.")):
            assert (kd_bin / name).read_bytes() == (data_bin / name).read_bytes(), name
    assert "train.src-tgt.tgt.bin" in os.listdir(kd_bin)
    # a distilled file whose line count differs from the source: one-line error
    bad = _write(tmp_path / "bad.txt", ("\n".join(distilled[:-1]) + "\n").encode())
    proc = _bash("distill.sh", data_bin, "-", tmp_path / "kd_bad", "--distilled", bad)
    assert proc.returncode == 1
    assert _error_lines(proc.stderr) == [f"error: {bad} has 299 lines but the source side has 300"]


def test_distill_drops_degenerate_teacher_outputs(prepared, tmp_path):
    """A looping line and an over-long line leave the binarised train split (both sides, order kept);
    the text file keeps every line; the filter's count reaches DISTILL_INFO.txt; --max-repeat 0
    --max-len off keeps everything."""
    _, out, _ = prepared
    data_bin = out / "data-bin"
    refs = _lines(out / "bpe" / "train.tgt")
    srcs = _decode(str(data_bin), "train", "src")
    distilled = list(refs)
    x, y = refs[3].split()[:2]  # tokens of the dictionary
    distilled[3] = " ".join([x, y, y, y] + refs[3].split()[2:])  # y 3 times in a row: looping
    distilled[7] = " ".join([x] * 2 + [y, x] * (len(srcs[7].split()) + 6))  # runs of 2, > 2 * source + 10
    gz = _write(tmp_path / "kd.txt.gz", ("\n".join(distilled) + "\n").encode(), gz=True)
    kd = tmp_path / "kd"
    proc = _bash("distill.sh", data_bin, "-", kd, "--distilled", gz, "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _lines(kd / "train.distill.tgt") == distilled
    keep = [i for i in range(len(refs)) if i not in (3, 7)]
    assert _decode(str(kd / "data-bin"), "train", "tgt") == [distilled[i] for i in keep]
    assert _decode(str(kd / "data-bin"), "train", "src") == [srcs[i] for i in keep]
    info = (kd / "data-bin" / "DISTILL_INFO.txt").read_text()
    assert "kept 298 of 300 pairs (1 repeat a token more than 2 times in a row; 1 are longer than 2 x source + 10)" in info
    proc = _bash("distill.sh", data_bin, "-", tmp_path / "kd_all", "--distilled", gz, "--workers", "1",
                 "--max-repeat", "0", "--max-len", "off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _decode(str(tmp_path / "kd_all" / "data-bin"), "train", "tgt") == distilled
    proc = _bash("distill.sh", data_bin, "-", tmp_path / "kd_bad", "--distilled", gz, "--max-len", "2")
    assert proc.returncode == 1
    assert _error_lines(proc.stderr) == ["error: --max-len must be A,B or off, got '2'"]


@pytest.mark.slow
def test_train_teacher_and_distill_by_generation(prepared, tmp_path):
    """Tiny teacher through train_teacher.sh (+ averaging), then distill.sh's generation path."""
    _, out, _ = prepared
    save = tmp_path / "teacher"
    env = {"MAX_UPDATE": "30", "MAX_EPOCH": "2", "LAYERS": "1", "DIM": "16", "HEADS": "2",
           "WARMUP": "5", "MAX_TOKENS": "2048", "AVG": "2", "LOG_INTERVAL": "5"}
    proc = _bash("train_teacher.sh", out / "data-bin", save, env_extra=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    avg = proc.stdout.strip().splitlines()[-1]
    assert avg == f"{save}/checkpoint_avg.pt" and os.path.isfile(avg)
    assert "averaged 2 checkpoints (checkpoint1.pt, checkpoint2.pt)" in proc.stderr
    kd = tmp_path / "kd"
    # the 30-update teacher loops on everything: keep its outputs (the filter is tested above)
    proc = _bash("distill.sh", out / "data-bin", avg, kd, "--beam", "1", "--workers", "1",
                 "--max-repeat", "0", "--max-len", "off", "--", "--max-len-a", "0", "--max-len-b", "8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    hyps = _lines(kd / "train.distill.tgt")
    assert len(hyps) == 300  # all sentences, in order, none dropped by fairseq's batching
    assert _decode(str(kd / "data-bin"), "train", "tgt") == hyps
    # with the default filter every looping output would go: a one-line error, not an empty split
    proc = _bash("distill.sh", out / "data-bin", avg, tmp_path / "kd_all_dropped", "--beam", "1", "--workers", "1",
                 "--max-repeat", "1", "--max-len", "0,0", "--", "--max-len-a", "0", "--max-len-b", "8")
    assert proc.returncode == 1
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and "train.src-tgt.tgt: the filter would drop all 300 pairs" in errors[0], proc.stderr
