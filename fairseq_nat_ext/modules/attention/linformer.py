"""``linformer``: keys and values projected from N to k positions by learned N -> k matrices
(Wang et al. 2020), shared by the heads of the layer.  Padding keys/values are zeroed BEFORE the
projection and only the first N columns are used, so shorter inputs and any padding work."""

import math

import torch
import torch.nn as nn

from .base import AttentionVariant
from .functional import check_max_positions, fused_attention, valid_keys
from .registry import register_attention


@register_attention("linformer")
class LinformerAttention(AttentionVariant):
    def __init__(self, num_heads, head_dim, opts, dropout=0.0):
        super().__init__(num_heads, head_dim, opts, dropout)
        shape = (opts.linformer_k, opts.max_positions)
        self.proj_k = nn.Parameter(torch.empty(shape))
        self.proj_v = nn.Parameter(torch.empty(shape))
        for p in (self.proj_k, self.proj_v):
            nn.init.normal_(p, std=1.0 / math.sqrt(opts.linformer_k))

    def forward(self, q, k, v, lengths):
        N = k.size(2)
        check_max_positions(N, self.opts.max_positions, "linformer")
        real = valid_keys(lengths, N)[:, None, :, None].to(k.dtype)  # (B, 1, N, 1)
        k_low = torch.einsum("kn,bhnd->bhkd", self.proj_k[:, :N].to(k.dtype), k * real)
        v_low = torch.einsum("kn,bhnd->bhkd", self.proj_v[:, :N].to(v.dtype), v * real)
        # every query sees all k projected keys: one fused softmax, no (B, H, N, k) tensor kept
        return fused_attention(q, k_low, v_low, None, self.dropout, self.training)
