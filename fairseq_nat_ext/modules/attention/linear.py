"""``linear``: kernelised attention phi(Q) (phi(K)^T V) / (phi(Q) sum_j phi(K_j)) in O(N).

--feature-map elu (elu(x) + 1, Katharopoulos et al. 2020), relu, or performer (FAVOR+: positive
orthogonal random features approximating the softmax kernel, Choromanski et al. 2021, redrawn
every --performer-redraw training forwards)."""

import math

import torch
import torch.nn.functional as F

from fairseq_nat_ext.compat import InputError

from .base import AttentionVariant
from .functional import valid_keys
from .registry import register_attention

FEATURE_MAPS = ("elu", "relu", "performer")


def orthogonal_gaussian(m: int, d: int, generator: torch.Generator) -> torch.Tensor:
    """(m, d) random features: blocks of orthogonal rows, each row rescaled to a chi(d) norm."""
    blocks = []
    for _ in range(-(-m // d)):
        g = torch.randn(d, d, generator=generator)
        q, _ = torch.linalg.qr(g)
        blocks.append(q.t())
    w = torch.cat(blocks)[:m]
    norms = torch.randn(m, d, generator=generator).norm(dim=1, keepdim=True)
    return w * norms


@register_attention("linear")
class LinearAttention(AttentionVariant):
    def __init__(self, num_heads, head_dim, opts, dropout=0.0):
        super().__init__(num_heads, head_dim, opts, dropout)
        if opts.feature_map not in FEATURE_MAPS:
            raise InputError(f"--feature-map {opts.feature_map!r} is unknown (known: {', '.join(FEATURE_MAPS)})")
        self.feature_map = opts.feature_map
        self.redraws = 0
        self.forwards = 0
        if self.feature_map == "performer":
            self.register_buffer("features", self._draw(), persistent=True)

    def _draw(self):
        gen = torch.Generator().manual_seed(self.opts.attention_seed * 1000003 + self.redraws)
        return orthogonal_gaussian(self.opts.performer_features, self.head_dim, gen)

    def phi(self, x, is_query, real=None):
        """Feature map; ``real`` (B, 1, N, 1) marks real keys (for the performer stabiliser).

        Performer: exp(w . x / d^(1/4) - |x|^2 / (2 sqrt(d)) - c) / sqrt(m) with one (N, m) product
        and one (N, m) result: the scale is folded into the features, the stabiliser c (per query row;
        per (batch, head) over REAL keys) and the 1 / sqrt(m) into one subtraction, exp in place."""
        if self.feature_map == "elu":
            return F.elu(x) + 1
        if self.feature_map == "relu":
            return F.relu(x)
        d = self.head_dim
        m = self.features.size(0)
        logits = torch.matmul(x, (self.features.to(x.dtype) / d ** 0.25).t())  # (B, H, N, m)
        half_norm = (x * x).sum(-1, keepdim=True) / (2 * d ** 0.5)  # (B, H, N, 1)
        if is_query:  # any per-row constant cancels between numerator and denominator
            stab = logits.amax(dim=-1, keepdim=True) - half_norm
        else:  # one constant per (batch, head), taken over REAL keys only
            row_max = (logits.amax(dim=-1, keepdim=True) - half_norm).masked_fill(real == 0, float("-inf"))
            stab = row_max.amax(dim=-2, keepdim=True)
        return (logits - (half_norm + stab.detach() + 0.5 * math.log(m))).exp_()

    def forward(self, q, k, v, lengths):
        if self.feature_map == "performer" and self.training:
            self.forwards += 1
            if self.opts.performer_redraw and self.forwards % self.opts.performer_redraw == 0:
                self.redraws += 1
                self.features.copy_(self._draw())
        real = valid_keys(lengths, k.size(2))[:, None, :, None].to(q.dtype)  # (B, 1, N, 1)
        qf = self.phi(q, True)
        kf = self.phi(k * real, False, real)  # padding keys: zero input (finite features), left out below
        kv = torch.matmul(kf.transpose(-1, -2), v * real)  # (B, H, m, d)
        k_sum = torch.matmul(real.transpose(-1, -2), kf)  # (B, H, 1, m): sum over real keys
        denom = torch.matmul(qf, k_sum.transpose(-1, -2)).clamp_min(1e-6)  # (B, H, N, 1)
        return torch.matmul(qf, kv) / denom
