"""Decoder layers over the REAL positions of a right-padded batch only ("packed" rows).

NPD decodes and teacher-scores many candidates of different lengths at once: padded to the longest, 28% of
the positions of Multi30K's batch-1 candidates (s = 10) are padding, and every position-wise product
(q/k/v/out projections, feed-forward, layer norms) would run on them.  Here the position-wise work runs on
the (M, C) rows of the real positions; only attention scatters its projections into the (N, T) layout
(zeros at padding, masked).  q, k and v of a self-attention come from ONE product with the stacked
weights.  Cross-attention to a single source (key batch 1: batch-1 NPD) needs no padded layout at all:
the M query rows attend to its S keys directly.

Training too (the Levenshtein Transformer's passes, :func:`nat_decoder_features`): y0 keeps a uniform share
of its target's tokens, so about half of a batch's deletion / placeholder positions are padding.  The
layers' own dropout modules act where fairseq's layer applies them (embedding, attention probabilities,
each residual branch, the feed-forward activation), so in eval mode nothing changes (a residual branch's
dropout module is not even called where it would return its input); and a training step's
passes over one batch may share the encoder keys / values of every cross-attention (:func:`cross_kv`:
projected once, their gradient summed over the passes by autograd).

Functions work on fairseq's own modules (``MultiheadAttention``, ``TransformerDecoderLayerBase``) and read
their parameters; nothing is copied.  :func:`supports_decoder` says whether a fairseq decoder has only the
features implemented here (callers fall back to its own forward otherwise).
"""
from typing import Optional

import torch
import torch.nn.functional as F

from . import cpu_linear, fast_route
from .attention.mix import KV, stacked_qkv, stacked_qkv_weight
from .attention.partials import additive

Tensor = torch.Tensor


class Rows:
    """The real positions ``valid`` (N, T) bool (a prefix of each row) of a padded batch."""

    def __init__(self, valid: Tensor, _dense: bool = False):
        self.valid = valid
        self.N, self.T = valid.shape
        # every position is real (only :meth:`whole` says so): packing is a reshape, and pack / unpack
        # return views of their input
        self.dense = _dense
        # the real positions' flat indices, found once: a layer packs and unpacks several times, and an
        # index_select / index_copy_ by them is several times cheaper than boolean-mask indexing
        self.index = (torch.arange(valid.numel(), device=valid.device) if _dense
                      else valid.reshape(-1).nonzero().squeeze(1))

    @classmethod
    def whole(cls, N: int, T: int, device=None) -> "Rows":
        """N rows of T positions, all real."""
        return cls(torch.ones(N, T, dtype=torch.bool, device=device), _dense=True)

    def pack(self, x: Tensor) -> Tensor:
        """(N, T, ...) -> (M, ...): the rows at real positions, row-major."""
        flat = x.reshape(self.N * self.T, *x.shape[2:])
        return flat if self.dense else flat.index_select(0, self.index)

    def unpack(self, rows: Tensor) -> Tensor:
        """(M, F) -> (N, T, F), zeros at padding."""
        if self.dense:
            return rows.reshape(self.N, self.T, rows.size(-1))
        out = rows.new_zeros(self.N * self.T, rows.size(-1))
        return out.index_copy_(0, self.index, rows).view(self.N, self.T, rows.size(-1))


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


def attention_dropout(mha) -> float:
    """The probability fairseq's ``MultiheadAttention`` drops attention weights with, now."""
    drop = mha.dropout_module
    return drop.p if drop.p > 0 and (drop.training or drop.apply_during_inference) else 0.0


def self_attention(mha, x: Tensor, rows: Rows, mask: Optional[Tensor] = None, causal: bool = False) -> Tensor:
    """fairseq ``MultiheadAttention`` as self-attention on packed rows x (M, C) -> (M, C).  ``mask``: bool
    (True = may attend) or additive float, broadcasting to (N, H, T, T); ``causal``: the future is masked."""
    qkv = stacked_qkv(mha, x)
    N, T = rows.N, rows.T
    H = mha.num_heads
    q, k, v = rows.unpack(qkv).view(N, T, 3, H, -1).permute(2, 0, 3, 1, 4).unbind(0)  # each (N, H, T, d)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=attention_dropout(mha),
                                         is_causal=causal and mask is None)
    return cpu_linear.module(mha.out_proj, _merge(out, rows))


def positional_attention(mha, positions: Tensor, x: Tensor, rows: Rows, key_ok: Tensor) -> Tensor:
    """Queries and keys from ``positions`` (T, C), the same for every row (projected once), values from the
    packed rows x (M, C); ``key_ok`` (N, T) bool, or that mask already made 4-D, e.g. additive
    (N, 1, 1, T) float (made once for several layers) -> (M, C)."""
    H = mha.num_heads
    q = _heads(cpu_linear.module(mha.q_proj, positions).unsqueeze(0), H).expand(rows.N, -1, -1, -1)
    k = _heads(cpu_linear.module(mha.k_proj, positions).unsqueeze(0), H).expand(rows.N, -1, -1, -1)
    v = _heads(rows.unpack(cpu_linear.module(mha.v_proj, x)), H)
    mask = key_ok[:, None, None, :] if key_ok.dim() == 2 else key_ok
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return cpu_linear.module(mha.out_proj, _merge(out, rows))


def encoder_kv(mha, enc: Tensor):
    """The keys and values (Bk, H, S, d) that ``mha`` reads from the encoder output ``enc`` (S, Bk, C).
    On CPU inside a caching decoding scope (:func:`.cpu_linear.caching`), as ONE product with the k and v
    weights stacked (the source's few rows: a product costs about what reading its weight does)."""
    H = mha.num_heads
    S, Bk, _ = enc.shape
    if cpu_linear.caching() and enc.device.type == "cpu" and mha.k_proj.in_features == mha.v_proj.in_features:
        kv = cpu_linear.linear(enc, *stacked_qkv_weight(mha, KV))  # (S, Bk, 2C)
        k, v = kv.permute(1, 0, 2).reshape(Bk, S, 2, H, -1).permute(2, 0, 3, 1, 4).unbind(0)
        return k, v
    k = cpu_linear.module(mha.k_proj, enc).permute(1, 0, 2).reshape(Bk, S, H, -1).transpose(1, 2)
    v = cpu_linear.module(mha.v_proj, enc).permute(1, 0, 2).reshape(Bk, S, H, -1).transpose(1, 2)
    return k, v


def cross_kv(decoder, encoder_out) -> dict:
    """Every layer's cross-attention keys / values over ``encoder_out``, keyed by the attention module: the
    passes of one training step over the same sources share them (``kv=`` of :func:`nat_decoder_features`)."""
    enc = encoder_out["encoder_out"][0]
    return {layer.encoder_attn: encoder_kv(layer.encoder_attn, enc) for layer in decoder.layers
            if layer.encoder_attn is not None}


def shared_cross_kv(decoder, encoder_out) -> Optional[dict]:
    """:func:`cross_kv` where :func:`supports_decoder` (the decoder's packed forward reads it), else None."""
    return cross_kv(decoder, encoder_out) if supports_decoder(decoder) else None


def select_kv(kv: Optional[dict], index: Tensor) -> Optional[dict]:
    """The shared keys / values of the sources ``index`` (as fairseq's ``reorder_encoder_out``)."""
    if kv is None:
        return None
    return {m: (k.index_select(0, index), v.index_select(0, index)) for m, (k, v) in kv.items()}


def cross_attention(mha, x: Tensor, rows: Rows, enc: Tensor, enc_pad: Optional[Tensor], kv=None) -> Tensor:
    """Packed query rows x (M, C) over the encoder output ``enc`` (S, Bk, C) with padding ``enc_pad``
    (Bk, S) bool (True = padding) or None.  Bk = 1: every row reads that one source (no padded layout);
    Bk = N: row n reads source n.  ``kv``: its keys / values already projected (:func:`encoder_kv`)."""
    H = mha.num_heads
    k, v = encoder_kv(mha, enc) if kv is None else kv  # (Bk, H, S, d)
    Bk = k.size(0)
    ok = None if enc_pad is None else ~enc_pad.bool()[:, None, None, :]
    q = cpu_linear.module(mha.q_proj, x)
    p = attention_dropout(mha)
    if Bk == 1:
        out = F.scaled_dot_product_attention(_heads(q.unsqueeze(0), H), k, v, attn_mask=ok, dropout_p=p)
        # (1, H, M, d) -> (M, C)
        return cpu_linear.module(mha.out_proj, out.transpose(1, 2).reshape(q.shape))
    if Bk != rows.N:
        raise ValueError(f"cross_attention: {Bk} encoder rows for {rows.N} decoder rows")
    out = F.scaled_dot_product_attention(_heads(rows.unpack(q), H), k, v, attn_mask=ok, dropout_p=p)
    return cpu_linear.module(mha.out_proj, _merge(out, rows))


def _drops(dropout) -> bool:
    """Whether a dropout module acts now (fairseq's ``FairseqDropout`` forward's own condition)."""
    return dropout.p > 0 and (dropout.training or getattr(dropout, "apply_during_inference", False))


def block(layer, x: Tensor, norm, fn) -> Tensor:
    """fairseq's residual block: pre- or post-norm by ``layer.normalize_before``, the branch through the
    layer's dropout (identity in eval mode).  (The residual is not fused into the branch's last product as
    on nat_decoder_inference's packed route: measured here, NPD decoded 1-3 % slower with it.)"""
    drop = layer.dropout_module
    if layer.normalize_before:
        y = fn(norm(x))
        return x + (drop(y) if _drops(drop) else y)
    y = fn(x)
    return norm(x + (drop(y) if _drops(drop) else y))


def feed_forward(layer, x: Tensor) -> Tensor:
    """fc2(activation_dropout(activation(fc1(x)))); a ReLU without activation dropout is applied inside
    oneDNN's first product where it can be (the same values)."""
    if (layer.activation_fn is F.relu and not _drops(layer.activation_dropout_module)
            and cpu_linear.usable(x, layer.fc1.weight) and cpu_linear.fused_available()):
        h = cpu_linear.prepacked(x, cpu_linear.packed_weight(layer.fc1.weight), layer.fc1.bias, relu=True)
    else:
        h = layer.activation_dropout_module(layer.activation_fn(cpu_linear.module(layer.fc1, x)))
    return cpu_linear.module(layer.fc2, h)


def supports_decoder(decoder) -> bool:
    """Whether :func:`decoder_features` reproduces this fairseq Transformer decoder's forward (once per
    decoder inside a ``fast_route.decoding_call``)."""
    return fast_route.once("packed_decoder", decoder, _supports_decoder)


def _supports_decoder(decoder) -> bool:
    from fairseq.models.transformer import TransformerDecoderBase

    if not isinstance(decoder, TransformerDecoderBase) or not fast_route.allows(decoder):
        return False
    if decoder.quant_noise is not None or getattr(decoder, "cross_self_attention", False):
        return False
    if decoder.training and getattr(decoder, "decoder_layerdrop", 0.0) > 0:
        return False
    for layer in decoder.layers:
        if getattr(layer, "cross_self_attention", False) or any(
                getattr(layer, name, None) is not None for name in ("c_attn", "attn_ln", "ffn_layernorm", "w_resid")):
            return False
        if not mha_supported(layer.self_attn) or (layer.encoder_attn is not None and not mha_supported(layer.encoder_attn)):
            return False
    return True


def prefix_tree(prev_output_tokens: Tensor, pad: int):
    """Rows of ONE source's teacher-forced inputs (N, T), right-padded -> (node (N, T) long: the id of the
    prefix prev[n, :t + 1] among the distinct prefixes of all rows, -1 at padding; ancestor (K, K) bool:
    node i's prefix starts with node j's (j = i included)).  Ids are level-major: the distinct prefixes of
    length 1 first, then those of length 2, ...; within a level in lexicographic order of the tokens.

    Without a loop over positions: sorted lexicographically, the rows that share a prefix of length
    t + 1 are consecutive (the sequences starting with a given prefix form an interval of the order; a
    row shorter than t + 1 holds ``pad`` at t and cannot sit inside such an interval of real tokens), so
    a row starts a new node at t exactly when its prefix differs from the previous sorted row's, and the
    running count of new nodes down a level numbers them."""
    N, T = prev_output_tokens.shape
    device = prev_output_tokens.device
    real = prev_output_tokens.ne(pad)
    if N == 0 or T == 0:
        return torch.full((N, T), -1, dtype=torch.long, device=device), torch.zeros(0, 0, dtype=torch.bool, device=device)
    _, rank = torch.unique(prev_output_tokens, dim=0, return_inverse=True)  # lexicographic rank of each row
    order = torch.argsort(rank, stable=True)
    rows, live = prev_output_tokens[order], real[order]
    same = torch.zeros(N, T, dtype=torch.bool, device=device)  # prefix [:t + 1] equals the previous row's
    same[1:] = (rows[1:] == rows[:-1]).long().cumprod(1).bool()
    new = live & ~same  # the first row of every distinct prefix, level by level
    per_level = new.sum(0)  # (T,) nodes of each prefix length
    offset = torch.cumsum(per_level, 0) - per_level
    sorted_node = (offset.unsqueeze(0) + new.long().cumsum(0) - 1).masked_fill(~live, -1)
    node = torch.empty_like(sorted_node)
    node[order] = sorted_node
    count = int(per_level.sum())
    # ancestor-or-self pairs: along each row, node at t has the nodes at 0..t as ancestors
    ancestor = torch.zeros(count, count, dtype=torch.bool, device=device)
    later = torch.ones(T, T, dtype=torch.bool, device=device).tril()  # [t, s]: s <= t
    both = real.unsqueeze(2) & real.unsqueeze(1) & later  # (N, T, T)
    ancestor[node.unsqueeze(2).expand(N, T, T)[both], node.unsqueeze(1).expand(N, T, T)[both]] = True
    return node, ancestor


def tree_decoder_features(decoder, prev_output_tokens: Tensor, encoder_out):
    """Teacher forcing of many rows from ONE source (``encoder_out`` of batch 1) over their distinct
    prefixes only: a causal decoder's state at position t depends on prev[:t + 1] alone, so rows that share
    a prefix share its states.  Every distinct prefix is one node; a node attends to its ancestors (the
    causal mask of any row that holds it), so its state is exactly that row's.  -> (features (K, C) of the K
    nodes, node (N, T) of :func:`prefix_tree`).  NPD's batch-1 candidates share 45% of their teacher
    positions (Multi30K, s = 10).  Only where :func:`supports_decoder`."""
    node, ancestor = prefix_tree(prev_output_tokens, decoder.padding_idx)
    first = torch.full((ancestor.size(0),), -1, dtype=torch.long, device=node.device)
    flat = node.flatten()
    where = flat.ge(0).nonzero().squeeze(1)
    first.scatter_reduce_(0, flat[where], where, reduce="amax", include_self=True)  # one position per node
    x = embed(decoder, prev_output_tokens).flatten(0, 1)[first]  # (K, C)
    enc, enc_pad = encoder_states(encoder_out)
    whole = Rows.whole(1, x.size(0), device=x.device)  # the nodes as one sequence
    # additive, made once: torch's attention converts a bool mask on every call (one per layer)
    mask = additive(ancestor, x.dtype).unsqueeze(0).unsqueeze(0)
    x = _layers(decoder, x, whole, enc, enc_pad, mask=mask)
    return x, node


def encoder_states(encoder_out):
    """fairseq's encoder output dict -> (states (S, B, C) or None, padding mask (B, S) or None; None too
    on CPU when no source position is padding, e.g. batch 1: attention then runs without a mask, the
    same values as with an all-true one, and torch's CPU attention is faster without; on CUDA the mask
    is kept, so that no call waits for the device to answer whether it is empty)."""
    enc = encoder_out["encoder_out"][0] if encoder_out is not None and encoder_out["encoder_out"] else None
    enc_pad = encoder_out["encoder_padding_mask"][0] if enc is not None and encoder_out["encoder_padding_mask"] else None
    if enc_pad is not None and enc_pad.device.type == "cpu" and not bool(enc_pad.any()):
        enc_pad = None
    return enc, enc_pad


def embed(decoder, prev_output_tokens: Tensor) -> Tensor:
    """fairseq's decoder input embedding (N, T, C), through its dropout (identity in eval mode)."""
    x = decoder.embed_scale * decoder.embed_tokens(prev_output_tokens)
    if decoder.project_in_dim is not None:
        x = decoder.project_in_dim(x)
    if decoder.embed_positions is not None:
        x = x + decoder.embed_positions(prev_output_tokens)
    if decoder.layernorm_embedding is not None:
        x = decoder.layernorm_embedding(x)
    return decoder.dropout_module(x)


def _layers(decoder, x: Tensor, rows: Rows, enc, enc_pad, mask=None, kv=None) -> Tensor:
    """The decoder layers and final norm / projection on packed rows; self-attention causal within each
    row of ``rows``, or by ``mask`` when given; ``kv``: shared keys / values of :func:`cross_kv`."""
    for layer in decoder.layers:
        x = block(layer, x, layer.self_attn_layer_norm,
                  lambda h: self_attention(layer.self_attn, h, rows, mask=mask, causal=mask is None))
        if layer.encoder_attn is not None and enc is not None:
            shared = None if kv is None else kv[layer.encoder_attn]
            x = block(layer, x, layer.encoder_attn_layer_norm,
                      lambda h: cross_attention(layer.encoder_attn, h, rows, enc, enc_pad, kv=shared))
        x = block(layer, x, layer.final_layer_norm, lambda h: feed_forward(layer, h))
    if decoder.layer_norm is not None:
        x = decoder.layer_norm(x)
    if decoder.project_out_dim is not None:
        x = decoder.project_out_dim(x)
    return x


def decoder_features(decoder, prev_output_tokens: Tensor, encoder_out) -> Tensor:
    """A fairseq Transformer decoder, teacher-forced on right-padded ``prev_output_tokens`` (N, T) -> its
    final features (M, C) at the non-padding positions (row-major), as ``decoder(prev, encoder_out,
    features_only=True)[0][prev != pad]``.  ``encoder_out``'s batch is N, or 1 (every row reads that
    source).  Only where :func:`supports_decoder`."""
    valid = prev_output_tokens.ne(decoder.padding_idx)
    rows = Rows(valid)
    x = rows.pack(embed(decoder, prev_output_tokens))
    enc, enc_pad = encoder_states(encoder_out)
    # causal: a real query sees only earlier positions, which are real in a right-padded row
    return _layers(decoder, x, rows, enc, enc_pad)


def nat_decoder_features(decoder, tokens: Tensor, encoder_out, kv: Optional[dict] = None) -> Tensor:
    """A fairseq Transformer decoder without its future mask (``full_context_alignment=True``: every
    position reads every real position of its row), on right-padded ``tokens`` (N, T) -> features (N, T, C),
    zeros at padding (fairseq leaves values there that no loss reads).  Training mode applies the decoder's
    dropout as fairseq's layers do.  ``kv``: :func:`cross_kv` of this ``encoder_out``, shared by several
    passes.  Only where :func:`supports_decoder`."""
    valid = tokens.ne(decoder.padding_idx)
    rows = Rows(valid)
    x = rows.pack(embed(decoder, tokens))
    enc, enc_pad = encoder_states(encoder_out)
    mask = valid[:, None, None, :]  # keys: the real positions of the row
    return rows.unpack(_layers(decoder, x, rows, enc, enc_pad, mask=mask, kv=kv))
