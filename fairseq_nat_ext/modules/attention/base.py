"""Common constructor of the attention variants (see registry.py for the forward contract)."""

import torch
import torch.nn as nn

from .registry import AttentionOptions


class AttentionVariant(nn.Module):
    """forward(q, k, v, lengths) -> (B, H, N, d) on a right-aligned batch."""

    variant_name = "?"
    #: buffers that keep float32 / float64 under ``.half()`` / ``.to(bfloat16)`` (they follow the module's
    #: device only): tables and running averages that half precision would round
    full_precision_buffers = ()

    def _apply(self, fn, *args, **kwargs):
        kept = {name: self._buffers[name] for name in self.full_precision_buffers
                if self._buffers.get(name) is not None}
        super()._apply(fn, *args, **kwargs)
        for name, old in kept.items():
            if self._buffers[name].dtype not in (torch.float32, torch.float64):
                self._buffers[name] = old.to(self._buffers[name].device)
        return self

    def __init__(self, num_heads: int, head_dim: int, opts: AttentionOptions, dropout: float = 0.0):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.opts = opts
        self.dropout = dropout

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, head_dim={self.head_dim}"
