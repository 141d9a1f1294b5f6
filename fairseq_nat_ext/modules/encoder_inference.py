"""Inference forward of a fairseq Transformer encoder, for the generators' decoding scope.

fairseq's ``TransformerEncoder`` runs every layer through ``MultiheadAttention`` (separate q/k/v
products, explicit attention weights, a (T, B, C) layout with reshapes around every head split) and
``nn.Linear`` (torch's ``linear`` on CPU).  A NAT decoder encodes each sentence once, but at batch 1
that one pass is a few percent of the sentence's time, and noisy parallel decoding runs two encoders
(the NAT's and the teacher's).  :func:`encode` computes the same output with the decoder fast path's
sublayers (:mod:`.nat_decoder_inference`: q/k/v as one product, torch's ``scaled_dot_product_attention``,
the products on CPU through :mod:`.cpu_linear`'s prepacked weights) in the batch-first layout.  Equal
to fairseq's forward up to float rounding (tests/test_encoder_inference.py compares them, padded
batches included), at every position: padded positions are zeroed before the first layer and
attend to the real ones, as in fairseq.

Where it runs: :func:`maybe_encode` is called by the plugin's encoders (``EfficientEncoderMixin``)
and by noisy parallel decoding for the teacher's; it takes this path only inside a generator's
decoding scope (``cpu_linear.caching()``: eval mode, no autograd) and for an encoder :func:`supported`
accepts, and returns None otherwise (the caller runs fairseq's forward).  Training and validation
never take it.
"""
import torch

from . import cpu_linear, fast_route, module_walk
from . import nat_decoder_inference as fast


#: False: :func:`maybe_encode` always returns None (fairseq's forward everywhere; for profiling and tests)
enabled = True


def supported(encoder) -> bool:
    """True when :func:`encode` computes exactly what ``encoder``'s own forward does: fairseq's
    ``TransformerEncoderBase`` forward_scriptable and embedding (ours without added global tokens), no embedding quant-noise,
    fairseq's encoder layers with fairseq's full ``MultiheadAttention`` (no bias_kv / zero attention /
    xFormers, the standard scaling), no dropout kept at inference (``--retain-dropout``); once per encoder
    inside a ``fast_route.decoding_call``."""
    return fast_route.once("encoder", encoder, _supported)


def _supported(encoder):
    from fairseq.models.transformer import TransformerEncoderBase
    from fairseq.modules import MultiheadAttention
    from fairseq.modules.transformer_layer import TransformerEncoderLayer, TransformerEncoderLayerBase

    if not isinstance(encoder, TransformerEncoderBase) or getattr(encoder, "num_added_tokens", 0):
        return False
    if not fast_route.allows(encoder):
        return False
    from .efficient_encoder import EfficientEncoderMixin

    own = (TransformerEncoderBase.forward_scriptable, EfficientEncoderMixin.forward_scriptable)
    if (type(encoder).forward_scriptable not in own or encoder.quant_noise is not None
            or type(encoder).forward_embedding is not TransformerEncoderBase.forward_embedding):
        return False
    layers = getattr(encoder, "layers", None)
    if layers is None or len(layers) == 0:
        return False
    if module_walk.dropout_at_inference(encoder):
        return False  # --retain-dropout: fairseq applies dropout at inference, this forward does not
    # nn.ModuleList's own iterator: fairseq's LayerDropModuleList draws a random number per layer on
    # every iteration (even in eval mode), and fairseq's forward iterates once; so does encode()
    for layer in torch.nn.ModuleList.__iter__(layers):
        if type(layer) not in (TransformerEncoderLayerBase, TransformerEncoderLayer):
            return False
        if type(layer.self_attn) is not MultiheadAttention or not fast._attn_supported(layer.self_attn):
            return False
        if type(layer).residual_connection is not TransformerEncoderLayerBase.residual_connection:
            return False
    return True


def usable(encoder, src_tokens, return_all_hiddens=False, token_embeddings=None) -> bool:
    """Whether :func:`maybe_encode` takes the fast path for this call."""
    return (enabled and not encoder.training and cpu_linear.caching() and not return_all_hiddens
            and token_embeddings is None and src_tokens.dim() == 2 and supported(encoder))


def encode(encoder, src_tokens, src_lengths=None):
    """fairseq's ``encoder(src_tokens, src_lengths)`` output dict, computed batch-first (see the module
    doc); ``encoder_states`` and ``fc_results`` are empty, as fairseq's without ``return_all_hiddens``."""
    pad = src_tokens.eq(encoder.padding_idx)
    has_pads = bool(pad.any())
    x, embedding = encoder.forward_embedding(src_tokens)  # (B, S, C); its dropout is off in eval mode
    keep = None
    if has_pads:
        x = x * (1 - pad.unsqueeze(-1).type_as(x))
        keep = (~pad).view(pad.size(0), 1, 1, pad.size(1))
    for layer in encoder.layers:
        x = fast.self_attention(layer, x, keep)
        x = fast.feed_forward(layer, x)
    if encoder.layer_norm is not None:
        x = encoder.layer_norm(x)
    lengths = src_tokens.ne(encoder.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
    return {
        "encoder_out": [x.transpose(0, 1).contiguous()],  # (S, B, C), as fairseq's
        "encoder_padding_mask": [pad],
        "encoder_embedding": [embedding],
        "encoder_states": [],
        "fc_results": [],
        "src_tokens": [],
        "src_lengths": [lengths],
    }


def maybe_encode(encoder, src_tokens, src_lengths=None, return_all_hiddens=False, token_embeddings=None):
    """:func:`encode` where :func:`usable`, else None (the caller runs fairseq's forward)."""
    if not usable(encoder, src_tokens, return_all_hiddens, token_embeddings):
        return None
    return encode(encoder, src_tokens, src_lengths)


def forward(encoder, src_tokens, src_lengths=None):
    """``encoder(src_tokens, src_lengths=src_lengths)``, through :func:`encode` where :func:`usable` and
    the encoder's class keeps fairseq's ``forward`` (for encoders that do not route their own forward
    here, e.g. fairseq's ``TransformerEncoder`` of an autoregressive teacher; a subclass with its own
    ``forward`` is called as it is)."""
    from fairseq.models.transformer import TransformerEncoderBase

    if type(encoder).forward is TransformerEncoderBase.forward:
        out = maybe_encode(encoder, src_tokens, src_lengths)
        if out is not None:
            return out
    return encoder(src_tokens, src_lengths=src_lengths)
