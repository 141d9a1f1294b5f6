"""``EfficientSelfAttention``: the fairseq-facing self-attention module.

It has fairseq's ``MultiheadAttention`` call signature and parameter names (q_proj, k_proj, v_proj,
out_proj), so it drops into fairseq's ``TransformerEncoderLayer``.  It

1. right-aligns the batch: fairseq left-pads sources; the real tokens of every sequence are moved to
   positions 0 .. len-1 (a stable sort on the padding mask, so any padding side works), which makes
   windows, blocks, strides and position-tied projections lie over the real tokens only;
2. projects to heads and gives each group of heads its variant (``--encoder-attention-mix``);
3. projects back and restores fairseq's layout (padding positions output zeros).
"""

import weakref
from typing import List, Optional, Tuple

import torch
import torch.nn as nn

from fairseq_nat_ext.compat import InputError

from .. import cpu_linear
from .registry import AttentionOptions, build_attention


#: attention module -> {projection names: (key, stacked weight, stacked bias, kept storages)}, inside
#: decoding scopes only
_STACKED = weakref.WeakKeyDictionary()
cpu_linear.register_clearer(_STACKED.clear)

QKV, KV = ("q_proj", "k_proj", "v_proj"), ("k_proj", "v_proj")


def stacked_qkv_weight(module, names=QKV):
    """``module``'s q_proj, k_proj and v_proj weights (and biases, or None) stacked into one (3C, C)
    weight (``names``: which projections, in that order, e.g. ``KV``: (2C, C); they must read inputs of
    one width).  Concatenated on every call (the gradient reaches the weights), except inside a caching
    decoding scope (``cpu_linear.decoding``, the generators), where it is cached per module and names
    and rebuilt when a parameter's storage, version or shape changed."""
    lins = tuple(getattr(module, name) for name in names)
    has_bias = lins[0].bias is not None

    def stack():
        return (torch.cat([lin.weight for lin in lins]),
                torch.cat([lin.bias for lin in lins]) if has_bias else None)

    if not cpu_linear.caching():
        return stack()
    params = [lin.weight for lin in lins] + [lin.bias for lin in lins if lin.bias is not None]
    key = tuple((p.data_ptr(), p._version, tuple(p.shape), p.dtype) for p in params)
    entries = _STACKED.get(module)
    if entries is None:
        entries = _STACKED[module] = {}
    hit = entries.get(names)
    if hit is None or hit[0] != key:
        hit = (key, *stack(), [p.detach() for p in params])  # the old storages stay alive with the entry
        entries[names] = hit
    return hit[1], hit[2]


def stacked_qkv(module, x: torch.Tensor) -> torch.Tensor:
    """(..., C) -> (..., 3C): ``module``'s q_proj, k_proj and v_proj (ours or fairseq's MultiheadAttention)
    as ONE product with the three weights stacked (self-attention reads one input; one (C, 3C) GEMM forward
    and backward is faster than three); at inference on CPU through :mod:`..cpu_linear`."""
    return cpu_linear.linear(x, *stacked_qkv_weight(module))


class EfficientSelfAttention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, spec: List[Tuple[str, int]], opts: AttentionOptions,
                 dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if embed_dim % num_heads:
            raise InputError(f"embed dim {embed_dim} is not divisible by {num_heads} attention heads")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.spec = list(spec)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.variants = nn.ModuleList(build_attention(name, heads, self.head_dim, opts) for name, heads in spec)
        for module in self.variants:
            module.dropout = dropout
        # fairseq's MultiheadAttention initialisation
        for lin in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(lin.weight, gain=1 / 2 ** 0.5)
        nn.init.xavier_uniform_(self.out_proj.weight)
        if bias:
            nn.init.constant_(self.out_proj.bias, 0.0)

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (B, T, 3C): :func:`stacked_qkv` of this module's projections."""
        return stacked_qkv(self, x)

    def forward(self, query, key=None, value=None, key_padding_mask: Optional[torch.Tensor] = None,
                need_weights: bool = False, attn_mask: Optional[torch.Tensor] = None, **unused):
        """query (T, B, C), key_padding_mask (B, T) True at padding -> ((T, B, C), None).

        Self-attention: ``key`` and ``value`` (fairseq passes the query again) are not used."""
        if attn_mask is not None:
            raise ValueError("EfficientSelfAttention is encoder self-attention: attn_mask is not supported")
        T, B, C = query.shape
        x = query.transpose(0, 1)  # (B, T, C)
        perm = None
        if key_padding_mask is not None and key_padding_mask.any():
            pad = key_padding_mask.bool()
            lengths = (~pad).sum(1)
            perm = torch.sort(pad.to(torch.uint8), dim=1, stable=True).indices  # real tokens first
            x = x.gather(1, perm.unsqueeze(-1).expand(B, T, C))
        else:
            lengths = torch.full((B,), T, dtype=torch.long, device=query.device)
        H, d = self.num_heads, self.head_dim
        q, k, v = self.project_qkv(x).view(B, T, 3, H, d).permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, d)
        outs, h0 = [], 0
        for module, (_, heads) in zip(self.variants, self.spec):
            outs.append(module(q[:, h0:h0 + heads], k[:, h0:h0 + heads], v[:, h0:h0 + heads], lengths))
            h0 += heads
        heads = outs[0] if len(outs) == 1 else torch.cat(outs, 1)  # one variant: often a view, no copy
        out = self.out_proj(heads.transpose(1, 2).reshape(B, T, C))
        if perm is not None:
            real = torch.arange(T, device=query.device).unsqueeze(0) < lengths.unsqueeze(1)
            out = out.masked_fill(~real.unsqueeze(-1), 0.0)
            out = torch.zeros_like(out).scatter(1, perm.unsqueeze(-1).expand(B, T, C), out)
        return out.transpose(0, 1), None
