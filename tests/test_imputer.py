"""Imputer: block masking, block decoding, the imputer loss against explicit sums over alignments."""
import argparse
import math

import pytest
import torch

from conftest import build_model_and_task
from fairseq_nat_ext.criterions.imputer_loss import ImputerLoss
from fairseq_nat_ext.generators.ctc_nat import ctc_greedy
from fairseq_nat_ext.generators.imputer import ImputerGenerator, block_fill_positions
from fairseq_nat_ext.models.nat.imputer import block_mask
from fairseq_nat_ext.oracles.ctc_alignment import ctc_best_alignment, ctc_collapse
from test_ctc_oracle import alignments_of, slow_restricted_nll


def test_block_mask_masks_the_same_count_in_every_block():
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([16, 13, 3, 8, 1])
    seen = {b: set() for b in range(5)}
    for _ in range(200):
        m = block_mask(lengths, 16, 4, generator=g)
        assert not m[torch.arange(16).unsqueeze(0) >= lengths.unsqueeze(1)].any(), "nothing beyond length"
        for b, n in enumerate(lengths.tolist()):
            counts = [int(m[b, k: min(k + 4, n)].sum()) for k in range(0, n, 4)]
            sizes = [min(4, n - k) for k in range(0, n, 4)]
            c = counts[0] if sizes[0] == 4 else None
            for cnt, size in zip(counts, sizes):
                assert 1 <= cnt <= size
                if size == 4:
                    assert cnt == c, "one count c per sentence for every full block"
                elif c is not None:
                    assert cnt == min(c, size)
            seen[b].add(counts[0])
    assert seen[0] == {1, 2, 3, 4} and seen[2] == {1, 2, 3} and seen[4] == {1}


def test_block_fill_positions_picks_the_most_confident_masked_position_per_block():
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        conf = torch.randn(3, 11, generator=g)
        masked = torch.rand(3, 11, generator=g) < 0.6
        pick = block_fill_positions(conf, masked, 4)
        for b in range(3):
            for k in range(0, 11, 4):
                blk = range(k, min(k + 4, 11))
                cands = [i for i in blk if masked[b, i]]
                chosen = [i for i in blk if pick[b, i]]
                if not cands:
                    assert chosen == []
                else:
                    assert chosen == [max(cands, key=lambda i: (conf[b, i].item(), -i))]


@pytest.fixture(scope="module")
def imputer(toy_databin):
    torch.manual_seed(0)
    task, model, args = build_model_and_task(
        toy_databin[0], ["--arch", "imputer_tiny", "--criterion", "imputer_loss", "--upsample-ratio", "2"])
    return task, model.eval(), args


def _batch(task, seqs):
    d = task.source_dictionary
    T = max(len(s) for s in seqs) + 1
    src = torch.tensor([[d.pad()] * (T - len(s) - 1) + s + [d.eos()] for s in seqs])
    return {"net_input": {"src_tokens": src, "src_lengths": src.ne(d.pad()).sum(1)}}


@pytest.mark.parametrize("B", [1, 2, 3, 4])
def test_block_decoding_fills_one_position_per_block_per_step_and_takes_B_steps(imputer, B):
    task, model, _ = imputer
    seqs = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [15, 16]]
    gen = ImputerGenerator([model], task.target_dictionary, block=B, retain_history=True)
    hyps = gen.generate([model], _batch(task, seqs))
    mask = model.mask_idx
    for b, s in enumerate(seqs):
        L = 2 * (len(s) + 1)
        h = hyps[b][0]
        assert h["steps"] == B and len(h["history"]) == B
        prev = torch.full((L,), mask)
        for step in h["history"]:
            cur = step["tokens"]
            changed = (prev == mask) & (cur != mask)
            assert torch.equal(changed, step["filled"])
            assert torch.equal(cur[~changed], prev[~changed]), "filled positions are never revised"
            for k in range(0, L, B):
                had_mask = bool((prev[k: k + B] == mask).any())
                assert int(changed[k: k + B].sum()) == (1 if had_mask else 0)
            prev = cur
        assert not (prev == mask).any(), "complete after B steps"
        toks, n, _ = ctc_collapse(prev.unsqueeze(0), torch.tensor([L]), model.blank_idx, model.pad)
        assert h["tokens"][:-1].tolist() == toks[0, : int(n[0])].tolist()
        assert h["tokens"][-1].item() == task.target_dictionary.eos()


def test_block_one_is_ctc_greedy_from_an_all_mask_input(imputer):
    task, model, _ = imputer
    seqs = [[5, 6, 7], [8, 9, 10, 11]]
    sample = _batch(task, seqs)
    gen = ImputerGenerator([model], task.target_dictionary, block=1)
    hyps = gen.generate([model], sample)
    with torch.no_grad():
        lp, lengths = model.alignment_lprobs(**sample["net_input"])
    lp[..., gen.forbidden] = float("-inf")
    toks, n, _, _ = ctc_greedy(lp, lengths, model.blank_idx, model.pad)
    for b in range(2):
        assert hyps[b][0]["tokens"][:-1].tolist() == toks[b, : int(n[b])].tolist()
        assert hyps[b][0]["steps"] == 1


def test_imputer_alignment_is_the_viterbi_alignment_of_its_own_all_mask_prediction(imputer):
    task, model, _ = imputer
    sample = _batch(task, [[5, 6, 7], [8, 9]])
    pad = model.pad
    tgt = torch.tensor([[20, 21, 21, 22], [23, pad, pad, pad]])
    tl = tgt.ne(pad).sum(1)
    model.train()
    align = model.impute_alignment(**sample["net_input"], tgt=tgt, tgt_lengths=tl)
    assert model.training, "the training mode is restored"
    model.eval()
    with torch.no_grad():
        lp, lengths = model.alignment_lprobs(**sample["net_input"])
    want, _ = ctc_best_alignment(lp, lengths, tgt, tl, model.blank_idx, pad=pad)
    assert torch.equal(align, want)
    toks, n, _ = ctc_collapse(align, lengths, model.blank_idx, pad)
    assert toks[0, :4].tolist() == [20, 21, 21, 22] and toks[1, : int(n[1])].tolist() == [23]


def _part(lp, alignment, masked, lengths, targets, target_lengths, feasible, blank):
    return {"ctc_lprobs": lp, "alignment": alignment, "masked": masked, "input_lengths": lengths,
            "targets": targets, "target_lengths": target_lengths, "feasible": feasible, "blank": blank}


def test_imputer_loss_equals_explicit_sums_over_consistent_alignments():
    g = torch.Generator().manual_seed(5)
    V, T, BLANK, PAD = 4, 6, 0, 9
    task = argparse.Namespace(target_dictionary=None)
    marginal = ImputerLoss.__new__(ImputerLoss)
    ImputerLoss.__init__(marginal, task, label_smoothing=0.0, imputer_loss="marginal")
    best = ImputerLoss.__new__(ImputerLoss)
    ImputerLoss.__init__(best, task, label_smoothing=0.0, imputer_loss="best_alignment")
    targets_list = [[1, 2], [3, 3], [1, 2, 3], [2, 2, 2, 2]]  # the last needs 7 > 6 positions
    lengths = torch.tensor([6, 5, 6, 6])
    targets = torch.full((4, 4), PAD)
    for i, t in enumerate(targets_list):
        targets[i, : len(t)] = torch.tensor(t)
    tl = torch.tensor([len(t) for t in targets_list])
    lp = torch.randn(4, T, V, generator=g, dtype=torch.float64).log_softmax(-1)
    lp_train = lp.clone().requires_grad_(True)
    align = torch.full((4, T), PAD)
    for i, t in enumerate(targets_list[:3]):
        cands = alignments_of(t, int(lengths[i]), V)
        align[i, : int(lengths[i])] = torch.tensor(cands[int(torch.randint(len(cands), (1,), generator=g))])
    inside = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    masked = (torch.rand(4, T, generator=g) < 0.5) & inside
    masked[:, 0] = True
    feasible = torch.tensor([True, True, True, False])
    part = _part(lp_train, align, masked, lengths, targets, tl, feasible, BLANK)
    loss, nll, log = marginal.part_loss("imputer", part)
    assert log == {"ctc_filtered": 1, "ctc_pairs": 4}
    want = sum(slow_restricted_nll(lp[i, : int(lengths[i])], targets_list[i], align[i].tolist(),
                                   (~masked[i]).tolist()) for i in range(3))
    n_masked = int(masked[:3].sum())
    assert math.isclose(loss.item(), want / n_masked, rel_tol=1e-9)
    loss.backward()
    assert torch.isfinite(lp_train.grad).all()
    assert (lp_train.grad[~masked] == 0).all(), "observed positions get no gradient"
    # cross-entropy on the best alignment's masked positions
    loss2, _, _ = best.part_loss("imputer", part)
    ce = -sum(lp[i, t, align[i, t]].item() for i in range(3) for t in range(T) if masked[i, t])
    assert math.isclose(loss2.item(), ce / n_masked, rel_tol=1e-6)  # nat_base computes in float32


def test_imputer_training_step_both_losses(imputer, toy_databin):
    task, model, args = imputer
    d = task.target_dictionary
    sample = _batch(task, [[5, 6, 7], [8, 9, 10, 11]])
    tgt = torch.tensor([[20, 21, 22, d.eos(), d.pad()], [23, 23, 24, 25, d.eos()]])
    sample.update(target=tgt, prev_target=tgt, ntokens=int(tgt.ne(d.pad()).sum()))
    model.train()
    for kind in ("marginal", "best_alignment"):
        crit = ImputerLoss(task, label_smoothing=0.1, imputer_loss=kind)
        model.zero_grad()
        loss, _, log = crit(model, sample)
        assert torch.isfinite(loss) and log["ctc_filtered"] == 0
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g_).all() for g_ in grads)
    model.eval()


def test_an_imputer_ensembled_with_itself_decodes_like_itself(imputer):
    task, model, _ = imputer
    sample = _batch(task, [[5, 6, 7, 8], [9, 10]])
    one = ImputerGenerator([model], task.target_dictionary, block=2).generate([model], sample)
    two = ImputerGenerator([model, model], task.target_dictionary, block=2).generate([model, model], sample)
    for a, b in zip(one, two):
        assert a[0]["tokens"].tolist() == b[0]["tokens"].tolist()
        assert torch.allclose(a[0]["positional_scores"], b[0]["positional_scores"], atol=1e-5)


def _reference_block_decoding(model, sample, B, forbidden):
    """Block decoding from its definition, one sentence at a time with the decoder's training-time
    forward (fairseq's layer loop, whole log-softmax): each step, in every block holding masked
    positions, the masked position whose best symbol is the most probable gets that symbol.
    -> per sentence (final alignment, sum of the filled symbols' log-probs)."""
    out = []
    net = sample["net_input"]
    with torch.enable_grad():  # the decoder's own layer loop, not the inference forward
        enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
        up, lengths = model.decoder.upsample(enc)
        for b in range(up.size(0)):
            L = int(lengths[b])
            enc_b = model.encoder.reorder_encoder_out(enc, torch.tensor([b]))
            align, total = [model.mask_idx] * L, 0.0
            for _ in range(B):
                if model.mask_idx not in align:
                    break
                lp = model.decoder(enc_b, alignment=torch.tensor([align]), normalize=True,
                                   upsampled=(up[b:b + 1, :L], lengths[b:b + 1])).detach()[0]
                lp[:, forbidden] = float("-inf")
                best_lp, best = lp.max(-1)
                new = list(align)
                for k in range(0, L, B):
                    cands = [i for i in range(k, min(k + B, L)) if align[i] == model.mask_idx]
                    if cands:
                        i = max(cands, key=lambda i: (best_lp[i].item(), -i))
                        new[i] = int(best[i])
                        total += best_lp[i].item()
                align = new
            out.append((align, total))
    return out


@pytest.mark.parametrize("B", [2, 3])
def test_block_decoding_equals_a_plain_loop_over_its_definition(imputer, B):
    task, model, _ = imputer
    seqs = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    sample = _batch(task, seqs)
    gen = ImputerGenerator([model], task.target_dictionary, block=B)
    hyps = gen.generate([model], sample)
    want = _reference_block_decoding(model, sample, B, gen.forbidden)
    for h, (align, total) in zip(hyps, want):
        assert h[0]["final_alignment"].tolist() == align
        # the log-probs the filled symbols had, spread over the output tokens: their sum is kept
        assert abs(h[0]["positional_scores"].sum().item() - total) < 1e-3
