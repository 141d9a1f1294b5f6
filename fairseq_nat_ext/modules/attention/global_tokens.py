"""``global``: g global tokens attend to every token and every token attends to them; the other
tokens also see a local window (--attention-window).  The global tokens are the first g real
tokens of the sequence (--global-mode first) or g learned tokens that the encoder prepends
(--global-mode added; the attention is the same, the encoder adds and later removes them)."""

import torch

from . import partials
from .base import AttentionVariant
from .functional import (from_blocks, fused_attention, to_blocks, valid_keys, window_blocks, window_layout,
                         window_mask)
from .registry import register_attention


@register_attention("global")
class GlobalAttention(AttentionVariant):
    def forward(self, q, k, v, lengths):
        """Ordinary queries: blocks of w positions read their window's key blocks (without the global
        keys) plus the g global keys, one fused softmax; global queries: every real key."""
        B, H, N, d = q.shape
        g = min(self.opts.global_tokens, N)
        r = self.opts.attention_window
        w, reach = window_layout(r, N)
        real = valid_keys(lengths, N)  # (B, N)
        nb = -(-N // w)
        if partials.usable(q, self.dropout, self.training):  # window view + the global keys, merged exactly
            parts, first = [partials.Band(w, reach, r, lengths, N, q.dtype, min_key=g)], None
            if g > 0:
                parts.append(partials.Prefix(g, real[:, :g], q.dtype))
                first = partials.FirstRows(g, valid_keys(lengths, nb * w), q.dtype)
            return partials.merged_attention(q, k, v, parts, nb * w, margin=reach * w, first=first)
        glob = fused_attention(q[:, :, :g], k, v, real[:, None, None, :], self.dropout, self.training)
        mask = window_mask(lengths, N, w, r, min_key=g, reach=reach)  # (B, nb, w, span)
        pad_query = torch.arange(nb * w, device=q.device).view(1, nb, w, 1) >= lengths.view(B, 1, 1, 1)
        mask = torch.cat([mask, real[:, None, None, :g].expand(B, nb, w, g) | pad_query], -1)

        def keys(x):  # (B * nb, H, span + g, d)
            glob = x[:, :, :g].unsqueeze(1).expand(B, nb, H, g, d).reshape(B * nb, H, g, d)
            return torch.cat([window_blocks(x, w, reach), glob], 2)

        out = from_blocks(fused_attention(to_blocks(q, w), keys(k), keys(v), mask.flatten(0, 1).unsqueeze(1),
                                          self.dropout, self.training), B, N)
        return torch.cat([glob, out[:, :, g:]], dim=2)

    def pattern(self, lengths, n):
        i = torch.arange(n, device=lengths.device)
        g = self.opts.global_tokens
        see = ((i[:, None] - i[None, :]).abs() <= self.opts.attention_window) | (i[:, None] < g) | (i[None, :] < g)
        real = i[None, :] < lengths[:, None]
        return see[None] & real[:, None, :] & real[:, :, None]
