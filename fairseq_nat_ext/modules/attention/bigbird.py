"""``bigbird``: block-sparse attention of BigBird (Zaheer et al. 2020): window and global blocks the same in
every head, random blocks per head.

The sequence is cut into blocks of --block-size tokens.  The first --bigbird-global-blocks blocks are
global: their queries see every key and every query sees them.  Every other query block sees its
window (--bigbird-window-blocks blocks centred on itself), the global blocks, and
--bigbird-random-blocks random blocks.  As in the released code (``np.random.permutation(middle)[:r]``
per query-block row), the r random blocks of a (head, query block) are distinct and drawn uniformly
among the candidates: the sequence's own real blocks that are neither global nor in the window; a row
with fewer than r candidates gets all of them.  The draw is the top r, among the candidates, of a fixed
random order of the key blocks per (head, query block) drawn once from the layer's seed, so it is a
fixed function of (layer seed, head, query block, number of real blocks): fixed per layer (as the
released code fixes its pattern at construction), never pointing into padding and not depending on it.
Work and memory are O(N * (w + g + r) * block), plus a (batch, H, N / block, N / block) integer
selection per forward (no gradient) and the order table (H, max blocks, max blocks)."""

import torch

from . import partials
from .base import AttentionVariant
from .functional import check_max_positions, fused_attention, valid_keys
from .registry import register_attention


@register_attention("bigbird")
class BigBirdAttention(AttentionVariant):
    # bf16 holds integers exactly only up to 256: rounded ranks would make rows tie
    full_precision_buffers = ("random_rank",)

    def __init__(self, num_heads, head_dim, opts, dropout=0.0):
        super().__init__(num_heads, head_dim, opts, dropout)
        if opts.bigbird_window_blocks % 2 == 0:
            from fairseq_nat_ext.compat import InputError

            raise InputError(f"--bigbird-window-blocks must be odd (own block +- neighbours), got {opts.bigbird_window_blocks}")
        # random_rank[h, i, j]: rank of key block j in a fixed random order of query block i's row in head h
        # (distinct in a row, so top r never ties; float32 holds them exactly); drawn once per layer from
        # the layer's seed, like the released code's pattern fixed at construction
        rows = -(-opts.max_positions // opts.block_size)
        gen = torch.Generator().manual_seed(opts.layer_seed())
        order = torch.rand(num_heads, rows, rows, generator=gen).argsort(dim=-1, stable=True)
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(rows).expand_as(order))
        self.register_buffer("random_rank", rank.float(), persistent=False)

    @torch.no_grad()
    def block_table(self, lengths, nb):
        """(B, H, nb, K) key-block index per query block and (B, H, nb, K) validity, K = w + g + r."""
        o = self.opts
        dev = lengths.device
        B, H = lengths.size(0), self.num_heads
        real_blocks = (lengths + o.block_size - 1) // o.block_size  # (B,)
        rb = real_blocks.view(B, 1, 1, 1)
        qb = torch.arange(nb, device=dev)
        half = o.bigbird_window_blocks // 2
        window = qb[:, None] + torch.arange(-half, half + 1, device=dev)[None, :]  # (nb, w)
        g = o.bigbird_global_blocks
        glob = torch.arange(g, device=dev)[None, :].expand(nb, -1)  # (nb, g)
        w = window.size(1)
        ok_window = ((window >= g) & (window >= 0)).expand(B, H, nb, w) & (window < rb)  # global: the global part
        ok_glob = glob.expand(B, H, nb, g) < rb
        r = o.bigbird_random_blocks
        # random: the top r scores among the candidates (real, not global, not in the window) of each row
        cand = (qb >= g) & ((qb[None, :] - qb[:, None]).abs() > half)  # (nb query, nb key)
        cand = cand[None, None] & (qb < rb)  # (B, 1, nb, nb)
        score = self.random_rank[:, :nb, :nb].to(dev)  # (H, nb, nb)
        top, rand = torch.where(cand, score, -1.0).topk(min(r, nb), dim=-1)  # (B, H, nb, r')
        ok_rand = top >= 0  # fewer than r candidates: the rest are invalid
        rand = torch.where(ok_rand, rand, 0)
        if rand.size(-1) < r:  # more random blocks asked than there are blocks
            rand = torch.nn.functional.pad(rand, (0, r - rand.size(-1)))
            ok_rand = torch.nn.functional.pad(ok_rand, (0, r - ok_rand.size(-1)))
        idx = torch.cat([window.expand(B, H, nb, -1), glob.expand(B, H, nb, -1), rand], dim=-1)
        valid = torch.cat([ok_window, ok_glob, ok_rand], dim=-1)
        return idx.clamp(0, nb - 1), valid

    def forward(self, q, k, v, lengths):
        B, H, N, d = q.shape
        o = self.opts
        check_max_positions(N, o.max_positions, "bigbird")
        bs = o.block_size
        nb = -(-N // bs)
        L = nb * bs
        idx, valid = self.block_table(lengths, nb)  # (B, H, nb, K)
        K = idx.size(-1)
        g = min(o.bigbird_global_blocks * bs, N)
        if partials.usable(q, self.dropout, self.training):
            return self.merged(q, k, v, lengths, idx, valid, g)
        pad = lambda t: torch.nn.functional.pad(t, (0, 0, 0, L - N))  # noqa: E731
        qb = pad(q).view(B, H, nb, bs, d)
        glob = None
        if g > 0:  # global queries see every real key
            glob = fused_attention(q[:, :, :g], k, v, valid_keys(lengths, N)[:, None, None, :],
                                   self.dropout, self.training)
        # whole key blocks (rows of bs * d numbers) picked by one index_select over all (batch, head, block)
        rows = (idx + torch.arange(B * H, device=q.device).view(B, H, 1, 1) * nb).flatten()
        kg = pad(k).reshape(B * H * nb, bs * d).index_select(0, rows).view(B, H, nb, K * bs, d)
        vg = pad(v).reshape(B * H * nb, bs * d).index_select(0, rows).view(B, H, nb, K * bs, d)
        kpos = (idx.unsqueeze(-1) * bs + torch.arange(bs, device=q.device)).view(B, H, nb, K * bs)
        allowed = valid.repeat_interleave(bs, dim=-1) & (kpos < lengths.view(B, 1, 1, 1))
        # a query block wholly in the padding sees all its keys (discarded; fused kernels need a key)
        pad_block = torch.arange(nb, device=q.device).view(1, 1, nb, 1) * bs >= lengths.view(B, 1, 1, 1)
        # one fused softmax per query block over its gathered key blocks (query blocks act as heads)
        out = fused_attention(qb.flatten(0, 1), kg.flatten(0, 1), vg.flatten(0, 1),
                              (allowed | pad_block).flatten(0, 1).unsqueeze(2), self.dropout, self.training)
        out = out.reshape(B, H, L, d)[:, :, :N]
        return out if glob is None else torch.cat([glob, out[:, :, g:]], dim=2)

    def merged(self, q, k, v, lengths, idx, valid, g):
        """The same pattern as two disjoint key sets merged exactly (partials.py): the window blocks read
        through an overlapping view of the keys; the global and random blocks gathered together (one partial
        less to run and merge than a separate global prefix: 1.97 -> 1.82 s fwd+bwd at N = 16384)."""
        B, H, N, d = q.shape
        o = self.opts
        bs, wb = o.block_size, o.bigbird_window_blocks
        nb = idx.size(2)
        half = wb // 2
        # window: the same in every head (padding queries see their whole window; discarded)
        parts = [partials.Band(bs, half, wb * bs, lengths, N, q.dtype, block_ok=valid[:, 0, :, :wb])]
        first = None
        if g > 0:  # global queries see every real key
            first = partials.FirstRows(g, valid_keys(lengths, nb * bs), q.dtype)
        if idx.size(-1) > wb:  # global then random blocks, per head
            blocks = idx[..., wb:].permute(0, 2, 1, 3)  # (B, nb, H, g + r)
            kpos = (blocks.unsqueeze(-1) * bs + torch.arange(bs, device=q.device)).flatten(-2)
            ok = valid[..., wb:].permute(0, 2, 1, 3).repeat_interleave(bs, dim=-1) & (kpos < lengths.view(B, 1, 1, 1))
            parts.append(partials.Blocks(bs, blocks.flatten(0, 1), ok.flatten(0, 1), nb, q.dtype))
        return partials.merged_attention(q, k, v, parts, nb * bs, margin=half * bs, first=first)

    def pattern(self, lengths, n):
        """Dense (B, H, n, n) bool of which query sees which key (tests and pictures only)."""
        bs = self.opts.block_size
        nb = -(-n // bs)
        idx, valid = self.block_table(lengths, nb)
        B, H = idx.shape[:2]
        blocks = torch.zeros(B, H, nb, nb, dtype=torch.bool, device=lengths.device)
        for j in range(idx.size(-1)):
            blocks |= torch.nn.functional.one_hot(idx[..., j], nb).bool() & valid[..., j:j + 1]
        gb = self.opts.bigbird_global_blocks
        blocks[:, :, :gb, :] = True
        blocks[:, :, :, :gb] = True
        see = blocks.repeat_interleave(bs, 2).repeat_interleave(bs, 3)[:, :, :n, :n]
        i = torch.arange(n, device=lengths.device)
        real = i[None, :] < lengths[:, None]
        return see & real[:, None, None, :] & real[:, None, :, None]
