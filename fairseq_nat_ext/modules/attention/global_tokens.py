"""``global``: g global tokens attend to every token and every token attends to them; the other
tokens also see a local window (--attention-window).  The global tokens are the first g real
tokens of the sequence (--global-mode first) or g learned tokens that the encoder prepends
(--global-mode added; the attention is the same, the encoder adds and later removes them)."""

import torch

from .base import AttentionVariant
from .functional import dense_partial, local_partial, merge_partials, valid_keys
from .registry import register_attention


@register_attention("global")
class GlobalAttention(AttentionVariant):
    def forward(self, q, k, v, lengths):
        B, H, N, d = q.shape
        g = min(self.opts.global_tokens, N)
        real = valid_keys(lengths, N)  # (B, N)
        # ordinary queries: window (without the global keys) + the global keys
        window = local_partial(q, k, v, lengths, self.opts.attention_window, min_key=g,
                               dropout=self.dropout, training=self.training)
        to_global = dense_partial(q, k[:, :, :g], v[:, :, :g], real[:, None, None, :g],
                                  self.dropout, self.training)
        out = merge_partials([window, to_global])
        # global queries: every real key
        glob, _ = dense_partial(q[:, :, :g], k, v, real[:, None, None, :], self.dropout, self.training)
        return torch.cat([glob, out[:, :, g:]], dim=2)

    def pattern(self, lengths, n):
        i = torch.arange(n, device=lengths.device)
        g = self.opts.global_tokens
        see = ((i[:, None] - i[None, :]).abs() <= self.opts.attention_window) | (i[:, None] < g) | (i[None, :] < g)
        real = i[None, :] < lengths[:, None]
        return see[None] & real[:, None, :] & real[:, :, None]
