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

from . import cpu_linear, fast_route, module_walk, packed
from .attention.mix import stacked_qkv, stacked_qkv_weight


#: functions called with the decoder at every pass of :func:`decoder_features` / :func:`token_features`
#: (evaluation.inference.count_decoder_calls counts the passes with one)
PASS_OBSERVERS = []


def _attn_supported(attn):
    return (attn is not None and attn.bias_k is None and not attn.add_zero_attn
            and not getattr(attn, "use_xformers", False) and attn.qkv_same_dim
            and abs(attn.scaling - attn.head_dim ** -0.5) < 1e-12)


def supported(decoder):
    """True when :func:`decoder_features` computes exactly what ``decoder``'s own layer loop does (in
    eval mode: no dropout kept at inference); once per decoder inside a ``fast_route.decoding_call``."""
    return fast_route.once("nat_decoder", decoder, _supported)


def _supported(decoder):
    layers = getattr(decoder, "layers", None)
    if layers is None or len(layers) == 0 or getattr(decoder, "cross_self_attention", False):
        return False
    if not fast_route.allows(decoder):
        return False  # switched off, a user's override, a hook or a non-plain projection (fast_route.py)
    if module_walk.dropout_at_inference(decoder):
        return False  # --retain-dropout: fairseq's layers drop at inference, this forward does not
    if getattr(decoder, "quant_noise", None) is not None:
        return False  # fairseq applies the decoder's quant-noise projection to its input, even in eval mode
    for layer in _layers(decoder):
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
    (B, H, S, C / H), ``keep`` (B, 1, 1, S) bool (False at source padding) or None, and ``plan`` (a
    :class:`Plan` of the decoder's weights for the packed CPU route, or None).  Like the keys and values,
    the plan is a snapshot of the decoder for one decoding call: weights changed afterwards are not seen."""

    def __init__(self, kv, keep, plan=None):
        self.kv, self.keep, self.plan = kv, keep, plan

    def rows(self, i, sent):
        """Layer i's keys, values and key mask for decoder rows of the sentences ``sent`` (None: one
        row per sentence, in order)."""
        k, v = self.kv[i]
        keep = self.keep
        if sent is not None:
            k, v = k.index_select(0, sent), v.index_select(0, sent)
            keep = keep.index_select(0, sent) if keep is not None else None
        return k, v, keep


def cross_kv(decoder, encoder_out, checked=False):
    """encoder_out (fairseq's dict) -> :class:`CrossKV` of every layer of ``decoder``; ``checked``: the
    caller has just seen :func:`supported` hold for ``decoder`` (every caller checks it first; the plan
    then skips that walk over the decoder's modules)."""
    enc = encoder_out["encoder_out"][0]  # (S, B, C)
    pads = encoder_out.get("encoder_padding_mask") or []
    keep = None
    if len(pads) > 0 and pads[0] is not None and bool(pads[0].any()):
        keep = (~pads[0]).view(pads[0].size(0), 1, 1, pads[0].size(1))
    layers = _layers(decoder)
    return CrossKV([packed.encoder_kv(layer.encoder_attn, enc) for layer in layers], keep,
                   Plan.build(decoder, enc, checked))


def layerdrop_count(layers):
    """How many uniforms one iteration of ``layers`` draws from torch's global generator (fairseq's
    LayerDropModuleList: one per layer; a plain list: none)."""
    from fairseq.modules.layer_drop import LayerDropModuleList

    return len(layers) if isinstance(layers, LayerDropModuleList) else 0


def _layers(decoder):
    """The decoder's layers, without a draw of fairseq's LayerDropModuleList (its iterator draws from
    torch's global generator on every iteration, even in eval mode)."""
    return list(torch.nn.ModuleList.__iter__(decoder.layers))


def _norm(ln):
    """A layer norm as (weight, bias, eps, shape) for ``F.layer_norm`` (torch's ``LayerNorm`` only),
    or the module itself."""
    if type(ln) is torch.nn.LayerNorm:
        return (ln.weight, ln.bias, ln.eps, ln.normalized_shape)
    return ln


def _apply_norm(norm, x):
    if isinstance(norm, tuple):
        w, b, eps, shape = norm
        return F.layer_norm(x, shape, w, b, eps)
    return norm(x)


class Plan:
    """The weights :func:`decoder_features` reads on the packed CPU route, fetched once per decoding
    call instead of once per product and pass: every product's weight in oneDNN's layout
    (:func:`.cpu_linear.packed_weight`), the layer norms' parameters, and whether the feed-forward
    activation is ReLU (then fused into the first product, as are the residual additions into the
    products that end each sublayer; :func:`.cpu_linear.fused_available`)."""

    def __init__(self, layers, final_norm, out_proj, layerdrop=0):
        self.layers, self.final_norm, self.out_proj = layers, final_norm, out_proj
        #: fairseq's LayerDropModuleList draws len(layers) uniforms from torch's global generator each time
        #: it is iterated, eval mode included (it drops nothing there): a pass of fairseq's forward does,
        #: and so does each pass here (0: plain layers, no draw), so seeded sampling is the same on both
        self.layerdrop = layerdrop
        self._positions = {}  # T -> (T, C) position embeddings of a right-padded row's real positions

    def positions(self, decoder, T, device):
        """``decoder.embed_positions`` of the positions 0..T-1 of a row whose tokens are all real (what
        every real position of a right-padded row gets), (T, C); computed once per T."""
        hit = self._positions.get(T)
        if hit is None:
            dummy = torch.full((1, T), decoder.padding_idx + 1, dtype=torch.long, device=device)
            hit = self._positions[T] = decoder.embed_positions(dummy)[0]
        return hit

    @staticmethod
    def build(decoder, enc, checked=False):
        """The plan of ``decoder`` for decoder inputs like ``enc`` (float32 on CPU inside a caching
        decoding scope, :func:`.cpu_linear.usable`), else None."""
        if (not cpu_linear.caching() or enc.device.type != "cpu" or enc.dtype != torch.float32
                or not cpu_linear.fused_available() or not (checked or supported(decoder))):
            return None

        def lin(m):
            if not cpu_linear.usable(enc, m.weight):
                raise _NoPlan
            return (cpu_linear.packed_weight(m.weight), m.bias)

        try:
            layers = []
            for layer in _layers(decoder):
                sa, ca = layer.self_attn, layer.encoder_attn
                w, b = stacked_qkv_weight(sa)
                if not cpu_linear.usable(enc, w):
                    raise _NoPlan
                layers.append(dict(
                    pre=layer.normalize_before, heads=sa.num_heads, cross_heads=ca.num_heads,
                    qkv=(cpu_linear.packed_weight(w), b), sa_out=lin(sa.out_proj),
                    ca_q=lin(ca.q_proj), ca_out=lin(ca.out_proj), fc1=lin(layer.fc1), fc2=lin(layer.fc2),
                    relu=layer.activation_fn is F.relu, act=layer.activation_fn,
                    sa_norm=_norm(layer.self_attn_layer_norm), ca_norm=_norm(layer.encoder_attn_layer_norm),
                    ff_norm=_norm(layer.final_layer_norm)))
            out = None if decoder.project_out_dim is None else lin(decoder.project_out_dim)
        except _NoPlan:
            return None
        final = None if decoder.layer_norm is None else _norm(decoder.layer_norm)
        return Plan(layers, final, out, layerdrop_count(decoder.layers))


class _NoPlan(Exception):
    pass


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
    With ``cross.plan`` (CPU, float32, inside a decoding scope) the layers run on the real positions
    only (:func:`packed_features`); states at padding are then zeros.
    """
    for observe in PASS_OBSERVERS:
        observe(decoder)
    return _features(decoder, x, self_pad, cross, sent, select)


def _features(decoder, x, self_pad, cross, sent, select):
    if cross.plan is not None and cpu_linear.caching() and x.dtype == torch.float32 and x.device.type == "cpu":
        out = packed_features(cross.plan, x, self_pad, cross, sent, select)
        if out is not None:
            return out
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


def packed_features(plan, x, self_pad, cross, sent=None, select=None):
    """:func:`decoder_features` on the packed CPU route: the same layers and maths, with

    * every position-wise product and layer norm on the (M, C) rows of the real positions only
      (length candidates of one batch are padded to the longest; modules/packed.py's ``Rows``); only
      attention reads the padded (N, T) layout;
    * cross-attention of rows that all read ONE sentence (batch 1: its length candidates) as one
      sequence of M queries over that sentence's keys, without a padded layout;
    * in the last layer, with ``select``, everything after the self-attention's weighted values (its
      output projection, the cross-attention, the feed-forward block) only at the selected positions
      (the keys and values of every position are still needed);
    * the weights fetched once per decoding call (:class:`Plan`), ReLU and the residual additions fused
      into the products.
    Equal to the padded route up to float rounding (the same hypotheses in every decoder's test).
    None (the caller takes the padded route) when there is nothing to compute (no real or no selected
    position) or ``select`` asks for padding positions."""
    N, T, _ = x.shape
    valid = (torch.ones(N, T, dtype=torch.bool, device=x.device) if self_pad is None else ~self_pad)
    rows = packed.Rows(valid)
    pick = _pick(rows, self_pad, select)
    if pick is False:
        return None
    return _packed_layers(plan, rows.pack(x), rows, self_pad, cross, sent, pick)


def _pick(rows, self_pad, select):
    """The selected positions' indices among the packed rows (None: no selection), or False when the
    packed route cannot serve the call (no real position, nothing selected, padding selected)."""
    if rows.index.numel() == 0:
        return False
    if select is None:
        return None
    if self_pad is not None and bool((select & self_pad).any()):
        return False  # padding positions' states asked for: only the padded route has them
    pick = (rows.valid.reshape(-1).long().cumsum(0) - 1)[select.reshape(-1).nonzero().squeeze(1)]
    return pick if pick.numel() > 0 else False


def token_features(decoder, tokens, cross, sent=None, select=None):
    """``decoder_features(decoder, embed_tokens(decoder, tokens), pad, cross, sent, select)`` for
    right-padded decoder input tokens (N, T) (pad: their padding, None when there is none); on the
    packed route only the real positions are embedded (position embeddings of a length computed once per
    decoding call).  The packed route needs right-padded rows (each row's real tokens first, as a NAT
    generator's candidates are); other padding takes the padded route, whose positions follow fairseq's
    ``make_positions``."""
    for observe in PASS_OBSERVERS:
        observe(decoder)
    pad = tokens.eq(decoder.padding_idx)
    self_pad = pad if bool(pad.any()) else None
    plan = cross.plan
    right_padded = self_pad is None or not bool((pad[:, :-1] & ~pad[:, 1:]).any())
    if plan is not None and cpu_linear.caching() and tokens.device.type == "cpu" and right_padded:
        rows = packed.Rows(~pad)
        pick = _pick(rows, self_pad, select)
        if pick is not False:
            h = decoder.embed_scale * decoder.embed_tokens(tokens.reshape(-1).index_select(0, rows.index))
            if decoder.project_in_dim is not None:
                h = decoder.project_in_dim(h)
            if decoder.embed_positions is not None:
                T = tokens.size(1)
                h = h + plan.positions(decoder, T, tokens.device).index_select(0, rows.index % T)
            if decoder.layernorm_embedding is not None:
                h = decoder.layernorm_embedding(h)
            if h.dtype == torch.float32:
                return _packed_layers(plan, h, rows, self_pad, cross, sent, pick)
    return _features(decoder, embed_tokens(decoder, tokens), self_pad, cross, sent, select)


def _packed_layers(plan, h, rows, self_pad, cross, sent, pick):
    """The layers of :func:`packed_features` on the packed rows h (M, C) of ``rows``; ``pick`` from
    :func:`_pick` (None: every position's state, unpacked to (N, T, C))."""
    N, T, C = rows.N, rows.T, h.size(-1)
    keep = None if self_pad is None else rows.valid.view(N, 1, 1, T)
    one = bool((sent == sent[0]).all()) if sent is not None else N == 1
    if plan.layerdrop:
        torch.empty(plan.layerdrop).uniform_()  # what iterating fairseq's LayerDropModuleList draws
    last = len(plan.layers) - 1
    for i, lp in enumerate(plan.layers):
        pre = lp["pre"]
        # self-attention: q/k/v at every real position, the weighted values back to packed rows
        z = _apply_norm(lp["sa_norm"], h) if pre else h
        H = lp["heads"]
        qkv = cpu_linear.prepacked(z, *lp["qkv"])
        q, k, v = rows.unpack(qkv).view(N, T, 3, H, -1).permute(2, 0, 3, 1, 4).unbind(0)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=keep).transpose(1, 2).reshape(N * T, C)
        at = rows.index
        if i == last and pick is not None:  # from here on only the selected positions
            at, h = at.index_select(0, pick), h.index_select(0, pick)
        h = cpu_linear.prepacked_add(o.index_select(0, at), *lp["sa_out"], h)
        if not pre:
            h = _apply_norm(lp["sa_norm"], h)
        # cross-attention on the sentence's cached keys / values
        z = _apply_norm(lp["ca_norm"], h) if pre else h
        Hc = lp["cross_heads"]
        qc = cpu_linear.prepacked(z, *lp["ca_q"])
        if one:
            kc, vc, kp = cross.rows(i, None)
            s0 = 0 if sent is None else int(sent[0])
            kc, vc = kc[s0:s0 + 1], vc[s0:s0 + 1]
            kp = None if kp is None else kp[s0:s0 + 1]
            oc = F.scaled_dot_product_attention(_heads(qc.unsqueeze(0), Hc), kc, vc, attn_mask=kp)
            oc = oc.transpose(1, 2).reshape(qc.shape)
        else:
            kc, vc, kp = cross.rows(i, sent)
            full = qc.new_zeros(N * T, C).index_copy_(0, at, qc).view(N, T, C)
            oc = F.scaled_dot_product_attention(_heads(full, Hc), kc, vc, attn_mask=kp)
            oc = _merge(oc).reshape(N * T, C).index_select(0, at)
        h = cpu_linear.prepacked_add(oc, *lp["ca_out"], h)
        if not pre:
            h = _apply_norm(lp["ca_norm"], h)
        # feed-forward
        z = _apply_norm(lp["ff_norm"], h) if pre else h
        if lp["relu"]:
            a = cpu_linear.prepacked(z, *lp["fc1"], relu=True)
        else:
            a = lp["act"](cpu_linear.prepacked(z, *lp["fc1"]))
        h = cpu_linear.prepacked_add(a, *lp["fc2"], h)
        if not pre:
            h = _apply_norm(lp["ff_norm"], h)
    if plan.final_norm is not None:
        h = _apply_norm(plan.final_norm, h)
    if plan.out_proj is not None:
        h = cpu_linear.prepacked(h, *plan.out_proj)
    return h if pick is not None else rows.unpack(h)
