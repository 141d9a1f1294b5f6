"""Helpers for examples/distill.sh (sequence-level knowledge distillation).

    python fairseq_nat_ext/data/distill_utils.py count DATA_BIN SPLIT SRC TGT LANG
        prints the number of sentences of DATA_BIN/SPLIT.SRC-TGT.LANG.{bin,idx}
    python fairseq_nat_ext/data/distill_utils.py collect GENERATE_OUTPUT N OUT_FILE
        writes the H- hypotheses of a fairseq-generate output to OUT_FILE in the
        original sentence order (by id); fails unless ids are exactly 0..N-1
    python fairseq_nat_ext/data/distill_utils.py import TEXT_FILE N OUT_FILE
        copies an already-distilled text file (plain or .gz) to OUT_FILE, checking
        that it has N lines of valid UTF-8 without carriage returns

``collect`` reports its progress (sentences, rate) on stderr every tenth or ``PROGRESS_INTERVAL``
seconds.  All print a single ``error: ...`` line and exit 1 on failure.  The module only
needs the standard library (fairseq is imported only for the rare non-mmap
index formats), so it is run as a plain script.
"""

import os
import struct
import sys
from typing import List, Optional, Sequence

_MMAP_MAGIC = b"MMIDIDX\x00\x00"
_LEGACY_MAGIC = b"TNTIDX\x00\x00"


def count_sentences(data_bin: str, split: str, src: str, tgt: str, lang: str) -> int:
    """Number of sentences of a fairseq binarised dataset (reads the .idx header)."""
    prefix = os.path.join(data_bin, f"{split}.{src}-{tgt}.{lang}")
    idx = prefix + ".idx"
    if not os.path.exists(idx):
        raise ValueError(f"{idx}: no such file")
    with open(idx, "rb") as f:
        head = f.read(64)
    if head.startswith(_MMAP_MAGIC):
        # magic, <Q version, <B dtype code, <Q number of sentences
        off = len(_MMAP_MAGIC) + 8 + 1
        return struct.unpack("<Q", head[off:off + 8])[0]
    if head.startswith(_LEGACY_MAGIC):
        # magic, <Q version, <QQ (dtype code, element size), <QQ (number of sentences, s)
        off = len(_LEGACY_MAGIC) + 8 + 16
        return struct.unpack("<Q", head[off:off + 8])[0]
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(prefix, None)
    if dataset is None:
        raise ValueError(f"{prefix}: cannot read this binarised dataset")
    return len(dataset)


def _load_progress():
    """fairseq_nat_ext/data/progress.py, also when this file runs as a plain script (its folder is then
    the first entry of sys.path)."""
    try:
        from .progress import Progress
    except ImportError:
        from progress import Progress
    return Progress


def collect_hypotheses(lines: Sequence[str], n_expected: int, name: str = "generate output",
                       progress=None) -> List[str]:
    """Return the best hypothesis per sentence id from fairseq-generate lines.

    Only the first ``H-<id>`` line of each id is kept (``--nbest`` > 1 prints more).  ``progress`` (a
    :class:`progress.Progress`) is advanced by one per sentence's first hypothesis.
    """
    hyps: List[Optional[str]] = [None] * n_expected
    for lineno, line in enumerate(lines, 1):
        if not line.startswith("H-"):
            continue
        fields = line.rstrip("\n").split("\t")
        if len(fields) < 2:
            raise ValueError(f"{name} line {lineno}: malformed H- line")
        try:
            sid = int(fields[0][2:])
        except ValueError:
            raise ValueError(f"{name} line {lineno}: malformed sentence id {fields[0]!r}") from None
        if not 0 <= sid < n_expected:
            raise ValueError(f"{name} line {lineno}: sentence id {sid} outside 0..{n_expected - 1}")
        if hyps[sid] is None:
            hyps[sid] = fields[2] if len(fields) > 2 else ""
            if progress is not None:
                progress.update()
    missing = [i for i, h in enumerate(hyps) if h is None]
    if missing:
        raise ValueError(
            f"{name}: {len(missing)} of {n_expected} sentences have no hypothesis (first missing id {missing[0]})"
        )
    return [h.strip() for h in hyps]  # type: ignore[union-attr]


def import_text(path: str, n_expected: int, out: str) -> int:
    """Copy ``path`` (plain or gzip) to ``out`` after checking it; returns empty-line count."""
    import gzip

    with open(path, "rb") as probe:
        gz = probe.read(2) == b"\x1f\x8b"
    opener = gzip.open if gz else open
    lines = []
    try:
        with opener(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if raw.endswith(b"\n"):
                    raw = raw[:-1]
                if raw.endswith(b"\r"):
                    raw = raw[:-1]
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError(f"{path} line {lineno}: not valid UTF-8") from None
                if "\r" in text:
                    raise ValueError(f"{path} line {lineno}: carriage return inside the line")
                lines.append(text.strip())
    except (OSError, EOFError) as e:
        raise ValueError(f"{path}: cannot read: {e}") from None
    if len(lines) != n_expected:
        raise ValueError(f"{path} has {len(lines)} lines but the source side has {n_expected}")
    _write_lines(out, lines)
    return sum(1 for line in lines if not line)


def _write_lines(out: str, lines: Sequence[str]) -> None:
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")
    os.replace(tmp, out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:1] == ["count"] and len(args) == 6:
            print(count_sentences(*args[1:]))
        elif args[:1] == ["collect"] and len(args) == 4:
            gen, n, out = args[1], int(args[2]), args[3]
            progress = _load_progress()("distill collect", n)
            with open(gen, encoding="utf-8") as f:
                hyps = collect_hypotheses(f, n, name=gen, progress=progress)
            progress.close()
            _write_lines(out, hyps)
            n_empty = sum(1 for h in hyps if not h)
            if n_empty:
                print(f"warning: {n_empty} empty hypotheses in {out}", file=sys.stderr)
        elif args[:1] == ["import"] and len(args) == 4:
            n_empty = import_text(args[1], int(args[2]), args[3])
            if n_empty:
                print(f"warning: {n_empty} empty lines in {args[1]}", file=sys.stderr)
        else:
            print(__doc__.strip().split("\n\n")[0], file=sys.stderr)
            return 2
    except (ValueError, OSError) as e:
        msg = str(e).replace("\n", " ")
        print(f"error: {msg}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
