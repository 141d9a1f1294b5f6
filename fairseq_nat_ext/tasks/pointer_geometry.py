"""Task ``pointer_geometry``: convex hull, Delaunay triangulation or TSP with pointer networks.

``DATA`` is a directory holding ``{split}.txt`` files in the published text format
(:mod:`fairseq_nat_ext.data.pointer_format`; write them with ``python -m
fairseq_nat_ext.data.pointer_geometry``).  No ``fairseq-preprocess`` step: the files are read as they
are, ``--gen-subset test_n50`` reads ``test_n50.txt``.

fairseq-generate treats ``src_tokens``, targets and hypotheses as dictionary ids, so they are ids of a
small position dictionary whose symbols are ``1 .. --max-points`` (what fairseq-generate prints is
the published 1-based output) and ``</s>`` ends a sequence.  The coordinates travel in the extra
``net_input`` field ``src_coords`` (B, N, 2).  The model works on *slots*: slot 0 is the end position
(``</s>``), slot i >= 1 is point i; ``net_input["prev_output_slots"]`` (B, T) is the decoder input
(0 = start, then the target shifted right) and ``sample["target_slots"]`` the target (-1 = padding).
Everything is padded on the right.
"""
import logging
import os
from dataclasses import dataclass, field

import numpy as np
import torch
from omegaconf import II
from fairseq import utils
from fairseq.data import Dictionary, FairseqDataset
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.tasks import FairseqTask, register_task

from ..compat import InputError
from ..data.pointer_augment import augment_example, parse_augment
from ..data.pointer_format import PROBLEMS, read_pointer_file

logger = logging.getLogger(__name__)

TARGET_PAD_SLOT = -1


def position_dictionary(max_points):
    """Symbols ``1 .. max_points``: the id of point p (1-based) is ``p + nspecial - 1``."""
    d = Dictionary()
    for p in range(1, max_points + 1):
        d.add_symbol(str(p))
    return d


def slot_offset(dictionary):
    """id = slot + offset for points (slot >= 1); slot 0 is ``</s>``."""
    return dictionary.nspecial - 1


def slots_to_ids(slots, dictionary):
    return torch.where(slots == 0, torch.full_like(slots, dictionary.eos()), slots + slot_offset(dictionary))


class PointerGeometryDataset(FairseqDataset):
    """Examples of a :class:`~fairseq_nat_ext.data.pointer_format.PointerData`; the target is the
    output sequence followed by the end slot.  ``augment`` (names from
    :func:`~fairseq_nat_ext.data.pointer_augment.parse_augment`) transforms every example afresh in
    each epoch, drawn from (seed, epoch, index), so a resumed run sees the same examples."""

    def __init__(self, data, dictionary, shuffle=True, augment=(), seed=1):
        self.data = data
        self.dict = dictionary
        self.offset = slot_offset(dictionary)
        self.shuffle = shuffle
        self.augment = tuple(augment)
        self.seed = seed
        self.epoch = 1
        self.sizes = data.sizes.astype(np.int64)
        self.tgt_sizes = data.output_sizes.astype(np.int64) + 1  # + end
        self.coords = torch.from_numpy(data.points.astype(np.float32))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        d = self.data
        coords = self.coords[d.point_offsets[index]:d.point_offsets[index + 1]]
        out = d.output_of(index)
        if self.augment:
            rng = np.random.default_rng([self.seed, self.epoch, index])
            points, out = augment_example(d.problem, coords.numpy(), out, rng, self.augment)
            coords = torch.from_numpy(np.ascontiguousarray(points))
        out = torch.from_numpy(out + 1)  # slots of the points
        return {"id": index, "coords": coords, "slots": torch.cat([out, out.new_zeros(1)])}

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return True  # batches depend on sizes only; set_epoch changes the augmentation

    def set_epoch(self, epoch):
        self.epoch = epoch

    def collater(self, samples):
        if not samples:
            return {}
        B = len(samples)
        n = torch.tensor([len(s["coords"]) for s in samples])
        t = torch.tensor([len(s["slots"]) for s in samples])
        N, T = int(n.max()), int(t.max())
        coords = torch.zeros(B, N, 2)
        src_tokens = torch.full((B, N), self.dict.pad(), dtype=torch.long)
        target_slots = torch.full((B, T), TARGET_PAD_SLOT, dtype=torch.long)
        prev = torch.zeros(B, T, dtype=torch.long)
        for i, s in enumerate(samples):
            k, m = len(s["coords"]), len(s["slots"])
            coords[i, :k] = s["coords"]
            src_tokens[i, :k] = torch.arange(1, k + 1) + self.offset
            target_slots[i, :m] = s["slots"]
            prev[i, 1:m] = s["slots"][:-1]
        target = slots_to_ids(target_slots.clamp(min=0), self.dict)
        target = target.masked_fill(target_slots == TARGET_PAD_SLOT, self.dict.pad())
        return {
            "id": torch.tensor([s["id"] for s in samples]),
            "nsentences": B,
            "ntokens": int(t.sum()),
            "net_input": {"src_tokens": src_tokens, "src_lengths": n, "src_coords": coords,
                          "prev_output_slots": prev},
            "target": target,
            "target_slots": target_slots,
        }

    def num_tokens(self, index):
        return int(self.sizes[index] + self.tgt_sizes[index])

    def num_tokens_vec(self, indices):
        return self.sizes[indices] + self.tgt_sizes[indices]

    def size(self, index):
        return int(self.sizes[index])

    def ordered_indices(self):
        order = np.random.permutation(len(self)) if self.shuffle else np.arange(len(self))
        order = order[np.argsort(self.tgt_sizes[order], kind="mergesort")]
        return order[np.argsort(self.sizes[order], kind="mergesort")]


@dataclass
class PointerGeometryConfig(FairseqDataclass):
    data: str = field(default="", metadata={"help": "directory with {split}.txt files (published text format)"})
    problem: ChoiceEnum(list(PROBLEMS)) = field(
        default="convex_hull", metadata={"help": "which labels the files hold and which constraints decoding uses"})
    max_points: int = field(default=1000, metadata={
        "help": "largest number of input points (size of the position dictionary)"})
    augment: str = field(default="none", metadata={
        "help": "training-split augmentation, drawn afresh every epoch: none, or a comma-separated subset "
                "of dihedral (the 8 symmetries of the unit square) and permute (the points in a random "
                "order, output re-canonicalised); labels stay exact (fairseq_nat_ext.data.pointer_augment)"})
    seed: int = II("common.seed")
    train_subset: str = II("dataset.train_subset")
    pointer_unconstrained: bool = field(default=False, metadata={
        "help": "decode without validity masks (ablation): only padding is masked and </s> forced at the "
                "longest valid length"})


@register_task("pointer_geometry", dataclass=PointerGeometryConfig)
class PointerGeometryTask(FairseqTask):
    cfg: PointerGeometryConfig

    def __init__(self, cfg, dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        paths = utils.split_paths(cfg.data) if cfg.data else []
        if not paths or not all(os.path.isdir(p) for p in paths):
            raise InputError(f"pointer_geometry: data directory '{cfg.data}' not found (write one with "
                             "python -m fairseq_nat_ext.data.pointer_geometry --out DIR/train.txt ...)")
        if str(cfg.problem) not in PROBLEMS:
            raise InputError(f"pointer_geometry: --problem {cfg.problem}: one of {', '.join(PROBLEMS)}")
        if cfg.max_points < 3:
            raise InputError("pointer_geometry: --max-points must be >= 3")
        try:
            parse_augment(getattr(cfg, "augment", None))
        except ValueError as err:
            raise InputError(f"pointer_geometry: --augment {cfg.augment}: {err}") from None
        return cls(cfg, position_dictionary(cfg.max_points))

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        paths = utils.split_paths(self.cfg.data)
        path = os.path.join(paths[(epoch - 1) % len(paths)], f"{split}.txt")
        data = read_pointer_file(path, str(self.cfg.problem))
        biggest = int(data.sizes.max())
        if biggest > self.cfg.max_points:
            raise InputError(f"pointer_geometry: {path}: an example has {biggest} points, more than "
                             f"--max-points {self.cfg.max_points}")
        # getattr: a checkpoint's stored task config from before these options lacks them
        train = split == (getattr(self.cfg, "train_subset", None) or "train")
        augment = parse_augment(getattr(self.cfg, "augment", None)) if train else ()
        seed = getattr(self.cfg, "seed", None)
        self.datasets[split] = PointerGeometryDataset(
            data, self.dictionary, shuffle=train, augment=augment, seed=1 if seed is None else seed)
        logger.info(f"pointer_geometry {split}: {len(data)} {self.cfg.problem} examples from {path}")

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        trained_on = getattr(model, "problem", None)
        if trained_on is None:
            model.problem = str(self.cfg.problem)
            if hasattr(model, "args"):
                model.args.pointer_problem = model.problem
        elif trained_on != str(self.cfg.problem):
            raise InputError(f"pointer_geometry: the model was trained on {trained_on}, "
                             f"not --problem {self.cfg.problem}")
        return model

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **unused):
        from ..generators.pointer_geometry import PointerGenerator

        for m in models:
            if not hasattr(m, "decode_step"):
                raise InputError(f"pointer_geometry: {type(m).__name__} is not a pointer model "
                                 "(use --arch pointer_lstm or pointer_transformer)")
        return PointerGenerator.from_generation_args(models, self.dictionary, args, str(self.cfg.problem),
                                                     constrained=not self.cfg.pointer_unconstrained)

    def max_positions(self):
        return self.cfg.max_points

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary
