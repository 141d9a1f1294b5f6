"""Common constructor of the attention variants (see registry.py for the forward contract)."""

import torch.nn as nn

from .registry import AttentionOptions


class AttentionVariant(nn.Module):
    """forward(q, k, v, lengths) -> (B, H, N, d) on a right-aligned batch."""

    variant_name = "?"

    def __init__(self, num_heads: int, head_dim: int, opts: AttentionOptions, dropout: float = 0.0):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.opts = opts
        self.dropout = dropout

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, head_dim={self.head_dim}"
