"""Drop degenerate teacher outputs from a binarised distilled training set.

    python -m fairseq_nat_ext.data.distill_filter DATA_BIN --src en --tgt de [--split train] \\
        [--max-repeat 2] [--max-len 2,10]

A weak or early teacher loops on rare words: Multi30K's 1,300-update teacher writes
``G@@ el@@ el@@ el@@ ...`` up to the 200-token limit for 47 of 29,000 training sentences and repeats
a token 3 or more times in a row in 2,373 of them (the real German side: 2 sentences).  A NAT student
learns those loops and, worse, the length 200 as a length class.  A pair is dropped when its target
repeats one token more than ``--max-repeat`` times in a row (0: no such test) or is longer than
``A * source + B`` tokens (``--max-len A,B``; ``off``: no such test), both counted without ``</s>``.
Both sides of the split are rewritten (token ids unchanged, order kept); one line says what went
(stdout); the pairs read so far and the rate go to stderr every tenth or ``PROGRESS_INTERVAL`` seconds.
"""

import argparse
import os
import sys
from typing import Optional, Sequence, Tuple

import numpy as np

from .progress import Progress


def max_runs(items: Sequence[np.ndarray]) -> np.ndarray:
    """Per sequence, the longest run of one repeated value (0 for an empty sequence), vectorised."""
    n = len(items)
    lens = np.array([len(x) for x in items], dtype=np.int64)
    out = np.zeros(n, dtype=np.int64)
    if lens.sum() == 0:
        return out
    flat = np.concatenate([np.asarray(x, dtype=np.int64) for x in items])
    sid = np.repeat(np.arange(n), lens)
    new = np.ones(len(flat), dtype=bool)
    new[1:] = (flat[1:] != flat[:-1]) | (sid[1:] != sid[:-1])
    starts = np.flatnonzero(new)
    run_len = np.diff(np.append(starts, len(flat)))
    np.maximum.at(out, sid[starts], run_len)
    return out


def degenerate(src_lens: np.ndarray, tgt_items: Sequence[np.ndarray], max_repeat: int,
               max_len: Optional[Tuple[float, float]]) -> Tuple[np.ndarray, np.ndarray]:
    """(looping, too_long) bool arrays over the pairs (targets without ``</s>``)."""
    tgt_lens = np.array([len(x) for x in tgt_items], dtype=np.int64)
    looping = max_runs(tgt_items) > max_repeat if max_repeat > 0 else np.zeros(len(tgt_lens), dtype=bool)
    if max_len is None:
        too_long = np.zeros(len(tgt_lens), dtype=bool)
    else:
        a, b = max_len
        too_long = tgt_lens > a * np.asarray(src_lens, dtype=np.float64) + b
    return looping, too_long


def parse_max_len(text: str) -> Optional[Tuple[float, float]]:
    if text == "off":
        return None
    try:
        a, b = (float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--max-len must be A,B (target <= A * source + B) or off, got {text!r}") from None
    return a, b


def _content(item, eos: int) -> np.ndarray:
    x = np.asarray(item, dtype=np.int64)
    return x[:-1] if len(x) and x[-1] == eos else x


def filter_split(data_bin: str, src: str, tgt: str, split: str = "train", max_repeat: int = 2,
                 max_len: Optional[Tuple[float, float]] = (2.0, 10.0), progress: bool = False) -> dict:
    """Rewrite DATA_BIN/SPLIT.SRC-TGT.{SRC,TGT} without the degenerate pairs; returns the counts.
    ``progress``: report the pairs read (and the rate) on stderr."""
    from fairseq.data import Dictionary, data_utils, indexed_dataset
    import torch

    prefixes = {lang: os.path.join(data_bin, f"{split}.{src}-{tgt}.{lang}") for lang in (src, tgt)}
    dicts = {lang: Dictionary.load(os.path.join(data_bin, f"dict.{lang}.txt")) for lang in (src, tgt)}
    data = {}
    for lang, prefix in prefixes.items():
        ds = data_utils.load_indexed_dataset(prefix, dicts[lang])
        if ds is None:
            raise ValueError(f"{prefix}.idx: no such binarised dataset")
        data[lang] = ds
    n = len(data[src])
    if len(data[tgt]) != n:
        raise ValueError(f"{prefixes[tgt]} has {len(data[tgt])} sentences but {prefixes[src]} has {n}")
    eos = dicts[tgt].eos()
    progress = Progress("distill_filter", n, unit="pairs") if progress else None
    targets, src_lens = [], np.zeros(n, dtype=np.int64)
    for i in range(n):
        targets.append(_content(data[tgt][i], eos))
        src_lens[i] = len(_content(data[src][i], dicts[src].eos()))
        if progress is not None:
            progress.update()
    if progress is not None:
        progress.close()
    looping, too_long = degenerate(src_lens, targets, max_repeat, max_len)
    keep = ~(looping | too_long)
    if n and not keep.any():
        raise ValueError(f"{prefixes[tgt]}: the filter would drop all {n} pairs ({int(looping.sum())} looping, "
                         f"{int(too_long.sum())} too long): the teacher's outputs are degenerate; "
                         "--max-repeat 0 --max-len off keeps them")
    if not keep.all():
        for lang, prefix in prefixes.items():
            tmp = prefix + ".filtered"
            builder = indexed_dataset.make_builder(tmp + ".bin", impl="mmap", vocab_size=len(dicts[lang]))
            for i in np.flatnonzero(keep):
                builder.add_item(torch.as_tensor(data[lang][int(i)]).int())
            builder.finalize(tmp + ".idx")
            del data[lang]
            for ext in ("bin", "idx"):
                os.replace(f"{tmp}.{ext}", f"{prefix}.{ext}")
    return {"pairs": n, "kept": int(keep.sum()), "looping": int(looping.sum()), "too_long": int(too_long.sum())}


def describe(counts: dict, max_repeat: int, max_len: Optional[Tuple[float, float]]) -> str:
    parts = []
    if max_repeat > 0:
        parts.append(f"{counts['looping']} repeat a token more than {max_repeat} times in a row")
    if max_len is not None:
        parts.append(f"{counts['too_long']} are longer than {max_len[0]:g} x source + {max_len[1]:g}")
    why = "; ".join(parts) if parts else "no filter"
    return f"kept {counts['kept']} of {counts['pairs']} pairs ({why})"


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fairseq_nat_ext.data.distill_filter",
                                description=__doc__.strip().split("\n\n")[1])
    p.add_argument("data_bin")
    p.add_argument("--src", required=True)
    p.add_argument("--tgt", required=True)
    p.add_argument("--split", default="train")
    p.add_argument("--max-repeat", type=int, default=2)
    p.add_argument("--max-len", default="2,10")
    args = p.parse_args(argv)
    try:
        if args.max_repeat < 0:
            raise ValueError(f"--max-repeat must be >= 0, got {args.max_repeat}")
        max_len = parse_max_len(args.max_len)
        counts = filter_split(args.data_bin, args.src, args.tgt, args.split, args.max_repeat, max_len,
                              progress=True)
    except (ValueError, OSError) as e:
        print(f"error: {e}".replace("\n", " "), file=sys.stderr)
        return 1
    print(describe(counts, args.max_repeat, max_len))
    return 0


if __name__ == "__main__":
    sys.exit(main())
