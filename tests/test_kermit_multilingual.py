"""Multilingual KERMIT (task kermit --lang-pairs): the three-language data recipe, batches that carry
each row's languages, the per-segment language embedding, every direction decoded from one
checkpoint through the CLI, and the multilingual Transformer recipe it is compared with."""
import filecmp
import os
import subprocess

import pytest
import torch

from conftest import PLUGIN_DIR, ROOT, cli_env, run_cli, write_toy_corpus

import fairseq_nat_ext  # noqa: F401
from fairseq_nat_ext.compat import InputError
from fairseq_nat_ext.tasks.kermit import pair_languages, parse_lang_pairs

LANGS = ("aa", "bb", "cc")
PAIRS = "aa-bb,aa-cc,bb-cc"


def _bash(script, *args, env_extra=None):
    env = cli_env()
    env.update(env_extra or {})
    return subprocess.run(["bash", os.path.join(ROOT, "examples", script), *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def multi_bin(tmp_path_factory):
    """Three line-aligned toy 'languages' (aa: words, bb: upper-cased, cc: z-prefixed) prepared by
    examples/prepare_multilingual.sh: (data_bin, out_dir)."""
    root = tmp_path_factory.mktemp("multi")
    raw = root / "raw"
    write_toy_corpus(str(raw), n_train=300, n_valid=30, n_test=20)
    for split in ("train", "valid", "test"):
        os.rename(raw / f"{split}.src", raw / f"{split}.aa")
        os.rename(raw / f"{split}.tgt", raw / f"{split}.bb")
        lines = open(raw / f"{split}.aa").read().splitlines()
        with open(raw / f"{split}.cc", "w") as f:
            f.write("\n".join(" ".join("z" + w for w in line.split()) for line in lines) + "\n")
    out = root / "prep"
    p = _bash("prepare_multilingual.sh", raw, out, "--langs", ",".join(LANGS), "--bpe-merges", "60",
              "--workers", "1")
    assert p.returncode == 0, p.stderr[-3000:]
    return str(out / "data-bin"), str(out)


def test_prepare_multilingual_layout(multi_bin):
    data_bin, out = multi_bin
    for pair in PAIRS.split(","):
        a, b = pair.split("-")
        for split in ("train", "valid", "test"):
            for lang in (a, b):
                assert os.path.exists(os.path.join(data_bin, f"{split}.{pair}.{lang}.bin"))
    dicts = [os.path.join(data_bin, f"dict.{lang}.txt") for lang in LANGS]
    assert all(filecmp.cmp(dicts[0], d, shallow=False) for d in dicts[1:])
    words = {line.split()[0] for line in open(dicts[0])}
    assert any(w.startswith("z") for w in words) and any(w.startswith("W") for w in words)  # every language
    for lang in LANGS:  # untokenised test references of every language
        assert sum(1 for _ in open(os.path.join(out, "raw", f"test.{lang}"))) == 20
    bad = _bash("prepare_multilingual.sh", os.path.dirname(out), out, "--langs", "aa,aa")
    assert bad.returncode != 0 and "repeated" in bad.stderr


def test_lang_pairs_option():
    assert parse_lang_pairs("en-de, en-fr,de-fr") == [("en", "de"), ("en", "fr"), ("de", "fr")]
    assert pair_languages(parse_lang_pairs("en-de,de-fr")) == ["en", "de", "fr"]
    for bad in ("en", "en-en", "en-de,de-en", "en-de-fr"):
        with pytest.raises(InputError, match="--lang-pairs"):
            parse_lang_pairs(bad)


def build(data_bin, extra=()):
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [data_bin, "--task", "kermit", "--user-dir", PLUGIN_DIR,
                                                "--lang-pairs", PAIRS, "--arch", "kermit_tiny",
                                                "--dropout", "0"] + list(extra))
    task = tasks.setup_task(args)
    return task, task.build_model(args).eval()


def test_batches_carry_each_rows_languages(multi_bin):
    """Rows of one batch come from different pairs; each row's (src_lang, tgt_lang) must name the pair
    whose files hold that row's source and target (looked up independently, pair by pair)."""
    from fairseq.data import data_utils

    data_bin, _ = multi_bin
    task, model = build(data_bin)
    assert model.langs == list(LANGS)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    assert len(ds) == 3 * 30
    files = {}
    for pair in PAIRS.split(","):
        a, b = pair.split("-")
        files[(a, b)] = [data_utils.load_indexed_dataset(os.path.join(data_bin, f"valid.{pair}.{lang}"),
                                                         task.source_dictionary) for lang in (a, b)]
    idx = [0, 31, 62, 5, 40, 75, 29, 59, 89]  # rows of all three pairs
    batch = ds.collater([ds[i] for i in idx])
    pad = task.source_dictionary.pad()
    net = batch["net_input"]
    assert sorted(batch["id"].tolist()) == sorted(idx)  # ids unique over the pairs
    pair_order = [tuple(p.split("-")) for p in PAIRS.split(",")]
    seen = set()
    for r in range(len(idx)):
        a, b = LANGS[int(net["src_lang"][r])], LANGS[int(net["tgt_lang"][r])]
        seen.add((a, b))
        src_ds, tgt_ds = files[(a, b)]
        i = int(batch["id"][r]) - 30 * pair_order.index((a, b))  # 30 valid sentences per pair
        src = net["src_tokens"][r]
        tgt = batch["target"][r]
        assert src[src.ne(pad)].tolist() == src_ds[i].tolist()
        assert tgt[tgt.ne(pad)].tolist() == tgt_ds[i].tolist()
    assert seen == {tuple(p.split("-")) for p in PAIRS.split(",")}
    # the criterion passes them to the model, and the loss is finite
    from fairseq_nat_ext.criterions.kermit_loss import KermitLoss

    inputs = KermitLoss.model_inputs(None, batch)
    assert inputs["src_lang"].tolist() == net["src_lang"].tolist()
    out = model(**inputs)
    assert torch.isfinite(out["kermit"]["loss"])
    # training: the row's source is segment x with its src_lang, the target segment y with its tgt_lang
    seen_calls = []
    real = model.slot_states

    def spy(tokens, seg=None, langs=None):
        seen_calls.append((tokens, langs))
        return real(tokens, seg, langs)

    model.slot_states = spy
    B = len(idx)
    given_x = (torch.zeros(B, dtype=torch.bool), torch.ones(B, dtype=torch.bool),
               torch.ones(B, dtype=torch.bool), torch.ones(B, dtype=torch.bool))  # mode x2y: x whole
    model(**inputs, modes=given_x)
    canvas, langs = seen_calls[-1]
    assert langs[0].tolist() == net["src_lang"].tolist() and langs[1].tolist() == net["tgt_lang"].tolist()
    for r in range(B):
        src = net["src_tokens"][r]
        content = src[src.ne(pad)]  # x </s>
        assert canvas[r, 1:1 + len(content)].tolist() == content.tolist()


def test_language_embedding_is_a_per_segment_vector(multi_bin):
    """Adding lang_embed[x] to segment x and lang_embed[y] to segment y is the same as a bilingual model
    whose two segment vectors are segment_embed + those language vectors."""
    data_bin, _ = multi_bin
    task, model = build(data_bin)
    eos, pad, bos = model.eos, model.pad, model.bos
    tokens = torch.tensor([[bos, 10, 11, eos, 12, 13, 14, eos], [bos, 15, eos, 16, eos, pad, pad, pad]])
    with torch.no_grad():
        got = model.slot_states(tokens, langs=(2, 0))
        per_row = model.slot_states(tokens, langs=(torch.tensor([2, 2]), torch.tensor([0, 0])))
        other = model.slot_states(tokens, langs=(1, 0))
        seg = model.segment_embed.weight.clone()
        model.segment_embed.weight.copy_(seg + model.lang_embed.weight[[2, 0]])
        langs, model.langs = model.langs, []
        try:
            ref = model.slot_states(tokens)
        finally:
            model.langs = langs
            model.segment_embed.weight.copy_(seg)
    assert torch.allclose(got, ref, atol=1e-5) and torch.allclose(got, per_row)
    assert not torch.allclose(got, other, atol=1e-3)  # the x language matters
    with pytest.raises(InputError, match="needs the languages"):
        model.slot_states(tokens)
    with pytest.raises(InputError, match="not one of the model's --kermit-langs"):
        model.lang_ids("aa", "zz")


def test_cli_train_then_every_direction(multi_bin, tmp_path):
    """One fairseq-train over all pairs (the recipe, LANG_PAIRS), then fairseq-generate in all six
    directions from that checkpoint; a direction outside --lang-pairs is a one-line error."""
    data_bin, out = multi_bin
    save = tmp_path / "ckpt"
    p = _bash("train_kermit.sh", data_bin, save, "--arch", "kermit_tiny", "--max-tokens", "800",
              env_extra={"LANG_PAIRS": PAIRS, "LAYERS": "2", "DIM": "32", "HEADS": "2", "MAX_UPDATE": "3",
                         "AVG": "0", "SAVE_INTERVAL_UPDATES": "3", "THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    ckpt = str(save / "checkpoint_last.pt")
    for pair in PAIRS.split(","):
        a, b = pair.split("-")
        for s, t in ((a, b), (b, a)):
            g = run_cli(["fairseq-generate", data_bin, "--user-dir", PLUGIN_DIR, "--task", "kermit",
                         "--lang-pairs", PAIRS, "-s", s, "-t", t, "--path", ckpt, "--max-tokens", "800",
                         "--iter-decode-max-iter", "3"])
            assert sum(1 for line in g.stdout.splitlines() if line.startswith("H-")) == 20, (s, t)
    # the generator places the languages as in their pair: cc -> aa generates segment x (aa)
    from fairseq_nat_ext.evaluation.inference import load_system

    system = load_system(ckpt, data_bin, "cc", "aa")
    gen = system.task.build_generator(system.models, system.cfg.generation)
    assert gen.target_is_x and gen.lang_ids == (0, 2)
    # one caption in all three languages: a joint pair then a conditional, or all from one language
    from fairseq_nat_ext.generators.kermit_languages import captions

    rows = captions(data_bin, ckpt, n=2, temperature=1.0, iters=3)
    assert len(rows) == 2 and all(list(r) == list(LANGS) for r in rows)
    rows = captions(data_bin, ckpt, n=3, given="cc", iters=3)
    test_cc = open(os.path.join(out, "raw", "test.cc")).read().splitlines()
    assert [r["cc"] for r in rows] == test_cc[:3]  # the given captions, as they are in the data-bin
    with pytest.raises(InputError, match="--given"):
        captions(data_bin, ckpt, n=1, given="zz")
    bad = run_cli(["fairseq-generate", data_bin, "--user-dir", PLUGIN_DIR, "--task", "kermit",
                   "--lang-pairs", "aa-bb", "-s", "bb", "-t", "cc", "--path", ckpt], check=False)
    assert bad.returncode != 0 and "not a direction of --lang-pairs" in bad.stderr
    # the checkpoint keeps its pairs: -s/-t alone decode as with --lang-pairs; a pair written the other
    # way round is refused (it would swap the segments)
    def hyps(*extra):
        g = run_cli(["fairseq-generate", data_bin, "--user-dir", PLUGIN_DIR, "--task", "kermit", "-s", "cc",
                     "-t", "aa", "--path", ckpt, "--max-tokens", "800", "--iter-decode-max-iter", "3", *extra])
        return sorted(line for line in g.stdout.splitlines() if line.startswith("H-"))

    assert hyps() == hyps("--lang-pairs", PAIRS)
    bad = run_cli(["fairseq-generate", data_bin, "--user-dir", PLUGIN_DIR, "--task", "kermit",
                   "--lang-pairs", "aa-bb,cc-aa,bb-cc", "-s", "cc", "-t", "aa", "--path", ckpt], check=False)
    assert bad.returncode != 0 and "differently from training" in bad.stderr


def test_multilingual_transformer_recipe(multi_bin, tmp_path):
    """The autoregressive side of the comparison: fairseq's translation_multi_simple_epoch with a
    target-language tag, trained on all six directions, decodes any one of them."""
    data_bin, _ = multi_bin
    p = _bash("train_multilingual_transformer.sh", "--directions", env_extra={"LANG_PAIRS": PAIRS})
    assert p.stdout.strip() == "aa-bb,bb-aa,aa-cc,cc-aa,bb-cc,cc-bb"
    save = tmp_path / "mt"
    p = _bash("train_multilingual_transformer.sh", data_bin, save, "--max-tokens", "800",
              env_extra={"LANG_PAIRS": PAIRS, "LAYERS": "1", "DIM": "32", "HEADS": "2", "MAX_UPDATE": "3",
                         "AVG": "0", "THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    g = run_cli(["fairseq-generate", data_bin, "--user-dir", PLUGIN_DIR, "--task", "translation_multi_simple_epoch",
                 "--lang-pairs", "aa-bb,bb-aa,aa-cc,cc-aa,bb-cc,cc-bb", "--encoder-langtok",
                 "tgt", "-s", "cc", "-t", "bb", "--path", str(save / "checkpoint_best.pt"), "--max-tokens", "800",
                 "--beam", "2"])
    assert sum(1 for line in g.stdout.splitlines() if line.startswith("H-")) == 20


def test_sampling_draws_each_slot_from_its_distribution(multi_bin, monkeypatch):
    """--kermit-temperature T > 0: every open slot draws its token from softmax(log p / T): with
    p = (0.7, 0.3) over two words and T = 1, about 70 % of 4,000 first-round insertions are the first
    word; T = 0 is the argmax."""
    from fairseq_nat_ext.generators.kermit import KermitGenerator

    data_bin, _ = multi_bin
    task, model = build(data_bin)
    d = task.target_dictionary
    w1, w2 = d.nspecial + 3, d.nspecial + 4
    lp_row = torch.full((len(d),), float("-inf"))
    lp_row[w1], lp_row[w2] = torch.log(torch.tensor(0.7)), torch.log(torch.tensor(0.3))

    def fake_slots(tokens, which, langs=None):
        return lp_row.expand(int(which.sum()), -1).clone()

    monkeypatch.setattr(model, "slot_log_probs", fake_slots)
    src = torch.tensor([[d.nspecial + 5, d.eos()]] * 4000)
    sample = {"net_input": {"src_tokens": src, "src_lengths": None}}
    torch.manual_seed(0)
    hyps = KermitGenerator([model], d, "aa", "bb", max_iter=1, x_lang="aa", temperature=1.0).generate([model], sample)
    first = torch.tensor([int(h[0]["tokens"][0]) for h in hyps])
    assert set(first.tolist()) == {w1, w2}
    assert abs(float(first.eq(w1).float().mean()) - 0.7) < 0.03  # 4.6 standard deviations
    hyps = KermitGenerator([model], d, "aa", "bb", max_iter=1, x_lang="aa").generate([model], sample)
    assert all(int(h[0]["tokens"][0]) == w1 for h in hyps)
    with pytest.raises(InputError, match="--kermit-temperature"):
        KermitGenerator([model], d, "aa", "bb", x_lang="aa", temperature=-1)


def test_captions_check_every_direction_before_decoding():
    """kermit_languages refuses a language it cannot reach from the given one (a --lang-pairs graph
    without that pair) with the task's one-line error, before decoding anything."""
    from types import SimpleNamespace

    from fairseq_nat_ext.generators.kermit_languages import _check_directions
    from fairseq_nat_ext.tasks.kermit import KermitTask

    task = SimpleNamespace(pairs=[("aa", "bb"), ("aa", "cc")], cfg=SimpleNamespace(lang_pairs="aa-bb,aa-cc"))
    task.pair_of = KermitTask.pair_of.__get__(task)
    _check_directions(task, "aa", ["bb", "cc"])
    _check_directions(task, "cc", ["aa"])
    with pytest.raises(InputError, match="-s bb -t cc is not a direction"):
        _check_directions(task, "bb", ["aa", "cc"])
