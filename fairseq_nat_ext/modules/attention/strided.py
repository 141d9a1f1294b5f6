"""``strided``: the strided pattern of the Sparse Transformer (Child et al. 2019), bidirectional.

Each token sees the tokens at a multiple of the stride l from it (``(i - j) mod l == 0``) and the
tokens within a local band of radius --strided-window, one softmax over the union (the paper's
"merged" head, which attends to both of its factorised patterns).  The paper takes l about sqrt(N):
by default (--attention-stride 0, --strided-window -1) l = ceil(sqrt(--max-positions)) and the band's
radius is l, so a query reads about N / l + 2 l keys, O(N sqrt(N)) time and memory.  l is set by
--max-positions, not by the batch's length, so a sequence's pattern never depends on the padding of its
batch.  The paper's pattern is causal (the previous l tokens and every l-th earlier one); an encoder
sees both sides, so both are mirrored here."""

import math

import torch
import torch.nn.functional as F

from .base import AttentionVariant
from .functional import dense_partial, local_partial, merge_partials
from .registry import register_attention


def strided_layout(opts):
    """(stride l, band radius r) of ``opts``: l = --attention-stride or ceil(sqrt(--max-positions)),
    r = --strided-window, or l when it is -1."""
    s = opts.attention_stride if opts.attention_stride > 0 else math.ceil(math.sqrt(opts.max_positions))
    r = s if opts.strided_window < 0 else opts.strided_window
    return max(1, s), r


@register_attention("strided")
class StridedAttention(AttentionVariant):
    def forward(self, q, k, v, lengths):
        """Keys at a multiple of l: positions of one residue class mod l form a sequence of N / l tokens,
        and each class is one dense attention (l classes of N / l: N^2 / l scores); the band is blocked
        (O(N r)); the two parts are disjoint (band keys are left out of the strided part) and merged
        exactly by their log-sum-exp."""
        B, H, N, d = q.shape
        s, r = strided_layout(self.opts)
        m = -(-N // s)
        L = m * s

        def by_class(t):  # (B, H, N, d) -> (B, H, s, m, d): class c holds positions c, c+s, c+2s, ...
            return F.pad(t, (0, 0, 0, L - N)).view(B, H, m, s, d).transpose(2, 3)

        pos = torch.arange(L, device=q.device).view(m, s).t()  # (s, m) position of (class, index)
        allowed = (pos.unsqueeze(0) < lengths.view(B, 1, 1)).unsqueeze(2)  # keys: (B, s, 1, m)
        if r > 0:  # keys inside the band are covered by the local part: count them once
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
        s, r = strided_layout(self.opts)
        i = torch.arange(n, device=lengths.device)
        diff = i[:, None] - i[None, :]
        see = diff.remainder(s) == 0
        if r > 0:
            see = see | (diff.abs() <= r)
        real = i[None, :] < lengths[:, None]
        return see[None] & real[:, None, :] & real[:, :, None]
