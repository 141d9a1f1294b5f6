"""Task ``listops``: classify a ListOps sequence (Long Range Arena) into its value 0-9.

``DATA`` is a directory written by ``python -m fairseq_nat_ext.data.listops`` holding
``{split}.src`` (tokens) and ``{split}.label`` (0-9); no fairseq-preprocess step is needed: the
vocabulary is fixed.  Every sequence starts with ``<s>`` (the CLS position for ``--pooling cls``).
Bad input is a one-line error naming file and line (unknown token, empty line, label out of range,
different line counts, a sequence longer than ``--max-positions``).
"""

import logging
import os
from dataclasses import dataclass, field

import numpy as np
import torch
from fairseq.data import Dictionary, FairseqDataset, data_utils
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import FairseqTask, register_task

from ..compat import InputError

logger = logging.getLogger(__name__)

NUM_CLASSES = 10


def _read_lines(path):
    """Lines of a UTF-8 text file; a bad byte is a one-line error naming the file and line."""
    with open(path, "rb") as f:
        raw = f.read().splitlines()
    out = []
    for i, line in enumerate(raw, 1):
        try:
            out.append(line.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise InputError(f"listops: {path}:{i}: not valid UTF-8 (byte 0x{line[e.start]:02x} at byte "
                             f"{e.start + 1})") from None
    return out


def listops_dictionary() -> Dictionary:
    # imported here, not at the top: the package imports this task, and a module imported before
    # `python -m fairseq_nat_ext.data.listops` runs it makes runpy warn (RuntimeWarning ... in sys.modules)
    from ..data.listops import OPERATORS

    d = Dictionary()
    for tok in [str(i) for i in range(10)] + ["[" + op for op in OPERATORS] + list(OPERATORS) + ["]"]:
        d.add_symbol(tok)
    return d


class ListOpsDataset(FairseqDataset):
    def __init__(self, tokens, labels, dictionary):
        self.tokens, self.labels, self.dict = tokens, labels, dictionary
        self.sizes = np.array([len(t) for t in tokens], dtype=np.int64)

    def __getitem__(self, index):
        return {"id": index, "source": self.tokens[index], "target": self.labels[index]}

    def __len__(self):
        return len(self.tokens)

    def collater(self, samples):
        if not samples:
            return {}
        src = data_utils.collate_tokens([s["source"] for s in samples], self.dict.pad(), left_pad=False)
        return {
            "id": torch.tensor([s["id"] for s in samples]),
            "nsentences": len(samples),
            "ntokens": sum(len(s["source"]) for s in samples),
            "net_input": {"src_tokens": src,
                          "src_lengths": torch.tensor([len(s["source"]) for s in samples])},
            "target": torch.tensor([s["target"] for s in samples]),
        }

    def num_tokens(self, index):
        return int(self.sizes[index])

    def size(self, index):
        return int(self.sizes[index])

    def ordered_indices(self):
        return np.argsort(self.sizes, kind="mergesort")


@dataclass
class ListOpsConfig(FairseqDataclass):
    data: str = field(default="", metadata={"help": "directory with {split}.src and {split}.label"})
    max_positions: int = field(default=2048, metadata={"help": "longest sequence (tokens, with <s>)"})


@register_task("listops", dataclass=ListOpsConfig)
class ListOpsTask(FairseqTask):
    def __init__(self, cfg, dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        if not cfg.data or not os.path.isdir(cfg.data):
            raise InputError(f"listops: data directory '{cfg.data}' not found "
                             "(write one with python -m fairseq_nat_ext.data.listops --out DIR)")
        return cls(cfg, listops_dictionary())

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        src_path = os.path.join(self.cfg.data, f"{split}.src")
        lab_path = os.path.join(self.cfg.data, f"{split}.label")
        for path in (src_path, lab_path):
            if not os.path.exists(path):
                raise InputError(f"listops: {path} not found")
        lines, labels_raw = _read_lines(src_path), _read_lines(lab_path)
        if len(lines) != len(labels_raw):
            raise InputError(f"listops: {src_path} has {len(lines)} lines but {lab_path} has {len(labels_raw)}")
        unk = self.dictionary.unk()
        tokens, labels = [], []
        for i, (line, lab) in enumerate(zip(lines, labels_raw), 1):
            words = line.split()
            if not words:
                raise InputError(f"listops: {src_path}:{i}: empty line")
            ids = [self.dictionary.bos()] + [self.dictionary.index(w) for w in words]
            if unk in ids:
                bad = next(w for w in words if self.dictionary.index(w) == unk)
                raise InputError(f"listops: {src_path}:{i}: unknown token '{bad}'")
            if len(ids) > self.cfg.max_positions:
                raise InputError(f"listops: {src_path}:{i}: {len(ids)} tokens (with <s>) exceed "
                                 f"--max-positions {self.cfg.max_positions}")
            if not lab.strip().isdigit() or not 0 <= int(lab) < NUM_CLASSES:
                raise InputError(f"listops: {lab_path}:{i}: label '{lab}' is not 0-9")
            tokens.append(torch.tensor(ids, dtype=torch.long))
            labels.append(int(lab))
        self.datasets[split] = ListOpsDataset(tokens, labels, self.dictionary)
        logger.info(f"listops {split}: {len(tokens)} sequences from {src_path}")

    def max_positions(self):
        return self.cfg.max_positions

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary
