"""Noisy parallel decoding of nat_fertility: candidates, one batched decoder pass, one teacher-forced
teacher pass, and the choice of the best candidate (checked with a fake teacher)."""
import pytest
import torch
import torch.nn as nn

from conftest import build_model_and_task
from fairseq_nat_ext.compat import InputError
from fairseq_nat_ext.generators.nat_fertility import (NPDGenerator, candidate_fertilities, teacher_forced_inputs,
                                            teacher_scores)


class FakeEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, src_tokens, src_lengths=None):
        self.calls += 1
        return {"src": src_tokens}

    def reorder_encoder_out(self, enc, order):
        return {"src": enc["src"].index_select(0, order)}


class FakeDecoder(nn.Module):
    """log p(next token) depends on the token only (a fixed table), so a candidate's teacher score is
    the mean of the table over its tokens and </s>."""

    def __init__(self, V, seed=0):
        super().__init__()
        self.output_projection = nn.Linear(1, V)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.output_projection.weight.zero_()
            self.output_projection.bias.copy_(torch.randn(V, generator=g) * 3)
        self.calls = 0

    def forward(self, prev_output_tokens, encoder_out=None, features_only=False):
        assert features_only
        self.calls += 1
        self.rows = prev_output_tokens.size(0)
        assert encoder_out["src"].size(0) == prev_output_tokens.size(0)
        return torch.ones(prev_output_tokens.shape + (1,)), {}

    def output_layer(self, x):
        return self.output_projection(x)


class FakeTeacher(nn.Module):
    def __init__(self, V):
        super().__init__()
        self.encoder, self.decoder = FakeEncoder(), FakeDecoder(V)

    def token_lprobs(self):
        return torch.log_softmax(self.decoder.output_projection.bias.detach(), -1)


@pytest.fixture(scope="module")
def model_task(toy_databin):
    torch.manual_seed(0)
    task, model, args = build_model_and_task(toy_databin[0], ["--arch", "nat_fertility_tiny", "--dropout", "0"])
    task.load_dataset("test")
    return task, model.eval(), args


def _sample(task, n=8):
    ds = task.dataset("test")
    return ds.collater([ds[i] for i in range(n)])


def test_teacher_forced_inputs():
    tokens = torch.tensor([[5, 6, 1], [7, 1, 1], [8, 9, 4]])
    prev, target = teacher_forced_inputs(tokens, torch.tensor([2, 1, 3]), pad=1, eos=2)
    assert target.tolist() == [[5, 6, 2, 1], [7, 2, 1, 1], [8, 9, 4, 2]]
    assert prev.tolist() == [[2, 5, 6, 1], [2, 7, 1, 1], [2, 8, 9, 4]]


def test_candidate_fertilities():
    torch.manual_seed(0)
    B, S, K = 3, 5, 4
    lp = torch.log_softmax(torch.randn(B, S, K) * 3, -1)
    lp[0] = torch.log(torch.tensor([0.0, 0.0, 1.0, 0.0]).clamp(min=1e-12))  # row 0: surely 2
    lp[2] = torch.log(torch.tensor([1.0, 0.0, 0.0, 0.0]).clamp(min=1e-12))  # row 2: surely 0
    allowed = torch.tensor([[True] * 4 + [False], [False, True, True, True, False], [False, True, True, True, False]])
    f = candidate_fertilities(lp, allowed, 6)
    assert f.shape == (B, 6, S)
    expected = lp.argmax(-1).masked_fill(~allowed, 0)
    expected[2, 1] = 1  # row 2 is all 0: its first allowed position gets 1
    assert torch.equal(f[:, 0], expected)
    assert f.masked_select(~allowed.unsqueeze(1).expand_as(f)).eq(0).all()
    assert (f[0] == torch.tensor([2, 2, 2, 2, 0])).all()  # samples of a certain distribution
    # row 2 would be empty: its first allowed source token gets 1 in every candidate
    assert (f[2] == torch.tensor([0, 1, 0, 0, 0])).all()
    assert f.sum(-1).ge(1).all()
    # sampling follows the classifier: frequencies of one source position
    lp1 = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [1e-12, 1.0, 1e-12]]]))
    f = candidate_fertilities(lp1, torch.tensor([[True, True]]), 4001)[0, 1:, 0]
    freq = torch.bincount(f, minlength=3).float() / f.numel()
    assert torch.allclose(freq, torch.tensor([0.5, 0.25, 0.25]), atol=0.04)


@pytest.mark.parametrize("rank", ["total", "mean"])
def test_npd_picks_the_candidate_with_the_best_teacher_score(model_task, rank):
    task, model, _ = model_task
    V = len(task.target_dictionary) - 1  # the teacher's dictionary lacks <mask>
    teacher = FakeTeacher(V)
    gen = NPDGenerator([model], task.target_dictionary, npd_samples=5, teacher=teacher, retain_history=True,
                       npd_rank=rank)
    sample = _sample(task)
    src, src_len = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    B = src.size(0)

    calls = {"n": 0}

    def counting(orig):
        def counted(*a, **k):
            calls["n"] += 1
            return orig(*a, **k)
        return counted

    passes = ("forward", "packed_features")  # a decoder pass over padded or packed positions
    for name in passes:
        setattr(model.decoder, name, counting(getattr(model.decoder, name)))
    try:
        torch.manual_seed(3)
        hyps = gen.generate([model], sample)
    finally:
        for name in passes:
            delattr(model.decoder, name)
    assert calls["n"] == 1, "all candidates in one decoder pass"
    assert teacher.decoder.calls == 1 and teacher.encoder.calls == 1, "one teacher-forced teacher pass"

    # the same candidates again (same seed), scored one by one by the slow route
    torch.manual_seed(3)
    c = gen.candidates([model], src, src_len, 5)
    table = teacher.token_lprobs()
    eos, pad = task.target_dictionary.eos(), task.target_dictionary.pad()
    n_distinct = 0
    for b in range(B):
        best, best_score, cands = None, None, []
        for k in range(5):
            r = b * 5 + k
            toks = c["tokens"][r, : int(c["lengths"][r])].tolist() + [eos]
            cands.append(toks)
            score = float(table[toks].sum() if rank == "total" else table[toks].mean())
            assert abs(score - float(hyps[b][0]["npd_scores"][k])) < 1e-4
            if best_score is None or score > best_score + 1e-6:
                best, best_score = toks, score
        n_distinct += len({tuple(x) for x in cands}) > 1
        assert hyps[b][0]["tokens"].tolist() == best
        assert abs(float(hyps[b][0]["score"]) - best_score) < 1e-4
        assert [h["tokens"].tolist() for h in hyps[b][0]["history"]] == cands
        assert hyps[b][0]["steps"] == 1
    assert n_distinct > 0, "the sampled candidates differ from the argmax one"
    assert pad not in sum((h[0]["tokens"].tolist() for h in hyps), [])


def test_npd_decodes_and_scores_each_distinct_candidate_once(model_task):
    """A fertility sequence drawn twice for a sentence is decoded and scored once: the teacher sees one
    row per distinct (sentence, fertilities) pair, and every candidate's tokens equal decoding its own
    fertilities alone."""
    task, model, _ = model_task
    teacher = FakeTeacher(len(task.target_dictionary) - 1)
    gen = NPDGenerator([model], task.target_dictionary, npd_samples=20, teacher=teacher)
    sample = _sample(task)
    src, src_len = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    torch.manual_seed(5)
    gen.generate([model], sample)
    torch.manual_seed(5)
    c = gen.candidates([model], src, src_len, 20)
    B, s, S = c["fert"].shape
    pairs = {(b, tuple(c["fert"][b, k].tolist())) for b in range(B) for k in range(s)}
    assert teacher.decoder.rows == len(pairs) == c["unique"].numel() < B * s
    assert torch.equal(c["inverse"][c["unique"]], torch.arange(len(pairs)))
    with torch.no_grad():
        for r in range(0, B * s, 7):
            b = r // s
            e = model.encoder(src[b:b + 1], src_lengths=src_len[b:b + 1])
            alone = model.decoder(e, fertility=c["fert"][b, r % s].unsqueeze(0)).argmax(-1)[0]
            n = int(c["lengths"][r])
            assert n == alone.numel() and c["tokens"][r, :n].tolist() == alone.tolist()


def test_length_chunks():
    from fairseq_nat_ext.generators.nat_fertility import length_chunks

    lengths = torch.tensor([5, 1, 9, 3, 3, 40, 2])
    groups = length_chunks(lengths, max_tokens=10)
    assert sorted(torch.cat(groups).tolist()) == list(range(7))
    for g in groups:
        assert len(g) == 1 or len(g) * int(lengths[g].max()) <= 10
    assert [lengths[g].tolist() for g in groups] == [[1, 2, 3], [3, 5], [9], [40]]
    assert length_chunks(torch.tensor([4, 4]), max_tokens=100)[0].tolist() == [0, 1]


def test_npd_in_length_groups_equals_one_pass(model_task, monkeypatch):
    """A small NPD_CHUNK_TOKENS splits the candidates of a batch into several decoder and teacher
    passes; hypotheses, scores and every candidate's score stay the same."""
    from fairseq_nat_ext.generators import nat_fertility as fertility_gen

    task, model, _ = model_task
    teacher = FakeTeacher(len(task.target_dictionary) - 1)
    sample = _sample(task)

    def run():
        gen = NPDGenerator([model], task.target_dictionary, npd_samples=6, teacher=teacher)
        torch.manual_seed(11)
        return gen.generate([model], sample)

    one = run()
    assert teacher.decoder.calls == 1
    monkeypatch.setattr(fertility_gen, "NPD_CHUNK_TOKENS", 24)
    teacher.decoder.calls = 0
    many = run()
    assert teacher.decoder.calls > 2
    for a, b in zip(one, many):
        assert a[0]["tokens"].tolist() == b[0]["tokens"].tolist()
        assert torch.allclose(a[0]["npd_scores"], b[0]["npd_scores"], atol=1e-6)
        assert torch.allclose(a[0]["positional_scores"], b[0]["positional_scores"], atol=1e-5)


def test_teacher_scores_batched_equals_one_by_one(model_task):
    task, model, _ = model_task
    teacher = FakeTeacher(len(task.target_dictionary) - 1)
    tokens = torch.tensor([[10, 11, 12], [13, 1, 1], [14, 15, 1]])
    lengths = torch.tensor([3, 1, 2])
    src = torch.tensor([[20, 21, 2], [1, 22, 2]])
    order = torch.tensor([0, 0, 1])
    s = teacher_scores(teacher, src, torch.tensor([3, 2]), order, tokens, lengths, pad=1, eos=2)
    table = teacher.token_lprobs()
    for n in range(3):
        toks = tokens[n, : int(lengths[n])].tolist() + [2]
        assert abs(float(s[n]) - float(table[toks].mean())) < 1e-5


@pytest.mark.parametrize("rank", [None, "total", "mean"])
def test_npd_1_is_argmax_decoding_and_needs_no_teacher(model_task, rank):
    task, model, _ = model_task
    sample = _sample(task)
    gen = NPDGenerator([model], task.target_dictionary, npd_rank=rank)
    hyps = gen.generate([model], sample)
    c = gen.candidates([model], sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"], 1)
    for b, h in enumerate(hyps):
        n = int(c["lengths"][b])
        assert h[0]["tokens"][:-1].tolist() == c["tokens"][b, :n].tolist()
        # the score is the NAT's own log-probability of the output: summed unless rank=mean
        lp = c["lprobs"][b, :n]
        assert abs(float(h[0]["score"]) - float(lp.mean() if rank == "mean" else lp.sum())) < 1e-4


def test_npd_option_errors(model_task, tmp_path):
    task, model, _ = model_task
    gen = NPDGenerator([model], task.target_dictionary, npd_samples=3)
    with pytest.raises(InputError, match="needs --npd-teacher"):
        gen.configure(task.cfg)
    gen = NPDGenerator([model], task.target_dictionary, npd_samples=3, teacher_path=str(tmp_path / "none.pt"))
    with pytest.raises(InputError, match="no such file"):
        gen.configure(task.cfg)
    with pytest.raises(InputError, match=">= 1"):
        NPDGenerator([model], task.target_dictionary, npd_samples=0).configure(task.cfg)
    with pytest.raises(InputError, match="--npd-rank must be one of total, mean, got 'sum'"):
        NPDGenerator([model], task.target_dictionary, npd_rank="sum").configure(task.cfg)
    # the fertility label must agree with the training fertilities' method file
    from fairseq_nat_ext.data.fertility import write_method

    write_method(str(tmp_path), "aligner eflomal")
    cfg = type("Cfg", (), {"fertility_path": str(tmp_path), "npd_samples": 1, "npd_teacher": None})()
    NPDGenerator([model], task.target_dictionary, fertility_label="aligner").configure(cfg)
    with pytest.raises(InputError, match="trained on aligner fertilities"):
        NPDGenerator([model], task.target_dictionary, fertility_label="attention").configure(cfg)


def test_benchmark_decoding_keys_of_this_issue():
    from fairseq_nat_ext.evaluation import decoding as dec

    assert dec.canonical_decoding("npd=10,fertility=aligner") == "fertility=aligner,npd=10"
    assert dec.parse_decoding("fertility=attention,npd=1") == {"fertility": "attention", "npd": 1}
    assert dec.canonical_decoding("iter=0") == "iter=0"  # fairseq's single-pass NAT decoding
    assert dec.canonical_decoding("rank=total,npd=10,fertility=aligner") == "fertility=aligner,npd=10,rank=total"
    assert dec.canonical_decoding("npd=10,rank=mean") == "npd=10,rank=mean"
    for bad in ("fertility=bpe", "npd=0", "npd=2.5", "len_beam=0", "block=0", "rank=sum", "rank=1"):
        with pytest.raises(ValueError):
            dec.parse_decoding(bad)
    ns = dec.generation_options({"fertility": "aligner", "npd": 10}, npd_teacher="t.pt")
    assert (ns.npd_samples, ns.fertility_source, ns.npd_teacher) == (10, "aligner", "t.pt")
    assert dec.decoding_kinds({"fertility": "aligner", "npd": 10}) == {"nat"}
    ns = dec.generation_options(dec.parse_decoding("npd=10,rank=mean"))
    assert (ns.npd_samples, ns.npd_rank) == (10, "mean")
    assert dec.decoding_kinds({"npd": 10, "rank": "total"}) == {"nat"}
    assert set(NPDGenerator.decoding_keys) == {"fertility", "npd", "rank"}
    from fairseq_nat_ext.evaluation.translate import generate_flags

    assert generate_flags("npd=10,rank=total") == "--npd-samples 10 --npd-rank total"


def test_generation_args_take_precedence_over_the_task_config(model_task):
    task, model, _ = model_task
    from fairseq_nat_ext.evaluation import decoding as dec

    gen = task.build_generator([model], dec.generation_options({"npd": 1}))
    assert isinstance(gen, NPDGenerator) and gen.samples == 1
    assert gen.rank == "total"  # the task's default --npd-rank: the paper's ranking
    task.cfg.npd_rank = "mean"
    try:
        assert task.build_generator([model], dec.generation_options({"npd": 1})).rank == "mean"
        assert task.build_generator([model], dec.generation_options({"npd": 1, "rank": "total"})).rank == "total"
    finally:
        task.cfg.npd_rank = "total"
    task.cfg.npd_samples = 4
    try:
        with pytest.raises(InputError, match="--npd-samples 4 needs --npd-teacher"):  # read from the task
            task.build_generator([model], dec.generation_options({}))
        assert task.build_generator([model], dec.generation_options({"npd": 1})).samples == 1
    finally:
        task.cfg.npd_samples = 1


def test_fairseq_reranker_shim_scores_like_our_teacher_scoring(toy_databin):
    """fairseq's --iter-decode-with-external-reranker (the NPD speed baseline) crashes on dict encoder
    outputs; the compat shim restores it, and it scores candidates exactly as teacher_scores does."""
    import fairseq_nat_ext  # noqa: F401  (applies the shim)
    from fairseq import options, tasks
    from fairseq.iterative_refinement_generator import IterativeRefinementGenerator

    args = options.parse_args_and_arch(options.get_training_parser(), [
        toy_databin[0], "--task", "translation", "--arch", "transformer", "--share-all-embeddings",
        "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--dropout", "0"])
    task = tasks.setup_task(args)
    torch.manual_seed(0)
    teacher = task.build_model(args).eval()
    d = task.target_dictionary
    src = torch.tensor([[1, 20, 21, 2], [22, 23, 24, 2]])
    src_len = torch.tensor([3, 4])
    ys = [[30, 31, 32], [33], [34, 35], [36, 37, 38, 39]]  # 2 candidates per sentence
    finalized = [[{"tokens": torch.tensor([d.bos()] + y + [d.eos()]), "score": 0.0}] for y in ys]
    gen = IterativeRefinementGenerator(d, beam_size=2, reranking=True)
    with torch.no_grad():
        out = gen.rerank(teacher, finalized, [src, src_len], 2)
    tokens = torch.full((4, 4), d.pad())
    for i, y in enumerate(ys):
        tokens[i, : len(y)] = torch.tensor(y)
    lengths = torch.tensor([len(y) for y in ys])
    ours = teacher_scores(teacher, src, src_len, torch.tensor([0, 0, 1, 1]), tokens, lengths, d.pad(), d.eos())
    assert torch.allclose(torch.stack([f[0]["score"] for f in out]), ours, atol=1e-5)


def test_one_source_groups_share_cross_attention_and_match_fairseqs_forwards(model_task, toy_databin, monkeypatch):
    """At batch 1 every candidate comes from one source: the NAT decoder and a real Transformer teacher
    cross-attend to that source's UNEXPANDED encoder output (keys/values projected once) and run their
    position-wise work on the real positions only (modules/packed.py), and both vocabulary products run
    on oneDNN's prepacked weights (modules/cpu_linear.py).  Same hypotheses, candidate scores and
    positional scores as fairseq's own forwards and output layers over the output expanded to every row."""
    from fairseq import options, tasks

    from fairseq_nat_ext.generators import nat_fertility as fertility_gen

    task, model, _ = model_task
    args = options.parse_args_and_arch(options.get_training_parser(), [
        toy_databin[0], "--task", "translation", "--arch", "transformer", "--share-all-embeddings",
        "--encoder-layers", "1", "--decoder-layers", "2", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--dropout", "0"])
    torch.manual_seed(1)
    teacher = tasks.setup_task(args).build_model(args).eval()
    key_batches = []
    cross = [layer.encoder_attn.k_proj for d in (model.decoder, teacher.decoder) for layer in d.layers]
    hooks = []  # fairseq's forwards call the modules: counted by pre-hooks, registered for that pass only
    # (a hooked projection makes the fast route fall back to fairseq's forward: modules/fast_route.py)
    # the packed passes call the projections' weights through modules/cpu_linear, not the modules
    linear_module = fertility_gen.packed.cpu_linear.module

    def recorded(lin, x):
        if any(lin is c for c in cross):
            key_batches.append(x.size(1))  # encoder states (S, batch, C)
        return linear_module(lin, x)

    monkeypatch.setattr(fertility_gen.packed.cpu_linear, "module", recorded)
    # the vocabulary products (NAT and teacher) go through the prepacked product in the fast mode
    vocab_weights = {id(model.decoder.output_projection.weight), id(teacher.decoder.output_projection.weight)}
    prepacked, cpu_linear_fn = [], fertility_gen.packed.cpu_linear.linear

    # ... and, in a decoding scope, each cross-attention's keys and values as one product (k and v stacked)
    stacked_kv = [torch.cat([layer.encoder_attn.k_proj.weight, layer.encoder_attn.v_proj.weight])
                  for d in (model.decoder, teacher.decoder) for layer in d.layers]

    def recorded_linear(x, weight, bias=None):
        if id(weight) in vocab_weights and fertility_gen.packed.cpu_linear.usable(x, weight):
            prepacked.append(id(weight))
        if x.dim() == 3 and any(w.shape == weight.shape and torch.equal(w, weight) for w in stacked_kv):
            key_batches.append(x.size(1))  # encoder states (S, batch, C)
        return cpu_linear_fn(x, weight, bias)

    monkeypatch.setattr(fertility_gen.packed.cpu_linear, "linear", recorded_linear)
    ds = task.dataset("test")
    results = []
    try:
        for fast in (True, False):
            if not fast:  # fairseq's forwards on the expanded encoder output
                monkeypatch.setattr(fertility_gen, "cross_attention_rows", lambda enc, out, order: enc.reorder_encoder_out(out, order))
                monkeypatch.setattr(fertility_gen.packed, "supports_decoder", lambda decoder: False)
                monkeypatch.setattr(model.decoder, "packed_features", None, raising=False)
                monkeypatch.setattr(fertility_gen, "vocab_projection", lambda decoder: decoder.output_layer)
                hooks = [lin.register_forward_pre_hook(lambda mod, inp: key_batches.append(inp[0].size(1)))
                         for lin in cross]
            key_batches.clear()
            prepacked.clear()
            outs = []
            for i in range(4):
                gen = NPDGenerator([model], task.target_dictionary, npd_samples=8, teacher=teacher)
                torch.manual_seed(5 + i)
                outs.append(gen.generate([model], ds.collater([ds[i]]))[0][0])
            results.append(outs)
            assert key_batches and (set(key_batches) == {1} if fast else max(key_batches) > 1)
            expected = vocab_weights if fast and fertility_gen.packed.cpu_linear.available() else set()
            assert set(prepacked) == expected
    finally:
        for h in hooks:
            h.remove()
    for a, b in zip(*results):
        assert a["tokens"].tolist() == b["tokens"].tolist()
        torch.testing.assert_close(a["npd_scores"], b["npd_scores"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a["positional_scores"], b["positional_scores"], atol=1e-5, rtol=1e-5)


def _tiny_transformer(data_bin, seed=0):
    """A random fairseq transformer on the toy data-bin (its dictionary: ours without <mask>)."""
    import fairseq_nat_ext  # noqa: F401
    from fairseq import options, tasks

    args = options.parse_args_and_arch(options.get_training_parser(), [
        data_bin, "--task", "translation", "--arch", "transformer", "--share-all-embeddings",
        "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--dropout", "0"])
    task = tasks.setup_task(args)
    torch.manual_seed(seed)
    return task.build_model(args).eval()


def _plain_teacher_log_prob(teacher, src, y, eos):
    """log p_teacher(y | src) by the chain rule, one full teacher call per target position (no cache, no
    packing): y ends in </s>; the decoder reads </s> then y's prefix."""
    total = 0.0
    with torch.no_grad():
        for t in range(len(y)):
            prev = torch.tensor([[eos] + y[:t]])
            logits, _ = teacher(src.unsqueeze(0), torch.tensor([src.numel()]), prev)
            total += float(torch.log_softmax(logits[0, -1].double(), -1)[y[t]])
    return total


def test_npd_rank_follows_the_paper_against_a_plain_teacher(model_task, toy_databin):
    """Gu et al. 2018 keep the NPD candidate of highest teacher log-probability: with rank=total (the
    default) the returned hypothesis is, for every sentence, the candidate whose total log p_teacher (a
    plain chain-rule loop over a real fairseq transformer) is the largest; rank=mean divides each by its
    length (tokens and </s>).  The two rankings pick differently for some sentence."""
    task, model, _ = model_task
    d = task.target_dictionary
    teacher = _tiny_transformer(toy_databin[0], seed=1)
    sample = _sample(task, n=8)
    src_tokens = sample["net_input"]["src_tokens"]
    s, picked = 6, {}
    for rank in (None, "total", "mean"):
        gen = NPDGenerator([model], d, npd_samples=s, teacher=teacher, retain_history=True, npd_rank=rank)
        torch.manual_seed(11)
        hyps = gen.generate([model], sample)
        picked[rank] = []
        for b in range(src_tokens.size(0)):
            src = src_tokens[b][src_tokens[b].ne(d.pad())]
            cands = [h["tokens"].tolist() for h in hyps[b][0]["history"]]
            assert len(cands) == s and all(c[-1] == d.eos() for c in cands)
            totals = [_plain_teacher_log_prob(teacher, src, c, d.eos()) for c in cands]
            scores = [t / len(c) for t, c in zip(totals, cands)] if rank == "mean" else totals
            best = max(range(s), key=lambda k: (scores[k], -k))  # ties: the lowest candidate
            assert hyps[b][0]["tokens"].tolist() == cands[best]
            assert abs(float(hyps[b][0]["score"]) - scores[best]) < 1e-3
            assert torch.allclose(hyps[b][0]["npd_scores"].double(), torch.tensor(scores, dtype=torch.double),
                                  atol=1e-3)
            picked[rank].append(cands[best])
    assert picked[None] == picked["total"]
    assert picked["total"] != picked["mean"], "the rankings differ for some sentence"


def test_npd_positional_scores_of_the_returned_candidate_are_the_nats_log_probs(model_task):
    """s > 1 keeps the candidates' logits and reads the log-probs of the returned candidate only: they
    equal the NAT's own forward (log_softmax over the vocabulary at the output tokens).  (Several groups
    compute every candidate's log-probs: test_npd_in_length_groups_equals_one_pass compares the two.)"""
    from fairseq_nat_ext.generators import nat_fertility as fertility_gen

    task, model, _ = model_task
    teacher = FakeTeacher(len(task.target_dictionary) - 1)
    gen = NPDGenerator([model], task.target_dictionary, npd_samples=6, teacher=teacher)
    for b in range(4):  # one sentence: one group, the logits kept
        sample = _sample(task, n=8)
        src = sample["net_input"]["src_tokens"][b:b + 1]
        src_len = sample["net_input"]["src_lengths"][b:b + 1]
        src = src[:, src.ne(task.target_dictionary.pad()).any(0)]
        torch.manual_seed(b)
        hyp = gen.generate([model], {"net_input": {"src_tokens": src, "src_lengths": src_len}})[0][0]
        torch.manual_seed(b)
        c = gen.candidates([model], src, src_len, 6)
        assert "logits" in c and c["lprobs"] is None and len(c["chunks"]) == 1
        k = int(hyp["npd_scores"].argmax())  # the returned candidate (ties: the first, as generate)
        with torch.no_grad():
            e = model.encoder(src, src_lengths=src_len)
            lp = model.decoder(e, fertility=c["fert"][0, k].unsqueeze(0), normalize=True)[0]
        toks = hyp["tokens"][:-1]
        ref = lp[torch.arange(toks.numel()), toks]
        assert torch.allclose(hyp["positional_scores"][:-1], ref, atol=1e-5)
        assert float(hyp["positional_scores"][-1]) == 0.0
