"""The decoding forward of modules/encoder_inference.py against fairseq's own encoder forward."""
import pytest
import torch

from conftest import build_model_and_task
from fairseq_nat_ext.modules import cpu_linear
from fairseq_nat_ext.modules import encoder_inference as ei


def _batch(pad, lengths, L, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), L), pad)
    for i, n in enumerate(lengths):  # left padding, as fairseq's collater
        src[i, L - n:] = torch.randint(4, 20, (n,), generator=g)
    return src, torch.tensor(lengths)


def _fairseq_forward(encoder, src, src_len):
    """fairseq's own forward: outside any decoding scope the fast path is never taken."""
    assert not ei.usable(encoder, src)
    return encoder(src, src_lengths=src_len)


def _assert_same_output(got, want):
    assert set(got) == set(want)
    assert got["encoder_out"][0].shape == want["encoder_out"][0].shape
    # every position, padded ones included (fairseq zeroes them and lets them attend)
    assert torch.allclose(got["encoder_out"][0], want["encoder_out"][0], atol=1e-5)
    assert torch.equal(got["encoder_padding_mask"][0], want["encoder_padding_mask"][0])
    assert torch.equal(got["encoder_embedding"][0], want["encoder_embedding"][0])
    assert torch.equal(got["src_lengths"][0], want["src_lengths"][0])
    assert got["encoder_states"] == [] and got["fc_results"] == []


@pytest.mark.parametrize("extra", [[], ["--encoder-normalize-before"], ["--layernorm-embedding"]],
                         ids=["post-norm", "pre-norm", "layernorm-embedding"])
@pytest.mark.parametrize("arch", ["mask_predict_tiny", "transformer"])
def test_encode_equals_fairseq_forward(toy_databin, arch, extra):
    """Our NAT encoder (EfficientNATEncoder, through its own forward inside a decoding scope) and
    fairseq's TransformerEncoder of an autoregressive model (through :func:`ei.forward`), padded and
    unpadded batches."""
    torch.manual_seed(5)
    size = [] if arch != "transformer" else ["--encoder-layers", "2", "--decoder-layers", "1",
                                             "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
                                             "--encoder-attention-heads", "4", "--decoder-embed-dim", "32"]
    _, m, _ = build_model_and_task(toy_databin[0], ["--arch", arch, "--dropout", "0"] + size + extra)
    m.eval()
    enc = m.encoder
    assert ei.supported(enc)
    for lengths, L in (([3, 7, 5], 7), ([6, 6], 6), ([4], 4)):
        src, src_len = _batch(enc.padding_idx, lengths, L)
        with torch.no_grad():
            want = _fairseq_forward(enc, src, src_len)
            with cpu_linear.decoding([m]):
                assert ei.usable(enc, src)
                got = ei.forward(enc, src, src_len)
                own = enc(src, src_lengths=src_len)  # ours routes its own forward; fairseq's does not
        _assert_same_output(got, want)
        if arch != "transformer":
            _assert_same_output(own, want)
            assert torch.equal(own["encoder_out"][0], got["encoder_out"][0])


def test_fast_path_only_in_eval_decoding_without_grad_and_for_supported_encoders(toy_databin):
    torch.manual_seed(6)
    _, m, _ = build_model_and_task(toy_databin[0], ["--arch", "mask_predict_tiny", "--dropout", "0"])
    src, _ = _batch(m.encoder.padding_idx, [3, 5], 5)
    m.eval()
    with torch.no_grad(), cpu_linear.decoding([m]):
        assert ei.usable(m.encoder, src)
        assert not ei.usable(m.encoder, src, return_all_hiddens=True)
        ei.enabled = False
        try:
            assert not ei.usable(m.encoder, src)
        finally:
            ei.enabled = True
    with cpu_linear.decoding([m]):  # autograd on: a training step's no-grad passes excepted, never
        assert not ei.usable(m.encoder, src)
    m.train()
    with torch.no_grad(), cpu_linear.decoding([m]):
        assert not ei.usable(m.encoder, src)
    # other attention variants, and fairseq options this forward does not implement
    _, local, _ = build_model_and_task(toy_databin[0], ["--arch", "mask_predict_tiny",
                                                        "--encoder-attention-type", "local"])
    assert not ei.supported(local.encoder)
    attn = m.encoder.layers[0].self_attn
    attn.add_zero_attn = True
    try:
        assert not ei.supported(m.encoder)
    finally:
        attn.add_zero_attn = False
    assert ei.supported(m.encoder)


@pytest.mark.parametrize("arch,options", [("mask_predict_tiny", dict(max_iter=4, length_beam=2)),
                                          ("ctc_nat_tiny", {})])
def test_generators_give_the_same_hypotheses_with_the_fast_encoder(toy_databin, arch, options):
    from fairseq_nat_ext.generators.ctc_nat import CTCGenerator
    from fairseq_nat_ext.generators.mask_predict import MaskPredictGenerator

    torch.manual_seed(7)
    extra = ["--upsample-ratio", "2"] if arch.startswith("ctc") else ["--length-classes", "16"]
    _, m, _ = build_model_and_task(toy_databin[0], ["--arch", arch, "--dropout", "0"] + extra)
    m.eval()
    src, src_len = _batch(m.encoder.padding_idx, [3, 8, 5, 2], 8, seed=1)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_len}}
    cls = MaskPredictGenerator if arch.startswith("mask") else CTCGenerator
    out = {}
    calls = []
    real = ei.encode

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    ei.encode = spy
    for on in (False, True):
        ei.enabled = on
        try:
            out[on] = cls([m], m.decoder.dictionary, **options).generate([m], sample)
        finally:
            ei.enabled = True
        assert len(calls) == int(on)  # the generator's encoder call took the fast path only when on
    ei.encode = real
    for a, b in zip(out[False], out[True]):
        assert a[0]["tokens"].tolist() == b[0]["tokens"].tolist()
        assert torch.allclose(a[0]["positional_scores"], b[0]["positional_scores"], atol=1e-4)


def test_layerdrop_draws_what_fairseqs_forward_draws_and_retained_dropout_is_refused(toy_databin):
    """fairseq's LayerDropModuleList draws one random number per layer whenever it is iterated, in eval
    mode too: the fast path must draw exactly as many (seeded NPD samples follow the encoder)."""
    torch.manual_seed(8)
    _, m, _ = build_model_and_task(toy_databin[0], ["--arch", "mask_predict_tiny", "--dropout", "0",
                                                    "--encoder-layerdrop", "0.2"])
    m.eval()
    src, src_len = _batch(m.encoder.padding_idx, [3, 5], 5)
    with torch.no_grad():
        torch.manual_seed(0)
        want = _fairseq_forward(m.encoder, src, src_len)
        after_fairseq = torch.rand(4)
        with cpu_linear.decoding([m]):
            torch.manual_seed(0)
            assert ei.usable(m.encoder, src)  # draws nothing itself
            got = m.encoder(src, src_lengths=src_len)
            after_fast = torch.rand(4)
    _assert_same_output(got, want)
    assert torch.equal(after_fast, after_fairseq)
    # --retain-dropout (fairseq-generate sets apply_during_inference): fairseq's forward, not this one
    m.encoder.dropout_module.p = 0.1
    m.encoder.dropout_module.apply_during_inference = True
    try:
        assert not ei.supported(m.encoder)
    finally:
        m.encoder.dropout_module.apply_during_inference = False
        m.encoder.dropout_module.p = 0.0
    assert ei.supported(m.encoder)


def test_forward_calls_an_encoder_with_its_own_forward_as_it_is(toy_databin):
    """ei.forward (NPD's teacher): a subclass that overrides ``forward`` is called, not bypassed."""
    from fairseq.models.transformer import TransformerEncoder

    torch.manual_seed(9)
    _, m, _ = build_model_and_task(toy_databin[0], ["--arch", "transformer", "--dropout", "0",
                                                    "--encoder-layers", "1", "--decoder-layers", "1",
                                                    "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
                                                    "--encoder-attention-heads", "2", "--decoder-embed-dim", "16"])
    m.eval()

    class Marked(TransformerEncoder):
        def forward(self, src_tokens, src_lengths=None, **kw):
            out = super().forward(src_tokens, src_lengths, **kw)
            out["marked"] = True
            return out

    m.encoder.__class__ = Marked
    src, src_len = _batch(m.encoder.padding_idx, [3], 3)
    with torch.no_grad(), cpu_linear.decoding([m]):
        assert ei.forward(m.encoder, src, src_len).get("marked") is True
