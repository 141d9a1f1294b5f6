"""Arch ``pointer_transformer``: a Transformer encoder over the point set and a pointer decoder.

Encoder: a learned end vector (slot 0) and the linearly embedded points (slots 1..n) plus a
sinusoidal embedding of each point's 1-based index, pre-norm Transformer layers with key padding
masks.  The input is a set, but the canonical outputs are not: a hull starts at its lowest index and
a tour's direction is fixed by comparing indices.  Without the index embedding
(``--no-pointer-index-embed``, the behaviour before the option existed) the encoder is
permutation-equivariant, so the model cannot tell which hull vertex to start from or which way round
a tour goes: those steps become coin flips.

Length generalisation (``--pointer-index-range L``, 0 = off): absolute indices 1..n are
out of distribution for a model tested on more points than it was trained on (the indices above the
training n were never seen).  With L > 0 the index embedding uses randomised positions (Ruoss et al.
2023, "Randomized Positional Encodings Boost Length Generalization of Transformers"): in training, the
n points of an example take a sorted uniform random subset of 1..L (only their order carries
information, which is all the canonical outputs need); at inference they take the evenly spaced
positions 1 + floor(k L / n), k = 0..n-1, so decoding stays deterministic.  n > L is an error.

Decoder: at step t its input is the encoder output of the slot pointed at in step t - 1 (a learned
start vector at t = 0) plus a sinusoidal step embedding; pre-norm layers of causal self-attention,
cross-attention to the encoder and a feed-forward block; the additive pointer over the n + 1 encoder
slots is the output distribution.  Incremental decoding keeps, per layer, the normalised inputs of
the previous steps (the self-attention keys/values), so a step costs O(t), and equals the full
forward (tested).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.models import register_model, register_model_architecture

from ...compat import InputError
from .common import AdditivePointer, PointerModel, sinusoid


class PointerDecoderLayer(nn.Module):
    def __init__(self, dim, heads, ffn_dim, dropout):
        super().__init__()
        self.norm_self = nn.LayerNorm(dim)
        self.self_attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.norm_cross = nn.LayerNorm(dim)
        self.cross_attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.norm_ffn = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn_dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn_dim, dim))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, memory, memory_pad, past=None):
        """x (B, T, D); memory (B, S, D); memory_pad (B, S) True at padding; past (B, t0, D) normalised
        inputs of earlier steps (incremental, T = 1) or None (full sequence, causal).  Returns
        (x, keys (B, t0 + T, D))."""
        h = self.norm_self(x)
        if past is None:
            keys = h
            T = x.size(1)
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        else:
            keys = torch.cat([past, h], 1)
            causal = None
        x = x + self.dropout(self.self_attn(h, keys, keys, attn_mask=causal, need_weights=False)[0])
        h = self.norm_cross(x)
        x = x + self.dropout(self.cross_attn(h, memory, memory, key_padding_mask=memory_pad,
                                             need_weights=False)[0])
        x = x + self.dropout(self.ffn(self.norm_ffn(x)))
        return x, keys


@register_model("pointer_transformer")
class PointerTransformerModel(PointerModel):
    def __init__(self, args):
        super().__init__(args)
        D = args.encoder_embed_dim
        self.point_embed = nn.Linear(2, D)
        self.end_embed = nn.Parameter(torch.randn(D) * 0.1)
        self.start_embed = nn.Parameter(torch.randn(D) * 0.1)
        layer = nn.TransformerEncoderLayer(D, args.encoder_attention_heads, args.encoder_ffn_embed_dim,
                                           args.dropout, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, args.encoder_layers, norm=nn.LayerNorm(D),
                                             enable_nested_tensor=False)
        self.layers = nn.ModuleList([
            PointerDecoderLayer(D, args.encoder_attention_heads, args.encoder_ffn_embed_dim, args.dropout)
            for _ in range(args.decoder_layers)
        ])
        self.decoder_norm = nn.LayerNorm(D)
        self.dropout = nn.Dropout(args.dropout)
        self.pointer = AdditivePointer(D, D, D, clip=args.pointer_logit_clip)
        self.index_embed = bool(args.pointer_index_embed)
        self.index_range = int(args.pointer_index_range)

    @staticmethod
    def add_args(parser):
        parser.add_argument("--encoder-embed-dim", type=int, help="model size")
        parser.add_argument("--encoder-layers", type=int, help="encoder layers")
        parser.add_argument("--decoder-layers", type=int, help="pointer decoder layers")
        parser.add_argument("--encoder-attention-heads", type=int, help="attention heads (both stacks)")
        parser.add_argument("--encoder-ffn-embed-dim", type=int, help="feed-forward size (both stacks)")
        parser.add_argument("--dropout", type=float, help="dropout")
        parser.add_argument("--pointer-logit-clip", type=float,
                            help="C > 0 bounds pointer logits to C*tanh(u) (0 = off)")
        parser.add_argument("--no-pointer-index-embed", dest="pointer_index_embed", action="store_false",
                            default=None, help="no sinusoidal embedding of the points' input indices (the "
                                               "encoder then cannot see the order the canonical outputs use)")
        parser.add_argument("--pointer-index-range", type=int, metavar="L",
                            help="L > 0: randomised index positions for length generalisation (training: "
                                 "a sorted random subset of 1..L per example; inference: evenly spaced over "
                                 "1..L); 0 = the indices 1..n themselves")

    @classmethod
    def build_model(cls, args, task):
        pointer_transformer_base(args)
        if args.encoder_embed_dim % args.encoder_attention_heads:
            raise InputError(f"pointer_transformer: --encoder-embed-dim {args.encoder_embed_dim} is not a "
                             f"multiple of --encoder-attention-heads {args.encoder_attention_heads}")
        if args.pointer_index_range < 0:
            raise InputError(f"pointer_transformer: --pointer-index-range must be >= 0, got {args.pointer_index_range}")
        if args.encoder_layers < 1 or args.decoder_layers < 1:
            raise InputError("pointer_transformer: --encoder-layers and --decoder-layers must be >= 1")
        return cls(args)

    def encode(self, src_coords, src_lengths):
        B, N, _ = src_coords.shape
        points = self.point_embed(src_coords)
        if self.index_embed:
            index = self.index_positions(src_lengths.to(src_coords.device), N)
            points = points + sinusoid(index, points.size(-1)).to(points.dtype)
        x = torch.cat([self.end_embed.expand(B, 1, -1), points], 1)  # (B, S, D)
        slot_mask = self.slot_mask(src_lengths, N + 1)
        memory = self.encoder(self.dropout(x), src_key_padding_mask=~slot_mask)
        memory = memory.masked_fill(~slot_mask.unsqueeze(-1), 0.0)
        return {"memory": memory, "keys": self.pointer.keys(memory), "slot_mask": slot_mask}

    def index_positions(self, lengths, N):
        """(B,) point counts -> (B, N) long positions of the index embedding (padding columns: any
        value, their slots are masked).  See the module docstring for ``--pointer-index-range``."""
        B, dev = lengths.size(0), lengths.device
        k = torch.arange(N, device=dev).unsqueeze(0).expand(B, N)
        L = self.index_range
        if L <= 0:
            return k + 1
        if N > L and int(lengths.max()) > L:
            raise InputError(f"pointer_transformer: an input of {int(lengths.max())} points exceeds "
                             f"--pointer-index-range {L}")
        if not self.training:
            return 1 + (k * L).div(lengths.clamp_min(1).unsqueeze(1), rounding_mode="floor").clamp_max(L - 1)
        # the first n entries of a random permutation of 0..L-1, sorted: a uniform ordered subset
        draw = torch.rand(B, L, device=dev).argsort(1)[:, :min(N, L)]
        draw = F.pad(draw, (0, N - draw.size(1)), value=L)  # only when the padded width exceeds L
        draw = draw.masked_fill(k >= lengths.unsqueeze(1), L)  # padding sorts last
        return 1 + draw.sort(1).values.clamp_max(L - 1)

    def _decoder_inputs(self, enc, prev_slots, steps):
        """prev_slots (B, T), steps (B, T) -> (B, T, D)."""
        D = enc["memory"].size(-1)
        x = enc["memory"].gather(1, prev_slots.unsqueeze(-1).expand(-1, -1, D))
        x = torch.where((prev_slots == 0).unsqueeze(-1), self.start_embed.to(x.dtype).expand_as(x), x)
        return self.dropout(x + sinusoid(steps, D).to(x.dtype))

    def decode_train(self, enc, prev_slots):
        B, T = prev_slots.shape
        steps = torch.arange(T, device=prev_slots.device).unsqueeze(0).expand(B, T)
        x = self._decoder_inputs(enc, prev_slots, steps)
        pad = ~enc["slot_mask"]
        for layer in self.layers:
            x, _ = layer(x, enc["memory"], pad)
        return self.pointer(enc["keys"], self.decoder_norm(x), enc["slot_mask"])

    def init_state(self, enc):
        B, D = enc["memory"].size(0), enc["memory"].size(-1)
        state = {"step": torch.zeros(B, dtype=torch.long, device=enc["memory"].device)}
        for i in range(len(self.layers)):
            state[f"past{i}"] = enc["memory"].new_zeros(B, 0, D)
        return state

    def decode_step(self, enc, prev_slots, state):
        x = self._decoder_inputs(enc, prev_slots.unsqueeze(1), state["step"].unsqueeze(1))
        pad = ~enc["slot_mask"]
        new = {"step": state["step"] + 1}
        for i, layer in enumerate(self.layers):
            x, new[f"past{i}"] = layer(x, enc["memory"], pad, past=state[f"past{i}"])
        logits = self.pointer(enc["keys"], self.decoder_norm(x), enc["slot_mask"]).squeeze(1)
        return F.log_softmax(logits.float(), -1), new


@register_model_architecture("pointer_transformer", "pointer_transformer")
def pointer_transformer_base(args):
    for name, value in (("encoder_embed_dim", 128), ("encoder_layers", 3), ("decoder_layers", 2),
                        ("encoder_attention_heads", 8), ("encoder_ffn_embed_dim", 512), ("dropout", 0.0),
                        ("pointer_logit_clip", 10.0), ("pointer_index_embed", True),
                        ("pointer_index_range", 0)):
        if getattr(args, name, None) is None:
            setattr(args, name, value)
