"""``routing`` attention against plain-loop references of the released code's balanced routing: per centroid
the w real queries and the w real keys nearest to it, queries attend to their cluster's keys, outputs averaged
over the clusters that chose the query; centroid EMA, deferred to the next forward (activation checkpointing),
summed over ranks in distributed training."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

import fairseq_nat_ext  # noqa: F401
from fairseq_nat_ext.modules.attention import AttentionOptions, EfficientSelfAttention, build_attention
from fairseq_nat_ext.modules.attention import routing


def inputs(B=3, H=2, N=23, d=8, seed=0, shift=3.0):
    """q, k, v float64 needing grad; the keys are the queries' distribution shifted by ``shift`` times a fixed
    vector, so that clusters of queries and of keys differ (queries and keys sorted apart)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = [torch.randn(B, H, N, d, generator=g, dtype=torch.float64) for _ in range(3)]
    k = q + 0.5 * k + shift * torch.randn(d, generator=g, dtype=torch.float64)
    return [t.clone().requires_grad_() for t in (q, k, v)]


def build(clusters, max_positions, H=2, d=8, decay=0.999, train=False):
    opts = AttentionOptions(routing_clusters=clusters, max_positions=max_positions, routing_decay=decay)
    mod = build_attention("routing", H, d, opts).double()
    return mod.train(train)


def top(vectors, mu, n, w):
    """Positions of the w (at most n) real vectors with the largest unit-vector dot product with mu; ties to
    the lower position (a Python sort)."""
    scores = (F.normalize(vectors[:n], dim=-1) @ mu).tolist()
    return sorted(range(n), key=lambda i: (-scores[i], i))[:w]


def routes(mod, q, k, lengths):
    """{(b, h, c): (queries, keys)} of the plain rule, from ``mod.centroids``."""
    w = math.ceil(mod.opts.max_positions / mod.centroids.size(1))
    out = {}
    for b, n in enumerate(lengths.tolist()):
        for h in range(q.size(1)):
            for c, mu in enumerate(mod.centroids[h]):
                out[b, h, c] = top(q[b, h].detach(), mu, n, w), top(k[b, h].detach(), mu, n, w)
    return out


def reference(mod, q, k, v, lengths):
    """Explicit softmax of each cluster's queries over its keys, averaged per query over the clusters that chose
    it; zeros for a query no cluster chose and at padding."""
    chosen = {}
    for (b, h, c), (qs, ks) in routes(mod, q, k, lengths).items():
        probs = torch.softmax(q[b, h, qs] @ k[b, h, ks].T / math.sqrt(q.size(-1)), -1)
        for i, row in zip(qs, probs @ v[b, h, ks]):
            chosen.setdefault((b, h, i), []).append(row)
    zero = torch.zeros_like(q[0, 0, 0])
    out = torch.stack([torch.stack([torch.stack([torch.stack(chosen[b, h, i]).mean(0) if (b, h, i) in chosen else zero
                                                 for i in range(q.size(2))]) for h in range(q.size(1))])
                       for b in range(q.size(0))])
    return out, chosen


def real_mask(lengths, n):
    return (torch.arange(n)[None, :] < lengths[:, None])[:, None, :, None]


CASES = [  # (N, clusters, max_positions, lengths)
    (23, 4, 24, [23, 17, 5]),  # w = 6: the 5-token sequence is all chosen by every cluster
    (24, 4, 24, [24, 17, 5]),
    (24, 4, 24, [24, 24, 24]),  # no padding
    (23, 8, 24, [23, 17, 5]),  # w = 3
    (23, 2, 24, [23, 17, 5]),  # w = 12: 24 slots for 23 tokens, some queries chosen by no cluster
    (10, 3, 40, [10, 7, 2]),  # w = 14 > N: every real token in every cluster (full attention)
]


@pytest.mark.parametrize("n,clusters,max_positions,lengths,train", [case + (i == 0,) for i, case in enumerate(CASES)])
def test_routing_matches_loop_reference_values_and_gradients(n, clusters, max_positions, lengths, train):
    lengths = torch.tensor(lengths)
    mod = build(clusters, max_positions, train=train)
    q, k, v = inputs(N=n)
    out = mod(q, k, v, lengths)  # a training forward leaves the centroids it used until the next forward
    ref, _ = reference(mod, q, k, v, lengths)
    real = real_mask(lengths, n)
    torch.testing.assert_close(out * real, ref * real)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * real
    grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * weights).sum(), (q, k, v))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)


def test_some_query_of_the_cases_is_chosen_by_no_cluster_and_outputs_zero():
    lengths = torch.tensor([23, 17, 5])
    mod = build(2, 24)
    q, k, v = inputs()
    _, chosen = reference(mod, q, k, v, lengths)
    missing = [(b, h, i) for b in range(3) for h in range(2) for i in range(int(lengths[b])) if (b, h, i) not in chosen]
    assert missing, "the case exercises queries that no cluster chose"
    out = mod(q, k, v, lengths)
    for b, h, i in missing:
        assert torch.equal(out[b, h, i], torch.zeros(8, dtype=torch.float64))


def test_a_query_reads_only_the_keys_of_the_clusters_that_chose_it():
    """Probe: the gradient of one output row w.r.t. v is nonzero exactly at the keys of the clusters that chose
    the query (with queries and keys distributed apart, chunk-pairing of separately sorted lists fails this)."""
    lengths = torch.tensor([23, 17, 5])
    mod = build(4, 24)
    q, k, v = inputs()
    out = mod(q, k, v, lengths)
    plan = routes(mod, q, k, lengths)
    some = False
    probes = [(b, h, i) for b, n in enumerate(lengths.tolist()) for h in range(2) for i in range(h, n, 3)]
    for b, h, i in probes:
        allowed = set()
        for c in range(4):
            qs, ks = plan[b, h, c]
            if i in qs:
                allowed |= set(ks)
        (gv,) = torch.autograd.grad(out[b, h, i].sum(), v, retain_graph=True)
        touched = {j for j in range(23) if gv[b, h, j].abs().sum() > 0}
        assert touched == allowed, (b, h, i)  # empty for a query no cluster chose
        assert gv[torch.arange(3) != b].abs().sum() == 0 and gv[b, 1 - h].abs().sum() == 0
        some |= bool(allowed)
    assert some


def test_ties_go_to_the_lower_position():
    """All queries equal and all keys equal, axis centroids (so that the similarities are exactly equal, whatever
    order a batched product sums in): every centroid chooses positions 0 .. w-1 of both."""
    mod = build(4, 24)
    mod.centroids.copy_(torch.eye(8, dtype=torch.float64)[:4].expand(2, 4, 8))
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 1, 8, generator=g, dtype=torch.float64).expand(1, 2, 20, 8)
    k = torch.randn(1, 2, 1, 8, generator=g, dtype=torch.float64).expand(1, 2, 20, 8)
    v = torch.randn(1, 2, 20, 8, generator=g, dtype=torch.float64)
    out = mod(q, k, v, torch.tensor([20]))
    w = mod.window  # 6
    torch.testing.assert_close(out[0, :, :w], v[0, :, :w].mean(1, keepdim=True).expand(2, w, 8))
    assert (out[0, :, w:] == 0).all()
    scores = torch.tensor([[[[1.0, 3.0, 2.0, 3.0, 2.0, 2.0, 0.0]]]])
    assert routing.top_positions(scores.clone(), torch.tensor([7]), 3).tolist() == [[[[1, 3, 2]]]]
    assert routing.top_positions(scores.clone(), torch.tensor([7]), 4).tolist() == [[[[1, 3, 2, 4]]]]
    # padding is never chosen ahead of a real token, and fills the slots after the real ones
    assert routing.top_positions(scores.clone(), torch.tensor([2]), 3)[0, 0, 0, :2].tolist() == [1, 0]


def ema_reference(before, q, k, lengths, decay):
    """Per head and centroid, the mean of the real q and k unit vectors nearest to it (argmax)."""
    H, C, _ = before.shape
    want = before.clone()
    for h in range(H):
        picked = {c: [] for c in range(C)}
        for x in (q, k):
            for b, n in enumerate(lengths.tolist()):
                for i in range(n):
                    u = F.normalize(x[b, h, i].detach(), dim=0)
                    picked[int((before[h] @ u).argmax())].append(u)
        for c, us in picked.items():
            if us:
                m = decay * before[h, c] + (1 - decay) * torch.stack(us).mean(0)
                want[h, c] = m / m.norm()
    return want


def test_centroid_update_is_the_ema_of_the_nearest_unit_vectors_applied_by_the_next_forward():
    lengths = torch.tensor([23, 17, 5])
    mod = build(4, 24, decay=0.7, train=True)
    q, k, v = inputs()
    before = mod.centroids.clone()
    mod(q, k, v, lengths)
    assert torch.equal(mod.centroids, before), "a forward is a pure function of the state: update deferred"
    want = ema_reference(before, q, k, lengths, 0.7)
    assert not torch.allclose(want, before)
    # an evaluation forward routes with the pending centroids but does not commit them
    routed = mod.eval()(q, k, v, lengths)
    assert torch.equal(mod.centroids, before)
    committed = copy.deepcopy(mod)
    committed.centroids.copy_(want)
    committed.pending_centroids = None
    torch.testing.assert_close(routed, committed(q, k, v, lengths))
    mod.train()(q, k, v, lengths)  # the next training forward commits it
    torch.testing.assert_close(mod.centroids, want)
    torch.testing.assert_close(mod.centroids.norm(dim=-1), torch.ones(2, 4, dtype=torch.float64))


def test_half_precision_module_keeps_float32_centroids():
    """An EMA step at decay 0.999 is below fp16 / bf16 rounding: the centroids stay float32 under .half()."""
    mod = build_attention("routing", 2, 8, AttentionOptions(routing_clusters=4, max_positions=24)).train()
    before = mod.centroids.clone()
    q, k, v = [t.detach().float() for t in inputs()]
    lengths = torch.tensor([23, 17, 5])
    for dtype in (torch.float16, torch.bfloat16):
        mod.to(dtype)
        assert mod.centroids.dtype == torch.float32
        out = mod(q.to(dtype), k.to(dtype), v.to(dtype), lengths)
        assert out.dtype == dtype and torch.isfinite(out).all()
        mod(q.to(dtype), k.to(dtype), v.to(dtype), lengths)  # commits the first forward's update
        assert mod.centroids.dtype == torch.float32 and not torch.equal(mod.centroids, before)


def test_eval_never_moves_centroids_and_training_moves_them_once_per_forward():
    lengths = torch.tensor([23, 17, 5])
    mod = build(4, 24, decay=0.5)
    before = mod.centroids.clone()
    for seed in range(2):
        mod(*inputs(seed=seed), lengths)
    assert torch.equal(mod.centroids, before), "eval never moves the centroids"
    mod.train()
    steps = []
    for seed in range(3):
        q, k, v = inputs(seed=seed)
        used = mod.centroids.clone()
        mod(q, k, v, lengths)
        assert torch.equal(mod.centroids, used)
        want = ema_reference(used, q, k, lengths, 0.5)
        steps.append(want)
        torch.testing.assert_close(mod.state_dict()["centroids"], want)  # one EMA step per forward
    assert not torch.allclose(steps[0], steps[1]) and not torch.allclose(steps[1], steps[2])


def test_state_dict_holds_the_updated_centroids_and_old_checkpoints_load():
    lengths = torch.tensor([23, 17, 5])
    mod = build(4, 24, decay=0.7, train=True)
    q, k, v = inputs()
    before = mod.centroids.clone()
    mod(q, k, v, lengths)
    state = mod.state_dict()
    assert set(state) == {"centroids"}, "the pending update is not saved"
    torch.testing.assert_close(state["centroids"], ema_reference(before, q, k, lengths, 0.7))
    # a checkpoint written before the update was deferred holds the same one buffer: loads strictly
    fresh = build(4, 24, train=True)
    fresh(q, k, v, lengths)  # leaves a pending update ...
    fresh.load_state_dict({"centroids": before})  # ... that loading discards
    fresh(q, k, v, lengths)
    assert torch.equal(fresh.centroids, before)


def test_initial_centroids_come_from_the_layer_seed():
    from dataclasses import replace

    opts = AttentionOptions(routing_clusters=4, max_positions=24)
    c0 = build_attention("routing", 2, 8, opts).centroids
    c1 = build_attention("routing", 2, 8, replace(opts, layer=1)).centroids
    gen = torch.Generator().manual_seed(opts.layer_seed())
    torch.testing.assert_close(c0, F.normalize(torch.randn(2, 4, 8, generator=gen), dim=-1))
    assert not torch.allclose(c0, c1)
    assert torch.equal(c0, build_attention("routing", 2, 8, opts).centroids)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        opts = AttentionOptions(routing_clusters=3, max_positions=16, routing_decay=0.5)
        self.attn = EfficientSelfAttention(16, 2, [("routing", 2)], opts)

    def forward(self, x, pad):
        return self.attn(x, x, x, key_padding_mask=pad)[0]


def plain_and_checkpointed(how):
    """(a Block, the callable running its deep copy under activation checkpointing (torch's reentrant
    checkpoint or fairseq's checkpoint_wrapper), that copy)."""
    torch.manual_seed(0)
    plain = Block().double().train()
    ckpt = copy.deepcopy(plain)
    if how == "torch":
        from torch.utils.checkpoint import checkpoint

        return plain, (lambda x, pad: checkpoint(ckpt, x, pad, use_reentrant=True)), ckpt
    from fairseq.modules.checkpoint_activations import checkpoint_wrapper

    return plain, checkpoint_wrapper(ckpt), ckpt


@pytest.mark.parametrize("how", ["torch", "fairseq"])
def test_activation_checkpointing_gives_the_plain_layer_s_outputs_gradients_and_centroids(how):
    plain, run, ckpt = plain_and_checkpointed(how)
    pad = torch.zeros(3, 11, dtype=torch.bool)
    pad[1, :4], pad[2, 7:] = True, True
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        x = torch.randn(11, 3, 16, generator=g, dtype=torch.float64)
        weights = torch.randn(11, 3, 16, generator=g, dtype=torch.float64)
        results = []
        for fn, module in ((plain, plain), (run, ckpt)):
            xi = x.clone().requires_grad_()
            module.zero_grad()
            out = fn(xi, pad)
            (out * weights).sum().backward()
            results.append((out.detach(), xi.grad, [p.grad for p in module.parameters()],
                            module.state_dict()["attn.variants.0.centroids"]))
        (o1, x1, p1, c1), (o2, x2, p2, c2) = results
        torch.testing.assert_close(o1, o2)
        torch.testing.assert_close(x1, x2)
        for a, b in zip(p1, p2):
            torch.testing.assert_close(a, b)
        assert torch.equal(c1, c2), f"step {step}: centroids after the step"


@pytest.mark.parametrize("how", ["torch", "fairseq"])
def test_an_evaluation_forward_between_forward_and_backward_leaves_checkpointed_gradients_exact(how):
    """The Imputer runs its encoder in evaluation mode between the training forward and the backward pass: the
    checkpointed layer's recomputation must still route with the centroids of the original forward."""
    plain, run, ckpt = plain_and_checkpointed(how)
    pad = torch.zeros(3, 11, dtype=torch.bool)
    pad[1, :4] = True
    g = torch.Generator().manual_seed(2)
    for step in range(3):
        x = torch.randn(11, 3, 16, generator=g, dtype=torch.float64)
        other = torch.randn(11, 3, 16, generator=g, dtype=torch.float64)
        grads = []
        for fn, module in ((plain, plain), (run, ckpt)):
            xi = x.clone().requires_grad_()
            module.zero_grad()
            out = fn(xi, pad)
            with torch.no_grad():
                module.eval()(other, pad)
            module.train()
            out.sum().backward()
            grads.append((xi.grad, [p.grad for p in module.parameters()]))
        (x1, p1), (x2, p2) = grads
        torch.testing.assert_close(x1, x2)
        for a, b in zip(p1, p2):
            torch.testing.assert_close(a, b)


def test_distributed_training_sums_centroid_statistics_over_ranks(monkeypatch):
    """Two ranks with different batches, simulated in one process (a 2-process gloo group takes far longer to
    start than the test may): each rank's reduction returns its own statistics plus the other's, and both keep
    the centroids of one process that saw both batches."""
    q, k, v = [t.detach() for t in inputs(B=4)]
    lengths = torch.tensor([23, 17, 5, 11])
    batches = [(q[:2], k[:2], v[:2], lengths[:2]), (q[2:], k[2:], v[2:], lengths[2:])]
    local = []
    monkeypatch.setattr(routing, "all_reduce_sum", lambda t: local.append(t.clone()) or t)
    for batch in batches:
        build(4, 24, decay=0.5, train=True)(*batch)
    kept = []
    for rank, batch in enumerate(batches):
        monkeypatch.setattr(routing, "all_reduce_sum", lambda t, other=local[1 - rank]: t.add_(other))
        mod = build(4, 24, decay=0.5, train=True)
        mod(*batch)
        kept.append(mod.state_dict()["centroids"])
    monkeypatch.undo()
    single = build(4, 24, decay=0.5, train=True)
    single(q, k, v, lengths)
    torch.testing.assert_close(kept[0], single.state_dict()["centroids"])
    assert torch.equal(kept[0], kept[1]), "every rank keeps the same centroids"


def test_all_reduce_sum_sums_over_the_default_group_only_when_distributed(monkeypatch):
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(dist, "all_reduce", lambda t: calls.append(t) or t.mul_(2))
    t = torch.ones(3)
    assert routing.all_reduce_sum(t) is t and not calls, "outside distributed training: untouched"
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 1)
    routing.all_reduce_sum(t)
    assert not calls, "a single process: no collective"
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    assert torch.equal(routing.all_reduce_sum(t), torch.full((3,), 2.0)) and calls == [t]
    # a training forward reduces once: the per-centroid sums (d) and counts (1) in one tensor
    seen = []
    monkeypatch.setattr(dist, "all_reduce", lambda t: seen.append(t.shape))
    build(4, 24, train=True)(*inputs(), torch.tensor([23, 17, 5]))
    assert len(seen) == 1 and math.prod(seen[0]) == 2 * 4 * (8 + 1)
    # a rank whose batch is empty still joins the collective (the other ranks would wait for it), and
    # adds nothing: its centroids move by the other ranks' statistics only
    seen.clear()
    mod = build(4, 24, train=True)
    before = mod.centroids.clone()
    out = mod(*[t[:0].detach() for t in inputs()], torch.tensor([], dtype=torch.long))
    assert out.shape == (0, 2, 23, 8) and len(seen) == 1 and math.prod(seen[0]) == 2 * 4 * (8 + 1)
    assert torch.equal(mod.state_dict()["centroids"], before), "nothing to move towards"
