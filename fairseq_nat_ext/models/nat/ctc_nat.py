"""CTC non-autoregressive translation (Libovický & Helcl, 2018; Saharia et al., 2020), arch ``ctc_nat``
(+ ``ctc_nat_small``, ``ctc_nat_tiny``).

Encoder: fairseq's Transformer encoder (with the attention registry).  Upsampling: every encoder state
is mapped by one linear layer to ``--upsample-ratio`` (r) states, so a source of n tokens (``</s>``
included) gives an alignment of L = r * n positions; padding is moved behind the real states first
(fairseq left-pads sources), so alignment positions 0..L-1 are always the real ones.  Decoder: a
Transformer decoder without the causal mask whose input at position t is the t-th upsampled state
plus its position embedding; it attends to the encoder and predicts, per position, a token or
``<blank>``.  Loss: CTC (criterion ``ctc_nat_loss``).  Output: the collapsed alignment (merge repeats,
drop blanks; ``generators/ctc_nat.py``), no length prediction.  Glancing (GLAT+CTC): the criterion's
``--glat-ratio-start/--glat-ratio-end`` (:meth:`CTCNATModel.glance`); the CTC loss is then taken on the
whole target, as in the GLAT+CTC systems (CTC's marginal has no per-token positions to leave out).

``<blank>``: the model appends a ``<blank>`` symbol to the task's dictionaries when it is built (after
``<mask>``).  It is not added by the task for every NAT model, so the embeddings of existing
checkpoints of other archs keep their size; ``fairseq-train`` and ``fairseq-generate`` both build the
model through the task, so training and decoding see the same dictionary without any extra option.

Targets are the target *content* (the dataset's ``</s>`` is dropped); hypotheses get ``</s>`` back.
Training pairs whose target cannot fit in L positions (``L < S + adjacent repeats``) are filtered by
the criterion and counted (metric ``ctc_filtered``); decoding filters nothing.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.models import register_model, register_model_architecture
from fairseq.models.nat import FairseqNATDecoder

from ...compat import InputError
from ...modules import nat_decoder_inference as fast
from ...modules.vocab_projection import vocab_logits
from ...oracles.ctc_alignment import ctc_best_alignment, ctc_feasible
from ...tasks.nat_translation import BLANK_SYMBOL, MASK_SYMBOL
from .base import SMALL, TINY, PluginNATModel, arch_defaults, nat_base_architecture
from .glancing import glanced_tokens, glancing_reveal
from .mask_predict import content_target


def add_blank_symbol(task):
    """Append ``<blank>`` to the target dictionary (and to the source one when the two are joined,
    so ``--share-all-embeddings`` still sees one dictionary).  Idempotent."""
    src, tgt = getattr(task, "source_dictionary", None), task.target_dictionary
    joined = src is not None and src is not tgt and src == tgt
    tgt.add_symbol(BLANK_SYMBOL)
    if joined:
        src.add_symbol(BLANK_SYMBOL)


def front_align(states, pad_mask):
    """Move the real states of every row to the front, in order.

    states (B, n, C); pad_mask (B, n) True at padding, or None -> (states (B, n, C), lengths (B,))."""
    B, n, _ = states.shape
    if pad_mask is None:
        return states, torch.full((B,), n, dtype=torch.long, device=states.device)
    order = pad_mask.long().argsort(dim=1, stable=True)  # real positions first, original order kept
    states = states.gather(1, order.unsqueeze(-1).expand_as(states))
    return states, (~pad_mask).sum(1)


class CTCDecoder(FairseqNATDecoder):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.mask_idx = dictionary.index(MASK_SYMBOL)
        self.blank_idx = dictionary.index(BLANK_SYMBOL)
        name = getattr(args, "arch", "ctc_nat")
        if self.mask_idx == dictionary.unk():
            raise InputError(f"{name}: the target dictionary has no {MASK_SYMBOL}; use --task nat_translation")
        if self.blank_idx == dictionary.unk():
            raise InputError(f"{name}: the target dictionary has no {BLANK_SYMBOL}; build the model "
                             "with task.build_model (fairseq-train / fairseq-generate do)")
        ratio = getattr(args, "upsample_ratio", None)
        if ratio is None or int(ratio) != ratio or ratio < 1:
            raise InputError(f"{name}: --upsample-ratio must be an integer >= 1, got {ratio}")
        self.upsample_ratio = int(ratio)
        self.upsample_proj = nn.Linear(args.encoder_embed_dim, self.upsample_ratio * args.decoder_embed_dim)

    def upsample(self, encoder_out):
        """-> (states (B, L, C) with L = r * n, lengths (B,) = r * source lengths)."""
        enc = encoder_out["encoder_out"][0].transpose(0, 1)  # (B, n, C)
        pad = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        enc, src_lengths = front_align(enc, pad)
        B, n, _ = enc.shape
        up = self.upsample_proj(enc).view(B, n * self.upsample_ratio, -1)
        return up, src_lengths * self.upsample_ratio

    def alignment_padding(self, lengths, L):
        """(B,) lengths -> bool (B, L) True beyond each length."""
        return torch.arange(L, device=lengths.device).unsqueeze(0) >= lengths.unsqueeze(1)

    def forward(self, encoder_out, alignment=None, normalize=False, select=None, upsampled=None,
                cross=None, glanced=None, **unused):
        """-> per-position logits (B, L, V) (log-probs with ``normalize``).

        alignment (B, L): the observed alignment (tokens, ``<blank>``, ``<mask>``, padding) added to
        the upsampled states (the Imputer); None for plain CTC.  ``upsampled``: the result of
        :meth:`upsample` when the caller already has it.  With ``select`` (bool (B, L)) only the
        selected positions are projected to the vocabulary: (K, V) in row-major order.  ``cross``:
        see :meth:`features`.  ``glanced`` (B, L) long: glancing -- the symbols (tokens or ``<blank>``) whose
        embeddings replace the upsampled state at the revealed positions (``pad`` elsewhere)."""
        x = self.features(encoder_out, alignment=alignment, select=select, upsampled=upsampled, cross=cross,
                          glanced=glanced)
        out = vocab_logits(self, x)
        return F.log_softmax(out.float(), -1) if normalize else out

    def features(self, encoder_out, alignment=None, select=None, upsampled=None, cross=None, glanced=None):
        """The decoder's final states (B, L, C), or (K, C) at the ``select``ed positions in row-major
        order (arguments as :meth:`forward`'s).

        In eval mode without autograd the layers run through modules/nat_decoder_inference.py (the
        same maths; the last feed-forward block only at ``select``); ``cross``: its cached
        cross-attention keys and values of these sentences (``cross_kv``), computed here when None."""
        states, lengths = upsampled if upsampled is not None else self.upsample(encoder_out)
        B, L, _ = states.shape
        if self.embed_positions is not None and L > self.embed_positions.max_positions:
            raise InputError(f"ctc_nat: {L} upsampled positions exceed the decoder's "
                             f"{self.embed_positions.max_positions} positions (--max-target-positions)")
        pad_mask = self.alignment_padding(lengths, L)
        x = states
        if alignment is not None:
            x = x + self.embed_scale * self.embed_tokens(alignment)
        if glanced is not None:
            reveal = glanced.ne(self.padding_idx).unsqueeze(-1)
            x = torch.where(reveal, self.embed_scale * self.embed_tokens(glanced), x)
        if self.embed_positions is not None:
            dummy = pad_mask.long() * self.padding_idx + (~pad_mask).long() * self.dictionary.unk()
            x = x + self.embed_positions(dummy)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        self_pad = pad_mask if bool(pad_mask.any()) else None
        if not self.training and not torch.is_grad_enabled() and fast.supported(self):
            cross = cross if cross is not None else fast.cross_kv(self, encoder_out, checked=True)
            return fast.decoder_features(self, x, self_pad, cross, select=select)
        x = self.dropout_module(x).transpose(0, 1)  # (L, B, C)
        enc = encoder_out["encoder_out"][0]
        enc_pad = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        for layer in self.layers:
            x, _, _ = layer(x, enc, enc_pad, None, self_attn_mask=None, self_attn_padding_mask=self_pad)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x[select] if select is not None else x


@register_model("ctc_nat")
class CTCNATModel(PluginNATModel):
    decoder_class = CTCDecoder

    @classmethod
    def build_model(cls, args, task):
        add_blank_symbol(task)
        return super().build_model(args, task)

    @property
    def generator_class(self):
        from ...generators.ctc_nat import CTCGenerator

        return CTCGenerator

    @property
    def blank_idx(self):
        return self.decoder.blank_idx

    @property
    def upsample_ratio(self):
        return self.decoder.upsample_ratio

    @staticmethod
    def add_args(parser):
        PluginNATModel.add_args(parser)
        parser.add_argument("--upsample-ratio", type=int,
                            help="alignment positions per source token (encoder state), default 2")

    def inject_noise(self, target):
        """CTC reads no decoder input: the content target stands in for it (``prev_target``)."""
        return content_target(target, self.eos, self.pad)

    def ctc_targets(self, tgt_tokens):
        """Dataset target (B, T) with </s> -> (content (B, T) right-padded, lengths (B,))."""
        tgt = content_target(tgt_tokens, self.eos, self.pad)
        return tgt, tgt.ne(self.pad).sum(1)

    @torch.no_grad()
    def glance(self, encoder_out, upsampled, tgt, tgt_lengths, ratio):
        """GLAT over the best CTC alignment (as the GLAT+CTC systems): a first pass without gradient,
        the best alignment A of the target under it (Viterbi), d = the positions where the pass' argmax
        differs from A; round(ratio * d) of them (random) are revealed: their input becomes the
        embedding of A's symbol there (a token or ``<blank>``).  Infeasible pairs reveal nothing.
        -> (glanced (B, L): A at the revealed positions, ``pad`` elsewhere; number revealed)."""
        lprobs = self.decoder(encoder_out, normalize=True, upsampled=upsampled)
        lengths = upsampled[1]
        align, score = ctc_best_alignment(lprobs, lengths, tgt, tgt_lengths, self.blank_idx, pad=self.pad)
        ok = ctc_feasible(lengths, tgt, tgt_lengths) & torch.isfinite(score)
        inside = torch.arange(lprobs.size(1), device=tgt.device).unsqueeze(0) < lengths.unsqueeze(1)
        wrong = inside & ok.unsqueeze(1) & lprobs.argmax(-1).ne(align)
        reveal = glancing_reveal(wrong, ratio)
        return glanced_tokens(align, reveal, self.pad), int(reveal.sum())

    def forward(self, src_tokens, src_lengths, prev_output_tokens, tgt_tokens, glat_ratio=None, **kwargs):
        tgt, tgt_lengths = self.ctc_targets(tgt_tokens)
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths)
        upsampled = self.decoder.upsample(encoder_out)
        lengths = upsampled[1]
        glanced, revealed = None, None
        if glat_ratio:
            glanced, revealed = self.glance(encoder_out, upsampled, tgt, tgt_lengths, float(glat_ratio))
        lprobs = self.decoder(encoder_out, normalize=True, upsampled=upsampled, glanced=glanced)
        out = {
            "ctc": {
                "ctc_lprobs": lprobs,  # (B, L, V) float32 log-probs
                "input_lengths": lengths,
                "targets": tgt,
                "target_lengths": tgt_lengths,
                "feasible": ctc_feasible(lengths, tgt, tgt_lengths),
                "blank": self.blank_idx,
                "factor": 1.0,
            }
        }
        if revealed is not None:
            out["ctc"]["glat_revealed"] = revealed
        return out


@register_model_architecture("ctc_nat", "ctc_nat")
def ctc_nat_base(args):
    """The base size: 6+6 layers, d=512, 8 heads; upsample ratio 2."""
    nat_base_architecture(
        args,
        dropout=0.3, share_all_embeddings=True, upsample_ratio=2, apply_bert_init=False,
        max_source_positions=256, max_target_positions=256,
    )


@register_model_architecture("ctc_nat", "ctc_nat_small")
def ctc_nat_small(args):
    """Multi30K size, the same as the shared teacher: 3+3 layers, d=256, 4 heads, FFN 1024."""
    arch_defaults(args, **SMALL)
    ctc_nat_base(args)


@register_model_architecture("ctc_nat", "ctc_nat_tiny")
def ctc_nat_tiny(args):
    """For tests and the quick start: 2+2 layers, d=128."""
    arch_defaults(args, **TINY)
    ctc_nat_base(args)
