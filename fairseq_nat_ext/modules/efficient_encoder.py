"""fairseq Transformer encoders whose self-attention comes from the attention registry.

``--encoder-attention-type NAME`` (or ``mix`` with ``--encoder-attention-mix local:2,linear:2,...``)
picks the variant of every encoder layer; ``full`` keeps fairseq's own ``MultiheadAttention``, so an
unchanged command line builds exactly fairseq's encoder.  With ``--global-mode added`` the encoder
prepends ``--global-tokens`` learned vectors to every sequence (no positional embedding); the
``global`` heads treat them as the global tokens, and they are removed from ``encoder_out`` so the
output stays aligned with the source tokens.
"""

import torch
import torch.nn as nn
from fairseq.models.nat import FairseqNATEncoder
from fairseq.models.transformer import TransformerConfig, TransformerEncoder
from fairseq.modules import transformer_layer
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from . import encoder_inference
from .attention import EfficientSelfAttention, layer_options, options_from_args, parse_mix
from .attention.registry import POSITION_TIED_VARIANTS


class EfficientEncoderLayer(transformer_layer.TransformerEncoderLayerBase):
    def __init__(self, cfg, spec, opts, return_fc=False):
        self._attention_spec, self._attention_opts = spec, opts  # read by build_self_attention
        super().__init__(cfg, return_fc=return_fc)

    def build_self_attention(self, embed_dim, cfg):
        return EfficientSelfAttention(embed_dim, cfg.encoder.attention_heads, self._attention_spec,
                                      self._attention_opts, dropout=cfg.attention_dropout)


class EfficientEncoderMixin:
    """Mixed into a fairseq TransformerEncoder subclass (before it in the bases)."""

    def __init__(self, args, dictionary, embed_tokens, **kwargs):
        self.attention_spec = parse_mix(getattr(args, "encoder_attention_type", "full") or "full",
                                        getattr(args, "encoder_attention_mix", None),
                                        args.encoder_attention_heads)
        self.attention_opts = options_from_args(args)
        super().__init__(args, dictionary, embed_tokens, **kwargs)
        uses_global = any(name == "global" for name, _ in self.attention_spec)
        self.num_added_tokens = self.attention_opts.global_tokens if (
            uses_global and self.attention_opts.global_mode == "added") else 0
        if self.attention_opts.global_mode not in ("first", "added"):
            from fairseq_nat_ext.compat import InputError

            raise InputError(f"--global-mode must be 'first' or 'added', got '{self.attention_opts.global_mode}'")
        if self.num_added_tokens:
            self.added_tokens = nn.Parameter(torch.randn(self.num_added_tokens, embed_tokens.embedding_dim) * 0.02)

    def source_limit(self):
        """(longest source in tokens, the option that sets it): position-tied attention variants
        (linformer, synthesizers, ...) accept at most ``--max-positions`` tokens, added global tokens
        included, whatever ``--max-source-positions`` says."""
        n, why = super().max_positions(), f"--max-source-positions {self.max_source_positions}"
        tied = sorted({name for name, _ in self.attention_spec if name in POSITION_TIED_VARIANTS})
        if tied:
            m = self.attention_opts.max_positions - self.num_added_tokens
            if m < n:
                added = f" minus {self.num_added_tokens} added global tokens" if self.num_added_tokens else ""
                n, why = m, f"--max-positions {self.attention_opts.max_positions}{added} of {'/'.join(tied)} attention"
        return n, why

    def max_positions(self):
        return self.source_limit()[0]

    @property
    def uses_fairseq_attention(self):
        return self.attention_spec == [("full", self.attention_spec[0][1])]

    def build_encoder_layer(self, args):
        if self.uses_fairseq_attention:
            return super().build_encoder_layer(args)
        cfg = TransformerConfig.from_namespace(args)
        # fairseq builds the layers in order, one call each: the count is the layer's index (its seed)
        index = self._layers_built = getattr(self, "_layers_built", -1) + 1
        layer = EfficientEncoderLayer(cfg, self.attention_spec, layer_options(self.attention_opts, index),
                                      return_fc=self.return_fc)
        if cfg.checkpoint_activations:
            layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
        return layer

    def forward_scriptable(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False,
                           token_embeddings=None):
        # inside a generator's decoding scope: the same output through the decoding fast path
        out = encoder_inference.maybe_encode(self, src_tokens, src_lengths, return_all_hiddens, token_embeddings)
        if out is not None:
            return out
        if not self.num_added_tokens:
            return super().forward_scriptable(src_tokens, src_lengths, return_all_hiddens, token_embeddings)
        g = self.num_added_tokens
        B = src_tokens.size(0)
        pad = src_tokens.eq(self.padding_idx)
        x, embedding = self.forward_embedding(src_tokens, token_embeddings)
        x = x * (1 - pad.unsqueeze(-1).type_as(x))
        x = torch.cat([self.added_tokens.to(x.dtype).unsqueeze(0).expand(B, g, -1), x], dim=1)
        mask = torch.cat([pad.new_zeros(B, g), pad], dim=1)
        x = x.transpose(0, 1)
        states = [x[g:]] if return_all_hiddens else []
        for layer in self.layers:
            x = layer(x, encoder_padding_mask=mask)
            if isinstance(x, tuple):
                x = x[0]
            if return_all_hiddens:
                states.append(x[g:])
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        lengths = src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        return {"encoder_out": [x[g:]], "encoder_padding_mask": [pad], "encoder_embedding": [embedding],
                "encoder_states": states, "fc_results": [], "src_tokens": [], "src_lengths": [lengths]}


class EfficientTransformerEncoder(EfficientEncoderMixin, TransformerEncoder):
    """For autoregressive models (arch ``efficient_transformer``)."""


class EfficientNATEncoder(EfficientEncoderMixin, FairseqNATEncoder):
    """For our NAT models (keeps FairseqNATEncoder's ensemble support)."""
