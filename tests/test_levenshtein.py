"""Levenshtein Transformer: training outputs follow the oracle, decoding, CLI end to end."""
import pytest
import torch

from conftest import build_model_and_task, train_then_generate

import fairseq_nat_ext  # noqa: F401
from fairseq_nat_ext.oracles.levenshtein import levenshtein_oracle

ARCH = ["--arch", "levenshtein_tiny", "--dropout", "0"]


@pytest.fixture(scope="module")
def model_task(toy_databin):
    task, model, _ = build_model_and_task(toy_databin[0], ARCH)
    return model, task


def toy_batch(task, n=6):
    task.load_dataset("valid")
    ds = task.datasets["valid"]
    return ds.collater([ds[i] for i in range(n)])


@pytest.mark.parametrize("rollin", ["paper", "fairseq"])
def test_training_outputs_are_the_oracles_targets(model_task, rollin):
    model, task = model_task
    model.args.levt_rollin = rollin
    model.train()
    sample = toy_batch(task)
    tgt = sample["target"]
    y0 = model.inject_noise(tgt)
    out = model(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"], y0, tgt)
    full = torch.cat([tgt.new_full((tgt.size(0), 1), model.bos), tgt], 1)
    # word_ins: exactly the target tokens missing from the insertion input
    assert out["word_ins"]["out"].shape[0] == out["word_ins"]["tgt"].numel()
    assert set(out["word_ins"]["tgt"].tolist()) <= set(full.flatten().tolist())
    # mask_ins targets + kept tokens rebuild the target length
    m = out["mask_ins"]["mask"]
    kept = m.sum(1) + 1
    assert torch.equal(kept + (out["mask_ins"]["tgt"] * m).sum(1), full.ne(model.pad).sum(1))
    # word_del labels never touch <s>, </s>, padding
    assert out["word_del"]["mask"].sum() >= out["word_del"]["tgt"].sum()
    from fairseq_nat_ext.criterions.nat_base import NATLossBase

    loss = sum(NATLossBase(task).part_loss(k, v)[0] for k, v in out.items())
    loss.backward()
    assert torch.isfinite(loss)


def test_deletion_labels_equal_the_oracle_on_y0_with_alpha_one(model_task):
    model, task = model_task
    model.args.levt_rollin, model.args.levt_alpha = "paper", 1.0
    sample = toy_batch(task)
    tgt = sample["target"]
    y0 = model.inject_noise(tgt)
    out = model(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"], y0, tgt)
    full = torch.cat([tgt.new_full((tgt.size(0), 1), model.bos), tgt], 1)
    assert torch.equal(out["word_del"]["tgt"], levenshtein_oracle(y0, full, model.pad, model.mask_idx).del_labels)
    model.args.levt_alpha = 0.5


def test_rollin_runs_on_the_chosen_rows_only_with_the_same_result(model_task):
    """_replace_rows(base, take, policy) == the policy on the whole batch, rows where take holds
    (eval mode: no dropout), and the policy sees only those rows."""
    from fairseq_nat_ext.models.nat.edit_ops import trim

    model, task = model_task
    model.eval()
    sample = toy_batch(task)
    src, lens, tgt = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"], sample["target"]
    y0 = model.inject_noise(tgt)
    enc = model.encoder(src, src_lengths=lens)
    take = torch.tensor([True, False, True, False, False, True])
    seen = []

    def policy(rows, enc_rows, kv, **kw):
        seen.append(rows.size(0))
        return model._model_insert(rows, enc_rows, kv, **kw)

    cap = 2 * tgt.ne(model.pad).sum(1)
    with torch.no_grad():
        got = model._replace_rows(y0, take, policy, enc, model.decoder.shared_kv(enc), max_len=cap[take])
        full = model._model_insert(y0, enc, max_len=cap)
    assert seen == [int(take.sum())]
    w = max(full.size(1), y0.size(1))
    pad = lambda t: torch.nn.functional.pad(t, (0, w - t.size(1)), value=model.pad)  # noqa: E731
    want = trim(torch.where(take.unsqueeze(1), pad(full), pad(y0)), model.pad)
    assert torch.equal(got, want)
    model.train()


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_paper_rollin_reuses_the_placeholder_pass_on_y0(model_task, monkeypatch, beta):
    """No dropout, every row rolls in (alpha 0): the deletion policy's input is exactly the model's
    own insertion of y0 made by a separate pass; where the insertion policy read y0 itself (beta 0:
    every row), its placeholder pass is reused, so the forward makes 4 decoder passes, not 5; with
    beta 1 the rows the model's deletion changed get their own placeholder pass."""
    from fairseq_nat_ext.models.nat import levenshtein as lev
    from fairseq_nat_ext.models.nat.edit_ops import rows_equal

    model, task = model_task
    model.args.levt_rollin, model.args.levt_alpha, model.args.levt_beta = "paper", 0.0, beta
    seen = []
    oracle = lev.levenshtein_oracle
    monkeypatch.setattr(lev, "levenshtein_oracle", lambda h, t, p, m: seen.append(h.clone()) or oracle(h, t, p, m))
    passes = []
    states = model.decoder.states
    monkeypatch.setattr(model.decoder, "states", lambda *a, **k: passes.append(1) or states(*a, **k))
    sample = toy_batch(task)
    src, lens, tgt = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"], sample["target"]
    torch.manual_seed(3)
    y0 = model.inject_noise(tgt)
    model.train()
    with torch.no_grad():
        model(src, lens, y0, tgt)
        n_passes = len(passes)
        enc = model.encoder(src, src_lengths=lens)
        cap = lev.ROLLIN_MAX_RATIO * (tgt.ne(model.pad).sum(1) + 1)
        want = model._model_insert(y0, enc, max_len=cap)
        ins_in = model._model_delete(y0, enc) if beta else y0
    got = seen[-1]
    assert torch.equal(rows_equal(got, want, model.pad), torch.ones(len(y0), dtype=torch.bool))
    same = rows_equal(ins_in, y0, model.pad)
    # mask_ins + word_ins (+ beta: the model's deletion) + word_del, then the roll-in: rows that
    # reuse the placeholder pass need only their word_ins pass, the others both passes
    assert n_passes == 3 + (1 if beta else 0) + int(same.any()) + 2 * int((~same).any())
    assert same.all() if not beta else True
    model.args.levt_alpha, model.args.levt_beta = 0.5, 0.2


def test_paper_rollin_is_cut_at_twice_the_target_length(model_task, monkeypatch):
    """An untrained placeholder classifier may ask for --max-placeholders in every slot; the
    deletion policy's roll-in input must stay near the target's size (it ran out of memory at
    max-positions-long rows on Multi30K batches)."""
    from fairseq_nat_ext.models.nat import levenshtein as lev

    model, task = model_task
    model.args.levt_rollin, model.args.levt_alpha = "paper", 0.0  # every row rolls in
    top = model.decoder.max_placeholders

    def greedy_max(tokens, encoder_out, normalize=False, kv=None):
        out = torch.zeros(tokens.size(0), tokens.size(1) - 1, top + 1)
        out[..., top] = 1.0
        return out

    monkeypatch.setattr(model.decoder, "forward_mask_ins", greedy_max)
    seen = {}
    oracle = lev.levenshtein_oracle

    def spy(hyp, tgt, pad, mask):
        seen.setdefault("calls", []).append(hyp.clone())
        return oracle(hyp, tgt, pad, mask)

    monkeypatch.setattr(lev, "levenshtein_oracle", spy)
    sample = toy_batch(task)
    tgt = sample["target"]
    y0 = model.inject_noise(tgt)
    with torch.no_grad():
        model(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"], y0, tgt)
    del_in = seen["calls"][-1]  # the deletion policy's input goes through the oracle last
    tgt_len = tgt.ne(model.pad).sum(1) + 1  # with <s>
    assert torch.equal(del_in.ne(model.pad).sum(1), lev.ROLLIN_MAX_RATIO * tgt_len)
    model.args.levt_alpha = 0.5


def test_decoding_runs_rounds_and_traces(model_task):
    model, task = model_task
    from fairseq_nat_ext.generators.levenshtein import EditGenerator

    gen = EditGenerator([model], task.target_dictionary, max_iter=3, retain_history=True)
    hyps = gen.generate([model], toy_batch(task, 4))
    for (h,) in hyps:
        assert h["tokens"][-1] == model.eos and 1 <= h["steps"] <= 3
        assert h["positional_scores"].shape == h["tokens"].shape
        assert set(h["history_ops"]) <= {"delete", "insert", "fill"}


@pytest.mark.slow
def test_cli_train_then_generate(toy_databin, tmp_path):
    proc = train_then_generate(toy_databin[0], tmp_path / "ck",
                               "levenshtein_tiny", "levenshtein_loss", ["--iter-decode-max-iter", "4", "--retain-iter-history"])
    assert proc.stdout.count("\nH-") == 40
