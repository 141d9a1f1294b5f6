"""Choose the checkpoint a stopped ``fairseq-train`` run resumes from.

    python fairseq_nat_ext/checkpoint_resume.py SAVE_DIR [--log FILE]

fairseq saves each checkpoint atomically (``.tmp``, then rename) and then *copies* it to
``checkpoint_best.pt`` and ``checkpoint_last.pt``; the copy is not atomic, so a run killed during it
leaves a truncated ``checkpoint_last.pt`` that fairseq-train cannot load on restart (or, killed while
copying ``checkpoint_best.pt``, a ``checkpoint_last.pt`` older than the newest checkpoint).

This script prints the fairseq-train arguments that resume from the newest intact checkpoint, one per
line on stdout: nothing when ``checkpoint_last.pt`` is intact and at least as new as every other
checkpoint (fairseq's default resume) or when there is no checkpoint at all (a fresh start), otherwise
``--restore-file`` and the path of the newest intact checkpoint.  Its decision is one line on stderr
(and appended to ``--log FILE``).  Exit status 1, with one ``error:`` line, when checkpoints exist but
none is intact.

Intact means a complete zip archive (torch's checkpoint format since 1.6) whose members all pass their
CRC check; nothing is unpickled.  Only fairseq's names are considered (``checkpoint_last.pt``,
``checkpoint_best.pt``, ``checkpointE.pt``, ``checkpoint_E_U.pt``), newest first by modification time.
Standard library only, so the recipes can call it without importing torch or fairseq.
"""

import os
import re
import sys
import zipfile
import zlib
from typing import List, Optional, Sequence, Tuple

CHECKPOINT_RE = re.compile(r"^checkpoint(_last|_best|\d+|_\d+_\d+)\.pt$")
LAST = "checkpoint_last.pt"


def damage(path: str) -> Optional[str]:
    """None when ``path`` is an intact checkpoint, else why it is not (a short phrase)."""
    try:
        if os.path.getsize(path) == 0:
            return "empty file"
        if not zipfile.is_zipfile(path):
            return "truncated or not a torch checkpoint (no zip directory)"
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            if not any(n.endswith("/data.pkl") or n == "data.pkl" for n in names):
                return "no data.pkl in the archive"
            bad = z.testzip()
            if bad is not None:
                return f"CRC error in {bad}"
    except (OSError, zipfile.BadZipFile, zlib.error, EOFError, ValueError) as e:
        return f"unreadable ({type(e).__name__}: {e})"
    return None


def updates_in_name(name: str) -> Optional[int]:
    m = re.match(r"^checkpoint_\d+_(\d+)\.pt$", name)
    return int(m.group(1)) if m else None


def candidates(save_dir: str) -> List[Tuple[float, int, str]]:
    """fairseq checkpoints in ``save_dir``, newest first: (mtime, preference, name); on equal times
    checkpoint_last.pt comes first (resuming from it needs no flag)."""
    out = []
    for name in os.listdir(save_dir):
        if CHECKPOINT_RE.match(name) and os.path.isfile(os.path.join(save_dir, name)):
            out.append((os.path.getmtime(os.path.join(save_dir, name)), 0 if name == LAST else 1, name))
    out.sort(key=lambda c: (-c[0], c[1], c[2]))
    return out


def choose(save_dir: str) -> Tuple[List[str], str]:
    """(fairseq-train arguments, message).  Raises ValueError (one line) when nothing is intact."""
    if not os.path.isdir(save_dir):
        return [], f"{save_dir} does not exist yet: training starts from scratch"
    cands = candidates(save_dir)
    if not cands:
        return [], f"no checkpoint in {save_dir}: training starts from scratch"
    last_damage = damage(os.path.join(save_dir, LAST)) if os.path.exists(os.path.join(save_dir, LAST)) else None
    broken = []
    for _, _, name in cands:
        path = os.path.join(save_dir, name)
        why = last_damage if name == LAST else damage(path)
        if why is not None:
            broken.append(f"{name}: {why}")
            continue
        if name == LAST:
            note = f" ({'; '.join(broken)})" if broken else ""
            return [], f"resuming from {path} (intact, newest){note}"
        upd = updates_in_name(name)
        at = f", update {upd}" if upd is not None else ""
        if os.path.exists(os.path.join(save_dir, LAST)):
            state = f"{LAST} is damaged ({last_damage})" if last_damage else f"{LAST} is older"
        else:
            state = f"there is no {LAST}"
        return ["--restore-file", path], f"{state}: resuming from {path} (newest intact checkpoint{at})"
    raise ValueError(f"no intact checkpoint in {save_dir} ({'; '.join(broken)}); move the damaged files "
                     "away to start from scratch")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    log = None
    if "--log" in args:
        i = args.index("--log")
        if i + 1 >= len(args):
            print("error: --log needs a file", file=sys.stderr)
            return 2
        log = args[i + 1]
        del args[i:i + 2]
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print("usage: python fairseq_nat_ext/checkpoint_resume.py SAVE_DIR [--log FILE]", file=sys.stderr)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    try:
        resume_args, message = choose(args[0])
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    line = f"[checkpoint_resume] {message}"
    print(line, file=sys.stderr)
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    for a in resume_args:
        print(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
