"""Arch ``pointer_lstm``: the Ptr-Net of Vinyals et al. (2015).

The encoder LSTM reads a learned end vector (slot 0) followed by the embedded points (slots 1..n);
its outputs are the memory e_j.  The decoder LSTM starts from the encoder's final state and at each
step reads the embedded coordinates of the point it pointed at (a learned start vector at step 0);
the additive attention u_j = v^T tanh(W1 e_j + W2 d_i) over the n + 1 slots is the output
distribution.  Inputs are padded on the right; the encoder packs them, so padding never reaches the
final state.  Defaults follow the paper (one layer, 256 units) except the initialisation: the paper's
uniform [-0.08, 0.08] (``--pointer-init-range 0.08``) trained far slower with Adam in our runs
(convex hull n=10: 32% vs 87% token accuracy after 600 updates), so PyTorch's defaults are the default.
"""
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from fairseq.models import register_model, register_model_architecture

from ...compat import InputError
from .common import AdditivePointer, PointerModel, uniform_init_


@register_model("pointer_lstm")
class PointerLSTMModel(PointerModel):
    def __init__(self, args):
        super().__init__(args)
        e, d, layers = args.pointer_embed_dim, args.pointer_hidden_dim, args.pointer_layers
        drop = args.dropout
        self.point_embed = nn.Linear(2, e)
        self.decoder_point_embed = nn.Linear(2, e)
        self.end_embed = nn.Parameter(torch.zeros(e))
        self.start_embed = nn.Parameter(torch.zeros(e))
        self.encoder = nn.LSTM(e, d, num_layers=layers, batch_first=True, dropout=drop if layers > 1 else 0.0)
        self.decoder = nn.LSTM(e, d, num_layers=layers, batch_first=True, dropout=drop if layers > 1 else 0.0)
        self.dropout = nn.Dropout(drop)
        self.pointer = AdditivePointer(d, d, d, clip=args.pointer_logit_clip)
        nn.init.normal_(self.end_embed, std=0.1)
        nn.init.normal_(self.start_embed, std=0.1)
        uniform_init_(self, args.pointer_init_range)

    @staticmethod
    def add_args(parser):
        parser.add_argument("--pointer-embed-dim", type=int, help="point embedding size")
        parser.add_argument("--pointer-hidden-dim", type=int, help="LSTM units (also the attention size)")
        parser.add_argument("--pointer-layers", type=int, help="LSTM layers of the encoder and the decoder")
        parser.add_argument("--dropout", type=float, help="dropout on embeddings and LSTM outputs")
        parser.add_argument("--pointer-init-range", type=float,
                            help="uniform init in [-r, r] for every parameter (0 = PyTorch defaults)")
        parser.add_argument("--pointer-logit-clip", type=float,
                            help="C > 0 bounds pointer logits to C*tanh(u) (0 = off)")

    @classmethod
    def build_model(cls, args, task):
        pointer_lstm_base(args)
        for name in ("pointer_embed_dim", "pointer_hidden_dim", "pointer_layers"):
            if getattr(args, name) < 1:
                raise InputError(f"pointer_lstm: --{name.replace('_', '-')} must be >= 1")
        return cls(args)

    def encode(self, src_coords, src_lengths):
        B, N, _ = src_coords.shape
        x = torch.cat([self.end_embed.expand(B, 1, -1), self.point_embed(src_coords)], 1)  # (B, S, e)
        x = self.dropout(x)
        packed = pack_padded_sequence(x, (src_lengths + 1).cpu(), batch_first=True, enforce_sorted=False)
        out, (h, c) = self.encoder(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=N + 1)  # (B, S, d)
        memory = self.dropout(memory)
        return {
            "keys": self.pointer.keys(memory),
            "slot_mask": self.slot_mask(src_lengths, N + 1),
            "slot_coords": self.slot_coords(src_coords),
            "h0": h.transpose(0, 1).contiguous(),  # (B, layers, d)
            "c0": c.transpose(0, 1).contiguous(),
        }

    def _decoder_inputs(self, enc, prev_slots):
        """prev_slots (B, T) -> (B, T, e): start vector for slot 0, else the pointed point's coords."""
        idx = prev_slots.unsqueeze(-1).expand(-1, -1, 2)
        coords = enc["slot_coords"].gather(1, idx)
        x = self.decoder_point_embed(coords)
        x = torch.where((prev_slots == 0).unsqueeze(-1), self.start_embed.to(x.dtype).expand_as(x), x)
        return self.dropout(x)

    def decode_train(self, enc, prev_slots):
        x = self._decoder_inputs(enc, prev_slots)
        out, _ = self.decoder(x, (enc["h0"].transpose(0, 1).contiguous(), enc["c0"].transpose(0, 1).contiguous()))
        return self.pointer(enc["keys"], self.dropout(out), enc["slot_mask"])

    def init_state(self, enc):
        return {"h": enc["h0"], "c": enc["c0"]}

    def decode_step(self, enc, prev_slots, state):
        x = self._decoder_inputs(enc, prev_slots.unsqueeze(1))
        hc = (state["h"].transpose(0, 1).contiguous(), state["c"].transpose(0, 1).contiguous())
        out, (h, c) = self.decoder(x, hc)
        logits = self.pointer(enc["keys"], self.dropout(out), enc["slot_mask"]).squeeze(1)
        return torch.log_softmax(logits.float(), -1), {"h": h.transpose(0, 1), "c": c.transpose(0, 1)}


@register_model_architecture("pointer_lstm", "pointer_lstm")
def pointer_lstm_base(args):
    for name, value in (("pointer_embed_dim", 256), ("pointer_hidden_dim", 256), ("pointer_layers", 1),
                        ("dropout", 0.0), ("pointer_init_range", 0.0), ("pointer_logit_clip", 0.0)):
        if getattr(args, name, None) is None:
            setattr(args, name, value)
