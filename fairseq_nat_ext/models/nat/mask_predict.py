"""Mask-Predict (Ghazvininejad et al., 2019): a conditional masked language model.

Encoder: fairseq's Transformer encoder.  Length: a classifier over mean-pooled encoder states that
predicts the target length (or, with ``--pred-length-offset``, its offset from the source length).
Decoder: a Transformer decoder without the causal mask that reads the target with some tokens
replaced by ``<mask>`` and predicts every masked token at once.

Target convention: the decoder works on the target *content* (the dataset's final ``</s>`` is
dropped), so ``length == number of content tokens``; hypotheses get ``</s>`` back at the end.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.models import register_model, register_model_architecture
from fairseq.models.nat import FairseqNATDecoder

from ...modules.vocab_projection import vocab_logits
from ...tasks.nat_translation import MASK_SYMBOL
from .base import SMALL, TINY, PluginNATModel, arch_defaults, nat_base_architecture


def mean_pool(enc, pad_mask):
    """enc: (T, B, C) encoder states; pad_mask: (B, T) True at padding, or None -> (B, C)."""
    if pad_mask is None:
        return enc.mean(0)
    keep = (~pad_mask).transpose(0, 1).unsqueeze(-1).type_as(enc)  # (T, B, 1)
    return (enc * keep).sum(0) / keep.sum(0).clamp(min=1)


def content_target(target, eos, pad):
    """(B, T) dataset target ending in </s> -> the content tokens, </s> replaced by padding."""
    return target.masked_fill(target.eq(eos), pad)


def random_mask(tgt, pad, mask_idx, generator=None):
    """CMLM training noise: per sentence draw k ~ U{1..len} and mask k random content positions.

    tgt: (B, T) content tokens with right padding.  Returns the decoder input (B, T)."""
    nonpad = tgt.ne(pad)
    lengths = nonpad.sum(1)  # (B,)
    scores = torch.rand(tgt.shape, device=tgt.device, generator=generator)
    scores = scores.masked_fill(~nonpad, 2.0)  # padding sorts last
    ranks = scores.argsort(1).argsort(1)  # rank of each position among its row
    u = torch.rand(lengths.shape, device=tgt.device, generator=generator)
    k = (u * lengths.float()).long() + 1  # 1..len
    k = torch.minimum(k, lengths)
    masked = ranks < k.unsqueeze(1)
    return tgt.masked_fill(masked & nonpad, mask_idx)


class MaskPredictDecoder(FairseqNATDecoder):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.mask_idx = dictionary.index(MASK_SYMBOL)
        if self.mask_idx == dictionary.unk():
            raise ValueError(
                f"mask_predict: the target dictionary has no {MASK_SYMBOL} symbol; "
                "use --task nat_translation"
            )
        self.length_classes = args.length_classes
        self.pred_length_offset = args.pred_length_offset
        self.sg_length_pred = args.sg_length_pred
        self.length_loss_factor = args.length_loss_factor
        self.length_proj = nn.Linear(args.encoder_embed_dim, self.length_classes)

    # -- length -----------------------------------------------------------------------------
    @staticmethod
    def _src_lengths(encoder_out):
        enc = encoder_out["encoder_out"][0]
        if len(encoder_out["encoder_padding_mask"]) > 0:
            return (~encoder_out["encoder_padding_mask"][0]).sum(1)
        return enc.new_full((enc.size(1),), enc.size(0), dtype=torch.long)

    def forward_length(self, encoder_out, normalize=False):
        """-> (B, length_classes) logits (or log-probs)."""
        enc = encoder_out["encoder_out"][0]
        pad = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        feats = mean_pool(enc, pad)
        if self.sg_length_pred:
            feats = feats.detach()
        out = self.length_proj(feats)
        return F.log_softmax(out, -1) if normalize else out

    def length_to_class(self, lengths, encoder_out):
        if self.pred_length_offset:
            lengths = lengths - self._src_lengths(encoder_out) + self.length_classes // 2
        return lengths.clamp(0, self.length_classes - 1)

    def class_to_length(self, classes, encoder_out):
        """classes: (B, k) -> lengths (B, k)."""
        if self.pred_length_offset:
            classes = classes + self._src_lengths(encoder_out).unsqueeze(1) - self.length_classes // 2
        return classes

    # -- tokens -----------------------------------------------------------------------------
    def forward(self, prev_output_tokens, encoder_out, normalize=False, select=None, **unused):
        """prev_output_tokens: (B, T) content with <mask>s -> (B, T, V) logits (or log-probs).

        With ``select`` (bool (B, T)) only the selected positions are projected to the vocabulary:
        (K, V) for the K selected positions, in row-major order (decoding needs only masked ones)."""
        feats, _ = self.extract_features(
            prev_output_tokens, encoder_out=encoder_out, full_context_alignment=True
        )
        if select is not None:
            feats = feats[select]
        out = vocab_logits(self, feats)
        return F.log_softmax(out, -1) if normalize else out


@register_model("mask_predict")
class MaskPredictModel(PluginNATModel):
    decoder_class = MaskPredictDecoder

    @property
    def generator_class(self):
        from ...generators.mask_predict import MaskPredictGenerator

        return MaskPredictGenerator

    @property
    def allow_length_beam(self):
        return True

    def target_limit(self):
        """Length classes 0..C-1 hold the content length: a target (with </s>) of more than C tokens
        has no class (without --pred-length-offset, whose range depends on the source)."""
        n, why = super().target_limit()
        c = self.decoder.length_classes
        if not self.decoder.pred_length_offset and c < n:
            n, why = c, f"--length-classes {c}: content lengths 0..{c - 1}"
        return n, why

    @staticmethod
    def add_args(parser):
        PluginNATModel.add_args(parser)
        parser.add_argument("--length-loss-factor", type=float,
                            help="weight of the length-prediction loss")
        parser.add_argument("--length-classes", type=int,
                            help="number of length classes (max length, or offset range)")
        parser.add_argument("--pred-length-offset", action="store_true",
                            help="predict target length minus source length instead of the length")
        parser.add_argument("--sg-length-pred", action="store_true",
                            help="stop gradients from the length loss into the encoder")


    def inject_noise(self, target):
        """Dataset target (B, T) with </s> -> decoder input with random <mask>s."""
        tgt = content_target(target, self.eos, self.pad)
        return random_mask(tgt, self.pad, self.mask_idx)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, tgt_tokens, **kwargs):
        tgt = content_target(tgt_tokens, self.eos, self.pad)
        if prev_output_tokens.size(1) != tgt.size(1):
            raise ValueError(
                "mask_predict: decoder input and target differ in length; build the input with "
                "model.inject_noise (task nat_translation does)"
            )
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths)
        length_out = self.decoder.forward_length(encoder_out)
        length_tgt = self.decoder.length_to_class(tgt.ne(self.pad).sum(1), encoder_out)
        masked = prev_output_tokens.eq(self.mask_idx)
        # the loss reads masked positions only: project just those to the vocabulary
        word_out = self.decoder(prev_output_tokens, encoder_out, select=masked)
        return {
            "word_ins": {
                "out": word_out,
                "tgt": tgt[masked],
                "mask": None,
            },
            "length": {
                "out": length_out,
                "tgt": length_tgt,
                "factor": self.decoder.length_loss_factor,
            },
        }


@register_model_architecture("mask_predict", "mask_predict")
def mask_predict_base(args):
    """The paper's base size: 6+6 layers, d=512, 8 heads."""
    nat_base_architecture(
        args,
        dropout=0.3, share_all_embeddings=True, length_loss_factor=0.1, length_classes=256,
        pred_length_offset=False, sg_length_pred=False, apply_bert_init=False,
        max_source_positions=256, max_target_positions=256,
    )


@register_model_architecture("mask_predict", "mask_predict_small")
def mask_predict_small(args):
    """Multi30K size, the same as the shared teacher: 3+3 layers, d=256, 4 heads, FFN 1024."""
    arch_defaults(args, **SMALL)
    mask_predict_base(args)


@register_model_architecture("mask_predict", "mask_predict_tiny")
def mask_predict_tiny(args):
    """For tests and the quick start: 2+2 layers, d=128."""
    arch_defaults(args, length_classes=128, **TINY)
    mask_predict_base(args)
