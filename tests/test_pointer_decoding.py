"""Pointer decoding: validity masks against an enumeration of the valid outputs, beam search against
exhaustive search, random logits never producing an invalid output, models' incremental decoding
against their full forward."""
import argparse
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fairseq_nat_ext  # noqa: F401
from fairseq_nat_ext.generators.pointer_geometry import PointerGenerator
from fairseq_nat_ext.generators.pointer_constraints import build_constraint
from fairseq_nat_ext.models.pointer.common import reorder_batch
from fairseq_nat_ext.tasks.pointer_geometry import position_dictionary

DICT = position_dictionary(50)


# ---- slow references: the valid outputs (slots, end = 0), written out ---------------------------

def hull_outputs(n):
    out = []
    for f in range(1, n + 1):
        higher = range(f + 1, n + 1)
        for k in range(2, n - f + 1):
            for rest in itertools.permutations(higher, k):
                out.append((f,) + rest + (f, 0))
    return out


def tsp_outputs(n):
    return [(1,) + p + (1, 0) for p in itertools.permutations(range(2, n + 1)) if n < 3 or p[0] < p[-1]]


def delaunay_outputs(n):
    triples = list(itertools.combinations(range(1, n + 1), 3))
    out = []
    for k in range(1, max(1, 2 * n - 5) + 1):
        for combo in itertools.combinations(triples, k):  # combinations keep the lexicographic order
            out.append(tuple(v for t in combo for v in t) + (0,))
    return out


OUTPUTS = {"convex_hull": hull_outputs, "tsp": tsp_outputs, "delaunay": delaunay_outputs}


def valid(problem, n, seq):
    """Independent check of one output (slots, ending with the end slot 0)."""
    seq = list(seq)
    if not seq or seq[-1] != 0 or 0 in seq[:-1]:
        return False
    body = seq[:-1]
    if any(not 1 <= v <= n for v in body):
        return False
    if problem == "convex_hull":
        ring = body[:-1]
        return (len(body) >= 4 and body[0] == body[-1] and len(set(ring)) == len(ring)
                and min(ring) == ring[0])
    if problem == "tsp":
        ring = body[:-1]
        return (len(body) == n + 1 and body[0] == body[-1] == 1 and sorted(ring) == list(range(1, n + 1))
                and ring[1] < ring[-1])
    if len(body) % 3 or not body:
        return False
    tris = [tuple(body[i:i + 3]) for i in range(0, len(body), 3)]
    return (all(a < b < c for a, b, c in tris) and all(x < y for x, y in zip(tris, tris[1:]))
            and len(tris) <= max(1, 2 * n - 5))


# ---- masks == the enumeration -----------------------------------------------------------------------

@pytest.mark.parametrize("problem,n", [("convex_hull", 3), ("convex_hull", 5), ("convex_hull", 6),
                                       ("tsp", 3), ("tsp", 4), ("tsp", 6),
                                       ("delaunay", 3), ("delaunay", 4), ("delaunay", 5)])
def test_masks_allow_exactly_the_continuations_of_valid_outputs(problem, n):
    outputs = OUTPUTS[problem](n)
    assert all(valid(problem, n, o) for o in outputs)
    S = n + 3  # two padding slots: a real batch has longer inputs too
    prefixes = sorted({o[:t] for o in outputs for t in range(len(o))}, key=len)
    children = {}
    for o in outputs:
        for t in range(len(o)):
            children.setdefault(o[:t], set()).add(o[t])
    for t in sorted({len(p) for p in prefixes}):
        batch = [p for p in prefixes if len(p) == t]
        cons = build_constraint(problem, torch.full((len(batch),), n), S)
        for step in range(t):
            cons.advance(torch.tensor([p[step] for p in batch]), torch.ones(len(batch), dtype=torch.bool))
        allowed = cons.allowed()
        for row, p in enumerate(batch):
            assert set(torch.nonzero(allowed[row]).view(-1).tolist()) == children[p], (problem, n, p)
    assert max(len(o) for o in outputs) <= int(cons.max_steps[0])


# ---- a deterministic fake model: log-probs are a function of (sentence, prefix) --------------------

class FakePointerModel:
    """Log-probs from a random table indexed by the sentence and a rolling hash of the prefix."""

    def __init__(self, batch, num_slots, seed, buckets=997):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(batch, buckets, num_slots, generator=g) * 3
        self.buckets = buckets

    def eval(self):
        return self

    def encode(self, coords, lengths):
        B, N, _ = coords.shape
        mask = torch.arange(N + 1).unsqueeze(0) <= lengths.unsqueeze(1)
        return {"sid": torch.arange(B), "slot_mask": mask}

    def reorder_encoder_out(self, enc, order):
        return reorder_batch(enc, order)

    def reorder_state(self, state, order):
        return reorder_batch(state, order)

    def init_state(self, enc):
        return {"h": torch.zeros_like(enc["sid"])}

    def decode_step(self, enc, prev, state):
        h = (state["h"] * 31 + prev + 1) % self.buckets
        logits = self.table[enc["sid"], h][:, :enc["slot_mask"].size(1)]
        logits = logits.masked_fill(~enc["slot_mask"], float("-inf"))
        return torch.log_softmax(logits, -1), {"h": h}


def sequence_score(model, b, n_slots_batch, seq):
    """Reference: sum of log-probs of ``seq`` for sentence b, one step at a time."""
    enc = {"sid": torch.tensor([b]), "slot_mask": n_slots_batch[b:b + 1]}
    state, prev, total = model.init_state(enc), torch.zeros(1, dtype=torch.long), 0.0
    for s in seq:
        lp, state = model.decode_step(enc, prev, state)
        total += float(lp[0, s])
        prev = torch.tensor([s])
    return total


def run(problem, lengths, beam, seed=0, nbest=None, constrained=True, model=None):
    lengths = torch.tensor(lengths)
    B, N = len(lengths), int(lengths.max())
    model = model or FakePointerModel(B, N + 1, seed)
    gen = PointerGenerator([model], DICT, problem, beam=beam, nbest=nbest or beam, constrained=constrained)
    sample = {"net_input": {"src_coords": torch.rand(B, N, 2), "src_lengths": lengths}}
    return model, gen.generate([model], sample)


def slots_of(hypo):
    t = hypo["tokens"]
    return tuple(torch.where(t == DICT.eos(), torch.zeros_like(t), t - (DICT.nspecial - 1)).tolist())


@pytest.mark.parametrize("problem,n", [("convex_hull", 4), ("convex_hull", 5), ("tsp", 5), ("delaunay", 4)])
def test_wide_beam_search_is_exact_and_ranks_by_model_score(problem, n):
    outputs = OUTPUTS[problem](n)
    lengths = [n, n - 1 if problem != "tsp" else n, n]  # mixed sizes: padding slots in the batch
    K = 24 if problem != "convex_hull" or n < 5 else 80
    model, hypos = run(problem, lengths, beam=K, seed=1)
    mask = torch.arange(max(lengths) + 1).unsqueeze(0) <= torch.tensor(lengths).unsqueeze(1)
    for b, hyps in enumerate(hypos):
        ref = sorted(((sequence_score(model, b, mask, o), o) for o in OUTPUTS[problem](lengths[b])),
                     key=lambda x: -x[0])
        assert len(hyps) == min(K, len(ref))
        assert slots_of(hyps[0]) == ref[0][1]
        for h, (score, seq) in zip(hyps, ref):
            assert h["score"] == pytest.approx(score, abs=1e-4)
            assert sum(h["positional_scores"].tolist()) == pytest.approx(h["score"], abs=1e-4)
            assert h["tokens"][-1] == DICT.eos() and h["alignment"] is None
        assert [h["score"] for h in hyps] == sorted((h["score"] for h in hyps), reverse=True)
    assert len(outputs) > 1


@pytest.mark.parametrize("problem", ["convex_hull", "tsp", "delaunay"])
def test_greedy_equals_stepwise_reference(problem):
    lengths = [7, 5, 6]
    model, hypos = run(problem, lengths, beam=1, seed=2)
    mask = torch.arange(8).unsqueeze(0) <= torch.tensor(lengths).unsqueeze(1)
    for b, hyps in enumerate(hypos):
        n = lengths[b]
        outputs = OUTPUTS[problem](n) if problem != "delaunay" else None
        enc = {"sid": torch.tensor([b]), "slot_mask": mask[b:b + 1]}
        state, prev, seq = model.init_state(enc), torch.zeros(1, dtype=torch.long), ()
        while not seq or seq[-1] != 0:
            lp, state = model.decode_step(enc, prev, state)
            if outputs is not None:
                ok = {o[len(seq)] for o in outputs if o[:len(seq)] == seq}
            else:  # Delaunay n=6 is too big to enumerate: continuations by the validity rules
                ok = {s for s in range(n + 1) if _delaunay_prefix_ok(n, seq + (s,))}
            best = max(ok, key=lambda s: float(lp[0, s]))
            seq += (best,)
            prev = torch.tensor([best])
        assert slots_of(hyps[0]) == seq


def _delaunay_prefix_ok(n, seq):
    """Can ``seq`` be extended to a valid Delaunay output (sorted, increasing triangles)?"""
    if seq[-1] == 0:
        return valid("delaunay", n, seq)
    body = list(seq)
    full = [tuple(body[i:i + 3]) for i in range(0, len(body) - len(body) % 3, 3)]
    part = tuple(body[len(full) * 3:])
    if len(full) + (1 if part else 0) > max(1, 2 * n - 5):
        return False
    if not all(a < b < c for a, b, c in full) or not all(x < y for x, y in zip(full, full[1:])):
        return False
    if not part:
        return True
    last = full[-1] if full else (0, 0, 0)
    return any(t[:len(part)] == part and t > last for t in itertools.combinations(range(1, n + 1), 3))


@settings(max_examples=40, deadline=None)
@given(problem=st.sampled_from(["convex_hull", "tsp", "delaunay"]),
       lengths=st.lists(st.integers(3, 11), min_size=1, max_size=4),
       beam=st.integers(1, 4), seed=st.integers(0, 10 ** 6))
def test_random_logits_never_give_an_invalid_output(problem, lengths, beam, seed):
    _, hypos = run(problem, lengths, beam=beam, seed=seed)
    for n, hyps in zip(lengths, hypos):
        assert hyps
        for h in hyps:
            assert valid(problem, n, slots_of(h)), (problem, n, slots_of(h))
            assert math.isfinite(h["score"])


@settings(max_examples=15, deadline=None)
@given(problem=st.sampled_from(["convex_hull", "tsp", "delaunay"]),
       lengths=st.lists(st.integers(3, 9), min_size=1, max_size=3), seed=st.integers(0, 10 ** 6))
def test_unconstrained_decoding_ends_within_the_bound(problem, lengths, seed):
    _, hypos = run(problem, lengths, beam=2, seed=seed, constrained=False)
    for n, hyps in zip(lengths, hypos):
        for h in hyps:
            s = slots_of(h)
            bound = n + 2 if problem != "delaunay" else 3 * max(1, 2 * n - 5) + 1
            assert s[-1] == 0 and 0 not in s[:-1] and len(s) <= bound and max(s) <= n


def test_generator_rejects_bad_options():
    from fairseq_nat_ext.compat import InputError

    with pytest.raises(InputError, match="nbest"):
        PointerGenerator([], DICT, "tsp", beam=2, nbest=3)
    _, _ = run("tsp", [4], beam=1)
    with pytest.raises(InputError, match="at least 3 points"):
        run("tsp", [2, 4], beam=1)


# ---- real models --------------------------------------------------------------------------------

def build(arch, extra=()):
    from fairseq import options, tasks

    from conftest import PLUGIN_DIR

    import tempfile

    d = tempfile.mkdtemp()
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [d, "--user-dir", PLUGIN_DIR, "--task", "pointer_geometry",
                                                "--problem", "tsp", "--arch", arch] + list(extra))
    task = tasks.setup_task(args)
    return task, task.build_model(args)


SMALL = {"pointer_lstm": ["--pointer-hidden-dim", "16", "--pointer-embed-dim", "8", "--pointer-layers", "2"],
         "pointer_transformer": ["--encoder-embed-dim", "16", "--encoder-attention-heads", "2",
                                 "--encoder-ffn-embed-dim", "32", "--encoder-layers", "2", "--decoder-layers", "2"]}


@pytest.mark.parametrize("arch,extra", [("pointer_lstm", []), ("pointer_transformer", []),
                                        ("pointer_transformer", ["--pointer-index-range", "64"])])
def test_incremental_decoding_equals_full_forward_and_ignores_padding(arch, extra):
    torch.manual_seed(0)
    _, model = build(arch, SMALL[arch] + extra)
    model.eval()
    lengths = torch.tensor([6, 4, 5])
    coords = torch.rand(3, 6, 2)
    prev = torch.randint(1, 5, (3, 7))
    prev[:, 0] = 0
    with torch.no_grad():
        full = torch.log_softmax(model(None, lengths, coords, prev), -1)  # (B, T, S)
        enc = model.encode(coords, lengths)
        state = model.init_state(enc)
        for t in range(prev.size(1)):
            lp, state = model.decode_step(enc, prev[:, t], state)
            assert torch.allclose(lp, full[:, t], atol=1e-5), t
        # the second sentence alone, without padding, gives the same distribution
        alone = torch.log_softmax(model(None, lengths[1:2], coords[1:2, :4], prev[1:2]), -1)
        assert torch.allclose(alone, full[1:2, :, :5], atol=1e-5)
        assert torch.isinf(full[1, :, 5:]).all()  # padding slots are impossible


def test_transformer_encoder_sees_point_indices_only_with_the_index_embedding():
    """Without the index embedding the encoder is permutation-equivariant (the canonical start and
    direction, which depend on indices, cannot be learnt); with it, reordering the points changes
    what each point's memory row holds."""
    coords = torch.rand(2, 7, 2)
    lengths = torch.tensor([7, 7])
    perm = torch.randperm(7)
    for index_embed, equivariant in ((False, True), (True, False)):
        torch.manual_seed(0)
        _, model = build("pointer_transformer", SMALL["pointer_transformer"]
                         + ([] if index_embed else ["--no-pointer-index-embed"]))
        assert model.index_embed is index_embed
        model.eval()
        with torch.no_grad():
            mem = model.encode(coords, lengths)["memory"]  # (B, 8, D): end slot, then the points
            mem_perm = model.encode(coords[:, perm], lengths)["memory"]
        same = torch.allclose(mem_perm[:, 1:], mem[:, 1:][:, perm], atol=1e-5)
        assert same is equivariant
        assert torch.allclose(mem_perm[:, 0], mem[:, 0], atol=1e-5) is equivariant


def test_randomised_index_positions():
    """--pointer-index-range L: in training every example's n points take a sorted uniform random
    subset of 1..L (checked against the enumeration of all subsets), at inference the evenly spaced
    1 + floor(k L / n); padding does not move the real points' positions; n > L is a one-line error."""
    from fairseq_nat_ext.compat import InputError

    _, model = build("pointer_transformer", SMALL["pointer_transformer"] + ["--pointer-index-range", "5"])
    assert model.index_range == 5
    lengths = torch.tensor([2, 5, 1])
    model.eval()
    pos = model.index_positions(lengths, 5)
    assert pos[0, :2].tolist() == [1, 3] and pos[1].tolist() == [1, 2, 3, 4, 5] and pos[2, 0].item() == 1
    assert torch.equal(model.index_positions(lengths[:1], 2), pos[:1, :2])  # padding width: no effect
    model.train()
    torch.manual_seed(0)
    counts = {s: 0 for s in itertools.combinations(range(1, 6), 2)}  # the reference: all 10 subsets
    draws = 4000
    for _ in range(draws // 100):
        pos = model.index_positions(torch.full((100,), 2), 3)
        for row in pos[:, :2].tolist():
            counts[tuple(row)] += 1  # a KeyError would mean an unsorted, repeated or out-of-range pair
        assert torch.equal(model.index_positions(torch.full((100,), 5), 5)[0], torch.arange(1, 6))
    expected = draws / len(counts)
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 27.9, counts  # chi-square, 9 degrees of freedom, p = 0.001
    with pytest.raises(InputError, match="--pointer-index-range 5"):
        model.index_positions(torch.tensor([6, 3]), 6)
    model.eval()
    with pytest.raises(InputError, match="--pointer-index-range 5"):
        model.encode(torch.rand(1, 6, 2), torch.tensor([6]))


@pytest.mark.parametrize("arch", ["pointer_lstm", "pointer_transformer"])
def test_real_models_decode_valid_tours_and_ensembles_work(arch):
    torch.manual_seed(1)
    task, model = build(arch, SMALL[arch])
    _, model2 = build(arch, SMALL[arch])
    lengths = torch.tensor([5, 8, 3])
    sample = {"net_input": {"src_coords": torch.rand(3, 8, 2), "src_lengths": lengths}}
    gen = PointerGenerator([model, model2], task.target_dictionary, "tsp", beam=3, nbest=2)
    hypos = gen.generate([model, model2], sample)
    for n, hyps in zip(lengths.tolist(), hypos):
        assert len(hyps) == (2 if n > 3 else 1)  # n = 3 has a single canonical tour
        for h in hyps:
            assert valid("tsp", n, slots_of(h))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_decoding_on_cuda_matches_cpu():
    torch.manual_seed(2)
    task, model = build("pointer_transformer", SMALL["pointer_transformer"])
    sample = {"net_input": {"src_coords": torch.rand(4, 9, 2), "src_lengths": torch.tensor([9, 7, 5, 8])}}
    gen = PointerGenerator([model], task.target_dictionary, "convex_hull", beam=4)
    cpu = gen.generate([model], sample)
    model.cuda()
    cuda_sample = {"net_input": {k: v.cuda() for k, v in sample["net_input"].items()}}
    gpu = gen.generate([model], cuda_sample)
    for a, b in zip(cpu, gpu):
        assert a[0]["tokens"].tolist() == b[0]["tokens"].cpu().tolist()
        assert a[0]["score"] == pytest.approx(b[0]["score"], abs=1e-3)
