"""Task ``nat_translation``: fairseq's translation task for non-autoregressive models.

* The target dictionary gains a ``<mask>`` symbol (NAT decoders read masked targets); the CTC archs
  append ``<blank>`` themselves when they are built (``models/nat/ctc_nat.py``).
* During training and validation the model's own ``inject_noise`` builds the decoder input from the
  target (``sample["prev_target"]``): each arch owns its corruption (random masking for Mask-Predict).
* ``build_generator`` returns the generator named by the model (``model.generator_class``); fairseq's
  autoregressive models (e.g. the teacher) get fairseq's SequenceGenerator as in ``translation``.
* Bad data stops the run before anything is written, with one line naming the binarised file and the
  line of the text it came from: an empty sentence, a sentence of only ``<unk>``, source and target
  of different lengths, a pair longer than the model accepts (fairseq would skip long training pairs
  silently and print a traceback for long valid/test pairs; ``--skip-invalid-size-train`` and
  fairseq's ``--skip-invalid-size-inputs-valid-test`` restore the skipping).
  Generator options that fairseq's generation config lacks are fields of this task's config, read by
  the generator's ``configure(task_cfg)`` (``--insertion-decoding``, ``--npd-samples``, ...).
* ``--collapse-repeats``: ``inference_step`` (what fairseq-generate calls) collapses consecutive repeated
  tokens of every hypothesis (``generators/postprocess.py``), whatever the generator.
* ``--no-fast-decoding``: every plugin generator runs fairseq's forward instead of the CPU decoding route
  (``modules/fast_route.py``; also ``kermit``'s; library use: ``FAIRSEQ_NAT_EXT_NO_FAST_DECODING=1``).
* ``--fertility-path DIR`` (the fertility NAT): every split with a ``DIR/{split}.fert`` file
  (``fairseq_nat_ext/data/fertility.py``) is checked against the split (one value per source token,
  summing to the target length; one-line error naming file and line) and its batches carry
  ``sample["fertility"]``.  A train split without its file is an error; other splits without one
  (the test split: ``examples/fertility.sh`` makes train and valid only, decoding needs none) are
  loaded as usual, and only a loss that needs fertilities (``nat_fertility_loss``, e.g. validation
  during fairseq-train) stops, with one line naming the missing file (:meth:`missing_fertility`).
"""
import logging
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
from fairseq import utils
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..compat import InputError

logger = logging.getLogger(__name__)

MASK_SYMBOL = "<mask>"
#: CTC's blank; appended by the CTC archs (ctc_nat, imputer) when they are built, not by the task, so
#: other archs' dictionaries (and checkpoints) keep their size
BLANK_SYMBOL = "<blank>"


@dataclass
class NATTranslationConfig(TranslationConfig):
    insertion_decoding: str = field(
        default="parallel",
        metadata={"help": "Insertion Transformer decoding: parallel (every slot at once) or sequential "
                          "(greedy, one token per step)"},
    )
    skip_invalid_size_train: bool = field(
        default=False,
        metadata={"help": "skip training pairs longer than the model accepts (fairseq's translation "
                          "behaviour) instead of stopping with an error naming the first one"},
    )
    fertility_path: Optional[str] = field(
        default=None,
        metadata={"help": "directory of fertility files {split}.fert (one line per sentence, one value "
                          "per source token without </s>), made by examples/fertility.sh; needed to "
                          "train nat_fertility"},
    )
    npd_samples: int = field(
        default=1,
        metadata={"help": "nat_fertility decoding: noisy parallel decoding with the argmax fertilities "
                          "plus s-1 sampled ones, rescored by --npd-teacher (1 = argmax only)"},
    )
    npd_teacher: Optional[str] = field(
        default=None,
        metadata={"help": "autoregressive fairseq checkpoint that scores the noisy parallel decoding "
                          "candidates (one teacher-forced pass); needed when --npd-samples > 1"},
    )
    npd_rank: str = field(
        default="total",
        metadata={"help": "nat_fertility decoding: how a candidate's score adds up its token "
                          "log-probabilities, 'total' (the sum: the teacher's log p(y|x), as Gu et al. 2018 "
                          "rank noisy parallel decoding candidates) or 'mean' (length-normalised)"},
    )
    dag_decoder: str = field(
        default="lookahead",
        metadata={"help": "da_transformer decoding: greedy, lookahead, viterbi (joint Viterbi, Shao et al. "
                          "2022), beam or sample (rescored by --npd-teacher when given)"},
    )
    dag_viterbi_lenpen: float = field(
        default=1.0,
        metadata={"help": "da_transformer viterbi/beam/sample: the hypothesis of highest "
                          "log P(path, tokens) / M^alpha is returned (M: its tokens with <s> and </s>)"},
    )
    dag_beam_size: int = field(
        default=5, metadata={"help": "da_transformer --dag-decoder beam: hypotheses kept per step"},
    )
    dag_sample_size: int = field(
        default=8, metadata={"help": "da_transformer --dag-decoder sample: candidates per sentence (the "
                                     "lookahead output and s-1 sampled paths)"},
    )
    dag_topk: int = field(
        default=5, metadata={"help": "da_transformer beam/sample: tokens considered at each vertex"},
    )
    collapse_repeats: bool = field(
        default=False,
        metadata={"help": "remove consecutive repeated target tokens (BPE units) from every hypothesis, a "
                          "common last step of NAT decoding; hypothesis scores are kept"},
    )
    no_fast_decoding: bool = field(
        default=False,
        metadata={"help": "decode with fairseq's forward everywhere instead of the plugin's CPU decoding "
                          "route (the same hypotheses up to float rounding; for checking and profiling; "
                          "in fairseq-train: the Levenshtein and Insertion training passes on fairseq's "
                          "layers; library use: FAIRSEQ_NAT_EXT_NO_FAST_DECODING=1)"},
    )


def _indexed_tokens(ds):
    """(tokens, starts) of a fairseq MMapIndexedDataset as numpy arrays, or None for other kinds."""
    index = getattr(ds, "_index", None)
    buf = getattr(ds, "_bin_buffer", None)
    if index is None or buf is None or not hasattr(index, "pointers"):
        return None
    sizes = np.asarray(index.sizes, dtype=np.int64)
    tokens = np.frombuffer(buf, dtype=index.dtype, count=int(sizes.sum()), offset=0)
    return tokens, np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)


def bad_sentences(ds, eos, unk):
    """First index of (an empty sentence, a sentence of only <unk>) in a token dataset, or None.

    A binarised empty line is just ``</s>``; "only <unk>" means every token before ``</s>`` is unknown."""
    sizes = np.asarray(ds.sizes, dtype=np.int64)
    empty = np.flatnonzero(sizes <= 1)
    first_empty = int(empty[0]) if empty.size else None
    arrays = _indexed_tokens(ds)
    if arrays is not None:
        tokens, starts = arrays
        known = ((tokens != unk) & (tokens != eos)).astype(np.int64)
        n_known = np.add.reduceat(known, starts) if starts.size else np.zeros(0, np.int64)
        only_unk = np.flatnonzero((n_known == 0) & (sizes > 1))
        first_unk = int(only_unk[0]) if only_unk.size else None
    else:
        first_unk = None
        for i in range(len(ds)):
            t = ds[i]
            content = t[t.ne(eos)]
            if content.numel() > 0 and bool(content.eq(unk).all()):
                first_unk = i
                break
    return first_empty, first_unk


@register_task("nat_translation", dataclass=NATTranslationConfig)
class NATTranslationTask(TranslationTask):
    cfg: NATTranslationConfig

    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        from ..modules import fast_route

        # fairseq-train too: the packed training passes (Levenshtein, Insertion) follow the switch
        fast_route.set_enabled(not getattr(cfg, "no_fast_decoding", False))

    @classmethod
    def load_dictionary(cls, filename):
        if not os.path.exists(filename):
            raise InputError(
                f"nat_translation: dictionary {filename} not found (run fairseq-preprocess first)"
            )
        d = super().load_dictionary(filename)
        d.add_symbol(MASK_SYMBOL)
        return d

    def _split_prefixes(self, split, epoch):
        """Paths (without .bin/.idx) of the binarised source and target files of ``split``."""
        paths = utils.split_paths(self.cfg.data)
        if split != self.cfg.train_subset:
            paths = paths[:1]
        data_path = paths[(epoch - 1) % len(paths)]
        src, tgt = self.cfg.source_lang, self.cfg.target_lang
        pair = f"{src}-{tgt}"
        if not os.path.exists(os.path.join(data_path, f"{split}.{pair}.{src}.idx")) and os.path.exists(
                os.path.join(data_path, f"{split}.{tgt}-{src}.{src}.idx")):
            pair = f"{tgt}-{src}"
        return tuple(os.path.join(data_path, f"{split}.{pair}.{lang}") for lang in (src, tgt))

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        src_file, tgt_file = self._split_prefixes(split, epoch)
        try:
            super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        except AssertionError as err:
            # LanguagePairDataset asserts equal sizes without naming anything
            raise InputError(
                f"nat_translation: {src_file} and {tgt_file} differ in number of sentences "
                f"({err or 'source and target sizes differ'}); binarise both sides from parallel files"
            ) from None
        dataset = self.datasets[split]
        self._split_files = getattr(self, "_split_files", {})
        self._split_files[split] = (src_file, tgt_file)
        for side, ds, path, d in ((("source", dataset.src, src_file, self.src_dict),)
                                  + ((("target", dataset.tgt, tgt_file, self.tgt_dict),)
                                     if dataset.tgt is not None else ())):
            empty, only_unk = bad_sentences(ds, d.eos(), d.unk())
            problem = None
            if empty is not None and (only_unk is None or empty <= only_unk):
                problem = (empty, "empty sentence")
            elif only_unk is not None:
                problem = (only_unk, "only unknown tokens (<unk>): the text is not in the dictionary "
                                     f"{self.cfg.data}/dict.*.txt")
            if problem is not None:
                del self.datasets[split]
                raise InputError(f"nat_translation: {path} line {problem[0] + 1}: {problem[1]}")

        if self.cfg.fertility_path:
            self._attach_fertility(split)

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        limits = getattr(model, "length_limits", None)
        self._length_notes = getattr(self, "_length_notes", [])
        if limits is not None:
            self._length_notes.append(limits())
        return model

    def filter_indices_by_size(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
        """fairseq's filter, but a pair that does not fit is a one-line error naming file and line
        (in training too, unless --skip-invalid-size-train)."""
        indices, ignored = dataset.filter_indices_by_size(indices, max_positions)
        if len(ignored) == 0:
            return indices
        split = next((name for name, ds in self.datasets.items() if ds is dataset), None)
        if split == self.cfg.train_subset:
            ignore_invalid_inputs = self.cfg.skip_invalid_size_train
        if ignore_invalid_inputs:
            logger.warning(f"nat_translation: skipping {len(ignored):,} {split or 'input'} pairs longer than "
                           f"the model accepts (max_positions={max_positions}), e.g. ids {list(ignored[:10])}")
            return indices
        i = int(ignored[0])
        size = dataset.size(i)
        src_n, tgt_n = (size if isinstance(size, tuple) else (size, None))
        src_max, tgt_max = (max_positions if isinstance(max_positions, tuple) else (max_positions, None))
        files = getattr(self, "_split_files", {}).get(split, (None, None))
        notes = getattr(self, "_length_notes", [])
        if src_max is not None and src_n > src_max:
            where = f"{files[0]} line {i + 1}" if files[0] else f"input sentence {i}"
            why = "; ".join(n["source"] for n in notes if "source" in n) or f"--max-source-positions"
            msg = f"source of {src_n} tokens (with </s>) is longer than the model accepts ({src_max}: {why})"
        else:
            where = f"{files[1]} line {i + 1}" if files[1] else f"input sentence {i}"
            why = "; ".join(n["target"] for n in notes if "target" in n) or "--max-target-positions"
            msg = (f"target of {tgt_n} tokens (with </s>) is longer than the model can produce "
                   f"({tgt_max}: {why})")
        hint = ("--skip-invalid-size-train skips such training pairs" if split == self.cfg.train_subset
                else "--skip-invalid-size-inputs-valid-test skips them")
        raise InputError(f"nat_translation: {where}: {msg}; shorten or drop it ({hint})")

    def _attach_fertility(self, split):
        from ..data.fertility import check_fertility, fertility_file, read_fertility_file
        from ..data.fertility_dataset import FertilityDataset

        name = fertility_file(self.cfg.fertility_path, split)
        self._missing_fertility = getattr(self, "_missing_fertility", {})
        self._missing_fertility.pop(split, None)
        if not os.path.isfile(name):
            if split.startswith("train"):
                raise InputError(f"nat_translation: --fertility-path: {name} not found (make it with "
                                 "examples/fertility.sh)")
            logger.info("no fertility file %s: split %s is loaded without fertilities (decoding needs none)",
                        name, split)
            self._missing_fertility[split] = name
            return
        dataset = self.datasets[split]
        if getattr(dataset, "tgt_sizes", None) is None:
            logger.info("split %s has no target side: loaded without fertilities", split)
            return
        try:
            rows = read_fertility_file(name)
            check_fertility(rows, dataset.src_sizes - 1, dataset.tgt_sizes - 1, name)
        except ValueError as err:
            raise InputError(str(err)) from None
        self.datasets[split] = FertilityDataset(dataset, rows, name)

    def missing_fertility(self):
        """{split: the ``--fertility-path`` file it was loaded without}: the loaded splits that have no
        fertilities (read by ``nat_fertility_loss`` to name the file when a batch lacks them)."""
        return {k: v for k, v in getattr(self, "_missing_fertility", {}).items() if k in self.datasets}

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **unused):
        from ..modules import fast_route

        fast_route.set_enabled(not getattr(self.cfg, "no_fast_decoding", False))
        gen_cls = getattr(models[0], "generator_class", None)
        if gen_cls is None:
            return super().build_generator(
                models, args, seq_gen_cls=seq_gen_cls, extra_gen_cls_kwargs=extra_gen_cls_kwargs
            )
        for m in models[1:]:
            if getattr(m, "generator_class", None) is not gen_cls:
                raise InputError(
                    "nat_translation: --path ensembles must hold models of one arch; got "
                    + ", ".join(type(x).__name__ for x in models)
                )
        gen = gen_cls.from_generation_args(models, self.target_dictionary, args)
        if hasattr(gen, "configure"):
            gen.configure(self.cfg)  # generator options that live in the task's config
        return gen

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        from ..modules import fast_route

        with fast_route.decoding_call():  # the CPU route's guard: checked once per module in this call
            hypos = super().inference_step(generator, models, sample, prefix_tokens=prefix_tokens,
                                           constraints=constraints)
        if not getattr(self.cfg, "collapse_repeats", False):
            return hypos
        from ..generators.postprocess import collapse_all  # not at import: generators import this module

        return collapse_all(hypos)

    def _noisy(self, sample, model):
        noise = getattr(model, "inject_noise", None)
        if noise is not None:
            sample["prev_target"] = noise(sample["target"])
        return sample

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        model.train()
        model.set_num_updates(update_num)
        sample = self._noisy(sample, model)
        loss, sample_size, logging_output = criterion(model, sample)
        if ignore_grad:
            loss *= 0
        optimizer.backward(loss)
        return loss, sample_size, logging_output

    def valid_step(self, sample, model, criterion):
        model.eval()
        with torch.no_grad():
            sample = self._noisy(sample, model)
            loss, sample_size, logging_output = criterion(model, sample)
        return loss, sample_size, logging_output
