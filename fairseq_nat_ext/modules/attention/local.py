"""``local``: truncated attention, each token sees the tokens within --attention-window of it."""

from .base import AttentionVariant
from . import partials
from .functional import from_blocks, fused_attention, to_blocks, window_blocks, window_layout, window_mask
from .registry import register_attention


@register_attention("local")
class LocalAttention(AttentionVariant):
    def forward(self, q, k, v, lengths):
        """Blocks of w positions; query block b reads key blocks b - reach .. b + reach through the
        fused kernel: O(N * (w + 2 radius)) time, O(N * d) memory, never N x N."""
        B, H, N, d = q.shape
        r = self.opts.attention_window
        w, reach = window_layout(r, N)
        if partials.usable(q, self.dropout, self.training):  # keys read through an overlapping view, no copies
            band = partials.Band(w, reach, r, lengths, N, q.dtype)
            return partials.merged_attention(q, k, v, [band], -(-N // w) * w, margin=reach * w)
        allowed = window_mask(lengths, N, w, r, reach=reach).flatten(0, 1).unsqueeze(1)  # (B * nb, 1, w, span)
        out = fused_attention(to_blocks(q, w), window_blocks(k, w, reach), window_blocks(v, w, reach), allowed,
                              self.dropout, self.training)
        return from_blocks(out, B, N)

    def pattern(self, lengths, n):
        """Dense (B, n, n) bool of which query sees which key (tests and pictures only)."""
        import torch

        i = torch.arange(n, device=lengths.device)
        band = (i[:, None] - i[None, :]).abs() <= self.opts.attention_window
        real = i[None, :] < lengths[:, None]
        return band[None] & real[:, None, :] & real[:, :, None]
