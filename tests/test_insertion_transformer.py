"""Insertion Transformer: slot loss against an explicit per-slot loop, decoding, CLI end to end."""
import math

import pytest
import torch

from conftest import build_model_and_task, train_then_generate

import fairseq_nat_ext  # noqa: F401


@pytest.fixture(scope="module")
def model_task(toy_databin):
    task, model, _ = build_model_and_task(toy_databin[0], ["--arch", "insertion_tiny", "--dropout", "0"])
    task.load_dataset("valid")
    return model.eval(), task


def batch(task, n=5):
    ds = task.datasets["valid"]
    return ds.collater([ds[i] for i in range(n)])


@pytest.mark.parametrize("tau", [0.0, 1.0, 2.5])
def test_loss_equals_explicit_per_slot_computation(model_task, tau):
    model, task = model_task
    model.args.insertion_tau = tau
    s = batch(task)
    torch.manual_seed(0)
    canvas = model.inject_noise(s["target"])
    src, lens = s["net_input"]["src_tokens"], s["net_input"]["src_lengths"]
    loss = model(src, lens, canvas, s["target"])["insertion"]["loss"]
    enc = model.encoder(src, src_lengths=lens)
    lp = model.decoder.forward_slots(canvas, enc, normalize=True)
    total, n = 0.0, 0
    for b in range(canvas.size(0)):
        c = [x for x in canvas[b].tolist() if x != model.pad]
        t = [model.bos] + [x for x in s["target"][b].tolist() if x != model.pad]
        # canvas = subsequence of t; the oracle's tie rule embeds it as far right as possible
        pos, j = [], len(c) - 1
        for k in range(len(t) - 1, -1, -1):
            if j >= 0 and t[k] == c[j]:
                pos.append(k)
                j -= 1
        assert j == -1
        pos.reverse()
        for k in range(len(c) - 1):
            span = t[pos[k] + 1:pos[k + 1]]
            if not span:
                total += -float(lp[b, k, model.eos])
            else:
                L = len(span)
                if tau > 0:
                    e = [math.exp(-abs(r - (L - 1) / 2) / tau) for r in range(L)]
                    w = [x / sum(e) for x in e]
                else:
                    w = [1 / L] * L
                total += -sum(wi * float(lp[b, k, tok]) for wi, tok in zip(w, span))
            n += 1
    assert abs(float(loss) - total / n) < 1e-4


def test_decoding_inserts_in_parallel_and_stops(model_task):
    model, task = model_task
    from fairseq_nat_ext.generators.insertion import InsertionGenerator

    gen = InsertionGenerator([model], task.target_dictionary, max_iter=4)
    for (h,) in gen.generate([model], batch(task, 4)):
        assert h["tokens"][-1] == model.eos and 1 <= h["steps"] <= 4
        assert len(h["tokens"]) <= 1 + (2 ** 4 - 1), "at most one token per slot per round"


def test_uniform_loss_option_equals_tau_zero(model_task):
    model, task = model_task
    s = batch(task)
    src, lens = s["net_input"]["src_tokens"], s["net_input"]["src_lengths"]
    losses = []
    for loss_kind, tau in (("uniform", 1.0), ("binary_tree", 0.0), ("binary_tree", 1.0)):
        model.args.insertion_loss, model.args.insertion_tau = loss_kind, tau
        torch.manual_seed(0)
        canvas = model.inject_noise(s["target"])
        losses.append(float(model(src, lens, canvas, s["target"])["insertion"]["loss"]))
    model.args.insertion_loss, model.args.insertion_tau = "binary_tree", 1.0
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)
    assert losses[0] != pytest.approx(losses[2], abs=1e-4), "the binary tree weights differ from uniform"


def test_sequential_decoding_inserts_one_token_per_round(model_task):
    model, task = model_task
    from types import SimpleNamespace

    from fairseq_nat_ext.generators.insertion import InsertionGenerator

    gen = InsertionGenerator([model], task.target_dictionary, max_iter=4, placeholder_penalty=50.0,
                             retain_history=True)
    gen.configure(SimpleNamespace(insertion_decoding="sequential"))
    assert gen.max_iter >= model.decoder.max_positions()
    for (h,) in gen.generate([model], batch(task, 3)):
        sizes = [len(x) for x in h["history"]]
        assert all(b - a == 1 for a, b in zip([1] + sizes, sizes)), sizes
        assert len(sizes) > 4, "the end-of-slot penalty forces insertions past --iter-decode-max-iter"
        assert len(h["tokens"]) - 1 == len(sizes), "one round per inserted token"
    with pytest.raises(ValueError, match="--insertion-decoding"):
        gen.configure(SimpleNamespace(insertion_decoding="beam"))


@pytest.mark.slow
def test_cli_train_then_generate(toy_databin, tmp_path):
    proc = train_then_generate(toy_databin[0], tmp_path / "ck",
                               "insertion_tiny", "insertion_loss", ["--iter-decode-max-iter", "5"])
    assert proc.stdout.count("\nH-") == 40
