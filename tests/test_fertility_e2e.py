"""nat_fertility end to end: fertility files (eflomal aligner, teacher attention) for the toy data-bin,
then fairseq-train and fairseq-generate with noisy parallel decoding rescored by an AT teacher."""
import os
import re

import pytest
import torch

from conftest import PLUGIN_DIR, run_cli
from fairseq_nat_ext.data import fertility as ff
from fairseq_nat_ext.data import make_fertility


def save_tiny_teacher(data_bin, path):
    """A (random) fairseq transformer checkpoint on the toy data-bin, saved as fairseq-train would."""
    import fairseq_nat_ext  # noqa: F401
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [
        data_bin, "--task", "translation", "--arch", "transformer", "--share-all-embeddings",
        "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
        "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--optimizer", "adam",
        "--lr", "1e-3"])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(0)
    model = task.build_model(cfg.model)
    torch.save({"cfg": cfg, "args": None, "model": model.state_dict(), "extra_state": {},
                "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
                                       "lr_scheduler_state": {}, "num_updates": 0}]}, path)
    return path


@pytest.fixture(scope="module")
def teacher(toy_databin, tmp_path_factory):
    return save_tiny_teacher(toy_databin[0], str(tmp_path_factory.mktemp("teacher") / "teacher.pt"))


@pytest.fixture(scope="module")
def aligner_fert(toy_databin, tmp_path_factory):
    pytest.importorskip("eflomal", reason="eflomal is not installed (pip install eflomal==2.0.0)")
    out = str(tmp_path_factory.mktemp("fert_aligner"))
    assert make_fertility.main(["--data-bin", toy_databin[0], "--out", out, "--method", "aligner"]) == 0
    return out  # the default splits: train and valid


def _lines(raw, split, side):
    with open(os.path.join(raw, f"{split}.{side}")) as f:
        return [line.split() for line in f]


def test_aligner_fertility_files(toy_databin, aligner_fert):
    raw = toy_databin[1]
    assert ff.fertility_method(aligner_fert) == "aligner"
    assert not os.path.exists(ff.fertility_file(aligner_fert, "test"))  # never made
    for split in ("train", "valid"):
        rows = ff.read_fertility_file(ff.fertility_file(aligner_fert, split))
        src, tgt = _lines(raw, split, "src"), _lines(raw, split, "tgt")
        ff.check_fertility(rows, [len(s) for s in src], [len(t) for t in tgt], split)
    # the toy task translates word by word (w3 -> W3): eflomal links nearly all words one to one
    rows = ff.read_fertility_file(ff.fertility_file(aligner_fert, "train"))
    ones = sum(int((r == 1).sum()) for r in rows) / sum(r.size for r in rows)
    assert ones > 0.8


def test_attention_fertility_files(toy_databin, teacher, tmp_path):
    out = str(tmp_path / "fert_attn")
    assert make_fertility.main(["--data-bin", toy_databin[0], "--out", out, "--method", "attention",
                                "--teacher", teacher, "--splits", "valid", "--max-tokens", "64",
                                "--cpu"]) == 0
    assert ff.fertility_method(out) == "attention"
    raw = toy_databin[1]
    for split in ("valid",):
        rows = ff.read_fertility_file(ff.fertility_file(out, split))
        src, tgt = _lines(raw, split, "src"), _lines(raw, split, "tgt")
        ff.check_fertility(rows, [len(s) for s in src], [len(t) for t in tgt], split)


def _word_lines(raw, split, side):
    with open(os.path.join(raw, f"{split}.{side}")) as f:
        return [" ".join(line.split()) for line in f]


def test_the_aligner_never_sees_test_lines(toy_databin, tmp_path, monkeypatch):
    """The fertility aligner aligns train and valid only: every line eflomal is given (recorded by a
    stand-in aligner that links word i to word i) is a train or valid line, in that order, and no
    test split is written or accepted."""
    raw, calls = toy_databin[1], []

    def fake_eflomal(src_lines, tgt_lines):
        calls.append((list(src_lines), list(tgt_lines)))
        return [" ".join(f"{i}-{i}" for i in range(min(len(s.split()), len(t.split()))))
                for s, t in zip(src_lines, tgt_lines)]

    monkeypatch.setattr(make_fertility, "run_eflomal", fake_eflomal)
    out = str(tmp_path / "fert")
    assert make_fertility.main(["--data-bin", toy_databin[0], "--out", out, "--method", "aligner"]) == 0
    assert len(calls) == 1
    src, tgt = calls[0]
    assert src == _word_lines(raw, "train", "src") + _word_lines(raw, "valid", "src")
    assert tgt == _word_lines(raw, "train", "tgt") + _word_lines(raw, "valid", "tgt")
    assert len(src) == 400 + 40  # the toy train and valid splits, not its 40 test sentences
    assert sorted(os.listdir(out)) == ["method", "train.fert", "valid.fert"]
    assert "splits train,valid" in open(os.path.join(out, "method")).read()
    # asking for a test split is refused with one line, before anything is aligned or written
    for splits in ("train,valid,test", "train,test1", "test"):
        calls.clear()
        out2 = str(tmp_path / f"fert_{splits.replace(',', '_')}")
        with pytest.raises(SystemExit, match=r"^error: --splits .*refusing test split") as err:
            make_fertility.main(["--data-bin", toy_databin[0], "--out", out2, "--method", "aligner",
                                 "--splits", splits])
        assert "\n" not in str(err.value)
        assert not calls and not os.path.exists(out2)
    # and the aligner itself refuses a test split handed to it directly
    loaded = make_fertility.load_split(toy_databin[0], "test", *make_fertility.infer_langs(toy_databin[0]))
    with pytest.raises(SystemExit, match="test-set leak"):
        make_fertility.aligner_fertility({"test": loaded}, {})
    assert not calls


def test_a_split_without_fertilities_is_an_error_only_where_the_loss_needs_them(toy_databin, tmp_path):
    """--fertility-path DIR without DIR/valid.fert: the valid split loads (decoding needs no
    fertilities); the fertility loss on one of its batches stops with one line naming the file."""
    import shutil

    from conftest import build_model_and_task
    from fairseq_nat_ext.compat import InputError
    from reliability_utils import toy_fertility

    fert = str(tmp_path / "fert")
    os.makedirs(fert)
    shutil.copy(ff.fertility_file(toy_fertility(toy_databin[0]), "train"), fert)  # train.fert only
    task, model, args = build_model_and_task(toy_databin[0], [
        "--arch", "nat_fertility_tiny", "--criterion", "nat_fertility_loss", "--fertility-path", fert])
    task.load_dataset("test")
    task.load_dataset("valid")
    assert task.missing_fertility() == {"test": ff.fertility_file(fert, "test"),
                                        "valid": ff.fertility_file(fert, "valid")}
    ds = task.dataset("valid")
    sample = task._noisy(ds.collater([ds[i] for i in range(4)]), model)
    criterion = task.build_criterion(args)
    with pytest.raises(InputError) as err:
        criterion(model, sample)
    msg = str(err.value)
    assert "\n" not in msg and ff.fertility_file(fert, "valid") in msg and "no fertility targets" in msg
    task.load_dataset("train")  # the train split has its file: its batches carry fertilities
    ds = task.dataset("train")
    loss, _, _ = criterion(model, task._noisy(ds.collater([ds[i] for i in range(4)]), model))
    assert torch.isfinite(loss)


def test_nat_fertility_train_then_npd_generate(toy_databin, aligner_fert, teacher, tmp_path):
    data, save = toy_databin[0], str(tmp_path / "ckpt")
    run_cli(["fairseq-train", data, "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
             "--arch", "nat_fertility_tiny", "--criterion", "nat_fertility_loss", "--fertility-path", aligner_fert,
             "--fertility-reinforce", "--fertility-reinforce-samples", "2", "--fertility-loss-factor", "0.5",
             "--fertility-reinforce-reward", "teacher", "--fertility-teacher", teacher,
             "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "800", "--max-update", "3",
             "--save-dir", save, "--no-epoch-checkpoints", "--num-workers", "0", "--seed", "1",
             "--log-format", "simple", "--log-interval", "1"])
    state = torch.load(os.path.join(save, "checkpoint_last.pt"), map_location="cpu", weights_only=False)
    assert not any("teacher" in key for key in state["model"])  # the REINFORCE teacher is not saved
    assert not os.path.exists(ff.fertility_file(aligner_fert, "test"))  # decoding needs no test.fert
    proc = run_cli(["fairseq-generate", data, "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                    "--path", os.path.join(save, "checkpoint_last.pt"), "--gen-subset", "test",
                    "--batch-size", "16", "--npd-samples", "3", "--npd-teacher", teacher, "--npd-rank", "total",
                    "--retain-iter-history"])
    hyps = {int(m.group(1)) for m in re.finditer(r"^H-(\d+)\t", proc.stdout, re.M)}
    assert hyps == set(range(40))
    for i in range(40):  # one trace line per candidate
        assert len(re.findall(rf"^E-{i}_\d+\t", proc.stdout, re.M)) == 3
    assert "BLEU4" in proc.stdout
