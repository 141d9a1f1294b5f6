"""``sinkhorn``: Sparse Sinkhorn attention (Tay et al. 2020).

The sequence is cut into blocks of --block-size.  A sorting network (per head, linear on the sum of a
block's keys, one logit per target block position) gives an nb x nb logit matrix that Sinkhorn
normalisation (--sinkhorn-iters rounds in log space, --sinkhorn-temperature) turns into a relaxed
permutation P.  Query block i attends to its own block and to the soft-sorted block sum_j P[i, j] K_j
(values alike), one softmax over both.  Real blocks are only matched with real blocks, and the
padding share of a sorted key enters as log(mass of real tokens), so padding never counts.
Memory: O(N * 2 * block + (N / block)^2)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import AttentionVariant
from .functional import check_max_positions, fused_attention, with_a_key_per_row
from .registry import register_attention


def sinkhorn(logits: torch.Tensor, allowed: torch.Tensor, iters: int) -> torch.Tensor:
    """Log-space Sinkhorn normalisation of (..., n, n) logits restricted to ``allowed``."""
    z = logits.masked_fill(~allowed, float("-inf"))
    for _ in range(iters):
        z = z - torch.logsumexp(z, dim=-1, keepdim=True)
        z = z - torch.logsumexp(z, dim=-2, keepdim=True)
    return torch.exp(z)


@register_attention("sinkhorn")
class SinkhornAttention(AttentionVariant):
    def __init__(self, num_heads, head_dim, opts, dropout=0.0):
        super().__init__(num_heads, head_dim, opts, dropout)
        self.max_blocks = -(-opts.max_positions // opts.block_size)
        self.sort_net = nn.Parameter(torch.empty(num_heads, head_dim, self.max_blocks))
        nn.init.normal_(self.sort_net, std=head_dim ** -0.5)

    def permutation(self, k, lengths, kb=None):
        """(B, H, nb, nb) relaxed permutation; real blocks map onto real blocks only.  ``kb``: the keys as
        (B, H, nb, bs, d) blocks with padding zeroed, when the caller has them."""
        B, H, N, d = k.shape
        bs = self.opts.block_size
        nb = -(-N // bs)
        if kb is None:
            real = (torch.arange(nb * bs, device=k.device)[None, :] < lengths[:, None]).to(k.dtype)
            kb = (F.pad(k, (0, 0, 0, nb * bs - N)) * real[:, None, :, None]).view(B, H, nb, bs, d)
        logits = torch.matmul(kb.sum(3), self.sort_net[:, :, :nb].to(k.dtype)) / self.opts.sinkhorn_temperature
        real_block = torch.arange(nb, device=k.device)[None, :] < ((lengths + bs - 1) // bs)[:, None]  # (B, nb)
        allowed = real_block[:, :, None] == real_block[:, None, :]
        return sinkhorn(logits.float(), allowed[:, None], self.opts.sinkhorn_iters).to(k.dtype)

    def forward(self, q, k, v, lengths):
        B, H, N, d = q.shape
        check_max_positions(N, self.opts.max_positions, "sinkhorn")
        bs = self.opts.block_size
        nb = -(-N // bs)
        L = nb * bs
        real = (torch.arange(L, device=q.device)[None, :] < lengths[:, None]).to(q.dtype)  # (B, L)
        if L == N and bool((lengths == N).all()):  # no padding: the blocks are views
            blocks = lambda t: t.view(B, H, nb, bs, d)  # noqa: E731
        else:
            blocks = lambda t: (F.pad(t, (0, 0, 0, L - N)) * real[:, None, :, None]).view(B, H, nb, bs, d)  # noqa: E731
        qb, kb, vb = blocks(q), blocks(k), blocks(v)
        P = self.permutation(k, lengths, kb)  # (B, H, nb, nb)
        ks = torch.einsum("bhij,bhjtd->bhitd", P, kb)
        vs = torch.einsum("bhij,bhjtd->bhitd", P, vb)
        mass = torch.einsum("bhij,bjt->bhit", P, real.view(B, nb, bs))  # real share of each sorted key
        keys = torch.cat([kb, ks], dim=3)  # (B, H, nb, 2bs, d)
        vals = torch.cat([vb, vs], dim=3)
        own_ok = real.view(B, 1, nb, bs).expand(B, H, nb, bs) > 0
        sorted_ok = mass > 1e-6
        allowed = with_a_key_per_row(torch.cat([own_ok, sorted_ok], dim=-1))  # (B, H, nb, 2bs)
        bias = torch.cat([torch.zeros_like(mass), mass.clamp_min(1e-6).log()], dim=-1)
        bias = bias.masked_fill(~allowed, float("-inf")).to(q.dtype)
        # one fused softmax per query block over [own block, sorted partner block], with log-mass bias
        out = fused_attention(qb.flatten(0, 1), keys.flatten(0, 1), vals.flatten(0, 1),
                              bias.flatten(0, 1).unsqueeze(2), self.dropout, self.training)
        return out.reshape(B, H, L, d)[:, :, :N]
