"""Moses-tokenise several files in one process (used by examples/prepare_data.sh).

    python fairseq_nat_ext/data/moses_tokenize.py [-j N] LANG IN OUT [LANG IN OUT ...]

Output is the same as ``sacremoses -l LANG -j N tokenize -x < IN > OUT`` with
sacremoses 0.1.1 (the command of shared/data/multi30k-teacher/README.md, whose
``-x`` leaves XML escaping on: ``&`` -> ``&amp;``, ``'`` -> ``&apos;``); one
process saves the interpreter start-up per file.  Language codes sacremoses
does not know use the English rules, as in sacremoses.  Each OUT is written
through OUT.tmp and renamed; its line count must equal IN's.  Progress (sentences done of all the
files, rate) goes to stderr every tenth or ``PROGRESS_INTERVAL`` seconds (default 30).
"""

import os
import sys
from multiprocessing import Pool
from typing import Optional, Sequence

_TOKENIZER = None


def _init(lang: str) -> None:
    global _TOKENIZER
    from sacremoses import MosesTokenizer

    _TOKENIZER = MosesTokenizer(lang=lang)


def _tokenize(line: str) -> str:
    return _TOKENIZER.tokenize(line, return_str=True, escape=True, aggressive_dash_splits=False)


def _load_progress():
    """fairseq_nat_ext/data/progress.py, also when this file runs as a plain script (its folder is then
    the first entry of sys.path)."""
    try:
        from .progress import Progress
    except ImportError:
        from progress import Progress
    return Progress


def count_lines(path: str) -> int:
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def tokenize_file(lang: str, src: str, out: str, workers: int = 1, progress=None) -> int:
    with open(src, encoding="utf-8", newline="\n") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    chunk = 500
    if workers > 1 and len(lines) >= 2000:
        with Pool(workers, initializer=_init, initargs=(lang,)) as pool:
            toks = []
            for tok in pool.imap(_tokenize, lines, chunksize=chunk):
                toks.append(tok)
                if progress is not None and len(toks) % chunk == 0:
                    progress.update(chunk)
    else:
        _init(lang)
        toks = []
        for line in lines:
            toks.append(_tokenize(line))
            if progress is not None and len(toks) % chunk == 0:
                progress.update(chunk)
    if progress is not None:
        progress.update(len(toks) % chunk)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for tok in toks:
            if "\n" in tok:
                raise ValueError(f"{src}: tokenised line contains a newline")
            f.write(tok + "\n")
    os.replace(tmp, out)
    return len(toks)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    workers = 1
    if args[:1] == ["-j"] and len(args) >= 2:
        workers = int(args[1])
        args = args[2:]
    if not args or len(args) % 3:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        total = sum(count_lines(args[i + 1]) for i in range(0, len(args), 3))
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    progress = _load_progress()("moses_tokenize", total)
    for i in range(0, len(args), 3):
        lang, src, out = args[i:i + 3]
        try:
            n = tokenize_file(lang, src, out, workers, progress)
        except (OSError, ValueError, UnicodeDecodeError) as e:
            msg = str(e).replace("\n", " ")
            print(f"error: {src}: {msg}", file=sys.stderr)
            return 1
        print(f"[moses_tokenize] {src} -> {out} ({lang}, {n} lines)", file=sys.stderr)
    progress.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
