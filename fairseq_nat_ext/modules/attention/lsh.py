"""``lsh``: Reformer attention (Kitaev et al. 2020): shared query-key, angular LSH, sorted chunks.

Keys are the unit-normalised queries (shared QK; the layer's key projection is not used by these
heads).  Each of --lsh-rounds rounds hashes every token by a random rotation
(bucket = argmax [xR, -xR]); tokens are sorted by (bucket, position) and cut into chunks of
--lsh-bucket-size; each chunk attends to itself and the chunk before it, and the first chunk to the
last chunk of its sequence (the wrap-around of the released code's look-adjacent roll; a sequence of
one chunk attends to that chunk once).  A token attends to itself only when nothing else is visible:
its score gets -1e5, as in the paper (scores are computed in float32 for fp16/bf16 inputs, so the
penalty never overflows).  Rounds are combined by their log-sum-exp (a key found in several rounds
counts once per round, as in the released trax code; the paper's appendix subtracts log N_ij so that
it counts once).

Rotations: in training every forward draws fresh ones (from torch's global random generator, on the
input's device and dtype), as the paper and trax do, so the buckets vary from step to step;
activation checkpointing restores the generator's state before recomputing a layer, so the
recomputed forward draws the same rotations.  In evaluation the rotations are fixed per layer
(seeded by --attention-seed and the layer's index, not saved in checkpoints), sized by
--max-positions.

Padding: a sequence of length n uses n_buckets = 2 * ceil(n / (2 * bucket_size)) buckets (its own
length, not the batch's), padding tokens sort after every real token, and the first chunk looks back
to the last chunk holding real tokens of its own sequence, so the chunks of real tokens and what they
see do not depend on padding."""

import torch
import torch.nn.functional as F

from .base import AttentionVariant
from .functional import check_max_positions, merge_partials
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
        gen = torch.Generator().manual_seed(opts.layer_seed())
        self.register_buffer(  # evaluation rotations
            "rotations",
            torch.randn(opts.lsh_rounds, num_heads, head_dim, max_buckets // 2, generator=gen), persistent=False)

    def current_rotations(self, q):
        """(rounds, H, d, R/2) rotations of this forward: fresh random ones in training (torch's global
        generator, q's device and dtype; R/2 for the batch's length), the fixed per-layer ones in eval."""
        if not self.training:
            return self.rotations
        c = self.opts.lsh_bucket_size
        half = max(1, -(-q.size(2) // (2 * c)))
        return torch.randn(self.opts.lsh_rounds, q.size(1), q.size(3), half, device=q.device, dtype=q.dtype)

    def sorted_order(self, q, lengths, rotations):
        """(B, H, N) positions sorted by (bucket, position) under ``rotations`` (H, d, R/2), or an int: that
        round's evaluation rotations (pictures); padding last."""
        B, H, N, _ = q.shape
        if isinstance(rotations, int):
            rotations = self.rotations[rotations]
        buckets = lsh_buckets(q, rotations, n_buckets_for(lengths, self.opts.lsh_bucket_size))
        pos = torch.arange(N, device=q.device)
        key = buckets * N + pos
        key = key.masked_fill(pos[None, None, :] >= lengths.view(B, 1, 1), torch.iinfo(torch.long).max)
        return key.argsort(dim=-1)

    def round_partial(self, q, keys, v, lengths, rotations, scaled=None):
        """One hash round: (out (B, H, N, d), lse (B, H, N)), each query over the keys of its chunk and of
        the chunk it looks back to.  ``keys`` the unit-normalised queries, ``rotations`` (H, d, R/2),
        ``scaled`` q / sqrt(d) if already computed."""
        B, H, N, d = q.shape
        scaled = q * d ** -0.5 if scaled is None else scaled
        c = self.opts.lsh_bucket_size
        nc = -(-N // c)
        L = nc * c
        dev = q.device
        # chunk each chunk looks back to: the one before; chunk 0 to the last chunk holding real tokens of
        # its sequence (a sequence of one chunk: itself, whose keys are then left out of the look-back)
        chunks = torch.arange(nc, device=dev)
        last = ((lengths + c - 1) // c).clamp_min(1) - 1  # (B,)
        prev = torch.where(chunks == 0, last.view(B, 1), chunks.view(1, nc) - 1)  # (B, nc)
        dup = (prev == chunks.view(1, nc)).view(B, 1, nc, 1)

        order = self.sorted_order(q, lengths, rotations)  # (B, H, N)
        order = F.pad(order, (0, L - N), value=N)  # extra slots point at a dummy position N
        pos = order.view(B, H, nc, c)
        prev_pos = pos.gather(2, prev.view(B, 1, nc, 1).expand(B, H, nc, c))
        kpos = torch.cat([prev_pos, pos], dim=3)  # (B, H, nc, 2c): looked-back chunk, own chunk

        def gathered(t, index, m):  # t (B, H, N, d) at positions ``index`` (B, H, nc, m) (dummy row N = 0)
            t = F.pad(t, (0, 0, 0, 1))
            return t.gather(2, index.reshape(B, H, nc * m, 1).expand(B, H, nc * m, d)).view(B, H, nc, m, d)

        qs = gathered(scaled, pos, c)
        kk = gathered(keys, kpos, 2 * c)
        vv = gathered(v, kpos, 2 * c)
        scores = torch.matmul(qs, kk.transpose(-1, -2))  # (B, H, nc, c, 2c)
        length = lengths.view(B, 1, 1, 1)
        allowed = torch.cat([(prev_pos < length) & ~dup, pos < length], dim=3).unsqueeze(-2)
        probs, lse = _ChunkSoftmax.apply(scores, allowed)
        if self.dropout > 0.0 and self.training:
            probs = F.dropout(probs, p=self.dropout, training=True)
        out = torch.matmul(probs.to(vv.dtype), vv).reshape(B, H, L, d)
        lse = lse.reshape(B, H, L)
        # un-sort: slot i holds position order[i]; the dummy position N is dropped
        back = torch.zeros(B, H, N + 1, d, dtype=out.dtype, device=dev)
        back = back.scatter(2, order.unsqueeze(-1).expand(B, H, L, d), out)[:, :, :N]
        lse_back = torch.full((B, H, N + 1), float("-inf"), dtype=lse.dtype, device=dev)
        lse_back = lse_back.scatter(2, order, lse)[:, :, :N]
        return back, lse_back

    def forward(self, q, k, v, lengths):
        check_max_positions(q.size(2), self.opts.max_positions, "lsh")
        rotations = self.current_rotations(q)
        keys = F.normalize(q, dim=-1)
        scaled = q * q.size(-1) ** -0.5
        return merge_partials([self.round_partial(q, keys, v, lengths, rotations[rnd], scaled)
                               for rnd in range(self.opts.lsh_rounds)])


class _ChunkSoftmax(torch.autograd.Function):
    """scores (.., c, 2c) of a chunk's queries over [looked-back chunk, own chunk], ``allowed`` (.., 1, 2c)
    bool -> (probs, lse), in float32 for fp16/bf16 scores: the softmax over the allowed keys with the self
    penalty on the own-chunk diagonal (a token's own key; a chunk never looks back to itself), and its
    log-sum-exp (-inf, probabilities 0, for a row without an allowed key).  One function, so the (c, 2c)
    tensors are passed over a few times only; backward: ds = p * (dp - sum(dp * p) + dlse)."""

    @staticmethod
    def forward(ctx, scores, allowed):
        half = scores.dtype in (torch.float16, torch.bfloat16)
        s = (scores.float() if half else scores).masked_fill(~allowed, float("-inf"))  # fresh: ours to change
        c = s.size(-2)
        s[..., c:].diagonal(dim1=-2, dim2=-1).sub_(SELF_PENALTY)
        lse = torch.logsumexp(s, dim=-1)
        probs = s.sub_(lse.masked_fill(torch.isinf(lse), 0.0).unsqueeze(-1)).exp_()  # in place: s is ours
        ctx.save_for_backward(probs)
        ctx.in_dtype = scores.dtype
        return probs, lse

    @staticmethod
    def backward(ctx, dprobs, dlse):
        (probs,) = ctx.saved_tensors
        if dprobs is None:
            dprobs = torch.zeros_like(probs)
        t = dprobs.to(probs.dtype) * probs
        shift = -t.sum(-1, keepdim=True)
        if dlse is not None:  # NaN where lse = -inf (a merge of empty rows): such rows have p = 0
            shift = shift + dlse.nan_to_num(0.0, 0.0, 0.0).unsqueeze(-1)
        return t.addcmul_(probs, shift).to(ctx.in_dtype), None
