"""DA-Transformer (arch da_transformer, criterion dag_loss, generators/da_transformer.py): the DAG loss and
every decoder against independent references (brute force over enumerated paths, plain Python loops), the
arch, initialisation from an AT model, and a tiny fairseq-train + fairseq-generate with each decoder."""
import itertools
import os
import re

import pytest
import torch

from conftest import PLUGIN_DIR, build_model_and_task, run_cli

import fairseq_nat_ext  # noqa: F401,E402
from fairseq_nat_ext.compat import InputError
from fairseq_nat_ext.criterions.dag_loss import DAGLoss, dag_best_alignment, dag_log_likelihood
from fairseq_nat_ext.generators.da_transformer import (DAGenerator, dag_beam_search, dag_greedy, dag_lookahead,
                                                       dag_sample_paths, dag_viterbi)
from fairseq_nat_ext.models.nat.da_transformer import link_log_probs, uniform_copy_index

NEG = float("-inf")


def paths(L, M=None):
    """Every path 0 = a_1 < ... < a_M = L - 1 (every M >= 2 when M is None)."""
    sizes = range(2, L + 1) if M is None else [M]
    for m in sizes:
        for mid in itertools.combinations(range(1, L - 1), m - 2):
            yield (0,) + mid + (L - 1,)


def random_graph(B, L, V, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, L + 1, (B,), generator=g)
    lengths[0] = L
    scores = torch.randn(B, L, L, generator=g, dtype=dtype)
    links = link_log_probs(scores, lengths).to(dtype)
    lprobs = torch.log_softmax(torch.randn(B, L, V, generator=g, dtype=dtype), -1)
    return links, lprobs, lengths


# -- the loss -----------------------------------------------------------------------------------------------

def brute_log_likelihood(match, links, L, M):
    """log of the sum over every path of M vertices of prod transitions x prod emissions (one sentence)."""
    terms = [sum(links[p[k], p[k + 1]] for k in range(M - 1)) + sum(match[k, p[k]] for k in range(M))
             for p in paths(L, M)]
    return torch.logsumexp(torch.stack(terms), 0) if terms else torch.tensor(NEG, dtype=match.dtype)


@pytest.mark.parametrize("L,M", [(2, 2), (4, 2), (4, 3), (5, 5), (6, 4), (7, 3)])
def test_dag_loss_equals_brute_force_sum_over_paths_values_and_gradients(L, M):
    g = torch.Generator().manual_seed(L * 10 + M)
    match = torch.randn(1, M, L, generator=g, dtype=torch.float64).requires_grad_()
    raw = torch.randn(1, L, L, generator=g, dtype=torch.float64).requires_grad_()
    lengths, tl = torch.tensor([L]), torch.tensor([M])
    ours = dag_log_likelihood(match, link_log_probs(raw, lengths).double(), lengths, tl)
    ga, gr = torch.autograd.grad(ours.sum(), [match, raw])
    ref = brute_log_likelihood(match[0], link_log_probs(raw, lengths).double()[0], L, M)
    ra, rr = torch.autograd.grad(ref, [match, raw])
    torch.testing.assert_close(ours[0], ref)
    torch.testing.assert_close(ga, ra)
    torch.testing.assert_close(gr, rr)


def test_dag_loss_float32_and_arbitrary_link_scores():
    """Any real link scores (not only normalised ones) and float32 inputs follow the same sum."""
    g = torch.Generator().manual_seed(3)
    L, M = 6, 4
    match = torch.randn(1, M, L, generator=g)
    links = torch.randn(1, L, L, generator=g).triu(1)
    ours = dag_log_likelihood(match, links, torch.tensor([L]), torch.tensor([M]))
    ref = brute_log_likelihood(match[0].double(), links[0].double(), L, M)
    assert ours.dtype == torch.float32
    assert abs(float(ours[0]) - float(ref)) < 1e-4


def test_dag_loss_batched_equals_per_sentence_with_padding_and_mixed_lengths():
    g = torch.Generator().manual_seed(0)
    B, L, M = 5, 7, 5
    graph = torch.tensor([7, 5, 3, 6, 4])
    tl = torch.tensor([5, 2, 3, 6, 5])  # the last one does not fit
    match = torch.randn(B, M + 1, L, generator=g, dtype=torch.float64)  # one padded target step
    raw = torch.randn(B, L, L, generator=g, dtype=torch.float64)
    match.requires_grad_()
    raw.requires_grad_()
    links = link_log_probs(raw, graph).double()
    # garbage beyond each sentence's graph and target: must not matter
    junk = torch.randn(B, L, L, generator=g, dtype=torch.float64) * 5
    beyond = torch.arange(L).view(1, 1, L) >= graph.view(B, 1, 1)
    links_j = torch.where(beyond | beyond.transpose(1, 2), junk, links)
    batched = dag_log_likelihood(match, links_j, graph, tl)
    gm, gr = torch.autograd.grad(batched.sum(), [match, raw])
    links = link_log_probs(raw, graph).double()  # a fresh graph for the references
    for b in range(B):
        n, m = int(graph[b]), int(tl[b])
        one = dag_log_likelihood(match[b:b + 1, :m, :n], links[b:b + 1, :n, :n], graph[b:b + 1], tl[b:b + 1])
        torch.testing.assert_close(batched[b], one[0])
        if m <= n:
            ref = brute_log_likelihood(match[b, :m, :n], links[b, :n, :n], n, m)
            torch.testing.assert_close(batched[b], ref)
    links = link_log_probs(raw, graph).double()
    ref_total = sum(brute_log_likelihood(match[b, : int(tl[b]), : int(graph[b])],
                                         links[b, : int(graph[b]), : int(graph[b])], int(graph[b]), int(tl[b]))
                    for b in range(B) if tl[b] <= graph[b])
    rm, rr = torch.autograd.grad(ref_total, [match, raw])
    torch.testing.assert_close(gm, rm)
    torch.testing.assert_close(gr, rr)
    assert torch.isfinite(batched[:4]).all() and torch.isneginf(batched[4])
    assert not bool(torch.isnan(gm).any() or torch.isnan(gr).any())


def test_infeasible_pairs_are_minus_inf_and_the_criterion_filters_and_counts_them():
    g = torch.Generator().manual_seed(1)
    B, L, V = 3, 4, 6
    graph = torch.tensor([4, 4, 3])
    tl = torch.tensor([3, 5, 4])  # rows 1 and 2 do not fit
    lp = torch.log_softmax(torch.randn(B, L, V, generator=g), -1).requires_grad_()
    links = link_log_probs(torch.randn(B, L, L, generator=g), graph)
    targets = torch.randint(4, V, (B, 5), generator=g)
    crit = DAGLoss(None)
    loss, nll, log = crit.part_loss("dag", {"dag_lprobs": lp, "links": links, "graph_lengths": graph,
                                           "targets": targets, "target_lengths": tl})
    assert log == {"dag_filtered": 2, "dag_pairs": 3}
    match = lp[:1].gather(-1, targets[:1, :3].unsqueeze(1).expand(-1, L, -1)).transpose(1, 2)
    expect = -dag_log_likelihood(match, links[:1], graph[:1], tl[:1])[0] / 3
    torch.testing.assert_close(loss, expect)
    loss.backward()
    assert torch.isfinite(lp.grad).all()
    full = lp.gather(-1, targets.unsqueeze(1).expand(-1, L, -1)).transpose(1, 2)
    ll = dag_log_likelihood(full, links, graph, tl)
    assert torch.isfinite(ll[0]) and torch.isneginf(ll[1]) and torch.isneginf(ll[2])
    with pytest.raises(InputError, match="--label-smoothing"):
        DAGLoss(None, label_smoothing=0.1)
    with pytest.raises(InputError, match="--glat-ratio-start"):
        DAGLoss(None, glat_ratio_start=1.5)


def alignment_score(links, match, p):
    """log-prob of target token k at vertex p[k] for every k, plus the path's transitions (plain Python)."""
    return sum(float(links[p[k], p[k + 1]]) for k in range(len(p) - 1)) \
        + sum(float(match[k, v]) for k, v in enumerate(p))


def test_best_alignment_equals_brute_force_max_over_paths():
    g = torch.Generator().manual_seed(5)
    B, L, M = 3, 6, 4
    graph, tl = torch.tensor([6, 5, 4]), torch.tensor([4, 3, 4])
    match = torch.randn(B, M, L, generator=g, dtype=torch.float64)
    links = link_log_probs(torch.randn(B, L, L, generator=g), graph).double()
    path, score = dag_best_alignment(match, links, graph, tl)
    for b in range(B):
        n, m = int(graph[b]), int(tl[b])
        best = max(paths(n, m), key=lambda p: alignment_score(links[b], match[b], p))
        assert path[b, :m].tolist() == list(best) and (path[b, m:] == -1).all()
        assert abs(float(score[b]) - alignment_score(links[b], match[b], best)) < 1e-9


def test_best_alignment_of_a_target_longer_than_its_graph_is_no_path():
    g = torch.Generator().manual_seed(6)
    B, L, M = 2, 5, 6
    graph, tl = torch.tensor([5, 4]), torch.tensor([4, 6])  # row 1: 6 tokens, 4 vertices
    match = torch.randn(B, M, L, generator=g, dtype=torch.float64)
    links = link_log_probs(torch.randn(B, L, L, generator=g), graph).double()
    path, score = dag_best_alignment(match, links, graph, tl)
    assert torch.isneginf(score[1]) and (path[1] == -1).all()
    best = max(paths(5, 4), key=lambda p: alignment_score(links[0], match[0], p))
    assert path[0, :4].tolist() == list(best) and torch.isfinite(score[0])


# -- decoders -----------------------------------------------------------------------------------------------

def vertex_scores(lprobs, lengths, bos=0, eos=2, forbidden=(0, 1, 2, 3)):
    """e(j) and the best token of each vertex by definition (plain Python)."""
    B, L, V = lprobs.shape
    e = torch.full((B, L), NEG, dtype=lprobs.dtype)
    best = torch.full((B, L), 1, dtype=torch.long)
    for b in range(B):
        n = int(lengths[b])
        for j in range(n):
            if j == 0:
                e[b, j], best[b, j] = lprobs[b, j, bos], bos
            elif j == n - 1:
                e[b, j], best[b, j] = lprobs[b, j, eos], eos
            else:
                allowed = [v for v in range(V) if v not in forbidden]
                v = max(allowed, key=lambda t: float(lprobs[b, j, t]))
                e[b, j], best[b, j] = lprobs[b, j, v], v
    return e, best


def path_score(links, e, p):
    return sum(float(links[p[k], p[k + 1]]) for k in range(len(p) - 1)) + sum(float(e[v]) for v in p)


@pytest.mark.parametrize("lenpen", [0.0, 0.5, 1.0, 2.0])
def test_viterbi_equals_brute_force_argmax_over_all_paths_with_length_penalty(lenpen):
    links, lprobs, lengths = random_graph(4, 7, 8, seed=int(lenpen * 10))
    e, _ = vertex_scores(lprobs, lengths)
    path, n, joint = dag_viterbi(links, e, lengths, lenpen)
    for b in range(4):
        L = int(lengths[b])
        best = max(paths(L), key=lambda p: path_score(links[b], e[b], p) / len(p) ** lenpen)
        assert path[b, : int(n[b])].tolist() == list(best) and (path[b, int(n[b]):] == -1).all()
        assert abs(float(joint[b]) - path_score(links[b], e[b], best)) < 1e-5


def test_viterbi_respects_the_longest_output():
    links, lprobs, lengths = random_graph(3, 8, 6, seed=11)
    e, _ = vertex_scores(lprobs, lengths)
    _, n, _ = dag_viterbi(links, e, lengths, lenpen=5.0, max_vertices=4)  # strong push to long outputs
    assert (n <= 4).all()
    for b in range(3):
        L = int(lengths[b])
        best = max((p for p in paths(L) if len(p) <= 4), key=lambda p: path_score(links[b], e[b], p) / len(p) ** 5.0)
        assert int(n[b]) == len(best)


def python_walk(links, e, L, lookahead):
    i, out = 0, [0]
    while i != L - 1:
        cand = range(i + 1, L)
        i = max(cand, key=lambda j: float(links[i, j]) + (float(e[j]) if lookahead else 0.0))
        out.append(i)
    return out


@pytest.mark.parametrize("lookahead", [False, True])
def test_greedy_and_lookahead_equal_their_definitions(lookahead):
    links, lprobs, lengths = random_graph(6, 9, 7, seed=21 + lookahead)
    e, _ = vertex_scores(lprobs, lengths)
    path, n = dag_lookahead(links, e, lengths) if lookahead else dag_greedy(links, lengths)
    for b in range(6):
        ref = python_walk(links[b], e[b], int(lengths[b]), lookahead)
        assert path[b, : int(n[b])].tolist() == ref and (path[b, int(n[b]):] == -1).all()


@pytest.mark.parametrize("lenpen", [0.0, 1.0])
def test_exhaustive_beam_equals_joint_viterbi(lenpen):
    """With every token of every vertex and a beam holding every partial hypothesis, beam search finds the
    joint maximum: Viterbi's output and normalised score."""
    V, forbidden = 7, (0, 1, 2, 3)
    links, lprobs, lengths = random_graph(3, 6, V, seed=31)
    e, best = vertex_scores(lprobs, lengths)
    allowed = torch.tensor([v for v in range(V) if v not in forbidden])
    B, L = lprobs.shape[:2]
    top_lp = lprobs[:, :, allowed].float()
    top_tok = allowed.expand(B, L, -1).clone()
    inner = (torch.arange(L).view(1, L) > 0) & (torch.arange(L).view(1, L) < (lengths - 1).view(B, 1))
    top_lp = top_lp.masked_fill(~inner.unsqueeze(-1), NEG)
    first = e[:, 0].float()
    last = e[torch.arange(B), lengths - 1].float()
    toks, n, joint, norm, bpath = dag_beam_search(links.float(), top_lp, top_tok, first, last, lengths, beam=500,
                                                  lenpen=lenpen)
    assert toks.shape[:2] == n.shape == joint.shape == norm.shape == bpath.shape[:2] == (B, 1)
    vpath, vn, vjoint = dag_viterbi(links, e, lengths, lenpen)
    for b in range(B):
        m = int(vn[b])
        assert toks[b, 0, : int(n[b, 0])].tolist() == best[b, vpath[b, 1:m - 1]].tolist()
        assert bpath[b, 0, : m].tolist() == vpath[b, :m].tolist()
        assert abs(float(joint[b, 0]) - float(vjoint[b])) < 1e-4
        assert abs(float(norm[b, 0]) - float(vjoint[b]) / m ** lenpen) < 1e-4


@pytest.mark.parametrize("lenpen", [0.0, 1.0])
def test_exhaustive_beam_nbest_equals_the_brute_force_best_hypotheses(lenpen):
    """--nbest F with a beam holding every partial hypothesis: the F best (path, tokens) hypotheses of all,
    best first, by joint log-prob / vertices^lenpen (enumerated: every path x every token at each vertex)."""
    V, allowed, F = 7, (4, 5, 6), 5
    links, lprobs, lengths = random_graph(3, 6, V, seed=37)
    B, L = lprobs.shape[:2]
    inner = (torch.arange(L).view(1, L) > 0) & (torch.arange(L).view(1, L) < (lengths - 1).view(B, 1))
    top_lp = lprobs[:, :, list(allowed)].float().masked_fill(~inner.unsqueeze(-1), NEG)
    top_tok = torch.tensor(allowed).expand(B, L, -1).clone()
    first, last = lprobs[:, 0, 0].float(), lprobs[torch.arange(B), lengths - 1, 2].float()
    toks, n, joint, norm, bpath = dag_beam_search(links.float(), top_lp, top_tok, first, last, lengths, beam=500,
                                                  lenpen=lenpen, nbest=F)
    for b in range(B):
        Lb = int(lengths[b])
        every = []
        for p in paths(Lb):
            for ys in itertools.product(allowed, repeat=len(p) - 2):
                j = float(first[b]) + float(last[b]) + sum(float(links[b, p[k], p[k + 1]]) for k in range(len(p) - 1)) \
                    + sum(float(lprobs[b, v, t]) for v, t in zip(p[1:-1], ys))
                every.append((j / len(p) ** lenpen, j, p, list(ys)))
        every.sort(key=lambda h: -h[0])
        want = every[:F]
        for f in range(F):
            if f >= len(want):  # fewer hypotheses than F (a short graph): the slot is empty
                assert torch.isneginf(norm[b, f])
                continue
            m = int(n[b, f])
            assert abs(float(norm[b, f]) - want[f][0]) < 1e-4 and abs(float(joint[b, f]) - want[f][1]) < 1e-4
            assert bpath[b, f, : m + 2].tolist() == list(want[f][2]) and toks[b, f, :m].tolist() == want[f][3]


def test_small_beam_returns_a_valid_hypothesis_with_its_joint_score():
    V = 9
    links, lprobs, lengths = random_graph(4, 10, V, seed=41)
    allowed = torch.arange(4, V)
    B, L = lprobs.shape[:2]
    inner = (torch.arange(L).view(1, L) > 0) & (torch.arange(L).view(1, L) < (lengths - 1).view(B, 1))
    top_lp, idx = lprobs[:, :, allowed].float().topk(2, -1)
    top_lp = top_lp.masked_fill(~inner.unsqueeze(-1), NEG)
    top_tok = allowed[idx]
    first, last = lprobs[:, 0, 0].float(), lprobs[torch.arange(B), lengths - 1, 2].float()
    toks, n, joint, _, p = dag_beam_search(links.float(), top_lp, top_tok, first, last, lengths, beam=3)
    toks, n, joint, p = toks[:, 0], n[:, 0], joint[:, 0], p[:, 0]
    for b in range(B):
        m = int(n[b])
        path = p[b, : m + 2].tolist()
        assert path[0] == 0 and path[-1] == int(lengths[b]) - 1 and path == sorted(set(path))
        ref = sum(float(links[b, path[k], path[k + 1]]) for k in range(m + 1)) + float(first[b]) + float(last[b]) \
            + sum(float(lprobs[b, v, t]) for v, t in zip(path[1:-1], toks[b, :m].tolist()))
        assert abs(float(joint[b]) - ref) < 1e-4


def test_sampled_paths_are_paths_of_the_graph_with_candidate_tokens():
    links, lprobs, lengths = random_graph(3, 8, 9, seed=51)
    B, L = lprobs.shape[:2]
    top_lp, top_tok = lprobs[:, :, 4:].float().topk(3, -1)
    top_tok = top_tok + 4
    g = torch.Generator().manual_seed(0)
    path, plen, tok, tok_lp = dag_sample_paths(links.float(), top_lp, top_tok, lengths, 5, generator=g)
    assert path.size(0) == B * 5
    for r in range(B * 5):
        b, n = r // 5, int(plen[r])
        p = path[r, :n].tolist()
        assert p[0] == 0 and p[-1] == int(lengths[b]) - 1 and p == sorted(set(p)) and (path[r, n:] == -1).all()
        for v, t, lp in zip(p[1:-1], tok[r, 1:n - 1].tolist(), tok_lp[r, 1:n - 1].tolist()):
            assert t in top_tok[b, v].tolist() and abs(lp - float(lprobs[b, v, t])) < 1e-5


def test_sampling_follows_a_deterministic_graph():
    """Transitions and tokens all but certain: every sample is the lookahead path."""
    B, L, T = 1, 6, 2
    scores = torch.full((B, L, L), -30.0)
    for i in range(L - 1):
        scores[0, i, i + 1] = 30.0
    lengths = torch.tensor([L])
    links = link_log_probs(scores, lengths)
    top_lp = torch.tensor([[-1e-6, -40.0]]).expand(B, L, T).clone()
    top_tok = torch.tensor([5, 6]).expand(B, L, T).clone()
    path, plen, tok, _ = dag_sample_paths(links, top_lp, top_tok, lengths, 4)
    assert (plen == L).all() and (path == torch.arange(L)).all() and (tok[:, 1:-1] == 5).all()


def test_uniform_copy_and_link_normalisation():
    idx = uniform_copy_index(torch.tensor([3, 2]), torch.tensor([9, 4]), 9)
    assert idx[0].tolist() == [round(t * 2 / 8) for t in range(9)]  # both round half to even
    assert idx[1, :4].tolist() == [0, 0, 1, 1] and (idx[1, 4:] == 0).all()
    lengths = torch.tensor([5, 3])
    lk = link_log_probs(torch.randn(2, 5, 5), lengths)
    for b, n in enumerate(lengths.tolist()):
        for i in range(5):
            row = lk[b, i].exp()
            if i < n - 1:
                assert abs(float(row.sum()) - 1) < 1e-5 and float(row[: i + 1].sum()) == 0 and float(row[n:].sum()) == 0
            else:
                assert torch.isneginf(lk[b, i]).all()


# -- the arch, the generator, the command line --------------------------------------------------------------

TINY_ARGS = ["--arch", "da_transformer_tiny", "--criterion", "dag_loss", "--dag-upsample-ratio", "4"]


@pytest.fixture(scope="module")
def tiny(toy_databin):
    torch.manual_seed(0)  # the same untrained model whatever ran before
    task, model, args = build_model_and_task(toy_databin[0], TINY_ARGS)
    return task, model, args


def test_model_graph_is_ratio_times_source_length_with_uniform_copy(tiny):
    task, model, _ = tiny
    model.eval()
    src = torch.tensor([[1, 1, 5, 6, 2], [7, 8, 9, 10, 2]])  # left-padded (1 = pad)
    enc = model.encoder(src, src_lengths=torch.tensor([3, 5]))
    states, lengths = model.decoder.graph(enc)
    assert lengths.tolist() == [12, 20] and states.shape[1] == 20
    emb = model.encoder.embed_scale * model.encoder.embed_tokens(torch.tensor([5, 6, 2]))
    for t in range(12):
        torch.testing.assert_close(states[0, t], emb[round(t * 2 / 11)])
    with torch.no_grad():
        lp, links, lengths = model.decoder(enc, normalize=True)
    assert lp.shape[:2] == (2, 20) and links.shape == (2, 20, 20)
    torch.testing.assert_close(links[0, :11, :12].exp().sum(-1), torch.ones(11))
    assert torch.isneginf(links[0, :, 12:]).all()


def test_model_loss_and_backward(tiny):
    task, model, _ = tiny
    model.train()
    crit = DAGLoss(task)
    src = torch.tensor([[1, 5, 6, 2], [7, 8, 9, 2]])
    tgt = torch.tensor([[10, 11, 12, 2], [13, 2, 1, 1]])
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([3, 4])}, "target": tgt,
              "prev_target": tgt, "ntokens": 6}
    loss, size, log = crit(model, sample)
    assert torch.isfinite(loss) and log["dag_filtered"] == 0 and log["dag_pairs"] == 2
    loss.backward()
    assert model.decoder.link_query.weight.grad is not None and model.decoder.link_query.weight.grad.abs().sum() > 0
    model.zero_grad()
    # glancing: the second pass reads some target tokens; loss still finite
    crit2 = DAGLoss(task, glat_ratio_start=1.0)
    crit2.train()
    loss2, _, log2 = crit2(model, sample)
    assert torch.isfinite(loss2) and log2["glat_revealed"] >= 0
    loss2.backward()


@pytest.mark.parametrize("ratio", [0.5, 1.0])
def test_glancing_reveals_round_ratio_hamming_wrong_vertices(tiny, ratio):
    task, model, _ = tiny
    model.eval()
    pad = model.pad
    # row 2: one source token -> 4 vertices, a target of 6 (<s> 4 tokens </s>): no path, nothing revealed
    src = torch.tensor([[5, 6, 7, 2], [pad, 8, 9, 2], [pad, pad, pad, 2]])
    tgt = torch.tensor([[10, 11, 12, 13, 14, 2], [15, 16, 2, pad, pad, pad], [10, 11, 12, 13, 2, pad]])
    src_lengths = torch.tensor([4, 3, 1])
    targets, tl = model.dag_targets(tgt)
    enc = model.encoder(src, src_lengths=src_lengths)
    graph = model.decoder.graph(enc)
    with torch.no_grad():
        lp, links, lengths = model.decoder(enc, graph=graph, normalize=True)
    match = lp.gather(-1, targets.unsqueeze(1).expand(-1, lp.size(1), -1)).transpose(1, 2)
    path, score = dag_best_alignment(match, links, lengths, tl)
    assert torch.isneginf(score[2]) and torch.isfinite(score[:2]).all()
    glanced, n = model.glance(enc, graph, targets, tl, ratio)
    pred = lp.argmax(-1)
    expected = 0
    for b in range(2):
        p = path[b, :int(tl[b])].tolist()
        wrong = [k for k, v in enumerate(p) if int(pred[b, v]) != int(targets[b, k])]
        if b == 0:
            assert len(wrong) >= 3  # so that round(ratio * d) > 0: the count is tested, not vacuous
        shown = glanced[b].ne(pad).nonzero().flatten().tolist()
        assert len(shown) == round(ratio * len(wrong)) and set(shown) <= {p[k] for k in wrong}
        for v in shown:
            assert int(glanced[b, v]) == int(targets[b, p.index(v)])
        expected += len(shown)
    assert glanced[2].eq(pad).all() and n == expected


def test_init_from_at_copies_everything_but_the_link_attention(toy_databin):
    from fairseq import options, tasks

    from fairseq_nat_ext.init_from_at import transfer_state

    data_bin = toy_databin[0]
    size = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32", "--decoder-embed-dim",
            "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads",
            "2", "--decoder-attention-heads", "2", "--share-all-embeddings"]
    parser = options.get_training_parser()
    at_args = options.parse_args_and_arch(parser, [data_bin, "--task", "translation", "--arch", "transformer"] + size)
    at_model = tasks.setup_task(at_args).build_model(at_args)
    _, nat, _ = build_model_and_task(data_bin, ["--arch", "da_transformer_tiny"] + size)
    state, report = transfer_state(nat.state_dict(), at_model.state_dict())
    nat.load_state_dict(state)
    assert sorted(report["nat_only"]) == sorted(["decoder.link_positions.weight", "decoder.link_query.weight",
                                                 "decoder.link_query.bias", "decoder.link_key.weight",
                                                 "decoder.link_key.bias"])
    assert report["at_only"] == []


def test_generator_options_and_bad_values(tiny):
    task, model, _ = tiny

    class Cfg:
        dag_decoder, dag_viterbi_lenpen, dag_beam_size, dag_sample_size, dag_topk = "viterbi", 0.5, 3, 4, 2
        npd_teacher, npd_rank, data = None, None, None

    g = DAGenerator([model], task.target_dictionary)
    g.configure(Cfg)
    assert (g.decoder, g.lenpen, g.beam_size) == ("viterbi", 0.5, 3)
    g = DAGenerator([model], task.target_dictionary, dag_decoder="beam")  # generation args first
    g.configure(Cfg)
    assert g.decoder == "beam" and g.decoding_keys == ("decoder",)
    with pytest.raises(InputError, match="--dag-decoder"):
        DAGenerator([model], task.target_dictionary, dag_decoder="nope")
    with pytest.raises(InputError, match="--dag-beam-size"):
        DAGenerator([model], task.target_dictionary, beam_size=0)


@pytest.mark.parametrize("method", ["greedy", "lookahead", "viterbi", "beam", "sample"])
def test_generate_each_decoder_in_process(tiny, method):
    task, model, _ = tiny
    model.eval()
    g = DAGenerator([model], task.target_dictionary, dag_decoder=method, beam_size=3, sample_size=3, topk=2)
    src = torch.tensor([[1, 5, 6, 2], [7, 8, 9, 2]])
    hyps = g.generate([model], {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([3, 4])}})
    assert len(hyps) == 2
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=torch.tensor([3, 4]))
        lp, links, _ = model.decoder(enc, normalize=True)
    for b, h in enumerate(hyps):
        h = h[0]
        toks = h["tokens"]
        assert toks[-1] == task.target_dictionary.eos() and h["steps"] == 1
        assert not any(int(t) in g.forbidden for t in toks[:-1])
        assert h["positional_scores"].numel() == toks.numel()
        assert torch.isfinite(h["score"])
        path = h["dag_path"].tolist()
        assert path[0] == 0 and path == sorted(set(path))
        if method != "beam":
            assert len(path) == toks.numel() + 1
            # log P(A, Y | X) from the model's own outputs along the returned path: the positional scores add
            # up to it and the score is it per output token
            ys = [task.target_dictionary.bos()] + toks.tolist()
            ref = sum(float(links[b, path[k], path[k + 1]]) for k in range(len(path) - 1)) \
                + sum(float(lp[b, v, t]) for v, t in zip(path, ys))
            assert abs(float(h["positional_scores"].sum()) - ref) < 1e-4
            assert abs(float(h["score"]) - ref / toks.numel()) < 1e-4


@pytest.mark.parametrize("method", ["beam", "sample"])
def test_generate_nbest_returns_the_best_hypotheses_best_first(tiny, method):
    """--nbest 3: beam's three best finished hypotheses, sample's three best candidates, by the decoder's own
    ranking (joint / vertices^lenpen; recomputed here from the model's outputs for sample), the first the
    nbest 1 output; the one-path decoders keep one hypothesis."""
    task, model, _ = tiny
    model.eval()
    d = task.target_dictionary
    src = {"net_input": {"src_tokens": torch.tensor([[1, 5, 6, 2], [7, 8, 9, 2]]), "src_lengths": torch.tensor([3, 4])}}
    opts = dict(dag_decoder=method, beam_size=4, sample_size=6, topk=3)
    torch.manual_seed(3)
    one = DAGenerator([model], d, **opts).generate([model], src)
    torch.manual_seed(3)
    three = DAGenerator([model], d, nbest=3, **opts).generate([model], src)
    with torch.no_grad():
        enc = model.encoder(src["net_input"]["src_tokens"], src_lengths=src["net_input"]["src_lengths"])
        lp, links, _ = model.decoder(enc, normalize=True)
    for b in range(2):
        assert len(one[b]) == 1 and len(three[b]) == 3
        assert three[b][0]["tokens"].tolist() == one[b][0]["tokens"].tolist()
        assert three[b][0]["dag_path"].tolist() == one[b][0]["dag_path"].tolist()
        ranks = []
        for h in three[b]:
            path, ys = h["dag_path"].tolist(), [d.bos()] + h["tokens"].tolist()
            joint = sum(float(links[b, path[k], path[k + 1]]) for k in range(len(path) - 1)) \
                + sum(float(lp[b, v, t]) for v, t in zip(path, ys))
            ranks.append(joint / len(path))  # lenpen 1
            assert abs(float(h["score"]) - joint / h["tokens"].numel()) < 1e-4
        assert ranks == sorted(ranks, reverse=True) and len({tuple(h["dag_path"].tolist()) for h in three[b]}) > 1
        if method == "sample":  # the three best of all the candidates scored
            want = sorted(three[b][0]["dag_sample_scores"].tolist(), reverse=True)[:3]
            assert all(abs(r - w) < 1e-4 for r, w in zip(ranks, want))
    g = DAGenerator([model], d, dag_decoder="viterbi", nbest=3)
    assert all(len(h) == 1 for h in g.generate([model], src))
    for bad in (0, None):
        with pytest.raises(InputError, match="--nbest"):
            DAGenerator([model], d, nbest=bad)

    class Args:
        nbest = 0

    with pytest.raises(InputError, match="--nbest"):  # fairseq-generate --nbest 0
        DAGenerator.from_generation_args([model], d, Args)


@pytest.mark.parametrize("lenpen", [0.0, 1.0, 3.0])
def test_generate_viterbi_equals_brute_force_argmax_over_the_models_paths(tiny, lenpen):
    """fairseq-generate's Viterbi on a real model: every path of the graph with each vertex's best allowed
    token (<s> / </s> at the ends), scored from the model's own outputs, the best by joint / vertices^lenpen."""
    task, model, _ = tiny
    model.eval()
    d = task.target_dictionary
    g = DAGenerator([model], d, dag_decoder="viterbi", lenpen=lenpen)
    pad = model.pad
    src, src_lengths = torch.tensor([[pad, 5, 6, 2], [7, 8, 9, 2]]), torch.tensor([3, 4])  # 12, 16 vertices
    hyps = g.generate([model], {"net_input": {"src_tokens": src, "src_lengths": src_lengths}})
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=src_lengths)
        lp, links, lengths = model.decoder(enc, normalize=True)
    forbidden = sorted({int(t) for t in g.forbidden})
    e, best_tok = vertex_scores(lp, lengths, bos=d.bos(), eos=d.eos(), forbidden=forbidden)
    for b in range(2):
        L = int(lengths[b])
        best = max(paths(L), key=lambda p: path_score(links[b], e[b], p) / len(p) ** lenpen)
        h = hyps[b][0]
        assert h["dag_path"].tolist() == list(best)
        assert h["tokens"].tolist() == [int(best_tok[b, v]) for v in best[1:]]


@pytest.mark.parametrize("method", ["greedy", "lookahead", "viterbi", "beam"])
def test_generate_on_a_padded_batch_equals_each_sentence_alone(tiny, method):
    task, model, _ = tiny
    model.eval()
    pad = model.pad
    g = DAGenerator([model], task.target_dictionary, dag_decoder=method, beam_size=3, topk=2)
    src = torch.tensor([[pad, pad, 5, 2], [7, 8, 9, 2], [pad, 11, 6, 2]])
    src_lengths = torch.tensor([2, 4, 3])
    together = g.generate([model], {"net_input": {"src_tokens": src, "src_lengths": src_lengths}})
    for b in range(3):
        n = int(src_lengths[b])
        alone = g.generate([model], {"net_input": {"src_tokens": src[b:b + 1, -n:],
                                                   "src_lengths": src_lengths[b:b + 1]}})[0][0]
        h = together[b][0]
        assert h["tokens"].tolist() == alone["tokens"].tolist()
        assert h["dag_path"].tolist() == alone["dag_path"].tolist()
        assert abs(float(h["score"]) - float(alone["score"])) < 1e-4


def _hyps(out):
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^H-(\d+)\t\S+\t(.*)$", out, re.M)}


@pytest.fixture(scope="module")
def dat_ckpt(toy_databin, tmp_path_factory):
    save = str(tmp_path_factory.mktemp("dat_ckpt"))
    proc = run_cli(["fairseq-train", toy_databin[0], "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                    "--arch", "da_transformer_tiny", "--criterion", "dag_loss", "--dag-upsample-ratio", "4",
                    "--glat-ratio-start", "0.5", "--glat-ratio-end", "0.1",
                    "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "800", "--max-update", "3",
                    "--save-dir", save, "--no-epoch-checkpoints", "--num-workers", "0", "--seed", "1",
                    "--log-format", "simple", "--log-interval", "1"])
    log = proc.stdout + proc.stderr
    assert re.search(r"dag_filtered=0\b", log) and re.search(r"dag_pairs=\d+", log), log[-2000:]
    assert re.search(r"glat_revealed=\d+", log), log[-2000:]
    return os.path.join(save, "checkpoint_last.pt")


@pytest.mark.parametrize("method", ["greedy", "lookahead", "viterbi", "beam", "sample"])
def test_train_then_fairseq_generate_with_each_decoder(toy_databin, dat_ckpt, method):
    proc = run_cli(["fairseq-generate", toy_databin[0], "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                    "--path", dat_ckpt, "--gen-subset", "test", "--batch-size", "16", "--dag-decoder", method,
                    "--dag-beam-size", "3", "--dag-sample-size", "3"])
    assert sorted(_hyps(proc.stdout)) == list(range(40)), proc.stdout[-2000:]
    assert "BLEU4" in proc.stdout


def test_fairseq_generate_beam_prints_nbest_hypotheses(toy_databin, dat_ckpt):
    proc = run_cli(["fairseq-generate", toy_databin[0], "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                    "--path", dat_ckpt, "--gen-subset", "test", "--batch-size", "16", "--dag-decoder", "beam",
                    "--dag-beam-size", "3", "--nbest", "2"])
    assert len(re.findall(r"^H-0\t", proc.stdout, re.M)) == 2, proc.stdout[-2000:]


def test_fairseq_generate_bad_decoder_is_one_line(toy_databin, dat_ckpt):
    proc = run_cli(["fairseq-generate", toy_databin[0], "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                    "--path", dat_ckpt, "--gen-subset", "test", "--dag-decoder", "nope"], check=False)
    assert proc.returncode != 0 and "--dag-decoder must be one of" in proc.stderr


def test_sample_decoder_returns_the_candidate_the_teacher_scores_best(tiny):
    from test_fertility_npd import FakeTeacher

    task, model, _ = tiny
    model.eval()
    teacher = FakeTeacher(len(task.target_dictionary) - 1)
    g = DAGenerator([model], task.target_dictionary, dag_decoder="sample", sample_size=6, topk=3, teacher=teacher,
                    npd_rank="total")
    src = torch.tensor([[1, 5, 6, 2], [7, 8, 9, 2]])
    torch.manual_seed(0)
    hyps = g.generate([model], {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([3, 4])}})
    table = teacher.token_lprobs()
    for h in hyps:
        h = h[0]
        scores = h["dag_sample_scores"]
        assert scores.numel() == 6
        assert abs(float(table[h["tokens"]].sum()) - float(scores.max())) < 1e-4


def test_inference_forward_equals_the_training_layer_loop(tiny):
    """Without autograd in eval mode the layers run through nat_decoder_inference: the same numbers."""
    task, model, _ = tiny
    model.eval()
    src = torch.tensor([[1, 5, 6, 2], [7, 8, 9, 2]])
    enc = model.encoder(src, src_lengths=torch.tensor([3, 4]))
    with torch.no_grad():
        fast_lp, fast_links, _ = model.decoder(enc, normalize=True)
    with torch.enable_grad():
        slow_lp, slow_links, _ = model.decoder(enc, normalize=True)
    torch.testing.assert_close(fast_lp, slow_lp.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fast_links, slow_links.detach(), atol=1e-4, rtol=1e-4)


def test_bad_upsample_ratio_and_too_long_graph_are_one_line_errors(toy_databin, tiny):
    with pytest.raises(InputError, match="--dag-upsample-ratio"):
        build_model_and_task(toy_databin[0], ["--arch", "da_transformer_tiny", "--dag-upsample-ratio", "0"])
    _, model, _ = tiny
    assert model.max_positions()[0] == 128 // 4  # a source needs ratio x its length decoder positions
    src = torch.full((1, 40), 5)
    src[0, -1] = 2
    enc = model.encoder(src, src_lengths=torch.tensor([40]))
    with pytest.raises(InputError, match="--max-target-positions"):
        model.decoder(enc)


def test_recipe_trains_with_glancing_and_prints_its_checkpoint(toy_databin, tmp_path):
    import subprocess

    from conftest import ROOT, cli_env

    save = tmp_path / "run"
    env = cli_env()
    env.update(LAYERS="1", DIM="32", FFN="64", HEADS="2", MAX_TOKENS="600", MAX_UPDATE="2", AVG="0", WARMUP="1",
               SAVE_INTERVAL_UPDATES="1", THREADS="1", RATIO="4", GLAT="0.5-0.1")
    cmd = ["bash", os.path.join(ROOT, "examples", "train_da_transformer.sh"), toy_databin[0], str(save),
           "-s", "src", "-t", "tgt"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == str(save / "checkpoint_last.pt")
    log = (save / "train.log").read_text()
    assert "glat_revealed" in log and "dag_filtered 0" in log
    bad = subprocess.run(cmd, env=dict(env, GLAT="2-0"), capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stderr.strip().startswith("error: GLAT")
