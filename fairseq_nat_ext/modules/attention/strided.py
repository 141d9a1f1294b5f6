"""``strided``: dilated attention, each token sees the tokens at a multiple of --attention-stride from
it, optionally plus a local window of radius --strided-window (one softmax over the union)."""

import torch
import torch.nn.functional as F

from .base import AttentionVariant
from .functional import dense_partial, local_partial, merge_partials
from .registry import register_attention


@register_attention("strided")
class StridedAttention(AttentionVariant):
    def forward(self, q, k, v, lengths):
        B, H, N, d = q.shape
        s = max(1, self.opts.attention_stride)
        r = self.opts.strided_window
        m = -(-N // s)
        L = m * s

        def by_class(t):  # (B, H, N, d) -> (B, H, s, m, d): class c holds positions c, c+s, c+2s, ...
            return F.pad(t, (0, 0, 0, L - N)).view(B, H, m, s, d).transpose(2, 3)

        pos = torch.arange(L, device=q.device).view(m, s).t()  # (s, m) position of (class, index)
        allowed = (pos.unsqueeze(0) < lengths.view(B, 1, 1)).unsqueeze(2)  # keys: (B, s, 1, m)
        if r > 0:  # keys inside the window are covered by the local part: count them once
            near = (pos.unsqueeze(2) - pos.unsqueeze(1)).abs() <= r  # (s, m, m)
            allowed = allowed & ~near.unsqueeze(0)
        out_s, lse_s = dense_partial(by_class(q), by_class(k), by_class(v), allowed.unsqueeze(1),
                                     self.dropout, self.training)
        out_s = out_s.transpose(2, 3).reshape(B, H, L, d)[:, :, :N]
        lse_s = lse_s.transpose(2, 3).reshape(B, H, L)[:, :, :N]
        parts = [(out_s, lse_s)]
        if r > 0:
            parts.append(local_partial(q, k, v, lengths, r, dropout=self.dropout, training=self.training))
        return merge_partials(parts)

    def pattern(self, lengths, n):
        i = torch.arange(n, device=lengths.device)
        diff = i[:, None] - i[None, :]
        see = diff.remainder(max(1, self.opts.attention_stride)) == 0
        if self.opts.strided_window > 0:
            see = see | (diff.abs() <= self.opts.strided_window)
        real = i[None, :] < lengths[:, None]
        return see[None] & real[:, None, :] & real[:, :, None]
