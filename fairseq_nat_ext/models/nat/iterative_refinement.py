"""Deterministic non-autoregressive translation by iterative refinement (Lee et al., 2018), arch
``iterative_refinement`` (+ ``_small``, ``_tiny``); criterion ``iterative_refinement_loss``, generator
``generators/iterative_refinement.py``.

* Encoder: fairseq's Transformer encoder (attention registry); the target length is predicted from
  the mean-pooled encoder states (Mask-Predict's length classifier, ``--length-classes``,
  ``--pred-length-offset``).
* One non-causal Transformer decoder applied repeatedly.  Y0: its input is the source embeddings
  copied uniformly to the target length (:func:`uniform_copy_index`: output position t of T reads
  source token floor((t + 0.5) * n / T) of the n source tokens without ``</s>``).  Y(t+1): its input
  is the token embeddings of Y(t).  Every pass predicts every position.
* Training (``--train-refine-steps`` L passes): pass 0 from the copied source, pass l from the argmax
  output of pass l-1 (no gradient through it: the deterministic refinement loss) -- or, for each
  sentence with probability ``--dae-ratio``, from the corrupted reference (the denoising loss): each
  token replaced by a random one with ``--corrupt-replace``, replaced by its right neighbour with
  ``--corrupt-repeat``, swapped with it with ``--corrupt-swap`` (``models/nat/corruption.py``).  The
  loss is the mean over the L passes of each pass' cross-entropy against the reference, plus the
  length loss.  In evaluation mode (validation) no corruption is drawn.
* Decoding (``generators/iterative_refinement.py``) stops adaptively when a pass leaves its input unchanged, or
  after ``--iter-decode-max-iter`` passes.
"""
import torch
import torch.nn.functional as F
from fairseq.models import register_model, register_model_architecture

from ...compat import InputError
from ...modules import nat_decoder_inference as fast
from .base import SMALL, TINY, arch_defaults, nat_base_architecture
from .corruption import corrupt
from .ctc_nat import front_align
from .mask_predict import MaskPredictDecoder, MaskPredictModel, content_target


def uniform_copy_index(src_lengths, tgt_lengths, T):
    """src_lengths (B,) source tokens to copy from (>= 1), tgt_lengths (B,), width T -> long (B, T):
    the source index read by each output position (0 beyond a row's length)."""
    t = torch.arange(T, device=tgt_lengths.device).unsqueeze(0).float()
    n = src_lengths.unsqueeze(1).float()
    idx = ((t + 0.5) * n / tgt_lengths.clamp(min=1).unsqueeze(1).float()).floor().long()
    idx = torch.minimum(idx, (src_lengths - 1).unsqueeze(1))
    return idx.masked_fill(t.long() >= tgt_lengths.unsqueeze(1), 0)


class RefinementDecoder(MaskPredictDecoder):
    def copy_source(self, encoder_out, tgt_lengths, T):
        """Source embeddings copied uniformly to each target length -> (B, T, C)."""
        emb = encoder_out["encoder_embedding"][0]  # (B, S, C), left-padded, ends in </s>
        pad = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        emb, src_lengths = front_align(emb, pad)
        n = (src_lengths - 1).clamp(min=1)  # without </s> (unless it is all there is)
        idx = uniform_copy_index(n, tgt_lengths, T)
        return emb.gather(1, idx.unsqueeze(-1).expand(-1, -1, emb.size(-1)))

    def forward(self, prev_output_tokens, encoder_out, normalize=False, copy_source=False,
                features_only=False, cross=None, sent=None, select=None, glanced=None, **unused):
        """prev_output_tokens (B, T) right-padded (Y(t), or any non-pad placeholders with
        ``copy_source``) -> logits (B, T, V) (log-probs with ``normalize``, features with
        ``features_only``); with ``select`` (bool (B, T)) only at those positions: (K, ...) in
        row-major order.

        In eval mode without autograd the layers run through modules/nat_decoder_inference.py (the
        same maths); ``cross``: the cached cross-attention keys and values of the sentences
        (``cross_kv``) and ``sent`` (B,) the sentence of every row (decoding reads the keys and values
        of a sentence once for all its passes and length candidates); ``encoder_out`` then only
        serves ``copy_source`` (one entry per row).  ``glanced`` (B, T) long (glancing, the ``glat`` arch):
        reference tokens whose embeddings replace the input at their positions (``pad`` elsewhere)."""
        pad = prev_output_tokens.eq(self.padding_idx)
        if copy_source:
            x = self.copy_source(encoder_out, (~pad).sum(1), prev_output_tokens.size(1))
        else:
            x = self.embed_scale * self.embed_tokens(prev_output_tokens)
        if glanced is not None:
            x = torch.where(glanced.ne(self.padding_idx).unsqueeze(-1), self.embed_scale * self.embed_tokens(glanced), x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if self.embed_positions is not None:
            x = x + self.embed_positions(prev_output_tokens)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        self_pad = pad if bool(pad.any()) else None
        if not self.training and not torch.is_grad_enabled() and fast.supported(self):
            cross = cross if cross is not None else fast.cross_kv(self, encoder_out, checked=True)
            x = fast.decoder_features(self, x, self_pad, cross, sent, select=select)
        else:
            if cross is not None or sent is not None:
                raise ValueError("RefinementDecoder: cached keys/values (cross, sent) need eval mode "
                                 "without autograd and supported layers")
            x = self._layers(x, encoder_out, self_pad)
            x = x[select] if select is not None else x
        if features_only:
            return x
        out = self.output_layer(x)
        return F.log_softmax(out.float(), -1) if normalize else out

    def _layers(self, x, encoder_out, self_pad):
        """fairseq's layer loop on embedded input x (B, T, C) -> final states (B, T, C)."""
        x = self.dropout_module(x).transpose(0, 1)
        enc = encoder_out["encoder_out"][0]
        enc_pad = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        for layer in self.layers:
            x, _, _ = layer(x, enc, enc_pad, None, self_attn_mask=None, self_attn_padding_mask=self_pad)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x


def replacement_vocab(dictionary):
    """Ids a random replacement may draw: ordinary symbols (not the specials, ``<mask>``, ``<blank>``
    or fairseq's ``madeupword`` fillers)."""
    ids = [i for i in range(dictionary.nspecial, len(dictionary))
           if not (dictionary[i].startswith("<") and dictionary[i].endswith(">"))
           and not dictionary[i].startswith("madeupword")]
    if not ids:
        raise InputError("iterative_refinement: the dictionary has no ordinary symbol to draw")
    return torch.tensor(ids, dtype=torch.long)


@register_model("iterative_refinement")
class IterativeRefinementModel(MaskPredictModel):
    decoder_class = RefinementDecoder

    @property
    def generator_class(self):
        from ...generators.iterative_refinement import RefinementGenerator

        return RefinementGenerator

    @staticmethod
    def add_args(parser):
        MaskPredictModel.add_args(parser)
        parser.add_argument("--train-refine-steps", type=int,
                            help="decoder passes per training step (the first from the copied source), "
                                 "default 4")
        parser.add_argument("--dae-ratio", type=float,
                            help="probability (per sentence and refinement pass) that the pass reads the "
                                 "corrupted reference instead of the previous output, default 0.5")
        parser.add_argument("--corrupt-replace", type=float,
                            help="corruption: probability of replacing a token by a random one")
        parser.add_argument("--corrupt-repeat", type=float,
                            help="corruption: probability of replacing y_t by y_(t+1)")
        parser.add_argument("--corrupt-swap", type=float,
                            help="corruption: probability of swapping y_t and y_(t+1)")

    @classmethod
    def build_model(cls, args, task):
        steps = getattr(args, "train_refine_steps", 4)
        if steps is None or steps < 1:
            raise InputError(f"iterative_refinement: --train-refine-steps must be >= 1, got {steps}")
        for name in ("dae_ratio", "corrupt_replace", "corrupt_repeat", "corrupt_swap"):
            v = getattr(args, name, 0.0)
            if not 0.0 <= v <= 1.0:
                raise InputError(f"iterative_refinement: --{name.replace('_', '-')} must be in [0, 1], got {v}")
        model = super().build_model(args, task)
        model.replace_vocab = replacement_vocab(task.target_dictionary)
        return model

    def inject_noise(self, target):
        """The passes build their own inputs: the content target stands in for ``prev_target``."""
        return content_target(target, self.eos, self.pad)

    def corrupt(self, tgt, generator=None):
        """The denoising input: the content target (B, T) corrupted by the three noises."""
        a = self.args
        return corrupt(tgt, tgt.ne(self.pad), self.replace_vocab, a.corrupt_replace, a.corrupt_repeat,
                       a.corrupt_swap, generator)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, tgt_tokens, **kwargs):
        tgt = content_target(tgt_tokens, self.eos, self.pad)
        content = tgt.ne(self.pad)
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths)
        length_out = self.decoder.forward_length(encoder_out)
        length_tgt = self.decoder.length_to_class(content.sum(1), encoder_out)
        L = int(self.args.train_refine_steps)
        forbidden = torch.tensor([self.pad, self.bos, self.eos, self.mask_idx], device=tgt.device)
        out = {}
        inp = tgt.masked_fill(content, self.mask_idx)  # placeholders: pass 0 reads the copied source
        for step in range(L):
            logits = self.decoder(inp, encoder_out, copy_source=step == 0)
            out[f"word_ins_{step}"] = {"out": logits, "tgt": tgt, "mask": content, "factor": 1.0 / L}
            if step == L - 1:
                break
            with torch.no_grad():
                # out of place: .float() of a float32 tensor is the tensor itself, and writing -inf
                # into it made the loss of every pass but the last infinite
                lp = logits.detach().index_fill(-1, forbidden, float("-inf"))
                inp = lp.argmax(-1).masked_fill(~content, self.pad)
                if self.training and self.args.dae_ratio > 0:
                    rows = torch.rand(tgt.size(0), device=tgt.device) < self.args.dae_ratio
                    inp = torch.where(rows.unsqueeze(1), self.corrupt(tgt), inp)
        out["length"] = {"out": length_out, "tgt": length_tgt, "factor": self.decoder.length_loss_factor}
        return out


@register_model_architecture("iterative_refinement", "iterative_refinement")
def iterative_refinement_base(args):
    """The base size: 6+6 layers, d=512, 8 heads; 4 training passes, denoising half of the time."""
    nat_base_architecture(
        args,
        dropout=0.3, share_all_embeddings=True, length_loss_factor=0.1, length_classes=256,
        pred_length_offset=False, sg_length_pred=False, apply_bert_init=False,
        train_refine_steps=4, dae_ratio=0.5, corrupt_replace=0.1, corrupt_repeat=0.1, corrupt_swap=0.1,
        max_source_positions=256, max_target_positions=256,
    )


@register_model_architecture("iterative_refinement", "iterative_refinement_small")
def iterative_refinement_small(args):
    """Multi30K size, the same as the shared teacher: 3+3 layers, d=256, 4 heads, FFN 1024."""
    arch_defaults(args, **SMALL)
    iterative_refinement_base(args)


@register_model_architecture("iterative_refinement", "iterative_refinement_tiny")
def iterative_refinement_tiny(args):
    """For tests: 2+2 layers, d=128, 2 training passes."""
    arch_defaults(args, length_classes=128, train_refine_steps=2, **TINY)
    iterative_refinement_base(args)
