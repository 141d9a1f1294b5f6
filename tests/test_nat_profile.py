"""benchmarks/nat_profile.py --count-flops: the product counter against hand-computed FLOPs."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.nat_profile import counting_products
from fairseq_nat_ext.modules import cpu_linear


def test_counts_linear_calls_as_two_rows_out_in():
    torch.manual_seed(0)
    lin = nn.Linear(8, 4)
    cpu_linear.available()  # its one-off self-check (an F.linear) runs before counting
    with torch.no_grad(), counting_products() as c:
        F.linear(torch.randn(3, 5, 8), torch.randn(6, 8))  # 15 rows: 2 * 15 * 6 * 8 = 1,440
        lin(torch.randn(7, 8))  # nn.Linear -> F.linear: 2 * 7 * 4 * 8 = 448
        with cpu_linear.decoding():  # the prepacked route (or its F.linear fallback): counted once
            assert cpu_linear.usable(torch.randn(1, 8), lin.weight) == cpu_linear.available()
            cpu_linear.linear(torch.randn(2, 3, 8), lin.weight, lin.bias)  # 2 * 6 * 4 * 8 = 384
            cpu_linear.module(lin, torch.randn(1, 8))  # 2 * 1 * 4 * 8 = 64
        cpu_linear.linear(torch.randn(5, 8), lin.weight)  # outside a decoding scope: 2 * 5 * 4 * 8 = 320
    assert c.flops["linear"] == 1440 + 448 + 384 + 64 + 320
    assert c.calls["linear"] == 5
    assert c.flops["attention"] == 0


def test_counts_attention_products_apart():
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 4)
    with torch.no_grad(), counting_products() as c:
        F.scaled_dot_product_attention(q, k, v)  # 2 heads x 3 x 6: scores 2*2*3*6*8 + values 2*2*3*6*4
        torch.matmul(torch.randn(2, 3, 4), torch.randn(4, 5))  # 2 * (2*3*5) * 4 = 240
        torch.bmm(torch.randn(2, 3, 4), torch.randn(2, 4, 5))  # 240
        torch.baddbmm(torch.zeros(2, 3, 5), torch.randn(2, 3, 4), torch.randn(2, 4, 5))  # 240
    assert c.flops["attention"] == 576 + 288 + 3 * 240
    assert c.calls["attention"] == 4
    assert c.flops["linear"] == 0


def test_counts_a_fairseq_decoder_layer_by_hand():
    """One fairseq TransformerDecoderLayer (self- and cross-attention, feed-forward) on T target and S
    source positions: q/k/v/out projections 2 * rows * d * d each, the feed-forward 2 * 2 * T * d * f."""
    from argparse import Namespace

    from fairseq.models.transformer import TransformerConfig
    from fairseq.modules import TransformerDecoderLayer

    d, f, heads, B, T, S = 16, 24, 2, 2, 5, 7
    cfg = TransformerConfig.from_namespace(Namespace(
        decoder_embed_dim=d, decoder_ffn_embed_dim=f, decoder_attention_heads=heads,
        encoder_embed_dim=d, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0))
    layer = TransformerDecoderLayer(cfg).eval()
    x, enc = torch.randn(T, B, d), torch.randn(S, B, d)
    with torch.no_grad(), counting_products() as c:
        layer(x, encoder_out=enc, encoder_padding_mask=None)
    self_attn = 4 * 2 * B * T * d * d  # q, k, v, out over the T target positions
    cross = 2 * 2 * B * T * d * d + 2 * 2 * B * S * d * d  # q, out over T; k, v over S
    ffn = 2 * 2 * B * T * d * f
    assert c.flops["linear"] == self_attn + cross + ffn
    # attention: scores and weighted values, over T x T and T x S (head dims sum to d)
    assert c.flops["attention"] == 2 * 2 * B * T * T * d + 2 * 2 * B * T * S * d


def test_restores_the_patched_functions_after_an_error():
    originals = (F.linear, cpu_linear.linear, F.scaled_dot_product_attention, torch.matmul, torch.bmm,
                 torch.baddbmm, cpu_linear.prepacked, cpu_linear.prepacked_add)
    with pytest.raises(RuntimeError):
        with counting_products():
            assert F.linear is not originals[0]
            raise RuntimeError("boom")
    assert (F.linear, cpu_linear.linear, F.scaled_dot_product_attention, torch.matmul, torch.bmm,
            torch.baddbmm, cpu_linear.prepacked, cpu_linear.prepacked_add) == originals


def test_counts_the_plugin_decoding_forward_by_hand(toy_databin):
    """The Mask-Predict decoding forward (modules/nat_decoder_inference.py: stacked q/k/v, prepacked
    products, scaled_dot_product_attention) of the tiny architecture: N rows of T positions, S sources."""
    from conftest import build_model_and_task
    from fairseq_nat_ext.modules import nat_decoder_inference as fast

    torch.manual_seed(0)
    _, model, _ = build_model_and_task(toy_databin[0], ["--arch", "mask_predict_tiny", "--dropout", "0"])
    dec = model.decoder.eval()
    L, d, f = len(dec.layers), dec.layers[0].fc1.in_features, dec.layers[0].fc1.out_features
    assert dec.project_out_dim is None
    N, T, S = 3, 6, 5
    enc = {"encoder_out": [torch.randn(S, N, d)], "encoder_padding_mask": []}
    with torch.no_grad(), cpu_linear.decoding([model]), counting_products() as c:
        kv = fast.cross_kv(dec, enc)
        fast.decoder_features(dec, torch.randn(N, T, d), None, kv)
    cross_kv = L * 2 * 2 * N * S * d * d  # keys and values of every layer, once
    per_layer = (2 * N * T * 3 * d * d + 2 * N * T * d * d  # self-attention: stacked q/k/v, out
                 + 2 * 2 * N * T * d * d  # cross-attention: q, out
                 + 2 * 2 * N * T * d * f)  # feed-forward
    assert c.flops["linear"] == cross_kv + L * per_layer
    assert c.flops["attention"] == L * (2 * 2 * N * T * T * d + 2 * 2 * N * T * S * d)


def test_clock_times_each_component_exclusively():
    """An inner timer of another component pauses the outer one; the same component nested counts once;
    the encoder keeps its sublayers' time; a stop out of order is an error."""
    from benchmarks.nat_profile import Clock

    ticks = iter([0.0, 2.0, 5.0, 6.0, 6.0, 8.0])  # the clock reads at each start / stop, in order
    clock = Clock(now=lambda: next(ticks))
    clock.start("cross_attention")  # 0
    clock.start("cross_kv")  # 2: cross_attention ran 2
    clock.start("cross_kv")  # 5
    clock.stop("cross_kv")  # 6
    clock.stop("cross_kv")  # 6: cross_kv ran 4 (2..6), once
    clock.stop("cross_attention")  # 8: cross_attention 2 more
    assert clock.seconds["cross_attention"] == 4.0 and clock.seconds["cross_kv"] == 4.0

    ticks = iter([0.0, 1.0, 3.0, 4.0])
    clock = Clock(now=lambda: next(ticks))
    clock.start("encoder")
    clock.start("self_attention")  # the fast encoder's sublayer: the encoder's time
    clock.stop("self_attention")
    clock.stop("encoder")
    assert clock.seconds["encoder"] == 4.0 and clock.seconds["self_attention"] == 0.0

    clock = Clock(now=lambda: 0.0)
    clock.start("encoder")
    clock.start("vocabulary")
    with pytest.raises(RuntimeError, match="vocabulary"):
        clock.stop("encoder")
