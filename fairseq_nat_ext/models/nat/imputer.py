"""Imputer (Chan et al., 2020; Saharia et al., 2020), arch ``imputer`` (+ ``imputer_small``, ``_tiny``).

The CTC model of ``ctc_nat.py`` whose decoder also reads a partially observed alignment: the input at
position t is the t-th upsampled encoder state plus the embedding of the observed symbol there (a
token, ``<blank>``, or ``<mask>`` when unobserved), and the decoder predicts every masked position.
It has exactly the parameters of ``ctc_nat`` (the alignment symbols use the shared embedding table), so
a trained CTC checkpoint initialises it directly (``--finetune-from-model ctc.pt``).

Training (one update):
1. the alignment: the best (Viterbi) CTC alignment of the target (``oracles/ctc_alignment.py``) under
   the model's own distribution from an all-``<mask>`` input (evaluation mode, no gradient), or
   under a trained CTC model's with ``--imputer-ctc-path`` (frozen, loaded at the first update);
2. block-wise masking: the alignment is cut into blocks of ``--imputer-train-block-size`` (B)
   positions; per sentence a count c ~ U{1..B} is drawn and c random positions of every block are
   masked -- the states block decoding with block size B passes through;
3. the loss (criterion ``imputer_loss``): by default -log of the sum, over the alignments that spell
   the target and agree with the observed positions, of the product of the model's probabilities at
   the masked positions (CTC over the lattice restricted by the observation); with
   ``--imputer-loss best_alignment``, cross-entropy on the Viterbi alignment's masked positions.
Infeasible pairs (target too long for the alignment) are filtered and counted, as for ``ctc_nat``.

Decoding (``generators/imputer.py``): block size B = ``--iter-decode-max-iter``; every step fills
the most confident masked position of every block, so decoding takes exactly B steps.
"""
import os
import weakref

import torch
from fairseq.models import register_model, register_model_architecture

from ...compat import InputError
from ...oracles.ctc_alignment import ctc_best_alignment, ctc_feasible
from .base import SMALL, TINY, arch_defaults
from .ctc_nat import CTCNATModel, ctc_nat_base


def block_mask(lengths, L, block, generator=None):
    """Block-wise training mask.  lengths (N,) alignment lengths, L >= max length, block B ->
    bool (N, L): per row a count c ~ U{1..B}; in every block of B positions (the last may be
    shorter), min(c, block length) positions chosen uniformly at random are True."""
    N, dev = lengths.numel(), lengths.device
    nb = -(-L // block)
    Lp = nb * block
    inside = torch.arange(Lp, device=dev).unsqueeze(0) < lengths.unsqueeze(1)
    scores = torch.rand((N, Lp), device=dev, generator=generator).masked_fill(~inside, 2.0)
    ranks = scores.view(N, nb, block).argsort(-1).argsort(-1)  # padding ranks last in its block
    count = torch.randint(1, block + 1, (N,), device=dev, generator=generator)
    masked = (ranks < count.view(N, 1, 1)).view(N, Lp) & inside
    return masked[:, :L]


@register_model("imputer")
class ImputerModel(CTCNATModel):
    @classmethod
    def build_model(cls, args, task):
        block = getattr(args, "imputer_train_block_size", None)
        if block is None or block < 1:
            raise InputError(f"imputer: --imputer-train-block-size must be >= 1, got {block}")
        model = super().build_model(args, task)
        # to load --imputer-ctc-path with the same dictionaries; a weak reference: not saved, and a
        # deepcopy of the model (--ema) does not copy the task
        model._task = weakref.ref(task)
        model._ctc_teacher = None
        return model

    @property
    def generator_class(self):
        from ...generators.imputer import ImputerGenerator

        return ImputerGenerator

    @staticmethod
    def add_args(parser):
        CTCNATModel.add_args(parser)
        parser.add_argument("--imputer-ctc-path", type=str, metavar="CKPT",
                            help="trained ctc_nat (or imputer) checkpoint whose Viterbi alignments "
                                 "the Imputer learns; default: the Imputer's own alignments")
        parser.add_argument("--imputer-train-block-size", type=int,
                            help="block size B of the training mask (c ~ U{1..B} masked per block), "
                                 "default 8")

    # ------------------------------------------------------------------------------------------
    def full_mask_input(self, lengths, L):
        """(B,) lengths -> (B, L) all ``<mask>`` inside each alignment, padding beyond."""
        pad = self.decoder.alignment_padding(lengths, L)
        return torch.full(pad.shape, self.mask_idx, dtype=torch.long, device=lengths.device).masked_fill(pad, self.pad)

    def alignment_lprobs(self, src_tokens, src_lengths):
        """The distribution over full alignments from the source alone (all-``<mask>`` input)."""
        enc = self.encoder(src_tokens, src_lengths=src_lengths)
        up = self.decoder.upsample(enc)
        inp = self.full_mask_input(up[1], up[0].size(1))
        return self.decoder(enc, alignment=inp, normalize=True, upsampled=up), up[1]

    def _ctc_source(self, device, dtype):
        """The model whose alignments are imputed: this one, or the --imputer-ctc-path checkpoint."""
        path = getattr(self.args, "imputer_ctc_path", None)
        if not path:
            return self
        if self._ctc_teacher is None:
            if not os.path.isfile(path):
                raise InputError(f"imputer: --imputer-ctc-path {path}: no such file")
            from fairseq import checkpoint_utils

            task = self._task()
            if task is None:
                raise RuntimeError("imputer: the task that built this model is gone; cannot load "
                                   "--imputer-ctc-path")
            models, _ = checkpoint_utils.load_model_ensemble([path], task=task)
            teacher = models[0]
            if not isinstance(teacher, CTCNATModel):
                raise InputError(f"imputer: --imputer-ctc-path {path} holds a {type(teacher).__name__}, "
                                 "not a ctc_nat or imputer model")
            if teacher.upsample_ratio != self.upsample_ratio:
                raise InputError(f"imputer: --imputer-ctc-path {path} has --upsample-ratio "
                                 f"{teacher.upsample_ratio}, this model {self.upsample_ratio}")
            for p in teacher.parameters():
                p.requires_grad_(False)
            self._ctc_teacher = [teacher.eval()]  # a list: not a submodule (not saved, not trained)
        teacher = self._ctc_teacher[0]
        return teacher.to(device=device, dtype=dtype).eval()

    @torch.no_grad()
    def impute_alignment(self, src_tokens, src_lengths, tgt, tgt_lengths):
        """The best alignment of every target under the alignment source, (B, L), padded."""
        p = next(self.parameters())
        source = self._ctc_source(p.device, p.dtype)
        was_training = self.training
        self.eval()  # no dropout in the alignment pass (a no-op for the frozen teacher)
        try:
            if isinstance(source, ImputerModel):
                lp, lengths = source.alignment_lprobs(src_tokens, src_lengths)
            else:
                enc = source.encoder(src_tokens, src_lengths=src_lengths)
                up = source.decoder.upsample(enc)
                lp, lengths = source.decoder(enc, normalize=True, upsampled=up), up[1]
        finally:
            self.train(was_training)
        alignment, _ = ctc_best_alignment(lp, lengths, tgt, tgt_lengths, self.blank_idx, pad=self.pad)
        return alignment

    def forward(self, src_tokens, src_lengths, prev_output_tokens, tgt_tokens, **kwargs):
        tgt, tgt_lengths = self.ctc_targets(tgt_tokens)
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths)
        upsampled = self.decoder.upsample(encoder_out)
        lengths, L = upsampled[1], upsampled[0].size(1)
        feasible = ctc_feasible(lengths, tgt, tgt_lengths)
        inside = ~self.decoder.alignment_padding(lengths, L)
        alignment = self.impute_alignment(src_tokens, src_lengths, tgt, tgt_lengths)
        # infeasible rows have no alignment: all blanks stand in (the criterion drops these rows)
        alignment = torch.where(feasible.unsqueeze(1) & inside, alignment,
                                torch.full_like(alignment, self.blank_idx)).masked_fill(~inside, self.pad)
        masked = block_mask(lengths, L, self.args.imputer_train_block_size)
        inp = alignment.masked_fill(masked, self.mask_idx)
        lprobs = self.decoder(encoder_out, alignment=inp, normalize=True, upsampled=upsampled)
        return {
            "imputer": {
                "ctc_lprobs": lprobs,
                "input_lengths": lengths,
                "targets": tgt,
                "target_lengths": tgt_lengths,
                "feasible": feasible,
                "blank": self.blank_idx,
                "alignment": alignment,
                "masked": masked,
                "factor": 1.0,
            }
        }


@register_model_architecture("imputer", "imputer")
def imputer_base(args):
    arch_defaults(args, imputer_ctc_path=None, imputer_train_block_size=8)
    ctc_nat_base(args)


@register_model_architecture("imputer", "imputer_small")
def imputer_small(args):
    arch_defaults(args, **SMALL)
    imputer_base(args)


@register_model_architecture("imputer", "imputer_tiny")
def imputer_tiny(args):
    arch_defaults(args, **TINY)
    imputer_base(args)
