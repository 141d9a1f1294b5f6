"""iterative_refinement: each corruption noise does exactly what it says; the uniform copy; training
passes (Y(t+1) from Y(t), denoising inputs); adaptive decoding."""
import math

import pytest
import torch

from conftest import build_model_and_task
from fairseq_nat_ext.models.nat.corruption import corrupt, random_replace, repeat_next, swap_next
from fairseq_nat_ext.models.nat.iterative_refinement import uniform_copy_index

PAD = 1


def _rows(n=200, T=9, seed=0):
    """Rows of distinct tokens (so every change can be identified) with random lengths 1..T."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.arange(10, 10 + T).repeat(n, 1) + 100 * torch.arange(n).unsqueeze(1)
    lengths = torch.randint(1, T + 1, (n,), generator=g)
    content = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    return tokens.masked_fill(~content, PAD), content


def test_random_replace():
    tokens, content = _rows()
    vocab = torch.arange(50000, 50100)  # disjoint from the rows' tokens
    out = random_replace(tokens, content, 0.3, vocab, torch.Generator().manual_seed(1))
    changed = out != tokens
    assert not changed[~content].any(), "padding never changes"
    assert ((out[changed] >= 50000) & (out[changed] < 50100)).all(), "replacements come from vocab"
    assert 0.25 < changed[content].float().mean() < 0.35
    assert torch.equal(random_replace(tokens, content, 0.0, vocab), tokens)
    full = random_replace(tokens, content, 1.0, vocab)
    assert (full[content] >= 50000).all()


def test_repeat_next():
    tokens, content = _rows()
    out = repeat_next(tokens, content, 0.4, torch.Generator().manual_seed(2))
    nxt = torch.cat([tokens[:, 1:], tokens[:, -1:]], 1)
    last = content & ~torch.cat([content[:, 1:], torch.zeros_like(content[:, :1])], 1)
    changed = out != tokens
    assert torch.equal(out[changed], nxt[changed]), "a changed token is its right neighbour (from the input)"
    assert not changed[last | ~content].any(), "the last token and padding never change"
    inner = content & ~last
    assert 0.33 < changed[inner].float().mean() < 0.47
    # p = 1: every token but the last becomes its right neighbour
    full = repeat_next(torch.tensor([[5, 6, 7, 8, PAD]]), torch.tensor([[True] * 4 + [False]]), 1.0)
    assert full.tolist() == [[6, 7, 8, 8, PAD]]


def _undo_swaps(row, orig):
    """Walk left to right: every position is unchanged or the first of a swapped adjacent pair;
    returns the number of swaps, or None when the row is anything else."""
    t, swaps = 0, 0
    while t < len(row):
        if row[t] == orig[t]:
            t += 1
        elif t + 1 < len(row) and row[t] == orig[t + 1] and row[t + 1] == orig[t]:
            swaps, t = swaps + 1, t + 2
        else:
            return None
    return swaps


def test_swap_next():
    tokens, content = _rows()
    out = swap_next(tokens, content, 0.4, torch.Generator().manual_seed(3))
    total = 0
    for b in range(tokens.size(0)):
        n = int(content[b].sum())
        swaps = _undo_swaps(out[b, :n].tolist(), tokens[b, :n].tolist())
        assert swaps is not None, (out[b], tokens[b])
        total += swaps
        assert out[b, n:].eq(PAD).all()
    assert total > 100
    # p = 1: runs of draws swap at a, a+2, ... (pairs never overlap); the last token has no neighbour
    full = swap_next(torch.tensor([[5, 6, 7, 8, 9, PAD]]), torch.tensor([[True] * 5 + [False]]), 1.0)
    assert full.tolist() == [[6, 5, 8, 7, 9, PAD]]


def test_corrupt_composes_the_three_in_order():
    tokens, content = _rows(50)
    vocab = torch.arange(50000, 50100)
    for kw, fn in (({"p_replace": 0.5}, lambda t, g: random_replace(t, content, 0.5, vocab, g)),
                   ({"p_repeat": 0.5}, lambda t, g: repeat_next(t, content, 0.5, g)),
                   ({"p_swap": 0.5}, lambda t, g: swap_next(t, content, 0.5, g))):
        a = corrupt(tokens, content, vocab, generator=torch.Generator().manual_seed(4), **kw)
        b = fn(tokens, torch.Generator().manual_seed(4))
        assert torch.equal(a, b), kw
    assert torch.equal(corrupt(tokens, content, vocab), tokens)


def test_uniform_copy_index():
    idx = uniform_copy_index(torch.tensor([3, 5, 1]), torch.tensor([6, 2, 3]), 6)
    assert idx.tolist() == [[0, 0, 1, 1, 2, 2], [1, 3, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]


@pytest.fixture(scope="module")
def built(toy_databin):
    torch.manual_seed(0)
    task, model, args = build_model_and_task(toy_databin[0], [
        "--arch", "iterative_refinement_tiny", "--criterion", "iterative_refinement_loss",
        "--train-refine-steps", "3", "--dropout", "0"])
    task.load_dataset("train")
    return task, model, args


def _record_inputs(model):
    seen = []
    orig = model.decoder.forward

    def rec(prev, enc, **kw):
        out = orig(prev, enc, **kw)
        seen.append((prev.clone(), kw.get("copy_source", False), out.detach()))
        return out

    model.decoder.forward = rec
    return seen


def test_training_passes(built):
    task, model, args = built
    ds = task.dataset("train")
    batch = task._noisy(ds.collater([ds[i] for i in range(6)]), model)
    crit = task.build_criterion(args)
    tgt = model.inject_noise(batch["target"])
    model.train()
    seen = _record_inputs(model)
    try:
        # deterministic refinement: pass l + 1 reads the argmax of pass l
        model.args.dae_ratio = 0.0
        loss, _, log = crit(model, batch)
        assert [c for _, c, _ in seen] == [True, False, False]
        assert seen[0][0].eq(model.mask_idx).sum() == tgt.ne(1).sum()
        for (prev, _, out), (nxt, _, _) in zip(seen, seen[1:]):
            lp = out.float().clone()
            lp[..., [0, 1, 2, model.mask_idx]] = float("-inf")
            assert torch.equal(nxt, lp.argmax(-1).masked_fill(tgt.eq(1), 1))
        assert all(f"word_ins_{i}-loss" in log for i in range(3)) and "length-loss" in log
        # every pass' loss is finite: the argmax for the next pass must not write -inf into the
        # logits the loss reads (it did, through .float() of a float32 tensor: the same tensor)
        assert all(math.isfinite(v) for k, v in log.items() if k.endswith("loss")), log
        loss.backward()
        # denoising only, without noise: the refinement passes read the reference itself
        seen.clear()
        model.args.dae_ratio = 1.0
        model.args.corrupt_replace = model.args.corrupt_repeat = model.args.corrupt_swap = 0.0
        crit(model, batch)
        assert torch.equal(seen[1][0], tgt) and torch.equal(seen[2][0], tgt)
        # with noise: the inputs are corruptions of the reference (same padding)
        seen.clear()
        model.args.corrupt_swap = 0.5
        crit(model, batch)
        assert seen[1][0].ne(1).eq(tgt.ne(1)).all() and not torch.equal(seen[1][0], tgt)
        # evaluation mode: never the corrupted reference
        seen.clear()
        model.eval()
        crit(model, batch)
        assert not torch.equal(seen[1][0], tgt)
    finally:
        del model.decoder.forward
        model.args.dae_ratio, model.args.corrupt_swap = 0.5, 0.1
        model.args.corrupt_replace = model.args.corrupt_repeat = 0.1


@pytest.mark.parametrize("adaptive", [True, False])
def test_decoding_stops_when_the_output_no_longer_changes(built, adaptive):
    task, model, _ = built
    from fairseq_nat_ext.generators.iterative_refinement import RefinementGenerator

    model.eval()
    task.load_dataset("test")
    ds = task.dataset("test")
    sample = ds.collater([ds[i] for i in range(16)])
    gen = RefinementGenerator([model], task.target_dictionary, max_iter=6, length_beam=1, adaptive=adaptive,
                              retain_history=True)
    hyps = gen.generate([model], sample)
    stopped_early = 0
    for h in hyps:
        h = h[0]
        hist = [x["tokens"].tolist() for x in h["history"]]
        assert len(hist) == h["steps"] <= 6 and hist[-1] == h["tokens"].tolist()
        if adaptive:
            # no pass before the last left its input unchanged; the last one did, or it hit the cap
            assert all(a != b for a, b in zip(hist[:-2], hist[1:-1]))
            assert h["steps"] == 6 or (len(hist) >= 2 and hist[-1] == hist[-2])
            stopped_early += h["steps"] < 6
        else:
            assert h["steps"] == 6
    if adaptive:
        assert stopped_early > 0
    # one pass only: the initial pass from the copied source
    one = RefinementGenerator([model], task.target_dictionary, max_iter=1).generate([model], sample)
    assert all(h[0]["steps"] == 1 for h in one)
    assert [h[0]["history"][0]["tokens"].tolist() for h in hyps] == [h[0]["tokens"].tolist() for h in one]


def test_batched_decoding_matches_a_sentence_by_sentence_reference(built):
    """The generator against a slow loop: one sentence at a time, argmax length, pass 1 from the copied
    source, then refine until a pass returns its input or max_iter passes."""
    task, model, _ = built
    from fairseq_nat_ext.generators.iterative_refinement import RefinementGenerator

    model.eval()
    task.load_dataset("test")
    ds = task.dataset("test")
    sample = ds.collater([ds[i] for i in range(12)])
    hyps = RefinementGenerator([model], task.target_dictionary, max_iter=5).generate([model], sample)
    d = task.target_dictionary
    forbidden = [d.pad(), d.bos(), d.eos(), model.mask_idx]
    src, src_len = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    with torch.enable_grad():  # the decoder's own layer loop, not the decoding forward the generator uses
        for b in range(src.size(0)):
            row = src[b][src[b].ne(d.pad())].unsqueeze(0)
            enc = model.encoder(row, src_lengths=src_len[b:b + 1])
            n = int(model.decoder.class_to_length(model.decoder.forward_length(enc).argmax(-1, keepdim=True), enc))
            n = max(1, min(n, model.decoder.max_positions() - 2))
            y, steps, first = torch.full((1, n), model.mask_idx), 0, True
            while steps < 5:
                lp = model.decoder(y, enc, normalize=True, copy_source=first).detach()
                lp[..., forbidden] = float("-inf")
                new = lp.argmax(-1)
                steps += 1
                done = not first and torch.equal(new, y)
                y, first = new, False
                if done:
                    break
            assert hyps[b][0]["tokens"].tolist() == y[0].tolist() + [d.eos()], b
            assert hyps[b][0]["steps"] == steps


@pytest.mark.parametrize("adaptive", [True, False])
def test_cached_single_model_path_equals_the_ensemble_path(built, adaptive):
    """One model decodes through cached keys/values and best_vocab_tokens; an ensemble of the model
    with itself through the per-row encoder output and full log-probs: the same hypotheses, length
    beam and early stopping included."""
    task, model, _ = built
    from fairseq_nat_ext.generators.iterative_refinement import RefinementGenerator

    model.eval()
    task.load_dataset("test")
    ds = task.dataset("test")
    sample = ds.collater([ds[i] for i in range(10)])
    one = RefinementGenerator([model], task.target_dictionary, max_iter=4, length_beam=3,
                              adaptive=adaptive).generate([model], sample)
    two = RefinementGenerator([model, model], task.target_dictionary, max_iter=4, length_beam=3,
                              adaptive=adaptive).generate([model, model], sample)
    for a, b in zip(one, two):
        assert a[0]["tokens"].tolist() == b[0]["tokens"].tolist()
        assert a[0]["steps"] == b[0]["steps"]
        assert torch.allclose(a[0]["positional_scores"], b[0]["positional_scores"], atol=1e-4)


def test_a_cached_pass_over_some_rows_reads_their_sentences_keys_and_values(built):
    """Rows that stay in the batch map to their sentences (``order[active]``): the cached pass equals
    the pass over the encoder output reordered to those rows."""
    task, model, _ = built
    from fairseq_nat_ext.generators.iterative_refinement import RefinementGenerator
    from fairseq_nat_ext.modules import cpu_linear
    from fairseq_nat_ext.modules import nat_decoder_inference as fast

    model.eval()
    task.load_dataset("test")
    ds = task.dataset("test")
    sample = ds.collater([ds[i] for i in range(4)])
    net = sample["net_input"]
    gen = RefinementGenerator([model], task.target_dictionary)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad(), cpu_linear.decoding([model]):
        enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
        order = torch.arange(4).repeat_interleave(2)  # 2 length candidates per sentence
        active = torch.tensor([7, 0, 3, 4])
        inp = torch.randint(4, 20, (4, 6), generator=g)
        inp[1, 4:] = inp[3, 2:] = task.target_dictionary.pad()
        cached = gen._pass([model], [enc], inp, first=False, cached=(fast.cross_kv(model.decoder, enc), order[active]))
        plain = gen._pass([model], [model.encoder.reorder_encoder_out(enc, order[active])], inp, first=False)
    assert torch.equal(cached[0], plain[0])
    assert torch.allclose(cached[1], plain[1], atol=1e-5)
