"""Fertility files: ``DIR/{split}.fert``, one line per sentence of the split (the data-bin's order), one
non-negative integer per source BPE piece (``</s>`` not included), separated by spaces.  A line's
values sum to the number of target pieces of that sentence (``</s>`` not included).  ``DIR/method``
records how they were made (``aligner ...`` or ``attention ...``; first word read by
:func:`fertility_method`).

Written by ``python -m fairseq_nat_ext.data.make_fertility`` (``examples/fertility.sh``), read by the
``nat_translation`` task with ``--fertility-path DIR`` (``fertility_dataset.FertilityDataset``).
Nothing here imports fairseq.
"""
import os

import numpy as np

SUFFIX = ".fert"
METHOD_FILE = "method"


def fertility_file(path, split):
    return os.path.join(path, split + SUFFIX)


def write_fertility_file(filename, rows):
    """rows: sequences of ints, one per sentence."""
    os.makedirs(os.path.dirname(filename) or ".", exist_ok=True)
    tmp = filename + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(" ".join(str(int(v)) for v in row) + "\n")
    os.replace(tmp, filename)


def read_fertility_file(filename):
    """-> list of int64 arrays.  ValueError naming file and line on anything but non-negative ints."""
    rows = []
    with open(filename, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            items = line.split()
            if not all(x.isdigit() for x in items):
                bad = next(x for x in items if not x.isdigit())
                raise ValueError(f"fertility: {filename} line {n}: {bad!r} is not a non-negative integer")
            rows.append(np.asarray([int(x) for x in items], dtype=np.int64))
    return rows


def check_fertility(rows, src_lengths, tgt_lengths, filename):
    """Each row must have one value per source piece and sum to the target length (both without
    ``</s>``).  ValueError naming the file and the first bad line."""
    if len(rows) != len(src_lengths):
        raise ValueError(f"fertility: {filename} has {len(rows)} lines, the split has {len(src_lengths)} "
                         "sentences")
    for n, (row, s, t) in enumerate(zip(rows, src_lengths, tgt_lengths), 1):
        if row.size != int(s):
            raise ValueError(f"fertility: {filename} line {n}: {row.size} values for {int(s)} source tokens")
        if int(row.sum()) != int(t):
            raise ValueError(f"fertility: {filename} line {n}: values sum to {int(row.sum())}, the target "
                             f"has {int(t)} tokens")


def write_method(path, text):
    with open(os.path.join(path, METHOD_FILE), "w", encoding="utf-8") as f:
        f.write(text.strip() + "\n")


def fertility_method(path):
    """``aligner`` / ``attention`` from ``DIR/method``, or None when the file is absent."""
    name = os.path.join(path, METHOD_FILE)
    if not os.path.isfile(name):
        return None
    with open(name, encoding="utf-8") as f:
        words = f.read().split()
    return words[0] if words else None
