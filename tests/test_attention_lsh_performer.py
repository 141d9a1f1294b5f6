"""lsh (Reformer) rotations, look-back and precision; the Performer's redraw state under activation
checkpointing and in checkpoints."""
import copy
import math

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import fairseq_nat_ext  # noqa: F401
from fairseq_nat_ext.modules.attention import AttentionOptions, EfficientSelfAttention, build_attention, layer_options

LSH = AttentionOptions(lsh_bucket_size=4, lsh_rounds=2, max_positions=64)
PERFORMER = AttentionOptions(feature_map="performer", performer_features=16, performer_redraw=1)


def qkv(B=3, H=2, N=23, d=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, d, generator=g, dtype=dtype) for _ in range(3)]


def chunks_of(q, rotations, n, c):
    """Plain hash of one (sequence, head, round): chunks (lists of positions) sorted by (bucket, position)."""
    half = max(1, -(-n // (2 * c)))
    xr = q[:n] @ rotations[:, :half]
    buckets = torch.cat([xr, -xr], -1).argmax(-1).tolist()
    order = sorted(range(n), key=lambda i: (buckets[i], i))
    return [order[j:j + c] for j in range(0, n, c)]


# ---------------------------------------------------------------- lsh
def test_lsh_rotations_are_fresh_in_every_training_forward_and_fixed_in_eval():
    mod = build_attention("lsh", 2, 8, LSH).double()
    q, k, v = qkv()
    lengths = torch.tensor([23, 17, 5])
    mod.train()
    r1, r2 = mod.current_rotations(q), mod.current_rotations(q)
    assert r1.dtype == q.dtype and r1.shape == (2, 2, 8, 3) and not torch.equal(r1, r2)
    h1, h2 = mod.sorted_order(q, lengths, r1[0]), mod.sorted_order(q, lengths, r2[0])
    assert not torch.equal(h1, h2), "hashes differ between two training forwards"
    assert not torch.equal(mod(q, k, v, lengths), mod(q, k, v, lengths))
    mod.eval()
    assert mod.current_rotations(q) is mod.rotations
    assert torch.equal(mod(q, k, v, lengths), mod(q, k, v, lengths)), "eval: the same rotations every time"
    assert "rotations" not in mod.state_dict()
    assert torch.equal(mod.sorted_order(q, lengths, 1), mod.sorted_order(q, lengths, mod.rotations[1]))


def test_lsh_rotations_differ_per_layer_and_follow_the_seed():
    r = [build_attention("lsh", 2, 8, layer_options(LSH, i)).rotations for i in (0, 1)]
    assert not torch.equal(r[0], r[1])
    assert torch.equal(r[0], build_attention("lsh", 2, 8, layer_options(LSH, 0)).rotations)


def test_lsh_first_chunk_attends_to_the_last_chunk_of_its_sequence():
    """Wrap-around: the first chunk of a 3-chunk sequence sees the last chunk, the middle chunk does not."""
    opts = AttentionOptions(lsh_bucket_size=4, lsh_rounds=1, max_positions=64)
    mod = build_attention("lsh", 1, 8, opts).double().eval()
    q, k, v = qkv(B=2, H=1, N=16)
    lengths = torch.tensor([12, 16])  # sequence 0: 3 chunks of real tokens, then padding
    v.requires_grad_()
    out = mod(q, k, v, lengths)
    chunks = chunks_of(q[0, 0], mod.rotations[0, 0], 12, 4)
    assert len(chunks) == 3

    def sees(i):  # positions whose value reaches the output at position i
        (g,) = torch.autograd.grad(out[0, 0, i].sum(), v, retain_graph=True)
        return set(torch.nonzero(g[0, 0].abs().sum(-1)).flatten().tolist())

    for t in chunks[0]:
        assert sees(t) <= set(chunks[0]) | set(chunks[2])
        assert sees(t) & set(chunks[2]), "a token of chunk 0 attends to keys of the last chunk"
        assert not sees(t) & set(chunks[1])
    for t in chunks[1]:
        assert not sees(t) & set(chunks[2])


def test_lsh_one_chunk_sequence_counts_each_key_once():
    """A sequence of one chunk looks back to itself: its keys are not counted twice (lse of the round)."""
    mod = build_attention("lsh", 2, 8, LSH).double().eval()
    q, k, v = qkv()
    lengths = torch.tensor([23, 3, 1])
    keys = torch.nn.functional.normalize(q, dim=-1)
    out, lse = mod.round_partial(q, keys, v, lengths, mod.rotations[0])
    for b, n in [(1, 3), (2, 1)]:
        scores = q[b, :, :n] @ keys[b, :, :n].transpose(-1, -2) / math.sqrt(8) - 1e5 * torch.eye(n, dtype=q.dtype)
        torch.testing.assert_close(lse[b, :, :n], torch.logsumexp(scores, -1))
        torch.testing.assert_close(out[b, :, :n], torch.softmax(scores, -1) @ v[b, :, :n])


def test_lsh_gradients_equal_numerical_gradients():
    """The chunk softmax's own backward (self penalty, empty rows, log-sum-exp merge) against finite differences."""
    mod = build_attention("lsh", 1, 4, LSH).double().eval()
    q, k, v = [t.requires_grad_() for t in qkv(B=3, H=1, N=10, d=4)]
    lengths = torch.tensor([10, 5, 1])
    real = (torch.arange(10)[None, :] < lengths[:, None])[:, None, :, None]
    assert torch.autograd.gradcheck(lambda a, c: mod(a, k, c, lengths) * real, (q, v), fast_mode=True)


def test_lsh_float16_is_finite_and_close_to_float32():
    """The self penalty (-1e5) is applied in float32: fp16 scores would overflow to -inf, and a token that
    sees only itself (a sequence of one token) would get no attention at all."""
    mod = build_attention("lsh", 2, 8, LSH).eval()
    q, k, v = [t.float() for t in qkv()]
    lengths = torch.tensor([23, 9, 1])
    ref = mod(q, k, v, lengths)
    half = build_attention("lsh", 2, 8, LSH).half().eval()
    try:
        out = half(q.half(), k.half(), v.half(), lengths)
    except RuntimeError as err:  # an fp16 op this CPU build lacks
        if "not implemented" in str(err).lower():
            pytest.skip(f"float16 on this device: {err}")
        raise
    assert out.dtype == torch.float16
    for b, n in enumerate(lengths.tolist()):
        assert torch.isfinite(out[b, :, :n]).all()
        torch.testing.assert_close(out[b, :, :n].float(), ref[b, :, :n], atol=1e-2, rtol=1e-2)
    # a lone token attends to itself (the only key; float32's lse near -1e5 leaves about 0.2% on the round weights)
    torch.testing.assert_close(out[2, :, 0].float(), v[2, :, 0], atol=1e-2, rtol=1e-2)


# ---------------------------------------------------------------- activation checkpointing
class Wrapper(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, pad):
        return self.layer(x, x, x, key_padding_mask=pad)[0]


def run_step(module, how, x, pad, seed):
    """One training forward + backward of ``module`` (a Wrapper) under checkpointing ``how``."""
    torch.manual_seed(seed)
    x = x.clone().requires_grad_()
    if how == "none":
        out = module(x, pad)
    elif how == "fairseq":
        out = module(x, pad)  # module is already wrapped by fairseq's checkpoint_wrapper
    else:
        out = checkpoint(module, x, pad, use_reentrant=how == "reentrant", **({"preserve_rng_state": False}
                                                                                 if how == "no_rng" else {}))
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    return out.detach(), x.grad


def layers_pair(name, opts, dropout=0.0):
    torch.manual_seed(0)
    layer = EfficientSelfAttention(16, 2, [(name, 2)], opts, dropout=dropout).double().train()
    return Wrapper(layer), Wrapper(copy.deepcopy(layer))


def wrapped(module, how):
    if how == "fairseq":
        from fairseq.modules.checkpoint_activations import checkpoint_wrapper

        return checkpoint_wrapper(module)
    return module


def batch():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(13, 3, 16, generator=g, dtype=torch.float64)
    pad = torch.zeros(3, 13, dtype=torch.bool)
    pad[1, :4] = True
    pad[2, 9:] = True
    return x, pad


def assert_same_step(a, b, how, steps=2):
    x, pad = batch()
    for step in range(steps):
        out_a, gx_a = run_step(a, "none", x, pad, seed=10 + step)
        out_b, gx_b = run_step(b, how, x, pad, seed=10 + step)
        torch.testing.assert_close(out_b, out_a)
        torch.testing.assert_close(gx_b, gx_a)
        for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
            torch.testing.assert_close(pb.grad, pa.grad, msg=n)


@pytest.mark.parametrize("how", ["reentrant", "non_reentrant", "fairseq"])
def test_lsh_under_activation_checkpointing_equals_no_checkpointing(how):
    """The recomputed forward draws the same rotations (and dropout): checkpointing restores the RNG state."""
    a, b = layers_pair("lsh", LSH, dropout=0.1)
    assert_same_step(a, wrapped(b, how), how)


def test_lsh_recomputation_with_other_rotations_would_change_the_gradients():
    """Control for the test above: without the RNG state restored, the recomputation hashes differently."""
    a, b = layers_pair("lsh", LSH)
    with pytest.raises(AssertionError):
        assert_same_step(a, b, "no_rng", steps=1)


def counters(wrapper):
    mod = wrapper.layer.variants[0]
    return mod.forwards, mod.redraws


@pytest.mark.parametrize("how", ["reentrant", "non_reentrant", "fairseq"])
def test_performer_under_activation_checkpointing_equals_no_checkpointing(how):
    """Features redrawn every training forward (--performer-redraw 1): the recomputation in the backward pass
    does not count, so it uses the features of the original forward, and the counters advance once a step."""
    a, b = layers_pair("linear", PERFORMER)
    first = a.layer.variants[0].features.clone()
    assert_same_step(a, wrapped(b, how), how, steps=3)
    assert counters(a) == counters(b) == (3, 3)
    torch.testing.assert_close(b.layer.variants[0].features, a.layer.variants[0].features)
    assert not torch.equal(a.layer.variants[0].features, first)


def test_performer_state_dict_resumes_the_draw_sequence():
    opts = AttentionOptions(feature_map="performer", performer_features=16, performer_redraw=2)
    torch.manual_seed(0)
    layer = EfficientSelfAttention(16, 2, [("linear", 2)], opts).train()
    x, pad = batch()
    x = x.float()
    for _ in range(3):
        layer(x, x, x, key_padding_mask=pad)
    state = layer.state_dict()
    assert int(state["variants.0.forwards"]) == 3 and int(state["variants.0.redraws"]) == 1
    fresh = EfficientSelfAttention(16, 2, [("linear", 2)], opts).train()
    fresh.load_state_dict(state)  # strict
    assert (fresh.variants[0].forwards, fresh.variants[0].redraws) == (3, 1)
    torch.testing.assert_close(fresh.variants[0].features, layer.variants[0].features)
    before = layer.variants[0].features.clone()
    torch.testing.assert_close(fresh(x, x, x, key_padding_mask=pad)[0], layer(x, x, x, key_padding_mask=pad)[0])
    assert not torch.equal(layer.variants[0].features, before), "the 4th forward redrew"
    torch.testing.assert_close(fresh.variants[0].features, layer.variants[0].features)
    assert (fresh.variants[0].forwards, fresh.variants[0].redraws) == (4, 2)


def test_performer_state_dict_without_counters_still_loads():
    """Checkpoints written before the counters were saved: a strict load works, counters left at 0."""
    torch.manual_seed(0)
    layer = EfficientSelfAttention(16, 2, [("linear", 2)], PERFORMER)
    old = {k: v for k, v in layer.state_dict().items() if not k.endswith(("forwards", "redraws"))}
    assert len(old) == len(layer.state_dict()) - 2
    fresh = EfficientSelfAttention(16, 2, [("linear", 2)], PERFORMER)
    fresh.load_state_dict(old)
    assert (fresh.variants[0].forwards, fresh.variants[0].redraws) == (0, 0)
    with pytest.raises(RuntimeError, match="Unexpected key"):  # other unknown keys are still refused
        fresh.load_state_dict(dict(old, **{"variants.0.bogus": torch.tensor(1)}))


def test_performer_features_differ_per_layer():
    feats = [EfficientSelfAttention(16, 2, [("linear", 2)], layer_options(PERFORMER, i)).variants[0].features
             for i in (0, 1, 0)]
    assert not torch.equal(feats[0], feats[1])
    assert torch.equal(feats[0], feats[2]), "a fixed function of (--attention-seed, layer)"
