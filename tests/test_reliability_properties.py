"""Property tests (hypothesis): random lengths, padding and batch composition.

* attention (every registered variant and per-head mixes): outputs at real positions do not depend on
  the padding (side, amount, content) nor on the other sequences of the batch;
* Mask-Predict decoder: logits and length predictions of a sentence do not depend on padding or batch;
* decoders (every NAT generator of the plugin: Mask-Predict, Levenshtein, Insertion, CTC greedy and
  prefix beam, Imputer, iterative refinement, nat_fertility's argmax-fertility decoding, KERMIT
  translation and joint generation): every hypothesis is inside the vocabulary, ends with a single
  </s>, holds no <pad>/<s>/<mask>/<blank>/<gap>, never exceeds the model's max target length, stops
  within its budget of decoder passes, and is the same whether the sentence is decoded alone or in a
  batch.
Models are tiny, random and in float64 (fairseq's attention still takes its softmax in float32, so
"does not depend" is checked to float32 rounding, far below what any padding leak would give); a
boost pushes each decoder towards long outputs (its length / fertility head, alignment logits, or its
insertion penalty: one ``DECODERS`` row each) so that the max-length cap is exercised.
The oracles' own property tests are in test_oracle_levenshtein.py and test_oracle_insertion.py.
"""
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, Optional

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import build_model_and_task

import fairseq_nat_ext  # noqa: F401
from fairseq_nat_ext.generators.ctc_nat import CTCGenerator
from fairseq_nat_ext.generators.insertion import InsertionGenerator
from fairseq_nat_ext.generators.levenshtein import EditGenerator
from fairseq_nat_ext.generators.imputer import ImputerGenerator
from fairseq_nat_ext.generators.kermit import KermitGenerator
from fairseq_nat_ext.generators.mask_predict import MaskPredictGenerator
from fairseq_nat_ext.generators.nat_fertility import NPDGenerator
from fairseq_nat_ext.generators.iterative_refinement import RefinementGenerator
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
#: a single-stack model (KERMIT) has no decoder options: its canvas <s> x </s> y </s> holds MAX_TGT per side
STACK_DIMS = [x for flag, value in zip(DIMS[::2], DIMS[1::2])
              if not flag.startswith("--decoder-") and flag != "--max-target-positions"
              for x in (flag, value)] + ["--max-source-positions", str(2 * MAX_TGT + 1)]
PENALTY = 10.0  # a large placeholder / end-of-slot penalty makes the insertion decoders insert everywhere


@contextmanager
def _raised(param, index, amount=8.0):
    """param[index] += amount while inside (the exact old values come back after)."""
    old = param.detach().clone()
    with torch.no_grad():
        param[index] += amount
    try:
        yield
    finally:
        with torch.no_grad():
            param.copy_(old)


def _longest_length_class(model):
    """Mask-Predict, iterative refinement: the length head prefers its largest class."""
    return _raised(model.decoder.length_proj.bias, -1)


def _largest_fertility(model):
    """nat_fertility: every source token gets the largest fertility (sum: far beyond the cap)."""
    return _raised(model.decoder.fertility_proj[-1].bias, -1)


@contextmanager
def _alternating_tokens(model):
    """CTC, Imputer: a large bonus for one word at even and another at odd alignment positions, so
    no position is blank and no neighbours repeat: the collapsed output is as long as the alignment
    (r x the source length, which a 7-token source makes longer than the cap)."""
    dec = model.decoder
    forward, (a, b) = dec.forward, (dec.dictionary.nspecial, dec.dictionary.nspecial + 1)

    def pushed(*args, normalize=False, select=None, **kwargs):
        out = forward(*args, normalize=False, select=None, **kwargs)  # (B, L, V) logits
        bonus = torch.zeros(out.shape[1:], dtype=out.dtype)
        bonus[0::2, a] = bonus[1::2, b] = 50.0
        out = out + bonus
        out = out[select] if select is not None else out
        return F.log_softmax(out.float(), -1) if normalize else out

    dec.forward = pushed
    try:
        yield
    finally:
        del dec.forward


@dataclass(frozen=True)
class Decoder:
    """One row of DECODERS.  ``make(model, dictionary, max_iter, beam, adaptive, boost)`` builds the
    generator (``boost``: its own options pushed towards long outputs, for the insertion decoders);
    ``push(model)``: a context in which the model itself prefers long outputs (None: none needed);
    ``passes(max_iter)``: the most decoder passes (``steps``) a hypothesis may report."""
    flags: list
    make: Callable
    push: Optional[Callable] = None
    passes: Callable = lambda max_iter: max_iter
    dims: list = field(default_factory=lambda: DIMS)


ONE_PASS = lambda max_iter: 1  # noqa: E731  (CTC, nat_fertility: one decoder pass whatever max_iter)
KERMIT = ["--task", "kermit", "-s", "src", "-t", "tgt", "--arch", "kermit_tiny"]

#: name -> how to build and push one decoder; one row per decoder (beam 1..3 is the length beam of
#: Mask-Predict / refinement, the prefix beam of ctc_beam (2..4); max_iter the block size of the Imputer)
DECODERS = {
    "mask_predict": Decoder(["--arch", "mask_predict_tiny"], lambda m, d, it, beam, ad, boost: MaskPredictGenerator(
        [m], d, max_iter=it, length_beam=beam, adaptive=ad), push=_longest_length_class),
    "levenshtein": Decoder(["--arch", "levenshtein_tiny"], lambda m, d, it, beam, ad, boost: EditGenerator(
        [m], d, max_iter=it, adaptive=ad, placeholder_penalty=PENALTY if boost else 0.0)),
    "insertion": Decoder(["--arch", "insertion_tiny"], lambda m, d, it, beam, ad, boost: InsertionGenerator(
        [m], d, max_iter=it, adaptive=ad, placeholder_penalty=PENALTY if boost else 0.0)),
    "ctc_greedy": Decoder(["--arch", "ctc_nat_tiny"], lambda m, d, it, beam, ad, boost: CTCGenerator(
        [m], d, beam=1), push=_alternating_tokens, passes=ONE_PASS),
    "ctc_beam": Decoder(["--arch", "ctc_nat_tiny"], lambda m, d, it, beam, ad, boost: CTCGenerator(
        [m], d, beam=beam + 1, nbest=beam + 1), push=_alternating_tokens, passes=ONE_PASS),
    "imputer": Decoder(["--arch", "imputer_tiny"], lambda m, d, it, beam, ad, boost: ImputerGenerator(
        [m], d, block=it), push=_alternating_tokens),
    "iterative_refinement": Decoder(["--arch", "iterative_refinement_tiny"], lambda m, d, it, beam, ad, boost:
                                    RefinementGenerator([m], d, max_iter=it, length_beam=beam, adaptive=ad),
                                    push=_longest_length_class),
    "nat_fertility": Decoder(["--arch", "nat_fertility_tiny"], lambda m, d, it, beam, ad, boost: NPDGenerator(
        [m], d), push=_largest_fertility, passes=ONE_PASS),  # argmax fertilities (no teacher)
    "kermit": Decoder(KERMIT, lambda m, d, it, beam, ad, boost: KermitGenerator(
        [m], d, "src", "tgt", mode="translate", max_iter=it, eos_penalty=PENALTY if boost else 0.0), dims=STACK_DIMS),
    "kermit_joint": Decoder(KERMIT, lambda m, d, it, beam, ad, boost: KermitGenerator(
        [m], d, "src", "tgt", mode="joint", max_iter=it, eos_penalty=PENALTY if boost else 0.0), dims=STACK_DIMS),
}


@pytest.fixture(scope="module")
def models(toy_databin):
    out = {}
    for name, dec in DECODERS.items():
        torch.manual_seed(0)
        task, model, _ = build_model_and_task(toy_databin[0], dec.flags + dec.dims)
        out[name] = (task, model.double().eval())
    return out


def _pushed(name, model, boost):
    push = DECODERS[name].push
    return push(model) if boost and push is not None else nullcontext()


def _sources(task, token_lists, extra):
    """Left-padded (fairseq's default) source batch ending in </s>."""
    d = task.source_dictionary
    rows = [torch.tensor(t + [d.eos()]) for t in token_lists]
    T = max(len(r) for r in rows) + extra
    src = torch.full((len(rows), T), d.pad(), dtype=torch.long)
    for b, r in enumerate(rows):
        src[b, T - len(r):] = r
    return src, torch.tensor([len(r) for r in rows])


def _words(d):
    """The ordinary symbols of a dictionary (not the specials, <mask>, <blank>, <gap>)."""
    return [i for i in range(d.nspecial, len(d)) if not (d[i].startswith("<") and d[i].endswith(">"))]


def _token_lists(task, model=None):
    """1..4 sources of 1..10 words (fewer when the model accepts fewer)."""
    longest = 10 if model is None else min(10, model.max_positions()[0] - 1)
    word = st.sampled_from(_words(task.source_dictionary))
    return st.lists(st.lists(word, min_size=1, max_size=longest), min_size=1, max_size=4)


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


def _check_hypothesis(hyp, model, d, passes):
    toks = hyp["tokens"]
    assert toks.dtype == torch.long and toks.dim() == 1 and toks.numel() >= 1
    assert int(toks.min()) >= 0 and int(toks.max()) < len(d), "inside the vocabulary"
    assert int(toks[-1]) == d.eos() and not toks[:-1].eq(d.eos()).any(), "one </s>, at the end"
    specials = {d.pad(), d.bos(), model.mask_idx} | {d.index(s) for s in ("<blank>", "<gap>") if s in d.indices}
    for special in specials:
        assert not toks.eq(special).any(), d[special]
    assert toks.numel() <= model.max_positions()[1], "never longer than the model's max length"
    assert 1 <= hyp["steps"] <= passes, "stops within its budget of decoder passes"
    assert hyp["positional_scores"].numel() == toks.numel() and torch.isfinite(hyp["score"]).all()
    if "other_side" in hyp:  # KERMIT joint: the source side is generated too
        other = hyp["other_side"]
        assert int(other[-1]) == d.eos() and other.numel() <= model.max_positions()[0]


def _generate(gen, model, src, src_len):
    return gen.generate([model], {"net_input": {"src_tokens": src, "src_lengths": src_len}})


@pytest.mark.parametrize("name", sorted(DECODERS))
@settings(max_examples=25, **FAST)
@given(data=st.data(), max_iter=st.integers(1, 4), beam=st.integers(1, 3), adaptive=st.booleans(),
       boost=st.booleans())
def test_decoders_stay_in_vocabulary_and_length_terminate_and_ignore_batch(models, name, data, max_iter, beam,
                                                                           adaptive, boost):
    task, model = models[name]
    d = task.target_dictionary
    srcs = data.draw(_token_lists(task, model))
    extra = data.draw(st.integers(0, 3))
    gen = DECODERS[name].make(model, d, max_iter, beam, adaptive, boost)
    src, src_len = _sources(task, srcs, extra)
    with _pushed(name, model, boost):
        batch = _generate(gen, model, src, src_len)
        assert len(batch) == len(srcs)
        for b, hyps in enumerate(batch):
            for hyp in hyps:  # the whole n-best list
                _check_hypothesis(hyp, model, d, DECODERS[name].passes(max_iter))
            s, sl = _sources(task, [srcs[b]], 0)
            alone = _generate(gen, model, s, sl)[0][0]
            assert torch.equal(alone["tokens"], hyps[0]["tokens"]), "the same alone and in a batch"


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_the_length_cap_is_reached_when_boosted(models, name):
    """The max-length property above is not vacuous: pushed decoders do hit the cap, and stop there."""
    task, model = models[name]
    d = task.target_dictionary
    gen = DECODERS[name].make(model, d, 6, 1, True, True)
    words = _words(task.source_dictionary)
    src, src_len = _sources(task, [words[:7], words[7:9]], 0)
    with _pushed(name, model, True):
        hyps = _generate(gen, model, src, src_len)
    limit = model.max_positions()[1]
    assert max(h[0]["tokens"].numel() for h in hyps) == limit
