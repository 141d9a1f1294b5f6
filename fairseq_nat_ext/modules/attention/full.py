"""Exact softmax attention: ``full`` (torch's scaled_dot_product_attention) and ``full_explicit``."""

import math

import torch
import torch.nn.functional as F

from .base import AttentionVariant
from .functional import masked_softmax, valid_keys
from .registry import register_attention


@register_attention("full")
class FullAttention(AttentionVariant):
    """softmax(q k^T / sqrt(d)) v over the real keys, by torch's fused kernel (the baseline)."""

    def forward(self, q, k, v, lengths):
        allowed = valid_keys(lengths, k.size(2))[:, None, None, :]
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, dropout_p=self.dropout if self.training else 0.0)


@register_attention("full_explicit")
class ExplicitFullAttention(AttentionVariant):
    """The same maths with an explicit N x N score matrix (reference; memory O(N^2))."""

    def forward(self, q, k, v, lengths):
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
        probs, _ = masked_softmax(scores, valid_keys(lengths, k.size(2))[:, None, None, :],
                                  self.dropout, self.training)
        return torch.matmul(probs, v)
