"""``linear``: kernelised attention phi(Q) (phi(K)^T V) / (phi(Q) sum_j phi(K_j)) in O(N).

--feature-map elu (elu(x) + 1, Katharopoulos et al. 2020), relu, or performer (FAVOR+: positive
orthogonal random features approximating the softmax kernel, Choromanski et al. 2021, redrawn
every --performer-redraw training forwards).

Performer redraws: draw r of a layer is seeded by (--attention-seed, the layer's index, r), so every
layer has its own features and a run reproduces.  The counters (training forwards, redraws) advance
only in training forwards that are not an activation-checkpointing recomputation, so
--checkpoint-activations recomputes with the features of the original forward and counts each step
once; they are saved in the state dict next to the features (keys ``forwards`` and ``redraws``), so a
resumed run continues the draw sequence.  A state dict without them (older checkpoints) loads with
the counters left as they are (0 in a fresh model)."""

import math

import torch
import torch.nn.functional as F

from fairseq_nat_ext.compat import InputError

from .base import AttentionVariant
from .functional import in_recomputation, valid_keys
from .registry import register_attention

FEATURE_MAPS = ("elu", "relu", "performer")
COUNTERS = ("forwards", "redraws")  # performer redraw state, saved in the state dict


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
        """The features of draw number ``self.redraws`` of this layer."""
        gen = torch.Generator().manual_seed((self.opts.layer_seed() * 1000003 + self.redraws) % 2 ** 63)
        return orthogonal_gaussian(self.opts.performer_features, self.head_dim, gen)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.feature_map == "performer":
            for name in COUNTERS:
                destination[prefix + name] = torch.tensor(getattr(self, name), dtype=torch.long)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        counters = {name: int(state_dict[prefix + name]) for name in COUNTERS if prefix + name in state_dict}
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        for name in COUNTERS:
            if prefix + name in unexpected_keys:
                unexpected_keys.remove(prefix + name)
        if self.feature_map == "performer":  # absent (older checkpoints): left as they are
            for name, value in counters.items():
                setattr(self, name, value)

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
        if self.feature_map == "performer" and self.training and not in_recomputation():
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
    denominator, so it is a constant for the gradient as well.  The (N, m) tensor is made once and then
    changed in place (each fresh (N, m) buffer costs as much as a pass over it)."""
    taped = torch.is_grad_enabled() and x.requires_grad  # phi() under autograd (tests, pictures): no in-place
    if fmap == "elu":
        return F.elu(x) + 1 if taped else F.elu(x).add_(1)
    if fmap == "relu":
        return F.relu(x)
    logits = torch.matmul(x, W.t())
    half_norm = (x * x).sum(-1, keepdim=True) / (2 * x.size(-1) ** 0.5)
    if stab is None:
        stab = logits.amax(dim=-1, keepdim=True) - half_norm
    shift = half_norm + stab + 0.5 * math.log(W.size(0))
    return (logits - shift).exp() if taped else logits.sub_(shift).exp_()


def features_backward(x, phi, grad, fmap, W=None):
    """d loss / d x from d loss / d phi(x) (the stabiliser held constant, as it cancels); ``grad`` is consumed
    (overwritten) for the performer map."""
    if fmap == "elu":
        return grad * torch.where(x > 0, torch.ones_like(phi), phi)  # elu(x) + 1 = exp(x) below 0
    if fmap == "relu":
        return grad * (x > 0).to(grad.dtype)
    t = grad.mul_(phi)
    return torch.matmul(t, W) - t.sum(-1, keepdim=True) * x / x.size(-1) ** 0.5


def with_ones(x, scale=None):
    """(..., n, d) -> (..., n, d + 1): x with a column of ones appended, times ``scale`` (..., n, 1) if given.
    Sums against the features and against 1 then come out of ONE product with the (n, m) features."""
    out = torch.cat([x, torch.ones_like(x[..., :1])], -1)
    return out if scale is None else out.mul_(scale)


def key_stabiliser(k, real, W, chunk):
    """(B, H, 1, 1): the largest (logit - |k|^2 / (2 sqrt(d))) over the REAL keys (0 when there is none)."""
    return _key_sums(k, torch.zeros_like(k[..., :1]), real, W, "performer", chunk)[1]


def _key_sums(k, v, real, W, fmap, chunk):
    """Sz = phi(K)^T [V, 1] (B, H, m, dv + 1) over the real keys -- S = phi(K)^T V and z = phi(K)^T 1 in one
    product -- in chunks of rows, and the performer's key stabiliser (None for elu/relu).  The stabiliser is
    the running maximum: when a chunk raises it, the sums so far are rescaled by exp(old - new), as in online
    softmax.  Padding keys are left out through the (n, dv + 1) factor, not the (n, m) features."""
    Sz = run = None
    for lo in range(0, k.size(2), chunk):
        kc, rc = k[:, :, lo:lo + chunk], real[:, :, lo:lo + chunk]
        if fmap == "performer":
            logits = torch.matmul(kc, W.t())
            half_norm = (kc * kc).sum(-1, keepdim=True) / (2 * k.size(-1) ** 0.5)
            top = (logits.amax(-1, keepdim=True) - half_norm).masked_fill(rc == 0, float("-inf")).amax(-2, keepdim=True)
            new = top if run is None else torch.maximum(run, top)
            new = new.masked_fill(torch.isinf(new), 0.0)  # no real key yet: any finite constant
            if Sz is not None:  # sums so far were taken with the old stabiliser
                Sz = Sz * torch.exp(run - new)
            run = new
            shift = half_norm + new + 0.5 * math.log(W.size(0))
            kf = (logits - shift).exp() if torch.is_grad_enabled() and kc.requires_grad else logits.sub_(shift).exp_()
        else:
            kf = features(kc, fmap)
        s = torch.matmul(kf.transpose(-1, -2), with_ones(v[:, :, lo:lo + chunk], rc))
        Sz = s if Sz is None else Sz.add_(s)
    return Sz, run


class _LinearAttention(torch.autograd.Function):
    """out = phi(Q) S / (phi(Q) z), S = phi(K)^T V and z = phi(K)^T 1 over the real keys, in chunks of rows;
    backward recomputes the features chunk by chunk, so only (B, H, N, d) tensors and the (m, d) sums are kept:
        U = dO / den, g = -<dO, out> / den, dphi(Q) = [U, g] [S, z]^T, [dS, dz] = phi(Q)^T [U, g],
        dphi(K) = [V, 1] [dS, dz]^T, dV = phi(K) dS (real keys only).
    Every (n, m) x (m, d) product carries the extra column of its z / 1 / g term (one pass over the features)."""

    @staticmethod
    def forward(ctx, q, k, v, real, W, fmap, chunk):
        if bool((real == 0).any()):  # padding keys: zero input (finite features), left out below
            kin, vin = k * real, v * real
        else:
            kin, vin = k, v
        Sz, stab = _key_sums(kin, vin, real, W, fmap, chunk)
        dv = v.size(-1)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        raw = q.new_empty(q.shape[:-1] + (1,))  # phi(Q) z before the clamp, kept for the backward pass
        for lo in range(0, q.size(2), chunk):
            nd = torch.matmul(features(q[:, :, lo:lo + chunk], fmap, W), Sz)  # (.., n, dv + 1): numerator, den
            raw[:, :, lo:lo + chunk] = nd[..., dv:]
            out[:, :, lo:lo + chunk] = nd[..., :dv] / nd[..., dv:].clamp_min(1e-6)
        ctx.fmap, ctx.chunk = fmap, chunk
        ctx.save_for_backward(q, kin, vin, real, W if W is not None else q.new_empty(0), stab if stab is not None
                              else q.new_empty(0), Sz, out, raw)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, kin, vin, real, W, stab, Sz, out, raw_all = ctx.saved_tensors
        fmap, chunk = ctx.fmap, ctx.chunk
        W = W if W.numel() else None
        stab = stab if stab.numel() else None
        dv = vin.size(-1)
        SzT = Sz.transpose(-1, -2)
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        dSz = torch.zeros_like(Sz)  # [dS, dz]
        for lo in range(0, q.size(2), chunk):
            qc, gc, oc = q[:, :, lo:lo + chunk], grad[:, :, lo:lo + chunk], out[:, :, lo:lo + chunk]
            qf = features(qc, fmap, W)
            raw = raw_all[:, :, lo:lo + chunk]
            den = raw.clamp_min(1e-6)
            U = gc / den
            g = -(gc * oc).sum(-1, keepdim=True) / den * (raw >= 1e-6).to(den.dtype)  # clamp: no gradient
            Ug = torch.cat([U, g], -1)
            dSz += torch.matmul(qf.transpose(-1, -2), Ug)
            dq[:, :, lo:lo + chunk] = features_backward(qc, qf, torch.matmul(Ug, SzT), fmap, W)
        dSzT = dSz.transpose(-1, -2)
        dS = dSz[..., :dv]
        dk = torch.empty_like(kin)
        dvv = torch.empty_like(vin)
        for lo in range(0, kin.size(2), chunk):
            kc, vc, rc = kin[:, :, lo:lo + chunk], vin[:, :, lo:lo + chunk], real[:, :, lo:lo + chunk]
            kf = features(kc, fmap, W, stab)
            dkf = torch.matmul(with_ones(vc, rc), dSzT)
            dk[:, :, lo:lo + chunk] = features_backward(kc, kf, dkf, fmap, W) * rc
            dvv[:, :, lo:lo + chunk] = torch.matmul(kf, dS) * rc
        return dq, dk, dvv, None, None, None, None
