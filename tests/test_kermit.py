"""KERMIT: canvases, modes, the loss against an explicit per-slot loop, cloze infilling that never
changes a given token, and both translation directions from one checkpoint through the CLI."""
import math
import os

import pytest
import torch

from conftest import PLUGIN_DIR, run_cli

import fairseq_nat_ext  # noqa: F401
from fairseq_nat_ext.compat import InputError
from fairseq_nat_ext.models.nat.kermit import pair_canvas, parse_modes, segments_of


def build(data_bin, extra=()):
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [data_bin, "--task", "kermit", "--user-dir", PLUGIN_DIR,
                                                "-s", "src", "-t", "tgt", "--arch", "kermit_tiny",
                                                "--dropout", "0"] + list(extra))
    task = tasks.setup_task(args)
    return task, task.build_model(args).eval(), args


@pytest.fixture(scope="module")
def kermit(toy_databin):
    task, model, args = build(toy_databin[0])
    task.load_dataset("valid")
    return task, model, args


def test_pair_canvas_and_segments():
    pad, bos, eos = 1, 0, 2
    x = torch.tensor([[5, 6, eos], [7, eos, pad]])
    y = torch.tensor([[8, eos, pad, pad], [9, 10, 11, eos]])
    c, seg, sep = pair_canvas(x, y, pad, bos)
    assert c.tolist() == [[bos, 5, 6, eos, 8, eos, pad], [bos, 7, eos, 9, 10, 11, eos]]
    assert sep.tolist() == [3, 2]
    assert seg.tolist() == [[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1]]
    assert segments_of(c, eos, pad).tolist() == [[0, 0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1, 1]]


def test_modes_option_errors():
    assert parse_modes("joint:2,x2y") == {"joint": 2.0, "x2y": 1.0}
    for bad in ("joint:1,bogus:1", "x:-1", "x:0", "y:abc"):
        with pytest.raises(InputError, match="--kermit-modes"):
            parse_modes(bad)


def sample(task, n=6):
    ds = task.datasets["valid"]
    return ds.collater([ds[i] for i in range(n)])


@pytest.mark.parametrize("mode", ["joint", "x2y", "y2x", "x", "y"])
def test_training_canvases_follow_the_mode(kermit, mode):
    task, model, _ = kermit
    s = sample(task)
    x, y = s["net_input"]["src_tokens"], s["target"]
    B = x.size(0)
    from fairseq_nat_ext.models.nat.kermit import _MODE_SIDES

    flags = [torch.full((B,), bool(f)) for f in _MODE_SIDES[mode]]
    torch.manual_seed(1)
    full, keep, x_gen, y_gen = model.training_canvases(x, y, flags)
    for b in range(B):
        row = [t for t in full[b].tolist() if t != model.pad]
        sep = row.index(model.eos)
        xs = [t for t in x[b].tolist() if t not in (model.pad, model.eos)]
        ys = [t for t in y[b].tolist() if t not in (model.pad, model.eos)]
        assert row[1:sep] == (xs if flags[2][b] else [])
        assert row[sep + 1:-1] == (ys if flags[3][b] else [])
        k = keep[b, :len(row)].tolist()
        assert k[0] and k[sep] and k[-1], "<s> and both </s> are always on the canvas"
        if not flags[0][b]:
            assert all(k[1:sep]), "a given x side is kept whole"
        if not flags[1][b]:
            assert all(k[sep + 1:-1]), "a given y side is kept whole"


@pytest.mark.parametrize("tau", [0.0, 1.0])
def test_loss_equals_explicit_per_slot_computation(kermit, tau):
    task, model, _ = kermit
    model.args.insertion_tau = tau
    s = sample(task)
    torch.manual_seed(3)
    full, keep, x_gen, y_gen = model.training_canvases(s["net_input"]["src_tokens"], s["target"])
    loss = model.insertion_loss(full, keep, x_gen, y_gen)
    from fairseq_nat_ext.models.nat.edit_ops import delete_tokens

    canvas = delete_tokens(full, ~keep, model.pad, model.bos, model.eos)
    lp = model.forward_slots(canvas, normalize=True)
    total, n = 0.0, 0
    for b in range(full.size(0)):
        f = [t for t in full[b].tolist() if t != model.pad]
        kept_pos = [p for p in range(len(f)) if keep[b, p]]
        sep_canvas = [f[p] for p in kept_pos].index(model.eos)
        for k in range(len(kept_pos) - 1):  # slot after the k-th canvas token
            side_y = k >= sep_canvas
            if not (y_gen[b] if side_y else x_gen[b]):
                continue
            span = f[kept_pos[k] + 1:kept_pos[k + 1]]
            if not span:
                total += -float(lp[b, k, model.eos])
            else:
                c = (len(span) - 1) / 2
                if tau > 0:
                    logits = [-abs(r - c) / tau for r in range(len(span))]
                    z = sum(math.exp(v) for v in logits)
                    w = [math.exp(v) / z for v in logits]
                else:
                    w = [1 / len(span)] * len(span)
                total += -sum(wi * float(lp[b, k, t]) for wi, t in zip(w, span))
            n += 1
    assert n > 0
    assert float(loss) == pytest.approx(total / n, rel=1e-4)


def split_at_gaps(tokens, gap):
    parts, cur, lead = [], [], bool(tokens) and tokens[0] == gap
    for t in tokens:
        if t == gap:
            parts.append(cur)
            cur = []
        else:
            cur.append(t)
    parts.append(cur)
    return parts


def test_cloze_never_changes_a_given_token(kermit, toy_databin):
    from fairseq_nat_ext.generators.kermit import GAP_SYMBOL, KermitGenerator

    task, model, _ = kermit
    d = task.target_dictionary
    gap = d.index(GAP_SYMBOL)
    g = torch.Generator().manual_seed(0)
    words = torch.randint(d.nspecial + 1, len(d) - 2, (4, 7), generator=g)
    rows = [
        [int(words[0, 0]), gap, int(words[0, 1]), int(words[0, 2]), gap],
        [gap, int(words[1, 0]), int(words[1, 1])],
        [int(words[2, 0]), gap, gap, int(words[2, 1])],  # two gap marks = one gap
        [int(words[3, 0]), int(words[3, 1]), int(words[3, 2])],  # no gap: nothing may change
    ]
    width = max(len(r) for r in rows) + 1
    src = torch.tensor([r + [d.eos()] + [d.pad()] * (width - len(r) - 1) for r in rows])
    for side in ("tgt", "src"):  # partial sentence on the y side, then on the x side
        gen = KermitGenerator([model], d, "src" if side == "tgt" else "tgt", side, mode="cloze",
                              max_iter=4, eos_penalty=100.0)  # the penalty forces insertions
        out = gen.generate([model], {"net_input": {"src_tokens": src, "src_lengths": None}})
        for r, hyps in zip(rows, out):
            hyp = hyps[0]["tokens"].tolist()
            assert hyp[-1] == d.eos()
            hyp = hyp[:-1]
            parts = [p for p in split_at_gaps(r, gap)]
            # the output is parts[0] + ins + parts[1] + ins + ... with insertions only at gaps
            pos = 0
            for i, p in enumerate(parts):
                if i == 0:
                    assert hyp[:len(p)] == p, (r, hyp)
                    pos = len(p)
                    continue
                # find p after some inserted tokens (a gap precedes it)
                rest = hyp[pos:]
                found = [k for k in range(len(rest) - len(p) + 1) if rest[k:k + len(p)] == p]
                assert found, (r, hyp)
                pos += found[0] + len(p)
            if gap not in r:
                assert hyp == r, "no gap: the sentence comes back unchanged"
            else:
                assert len(hyp) > len([t for t in r if t != gap]), "the forced gaps received tokens"
            last_part = parts[-1]
            if last_part and r[-1] != gap:
                assert hyp[-len(last_part):] == last_part, "nothing is appended after a closed end"


def test_cli_train_then_generate_both_directions(toy_databin, tmp_path):
    data_bin, _ = toy_databin
    save = tmp_path / "ckpt"
    run_cli(["fairseq-train", data_bin, "--user-dir", PLUGIN_DIR, "--task", "kermit", "-s", "src", "-t", "tgt",
             "--arch", "kermit_tiny", "--criterion", "kermit_loss", "--optimizer", "adam", "--lr", "1e-3",
             "--max-tokens", "800", "--max-update", "4", "--save-dir", str(save), "--no-epoch-checkpoints",
             "--num-workers", "0"])
    ckpt = os.path.join(str(save), "checkpoint_last.pt")
    n_test = sum(1 for _ in open(os.path.join(toy_databin[1], "test.src")))
    for s, t in (("src", "tgt"), ("tgt", "src")):
        p = run_cli(["fairseq-generate", data_bin, "--user-dir", PLUGIN_DIR, "--task", "kermit", "-s", s,
                     "-t", t, "--path", ckpt, "--max-tokens", "800", "--iter-decode-max-iter", "6"])
        hyps = [line for line in p.stdout.splitlines() if line.startswith("H-")]
        assert len(hyps) == n_test, (s, t, p.stdout[-2000:])
    p = run_cli(["fairseq-generate", data_bin, "--user-dir", PLUGIN_DIR, "--task", "kermit", "-s", "src",
                 "-t", "tgt", "--path", ckpt, "--max-tokens", "800", "--kermit-generate", "marginal",
                 "--iter-decode-max-iter", "3"])
    assert sum(1 for line in p.stdout.splitlines() if line.startswith("H-")) == n_test
    # the end-of-slot penalty chosen on the validation split: a huge penalty never ends a slot early
    out = tmp_path / "eos.json"
    run_cli(["python", "-m", "fairseq_nat_ext.evaluation.tune_eos_penalty", data_bin, ckpt, "--src", "src",
             "--tgt", "tgt", "--penalties", "0,100", "--iter", "4", "--batch-size", "16", "--threads", "1",
             "--out", str(out)])
    import json

    rec = json.load(open(out))
    assert [r["eos_penalty"] for r in rec["rows"]] == [0.0, 100.0] and rec["subset"] == "valid"
    assert rec["rows"][1]["length_ratio"] > rec["rows"][0]["length_ratio"]
    assert rec["best"] == max(rec["rows"], key=lambda r: (r["bleu"], -r["eos_penalty"]))["eos_penalty"]


def test_tune_eos_penalty_parsing_and_refusals():
    from fairseq_nat_ext.evaluation import tune_eos_penalty as t

    line = "Generate valid with beam=5: BLEU4 = 4.53, 60.4/18.6/7.0/2.7 (BP=0.375, ratio=0.505, syslen=6111, reflen=12102)"
    assert t.parse_bleu("noise\n" + line) == (4.53, 0.505)
    with pytest.raises(InputError, match="no BLEU line"):
        t.parse_bleu("Traceback: boom")
    rows = [{"eos_penalty": 0.0, "bleu": 3.0}, {"eos_penalty": 1.0, "bleu": 5.0}, {"eos_penalty": 2.0, "bleu": 5.0}]
    assert t.best_penalty(rows) == 1.0  # the smallest penalty among the best
    with pytest.raises(InputError, match="test split"):
        t.main(["d", "c", "--subset", "test"])
    with pytest.raises(InputError, match=">= 0"):
        t.main(["d", "c", "--penalties", "-1"])


def test_batch_decoding_when_the_longest_row_finishes_first(kermit, monkeypatch):
    """A finished long row leaves shorter active rows: the next round works on their trimmed canvas
    (it failed with a width mismatch on Multi30K batches), and the batch decodes each row as alone."""
    from fairseq_nat_ext.generators.kermit import KermitGenerator

    task, model, _ = kermit
    d = task.target_dictionary
    pad, word = d.pad(), d.nspecial + 1

    def fake_slots(tokens, which, langs=None):  # long canvases stop, short ones grow
        lp = torch.full((tokens.size(0), tokens.size(1) - 1, len(d)), -10.0)
        stop = tokens.ne(pad).sum(1) >= 10
        lp[stop, :, d.eos()] = 0.0
        lp[~stop, :, word] = 0.0
        return lp[which]

    monkeypatch.setattr(model, "slot_log_probs", fake_slots)
    w = d.nspecial + 2
    src = torch.tensor([[w] * 12 + [d.eos()], [w, w, d.eos()] + [pad] * 10])
    gen = KermitGenerator([model], d, "src", "tgt", max_iter=6)
    batch = gen.generate([model], {"net_input": {"src_tokens": src, "src_lengths": None}})
    for i in range(2):
        row = src[i:i + 1, : int(src[i].ne(pad).sum())]
        alone = gen.generate([model], {"net_input": {"src_tokens": row, "src_lengths": None}})
        assert batch[i][0]["tokens"].tolist() == alone[0][0]["tokens"].tolist()
        assert batch[i][0]["steps"] == alone[0][0]["steps"]
    assert batch[0][0]["steps"] == 1 and batch[1][0]["steps"] > 1


def test_conditioning_losses_roll_the_source_and_drop_it(kermit):
    """benchmark.kermit_conditioning: with every row holding the same source, the rolled source IS the
    true one (same loss); a source that differs per row gives another loss, and so does no source."""
    from benchmarks.kermit_conditioning import conditioning_losses

    task, model, _ = kermit
    s = sample(task)
    same = dict(s, net_input=dict(s["net_input"], src_tokens=s["net_input"]["src_tokens"][:1].expand_as(
        s["net_input"]["src_tokens"]).contiguous()))
    out = conditioning_losses(model, [same])
    assert out["true"] == pytest.approx(out["shuffled"], abs=1e-6)
    assert out["x_absent"] != pytest.approx(out["true"], abs=1e-6)
    out = conditioning_losses(model, [s])
    assert out["shuffled"] != pytest.approx(out["true"], abs=1e-6)
    # the same as the model's own x2y loss under the same seed
    on = torch.ones(len(s["id"]), dtype=torch.bool)
    torch.manual_seed(0)
    with torch.no_grad():
        want = float(model.insertion_loss(*model.training_canvases(s["net_input"]["src_tokens"], s["target"],
                                                                  (~on, on, on, on))))
    assert out["true"] == pytest.approx(want, abs=1e-6)
