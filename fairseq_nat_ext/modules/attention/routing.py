"""``routing``: Routing Transformer attention (Roy et al. 2021), balanced routing as in the released code.

Every head keeps C unit-norm centroids mu_1 .. mu_C (--routing-clusters, 0: ceil(sqrt(--max-positions))).
Queries and keys are unit-normalised; with the window w = ceil(max_positions / C) (at most N), centroid c
selects the w REAL queries with the largest q^.mu_c and, separately, the w REAL keys with the largest k^.mu_c
(all real tokens of a sequence shorter than w; padding is never selected; equal similarities, as computed
in float32 or wider, go to the lower position).
The query slots of cluster c attend, in one softmax scaled by 1/sqrt(d), to exactly the keys of cluster c,
and a query's output is the mean of its outputs over the clusters that selected it (``distribution`` =
top-w per centroid, then ``scatter_mean``, as lucidrains' ``KmeansAttention``).  A query that no centroid
selects outputs ZEROS from these heads, as in the released code: the paper combines routing heads with
local heads (e.g. ``--encoder-attention-mix local:4,routing:4``).  Outputs at real positions do not depend
on the padding.  Time O(C w^2 d) = O(max_positions w d) per head, memory O(N C + C w d): no N x N tensor.

The centroids (a persistent buffer: checkpoints hold them) follow, without gradient, an exponential moving
average (--routing-decay) of the mean of the real unit queries and keys nearest to them (argmax), as in the
paper.  A training forward computes the new centroids into ``pending_centroids`` and leaves ``centroids``
alone; the update is committed at the start of the next training forward and before a ``state_dict`` is
taken; an evaluation forward routes with the pending centroids without committing them.  So a forward is a
pure function of the module's state: under activation checkpointing (``--checkpoint-activations``,
``torch.utils.checkpoint``) the recomputed forward, which runs inside the backward pass
(:func:`functional.in_recomputation`), sees the centroids the original forward saw and neither applies nor
computes an update, also when an evaluation forward ran in between (the Imputer's alignment pass).  The
centroids move once per training forward (k times per optimizer step with ``--update-freq k``); two
TRAINING forwards of one layer before one backward are not supported under activation checkpointing (the
second commits the first's update before the first's recomputation).  The centroids stay float32 under
``--fp16``/``--bf16`` (an EMA step is below half precision's rounding step).  In
distributed training (torch.distributed initialised, world size > 1) the per-centroid sums and counts are
summed over all ranks before the average, so every rank keeps the same centroids (a rank with an empty
batch takes part in that sum with nothing).  The initial centroids
are drawn from ``opts.layer_seed()`` (a seed per layer).
"""

import math

import torch
import torch.nn.functional as F

from .base import AttentionVariant
from .functional import check_max_positions, fused_attention, in_recomputation, with_a_key_per_row
from .registry import register_attention


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` in place over the ranks of the default process group (nothing outside distributed
    training); returns ``t``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


def top_positions(scores: torch.Tensor, lengths: torch.Tensor, w: int, padded: bool = True) -> torch.Tensor:
    """scores (B, H, C, N), overwritten -> (B, H, C, w) the positions of the w largest scores of every row among
    the real positions (< lengths[b]), by decreasing score, ties to the lower position; when a sequence has
    fewer than w real tokens, its padding positions fill the last slots (slot j holds a real token exactly
    when j < lengths[b]).  ``padded``: False when no sequence of the batch has padding."""
    N = scores.size(-1)
    if padded:
        scores.masked_fill_(torch.arange(N, device=scores.device) >= lengths.view(-1, 1, 1, 1), float("-inf"))
    if w >= N:
        return scores.topk(N, dim=-1).indices  # every position: the order of ties does not matter
    # topk orders ties as it likes; only a tie between the w-th and the (w+1)-th score changes which tokens
    # are chosen (the order inside the selection does not matter): rare, and then a stable sort settles it
    top, idx = scores.topk(w + 1, dim=-1)
    tied = (top[..., w - 1] == top[..., w]) & (top[..., w - 1] > float("-inf"))
    if bool(tied.any()):
        idx = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    return idx[..., :w]


@register_attention("routing")
class RoutingAttention(AttentionVariant):
    # an EMA step at decay 0.999 (about 1e-4 per component) is below half precision's rounding step
    full_precision_buffers = ("centroids", "pending_centroids")

    def __init__(self, num_heads, head_dim, opts, dropout=0.0):
        super().__init__(num_heads, head_dim, opts, dropout)
        self.n_clusters = opts.routing_clusters or math.ceil(math.sqrt(opts.max_positions))
        self.window = math.ceil(opts.max_positions / self.n_clusters)
        gen = torch.Generator().manual_seed(opts.layer_seed())
        self.register_buffer("centroids", F.normalize(torch.randn(num_heads, self.n_clusters, head_dim, generator=gen), dim=-1))
        # the centroids a training forward computed, applied by the next forward (or state_dict)
        self.register_buffer("pending_centroids", None, persistent=False)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, clusters={self.n_clusters}, window={self.window}"

    def routing_centroids(self):
        """The centroids a forward routes with: in training the committed ones; in evaluation a pending
        update is read (validation right after a step sees it) but not committed, so an evaluation forward
        between a training forward and its backward (the Imputer's alignment pass) changes no state."""
        if not self.training and self.pending_centroids is not None:
            return self.pending_centroids
        return self.centroids

    def similarities(self, x):
        """x (B, H, N, d) -> (cosine similarities to the centroids (B, H, C, N), unit vectors (B, H, N, d)),
        both in float32 at least (no gradient)."""
        dt = torch.promote_types(x.dtype, torch.float32)
        unit = F.normalize(x.detach().to(dt), dim=-1)
        return torch.matmul(self.routing_centroids().to(dt), unit.transpose(-1, -2)), unit

    @torch.no_grad()
    def updated_centroids(self, units, sims, lengths):
        """The EMA step: every centroid moves towards the mean of the real unit vectors (queries and keys) whose
        nearest centroid (argmax) it is, then is renormalised; a centroid nobody chose stays.  Sums by index_add
        over (head, cluster) rows (padding goes to an extra row that is dropped), summed over the ranks in
        distributed training."""
        H, C, d = self.centroids.shape
        dt, dev = units[0].dtype, units[0].device
        sums = torch.zeros(H * C + 1, d, dtype=dt, device=dev)
        counts = torch.zeros(H * C + 1, dtype=torch.long, device=dev)
        head = (torch.arange(H, device=dev) * C).view(1, H, 1)
        for x, s in zip(units, sims):  # queries, keys
            pad = torch.arange(x.size(2), device=dev) >= lengths.view(-1, 1, 1)  # (B, 1, N)
            rows = (s.max(2).indices + head).masked_fill_(pad, H * C).flatten().to(torch.int32)
            sums.index_add_(0, rows, x.reshape(-1, d))
            counts += torch.bincount(rows, minlength=H * C + 1)
        both = all_reduce_sum(torch.cat([sums[:-1], counts[:-1, None].to(dt)], 1)).view(H, C, d + 1)
        sums, counts = both[..., :d], both[..., d:]
        old = self.centroids.to(dt)
        decay = self.opts.routing_decay
        new = F.normalize(decay * old + (1 - decay) * sums / counts.clamp_min(1), dim=-1)
        return torch.where(counts > 0, new, old).to(self.centroids.dtype)

    @torch.no_grad()
    def apply_pending_update(self):
        if self.pending_centroids is not None:
            self.centroids.copy_(self.pending_centroids)
            self.pending_centroids = None

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        self.apply_pending_update()  # checkpoints hold the centroids after the last training forward
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, *args, **kwargs):
        self.pending_centroids = None  # computed from the centroids being replaced
        super()._load_from_state_dict(*args, **kwargs)

    def routes(self, q, k, lengths, padded=True):
        """(query positions, key positions) of every cluster, each (B, H, C, w) (see :func:`top_positions`); in a
        training forward outside a recomputation, also computes the pending centroid update."""
        w = min(self.window, q.size(2))
        with torch.no_grad():
            sq, uq = self.similarities(q)
            sk, uk = self.similarities(k)
            if self.training and not in_recomputation():
                self.pending_centroids = self.updated_centroids((uq, uk), (sq, sk), lengths)
            return top_positions(sq, lengths, w, padded), top_positions(sk, lengths, w, padded)

    def forward(self, q, k, v, lengths):
        B, H, N, d = q.shape
        check_max_positions(N, self.opts.max_positions, "routing")
        if self.training and not in_recomputation():
            self.apply_pending_update()
        if B * N == 0:
            self.routes(q, k, lengths)  # a training forward still joins the ranks' reduction (a collective)
            return q.new_zeros(B, H, N, d)
        C, w = self.n_clusters, min(self.window, N)
        shortest = int(lengths.min())
        padded, short = shortest < N, shortest < w
        iq, ik = self.routes(q, k, lengths, padded)
        with torch.no_grad():
            # rows of the (B H N, d) views; int32 indices take torch's fast index_add path on CPU
            itype = torch.int32 if B * H * N < 2 ** 31 else torch.long
            base = torch.arange(0, B * H * N, N, device=q.device).view(B, H, 1, 1)
            rq, rk = (iq + base).flatten().to(itype), (ik + base).flatten().to(itype)
            # scatter-mean weights: 1 / the number of clusters that selected the query
            share = torch.bincount(rq, minlength=B * H * N).clamp_min_(1).to(q.dtype).reciprocal_().index_select(0, rq)

        def rows(t, index):
            return t.reshape(B * H * N, d).index_select(0, index).view(B * H, C, w, d)

        allowed = None
        if short:  # slot j of a cluster holds a real key exactly when j < length
            real = torch.arange(w, device=q.device) < lengths.view(B, 1, 1, 1, 1)
            allowed = with_a_key_per_row(real).expand(B, H, 1, 1, w).reshape(B * H, 1, 1, w)
        out = fused_attention(rows(q, rq), rows(k, rk), rows(v, rk), allowed, self.dropout, self.training)
        out = out.reshape(-1, d) * share.unsqueeze(-1)
        return out.new_zeros(B * H * N, d).index_add(0, rq, out).view(B, H, N, d)
