"""Nothing in the repository is tied to one machine.

* no tracked symbolic link (``git ls-files -s`` mode 120000): a link to an absolute path dangles in a
  fresh clone (``runs`` once did, and every recipe writing under ``runs/`` failed);
* no tracked text file names an absolute path of a build machine (the work tree of the machine the
  project was developed on, its scratch folders, a home or root directory).

The patterns are assembled from pieces so that this file does not match them itself.
"""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_S = "/"
#: absolute paths of build machines (each a regular expression)
MACHINE_PATHS = [
    re.escape(_S + "work" + _S),  # the development machine's work tree
    re.escape(_S + "tmp" + _S + "fresh"),  # its fresh-clone checks
    re.escape(_S + "home" + _S) + r"[A-Za-z0-9_.-]+" + re.escape(_S),  # a user's home
    re.escape(_S + "root" + _S),  # root's home
]
# a path starts at the beginning of a line, after whitespace, a quote, '=', '(', ':' ... but not inside
# a longer path or a URL (a URL's path or a relative "some/<dir>/x" is not a machine path)
_PATTERN = re.compile(r"(?<![A-Za-z0-9_.~/-])(?:" + "|".join(MACHINE_PATHS) + ")")


def _git(*args):
    if shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout (or git missing)")
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, check=True).stdout


def _tracked_files():
    return [p for p in _git("ls-files", "-z").decode("utf-8", "surrogateescape").split("\0") if p]


def _is_binary(data):
    return b"\0" in data[:8192]


def test_no_tracked_symlinks():
    links = []
    for line in _git("ls-files", "-s").decode("utf-8", "surrogateescape").splitlines():
        mode, _, rest = line.partition(" ")
        if mode == "120000":
            links.append(rest.split("\t", 1)[-1])
    assert not links, (
        f"tracked symbolic links (they dangle in a fresh clone): {links}; "
        "remove them with `git rm --cached PATH` and create the folder at run time instead"
    )


def machine_path_hits(text):
    """(line number, line) of every line of ``text`` that names a build machine's absolute path."""
    return [(i, line.strip()) for i, line in enumerate(text.splitlines(), 1) if _PATTERN.search(line)]


def test_pattern_matches_what_it_should():
    w, h, r = _S + "work" + _S, _S + "home" + _S, _S + "root" + _S
    for bad in (f"cd {w}main", f"PATH={h}alice/bin", f"'{r}.cache'", f"({_S}tmp{_S}fresh-1)"):
        assert machine_path_hits(bad), bad
    for good in ("runs" + w + "x", "https://example.org" + w + "x", "~" + w + "x", "a work item", "/tmp/x"):
        assert not machine_path_hits(good), good


def test_no_machine_paths_in_tracked_files():
    hits = []
    for path in _tracked_files():
        full = os.path.join(ROOT, path)
        if not os.path.isfile(full) or os.path.islink(full):
            continue
        with open(full, "rb") as f:
            data = f.read()
        if _is_binary(data):
            continue
        text = data.decode("utf-8", "replace")
        hits += [f"{path}:{n}: {line[:160]}" for n, line in machine_path_hits(text)]
    assert not hits, (
        f"{len(hits)} lines name an absolute path of a build machine (use paths relative to the "
        "repository, or the environment):\n" + "\n".join(hits[:60])
    )
