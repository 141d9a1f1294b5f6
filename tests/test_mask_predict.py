"""Mask-Predict maths against slow, obviously-correct references."""
import math

import pytest
import torch

from conftest import build_model_and_task
from fairseq_nat_ext.criterions.nat_base import label_smoothed_nll
from fairseq_nat_ext.generators.mask_predict import (
    MaskPredictGenerator,
    lowest_prob_mask,
    remask_counts,
)
from fairseq_nat_ext.models.nat.mask_predict import content_target, random_mask

PAD, EOS, MASK = 1, 2, 99


def test_content_target_drops_eos():
    t = torch.tensor([[5, 6, 7, EOS], [8, 9, EOS, PAD]])
    assert content_target(t, EOS, PAD).tolist() == [[5, 6, 7, PAD], [8, 9, PAD, PAD]]


def test_random_mask_counts_and_positions():
    torch.manual_seed(0)
    tgt = torch.tensor([[5, 6, 7, 8, 9, 10], [5, 6, PAD, PAD, PAD, PAD], [7, PAD, PAD, PAD, PAD, PAD]])
    seen_counts = {0: set(), 1: set(), 2: set()}
    for _ in range(300):
        out = random_mask(tgt, PAD, MASK)
        assert torch.equal(out.eq(PAD), tgt.eq(PAD)), "padding must never be masked or changed"
        kept = out.ne(MASK) & out.ne(PAD)
        assert torch.equal(out[kept], tgt[kept])
        for b in range(3):
            seen_counts[b].add(int(out[b].eq(MASK).sum()))
    # k ~ U{1..len}: every count from 1 to len occurs, 0 never does
    assert seen_counts[0] == set(range(1, 7))
    assert seen_counts[1] == {1, 2}
    assert seen_counts[2] == {1}


def test_linear_decay_schedule_matches_paper():
    # n = N * (T - t) / T  (Ghazvininejad et al. 2019, eq. in section 3.2), floored
    for N in range(1, 40):
        for T in range(1, 12):
            for t in range(1, T):
                got = int(remask_counts(torch.tensor([N]), t, T)[0])
                assert got == math.floor(N * (T - t) / T)


def _slow_lowest(probs_row, length, n):
    idx = sorted(range(length), key=lambda i: (probs_row[i], i))[:n]
    return set(idx)


def test_lowest_prob_mask_against_slow_reference():
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        probs = torch.rand(4, 9, generator=g).log()
        probs[0, 1] = probs[0, 2]  # a tie: the earlier position goes first
        lengths = torch.randint(1, 10, (4,), generator=g)
        n = (torch.rand(4, generator=g) * lengths).long()
        got = lowest_prob_mask(probs, lengths, n)
        for r in range(4):
            want = _slow_lowest(probs[r].tolist(), int(lengths[r]), int(n[r]))
            assert set(got[r].nonzero().flatten().tolist()) == want


def test_label_smoothed_nll_against_manual():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7)
    tgt = torch.randint(0, 7, (3, 5))
    mask = torch.rand(3, 5) > 0.4
    eps = 0.1
    loss, nll = label_smoothed_nll(logits, tgt, mask, eps)
    terms, nlls = [], []
    for i in range(3):
        for j in range(5):
            if mask[i, j]:
                lp = torch.log_softmax(logits[i, j], -1)
                nlls.append(-lp[tgt[i, j]])
                terms.append((1 - eps) * -lp[tgt[i, j]] + eps * -lp.mean())
    assert torch.allclose(nll, torch.stack(nlls).mean(), atol=1e-6)
    assert torch.allclose(loss, torch.stack(terms).mean(), atol=1e-6)


# ----------------------------------------------------------------------------------------------
# the batched generator against a slow per-candidate loop
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(toy_databin):
    torch.manual_seed(1)
    task, model, _ = build_model_and_task(
        toy_databin[0], ["--arch", "mask_predict_tiny", "--dropout", "0", "--length-classes", "16"]
    )
    model.eval()
    return task, model


@torch.no_grad()
def _slow_mask_predict(model, src, T, l, adaptive):
    """One sentence, one length candidate at a time, plain Python loops."""
    dec, enc = model.decoder, model.encoder
    forbidden = {model.pad, model.bos, model.eos, model.mask_idx}
    src = src.unsqueeze(0)
    eo = enc(src, src_lengths=torch.tensor([src.size(1)]))
    len_lp = dec.forward_length(eo, normalize=True)[0]
    order = sorted(range(len_lp.numel()), key=lambda c: -float(len_lp[c]))[:l]
    cands = []
    for c in order:
        n = int(dec.class_to_length(torch.tensor([[c]]), eo)[0, 0])
        n = max(1, min(n, dec.max_positions() - 2))
        toks = [model.mask_idx] * n
        probs = [0.0] * n
        steps = 0
        last = None
        for t in range(T):
            if t == 0:
                masked = list(range(n))
            else:
                k = math.floor(n * (T - t) / T)
                masked = sorted(range(n), key=lambda i: (probs[i], i))[:k]
                if adaptive and (k == 0 or sorted(masked) == sorted(last)):
                    break  # nothing to re-mask, or the last iteration's input again (a loop)
            last = masked
            inp = list(toks)
            for i in masked:
                inp[i] = model.mask_idx
            lp = dec(torch.tensor([inp]), eo, normalize=True)[0]
            steps += 1
            for i in masked:
                row = lp[i].clone()
                for f in forbidden:
                    row[f] = -float("inf")
                toks[i] = int(row.argmax())
                probs[i] = float(row.max())
        cands.append((sum(probs) / n, toks, steps))
    best = max(range(len(cands)), key=lambda i: (cands[i][0], -i))
    return cands[best][1], cands[best][0], max(c[2] for c in cands)


@pytest.mark.parametrize("bucket_ratio", [0.0, 1.5, 1e9])  # every row alone / grouped / one batch
@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("T,l", [(1, 1), (4, 3), (10, 2)])
def test_generator_matches_slow_reference(tiny, T, l, adaptive, bucket_ratio):
    task, model = tiny
    gen = MaskPredictGenerator([model], task.target_dictionary, max_iter=T, length_beam=l,
                               adaptive=adaptive, bucket_ratio=bucket_ratio)
    torch.manual_seed(5)
    srcs = [torch.randint(4, 20, (n,)) for n in (3, 7, 5, 9)]
    srcs = [torch.cat([s, torch.tensor([model.eos])]) for s in srcs]
    L = max(len(s) for s in srcs)
    batch = torch.full((len(srcs), L), model.pad)
    for i, s in enumerate(srcs):  # left padding, as fairseq's source collater does
        batch[i, L - len(s):] = s
    sample = {"net_input": {"src_tokens": batch, "src_lengths": torch.tensor([len(s) for s in srcs])}}
    hyps = gen.generate([model], sample)
    for i, s in enumerate(srcs):
        toks, score, steps = _slow_mask_predict(model, s, T, l, adaptive)
        h = hyps[i][0]
        assert h["tokens"].tolist() == toks + [model.eos]
        assert abs(float(h["score"]) - score) < 1e-4
        assert h["steps"] == steps
        assert h["positional_scores"].numel() == len(toks) + 1


def test_generator_trace_and_ensemble(tiny):
    task, model = tiny
    src = torch.tensor([[5, 6, 7, 8, model.eos]])
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([5])}}
    gen = MaskPredictGenerator([model], task.target_dictionary, max_iter=3, length_beam=1,
                               adaptive=False, retain_history=True)
    h = gen.generate([model], sample)[0][0]
    assert len(h["history"]) == 3
    first = h["history"][0]
    assert first["input"][:-1].eq(model.mask_idx).all(), "iteration 0 reads an all-<mask> input"
    assert torch.equal(h["history"][-1]["tokens"], h["tokens"])
    # an ensemble of a model with itself decodes exactly like the model alone
    ens = MaskPredictGenerator([model, model], task.target_dictionary, max_iter=3, length_beam=1,
                               adaptive=False)
    h2 = ens.generate([model, model], sample)[0][0]
    assert torch.equal(h2["tokens"], h["tokens"])
    assert abs(float(h2["score"]) - float(h["score"])) < 1e-5


def test_training_loss_projects_only_masked_positions_without_changing_it(tiny):
    task, model = tiny
    torch.manual_seed(2)
    target = torch.randint(4, 20, (3, 6))
    target[:, -1] = model.eos
    prev = model.inject_noise(target)
    src = torch.randint(4, 20, (3, 5))
    out = model(src, torch.tensor([5, 5, 5]), prev, target)["word_ins"]
    loss, _ = label_smoothed_nll(out["out"], out["tgt"], out["mask"], 0.1)
    enc = model.encoder(src, src_lengths=torch.tensor([5, 5, 5]))
    full = model.decoder(prev, enc)  # (B, T, V) for every position
    tgt = content_target(target, model.eos, model.pad)
    ref, _ = label_smoothed_nll(full, tgt, prev.eq(model.mask_idx), 0.1)
    assert out["out"].size(0) == int(prev.eq(model.mask_idx).sum())
    assert torch.allclose(loss, ref, atol=1e-5)
