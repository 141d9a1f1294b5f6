"""Synthesizer attention (Tay et al. 2021): weights without query-key dot products.

``synthesizer_dense``: each token's own head projection goes through a 2-layer MLP that outputs one
logit per key position (up to --max-positions); ``synthesizer_random``: a learned
max_positions x max_positions logit matrix per head, the same for every input.  Both are softmaxed
over the real keys and applied to the values (these two, like ``full``, are O(N^2) by design)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import AttentionVariant
from .functional import check_max_positions, masked_softmax, valid_keys
from .registry import register_attention


@register_attention("synthesizer_dense")
class DenseSynthesizerAttention(AttentionVariant):
    def __init__(self, num_heads, head_dim, opts, dropout=0.0):
        super().__init__(num_heads, head_dim, opts, dropout)
        self.w1 = nn.Parameter(torch.empty(num_heads, head_dim, head_dim))
        self.b1 = nn.Parameter(torch.zeros(num_heads, 1, head_dim))
        self.w2 = nn.Parameter(torch.empty(num_heads, head_dim, opts.max_positions))
        self.b2 = nn.Parameter(torch.zeros(num_heads, 1, opts.max_positions))
        nn.init.normal_(self.w1, std=1.0 / math.sqrt(head_dim))
        nn.init.normal_(self.w2, std=1.0 / math.sqrt(head_dim))

    def forward(self, q, k, v, lengths):
        N = k.size(2)
        check_max_positions(N, self.opts.max_positions, "synthesizer_dense")
        hidden = F.relu(torch.matmul(q, self.w1) + self.b1)  # (B, H, N, d)
        logits = torch.matmul(hidden, self.w2[:, :, :N]) + self.b2[:, :, :N]  # (B, H, N, N)
        probs, _ = masked_softmax(logits, valid_keys(lengths, N)[:, None, None, :], self.dropout, self.training)
        return torch.matmul(probs, v)


@register_attention("synthesizer_random")
class RandomSynthesizerAttention(AttentionVariant):
    def __init__(self, num_heads, head_dim, opts, dropout=0.0):
        super().__init__(num_heads, head_dim, opts, dropout)
        self.logits = nn.Parameter(torch.randn(num_heads, opts.max_positions, opts.max_positions) * 0.02)

    def forward(self, q, k, v, lengths):
        N = k.size(2)
        check_max_positions(N, self.opts.max_positions, "synthesizer_random")
        logits = self.logits[:, :N, :N].unsqueeze(0).to(v.dtype)
        probs, _ = masked_softmax(logits, valid_keys(lengths, N)[:, None, None, :], self.dropout, self.training)
        return torch.matmul(probs, v)
