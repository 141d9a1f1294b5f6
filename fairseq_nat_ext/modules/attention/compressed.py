"""``compressed``: memory-compressed attention (Liu et al. 2018): keys and values pass through a
strided 1-D convolution (kernel = stride = --compress-kernel), so N queries attend over N/c keys."""


import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import AttentionVariant
from .functional import fused_attention, valid_keys
from .registry import register_attention


@register_attention("compressed")
class CompressedAttention(AttentionVariant):
    def __init__(self, num_heads, head_dim, opts, dropout=0.0):
        super().__init__(num_heads, head_dim, opts, dropout)
        c = max(1, opts.compress_kernel)
        self.conv_k = nn.Conv1d(head_dim, head_dim, c, stride=c)
        self.conv_v = nn.Conv1d(head_dim, head_dim, c, stride=c)

    def _compress(self, conv, t, real):
        B, H, N, d = t.shape
        c = conv.stride[0]
        L = -(-N // c) * c
        t = F.pad(t * real, (0, 0, 0, L - N))  # padding zeroed, length a multiple of c
        out = conv(t.reshape(B * H, L, d).transpose(1, 2))  # (B*H, d, L/c)
        # contiguous: the fused kernel needs unit stride on the last dim (else torch falls back to the
        # N x N/c math path)
        return out.transpose(1, 2).reshape(B, H, L // c, d).contiguous()

    def forward(self, q, k, v, lengths):
        N = k.size(2)
        c = self.conv_k.stride[0]
        real = valid_keys(lengths, N)[:, None, :, None].to(k.dtype)
        k_c = self._compress(self.conv_k, k, real)
        v_c = self._compress(self.conv_v, v, real)
        # a compressed key is real when its window holds at least one real token
        allowed = (torch.arange(k_c.size(2), device=q.device) * c).unsqueeze(0) < lengths.unsqueeze(1)
        return fused_attention(q, k_c, v_c, allowed[:, None, None, :], self.dropout, self.training)
