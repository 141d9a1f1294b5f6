"""``routing``: Routing Transformer attention (Roy et al. 2021): online k-means over queries and keys.

Queries and keys are unit-normalised and assigned to their nearest of k centroids
(--routing-clusters, default sqrt(--max-positions)).  For balanced, batched work the queries are
sorted by (cluster, position) and cut into chunks of w = ceil(max_positions / k) tokens, the keys
likewise; query chunk i attends to key chunk i, so each query sees the keys of its own and adjacent
clusters in a w-sized window of the cluster order: O(N * w).  Padding sorts after the real tokens
(a sequence of n tokens has n real queries and n real keys, so real chunks pair with real chunks).
Centroids are buffers updated in training by an exponential moving average (--routing-decay) of the
vectors assigned to them (no gradient), as in the paper."""

import math

import torch
import torch.nn.functional as F

from .base import AttentionVariant
from .functional import check_max_positions, fused_attention, with_a_key_per_row
from .registry import register_attention


@register_attention("routing")
class RoutingAttention(AttentionVariant):
    def __init__(self, num_heads, head_dim, opts, dropout=0.0):
        super().__init__(num_heads, head_dim, opts, dropout)
        self.n_clusters = opts.routing_clusters or math.ceil(math.sqrt(opts.max_positions))
        self.window = math.ceil(opts.max_positions / self.n_clusters)
        gen = torch.Generator().manual_seed(opts.attention_seed)
        self.register_buffer("centroids", F.normalize(torch.randn(num_heads, self.n_clusters, head_dim, generator=gen), dim=-1))

    def assign(self, x):
        """x (B, H, N, d) unit vectors -> nearest centroid (B, H, N)."""
        return torch.einsum("bhnd,hcd->bhnc", x, self.centroids.to(x.dtype)).argmax(-1)

    def order(self, clusters, lengths):
        B, H, N = clusters.shape
        pos = torch.arange(N, device=clusters.device)
        key = (clusters * N + pos).masked_fill(pos[None, None, :] >= lengths.view(B, 1, 1), torch.iinfo(torch.long).max)
        return key.argsort(-1)

    @torch.no_grad()
    def update_centroids(self, xs, clusters, lengths):
        """EMA of the mean unit vector assigned to each centroid, over real tokens of q and k: sums by index_add
        over (head, cluster) rows of the vectors as they lie (B, H, N, d), padding sent to one extra row that is
        dropped (no (B, H, N, C) one-hot, no copy of the vectors)."""
        H, C, d = self.centroids.shape
        dev = self.centroids.device
        sums = torch.zeros(H * C + 1, d, dtype=torch.float32, device=dev)
        counts = torch.zeros(H * C + 1, dtype=torch.float32, device=dev)
        head = (torch.arange(H, device=dev) * C).view(1, H, 1)
        for x, c in zip(xs, clusters):
            pad = torch.arange(x.size(2), device=x.device)[None, None, :] >= lengths.view(-1, 1, 1)  # (B, 1, N)
            rows = (c + head).masked_fill(pad, H * C).flatten()
            sums.index_add_(0, rows, x.reshape(-1, d).float())
            counts.index_add_(0, rows, torch.ones(rows.numel(), device=dev))
        sums, counts = sums[:-1].view(H, C, d), counts[:-1].view(H, C)
        seen = counts > 0
        mean = sums / counts.clamp_min(1).unsqueeze(-1)
        decay = self.opts.routing_decay
        new = F.normalize(decay * self.centroids.float() + (1 - decay) * mean, dim=-1)
        self.centroids.copy_(torch.where(seen.unsqueeze(-1), new, self.centroids.float()).to(self.centroids.dtype))

    def orders(self, q, k, lengths):
        qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        cq, ck = self.assign(qn), self.assign(kn)
        return self.order(cq, lengths), self.order(ck, lengths), (qn, kn, cq, ck)

    def forward(self, q, k, v, lengths):
        B, H, N, d = q.shape
        check_max_positions(N, self.opts.max_positions, "routing")
        w = min(self.window, N)
        nc = -(-N // w)
        L = nc * w
        order_q, order_k, (qn, kn, cq, ck) = self.orders(q, k, lengths)
        if self.training:
            self.update_centroids([qn.detach(), kn.detach()], [cq, ck], lengths)
        # gathers read the unpadded tensors (the chunks' padding slots read position N - 1 and are masked
        # as keys; as queries their output goes to a dump row); without padding slots (L == N) the order
        # is a permutation and the output is scattered straight back
        oq, ok = F.pad(order_q, (0, L - N), value=N), F.pad(order_k, (0, L - N), value=N)
        gq, gk = oq.clamp(max=N - 1), ok.clamp(max=N - 1)

        def chunked(t, o):
            return t.gather(2, o.unsqueeze(-1).expand(B, H, L, d)).view(B, H, nc, w, d)

        qs, ks, vs = chunked(q, gq), chunked(k, gk), chunked(v, gk)
        # chunk c holds real queries exactly when it holds real keys (both sorted real-first), so only
        # chunks of padding allow no key
        allowed = with_a_key_per_row(ok.view(B, H, nc, 1, w) < lengths.view(B, 1, 1, 1, 1))
        out = fused_attention(qs.flatten(0, 1), ks.flatten(0, 1), vs.flatten(0, 1), allowed.flatten(0, 1),
                              self.dropout, self.training).reshape(B, H, L, d)
        if L == N:
            return out.new_empty(B, H, N, d).scatter_(2, oq.unsqueeze(-1).expand(B, H, N, d), out)
        return out.new_zeros(B, H, N + 1, d).scatter_(2, oq.unsqueeze(-1).expand(B, H, L, d), out)[:, :, :N]
