"""``local``: truncated attention, each token sees the tokens within --attention-window of it."""

from .base import AttentionVariant
from .functional import local_partial
from .registry import register_attention


@register_attention("local")
class LocalAttention(AttentionVariant):
    def forward(self, q, k, v, lengths):
        out, _ = local_partial(q, k, v, lengths, self.opts.attention_window,
                               dropout=self.dropout, training=self.training)
        return out

    def pattern(self, lengths, n):
        """Dense (B, n, n) bool of which query sees which key (tests and pictures only)."""
        import torch

        i = torch.arange(n, device=lengths.device)
        band = (i[:, None] - i[None, :]).abs() <= self.opts.attention_window
        real = i[None, :] < lengths[:, None]
        return band[None] & real[:, None, :] & real[:, :, None]
