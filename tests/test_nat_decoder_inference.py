"""The decoding forward of modules/nat_decoder_inference.py against fairseq's own decoder forward."""
import pytest
import torch

from conftest import build_model_and_task
from fairseq_nat_ext.modules import nat_decoder_inference as fast


@pytest.fixture(scope="module", params=["post-norm", "pre-norm"])
def model(request, toy_databin):
    torch.manual_seed(3)
    extra = ["--decoder-normalize-before"] if request.param == "pre-norm" else []
    _, m, _ = build_model_and_task(
        toy_databin[0], ["--arch", "mask_predict_tiny", "--dropout", "0", "--length-classes", "16"] + extra
    )
    return m.eval()


def _batch(m, lengths, L):
    src = torch.full((len(lengths), L), m.pad)
    for i, n in enumerate(lengths):  # left padding, as fairseq's collater
        src[i, L - n:] = torch.randint(4, 20, (n,))
    return src, torch.tensor(lengths)


@torch.no_grad()
def test_features_equal_fairseq_forward_with_candidates_padding_and_selection(model):
    m = model
    assert fast.supported(m.decoder)
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    src, src_len = _batch(m, [3, 6, 4], 6)
    enc = m.encoder(src, src_lengths=src_len)
    sent = torch.tensor([0, 0, 1, 2, 2, 2])  # length candidates: rows of the same sentence
    tgt_len = torch.tensor([2, 5, 4, 1, 3, 5])
    T = int(tgt_len.max())
    tokens = torch.randint(4, 20, (6, T), generator=g)
    pad = torch.arange(T).unsqueeze(0) >= tgt_len.unsqueeze(1)
    tokens = tokens.masked_fill(pad, m.pad)
    tokens[torch.rand(6, T, generator=g) < 0.4] = m.mask_idx
    tokens = tokens.masked_fill(pad, m.pad)
    # fairseq: the encoder output repeated for every row, the whole decoder forward
    want, _ = m.decoder.extract_features(tokens, encoder_out=m.encoder.reorder_encoder_out(enc, sent),
                                         full_context_alignment=True)
    cross = fast.cross_kv(m.decoder, enc)  # once per sentence, not per row
    assert cross.kv[0][0].size(0) == 3
    x = fast.embed_tokens(m.decoder, tokens)
    got = fast.decoder_features(m.decoder, x, pad, cross, sent)
    assert torch.allclose(got[~pad], want[~pad], atol=1e-5)
    select = (torch.rand(6, T, generator=g) < 0.5) & ~pad
    got_sel = fast.decoder_features(m.decoder, x, pad, cross, sent, select=select)
    assert got_sel.shape == (int(select.sum()), want.size(-1))
    assert torch.allclose(got_sel, want[select], atol=1e-5)


@pytest.fixture(scope="module")
def gelu_model(toy_databin):
    torch.manual_seed(4)
    _, m, _ = build_model_and_task(toy_databin[0], ["--arch", "mask_predict_tiny", "--dropout", "0",
                                                     "--length-classes", "16", "--activation-fn", "gelu",
                                                     "--decoder-learned-pos", "--encoder-learned-pos"])
    return m.eval()


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_packed_route_equals_fairseq_forward(model, gelu_model, activation, monkeypatch):  # gelu: learned positions
    """Inside a decoding scope (CPU, float32) the layers run packed (real positions only, one
    sentence's rows as one cross-attention sequence, the last layer after self-attention only at the
    selected positions, ReLU and residuals fused): fairseq's forward at every real / selected position."""
    from fairseq_nat_ext.modules import cpu_linear

    if not cpu_linear.fused_available():
        pytest.skip("this torch has no oneDNN fused products: no packed route")
    m = gelu_model if activation == "gelu" else model
    packed_calls = []
    layers = fast._packed_layers
    monkeypatch.setattr(fast, "_packed_layers", lambda *a: packed_calls.append(1) or layers(*a))
    g = torch.Generator().manual_seed(1)
    src, src_len = _batch(m, [3, 6, 4], 6)
    cases = [  # (sentence of each row, target lengths)
        (torch.tensor([0, 0, 1, 2, 2, 2]), torch.tensor([2, 5, 4, 1, 3, 5])),  # several sentences
        (torch.tensor([1, 1, 1]), torch.tensor([4, 6, 5])),  # one sentence's length candidates
        (torch.tensor([2]), torch.tensor([5])),  # one row, no padding
    ]
    with torch.no_grad(), cpu_linear.decoding([m]):
        enc = m.encoder(src, src_lengths=src_len)
        cross = fast.cross_kv(m.decoder, enc)
        assert cross.plan is not None
        for sent, tgt_len in cases:
            N, T = len(sent), int(tgt_len.max())
            pad = torch.arange(T).unsqueeze(0) >= tgt_len.unsqueeze(1)
            tokens = torch.randint(4, 20, (N, T), generator=g)
            tokens[torch.rand(N, T, generator=g) < 0.4] = m.mask_idx
            tokens = tokens.masked_fill(pad, m.pad)
            want, _ = m.decoder.extract_features(tokens, encoder_out=m.encoder.reorder_encoder_out(enc, sent),
                                                 full_context_alignment=True)
            x = fast.embed_tokens(m.decoder, tokens)
            self_pad = pad if bool(pad.any()) else None
            got = fast.decoder_features(m.decoder, x, self_pad, cross, sent)
            assert got.shape == want.shape
            assert torch.allclose(got[~pad], want[~pad], atol=1e-5)
            select = (torch.rand(N, T, generator=g) < 0.5) & ~pad
            select[0, 0] = True
            got_sel = fast.decoder_features(m.decoder, x, self_pad, cross, sent, select=select)
            assert torch.allclose(got_sel, want[select], atol=1e-5)
            none = fast.decoder_features(m.decoder, x, self_pad, cross, sent, select=torch.zeros_like(select))
            assert none.shape == (0, want.size(-1))
            # from tokens: only the real positions embedded
            before = len(packed_calls)
            assert torch.allclose(fast.token_features(m.decoder, tokens, cross, sent)[~pad], want[~pad], atol=1e-5)
            assert torch.allclose(fast.token_features(m.decoder, tokens, cross, sent, select=select),
                                  want[select], atol=1e-5)
            assert len(packed_calls) == before + 2  # both on the packed route
        # a row padded in the middle is not right-padded: embedded by fairseq's own embedding (its
        # positions count real tokens only), then the layers
        tokens = torch.tensor([[5, 6, m.pad, 7], [8, 9, 10, 11]])
        sent = torch.tensor([0, 1])
        got = fast.token_features(m.decoder, tokens, cross, sent)
        want, _ = m.decoder.extract_features(tokens, encoder_out=m.encoder.reorder_encoder_out(enc, sent),
                                             full_context_alignment=True)
        real = tokens.ne(m.pad)
        assert torch.allclose(got[real], want[real], atol=1e-5)


@torch.no_grad()
def test_unpadded_batch_and_one_row_per_sentence(model):
    m = model
    torch.manual_seed(1)
    src, src_len = _batch(m, [5, 5], 5)
    enc = m.encoder(src, src_lengths=src_len)
    tokens = torch.randint(4, 20, (2, 4))
    want, _ = m.decoder.extract_features(tokens, encoder_out=enc, full_context_alignment=True)
    got = fast.decoder_features(m.decoder, fast.embed_tokens(m.decoder, tokens), None,
                                fast.cross_kv(m.decoder, enc))
    assert torch.allclose(got, want, atol=1e-5)


def test_fused_projection_follows_weight_updates(model):
    from fairseq_nat_ext.modules import cpu_linear
    from fairseq_nat_ext.modules.attention.mix import stacked_qkv_weight

    m = model
    sa = m.decoder.layers[0].self_attn
    with torch.no_grad():
        assert stacked_qkv_weight(sa)[0] is not stacked_qkv_weight(sa)[0]  # outside decoding: no cache
    with torch.no_grad(), cpu_linear.decoding([m]):
        w1, _ = stacked_qkv_weight(sa)
        assert stacked_qkv_weight(sa)[0] is w1  # cached
        sa.k_proj.weight.add_(1.0)
    try:
        with torch.no_grad(), cpu_linear.decoding([m]):
            w2, _ = stacked_qkv_weight(sa)
        assert torch.equal(w2[sa.embed_dim:2 * sa.embed_dim], sa.k_proj.weight)
    finally:
        with torch.no_grad():
            sa.k_proj.weight.sub_(1.0)


def test_decoder_quant_noise_is_refused(model):
    """fairseq's decoder applies its quant-noise projection to the input even in eval mode."""
    model.decoder.quant_noise = torch.nn.Linear(4, 4)
    try:
        assert not fast.supported(model.decoder)
    finally:
        model.decoder.quant_noise = None
    assert fast.supported(model.decoder)


def test_retained_dropout_is_refused(model):
    """--retain-dropout (fairseq-generate sets apply_during_inference): the decoder's own forward, which
    drops at inference; the decoding forward here applies no dropout."""
    drop = model.decoder.layers[-1].dropout_module
    old = (drop.p, drop.apply_during_inference)
    drop.p, drop.apply_during_inference = 0.1, True
    try:
        assert not fast.supported(model.decoder)
    finally:
        drop.p, drop.apply_during_inference = old
    assert fast.supported(model.decoder)


def test_unsupported_layers_are_refused(model):
    layer = model.decoder.layers[0]
    old = layer.c_attn
    layer.c_attn = torch.nn.Parameter(torch.ones(layer.nh))  # fairseq's --scale-heads
    try:
        assert not fast.supported(model.decoder)
    finally:
        layer.c_attn = old
    assert fast.supported(model.decoder)


@pytest.mark.parametrize("adaptive", [False, True])
def test_mask_predict_fast_path_gives_the_slow_paths_hypotheses_and_counts_its_passes(model, adaptive):
    from fairseq_nat_ext.evaluation.inference import count_decoder_calls
    from fairseq_nat_ext.generators.mask_predict import MaskPredictGenerator

    m = model
    torch.manual_seed(4)
    src, src_len = _batch(m, [3, 8, 5, 6, 2], 8)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_len}}
    out = {}
    for fast_decoder in (False, True):
        gen = MaskPredictGenerator([m], m.decoder.dictionary, max_iter=6, length_beam=3, adaptive=adaptive)
        gen.fast_decoder = fast_decoder
        with count_decoder_calls([m]) as c:
            out[fast_decoder] = (gen.generate([m], sample), c.calls)
    (slow, slow_calls), (quick, quick_calls) = out[False], out[True]
    assert quick_calls == slow_calls > 0  # the fast path's passes are counted like the layer loop's
    for a, b in zip(slow, quick):
        assert a[0]["tokens"].tolist() == b[0]["tokens"].tolist()
        assert a[0]["steps"] == b[0]["steps"]
        assert torch.allclose(a[0]["positional_scores"], b[0]["positional_scores"], atol=1e-4)


@pytest.mark.parametrize("arch", ["ctc_nat_tiny", "imputer_tiny"])
def test_ctc_decoder_eval_forward_equals_its_layer_loop(toy_databin, arch):
    """CTC / Imputer decoders run the decoding forward in eval mode without autograd; with autograd on
    they run fairseq's layer loop: the same log-probs, with and without an observed alignment and a
    selection, with cross-attention keys/values passed in or computed, inside a decoding scope too."""
    from fairseq_nat_ext.modules import cpu_linear

    torch.manual_seed(2)
    extra = ["--imputer-train-block-size", "2"] if arch.startswith("imputer") else []
    _, m, _ = build_model_and_task(toy_databin[0], ["--arch", arch, "--upsample-ratio", "2",
                                                     "--dropout", "0"] + extra)
    m.eval()
    src, src_len = _batch(m, [4, 7, 2], 7)
    enc = m.encoder(src, src_lengths=src_len)
    up = m.decoder.upsample(enc)
    L = up[0].size(1)
    alignment = torch.randint(4, 20, (3, L)).masked_fill(m.decoder.alignment_padding(up[1], L), m.pad)
    alignment[torch.rand(3, L) < 0.5] = m.mask_idx  # padding positions too: only the padded route has them
    select = alignment.eq(m.mask_idx)
    real = ~m.decoder.alignment_padding(up[1], L)
    observed = alignment.masked_fill(~real, m.pad)
    observed[(torch.rand(3, L) < 0.5) & real] = m.mask_idx  # real positions only: the packed route
    for kw in ({}, {"alignment": alignment, "select": select},
               {"alignment": observed, "select": observed.eq(m.mask_idx)}):
        with torch.enable_grad():
            want = m.decoder(enc, normalize=True, upsampled=up, **kw)
        with torch.no_grad():
            got = m.decoder(enc, normalize=True, upsampled=up, **kw)
            cached = m.decoder(enc, normalize=True, upsampled=up, cross=fast.cross_kv(m.decoder, enc), **kw)
        with torch.no_grad(), cpu_linear.decoding([m]):  # the packed route
            cross = fast.cross_kv(m.decoder, enc)
            assert (cross.plan is not None) == cpu_linear.fused_available()
            packed = m.decoder(enc, normalize=True, upsampled=up, cross=cross, **kw)
        inside = ~m.decoder.alignment_padding(up[1], L) if not kw else slice(None)
        assert torch.allclose(got[inside], want[inside].detach(), atol=1e-4)
        assert torch.equal(got, cached)
        assert torch.allclose(packed[inside], want[inside].detach(), atol=1e-4)
