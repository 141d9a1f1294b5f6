"""Task ``kermit``: one model for p(x, y), p(y|x), p(x|y), p(x), p(y) over a parallel corpus.

The data is a fairseq-preprocess'd language pair with a joined dictionary, read like ``translation``
(``-s en -t de``; fairseq also finds the en-de files for ``-s de -t en``, so both directions are
decoded from one data-bin).  The dictionary gains ``<mask>`` (insertion placeholders) and ``<gap>``
(cloze input).  Sources are right-padded: the model concatenates ``<s> x </s> y </s>``.  The x segment
is the language given by ``--source-lang`` at training (stored in the model as ``kermit_x_lang``).
``build_generator`` returns ``generators.kermit.KermitGenerator`` (``--kermit-generate``).
"""
from dataclasses import dataclass, field

from fairseq.tasks import register_task

from ..compat import InputError
from ..generators.kermit import GAP_SYMBOL, GENERATE_MODES, KermitGenerator
from .nat_translation import NATTranslationConfig, NATTranslationTask


@dataclass
class KermitConfig(NATTranslationConfig):
    left_pad_source: bool = field(default=False, metadata={"help": "kermit reads right-padded sources"})
    kermit_generate: str = field(
        default="translate",
        metadata={"help": "decoding: translate (source side given), joint (both sides from nothing), "
                          "marginal (target side alone), cloze (source line = partial target sentence "
                          "with <gap> marks; insert only into the gaps)"},
    )


@register_task("kermit", dataclass=KermitConfig)
class KermitTask(NATTranslationTask):
    cfg: KermitConfig

    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        if cfg.kermit_generate not in GENERATE_MODES:
            raise InputError(f"--kermit-generate: unknown mode '{cfg.kermit_generate}' "
                             f"(choose from {', '.join(GENERATE_MODES)})")

    @classmethod
    def load_dictionary(cls, filename):
        d = super().load_dictionary(filename)
        d.add_symbol(GAP_SYMBOL)
        return d

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if not hasattr(model, "slot_log_probs") or not hasattr(model, "max_canvas"):
            raise InputError(f"--task kermit needs --arch kermit*, got {type(model).__name__}")
        return model

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **unused):
        return KermitGenerator.from_generation_args(
            models, self.target_dictionary, args, self.cfg.source_lang, self.cfg.target_lang,
            self.cfg.kermit_generate)
