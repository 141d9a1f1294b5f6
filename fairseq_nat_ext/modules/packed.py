"""Inference through decoder layers over the REAL positions of a right-padded batch only ("packed" rows).

NPD decodes and teacher-scores many candidates of different lengths at once: padded to the longest, 28% of
the positions of Multi30K's batch-1 candidates (s = 10) are padding, and every position-wise product
(q/k/v/out projections, feed-forward, layer norms) would run on them.  Here the position-wise work runs on
the (M, C) rows of the real positions; only attention scatters its projections into the (N, T) layout
(zeros at padding, masked).  q, k and v of a self-attention come from ONE product with the stacked
weights.  Cross-attention to a single source (key batch 1: batch-1 NPD) needs no padded layout at all:
the M query rows attend to its S keys directly.

Functions work on fairseq's own modules (``MultiheadAttention``, ``TransformerDecoderLayerBase``) and read
their parameters; nothing is copied.  Eval mode only (no dropout): :func:`supports_decoder` says whether
a fairseq decoder has only the features implemented here (callers fall back to its own forward otherwise).
"""
from typing import Optional

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


class Rows:
    """The real positions ``valid`` (N, T) bool (a prefix of each row) of a padded batch."""

    def __init__(self, valid: Tensor):
        self.valid = valid
        self.N, self.T = valid.shape

    def pack(self, x: Tensor) -> Tensor:
        """(N, T, ...) -> (M, ...): the rows at real positions, row-major."""
        return x[self.valid]

    def unpack(self, rows: Tensor) -> Tensor:
        """(M, F) -> (N, T, F), zeros at padding."""
        out = rows.new_zeros(self.N, self.T, rows.size(-1))
        out[self.valid] = rows
        return out


def _heads(x: Tensor, heads: int) -> Tensor:
    """(N, T, C) -> (N, H, T, d)."""
    N, T, C = x.shape
    return x.view(N, T, heads, C // heads).transpose(1, 2)


def _merge(x: Tensor, rows: Rows) -> Tensor:
    """(N, H, T, d) -> (M, C) at the real positions."""
    N, H, T, d = x.shape
    return rows.pack(x.transpose(1, 2).reshape(N, T, H * d))


def mha_supported(mha) -> bool:
    return (getattr(mha, "bias_k", None) is None and not getattr(mha, "add_zero_attn", False)
            and not getattr(mha, "use_xformers", False) and mha.q_proj.bias is not None)


def self_attention(mha, x: Tensor, rows: Rows, mask: Optional[Tensor] = None, causal: bool = False) -> Tensor:
    """fairseq ``MultiheadAttention`` as self-attention on packed rows x (M, C) -> (M, C).  ``mask``: bool
    (True = may attend) or additive float, broadcasting to (N, H, T, T); ``causal``: the future is masked."""
    lins = (mha.q_proj, mha.k_proj, mha.v_proj)
    qkv = F.linear(x, torch.cat([lin.weight for lin in lins]), torch.cat([lin.bias for lin in lins]))
    N, T = rows.N, rows.T
    H = mha.num_heads
    q, k, v = rows.unpack(qkv).view(N, T, 3, H, -1).permute(2, 0, 3, 1, 4).unbind(0)  # each (N, H, T, d)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)
    return mha.out_proj(_merge(out, rows))


def positional_attention(mha, positions: Tensor, x: Tensor, rows: Rows, key_ok: Tensor) -> Tensor:
    """Queries and keys from ``positions`` (T, C), the same for every row (projected once), values from the
    packed rows x (M, C); ``key_ok`` (N, T) bool -> (M, C)."""
    H = mha.num_heads
    q = _heads(mha.q_proj(positions).unsqueeze(0), H).expand(rows.N, -1, -1, -1)
    k = _heads(mha.k_proj(positions).unsqueeze(0), H).expand(rows.N, -1, -1, -1)
    v = _heads(rows.unpack(mha.v_proj(x)), H)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_ok[:, None, None, :])
    return mha.out_proj(_merge(out, rows))


def cross_attention(mha, x: Tensor, rows: Rows, enc: Tensor, enc_pad: Optional[Tensor]) -> Tensor:
    """Packed query rows x (M, C) over the encoder output ``enc`` (S, Bk, C) with padding ``enc_pad``
    (Bk, S) bool (True = padding) or None.  Bk = 1: every row reads that one source (no padded layout);
    Bk = N: row n reads source n."""
    H = mha.num_heads
    S, Bk, _ = enc.shape
    k = mha.k_proj(enc).permute(1, 0, 2).reshape(Bk, S, H, -1).transpose(1, 2)  # (Bk, H, S, d)
    v = mha.v_proj(enc).permute(1, 0, 2).reshape(Bk, S, H, -1).transpose(1, 2)
    ok = None if enc_pad is None else ~enc_pad.bool()[:, None, None, :]
    q = mha.q_proj(x)
    if Bk == 1:
        out = F.scaled_dot_product_attention(_heads(q.unsqueeze(0), H), k, v, attn_mask=ok)  # (1, H, M, d)
        return mha.out_proj(out.transpose(1, 2).reshape(q.shape))
    if Bk != rows.N:
        raise ValueError(f"cross_attention: {Bk} encoder rows for {rows.N} decoder rows")
    out = F.scaled_dot_product_attention(_heads(rows.unpack(q), H), k, v, attn_mask=ok)
    return mha.out_proj(_merge(out, rows))


def block(layer, x: Tensor, norm, fn) -> Tensor:
    """fairseq's residual block: pre- or post-norm by ``layer.normalize_before`` (eval: no dropout)."""
    if layer.normalize_before:
        return x + fn(norm(x))
    return norm(x + fn(x))


def feed_forward(layer, x: Tensor) -> Tensor:
    return layer.fc2(layer.activation_fn(layer.fc1(x)))


def supports_decoder(decoder) -> bool:
    """Whether :func:`decoder_features` reproduces this fairseq Transformer decoder's forward."""
    from fairseq.models.transformer import TransformerDecoderBase

    if not isinstance(decoder, TransformerDecoderBase) or decoder.training:
        return False
    if decoder.quant_noise is not None or getattr(decoder, "cross_self_attention", False):
        return False
    for layer in decoder.layers:
        if getattr(layer, "cross_self_attention", False) or any(
                getattr(layer, name, None) is not None for name in ("c_attn", "attn_ln", "ffn_layernorm", "w_resid")):
            return False
        if not mha_supported(layer.self_attn) or (layer.encoder_attn is not None and not mha_supported(layer.encoder_attn)):
            return False
    return True


def decoder_features(decoder, prev_output_tokens: Tensor, encoder_out) -> Tensor:
    """A fairseq Transformer decoder, teacher-forced on right-padded ``prev_output_tokens`` (N, T) -> its
    final features (M, C) at the non-padding positions (row-major), as ``decoder(prev, encoder_out,
    features_only=True)[0][prev != pad]``.  ``encoder_out``'s batch is N, or 1 (every row reads that
    source).  Only where :func:`supports_decoder`."""
    valid = prev_output_tokens.ne(decoder.padding_idx)
    rows = Rows(valid)
    x = decoder.embed_scale * decoder.embed_tokens(prev_output_tokens[valid])
    if decoder.project_in_dim is not None:
        x = decoder.project_in_dim(x)
    if decoder.embed_positions is not None:
        x = x + rows.pack(decoder.embed_positions(prev_output_tokens))
    if decoder.layernorm_embedding is not None:
        x = decoder.layernorm_embedding(x)
    enc = encoder_out["encoder_out"][0] if encoder_out is not None and encoder_out["encoder_out"] else None
    enc_pad = encoder_out["encoder_padding_mask"][0] if enc is not None and encoder_out["encoder_padding_mask"] else None
    for layer in decoder.layers:
        # causal: a real query sees only earlier positions, which are real in a right-padded row
        x = block(layer, x, layer.self_attn_layer_norm, lambda h: self_attention(layer.self_attn, h, rows, causal=True))
        if layer.encoder_attn is not None and enc is not None:
            x = block(layer, x, layer.encoder_attn_layer_norm,
                      lambda h: cross_attention(layer.encoder_attn, h, rows, enc, enc_pad))
        x = block(layer, x, layer.final_layer_norm, lambda h: feed_forward(layer, h))
    if decoder.layer_norm is not None:
        x = decoder.layer_norm(x)
    if decoder.project_out_dim is not None:
        x = decoder.project_out_dim(x)
    return x
