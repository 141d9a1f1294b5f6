"""Glancing Transformer (GLAT, Qian et al., ACL 2021), arch ``glat`` (+ ``_small``, ``_tiny``); criterion
``glat_loss``, generator ``generators/glat.py``.

A vanilla one-pass NAT: fairseq's Transformer encoder (attention registry); the target length predicted
from the mean-pooled encoder states (Mask-Predict's length classifier, ``--length-classes``,
``--pred-length-offset``, ``--length-loss-factor``); a non-causal decoder whose input is the source
embeddings copied to the target length -- ``--glat-copy uniform`` (default: output position t of T reads
source token floor((t + 0.5) n / T) of the n tokens without ``</s>``) or ``soft`` (Wei et al. 2019's soft
copy: the softmax over source positions i of -|i - c_t| / ``--soft-copy-temperature``, c_t = (t + 0.5) n / T
- 0.5 the uniform copy's centre) -- plus positions.

Training (criterion ``glat_loss``, ``--glat-ratio-start/--glat-ratio-end``): the decoder first predicts
the reference-length output without gradient; d = its Hamming distance to the reference; round(ratio * d)
positions (wrong ones, ``models/nat/glancing.py``) get the reference tokens' embeddings as decoder input
and the label-smoothed cross-entropy is taken on the *other* positions, as the paper.  With ratio 0 it is
the vanilla NAT (every position predicted from the copied source).  Decoding: one pass (length beam
``--iter-decode-with-beam``, the candidate of best mean log-probability).
"""
import torch
from fairseq.models import register_model, register_model_architecture

from ...compat import InputError
from .base import SMALL, TINY, arch_defaults
from .ctc_nat import front_align
from .glancing import glanced_tokens, glancing_reveal
from .iterative_refinement import RefinementDecoder
from .mask_predict import MaskPredictModel, content_target, mask_predict_base


def soft_copy_weights(src_lengths, tgt_lengths, T, S, temperature):
    """src_lengths (B,) source tokens to copy from (>= 1, at the front of width S), tgt_lengths (B,), width
    T -> (B, T, S) weights: row t of sentence b is softmax_i(-|i - c_t| / temperature) over i < n_b, with
    c_t = (t + 0.5) n_b / T_b - 0.5 (zeros beyond the source; rows beyond T_b are those of T_b - 1)."""
    dev = tgt_lengths.device
    t = torch.arange(T, device=dev).view(1, T, 1).float()
    n = src_lengths.view(-1, 1, 1).float()
    centre = (t + 0.5) * n / tgt_lengths.clamp(min=1).view(-1, 1, 1).float() - 0.5
    i = torch.arange(S, device=dev).view(1, 1, S).float()
    score = -(i - centre).abs() / temperature
    score = score.masked_fill(i >= n, float("-inf"))
    return score.softmax(-1)


class GLATDecoder(RefinementDecoder):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.copy_mode = getattr(args, "glat_copy", "uniform") or "uniform"
        self.soft_copy_temperature = float(getattr(args, "soft_copy_temperature", 1.0) or 1.0)
        if self.copy_mode not in ("uniform", "soft"):
            raise InputError(f"glat: --glat-copy must be 'uniform' or 'soft', got '{self.copy_mode}'")
        if self.soft_copy_temperature <= 0:
            raise InputError(f"glat: --soft-copy-temperature must be > 0, got {self.soft_copy_temperature}")

    def copy_source(self, encoder_out, tgt_lengths, T):
        if self.copy_mode == "uniform":
            return super().copy_source(encoder_out, tgt_lengths, T)
        emb = encoder_out["encoder_embedding"][0]  # (B, S, C), left-padded, ends in </s>
        pad = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        emb, src_lengths = front_align(emb, pad)
        n = (src_lengths - 1).clamp(min=1)  # without </s> (unless it is all there is)
        w = soft_copy_weights(n, tgt_lengths, T, emb.size(1), self.soft_copy_temperature)
        return torch.bmm(w.to(emb.dtype), emb)


@register_model("glat")
class GLATModel(MaskPredictModel):
    decoder_class = GLATDecoder

    @property
    def generator_class(self):
        from ...generators.glat import GLATGenerator

        return GLATGenerator

    @staticmethod
    def add_args(parser):
        MaskPredictModel.add_args(parser)
        parser.add_argument("--glat-copy", choices=["uniform", "soft"],
                            help="decoder input: source embeddings copied uniformly (default) or softly")
        parser.add_argument("--soft-copy-temperature", type=float,
                            help="--glat-copy soft: temperature of the distance softmax, default 1")

    def inject_noise(self, target):
        """The decoder reads the copied source: the content target stands in for ``prev_target``."""
        return content_target(target, self.eos, self.pad)

    def forbidden(self, device):
        return torch.tensor([self.pad, self.bos, self.eos, self.mask_idx], device=device)

    @torch.no_grad()
    def glance(self, encoder_out, placeholders, tgt, content, ratio):
        """First pass without gradient; reveal round(ratio * d) of its wrong positions (d: Hamming distance
        to the reference) -> (glanced (B, T): the reference there, ``pad`` elsewhere; reveal bool (B, T))."""
        logits = self.decoder(placeholders, encoder_out, copy_source=True)
        pred = logits.index_fill(-1, self.forbidden(tgt.device), float("-inf")).argmax(-1)
        reveal = glancing_reveal(content & pred.ne(tgt), ratio)
        return glanced_tokens(tgt, reveal, self.pad), reveal

    def forward(self, src_tokens, src_lengths, prev_output_tokens, tgt_tokens, glat_ratio=None, **kwargs):
        tgt = content_target(tgt_tokens, self.eos, self.pad)
        content = tgt.ne(self.pad)
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths)
        length_out = self.decoder.forward_length(encoder_out)
        length_tgt = self.decoder.length_to_class(content.sum(1), encoder_out)
        placeholders = tgt.masked_fill(content, self.mask_idx)  # the decoder reads the copied source
        glanced, reveal = None, torch.zeros_like(content)
        if glat_ratio:
            glanced, reveal = self.glance(encoder_out, placeholders, tgt, content, float(glat_ratio))
        trained = content & ~reveal
        word_out = self.decoder(placeholders, encoder_out, copy_source=True, glanced=glanced, select=trained)
        word = {"out": word_out, "tgt": tgt[trained], "mask": None}
        if glanced is not None:
            word["glat_revealed"] = int(reveal.sum())
        return {
            "word_ins": word,
            "length": {"out": length_out, "tgt": length_tgt, "factor": self.decoder.length_loss_factor},
        }


@register_model_architecture("glat", "glat")
def glat_base(args):
    """The base size: 6+6 layers, d=512, 8 heads; uniform copy."""
    arch_defaults(args, glat_copy="uniform", soft_copy_temperature=1.0)
    mask_predict_base(args)


@register_model_architecture("glat", "glat_small")
def glat_small(args):
    """Multi30K size, the same as the shared teacher: 3+3 layers, d=256, 4 heads, FFN 1024."""
    arch_defaults(args, **SMALL)
    glat_base(args)


@register_model_architecture("glat", "glat_tiny")
def glat_tiny(args):
    """For tests and the quick start: 2+2 layers, d=128."""
    arch_defaults(args, length_classes=128, **TINY)
    glat_base(args)
