"""``sinkhorn``: Sparse Sinkhorn attention (Tay et al. 2020).

The sequence is cut into blocks of --block-size.  The sorting network psi of the paper, per head
(Linear(d, d) -> ReLU -> Linear(d, nb_max)), maps the block-pooled (summed) input of each block to its
logits over the target block positions, R (nb x nb).  In training Gumbel noise -log(-log U) is added
(the global torch RNG on the keys' device, so activation checkpointing replays the same noise);
evaluation is deterministic.  Sinkhorn normalisation of (R + noise) / --sinkhorn-temperature
(--sinkhorn-iters rounds in log space) turns it into a relaxed permutation P.  Query block i attends
to its own block and to the soft-sorted block sum_j P[i, j] K_j (values alike), one softmax over both.
Real blocks are only matched with real blocks.  A sorted key position t mixes the blocks' t-th
tokens; where some of them are padding (the last real block is partial) the padding adds zero vectors
to the mixture and the key enters with the bias log(real share of its mixture) = log(sum_j P[i, j]
real_j[t] / sum_j P[i, j]) (computed in float32 at least), so its weight shrinks with its padding share
and a key made of padding only is masked; a key of real tokens only has bias 0.  When every length is N
and N is a multiple of --block-size (no padding, no partial block) there is no bias and no mask: the
paper's softmax, run forward and backward by torch's fused kernel (flash on CPU; on CUDA whichever fused
kernel torch picks).  (Before 0.3.0 the bias was
log(sum_j P[i, j] real_j[t]), which without padding is log of P's row sum, not exactly 0 after the
final column normalisation; it kept every batch on the math path of scaled_dot_product_attention.)
Kept simplification: psi reads the sum of the head's KEYS (padding zeroed), not of the layer input X
as in the paper, since a variant sees only its heads' projections (q, k, v), not X.
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
        d, m = head_dim, self.max_blocks
        # psi, per head: Linear(d, d) -> ReLU -> Linear(d, max_blocks), nn.Linear's initialisation
        self.psi_w1 = nn.Parameter(torch.empty(num_heads, d, d))
        self.psi_b1 = nn.Parameter(torch.empty(num_heads, d))
        self.psi_w2 = nn.Parameter(torch.empty(num_heads, d, m))
        self.psi_b2 = nn.Parameter(torch.empty(num_heads, m))
        for p in (self.psi_w1, self.psi_b1, self.psi_w2, self.psi_b2):
            nn.init.uniform_(p, -d ** -0.5, d ** -0.5)

    def sort_logits(self, pooled):
        """psi of (B, H, nb, d) block sums: (B, H, nb, nb) logits, row i over the target blocks."""
        nb, dt = pooled.size(2), pooled.dtype
        hidden = F.relu(torch.matmul(pooled, self.psi_w1.to(dt)) + self.psi_b1.to(dt)[:, None, :])
        return torch.matmul(hidden, self.psi_w2[:, :, :nb].to(dt)) + self.psi_b2[:, :nb].to(dt)[:, None, :]

    def permutation(self, k, lengths, kb=None):
        """(B, H, nb, nb) relaxed permutation; real blocks map onto real blocks only.  ``kb``: the keys as
        (B, H, nb, bs, d) blocks with padding zeroed, when the caller has them.  Training adds Gumbel noise."""
        B, H, N, d = k.shape
        bs = self.opts.block_size
        nb = -(-N // bs)
        if kb is None:
            real = (torch.arange(nb * bs, device=k.device)[None, :] < lengths[:, None]).to(k.dtype)
            kb = (F.pad(k, (0, 0, 0, nb * bs - N)) * real[:, None, :, None]).view(B, H, nb, bs, d)
        logits = self.sort_logits(kb.sum(3))
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # Sinkhorn in fp32 at least
        if self.training:  # Gumbel noise -log(-log U), U in (0, 1)
            u = torch.rand(logits.shape, device=logits.device, dtype=logits.dtype).clamp_(1e-10, 1.0 - 1e-7)
            logits = logits - torch.log(-torch.log(u))
        real_block = torch.arange(nb, device=k.device)[None, :] < ((lengths + bs - 1) // bs)[:, None]  # (B, nb)
        allowed = real_block[:, :, None] == real_block[:, None, :]
        return sinkhorn(logits / self.opts.sinkhorn_temperature, allowed[:, None], self.opts.sinkhorn_iters).to(k.dtype)

    def forward(self, q, k, v, lengths):
        B, H, N, d = q.shape
        check_max_positions(N, self.opts.max_positions, "sinkhorn")
        bs = self.opts.block_size
        nb = -(-N // bs)
        L = nb * bs
        unpadded = L == N and bool((lengths == N).all())
        if unpadded:  # no padding: the blocks are views
            blocks = lambda t: t.view(B, H, nb, bs, d)  # noqa: E731
        else:
            real = (torch.arange(L, device=q.device)[None, :] < lengths[:, None]).to(q.dtype)  # (B, L)
            blocks = lambda t: (F.pad(t, (0, 0, 0, L - N)) * real[:, None, :, None]).view(B, H, nb, bs, d)  # noqa: E731
        qb, kb, vb = blocks(q), blocks(k), blocks(v)
        P = self.permutation(k, lengths, kb)  # (B, H, nb, nb)
        ks = torch.einsum("bhij,bhjtd->bhitd", P, kb)
        vs = torch.einsum("bhij,bhjtd->bhitd", P, vb)
        keys = torch.cat([kb, ks], dim=3)  # (B, H, nb, 2bs, d)
        vals = torch.cat([vb, vs], dim=3)
        bias = None  # no padding: every key is real, the paper's plain softmax (fused kernel, no mask)
        if not unpadded:
            Pf = P.to(torch.promote_types(P.dtype, torch.float32))  # the share in float32 at least
            mass = torch.einsum("bhij,bjt->bhit", Pf, real.view(B, nb, bs).to(Pf.dtype))  # real mass of a sorted key
            share = mass / Pf.sum(-1, keepdim=True).clamp_min(1e-6)  # its real share, 1 without padding
            own_ok = real.view(B, 1, nb, bs).expand(B, H, nb, bs) > 0
            sorted_ok = share > 1e-6
            allowed = with_a_key_per_row(torch.cat([own_ok, sorted_ok], dim=-1))  # (B, H, nb, 2bs)
            bias = torch.cat([torch.zeros_like(share), share.clamp_min(1e-6).log()], dim=-1)
            bias = bias.masked_fill(~allowed, float("-inf")).to(q.dtype).flatten(0, 1).unsqueeze(2)
        # one fused softmax per query block over [own block, sorted partner block]
        out = fused_attention(qb.flatten(0, 1), keys.flatten(0, 1), vals.flatten(0, 1), bias,
                              self.dropout, self.training)
        return out.reshape(B, H, L, d)[:, :, :N]
