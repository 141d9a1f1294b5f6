"""What the pointer archs share: the additive pointer (Vinyals et al. 2015, eq. 3), the model interface
the task, criterion and generator use, and sinusoidal step embeddings.

Slots: for an input of n points the output distribution has n + 1 slots, slot 0 the end position and
slot i the i-th point.  Interface of a :class:`PointerModel`:

* ``forward(src_tokens, src_lengths, src_coords, prev_output_slots)`` -> logits (B, T, N + 1),
  padding slots at -inf (teacher forcing: training and scoring).
* ``encode(src_coords, src_lengths)`` -> dict of batch-first tensors (``slot_mask`` (B, S) among them).
* ``init_state(enc)`` -> dict of batch-first tensors; ``decode_step(enc, prev_slots (R,), state)`` ->
  (log-probs (R, S), new state).  Beam search reorders both dicts with :func:`reorder_batch`.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.models import BaseFairseqModel


def reorder_batch(tensors, order):
    """Every tensor of the dict indexed along dim 0 by ``order``."""
    return {k: v.index_select(0, order) for k, v in tensors.items()}


def sinusoid(positions, dim):
    """(...,) long -> (..., dim) sinusoidal embeddings (sin on even, cos on odd channels)."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, device=positions.device, dtype=torch.float32)
                     * (-math.log(10000.0) / max(half - 1, 1)))
    angle = positions.float().unsqueeze(-1) * freq
    emb = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(-2)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb


class AdditivePointer(nn.Module):
    """u_j = v^T tanh(W1 e_j + W2 d_i) over the memory slots j, masked where ``slot_mask`` is False;
    ``clip > 0`` bounds the logits to clip * tanh(u) (Bello et al. 2016)."""

    def __init__(self, memory_dim, query_dim, dim, clip=0.0):
        super().__init__()
        self.w_memory = nn.Linear(memory_dim, dim, bias=False)
        self.w_query = nn.Linear(query_dim, dim)
        self.v = nn.Linear(dim, 1, bias=False)
        self.clip = clip

    def keys(self, memory):
        """(B, S, memory_dim) -> (B, S, dim): the query-independent half, computed once per input."""
        return self.w_memory(memory)

    def forward(self, keys, query, slot_mask):
        """keys (B, S, A), query (B, T, Q), slot_mask (B, S) -> logits (B, T, S)."""
        u = self.v(torch.tanh(keys.unsqueeze(1) + self.w_query(query).unsqueeze(2))).squeeze(-1)
        if self.clip > 0:
            u = self.clip * torch.tanh(u)
        return u.masked_fill(~slot_mask.unsqueeze(1), float("-inf"))


def uniform_init_(module, init_range):
    """Vinyals et al.: every parameter uniform in [-r, r] (r = 0 keeps PyTorch's defaults)."""
    if init_range > 0:
        for p in module.parameters():
            nn.init.uniform_(p, -init_range, init_range)


class PointerModel(BaseFairseqModel):
    """Base of the pointer archs (see the module docstring for the interface)."""

    def __init__(self, args):
        super().__init__()
        self.args = args
        # the problem the model was trained on, stored in the checkpoint's args by the task
        self.problem = getattr(args, "pointer_problem", None)

    @staticmethod
    def slot_mask(src_lengths, num_slots):
        """(B,) point counts -> bool (B, S): slot 0 (end) and slots 1..n are real."""
        return torch.arange(num_slots, device=src_lengths.device).unsqueeze(0) <= src_lengths.unsqueeze(1)

    @staticmethod
    def slot_coords(src_coords):
        """(B, N, 2) -> (B, N + 1, 2) with zeros at the end slot."""
        return F.pad(src_coords, (0, 0, 1, 0))

    def forward(self, src_tokens, src_lengths, src_coords, prev_output_slots, **unused):
        enc = self.encode(src_coords, src_lengths)
        return self.decode_train(enc, prev_output_slots)

    def get_normalized_probs(self, net_output, log_probs, sample=None):
        logits = net_output[0] if isinstance(net_output, tuple) else net_output
        return F.log_softmax(logits.float(), -1) if log_probs else F.softmax(logits.float(), -1)

    def reorder_encoder_out(self, enc, order):
        return reorder_batch(enc, order)

    def reorder_state(self, state, order):
        return reorder_batch(state, order)

    def max_positions(self):
        return None
