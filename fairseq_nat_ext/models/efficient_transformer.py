"""Arch ``efficient_transformer``: fairseq's Transformer (autoregressive) with an encoder whose
self-attention is any registered variant or a per-head mix (``--encoder-attention-type``).
With the default ``full`` it is exactly fairseq's ``transformer``."""

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel, base_architecture

from ..modules.attention import add_attention_args
from ..modules.efficient_encoder import EfficientTransformerEncoder


@register_model("efficient_transformer")
class EfficientTransformerModel(TransformerModel):
    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_attention_args(parser)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return EfficientTransformerEncoder(args, src_dict, embed_tokens)

    def length_limits(self):
        """Notes naming the options behind :meth:`max_positions` (for one-line data errors)."""
        return {"source": self.encoder.source_limit()[1],
                "target": f"--max-target-positions {self.decoder.max_positions()}"}


@register_model_architecture("efficient_transformer", "efficient_transformer")
def efficient_transformer_base(args):
    base_architecture(args)


@register_model_architecture("efficient_transformer", "efficient_transformer_small")
def efficient_transformer_small(args):
    """3+3 layers, d=256 (the size of the shared Multi30K teacher)."""
    for name, value in (("encoder_layers", 3), ("decoder_layers", 3), ("encoder_embed_dim", 256),
                        ("decoder_embed_dim", 256), ("encoder_ffn_embed_dim", 1024),
                        ("decoder_ffn_embed_dim", 1024), ("encoder_attention_heads", 4),
                        ("decoder_attention_heads", 4)):
        setattr(args, name, getattr(args, name, value))
    base_architecture(args)
