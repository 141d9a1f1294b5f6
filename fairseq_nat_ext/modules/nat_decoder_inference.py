"""Inference forward of a NAT decoder's Transformer layers without the work that repeats across passes.

An iterative NAT decoder (Mask-Predict, Imputer, refinement, noisy parallel decoding) runs the same
decoder stack many times per sentence: once per pass, and once per length candidate or sample.
fairseq's ``TransformerDecoderLayer`` recomputes the cross-attention keys and values from the encoder
states on every call, computes (and averages) attention weights nobody reads (``need_attn`` is on in
eval mode), and runs the last layer's feed-forward block at every position, although a pass needs
the states of a few positions only.  Here, with the same weights and the same maths:

* :func:`cross_kv`: every layer's cross-attention keys and values, computed once per *sentence* from
  the encoder output; a pass reads them through ``sent`` (the sentence of each decoder row), so the
  length candidates and samples of one sentence share them;
* :func:`decoder_features`: the layers in eval mode (dropout off) with torch's
  ``scaled_dot_product_attention`` (the fused kernel where a batch has no padding), self-attention's
  q/k/v as one product, the projections on CPU through :mod:`.cpu_linear` (weights laid out once for
  oneDNN), and the last layer's feed-forward block (the largest part of a layer) only at the positions
  in ``select`` when given.  Results equal fairseq's layer loop up to float rounding
  (tests/test_nat_decoder_inference.py compares them with fairseq's own forward).

:func:`supported` says whether a decoder's layers hold only what is implemented here (post- or
pre-norm, any activation, learned or sinusoidal positions); layers with fairseq's other options
(cross-self-attention, scaled heads/attention/fc/residuals, bias_kv, zero attention, xFormers) are
not, and callers then keep the decoder's own forward.  Autograd is never needed here: it serves the
decoders in eval mode without autograd -- decoding, validation, and the no-grad passes of a training
step such as the Imputer's alignments (training's own forward keeps fairseq's layers and dropout).
Weight caches (prepacked products, the stacked q/k/v) apply only inside the generators' decoding scope
(:mod:`.cpu_linear`).
"""
import torch
import torch.nn.functional as F

from . import cpu_linear, packed
from .attention.mix import stacked_qkv


def _attn_supported(attn):
    return (attn is not None and attn.bias_k is None and not attn.add_zero_attn
            and not getattr(attn, "use_xformers", False) and attn.qkv_same_dim
            and abs(attn.scaling - attn.head_dim ** -0.5) < 1e-12)


def supported(decoder):
    """True when :func:`decoder_features` computes exactly what ``decoder``'s own layer loop does."""
    layers = getattr(decoder, "layers", None)
    if layers is None or len(layers) == 0 or getattr(decoder, "cross_self_attention", False):
        return False
    for layer in torch.nn.ModuleList.__iter__(layers):  # no LayerDropModuleList draws
        if (getattr(layer, "cross_self_attention", False) or layer.c_attn is not None
                or layer.attn_ln is not None or layer.ffn_layernorm is not None
                or layer.w_resid is not None or not _attn_supported(layer.self_attn)
                or not _attn_supported(layer.encoder_attn)):
            return False
    return True


def _heads(x, H):
    """(N, T, C) -> (N, H, T, C / H)."""
    N, T, C = x.shape
    return x.view(N, T, H, C // H).transpose(1, 2)


def _merge(x):
    """(N, H, T, D) -> (N, T, H * D)."""
    N, H, T, D = x.shape
    return x.transpose(1, 2).reshape(N, T, H * D)


class CrossKV:
    """Every layer's cross-attention keys and values for B sentences: ``kv[i] = (k, v)``, each
    (B, H, S, C / H), and ``keep`` (B, 1, 1, S) bool (False at source padding), or None."""

    def __init__(self, kv, keep):
        self.kv, self.keep = kv, keep

    def rows(self, i, sent):
        """Layer i's keys, values and key mask for decoder rows of the sentences ``sent`` (None: one
        row per sentence, in order)."""
        k, v = self.kv[i]
        keep = self.keep
        if sent is not None:
            k, v = k.index_select(0, sent), v.index_select(0, sent)
            keep = keep.index_select(0, sent) if keep is not None else None
        return k, v, keep


def cross_kv(decoder, encoder_out):
    """encoder_out (fairseq's dict) -> :class:`CrossKV` of every layer of ``decoder``."""
    enc = encoder_out["encoder_out"][0]  # (S, B, C)
    pads = encoder_out.get("encoder_padding_mask") or []
    keep = None
    if len(pads) > 0 and pads[0] is not None and bool(pads[0].any()):
        keep = (~pads[0]).view(pads[0].size(0), 1, 1, pads[0].size(1))
    return CrossKV([packed.encoder_kv(layer.encoder_attn, enc) for layer in decoder.layers], keep)


def embed_tokens(decoder, tokens):
    """fairseq's ``extract_features`` input (scaled token embeddings, project_in_dim, positions,
    layernorm_embedding) -> (N, T, C); modules/packed.py's, whose dropout is the identity in eval mode."""
    return packed.embed(decoder, tokens)


def self_attention(layer, x, keep):
    """Self-attention sublayer (no causal mask) with its residual and layer norm; keep (N, 1, 1, T)
    bool False at padded keys, or None."""
    sa = layer.self_attn
    h = layer.self_attn_layer_norm(x) if layer.normalize_before else x
    q, k, v = stacked_qkv(sa, h).chunk(3, dim=-1)
    H = sa.num_heads
    h = F.scaled_dot_product_attention(_heads(q, H), _heads(k, H), _heads(v, H), attn_mask=keep)
    x = x + cpu_linear.module(sa.out_proj, _merge(h))
    return x if layer.normalize_before else layer.self_attn_layer_norm(x)


def cross_attention(layer, x, k, v, keep):
    """Encoder-decoder attention sublayer on cached keys/values k, v (N, H, S, D), keep (N, 1, 1, S)
    or None, with its residual and layer norm."""
    ca = layer.encoder_attn
    h = layer.encoder_attn_layer_norm(x) if layer.normalize_before else x
    q = _heads(cpu_linear.module(ca.q_proj, h), ca.num_heads)
    h = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    x = x + cpu_linear.module(ca.out_proj, _merge(h))
    return x if layer.normalize_before else layer.encoder_attn_layer_norm(x)


def feed_forward(layer, x):
    """Feed-forward sublayer with its residual and layer norm (any leading shape)."""
    h = layer.final_layer_norm(x) if layer.normalize_before else x
    x = x + cpu_linear.module(layer.fc2, layer.activation_fn(cpu_linear.module(layer.fc1, h)))
    return x if layer.normalize_before else layer.final_layer_norm(x)


def decoder_features(decoder, x, self_pad, cross, sent=None, select=None):
    """Run ``decoder``'s layers (eval mode) on embedded input.

    x (N, T, C) embedded decoder input; self_pad (N, T) bool True at padding (or None: no padding);
    cross a :class:`CrossKV` of the sentences; sent (N,) the sentence of every row (None: row i is
    sentence i); select (N, T) bool: the positions whose states are returned.
    -> the final states (after the decoder's layer_norm and project_out_dim): (N, T, C), or (M, C) at
    the M selected positions in row-major order (the last layer's feed-forward block runs only there).
    """
    keep = None if self_pad is None else (~self_pad).view(x.size(0), 1, 1, x.size(1))
    last = len(decoder.layers) - 1
    for i, layer in enumerate(decoder.layers):
        x = self_attention(layer, x, keep)
        x = cross_attention(layer, x, *cross.rows(i, sent))
        if i == last and select is not None:
            x = x[select]  # only these positions' states are read
        x = feed_forward(layer, x)
    if decoder.layer_norm is not None:
        x = decoder.layer_norm(x)
    if decoder.project_out_dim is not None:
        x = cpu_linear.module(decoder.project_out_dim, x)
    return x
