"""nat_fertility: the copy layer against a slow reference, the decoder's attention masks, the fertility
batches of the task, the losses (token CE, fertility CE, REINFORCE)."""
import os
import warnings

import numpy as np
import pytest
import torch

from conftest import build_model_and_task
from fairseq_nat_ext.compat import InputError
from fairseq_nat_ext.data.fertility import write_fertility_file
from fairseq_nat_ext.models.nat.nat_fertility import copy_by_fertility, no_self_attention_mask


def slow_copy(states, fert, max_len=None):
    rows = []
    for b in range(states.size(0)):
        r = torch.repeat_interleave(states[b], fert[b], dim=0)
        rows.append(r[:max_len] if max_len is not None else r)
    T = max(r.size(0) for r in rows)
    out = states.new_zeros(states.size(0), T, states.size(2))
    for b, r in enumerate(rows):
        out[b, : r.size(0)] = r
    return out, torch.tensor([r.size(0) for r in rows])


@pytest.mark.parametrize("max_len", [None, 4])
def test_copy_layer_matches_slow_reference(max_len):
    g = torch.Generator().manual_seed(0)
    states = torch.randn(6, 7, 5, generator=g)
    fert = torch.randint(0, 4, (6, 7), generator=g)
    fert[2] = 0  # a row without output
    fert[3, :6] = 0  # only the last source position
    out, valid, lengths = copy_by_fertility(states, fert, max_len)
    ref, ref_len = slow_copy(states, fert, max_len)
    assert torch.equal(lengths, ref_len)
    assert out.shape == ref.shape and torch.equal(out, ref)
    assert torch.equal(valid, torch.arange(out.size(1)).unsqueeze(0) < ref_len.unsqueeze(1))


def _pattern(n):
    """A fertility pattern for n source tokens summing to n: 2, 0, 1, 1, ... (or 1 when n == 1)."""
    return [1] if n == 1 else [2, 0] + [1] * (n - 2)


@pytest.fixture(scope="module")
def fert_dir(toy_databin, tmp_path_factory):
    data_bin, raw = toy_databin
    out = tmp_path_factory.mktemp("fert")
    for split in ("train", "valid", "test"):
        with open(os.path.join(raw, f"{split}.src")) as f:  # toy: one token per word, |src| == |tgt|
            write_fertility_file(str(out / f"{split}.fert"), [_pattern(len(line.split())) for line in f])
    return str(out)


@pytest.fixture(scope="module")
def built(toy_databin, fert_dir):
    torch.manual_seed(0)
    task, model, args = build_model_and_task(toy_databin[0], [
        "--arch", "nat_fertility_tiny", "--criterion", "nat_fertility_loss", "--fertility-path", fert_dir,
        "--fertility-reinforce", "--fertility-reinforce-samples", "3", "--dropout", "0"])
    task.load_dataset("train")
    return task, model, args


def _batch(task, model, n=6):
    ds = task.dataset("train")
    batch = ds.collater([ds[i] for i in range(n)])
    return task._noisy(batch, model)


def test_batches_carry_fertilities_aligned_with_the_source(built, toy_databin):
    task, model, _ = built
    batch = _batch(task, model)
    src, fert = batch["net_input"]["src_tokens"], batch["fertility"]
    assert fert.shape == src.shape
    pad, eos = task.source_dictionary.pad(), task.source_dictionary.eos()
    with open(os.path.join(toy_databin[1], "train.src")) as f:
        lines = f.read().splitlines()
    for b, sid in enumerate(batch["id"].tolist()):
        real = src[b].ne(pad)
        expected = _pattern(len(lines[sid].split())) + [0]  # </s> gets 0
        assert fert[b][real].tolist() == expected
        assert fert[b][~real].eq(0).all() and src[b][real][-1] == eos


def test_attention_masks_of_the_decoder_layer(built):
    _, model, _ = built
    layer = model.decoder.layers[0].eval()
    T, B, C = 5, 2, model.decoder.embed_dim
    x = torch.randn(T, B, C)
    mask = no_self_attention_mask(T, x.dtype, x.device)
    out = layer.self_attn(query=x, key=x, value=x, attn_mask=mask, need_weights=False)[0]
    x2 = x.clone()
    x2[2] += 10.0  # change position 2 only
    out2 = layer.self_attn(query=x2, key=x2, value=x2, attn_mask=mask, need_weights=False)[0]
    # its own output ignores its own value: a query never attends to itself ...
    # (its query changed too, so compare with the query held fixed)
    out3 = layer.self_attn(query=x, key=x2, value=x2, attn_mask=mask, need_weights=False)[0]
    assert torch.allclose(out3[2], out[2], atol=1e-5)
    assert not torch.allclose(out2[0], out[0], atol=1e-3)  # ... but every other query sees it
    # a row whose only real position is itself stays finite
    pad = torch.tensor([[False, True, True, True, True], [False] * 5])
    # the padding inside the float mask, (B * heads, T, T), as the decoder passes it
    add = torch.zeros(pad.shape).masked_fill_(pad, float("-inf"))
    mask3 = (mask.unsqueeze(0) + add.unsqueeze(1)).repeat_interleave(layer.self_attn.num_heads, 0)
    one = layer.self_attn(query=x, key=x, value=x, attn_mask=mask3, need_weights=False)[0]
    assert torch.isfinite(one).all()
    # ... and row 1 (no padding) is what the plain mask gives, row 0's position 0 sees only itself
    assert torch.allclose(one[:, 1], out[:, 1], atol=1e-5)
    v = layer.self_attn.out_proj(layer.self_attn.v_proj(x[0, 0]))
    assert torch.allclose(one[0, 0], v, atol=1e-5)
    # positional attention: same hidden states, other positions -> other output
    enc = torch.randn(3, B, model.encoder.embed_tokens.embedding_dim)
    pos = torch.randn(T, B, C)
    y1 = layer(x, enc, None, self_attn_mask=mask, positions=pos)
    y2 = layer(x, enc, None, self_attn_mask=mask, positions=pos.flip(0))
    assert not torch.allclose(y1, y2, atol=1e-4)


def test_decoder_input_is_the_source_copied_by_fertility(built):
    task, model, _ = built
    model.eval()
    batch = _batch(task, model)
    src, fert = batch["net_input"]["src_tokens"], batch["fertility"]
    enc = model.encoder(src, src_lengths=batch["net_input"]["src_lengths"])
    x, valid = model.decoder.copy_source(enc, fert)
    emb = model.encoder.embed_scale * model.encoder.embed_tokens(src)
    ref, lengths = slow_copy(emb, fert)
    assert torch.allclose(x, ref) and torch.equal(valid.sum(1), lengths)
    tgt_len = batch["target"].ne(task.target_dictionary.pad()).sum(1) - 1
    assert torch.equal(lengths, tgt_len)
    assert lengths.min() < lengths.max()  # the batch has padded output rows
    with warnings.catch_warnings():  # e.g. torch's "mismatched key_padding_mask and attn_mask"
        warnings.simplefilter("error")
        with torch.no_grad():
            assert torch.isfinite(model.decoder(enc, fertility=fert)).all()


def test_losses_and_reinforce_gradients(built):
    task, model, args = built
    crit = task.build_criterion(args)
    model.train()
    batch = _batch(task, model)
    torch.manual_seed(1)
    loss, _, log = crit(model, batch)
    for key in ("word_ins-loss", "fertility-loss", "fertility_reinforce-loss"):
        assert key in log and np.isfinite(log[key])
    model.zero_grad()
    loss.backward()
    assert model.decoder.fertility_proj[0].weight.grad.abs().sum() > 0
    assert model.decoder.layers[0].pos_attn.q_proj.weight.grad.abs().sum() > 0
    # the REINFORCE term alone reaches the fertility classifier (and the encoder under it), not the
    # decoder stack
    model.zero_grad()
    inputs = crit.model_inputs(batch)
    out = model(**inputs)
    out["fertility_reinforce"]["loss"].backward()
    assert model.decoder.fertility_proj[2].weight.grad.abs().sum() > 0
    assert model.decoder.layers[0].fc1.weight.grad is None or model.decoder.layers[0].fc1.weight.grad.abs().sum() == 0
    # fertility CE: the weight option scales it
    crit.factors["fertility"] = 0.0
    model.eval()
    with torch.no_grad():
        l0, _, log0 = crit(model, batch)
    assert abs(float(l0) - log0["word_ins-loss"]) < 1e-4


def test_reinforce_reward_is_minus_the_translation_loss(built):
    """Reward of a sampled fertility sequence, against a row-by-row computation: minus the mean over
    max(output, reference length) positions of -log p(reference token) where both exist and log V
    where only one does."""
    import math

    task, model, _ = built
    model.eval()
    batch = _batch(task, model)
    src, src_len = batch["net_input"]["src_tokens"], batch["net_input"]["src_lengths"]
    enc = model.encoder(src, src_lengths=src_len)
    tgt = model.inject_noise(batch["target"])
    ref = batch["fertility"]
    longer = ref.clone()
    longer[ref.gt(0)] += 1
    shorter = ref.clone()
    shorter[:, -2] = 0  # the last source token of every row gets no copy
    samples = torch.cat([ref, longer, shorter])
    with torch.no_grad():
        r = model._sample_rewards(enc, samples, tgt.repeat(3, 1), 3)
    logV = math.log(len(task.target_dictionary))
    pad = task.target_dictionary.pad()
    for n in range(samples.size(0)):
        b = n % src.size(0)
        with torch.no_grad():
            e = model.encoder(src[b:b + 1], src_lengths=src_len[b:b + 1])
            lp = model.decoder(e, fertility=samples[n:n + 1], normalize=True)[0]  # (T_n, V)
        y = tgt[b][tgt[b].ne(pad)]
        k = min(lp.size(0), y.numel())
        loss = -lp[torch.arange(k), y[:k]].sum() + abs(lp.size(0) - y.numel()) * logV
        assert abs(float(r[n]) + float(loss) / max(lp.size(0), y.numel())) < 1e-4


def test_missing_or_wrong_fertilities_are_one_line_errors(built, toy_databin, tmp_path):
    task, model, args = built
    batch = _batch(task, model)
    inputs = task.build_criterion(args).model_inputs(batch)
    inputs["tgt_fertility"] = None
    with pytest.raises(InputError, match="--fertility-path"):
        model(**inputs)
    bad = tmp_path / "fert"
    bad.mkdir()
    with open(os.path.join(toy_databin[1], "train.src")) as f:
        rows = [_pattern(len(line.split())) for line in f]
    rows[2] = rows[2] + [1]
    write_fertility_file(str(bad / "train.fert"), rows)
    task2, _, _ = build_model_and_task(toy_databin[0], [
        "--arch", "nat_fertility_tiny", "--criterion", "nat_fertility_loss", "--fertility-path", str(bad)])
    with pytest.raises(InputError, match=r"train\.fert line 3: \d+ values for \d+ source tokens"):
        task2.load_dataset("train")
    os.remove(bad / "train.fert")
    with pytest.raises(InputError, match=r"train\.fert not found"):
        task2.load_dataset("train")
    task2.load_dataset("valid")  # other splits load without fertilities
    assert "fertility" not in task2.dataset("valid").collater([task2.dataset("valid")[0]])


def test_reinforce_objective_against_a_plain_loop():
    """-mean over samples and sentences of advantage x the summed log-probability of the sampled
    fertilities at the allowed positions."""
    from fairseq_nat_ext.models.nat.nat_fertility import reinforce_objective

    torch.manual_seed(0)
    k, B, S, K = 3, 2, 4, 5
    lp = torch.log_softmax(torch.randn(B, S, K), -1)
    allowed = torch.tensor([[True, True, True, False], [False, True, True, False]])
    samples = torch.randint(0, K, (k, B, S))
    adv = torch.randn(k, B)
    expected = 0.0
    for i in range(k):
        for b in range(B):
            logp = sum(float(lp[b, s, samples[i, b, s]]) for s in range(S) if allowed[b, s])
            expected += -float(adv[i, b]) * logp
    assert abs(float(reinforce_objective(lp, samples, allowed, adv)) - expected / (k * B)) < 1e-5


@pytest.fixture(scope="module")
def teacher_model(toy_databin):
    from test_fertility_npd import _tiny_transformer

    return _tiny_transformer(toy_databin[0], seed=2)


def test_teacher_reward_is_the_teachers_total_log_prob_of_the_decoded_translation(built, teacher_model):
    """teacher_rewards against a row-by-row computation: decode each fertility sequence alone (argmax
    token per position, special symbols excluded), then sum the teacher's log-probabilities of its
    tokens and </s> by the chain rule (one plain teacher call per position)."""
    from test_fertility_npd import _plain_teacher_log_prob

    task, model, _ = built
    d = task.target_dictionary
    model.train()  # the reward decodes with dropout off whatever the mode; the mode is restored
    batch = _batch(task, model, n=4)
    src, src_len = batch["net_input"]["src_tokens"], batch["net_input"]["src_lengths"]
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=src_len)
    ref = batch["fertility"]
    longer = ref.clone()
    longer[ref.gt(0)] += 1
    empty = torch.zeros_like(ref)  # no output token: the teacher scores </s> alone
    fert = torch.cat([ref, longer, empty])
    order = torch.arange(src.size(0)).repeat(3)
    r = model.teacher_rewards(enc, src, src_len, fert, order, teacher=teacher_model)
    assert model.decoder.training
    model.eval()
    banned = [d.pad(), d.bos(), d.eos(), d.index("<mask>")]
    for n in range(fert.size(0)):
        b = int(order[n])
        s = src[b][src[b].ne(d.pad())]
        with torch.no_grad():
            e = model.encoder(s.unsqueeze(0), src_lengths=torch.tensor([s.numel()]))
            if int(fert[n].sum()) == 0:
                y = []
            else:
                logits = model.decoder(e, fertility=fert[n][src[b].ne(d.pad())].unsqueeze(0))[0]
                logits[:, banned] = float("-inf")
                y = logits.argmax(-1).tolist()
        expected = _plain_teacher_log_prob(teacher_model, s, y + [d.eos()], d.eos())
        assert abs(float(r[n]) - expected) < 1e-3, n


def test_teacher_reinforce_uses_the_argmax_fertilities_as_baseline(built, teacher_model, monkeypatch):
    """With --fertility-reinforce-reward teacher the loss is -mean_kb (r(f_kb) - r(argmax_b)) log p(f_kb):
    the rewarded rows are the k samples then the argmax fertilities of every sentence (recorded from the
    reward call), and the loss matches a plain loop over them."""
    task, model, args = built
    d = task.target_dictionary
    model.train()
    batch = _batch(task, model, n=4)
    seen = {}

    def fake_rewards(encoder_out, src_tokens, src_lengths, fert, order, teacher=None):
        seen["fert"], seen["order"] = fert.clone(), order.clone()
        return fert.float().pow(2).sum(1) * 0.1 - fert.float().sum(1)  # any function of the fertilities

    monkeypatch.setattr(model, "teacher_rewards", fake_rewards)
    monkeypatch.setattr(model.args, "fertility_reinforce_reward", "teacher")
    inputs = task.build_criterion(args).model_inputs(batch)
    torch.manual_seed(4)
    out = model(**inputs)
    loss = float(out["fertility_reinforce"]["loss"])
    k, B = 3, batch["net_input"]["src_tokens"].size(0)
    fert, order = seen["fert"], seen["order"]
    assert fert.size(0) == (k + 1) * B and order.tolist() == list(range(B)) * (k + 1)
    src = batch["net_input"]["src_tokens"]
    allowed = src.ne(d.pad()) & src.ne(d.eos())
    with torch.no_grad():
        lp = model.decoder.forward_fertility(model.encoder(src, src_lengths=batch["net_input"]["src_lengths"]),
                                             normalize=True)
    assert torch.equal(fert[k * B:], lp.argmax(-1).masked_fill(~allowed, 0))  # the baseline rows
    reward = fake_rewards(None, None, None, fert, order)
    expected = 0.0
    for i in range(k):
        for b in range(B):
            f = fert[i * B + b]
            logp = sum(float(lp[b, s, f[s]]) for s in range(src.size(1)) if allowed[b, s])
            expected += -(float(reward[i * B + b]) - float(reward[k * B + b])) * logp
    assert abs(loss - expected / (k * B)) < 1e-3 * max(1.0, abs(loss))


def test_teacher_reward_needs_a_teacher_and_is_not_part_of_the_model(built, toy_databin, tmp_path, monkeypatch):
    from test_fertility_e2e import save_tiny_teacher

    task, model, args = built
    batch = _batch(task, model, n=2)
    inputs = task.build_criterion(args).model_inputs(batch)
    model.train()
    monkeypatch.setattr(model.args, "fertility_reinforce_reward", "teacher")
    monkeypatch.setattr(model.args, "fertility_teacher", None, raising=False)
    with pytest.raises(InputError, match="needs --fertility-teacher"):
        model(**inputs)
    monkeypatch.setattr(model.args, "fertility_reinforce_reward", "bleu")
    with pytest.raises(InputError, match="must be one of reference, teacher"):
        model(**inputs)
    monkeypatch.setattr(model.args, "fertility_reinforce_reward", "teacher")
    monkeypatch.setattr(model.args, "fertility_teacher", save_tiny_teacher(toy_databin[0], str(tmp_path / "t.pt")))
    keys = set(model.state_dict())
    out = model(**inputs)
    assert torch.isfinite(out["fertility_reinforce"]["loss"])
    assert set(model.state_dict()) == keys  # the teacher is neither saved nor trained
    assert all(not p.requires_grad for p in model.__dict__["_fertility_teacher"].parameters())
    model.__dict__.pop("_fertility_teacher")
