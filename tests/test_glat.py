"""Glancing training (GLAT, Qian et al. 2021): the reveal rule against a plain loop over its definition, the
``glat`` arch (uniform and soft copy, loss on the unrevealed positions, one-pass decoding), glancing over
the best CTC alignment for ``ctc_nat``, the criteria's schedule and logs, and tiny fairseq-train +
fairseq-generate runs of both."""
import math
import re

import pytest
import torch

from conftest import PLUGIN_DIR, build_model_and_task, run_cli

import fairseq_nat_ext  # noqa: F401,E402
from fairseq_nat_ext.compat import InputError
from fairseq_nat_ext.criterions.ctc_nat_loss import CTCNATLoss
from fairseq_nat_ext.criterions.glat_loss import GLATLoss
from fairseq_nat_ext.models.nat.glancing import glancing_reveal
from fairseq_nat_ext.models.nat.glat import soft_copy_weights

GLAT_ARGS = ["--arch", "glat_tiny", "--criterion", "glat_loss"]
CTC_ARGS = ["--arch", "ctc_nat_tiny", "--criterion", "ctc_nat_loss", "--upsample-ratio", "2"]


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.3, 0.5, 0.75, 1.0])
def test_reveal_count_is_round_ratio_times_distance_and_only_wrong_positions(ratio):
    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        wrong = torch.rand(5, 9, generator=g) < 0.2 + 0.6 * torch.rand(5, 1, generator=g)
        reveal = glancing_reveal(wrong, ratio, generator=g)
        for b in range(5):
            d = sum(bool(w) for w in wrong[b].tolist())  # the Hamming distance of the row
            shown = [t for t in range(9) if reveal[b, t]]
            assert len(shown) == round(ratio * d)
            assert all(wrong[b, t] for t in shown)  # a position the first pass got right never


def test_reveal_draws_uniformly_among_the_wrong_positions():
    wrong = torch.tensor([[True, False, True, True, False, True]])
    counts = torch.zeros(6)
    g = torch.Generator().manual_seed(1)
    for _ in range(4000):
        counts += glancing_reveal(wrong, 0.5, generator=g)[0].float()
    assert counts[1] == 0 and counts[4] == 0
    freq = counts[wrong[0]] / 4000  # 2 of 4 each time: 0.5 each
    assert torch.allclose(freq, torch.full((4,), 0.5), atol=0.04), freq


def test_reveal_rejects_a_ratio_outside_0_1():
    with pytest.raises(ValueError, match="ratio"):
        glancing_reveal(torch.ones(1, 3, dtype=torch.bool), 1.5)


def test_soft_copy_weights_equal_the_definition():
    src_lengths, tgt_lengths, T, S, tau = torch.tensor([3, 5]), torch.tensor([4, 7]), 7, 6, 0.7
    w = soft_copy_weights(src_lengths, tgt_lengths, T, S, tau)
    for b in range(2):
        n, m = int(src_lengths[b]), int(tgt_lengths[b])
        for t in range(T):
            c = (t + 0.5) * n / m - 0.5
            z = [math.exp(-abs(i - c) / tau) for i in range(n)]
            ref = [v / sum(z) for v in z] + [0.0] * (S - n)
            assert torch.allclose(w[b, t], torch.tensor(ref), atol=1e-6)


@pytest.fixture(scope="module")
def glat(toy_databin):
    return build_model_and_task(toy_databin[0], GLAT_ARGS)


def _sample(tgt=((10, 11, 12, 2), (13, 2, 1, 1))):
    src = torch.tensor([[1, 5, 6, 2], [7, 8, 9, 2]])
    tgt = torch.tensor(tgt)
    return {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([3, 4])}, "target": tgt,
            "prev_target": tgt, "ntokens": int(tgt.ne(1).sum())}


def test_glat_decoder_input_is_the_uniformly_copied_source(glat):
    task, model, _ = glat
    model.eval()
    src = torch.tensor([[1, 5, 6, 7, 2]])
    enc = model.encoder(src, src_lengths=torch.tensor([4]))
    x = model.decoder.copy_source(enc, torch.tensor([5]), 5)
    emb = model.encoder.embed_scale * model.encoder.embed_tokens(torch.tensor([5, 6, 7]))
    for t in range(5):
        torch.testing.assert_close(x[0, t], emb[int((t + 0.5) * 3 / 5)])


def test_glat_glance_reveals_round_ratio_hamming_wrong_tokens_and_loss_skips_them(glat):
    task, model, _ = glat
    model.train()
    torch.manual_seed(0)
    sample = _sample()
    net = sample["net_input"]
    tgt = sample["target"].masked_fill(sample["target"].eq(2), 1)  # content only
    content = tgt.ne(1)
    enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
    placeholders = tgt.masked_fill(content, model.mask_idx)
    model.eval()  # a deterministic first pass, to compare with the reference below
    with torch.no_grad():
        logits = model.decoder(placeholders, enc, copy_source=True)
    pred = logits.index_fill(-1, torch.tensor([1, 0, 2, model.mask_idx]), float("-inf")).argmax(-1)
    glanced, reveal = model.glance(enc, placeholders, tgt, content, 0.5)
    distances = []
    for b in range(2):
        d = sum(int(pred[b, t]) != int(tgt[b, t]) for t in range(tgt.size(1)) if content[b, t])
        distances.append(d)
        shown = [t for t in range(tgt.size(1)) if reveal[b, t]]
        assert len(shown) == round(0.5 * d)
        assert all(int(pred[b, t]) != int(tgt[b, t]) and int(glanced[b, t]) == int(tgt[b, t]) for t in shown)
        assert all(int(glanced[b, t]) == model.pad for t in range(tgt.size(1)) if t not in shown)
    assert max(distances) >= 2  # something is revealed: the count is tested, not vacuous
    # the loss reads only the positions not revealed
    out = model(net["src_tokens"], net["src_lengths"], sample["prev_target"], sample["target"], glat_ratio=1.0)
    n_content = int(content.sum())
    assert out["word_ins"]["tgt"].numel() == n_content - out["word_ins"]["glat_revealed"]
    out0 = model(net["src_tokens"], net["src_lengths"], sample["prev_target"], sample["target"])
    assert out0["word_ins"]["tgt"].numel() == n_content and "glat_revealed" not in out0["word_ins"]


def test_glanced_tokens_replace_the_copied_input(glat):
    """A revealed position's decoder input is the reference token's embedding: the output there equals
    that of a decoder reading the token embedding at that position."""
    task, model, _ = glat
    model.eval()
    src = torch.tensor([[5, 6, 7, 2]])
    enc = model.encoder(src, src_lengths=torch.tensor([4]))
    inp = torch.full((1, 4), model.mask_idx)
    glanced = torch.tensor([[1, 11, 1, 1]])
    with torch.enable_grad():
        a = model.decoder(inp, enc, copy_source=True, glanced=glanced)
        copied = model.decoder.copy_source(enc, torch.tensor([4]), 4)
        x = copied.clone()
        x[0, 1] = model.decoder.embed_scale * model.decoder.embed_tokens(torch.tensor(11))
        x = x + model.decoder.embed_positions(inp)
        ref = model.decoder.output_layer(model.decoder._layers(x, enc, None))
    torch.testing.assert_close(a, ref)


def test_glat_loss_schedule_logs_and_backward(glat):
    task, model, _ = glat
    model.train()
    crit = GLATLoss(task, glat_ratio_start=0.5, glat_ratio_end=0.3, max_update=100)
    crit.train()
    for upd, want in ((0, 0.5), (50, 0.4), (100, 0.3), (150, 0.3)):
        model.set_num_updates(upd)
        loss, size, log = crit(model, _sample())
        assert abs(crit.glat_ratio() - want) < 1e-9
        assert abs(log["glat_ratio"] / log["nsentences"] - want) < 1e-9 and log["glat_revealed"] >= 0
    loss.backward()
    assert torch.isfinite(loss)
    crit.eval()  # validation never glances
    _, _, log = crit(model, _sample())
    assert "glat_ratio" not in log
    with pytest.raises(InputError, match="--glat-ratio-end"):
        GLATLoss(task, glat_ratio_start=0.5, glat_ratio_end=1.5)


def test_glat_soft_copy_and_bad_options(toy_databin):
    task, model, _ = build_model_and_task(toy_databin[0], GLAT_ARGS + ["--glat-copy", "soft",
                                                                       "--soft-copy-temperature", "0.5"])
    model.eval()
    src = torch.tensor([[1, 5, 6, 7, 2]])
    enc = model.encoder(src, src_lengths=torch.tensor([4]))
    x = model.decoder.copy_source(enc, torch.tensor([5]), 5)
    emb = model.encoder.embed_scale * model.encoder.embed_tokens(torch.tensor([5, 6, 7]))
    w = soft_copy_weights(torch.tensor([3]), torch.tensor([5]), 5, 3, 0.5)[0]
    torch.testing.assert_close(x[0], w @ emb)
    with pytest.raises(InputError, match="--soft-copy-temperature"):
        build_model_and_task(toy_databin[0], GLAT_ARGS + ["--soft-copy-temperature", "-1"])


def test_glat_fast_decoding_route_equals_the_training_loop(glat):
    task, model, _ = glat
    model.eval()
    src = torch.tensor([[1, 5, 6, 2], [7, 8, 9, 2]])
    enc = model.encoder(src, src_lengths=torch.tensor([3, 4]))
    inp = torch.tensor([[4, 4, 4, 1], [4, 4, 4, 4]]).masked_fill(torch.tensor([[0, 0, 0, 1], [0, 0, 0, 0]]).bool(), 1)
    inp = inp.masked_fill(inp.eq(4), model.mask_idx)
    with torch.no_grad():
        fast = model.decoder(inp, enc, copy_source=True, normalize=True)
    with torch.enable_grad():
        slow = model.decoder(inp, enc, copy_source=True, normalize=True)
    valid = inp.ne(1)
    torch.testing.assert_close(fast[valid], slow.detach()[valid], atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def ctc(toy_databin):
    return build_model_and_task(toy_databin[0], CTC_ARGS)


def test_ctc_glance_reveals_symbols_of_the_best_alignment(ctc):
    task, model, _ = ctc
    model.eval()
    sample = _sample()
    net = sample["net_input"]
    tgt, tl = model.ctc_targets(sample["target"])
    enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
    up = model.decoder.upsample(enc)
    with torch.no_grad():
        lp = model.decoder(enc, normalize=True, upsampled=up)
    from fairseq_nat_ext.oracles.ctc_alignment import ctc_best_alignment

    align, _ = ctc_best_alignment(lp, up[1], tgt, tl, model.blank_idx, pad=model.pad)

    def collapse(seq):  # the CTC collapse as a plain loop: merge repeats, drop blanks
        out, prev = [], None
        for v in seq:
            if v != prev and v != model.blank_idx:
                out.append(v)
            prev = v
        return out
    for ratio in (0.3, 1.0):
        glanced, n = model.glance(enc, up, tgt, tl, ratio)
        total = 0
        for b in range(2):
            L = int(up[1][b])
            assert collapse(align[b, :L].tolist()) == tgt[b, : int(tl[b])].tolist()
            wrong = [t for t in range(L) if int(lp[b, t].argmax()) != int(align[b, t])]
            shown = [t for t in range(lp.size(1)) if int(glanced[b, t]) != model.pad]
            assert len(shown) == round(ratio * len(wrong)) and set(shown) <= set(wrong)
            assert all(int(glanced[b, t]) == int(align[b, t]) for t in shown)
            total += len(shown)
        assert n == total


def test_ctc_glancing_criterion_logs_and_plain_ctc_is_unchanged(ctc):
    task, model, _ = ctc
    model.train()
    sample = _sample()
    torch.manual_seed(3)
    plain = CTCNATLoss(task)
    plain.train()
    l0, _, log0 = plain(model, sample)
    assert "glat_ratio" not in log0 and "glat_revealed" not in log0
    crit = CTCNATLoss(task, glat_ratio_start=0.5, glat_ratio_end=0.3, max_update=10)
    crit.train()
    model.set_num_updates(5)
    loss, _, log = crit(model, sample)
    assert abs(log["glat_ratio"] / log["nsentences"] - 0.4) < 1e-9 and log["glat_revealed"] >= 0
    assert log["ctc_filtered"] == 0 and torch.isfinite(loss)
    loss.backward()


def test_glancing_logs_the_share_of_revealed_positions_per_target_token():
    from fairseq import metrics
    logs = [dict(glat_ratio=0.5 * 2, nsentences=2, ntokens=10, glat_revealed=3),
            dict(glat_ratio=0.5 * 6, nsentences=6, ntokens=30, glat_revealed=1)]
    with metrics.aggregate() as agg:
        GLATLoss.reduce_metrics(logs)
        got = agg.get_smoothed_values()
    assert got["glat_revealed"] == 4 and abs(got["glat_share"] - 4 / 40) < 1e-9 and abs(got["glat_ratio"] - 0.5) < 1e-9


def _hyps(out):
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^H-(\d+)\t\S+\t(.*)$", out, re.M)}


@pytest.mark.parametrize("arch_args,gen_args", [
    (["--arch", "glat_tiny", "--criterion", "glat_loss"], ["--iter-decode-with-beam", "3"]),
    (["--arch", "ctc_nat_tiny", "--criterion", "ctc_nat_loss"], []),
], ids=["glat", "glat_ctc"])
def test_train_with_glancing_then_fairseq_generate(toy_databin, tmp_path, arch_args, gen_args):
    save = str(tmp_path / "ckpt")
    proc = run_cli(["fairseq-train", toy_databin[0], "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                    *arch_args, "--glat-ratio-start", "0.5", "--glat-ratio-end", "0.3",
                    "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "800", "--max-update", "3",
                    "--save-dir", save, "--no-epoch-checkpoints", "--num-workers", "0", "--seed", "1",
                    "--log-format", "simple", "--log-interval", "1"])
    log = proc.stdout + proc.stderr
    assert re.search(r"glat_revealed=\d+", log) and re.search(r"glat_ratio=0\.[345]", log), log[-2000:]
    assert re.search(r"glat_share=[01]\.\d+", log), log[-2000:]
    gen = run_cli(["fairseq-generate", toy_databin[0], "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                   "--path", f"{save}/checkpoint_last.pt", "--gen-subset", "test", "--batch-size", "16", "--print-step", *gen_args])
    assert sorted(_hyps(gen.stdout)) == list(range(40)), gen.stdout[-2000:]
    if arch_args[1] == "glat_tiny":  # one decoder pass, whatever --iter-decode-max-iter says
        steps = re.findall(r"^I-\d+\t(\d+)", gen.stdout, re.M)
        assert len(steps) == 40 and set(steps) == {"1"}, gen.stdout[-2000:]
