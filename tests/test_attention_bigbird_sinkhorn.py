"""BigBird's random blocks (redrawn like the released code, not dropped) and Sinkhorn's sorting network
(psi with Gumbel noise in training), against plain-loop statements of what they should be."""
import math
from dataclasses import replace

import pytest
import torch

import fairseq_nat_ext  # noqa: F401
from fairseq_nat_ext.modules.attention import AttentionOptions, build_attention, layer_options


# ---------------------------------------------------------------- bigbird
def bigbird(H=4, **kw):
    opts = dict(block_size=2, bigbird_window_blocks=3, bigbird_global_blocks=2, bigbird_random_blocks=3,
                max_positions=128)
    opts.update(kw)
    return build_attention("bigbird", H, 8, AttentionOptions(**opts)).eval()


def candidates(i, real_blocks, opts):
    """Key blocks a random block of query block i may be: real, not global, not in the window."""
    half = opts.bigbird_window_blocks // 2
    return {j for j in range(real_blocks) if j >= opts.bigbird_global_blocks and abs(j - i) > half}


def check_random_blocks(mod, lengths, nb):
    """Every (sequence, head, real query block): exactly min(r, #candidates) valid random blocks, distinct,
    all candidates; returns how many rows had fewer candidates than r."""
    o = mod.opts
    r = o.bigbird_random_blocks
    idx, valid = mod.block_table(lengths, nb)
    assert idx.shape == valid.shape == (len(lengths), mod.num_heads, nb,
                                        o.bigbird_window_blocks + o.bigbird_global_blocks + r)
    first = o.bigbird_window_blocks + o.bigbird_global_blocks  # the random blocks come last
    short = 0
    for b, n in enumerate(lengths.tolist()):
        R = -(-n // o.block_size)
        for h in range(mod.num_heads):
            for i in range(R):
                cand = candidates(i, R, o)
                got = [int(j) for j, ok in zip(idx[b, h, i, first:], valid[b, h, i, first:]) if ok]
                assert len(got) == min(r, len(cand)), (b, h, i, got, cand)
                assert len(set(got)) == len(got) and set(got) <= cand, (b, h, i, got, cand)
                if len(cand) <= r:
                    assert set(got) == cand
                    short += 1
    return short


def test_bigbird_every_row_gets_r_distinct_random_candidates():
    mod = bigbird()
    lengths = torch.tensor([128, 97, 41, 30])  # 64, 49, 21, 15 real blocks
    assert check_random_blocks(mod, lengths, 64) == 0, "every row has more than r candidates here"


@pytest.mark.parametrize("kw,lengths,nb", [
    (dict(), [9, 7, 3], 5),  # 5, 4, 2 real blocks: 0..1 candidates per row
    (dict(bigbird_random_blocks=8, bigbird_global_blocks=1), [40, 13], 20),  # r above the candidates of short rows
    (dict(bigbird_random_blocks=6, bigbird_window_blocks=1, bigbird_global_blocks=0), [8, 5], 4),  # r > nb
    (dict(bigbird_random_blocks=0), [20], 10),
])
def test_bigbird_rows_with_few_candidates_get_exactly_all_of_them(kw, lengths, nb):
    mod = bigbird(**kw)
    short = check_random_blocks(mod, torch.tensor(lengths), nb)
    assert short > 0 or mod.opts.bigbird_random_blocks == 0


def test_bigbird_random_blocks_depend_on_the_real_blocks_only():
    """The same sequence alone (nb = its blocks) and in a padded batch (nb larger): the same table rows."""
    mod = bigbird()
    idx, valid = mod.block_table(torch.tensor([37, 128, 3]), 64)
    alone_idx, alone_valid = mod.block_table(torch.tensor([37]), 19)
    assert torch.equal(alone_valid[0], valid[0, :, :19])
    assert torch.equal(alone_idx[0] * alone_valid[0], idx[0, :, :19] * valid[0, :, :19])  # the valid entries


def test_bigbird_half_precision_module_keeps_the_same_random_blocks():
    """.to(bfloat16) / .half() would round the ranks of a row beyond 256 blocks into ties: kept exact."""
    mod = bigbird(max_positions=1200)  # 600 blocks
    lengths = torch.tensor([1200, 901])
    idx, valid = mod.block_table(lengths, 600)
    for dtype in (torch.bfloat16, torch.float16):
        low = bigbird(max_positions=1200).to(dtype)
        assert torch.equal(low.block_table(lengths, 600)[0], idx) and torch.equal(low.block_table(lengths, 600)[1], valid)


def test_bigbird_patterns_are_fixed_per_layer_and_differ_between_layers():
    opts = AttentionOptions(block_size=2, bigbird_random_blocks=3, max_positions=128)
    lengths = torch.tensor([128, 77])

    def table(layer, seed=1):
        mod = build_attention("bigbird", 4, 8, layer_options(replace(opts, attention_seed=seed), layer))
        return mod.block_table(lengths, 64)[0][..., -3:]

    assert torch.equal(table(0), table(0)) and torch.equal(table(3), table(3)), "same layer: same table"
    tables = [table(layer) for layer in range(4)] + [table(0, seed=2)]
    for a in range(len(tables)):
        for b in range(a):
            assert (tables[a] != tables[b]).float().mean() > 0.5, f"tables {a} and {b} mostly equal"


@pytest.mark.parametrize("r,real", [(1, 16), (3, 16), (3, 11)])
def test_bigbird_random_blocks_are_uniform_over_the_candidates(r, real):
    """Over 3000 heads, each (query block, key block) candidate is drawn about r / #candidates of the time;
    a chi-square per query block (window and global blocks never drawn).  Fixed seeds: the table is a fixed
    function, so this cannot flake; the bound (mean chi-square per degree of freedom under 1.5, every
    query block under 3) fails a biased draw (e.g. one that favours near or low blocks) by far."""
    H, nb = 3000, 16
    mod = bigbird(H=H, bigbird_random_blocks=r, bigbird_window_blocks=3, bigbird_global_blocks=1,
                  max_positions=2 * nb)
    idx, valid = mod.block_table(torch.tensor([2 * real]), nb)
    idx, valid = idx[0, :, :, -r:], valid[0, :, :, -r:]  # (H, nb, r)
    per_df = []
    for i in range(1, real):  # the non-global real query blocks
        cand = sorted(candidates(i, real, mod.opts))
        counts = torch.zeros(nb)
        counts.index_add_(0, idx[:, i][valid[:, i]], torch.ones(int(valid[:, i].sum())))
        assert counts[[j for j in range(nb) if j not in cand]].sum() == 0
        expected = H * min(r, len(cand)) / len(cand)
        if len(cand) <= r:
            assert (counts[cand] == H).all()
            continue
        chi2 = float(((counts[cand] - expected) ** 2 / expected).sum())
        per_df.append(chi2 / (len(cand) - 1))
    assert max(per_df) < 3.0 and sum(per_df) / len(per_df) < 1.5, per_df


# ---------------------------------------------------------------- sinkhorn
def sinkhorn(iters=8, temperature=0.75, H=2, d=8, **kw):
    opts = AttentionOptions(block_size=4, sinkhorn_iters=iters, sinkhorn_temperature=temperature,
                            max_positions=64, **kw)
    return build_attention("sinkhorn", H, d, opts).double()


def qkv(B=3, H=2, N=23, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, d, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)]


LENGTHS = torch.tensor([23, 17, 5])


def test_sinkhorn_gumbel_noise_in_training_only():
    mod = sinkhorn()
    q, k, v = qkv()
    mod.eval()
    torch.testing.assert_close(mod(q, k, v, LENGTHS), mod(q, k, v, LENGTHS), rtol=0, atol=0)
    mod.train()
    a, b = mod.permutation(k, LENGTHS), mod.permutation(k, LENGTHS)
    assert (a - b).abs().max() > 1e-2, "two training draws differ"
    assert (mod(q, k, v, LENGTHS) - mod(q, k, v, LENGTHS)).abs().max() > 1e-4
    torch.manual_seed(5)
    a = mod(q, k, v, LENGTHS)
    torch.manual_seed(5)
    torch.testing.assert_close(mod(q, k, v, LENGTHS), a, rtol=0, atol=0)  # the global RNG: seeded, replayed


def test_sinkhorn_noise_is_standard_gumbel():
    """psi's output zeroed, no Sinkhorn round, temperature 1: log P is the noise itself, Gumbel(0, 1):
    mean = Euler's gamma, standard deviation = pi / sqrt(6) (16 * 2 * 16 * 16 = 8192 draws)."""
    mod = sinkhorn(iters=0, temperature=1.0).train()
    with torch.no_grad():
        mod.psi_w2.zero_()
        mod.psi_b2.zero_()
    k = torch.randn(16, 2, 64, 8, dtype=torch.float64)
    torch.manual_seed(0)
    g = mod.permutation(k, torch.full((16,), 64)).log().flatten()
    assert abs(g.mean().item() - 0.5772) < 0.05 and abs(g.std().item() - math.pi / math.sqrt(6)) < 0.05


def test_sinkhorn_gradients_reach_the_sorting_network():
    mod = sinkhorn().train()
    q, k, v = qkv()
    mod(q, k, v, LENGTHS).pow(2).sum().backward()
    for name in ("psi_w1", "psi_b1", "psi_w2", "psi_b2"):
        grad = getattr(mod, name).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().max() > 0, name
    assert mod.psi_w2.grad[:, :, 6:].abs().max() == 0, "targets beyond the 6 blocks of the batch get nothing"


def test_sinkhorn_activation_checkpointing_replays_the_noise():
    """torch.utils.checkpoint restores the global RNG for its recomputation: the same outputs and
    gradients as without checkpointing, from the same seed."""
    from torch.utils.checkpoint import checkpoint

    mod = sinkhorn().train()
    results = []
    for ckpt in (False, True):
        q, k, v = qkv()
        mod.zero_grad()
        torch.manual_seed(11)
        out = checkpoint(mod, q, k, v, LENGTHS, use_reentrant=False) if ckpt else mod(q, k, v, LENGTHS)
        out.pow(2).sum().backward()
        results.append([out.detach(), q.grad, k.grad, v.grad, mod.psi_w1.grad.clone()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)
