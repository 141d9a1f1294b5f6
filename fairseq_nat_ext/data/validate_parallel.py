"""Check that two files form a usable parallel corpus.

    python -m fairseq_nat_ext.data.validate_parallel SRC_FILE TGT_FILE

Files may be plain text or gzip (``.gz``).  Exits 0 silently when fine;
otherwise prints exactly one line to stderr and exits 1, e.g.::

    error: train.en has 29000 lines but train.de has 28999
    error: train.de line 17: empty line
    error: train.en line 5: not valid UTF-8

Checks, reported for the first offending line (the source file first when
both files are wrong at the same line): the file can be read, every line is
valid UTF-8, no line is empty or whitespace only, no line contains a carriage
return other than a final CRLF line end (Python's text mode, used by sacremoses
and fairseq-preprocess, would split it into two lines and misalign the corpus),
and both files have the same, non-zero number of lines.  A last line without a
final newline counts as a line.

From Python, :func:`validate_parallel` raises :class:`ValueError` whose message
is that same line without the ``error: `` prefix.
"""

import gzip
import itertools
import os
import sys
import zlib
from typing import BinaryIO, Iterator, Optional, Sequence


def _open_binary(path: str) -> BinaryIO:
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _lines(path: str, f: BinaryIO) -> Iterator[bytes]:
    try:
        for line in f:
            yield line
    except (OSError, EOFError, zlib.error) as e:
        raise ValueError(f"{path}: cannot read: {e}") from None


def _check_line(path: str, lineno: int, line: bytes) -> None:
    if line.endswith(b"\n"):
        line = line[:-1]
        if line.endswith(b"\r"):
            line = line[:-1]
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} line {lineno}: not valid UTF-8") from None
    if "\r" in text:
        raise ValueError(f"{path} line {lineno}: carriage return inside the line")
    if not text.strip():
        raise ValueError(f"{path} line {lineno}: empty line")


def validate_parallel(src_path: str, tgt_path: str) -> int:
    """Validate a parallel pair; returns the number of lines.

    Raises ValueError with a one-line message naming the file (as given) and,
    where it applies, the line number.
    """
    src_path, tgt_path = os.fspath(src_path), os.fspath(tgt_path)
    files = []
    try:
        for path in (src_path, tgt_path):
            try:
                files.append(_open_binary(path))
            except FileNotFoundError:
                raise ValueError(f"{path}: no such file") from None
            except IsADirectoryError:
                raise ValueError(f"{path}: is a directory") from None
            except OSError as e:
                raise ValueError(f"{path}: cannot open: {e.strerror or e}") from None
        src_lines = _lines(src_path, files[0])
        tgt_lines = _lines(tgt_path, files[1])
        n_src = n_tgt = 0
        for src_line, tgt_line in itertools.zip_longest(src_lines, tgt_lines):
            if src_line is None or tgt_line is None:
                # one file ended: count the rest of the other one
                if src_line is None:
                    n_tgt += 1 + sum(1 for _ in tgt_lines)
                else:
                    n_src += 1 + sum(1 for _ in src_lines)
                break
            n_src += 1
            n_tgt += 1
            _check_line(src_path, n_src, src_line)
            _check_line(tgt_path, n_tgt, tgt_line)
        if n_src != n_tgt:
            raise ValueError(f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}")
        if n_src == 0:
            raise ValueError(f"{src_path} and {tgt_path} are empty")
        return n_src
    finally:
        for f in files:
            f.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or any(a in ("-h", "--help") for a in args):
        print(
            "usage: python -m fairseq_nat_ext.data.validate_parallel SRC_FILE TGT_FILE",
            file=sys.stderr,
        )
        return 0 if args and args[0] in ("-h", "--help") else 2
    try:
        validate_parallel(args[0], args[1])
    except ValueError as e:
        # exactly one line, whatever the message
        msg = str(e).replace("\r", " ").replace("\n", " ")
        print("error: " + msg, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
