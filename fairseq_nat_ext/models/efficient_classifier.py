"""Arch ``efficient_classifier``: an encoder-only Transformer classifier (ListOps, LRA style) whose
self-attention is any registered variant (``--encoder-attention-type``); pooling over the real
tokens by mean (``--pooling mean``) or the first token (``--pooling cls``, the task's ``<s>``)."""

import torch
import torch.nn as nn
from fairseq.models import BaseFairseqModel, register_model, register_model_architecture
from fairseq.models.transformer import Embedding, TransformerModel
from fairseq.models.transformer import base_architecture as transformer_base_architecture

from ..compat import InputError
from ..modules.attention import add_attention_args
from ..modules.efficient_encoder import EfficientTransformerEncoder


@register_model("efficient_classifier")
class EfficientClassifier(BaseFairseqModel):
    def __init__(self, args, encoder, num_classes):
        super().__init__()
        self.args = args
        self.encoder = encoder
        dim = args.encoder_embed_dim
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Dropout(args.dropout), nn.Linear(dim, num_classes))

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        add_attention_args(parser)
        parser.add_argument("--pooling", choices=["mean", "cls"], help="mean over real tokens or the first token")
        parser.add_argument("--num-classes", type=int, help="number of classes (default: the task's, 10)")

    @classmethod
    def build_model(cls, args, task):
        efficient_classifier_base(args)
        d = task.source_dictionary
        args.max_source_positions = min(getattr(args, "max_source_positions", None) or task.max_positions(),
                                        task.max_positions())
        embed = Embedding(len(d), args.encoder_embed_dim, d.pad())
        encoder = EfficientTransformerEncoder(args, d, embed)
        return cls(args, encoder, args.num_classes or 10)

    def forward(self, src_tokens, src_lengths, **unused):
        if src_tokens.size(1) > self.encoder.max_source_positions:
            raise InputError(f"efficient_classifier: input of {src_tokens.size(1)} tokens is longer than "
                             f"--max-source-positions {self.encoder.max_source_positions}")
        out = self.encoder(src_tokens, src_lengths=src_lengths)
        x = out["encoder_out"][0].transpose(0, 1)  # (B, T, C)
        real = ~out["encoder_padding_mask"][0]  # (B, T)
        if self.args.pooling == "cls":
            first = real.float().argmax(1)  # first real position, whatever the padding side
            pooled = x[torch.arange(x.size(0), device=x.device), first]
        else:
            pooled = (x * real.unsqueeze(-1).to(x.dtype)).sum(1) / real.sum(1, keepdim=True).to(x.dtype)
        return self.head(pooled)

    def max_positions(self):
        return self.encoder.max_positions()


@register_model_architecture("efficient_classifier", "efficient_classifier")
def efficient_classifier_base(args):
    """LRA ListOps-sized defaults scaled for CPU: 2 layers, d=128, 4 heads, mean pooling."""
    for name, value in (("encoder_layers", 2), ("encoder_embed_dim", 128), ("encoder_ffn_embed_dim", 256),
                        ("encoder_attention_heads", 4), ("dropout", 0.1), ("pooling", "mean"),
                        ("num_classes", 10), ("decoder_layers", 0)):
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    transformer_base_architecture(args)
