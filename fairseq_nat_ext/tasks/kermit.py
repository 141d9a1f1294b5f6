"""Task ``kermit``: one model for p(x, y), p(y|x), p(x|y), p(x), p(y) over a parallel corpus.

The data is a fairseq-preprocess'd language pair with a joined dictionary, read like ``translation``
(``-s en -t de``; fairseq also finds the en-de files for ``-s de -t en``, so both directions are
decoded from one data-bin).  The dictionary gains ``<mask>`` (insertion placeholders) and ``<gap>``
(cloze input).  Sources are right-padded: the model concatenates ``<s> x </s> y </s>``.  The x segment
is the language given by ``--source-lang`` at training (stored in the model as ``kermit_x_lang``).
``build_generator`` returns ``generators.kermit.KermitGenerator`` (``--kermit-generate``).

Multilingual: ``--lang-pairs en-de,en-fr,de-fr`` over a data-bin that holds every pair with one
shared dictionary (``examples/prepare_multilingual.sh``).  Without ``-s/-t`` (training) every split
is read over all pairs, pair a-b as canvases ``<s> a </s> b </s>``, the batches carrying both
languages for the model's language embedding (``data/language_tagged.py``); with ``-s/-t``
(decoding) the one direction is read, its languages placed as in their pair.
"""
import os
from dataclasses import dataclass, field

from fairseq import utils
from fairseq.tasks import register_task

from ..compat import InputError
from ..data.language_tagged import LanguageTaggedDataset, MultiPairDataset
from ..models.nat.kermit import pair_languages, parse_lang_pairs
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
    kermit_temperature: float = field(
        default=0.0,
        metadata={"help": "0: every slot takes its argmax token; T > 0: samples from softmax(log p / T) "
                          "(unconditional generation; --seed fixes the draws)"},
    )
    lang_pairs: str = field(
        default="",
        metadata={"help": "multilingual: the language pairs of the data-bin, e.g. en-de,en-fr,de-fr (one "
                          "shared dictionary). Without -s/-t every split is read over all pairs (training); "
                          "with -s/-t the one direction (decoding, e.g. -s fr -t de)"},
    )


@register_task("kermit", dataclass=KermitConfig)
class KermitTask(NATTranslationTask):
    cfg: KermitConfig

    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        if cfg.kermit_generate not in GENERATE_MODES:
            raise InputError(f"--kermit-generate: unknown mode '{cfg.kermit_generate}' "
                             f"(choose from {', '.join(GENERATE_MODES)})")
        self.pairs = parse_lang_pairs(cfg.lang_pairs)
        self.langs = pair_languages(self.pairs)
        self.multi = bool(self.pairs) and cfg.source_lang is None
        if self.multi and getattr(cfg, "eval_bleu", False):
            raise InputError("kermit --lang-pairs without -s/-t trains on every pair: --eval-bleu needs one "
                             "direction (score the directions after training, e.g. examples/benchmark/multilingual.sh)")
        if self.multi and getattr(cfg, "fertility_path", None):
            raise InputError("kermit --lang-pairs: --fertility-path is for one language pair (nat_fertility)")
        if self.pairs and not self.multi:
            self.x_lang = self.pair_of(cfg.source_lang, cfg.target_lang)[0]

    def pair_of(self, src, tgt):
        """The --lang-pairs pair that holds the direction src-tgt (one-line error if none)."""
        for a, b in self.pairs:
            if {a, b} == {src, tgt}:
                return a, b
        raise InputError(f"kermit: -s {src} -t {tgt} is not a direction of --lang-pairs {self.cfg.lang_pairs}")

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        pairs = parse_lang_pairs(cfg.lang_pairs)
        if pairs and (cfg.source_lang is None) != (cfg.target_lang is None):
            raise InputError("kermit --lang-pairs: give both -s and -t (one direction) or neither (all pairs)")
        if not pairs or cfg.source_lang is not None:
            return super().setup_task(cfg, **kwargs)
        path = utils.split_paths(cfg.data)[0]
        files = [os.path.join(path, f"dict.{lang}.txt") for lang in pair_languages(pairs)]
        d = cls.load_dictionary(files[0])
        for f in files[1:]:
            if not os.path.exists(f):
                raise InputError(f"kermit --lang-pairs: dictionary {f} not found")
            with open(files[0], "rb") as a, open(f, "rb") as b:
                if a.read() != b.read():
                    raise InputError(f"kermit --lang-pairs: {f} differs from {files[0]}: the languages must "
                                     "share one dictionary (examples/prepare_multilingual.sh)")
        return cls(cfg, d, d)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        if not self.multi:
            return super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        parts = []
        try:
            for a, b in self.pairs:  # NATTranslationTask reads (and checks) one pair: -s a -t b
                self.cfg.source_lang, self.cfg.target_lang = a, b
                super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
                parts.append(LanguageTaggedDataset(self.datasets[split], self.langs.index(a), self.langs.index(b)))
        finally:
            self.cfg.source_lang = self.cfg.target_lang = None
        getattr(self, "_split_files", {}).pop(split, None)  # several files: errors name the sentence
        self.datasets[split] = MultiPairDataset(parts, shuffle=split != "test")

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
        if self.multi:
            raise InputError("kermit --lang-pairs: decoding needs one direction: give -s and -t")
        from ..modules import fast_route

        fast_route.set_enabled(not getattr(self.cfg, "no_fast_decoding", False))
        return KermitGenerator.from_generation_args(
            models, self.target_dictionary, args, self.cfg.source_lang, self.cfg.target_lang,
            self.cfg.kermit_generate, x_lang=getattr(self, "x_lang", None), temperature=self.cfg.kermit_temperature)
