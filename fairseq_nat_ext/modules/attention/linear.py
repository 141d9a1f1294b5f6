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
        """Feature map; ``real`` (B, 1, N, 1) marks real keys (for the performer stabiliser)."""
        if self.feature_map == "elu":
            return F.elu(x) + 1
        if self.feature_map == "relu":
            return F.relu(x)
        x = x / self.head_dim ** 0.25
        proj = torch.matmul(x, self.features.to(x.dtype).t())  # (B, H, N, m)
        logits = proj - 0.5 * (x * x).sum(-1, keepdim=True)
        if is_query:  # any per-row constant cancels between numerator and denominator
            stab = logits.amax(dim=-1, keepdim=True)
        else:  # one constant per (batch, head), taken over REAL keys only
            stab = logits.masked_fill(real == 0, float("-inf")).amax(dim=(-1, -2), keepdim=True)
        return torch.exp(logits - stab.detach()) / math.sqrt(self.features.size(0))

    def forward(self, q, k, v, lengths):
        if self.feature_map == "performer" and self.training:
            self.forwards += 1
            if self.opts.performer_redraw and self.forwards % self.opts.performer_redraw == 0:
                self.redraws += 1
                self.features.copy_(self._draw())
        real = valid_keys(lengths, k.size(2))[:, None, :, None].to(q.dtype)  # (B, 1, N, 1)
        qf = self.phi(q, True)
        kf = self.phi(k, False, real) * real
        kv = torch.matmul(kf.transpose(-1, -2), v)  # (B, H, m, d)
        denom = torch.matmul(qf, kf.sum(2).unsqueeze(-1)).clamp_min(1e-6)  # (B, H, N, 1)
        return torch.matmul(qf, kv) / denom
