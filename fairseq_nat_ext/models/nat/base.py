"""What every NAT model of the plugin shares: the encoder (fairseq's, with the attention registry),
fairseq's ``--apply-bert-init``, the ``<mask>`` index, and the model sizes of the archs."""

from fairseq.models.nat import FairseqNATModel

from ...modules.attention import add_attention_args
from ...modules.efficient_encoder import EfficientNATEncoder
from .edit_ops import random_delete, with_bos

#: arch sizes: ``small`` is the shared Multi30K teacher's size, ``tiny`` is for tests and the quick start
SMALL = dict(encoder_layers=3, decoder_layers=3, encoder_embed_dim=256, decoder_embed_dim=256,
             encoder_ffn_embed_dim=1024, decoder_ffn_embed_dim=1024, encoder_attention_heads=4,
             decoder_attention_heads=4)
TINY = dict(encoder_layers=2, decoder_layers=2, encoder_embed_dim=128, decoder_embed_dim=128,
            encoder_ffn_embed_dim=256, decoder_ffn_embed_dim=256, encoder_attention_heads=4,
            decoder_attention_heads=4, dropout=0.1, max_source_positions=128, max_target_positions=128)


def arch_defaults(args, **values):
    """Set every value the user did not give on the command line."""
    for k, v in values.items():
        setattr(args, k, getattr(args, k, v))


#: the base size of every NAT arch (the papers' 6+6 layers, d=512, 8 heads), shared embeddings
BASE = dict(encoder_embed_dim=512, encoder_ffn_embed_dim=2048, encoder_layers=6, encoder_attention_heads=8,
            decoder_layers=6, decoder_attention_heads=8, share_all_embeddings=True, apply_bert_init=False,
            max_source_positions=256, max_target_positions=256)


def nat_base_architecture(args, **values):
    """An arch's base defaults: ``values`` (the arch's own options, and any of :data:`BASE` it changes)
    over :data:`BASE`; the decoder's sizes follow the encoder's; then fairseq's Transformer defaults."""
    from fairseq.models.transformer import base_architecture as transformer_base_architecture

    arch_defaults(args, **{**BASE, **values})
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", args.encoder_embed_dim)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", args.encoder_ffn_embed_dim)
    args.share_decoder_input_output_embed = getattr(args, "share_decoder_input_output_embed", True)
    transformer_base_architecture(args)


def bert_init(args, module):
    """fairseq's --apply-bert-init (normal(0, 0.02) for linear layers and embeddings)."""
    if getattr(args, "apply_bert_init", False):
        from fairseq.modules.transformer_sentence_encoder import init_bert_params

        module.apply(init_bert_params)
    return module


class PluginNATModel(FairseqNATModel):
    """Subclasses set ``decoder_class`` and add their own options after ``PluginNATModel.add_args``."""

    decoder_class = None

    @staticmethod
    def add_args(parser):
        FairseqNATModel.add_args(parser)
        add_attention_args(parser)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return bert_init(args, EfficientNATEncoder(args, src_dict, embed_tokens))

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return bert_init(args, cls.decoder_class(args, tgt_dict, embed_tokens))

    @property
    def mask_idx(self):
        return self.decoder.mask_idx

    def set_num_updates(self, num_updates):
        """Kept on the model: glancing criteria (criterions/glancing.py) read it for their schedule."""
        self.num_updates = num_updates
        super().set_num_updates(num_updates)

    def target_limit(self):
        """(longest dataset target, ``</s>`` included, the model can produce; the option that sets it).
        Decoder sequences hold ``<s>`` ... ``</s>`` (edit models) or the content within
        max_positions - 2 (Mask-Predict's decoding), so one position goes to the special symbols."""
        n = self.decoder.max_positions()
        return n - 1, f"--max-target-positions {n}, one position kept for <s>"

    def max_positions(self):
        return self.encoder.max_positions(), self.target_limit()[0]

    def length_limits(self):
        """Notes naming the options behind :meth:`max_positions` (for one-line data errors)."""
        return {"source": self.encoder.source_limit()[1], "target": self.target_limit()[1]}


class EditNATModel(PluginNATModel):
    """Edit-based models (Levenshtein, Insertion): sequences are ``<s> ... </s>``, the first decoder
    input is the target with random deletions: ``--deletion-noise paper`` keeps k ~ U{0..n} of its n
    content tokens (Stern et al. 2019's canvas; a complete canvas is possible), ``fairseq`` keeps
    k ~ U{0..n-1} (fairseq's ``translation_lev`` random_delete: never the complete target)."""

    @staticmethod
    def add_args(parser):
        PluginNATModel.add_args(parser)
        parser.add_argument("--deletion-noise", choices=["paper", "fairseq"],
                            help="training canvases: keep k ~ U{0..n} of the target's n tokens (paper) or "
                                 "k ~ U{0..n-1} (fairseq's translation_lev, never the complete target)")

    @property
    def allow_length_beam(self):
        return False

    def inject_noise(self, target):
        """Dataset target -> y0 = ``<s>`` + target with random deletions (the first decoder input)."""
        complete = (getattr(self.args, "deletion_noise", None) or "paper") == "paper"
        return random_delete(with_bos(target, self.bos), self.pad, self.bos, self.eos, keep_complete=complete)
