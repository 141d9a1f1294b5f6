"""Property tests (hypothesis): random lengths, padding and batch composition.

* attention (every registered variant and per-head mixes): outputs at real positions do not depend on
  the padding (side, amount, content) nor on the other sequences of the batch;
* Mask-Predict decoder: logits and length predictions of a sentence do not depend on padding or batch;
* decoders (Mask-Predict, Levenshtein, Insertion): every hypothesis is inside the vocabulary, ends with
  a single </s>, holds no <pad>/<s>/<mask>, never exceeds the model's max length, stops within
  --iter-decode-max-iter rounds, and is the same whether the sentence is decoded alone or in a batch.
Models are tiny, random and in float64 (fairseq's attention still takes its softmax in float32, so
"does not depend" is checked to float32 rounding, far below what any padding leak would give); a
``boost`` pushes their length / insertion heads to the limit so the max-length cap is exercised.
The oracles' own property tests are in test_oracle_levenshtein.py and test_oracle_insertion.py.
"""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import build_model_and_task

import fairseq_nat_ext  # noqa: F401
from fairseq_nat_ext.generators.edit import EditGenerator, InsertionGenerator
from fairseq_nat_ext.generators.mask_predict import MaskPredictGenerator
from fairseq_nat_ext.modules.attention import ATTENTION_REGISTRY, AttentionOptions, EfficientSelfAttention

OPTS = AttentionOptions(attention_window=2, attention_stride=3, strided_window=1, global_tokens=2,
                        bigbird_window_blocks=3, bigbird_global_blocks=1, bigbird_random_blocks=1, linformer_k=4,
                        compress_kernel=2, performer_features=16, max_positions=32, block_size=2,
                        lsh_bucket_size=2, lsh_rounds=2, routing_clusters=3)
SPECS = [[(name, 2)] for name in sorted(ATTENTION_REGISTRY)] + [
    [("local", 1), ("linear", 1)], [("bigbird", 1), ("lsh", 1)], [("global", 1), ("linformer", 1)]]
#: variants computing a part in float32 on purpose (sinkhorn's normalisation): rounding-level differences
FLOAT32_INSIDE = {"sinkhorn"}
MAX_TGT = 12  # decoder max positions of the property models: small, so the cap is reached
FAST = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


# ---- attention --------------------------------------------------------------------------------

@settings(max_examples=60, **FAST)
@given(spec=st.sampled_from(SPECS), lengths=st.lists(st.integers(1, 11), min_size=1, max_size=4),
       extra=st.integers(0, 4), left=st.booleans(), seed=st.integers(0, 10_000))
def test_attention_real_outputs_ignore_padding_and_batch(spec, lengths, extra, left, seed):
    torch.manual_seed(seed)
    layer = EfficientSelfAttention(8, 2, spec, OPTS).double().eval()
    B, T = len(lengths), max(lengths) + extra
    x = torch.randn(T, B, 8, dtype=torch.float64) * 3  # padding positions hold garbage too
    pos = torch.arange(T)
    pad = torch.stack([pos < T - n if left else pos >= n for n in lengths])  # (B, T) True at padding
    with torch.no_grad():
        out, _ = layer(x, x, x, key_padding_mask=pad)
        for b, n in enumerate(lengths):
            real = (~pad[b]).nonzero().squeeze(1)
            alone, _ = layer(x[real, b:b + 1], x[real, b:b + 1], x[real, b:b + 1], key_padding_mask=None)
            tol = 1e-5 if any(name in FLOAT32_INSIDE for name, _ in spec) else 1e-9  # a leak would be O(1)
            torch.testing.assert_close(out[real, b], alone[:, 0], rtol=tol, atol=tol)
            assert torch.isfinite(out).all()


# ---- models -----------------------------------------------------------------------------------

DIMS = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--dropout", "0", "--max-target-positions", str(MAX_TGT)]

#: arch -> (fairseq-train flags, generator class); one line per decoder
DECODERS = {
    "mask_predict": (["--arch", "mask_predict_tiny"], MaskPredictGenerator),
    "levenshtein": (["--arch", "levenshtein_tiny"], EditGenerator),
    "insertion": (["--arch", "insertion_tiny"], InsertionGenerator),
}


@pytest.fixture(scope="module")
def models(toy_databin):
    out = {}
    for name, (flags, _) in DECODERS.items():
        torch.manual_seed(0)
        task, model, _ = build_model_and_task(toy_databin[0], flags + DIMS)
        out[name] = (task, model.double().eval())
    return out


def _boost(model, on):
    """Mask-Predict: push the length head towards its largest class (undone with on=False)."""
    with torch.no_grad():
        model.decoder.length_proj.bias[-1] += 8.0 if on else -8.0


def _sources(task, token_lists, extra):
    """Left-padded (fairseq's default) source batch ending in </s>."""
    d = task.source_dictionary
    rows = [torch.tensor(t + [d.eos()]) for t in token_lists]
    T = max(len(r) for r in rows) + extra
    src = torch.full((len(rows), T), d.pad(), dtype=torch.long)
    for b, r in enumerate(rows):
        src[b, T - len(r):] = r
    return src, torch.tensor([len(r) for r in rows])


def _token_lists(task):
    d = task.source_dictionary
    word = st.integers(d.nspecial, len(d) - 2)  # the last symbol is <mask>
    return st.lists(st.lists(word, min_size=1, max_size=10), min_size=1, max_size=4)


@settings(max_examples=25, **FAST)
@given(data=st.data())
def test_mask_predict_decoder_ignores_padding_and_batch(models, data):
    task, model = models["mask_predict"]
    srcs = data.draw(_token_lists(task))
    extra = data.draw(st.integers(0, 3))
    tgt_len = data.draw(st.lists(st.integers(1, MAX_TGT - 2), min_size=len(srcs), max_size=len(srcs)))
    tgt_extra = data.draw(st.integers(0, 3))
    V = len(task.target_dictionary)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 10_000)))
    src, src_len = _sources(task, srcs, extra)
    T = max(tgt_len) + tgt_extra
    prev = torch.randint(task.target_dictionary.nspecial, V, (len(srcs), T), generator=g)
    for b, n in enumerate(tgt_len):
        prev[b, n:] = model.pad
    tol = 1e-6  # fairseq's MultiheadAttention takes its softmax in float32 even in a float64 model
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=src_len)
        logits = model.decoder(prev, enc)
        length = model.decoder.forward_length(enc)
        for b, n in enumerate(tgt_len):
            s, _ = _sources(task, [srcs[b]], 0)
            enc_b = model.encoder(s, src_lengths=src_len[b:b + 1])
            torch.testing.assert_close(logits[b, :n], model.decoder(prev[b:b + 1, :n], enc_b)[0], rtol=tol, atol=tol)
            torch.testing.assert_close(length[b], model.decoder.forward_length(enc_b)[0], rtol=tol, atol=tol)


def _check_hypothesis(hyp, model, task, max_iter):
    d = task.target_dictionary
    toks = hyp["tokens"]
    assert toks.dtype == torch.long and toks.dim() == 1 and toks.numel() >= 1
    assert int(toks.min()) >= 0 and int(toks.max()) < len(d), "inside the vocabulary"
    assert int(toks[-1]) == d.eos() and not toks[:-1].eq(d.eos()).any(), "one </s>, at the end"
    for special in (d.pad(), d.bos(), model.mask_idx):
        assert not toks.eq(special).any()
    assert toks.numel() <= model.max_positions()[1], "never longer than the model's max length"
    assert 1 <= hyp["steps"] <= max_iter, "stops within the iteration budget"
    assert hyp["positional_scores"].numel() == toks.numel() and torch.isfinite(hyp["score"]).all()


@settings(max_examples=45, **FAST)
@given(data=st.data(), arch=st.sampled_from(sorted(DECODERS)), max_iter=st.integers(1, 4),
       beam=st.integers(1, 3), adaptive=st.booleans(), boost=st.booleans())
def test_decoders_stay_in_vocabulary_and_length_terminate_and_ignore_batch(models, data, arch, max_iter, beam,
                                                                           adaptive, boost):
    task, model = models[arch]
    gen_cls = DECODERS[arch][1]
    srcs = data.draw(_token_lists(task))
    extra = data.draw(st.integers(0, 3))
    kw = dict(max_iter=max_iter, adaptive=adaptive)
    if gen_cls is MaskPredictGenerator:
        kw["length_beam"] = beam
    elif boost:  # edit decoders: a large placeholder / end-of-slot penalty makes them insert everywhere
        kw["placeholder_penalty"] = 10.0
    gen = gen_cls([model], task.target_dictionary, **kw)
    src, src_len = _sources(task, srcs, extra)
    boosted = boost and gen_cls is MaskPredictGenerator
    if boosted:
        _boost(model, True)
    try:
        batch = gen.generate([model], {"net_input": {"src_tokens": src, "src_lengths": src_len}})
        assert len(batch) == len(srcs)
        for b, hyps in enumerate(batch):
            _check_hypothesis(hyps[0], model, task, max_iter)
            s, sl = _sources(task, [srcs[b]], 0)
            alone = gen.generate([model], {"net_input": {"src_tokens": s, "src_lengths": sl}})[0][0]
            assert torch.equal(alone["tokens"], hyps[0]["tokens"]), "the same alone and in a batch"
    finally:
        if boosted:
            _boost(model, False)


@pytest.mark.parametrize("arch", sorted(DECODERS))
def test_the_length_cap_is_reached_when_boosted(models, arch):
    """The max-length property above is not vacuous: boosted models do hit the cap, and stop there."""
    task, model = models[arch]
    gen_cls = DECODERS[arch][1]
    kw = {} if gen_cls is MaskPredictGenerator else {"placeholder_penalty": 10.0}
    gen = gen_cls([model], task.target_dictionary, max_iter=6, **kw)
    src, src_len = _sources(task, [[5, 6, 7], [8, 9]], 0)
    if gen_cls is MaskPredictGenerator:
        _boost(model, True)
    try:
        hyps = gen.generate([model], {"net_input": {"src_tokens": src, "src_lengths": src_len}})
    finally:
        if gen_cls is MaskPredictGenerator:
            _boost(model, False)
    limit = model.max_positions()[1]
    assert max(h[0]["tokens"].numel() for h in hyps) == limit
