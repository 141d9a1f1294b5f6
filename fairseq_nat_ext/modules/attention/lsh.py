"""``lsh``: Reformer attention (Kitaev et al. 2020): shared query-key, angular LSH, sorted chunks.

Keys are the unit-normalised queries (shared QK; the layer's key projection is not used by these
heads).  Each of --lsh-rounds rounds hashes every token by a random rotation
(bucket = argmax [xR, -xR]); tokens are sorted by (bucket, position) and cut into chunks of
--lsh-bucket-size; each chunk attends to itself and the chunk before it.  A token attends to itself
only when nothing else is visible (its score gets -1e5, as in the paper).  Rounds are combined by
their log-sum-exp (a key found in several rounds counts once per round, as in the paper).

Padding: a sequence of length n uses n_buckets = 2 * ceil(n / (2 * bucket_size)) buckets (its own
length, not the batch's) and padding tokens sort after every real token, so the chunks of real tokens
do not depend on padding.  Rotations are fixed per layer (seeded), sized by --max-positions."""

import torch
import torch.nn.functional as F

from .base import AttentionVariant
from .functional import check_max_positions, masked_softmax, merge_partials
from .registry import register_attention

SELF_PENALTY = 1e5


def n_buckets_for(lengths: torch.Tensor, bucket_size: int) -> torch.Tensor:
    """Even number of buckets per sequence, about length / bucket_size (at least 2)."""
    return 2 * ((lengths + 2 * bucket_size - 1) // (2 * bucket_size)).clamp_min(1)


def lsh_buckets(x: torch.Tensor, rotations: torch.Tensor, n_buckets: torch.Tensor) -> torch.Tensor:
    """x (B, H, N, d), rotations (H, d, R/2), n_buckets (B,) -> (B, H, N) bucket ids.

    Sequence b uses the first n_buckets[b] / 2 rotation columns: argmax over [xR, -xR]."""
    rot = torch.einsum("bhnd,hdr->bhnr", x, rotations.to(x.dtype))  # (B, H, N, R/2)
    half = rot.size(-1)
    use = torch.arange(half, device=x.device)[None, :] < (n_buckets // 2)[:, None]  # (B, R/2)
    use = use[:, None, None, :]
    both = torch.cat([rot.masked_fill(~use, float("-inf")), (-rot).masked_fill(~use, float("-inf"))], -1)
    arg = both.argmax(-1)  # in [0, R): first half "+", second half "-"
    plus = arg < half
    return torch.where(plus, arg, arg - half + (n_buckets // 2).view(-1, 1, 1))


@register_attention("lsh")
class LSHAttention(AttentionVariant):
    def __init__(self, num_heads, head_dim, opts, dropout=0.0):
        super().__init__(num_heads, head_dim, opts, dropout)
        max_buckets = int(n_buckets_for(torch.tensor([opts.max_positions]), opts.lsh_bucket_size))
        gen = torch.Generator().manual_seed(opts.attention_seed)
        self.register_buffer(
            "rotations",
            torch.randn(opts.lsh_rounds, num_heads, head_dim, max_buckets // 2, generator=gen), persistent=False)

    def sorted_order(self, q, lengths, rnd):
        """(B, H, N) positions sorted by (bucket, position) for round ``rnd``; padding last."""
        B, H, N, _ = q.shape
        buckets = lsh_buckets(q, self.rotations[rnd], n_buckets_for(lengths, self.opts.lsh_bucket_size))
        pos = torch.arange(N, device=q.device)
        key = buckets * N + pos
        key = key.masked_fill(pos[None, None, :] >= lengths.view(B, 1, 1), torch.iinfo(torch.long).max)
        return key.argsort(dim=-1)

    def forward(self, q, k, v, lengths):
        B, H, N, d = q.shape
        check_max_positions(N, self.opts.max_positions, "lsh")
        c = self.opts.lsh_bucket_size
        nc = -(-N // c)
        L = nc * c
        keys = F.normalize(q, dim=-1)
        parts = []
        for rnd in range(self.opts.lsh_rounds):
            order = self.sorted_order(q, lengths, rnd)  # (B, H, N)
            order = F.pad(order, (0, L - N), value=N)  # extra slots point at a dummy position N
            pos = order.view(B, H, nc, c)

            def chunked(t):  # (B, H, N, d) -> (B, H, nc, c, d) in sorted order (dummy row = 0)
                t = F.pad(t, (0, 0, 0, 1))
                return t.gather(2, order.unsqueeze(-1).expand(B, H, L, d)).view(B, H, nc, c, d)

            qs, ks, vs = chunked(q), chunked(keys), chunked(v)
            look = lambda t: torch.cat([F.pad(t, (0, 0, 0, 0, 1, 0))[:, :, :-1], t], dim=3)  # noqa: E731
            kk, vv = look(ks), look(vs)  # (B, H, nc, 2c, d): previous chunk, own chunk
            kpos = torch.cat([F.pad(pos, (0, 0, 1, 0), value=N)[:, :, :-1], pos], dim=3)  # (B, H, nc, 2c)
            scores = torch.matmul(qs, kk.transpose(-1, -2)) / d ** 0.5  # (B, H, nc, c, 2c)
            scores = scores - SELF_PENALTY * (pos.unsqueeze(-1) == kpos.unsqueeze(-2)).to(scores.dtype)
            allowed = (kpos < lengths.view(B, 1, 1, 1)).unsqueeze(-2)
            probs, lse = masked_softmax(scores, allowed, self.dropout, self.training)
            out = torch.matmul(probs, vv).reshape(B, H, L, d)
            lse = lse.reshape(B, H, L)
            # un-sort: slot i holds position order[i]; the dummy position N is dropped
            back = torch.zeros(B, H, N + 1, d, dtype=out.dtype, device=out.device)
            back = back.scatter(2, order.unsqueeze(-1).expand(B, H, L, d), out)[:, :, :N]
            lse_back = torch.full((B, H, N + 1), float("-inf"), dtype=lse.dtype, device=lse.device)
            lse_back = lse_back.scatter(2, order, lse)[:, :, :N]
            parts.append((back, lse_back))
        return merge_partials(parts)
