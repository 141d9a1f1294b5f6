"""Exact softmax attention of every query over a union of disjoint key sets ("partials"), run by torch's
CPU flash-attention kernel, keeping only O(N d) tensors for the backward pass.

Each partial reads its keys through a 4-D view in the kernel's layout (X, heads, keys, d):
- :class:`Band`: query blocks of w positions read the keys b*w - reach*w .. b*w + (reach+1)*w - 1 as an
  OVERLAPPING strided view of the keys (no copy; the kernel reads through the strides);
- :class:`Prefix`: every query reads the first g keys of its sequence (a slice, no copy);
- :class:`Blocks`: query blocks read per-head chosen key blocks (gathered in forward, gathered again in
  backward instead of being kept);
- :class:`FirstRows` (not merged): the first g query rows read every key and replace the merged output there.
The partials' outputs O_i (normalised within the partial) are merged with their log-sum-exp weights
a_i = exp(lse_i - lse); the backward pass calls the kernel's own backward per partial with gradient
a_i * dO and the MERGED output as ``out``: the kernel's row term D = <dO_i, out> then equals the merged
attention's, so dS_i = a_i P_i (dP_i - D) is exactly the gradient of the softmax over the union.

Memory: the backward pass runs over chunks of query blocks (the prefix over chunks of queries, the global
rows over chunks of keys; a gathering partial's forward pass over chunks too), so the kernel's key gradients (one row per key
READ, (2 reach + 1)x the keys for a band) and the band's additive mask (rebuilt per chunk from a (w, span)
band and per-block vectors) never exist for the whole sequence at once.  A chunk's key gradients are also
kept under ``CHUNK_BYTES``: the kernel zero-fills them, and glibc serves a buffer above its mmap threshold
(at most 32 MiB) as fresh pages that fault on that first touch, chunk after chunk; smaller buffers are
reused from the heap (N = 16384, local: the kernel's fill_ 382 -> 50 ms; bigbird fwd+bwd 2.3 -> 1.7 s).  Used on CPU when there is no
attention dropout to apply; the variants keep their ``scaled_dot_product_attention`` path for CUDA and dropout.
"""

from typing import List, Optional, Tuple

import torch

from .functional import window_parts

Tensor = torch.Tensor

_FORWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
ENABLED = True  # tests switch it off to compare with the scaled_dot_product_attention path
CHUNK_BYTES = 4 << 20  # most bytes of one backward chunk's key gradient (see the module docstring)


def usable(q: Tensor, dropout: float, training: bool) -> bool:
    """Whether the flash-kernel path applies: CPU, a floating dtype, no attention dropout to apply."""
    return (ENABLED and _FORWARD is not None and q.device.type == "cpu" and q.is_floating_point()
            and not (dropout > 0.0 and training))


def additive(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """bool mask -> the kernel's additive mask (0 where allowed, -inf elsewhere)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


class Partial:
    """One key set.  ``w``: query block size (None: the query rows are whole sequences).  Kernel rows X are
    query blocks (B * nb) or sequences (B); the backward pass runs over row ranges of ``chunk`` rows."""

    w: Optional[int] = None
    chunk: Optional[int] = None  # None: all rows at once
    gathers = False  # keys() copies the keys (Blocks): the forward pass runs in chunks too
    has_key: Optional[Tensor] = None  # bool broadcasting to (B, L, H): rows with at least one key here

    def mask(self, lo: int = 0, hi: Optional[int] = None) -> Tensor:
        """Additive mask of kernel rows lo:hi, broadcasting to (hi - lo, H, Lq, M)."""
        raise NotImplementedError

    def bulk_mask(self) -> Optional[Tensor]:
        """The mask of ONE forward call over all rows; rows it gets wrong are listed by :meth:`exact_rows`."""
        return self.mask()

    def exact_rows(self) -> List[Tuple[int, int]]:
        """Row ranges whose forward output the bulk call gets wrong: run again with :meth:`mask` and replaced."""
        return []

    def q_view(self, x: Tensor) -> Tensor:
        """(B, L, H, d) common layout -> the kernel's (X, H, Lq, d) query view."""
        B, L, H, d = x.shape
        if self.w is None:
            return x.transpose(1, 2)
        return x.view(B * (L // self.w), self.w, H, d).transpose(1, 2)

    def common(self, y: Tensor, B: int) -> Tensor:
        """kernel output (X, H, Lq, d) or lse (X, H, Lq) -> (B, L, H[, d])."""
        y = y.transpose(1, 2)
        return y.reshape(B, -1, *y.shape[2:])

    def keys(self, flat: Tensor, B: int, L: int, margin: int, lo: int = 0, hi: Optional[int] = None) -> Tensor:
        """Kernel rows lo:hi of the (X, H, M, d) key view of the flat keys (margin + B * L + margin, H, d)."""
        raise NotImplementedError

    def fold(self, grad: Tensor, flat_grad: Tensor, B: int, L: int, margin: int, lo: int = 0) -> None:
        """Add the kernel's gradient for rows lo:lo + len(grad) of :meth:`keys` into the flat key gradient."""
        raise NotImplementedError

    def row_bytes(self, flat: Tensor, B: int, L: int, margin: int) -> int:
        """Bytes of one kernel row's keys (and so of its key gradient) from the flat keys."""
        return self.keys(flat, B, L, margin, 0, 1)[0].numel() * flat.element_size()

    def ranges(self, X: int, row_bytes: int = 0) -> List[Tuple[int, int]]:
        """Row ranges of the backward pass: ``chunk`` rows, fewer where one row's key gradient (``row_bytes``)
        times the rows would pass CHUNK_BYTES."""
        step = min(self.chunk or X, max(1, CHUNK_BYTES // max(row_bytes, 1)))
        return [(lo, min(lo + step, X)) for lo in range(0, X, step)]


class Band(Partial):
    """Query block b (w positions) reads key positions b*w - reach*w + j, j < (2 reach + 1) w: query i sees
    key j when |i - j| <= radius and min_key <= j < length; a padding query (i >= length) sees its whole
    window (its output is discarded).  Keys outside a sequence read a neighbour's rows or the zero margins and
    are masked."""

    def __init__(self, w: int, reach: int, radius: int, lengths: Tensor, n: int, dtype: torch.dtype,
                 min_key: int = 0, block_ok: Optional[Tensor] = None):
        """``block_ok`` (B, nb, 2 reach + 1) bool: per query block, which of its key blocks may be read
        (BigBird); None: all (local windows)."""
        self.w, self.reach, self.dtype = w, reach, dtype
        self.band, key_ok, pad_query = window_parts(lengths, n, w, radius, min_key, reach)
        if block_ok is not None:
            key_ok = key_ok & block_ok.repeat_interleave(w, dim=-1)
        self.key_ok, self.pad_query = key_ok.flatten(0, 1), pad_query.flatten(0, 1)  # (B * nb, span), (B * nb, w)
        nb = pad_query.size(1)
        self.has_key = self.allowed().any(-1).reshape(lengths.size(0), nb * w, 1)
        self.chunk = max(1, -(-self.key_ok.size(0) // (2 * reach + 1)))  # key-gradient chunks ~ the keys' size
        # "plain" rows (every key of the span readable, no padding query) all have the mask of the band alone:
        # one (1, 1, w, span) mask, or none where the band covers the span, instead of a (rows, w, span) one
        # built and read per row (N = 16384, local: a 38 MB mask per forward)
        plain = self.key_ok.all(-1) & ~self.pad_query.any(-1)
        self._odd = [0] + torch.cumsum(~plain, 0).tolist()  # rows lo:hi are plain iff _odd[hi] == _odd[lo]
        self._band = None if bool(self.band.all()) else additive(self.band, dtype)[None, None]

    def _plain(self, lo: int, hi: int) -> bool:
        return self._odd[hi] == self._odd[lo]

    def exact_rows(self):
        """Runs of non-plain rows."""
        runs, X = [], len(self._odd) - 1
        for x in range(X):
            if self._odd[x + 1] != self._odd[x]:
                if runs and runs[-1][1] == x:
                    runs[-1] = (runs[-1][0], x + 1)
                else:
                    runs.append((x, x + 1))
        return runs

    def bulk_mask(self):
        return self._band

    def allowed(self, lo: int = 0, hi: Optional[int] = None) -> Tensor:
        """(hi - lo, w, span) bool."""
        return (self.band & self.key_ok[lo:hi].unsqueeze(1)) | self.pad_query[lo:hi].unsqueeze(-1)

    def mask(self, lo=0, hi=None):
        if self._plain(lo, len(self._odd) - 1 if hi is None else hi):
            return self._band
        return additive(self.allowed(lo, hi), self.dtype).unsqueeze(1)

    def keys(self, flat, B, L, margin, lo=0, hi=None):
        _, H, d = flat.shape
        span = (2 * self.reach + 1) * self.w
        start = flat.storage_offset() + (margin - self.reach * self.w) * H * d
        return flat.as_strided((B * (L // self.w), H, span, d), (self.w * H * d, d, H * d, 1), start)[lo:hi]

    def fold(self, grad, flat_grad, B, L, margin, lo=0):
        X, H, span, d = grad.shape
        # (X, span, H, d) is the kernel's own memory layout: a view, and each offset's rows are added
        # through their strides (reshaping them to the flat rows would copy every offset first)
        g = grad.transpose(1, 2).reshape(X, 2 * self.reach + 1, self.w, H, d)
        first = margin - self.reach * self.w + lo * self.w
        for o in range(2 * self.reach + 1):
            start = first + o * self.w
            flat_grad[start:start + X * self.w].view(X, self.w, H, d).add_(g[:, o])


class Prefix(Partial):
    """Every query reads the first g keys of its own sequence; ``allowed`` (B, g) bool."""

    def __init__(self, g: int, allowed: Tensor, dtype: torch.dtype):
        self.g = g
        self._mask = additive(allowed[:, None, None, :], dtype)
        self.has_key = allowed.any(-1).view(-1, 1, 1)

    def mask(self, lo=0, hi=None):
        return self._mask[lo:hi]

    def keys(self, flat, B, L, margin, lo=0, hi=None):
        _, H, d = flat.shape
        return flat[margin:margin + B * L].view(B, L, H, d)[lo:hi, :self.g].transpose(1, 2)

    def fold(self, grad, flat_grad, B, L, margin, lo=0):
        _, H, d = flat_grad.shape
        flat_grad[margin:margin + B * L].view(B, L, H, d)[lo:lo + grad.size(0), :self.g] += grad.transpose(1, 2)


class FirstRows(Prefix):
    """Not merged: the first g query rows (global tokens) read every key of their sequence (``allowed``
    (B, L) bool) and REPLACE the merged output there; their gradient goes to this attention only."""

    def __init__(self, g: int, allowed: Tensor, dtype: torch.dtype):
        super().__init__(g, allowed, dtype)
        self.has_key = None

    def q_view(self, x):
        return x[:, :self.g].transpose(1, 2)

    def keys(self, flat, B, L, margin, lo=0, hi=None):
        _, H, d = flat.shape
        return flat[margin:margin + B * L].view(B, L, H, d)[lo:hi].transpose(1, 2)


class Blocks(Partial):
    """Query block x (w positions) of head h reads the key blocks ``index[x, h, :]`` (block numbers within its
    sequence, blocks of w positions); ``allowed`` (X, H, K * w) bool per key (the same for the whole block).
    The gathered keys are K times the keys' size: both passes gather them chunk by chunk."""

    gathers = True

    def __init__(self, w: int, index: Tensor, allowed: Tensor, nb: int, dtype: torch.dtype):
        X, H, K = index.shape
        self.w = w
        self.index = index + (torch.arange(X, device=index.device) // nb * nb).view(X, 1, 1)  # global block ids
        self._mask = additive(allowed.unsqueeze(2), dtype)  # (X, H, 1, K * w)
        self.has_key = allowed.any(-1).view(X // nb, nb, 1, H).expand(-1, -1, w, -1).reshape(X // nb, nb * w, H)
        self.chunk = max(1, -(-X // K))

    def mask(self, lo=0, hi=None):
        return self._mask[lo:hi]

    def _where(self, lo, hi):
        """Rows of the head-major block table (H * B * nb, w * d) that rows lo:hi read: (X', H, K)."""
        H = self.index.size(1)
        nbt = self.index.size(0)  # every kernel row is one query block: B * nb blocks in all
        return self.index[lo:hi] + torch.arange(H, device=self.index.device).view(1, H, 1) * nbt

    def _table(self, flat, B, L, margin):
        """(H * B * nb, w * d): every (head, key block) as one contiguous row, so gathering whole blocks is a
        row copy (indexing the (B nb, H, w, d) view directly reads w strided rows per block).  Made once per
        key / value tensor and kept while the partial lives (the backward pass reads it once per chunk)."""
        key = (flat.data_ptr(), flat._version)
        cache = self.__dict__.setdefault("_tables", {})
        if key not in cache:
            _, H, d = flat.shape
            blocks = flat[margin:margin + B * L].view(B * (L // self.w), self.w, H, d)
            cache[key] = blocks.permute(2, 0, 1, 3).reshape(H * B * (L // self.w), self.w * d)
        return cache[key]

    def keys(self, flat, B, L, margin, lo=0, hi=None):
        rows = self._where(lo, hi)
        X, H, K = rows.shape
        table = self._table(flat, B, L, margin)
        return table.index_select(0, rows.flatten()).view(X, H, K * self.w, flat.size(-1))

    def fold(self, grad, flat_grad, B, L, margin, lo=0):
        """The chunks' key gradients are summed into one head-major table per gradient tensor, added to the
        flat gradient after the last chunk (the chunks run in order)."""
        rows = self._where(lo, lo + grad.size(0))
        X, H, K = rows.shape
        _, _, d = flat_grad.shape
        nbt = self.index.size(0)
        accs = self.__dict__.setdefault("_accs", {})
        acc = accs.get(flat_grad.data_ptr())
        if acc is None:
            acc = accs[flat_grad.data_ptr()] = grad.new_zeros(H * nbt, self.w, d)
        # per head: in the kernel's own (X, K * w, H, d) memory a head's (w, d) block slices are a strided VIEW,
        # added as they lie (reshaping all of (X, H, K * w, d) to head-major rows would copy every chunk)
        for h in range(H):
            acc.index_add_(0, rows[:, h].flatten(), grad[:, h].reshape(X * K, self.w, d))
        if lo + X == nbt:
            del accs[flat_grad.data_ptr()]
            flat_grad[margin:margin + B * L].view(nbt, self.w, H, d).add_(acc.view(H, nbt, self.w, d).permute(1, 2, 0, 3))


def _flat(x: Tensor, L: int, margin: int) -> Tensor:
    """(B, H, N, d) -> (margin + B * L + margin, H, d): each sequence padded to L, zero margins."""
    B, H, N, d = x.shape
    flat = x.new_empty(margin + B * L + margin, H, d)
    flat[:margin].zero_()
    flat[margin + B * L:].zero_()
    body = flat[margin:margin + B * L].view(B, L, H, d)
    body[:, :N] = x.transpose(1, 2)
    body[:, N:].zero_()
    return flat


def _merge_weights(partials: List[Partial], lses: List[Tensor]) -> List[Tensor]:
    """Per partial a_i = exp(lse_i - logsumexp_j lse_j), 0 where the partial has no key (or none has)."""
    lse = [l.masked_fill(~p.has_key, float("-inf")) if p.has_key is not None else l for p, l in zip(partials, lses)]
    total = torch.logsumexp(torch.stack(lse), 0)
    total = total.masked_fill(torch.isinf(total), 0.0)
    return [torch.exp(l - total) for l in lse]


def _chunked_forward(p: Partial, qp: Tensor, kf: Tensor, vf: Tensor, B: int, L: int, margin: int):
    """The kernel's forward over row ranges of at most CHUNK_BYTES of gathered keys, into outputs laid out as
    the kernel's own ((X, Lq, H, d) memory seen as (X, H, Lq, d); lse (X, H, Lq)): the gathered keys and
    values never exist for the whole sequence (N = 16384, bigbird: 2 x 168 MB of fresh pages per call)."""
    qv = p.q_view(qp)
    X, H, Lq, d = qv.shape
    out = qv.new_empty(X, Lq, H, d).transpose(1, 2)
    lse = None
    for lo, hi in p.ranges(X, p.row_bytes(kf, B, L, margin)):
        o, l = _FORWARD(qv[lo:hi], p.keys(kf, B, L, margin, lo, hi), p.keys(vf, B, L, margin, lo, hi), 0.0,
                        False, attn_mask=p.mask(lo, hi))
        if lse is None:
            lse = l.new_empty(X, *l.shape[1:])
        out[lo:hi] = o
        lse[lo:hi] = l
    return out, lse


def _bulk_forward(p: Partial, qp: Tensor, kf: Tensor, vf: Tensor, B: int, L: int, margin: int):
    """One kernel call over every row with :meth:`Partial.bulk_mask`, then the rows it gets wrong again
    with their exact masks, written over the bulk call's output and lse."""
    qv, kv, vv = p.q_view(qp), p.keys(kf, B, L, margin), p.keys(vf, B, L, margin)
    exact = p.exact_rows()
    if 2 * sum(hi - lo for lo, hi in exact) > qv.size(0):  # mostly exact rows (short, padded): one exact call
        return _FORWARD(qv, kv, vv, 0.0, False, attn_mask=p.mask())
    out, lse = _FORWARD(qv, kv, vv, 0.0, False, attn_mask=p.bulk_mask())
    for lo, hi in exact:
        o, l = _FORWARD(qv[lo:hi], kv[lo:hi], vv[lo:hi], 0.0, False, attn_mask=p.mask(lo, hi))
        out[lo:hi] = o
        lse[lo:hi] = l
    return out, lse


class _MergedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, partials, first, L, margin):
        B, H, N, d = q.shape
        qp = q.new_empty(B, L, H, d)  # written once (a fresh buffer's first touch is its cost on CPU)
        qp[:, :N] = q.transpose(1, 2)
        qp[:, N:].zero_()
        kf, vf = _flat(k, L, margin), _flat(v, L, margin)
        outs, lses, raw = [], [], []
        for p in partials:
            o, lse = _chunked_forward(p, qp, kf, vf, B, L, margin) if p.gathers else _bulk_forward(
                p, qp, kf, vf, B, L, margin)
            outs.append(p.common(o, B))
            lses.append(p.common(lse, B).to(torch.promote_types(lse.dtype, torch.float32)))
            raw.append(lse)
        if len(partials) == 1:
            weights = []
            out = outs[0]
        else:
            weights = _merge_weights(partials, lses)
            out = outs[0].mul_(weights[0].unsqueeze(-1).to(outs[0].dtype))  # in place: the kernel's own outputs
            for a, o in zip(weights[1:], outs[1:]):
                out.addcmul_(a.unsqueeze(-1).to(o.dtype), o)
        del outs, lses
        if first is not None:
            o, lse = _FORWARD(first.q_view(qp), first.keys(kf, B, L, margin), first.keys(vf, B, L, margin), 0.0,
                              False, attn_mask=first.mask())
            out[:, :first.g] = first.common(o, B)
            raw.append(lse)
        for p in partials:
            p.__dict__.pop("_tables", None)  # per-pass caches (Blocks): not kept between the passes
        ctx.partials, ctx.first, ctx.shape = partials, first, (B, H, N, d, L, margin)
        ctx.save_for_backward(qp, kf, vf, out, *raw, *weights)
        return out[:, :N].transpose(1, 2)

    @staticmethod
    def backward(ctx, grad):
        B, H, N, d, L, margin = ctx.shape
        partials, first = ctx.partials, ctx.first
        qp, kf, vf, out, *rest = ctx.saved_tensors
        n_raw = len(partials) + (first is not None)
        raw, weights = rest[:n_raw], rest[n_raw:]
        if L == N and first is None and grad.transpose(1, 2).is_contiguous():
            g = grad.transpose(1, 2)  # already the kernel's layout (the usual case: out_proj's input gradient)
        else:  # a fresh buffer: padded to L, and the global rows zeroed below
            g = grad.new_empty(B, L, H, d)
            g[:, :N] = grad.transpose(1, 2)
            g[:, N:].zero_()
        gq = torch.zeros_like(qp)
        gk, gv = torch.zeros_like(kf), torch.zeros_like(vf)

        def run(p, lse, weight):
            """One partial's kernel backward with gradient ``weight`` * g (its merge weight, per query; None:
            1), the product formed chunk by chunk (a whole-sequence one is fresh pages every pass)."""
            qv, gv_, ov, dqv = p.q_view(qp), p.q_view(g), p.q_view(out), p.q_view(gq)
            wv = None if weight is None else p.q_view(weight.unsqueeze(-1).to(g.dtype))
            if p.w is None:  # Prefix: whole sequences read the same few keys; chunks of QUERIES
                keys, values, mask = p.keys(kf, B, L, margin), p.keys(vf, B, L, margin), p.mask()
                step = max(1, CHUNK_BYTES // (B * H * d * kf.element_size()))
                for lo in range(0, qv.size(2), step):
                    q_ = slice(lo, lo + step)
                    gi = gv_[:, :, q_] if wv is None else gv_[:, :, q_] * wv[:, :, q_]
                    dq, dk, dv = _BACKWARD(gi, qv[:, :, q_], keys, values, ov[:, :, q_],
                                           lse[:, :, q_].contiguous(), 0.0, False, attn_mask=mask)
                    dqv[:, :, q_] += dq
                    p.fold(dk, gk, B, L, margin)
                    p.fold(dv, gv, B, L, margin)
                return
            for lo, hi in p.ranges(qv.size(0), p.row_bytes(kf, B, L, margin)):
                gi = gv_[lo:hi] if wv is None else gv_[lo:hi] * wv[lo:hi]
                dq, dk, dv = _BACKWARD(gi, qv[lo:hi], p.keys(kf, B, L, margin, lo, hi),
                                       p.keys(vf, B, L, margin, lo, hi), ov[lo:hi], lse[lo:hi], 0.0, False,
                                       attn_mask=p.mask(lo, hi))
                dqv[lo:hi] += dq
                p.fold(dk, gk, B, L, margin, lo)
                p.fold(dv, gv, B, L, margin, lo)

        def run_first(p, lse):
            """The global rows over chunks of KEYS: with the whole row's lse and output the kernel's backward
            on a key range gives exactly those keys' gradients (and their part of dq), and no key gradient
            bigger than CHUNK_BYTES is allocated (a whole (L, H, d) one is fresh pages every pass)."""
            qv, gv_, ov, dqv = p.q_view(qp), p.q_view(g), p.q_view(out), p.q_view(gq)
            keys, values, mask = p.keys(kf, B, L, margin), p.keys(vf, B, L, margin), p.mask()
            step = max(1, CHUNK_BYTES // (B * H * d * kf.element_size()))
            body_k = gk[margin:margin + B * L].view(B, L, H, d)
            body_v = gv[margin:margin + B * L].view(B, L, H, d)
            for lo in range(0, L, step):
                hi = min(lo + step, L)
                dq, dk, dv = _BACKWARD(gv_, qv, keys[:, :, lo:hi], values[:, :, lo:hi], ov, lse, 0.0, False,
                                       attn_mask=mask[..., lo:hi])
                dqv += dq
                body_k[:, lo:hi] += dk.transpose(1, 2)
                body_v[:, lo:hi] += dv.transpose(1, 2)

        if first is not None:
            run_first(first, raw[-1])
            g[:, :first.g] = 0.0  # those rows' merged output was replaced
        for i, p in enumerate(partials):
            run(p, raw[i], weights[i] if weights else None)

        for p in partials:
            p.__dict__.pop("_tables", None)

        def back(flat):
            return flat[margin:margin + B * L].view(B, L, H, d)[:, :N].transpose(1, 2)

        return gq[:, :N].transpose(1, 2), back(gk), back(gv), None, None, None, None


def merged_attention(q: Tensor, k: Tensor, v: Tensor, partials: List[Partial], L: int, margin: int = 0,
                     first: Optional[FirstRows] = None) -> Tensor:
    """Softmax attention of q over the union of ``partials`` (disjoint key sets), (B, H, N, d) -> (B, H, N, d);
    with ``first`` the first g query rows are its attention instead.  ``L`` >= N: the common padded length (a
    multiple of every partial's block size); ``margin``: zero rows before and after the flat keys (a
    :class:`Band` needs reach * w).  Only where :func:`usable` is True."""
    return _MergedAttention.apply(q, k, v, partials, first, L, margin)
