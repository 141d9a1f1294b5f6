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
        """Feature map of queries or keys (B, H, N, d) -> (B, H, N, m); ``real`` (B, 1, N, 1) marks real keys
        (the keys' performer stabiliser is taken over them).  Tests and pictures; forward runs in chunks."""
        W = self._scaled_features(x)
        stab = None if is_query or W is None else key_stabiliser(x, real, W, x.size(2))
        return features(x, self.feature_map, W, stab)

    def _scaled_features(self, x):
        if self.feature_map != "performer":
            return None
        return self.features.to(x.dtype) / self.head_dim ** 0.25

    def forward(self, q, k, v, lengths):
        if self.feature_map == "performer" and self.training:
            self.forwards += 1
            if self.opts.performer_redraw and self.forwards % self.opts.performer_redraw == 0:
                self.redraws += 1
                self.features.copy_(self._draw())
        real = valid_keys(lengths, k.size(2))[:, None, :, None].to(q.dtype)  # (B, 1, N, 1)
        return _LinearAttention.apply(q, k, v, real, self._scaled_features(q), self.feature_map, CHUNK)


CHUNK = 1024  # rows per chunk: feature tensors never exist for the whole sequence


def features(x, fmap, W=None, stab=None):
    """phi(x) (..., N, m).  Performer (FAVOR+): exp(x . w / d^(1/4) - |x|^2 / (2 sqrt(d)) - c) / sqrt(m), W the
    features already divided by d^(1/4); c = ``stab`` (keys: one constant per (batch, head) over real keys)
    or, for queries (None), the row's own maximum: any such constant cancels between numerator and
    denominator, so it is a constant for the gradient as well."""
    if fmap == "elu":
        return F.elu(x) + 1
    if fmap == "relu":
        return F.relu(x)
    logits = torch.matmul(x, W.t())
    half_norm = (x * x).sum(-1, keepdim=True) / (2 * x.size(-1) ** 0.5)
    if stab is None:
        stab = logits.amax(dim=-1, keepdim=True) - half_norm
    return (logits - (half_norm + stab + 0.5 * math.log(W.size(0)))).exp_()


def features_backward(x, phi, grad, fmap, W=None):
    """d loss / d x from d loss / d phi(x) (the stabiliser held constant, as it cancels)."""
    if fmap == "elu":
        return grad * torch.where(x > 0, torch.ones_like(phi), phi)  # elu(x) + 1 = exp(x) below 0
    if fmap == "relu":
        return grad * (x > 0).to(grad.dtype)
    t = grad * phi
    return torch.matmul(t, W) - t.sum(-1, keepdim=True) * x / x.size(-1) ** 0.5


def key_stabiliser(k, real, W, chunk):
    """(B, H, 1, 1): the largest (logit - |k|^2 / (2 sqrt(d))) over the REAL keys (0 when there is none)."""
    return _key_sums(k, torch.zeros_like(k[..., :1]), real, W, "performer", chunk)[2]


def _key_sums(k, v, real, W, fmap, chunk):
    """S = phi(K)^T V (B, H, m, dv), z = phi(K)^T 1 (B, H, m) over the real keys, in chunks of rows, and the
    performer's key stabiliser (None for elu/relu).  The stabiliser is the running maximum: when a chunk
    raises it, the sums so far are rescaled by exp(old - new), as in online softmax."""
    S = z = run = None
    for lo in range(0, k.size(2), chunk):
        kc, rc = k[:, :, lo:lo + chunk], real[:, :, lo:lo + chunk]
        if fmap == "performer":
            logits = torch.matmul(kc, W.t())
            half_norm = (kc * kc).sum(-1, keepdim=True) / (2 * k.size(-1) ** 0.5)
            top = (logits.amax(-1, keepdim=True) - half_norm).masked_fill(rc == 0, float("-inf")).amax(-2, keepdim=True)
            new = top if run is None else torch.maximum(run, top)
            new = new.masked_fill(torch.isinf(new), 0.0)  # no real key yet: any finite constant
            if S is not None:  # sums so far were taken with the old stabiliser
                scale = torch.exp(run - new)
                S, z = S * scale, z * scale.squeeze(-1)
            run = new
            kf = (logits - (half_norm + new + 0.5 * math.log(W.size(0)))).exp_() * rc
        else:
            kf = features(kc, fmap) * rc
        s, zz = torch.matmul(kf.transpose(-1, -2), v[:, :, lo:lo + chunk]), kf.sum(-2)
        S, z = (s, zz) if S is None else (S + s, z + zz)
    return S, z, run


class _LinearAttention(torch.autograd.Function):
    """out = phi(Q) S / (phi(Q) z), S = phi(K)^T V and z = phi(K)^T 1 over the real keys, in chunks of rows;
    backward recomputes the features chunk by chunk, so only (B, H, N, d) tensors and the (m, d) sums are kept:
        U = dO / den, g = -<dO, out> / den, dphi(Q) = U S^T + g z^T, dS = phi(Q)^T U, dz = phi(Q)^T g,
        dphi(K) = V dS^T + 1 dz^T, dV = phi(K) dS (real keys only)."""

    @staticmethod
    def forward(ctx, q, k, v, real, W, fmap, chunk):
        if bool((real == 0).any()):  # padding keys: zero input (finite features), left out below
            kin, vin = k * real, v * real
        else:
            kin, vin = k, v
        S, z, stab = _key_sums(kin, vin, real, W, fmap, chunk)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        for lo in range(0, q.size(2), chunk):
            qf = features(q[:, :, lo:lo + chunk], fmap, W)
            den = torch.matmul(qf, z.unsqueeze(-1)).clamp_min(1e-6)
            out[:, :, lo:lo + chunk] = torch.matmul(qf, S) / den
        ctx.fmap, ctx.chunk = fmap, chunk
        ctx.save_for_backward(q, kin, vin, real, W if W is not None else q.new_empty(0), stab if stab is not None
                              else q.new_empty(0), S, z, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, kin, vin, real, W, stab, S, z, out = ctx.saved_tensors
        fmap, chunk = ctx.fmap, ctx.chunk
        W = W if W.numel() else None
        stab = stab if stab.numel() else None
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        dS = torch.zeros_like(S)
        dz = torch.zeros_like(z)
        for lo in range(0, q.size(2), chunk):
            qc, gc, oc = q[:, :, lo:lo + chunk], grad[:, :, lo:lo + chunk], out[:, :, lo:lo + chunk]
            qf = features(qc, fmap, W)
            raw = torch.matmul(qf, z.unsqueeze(-1))
            den = raw.clamp_min(1e-6)
            U = gc / den
            g = -(gc * oc).sum(-1, keepdim=True) / den * (raw >= 1e-6).to(den.dtype)  # clamp: no gradient
            dqf = torch.matmul(U, S.transpose(-1, -2)) + g * z.unsqueeze(-2)
            dS += torch.matmul(qf.transpose(-1, -2), U)
            dz += (qf * g).sum(-2)
            dq[:, :, lo:lo + chunk] = features_backward(qc, qf, dqf, fmap, W)
        dk = torch.empty_like(kin)
        dv = torch.empty_like(vin)
        for lo in range(0, kin.size(2), chunk):
            kc, vc, rc = kin[:, :, lo:lo + chunk], vin[:, :, lo:lo + chunk], real[:, :, lo:lo + chunk]
            kf = features(kc, fmap, W, stab)
            dkf = (torch.matmul(vc, dS.transpose(-1, -2)) + dz.unsqueeze(-2)) * rc
            dk[:, :, lo:lo + chunk] = features_backward(kc, kf, dkf, fmap, W) * rc
            dv[:, :, lo:lo + chunk] = torch.matmul(kf, dS) * rc
        return dq, dk, dv, None, None, None, None
