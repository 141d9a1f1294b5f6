"""Task ``nat_translation``: fairseq's translation task for non-autoregressive models.

* The target dictionary gains a ``<mask>`` symbol (NAT decoders read masked targets); the CTC archs
  append ``<blank>`` themselves when they are built (``models/nat/ctc_nat.py``).
* During training and validation the model's own ``inject_noise`` builds the decoder input from the
  target (``sample["prev_target"]``): each arch owns its corruption (random masking for Mask-Predict).
* ``build_generator`` returns the generator named by the model (``model.generator_class``); fairseq's
  autoregressive models (e.g. the teacher) get fairseq's SequenceGenerator as in ``translation``.
  Generator options that fairseq's generation config lacks are fields of this task's config, read by
  the generator's ``configure(task_cfg)`` (``--insertion-decoding``, ``--npd-samples``, ...).
* ``--fertility-path DIR`` (the fertility NAT): every split with a ``DIR/{split}.fert`` file
  (``fairseq_nat_ext/data/fertility.py``) is checked against the split (one value per source token,
  summing to the target length; one-line error naming file and line) and its batches carry
  ``sample["fertility"]``.  A train split without its file is an error; other splits without one
  (e.g. the test split at decoding time) are loaded as usual.
"""
import logging
import os
from dataclasses import dataclass, field
from typing import Optional

import torch
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


@register_task("nat_translation", dataclass=NATTranslationConfig)
class NATTranslationTask(TranslationTask):
    cfg: NATTranslationConfig

    @classmethod
    def load_dictionary(cls, filename):
        if not os.path.exists(filename):
            raise InputError(
                f"nat_translation: dictionary {filename} not found (run fairseq-preprocess first)"
            )
        d = super().load_dictionary(filename)
        d.add_symbol(MASK_SYMBOL)
        return d

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        try:
            super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        except AssertionError as err:
            # LanguagePairDataset asserts equal sizes without naming anything
            raise InputError(
                f"nat_translation: {split} split in {self.cfg.data}: source and target files "
                f"({self.cfg.source_lang}/{self.cfg.target_lang}) differ in number of lines ({err})"
            ) from None
        if self.cfg.fertility_path:
            self._attach_fertility(split)

    def _attach_fertility(self, split):
        from ..data.fertility import check_fertility, fertility_file, read_fertility_file
        from ..data.fertility_dataset import FertilityDataset

        name = fertility_file(self.cfg.fertility_path, split)
        if not os.path.isfile(name):
            if split.startswith("train"):
                raise InputError(f"nat_translation: --fertility-path: {name} not found (make it with "
                                 "examples/fertility.sh)")
            logger.info("no fertility file %s: split %s is loaded without fertilities", name, split)
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

    def get_batch_iterator(self, dataset, max_tokens=None, max_sentences=None, max_positions=None,
                           ignore_invalid_inputs=False, required_batch_size_multiple=1, **kwargs):
        # fairseq's batch_by_size drops the last batch of an evaluation split when its size is not a
        # multiple of --required-batch-size-multiple (default 8; fairseq issue #5036), so
        # fairseq-generate silently translates fewer sentences.  Outside training, use 1.
        if dataset is not self.datasets.get("train"):
            required_batch_size_multiple = 1
        return super().get_batch_iterator(
            dataset, max_tokens=max_tokens, max_sentences=max_sentences, max_positions=max_positions,
            ignore_invalid_inputs=ignore_invalid_inputs,
            required_batch_size_multiple=required_batch_size_multiple, **kwargs)

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **unused):
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
