"""The published pointer-network text format (Vinyals et al. 2015): one example per line,

    x1 y1 x2 y2 ... xn yn output i1 i2 ... ik

with 1-based point indices.  The output is the closed hull polygon (first index repeated at the end),
the flattened Delaunay triangles, or the closed TSP tour.  Lines starting with ``#`` are comments; the
first ``#`` line with ``key=value`` fields is the file's header (written by
:mod:`.pointer_geometry`: problem, n, count, seed, and the TSP reference kind).

Reading checks every line and raises a one-line :class:`~fairseq_nat_ext.compat.InputError` naming
file and line: a missing ``output`` separator, a coordinate that is not a finite number (NaN/inf), a
wrong count (odd number of coordinates, fewer than 3 points, Delaunay indices not a multiple of 3, a
tour of the wrong length), an index out of range 1..n, a repeated index where the problem forbids
it.  Outputs are brought to the canonical forms (hull rotated to start at
its lowest index, triangles sorted, tour from city 1 in the canonical direction); a hull may be given
open or closed.

In memory everything is 0-based; :class:`PointerData` keeps all examples in flat arrays.
"""
import os
from dataclasses import dataclass, field

import numpy as np

PROBLEMS = ("convex_hull", "delaunay", "tsp")
DECIMALS = 6  # coordinates as written
SEPARATOR = "output"


def canonical_triangles(triangles):
    """(m, 3) index triples -> each row sorted, rows sorted lexicographically."""
    tri = np.sort(np.asarray(triangles, dtype=np.int64).reshape(-1, 3), axis=1)
    order = np.lexsort((tri[:, 2], tri[:, 1], tri[:, 0]))
    return tri[order]


def canonical_tour(tour):
    """A tour (permutation, open) -> rotated to start at city 0, second city < last city."""
    tour = np.asarray(tour, dtype=np.int64)
    tour = np.roll(tour, -int(np.nonzero(tour == 0)[0][0]))
    if len(tour) >= 3 and tour[1] > tour[-1]:
        tour = np.concatenate([tour[:1], tour[1:][::-1]])
    return tour


def canonical_sequence(problem, out):
    """0-based output sequence (closed hull / closed tour / flat triangles) -> its canonical form."""
    out = np.asarray(out, dtype=np.int64)
    if problem == "convex_hull":
        body = np.roll(out[:-1], -int(np.argmin(out[:-1])))
        return np.concatenate([body, body[:1]])
    if problem == "tsp":
        tour = canonical_tour(out[:-1])
        return np.concatenate([tour, tour[:1]])
    if problem == "delaunay":
        return canonical_triangles(out).reshape(-1)
    raise ValueError(problem)


@dataclass
class PointerData:
    """All examples of one file: points (total, 2) float64, outputs (total_out,) int64 0-based as in
    the file (hull and tour closed), with offsets (count + 1,) into both."""

    problem: str
    points: np.ndarray
    point_offsets: np.ndarray
    outputs: np.ndarray
    output_offsets: np.ndarray
    header: dict = field(default_factory=dict)
    path: str = ""

    def __len__(self):
        return len(self.point_offsets) - 1

    @property
    def sizes(self):
        return np.diff(self.point_offsets)

    @property
    def output_sizes(self):
        return np.diff(self.output_offsets)

    def points_of(self, i):
        return self.points[self.point_offsets[i]:self.point_offsets[i + 1]]

    def output_of(self, i):
        return self.outputs[self.output_offsets[i]:self.output_offsets[i + 1]]


def output_sequence(problem, label):
    """Canonical 0-based label (open hull / flat triangles / open tour) -> the output sequence."""
    label = np.asarray(label, dtype=np.int64).reshape(-1)
    if problem in ("convex_hull", "tsp"):
        return np.concatenate([label, label[:1]])
    return label


def format_line(points, output0):
    coords = " ".join(np.char.mod(f"%.{DECIMALS}f", np.asarray(points, dtype=np.float64).reshape(-1)))
    return f"{coords} {SEPARATOR} " + " ".join(str(int(i) + 1) for i in output0)


def write_pointer_file(path, problem, examples, header=None):
    """examples: iterable of (points (n, 2), canonical 0-based label); header: dict for the # line."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        if header:
            f.write("# pointer_geometry " + " ".join(f"{k}={v}" for k, v in header.items()) + "\n")
        for points, label in examples:
            f.write(format_line(points, output_sequence(problem, label)) + "\n")
    os.replace(tmp, path)


def _parse_header(line):
    fields = {}
    for tok in line.lstrip("#").split():
        if "=" in tok:
            key, value = tok.split("=", 1)
            fields[key] = value
    return fields


class _LineError(Exception):
    pass


def check_output(problem, n, out):
    """Validate a 1-based output list for ``n`` points; return the canonical 0-based output sequence.
    Raises _LineError with the reason."""
    for v in out:
        if not 1 <= v <= n:
            raise _LineError(f"index {v} out of range 1..{n}")
    o = np.asarray(out, dtype=np.int64) - 1
    if problem == "convex_hull":
        body = o[:-1] if len(o) >= 2 and o[0] == o[-1] else o
        if len(body) < 3:
            raise _LineError(f"wrong count: a hull of {len(body)} vertices (at least 3)")
        if len(np.unique(body)) != len(body):
            dup = _first_duplicate(body)
            raise _LineError(f"index {dup + 1} repeated in the hull")
        return canonical_sequence(problem, np.concatenate([body, body[:1]]))
    if problem == "delaunay":
        if len(o) == 0 or len(o) % 3:
            raise _LineError(f"wrong count: {len(o)} indices, not a positive multiple of 3 (triangles)")
        tri = o.reshape(-1, 3)
        for t in tri:
            if len(set(t.tolist())) < 3:
                raise _LineError(f"triangle {' '.join(str(v + 1) for v in t)} repeats an index")
        tri = canonical_triangles(tri)
        same = np.all(tri[1:] == tri[:-1], axis=1)
        if same.any():
            t = tri[int(np.nonzero(same)[0][0])]
            raise _LineError(f"triangle {' '.join(str(v + 1) for v in t)} appears twice")
        return tri.reshape(-1)
    if problem == "tsp":
        if len(o) != n + 1:
            raise _LineError(f"wrong count: a tour of {len(o)} indices, expected {n + 1} "
                             f"({n} cities, then back to the first)")
        if o[0] != o[-1]:
            raise _LineError("the tour does not return to its first city")
        if len(np.unique(o[:-1])) != n:
            raise _LineError(f"city {_first_duplicate(o[:-1]) + 1} visited twice")
        return canonical_sequence(problem, o)
    raise ValueError(problem)


def _first_duplicate(values):
    seen = set()
    for v in values.tolist():
        if v in seen:
            return v
        seen.add(v)
    return None


def _parse_line(problem, line):
    toks = line.split()
    if toks.count(SEPARATOR) != 1:
        raise _LineError(f"expected exactly one '{SEPARATOR}' separator, found {toks.count(SEPARATOR)}")
    k = toks.index(SEPARATOR)
    coords, outs = toks[:k], toks[k + 1:]
    if len(coords) % 2:
        raise _LineError(f"wrong count: {len(coords)} coordinates, expected x y pairs (an even number)")
    if len(coords) < 6:
        raise _LineError(f"wrong count: {len(coords) // 2} points, at least 3 needed")
    try:
        xy = np.array(coords, dtype=np.float64)
    except ValueError:
        j = next(j for j, t in enumerate(coords) if not _is_float(t))
        raise _LineError(f"coordinate {j + 1} '{coords[j]}' is not a number") from None
    bad = ~np.isfinite(xy)
    if bad.any():
        j = int(np.nonzero(bad)[0][0])
        raise _LineError(f"coordinate {j + 1} is '{coords[j]}' (NaN/inf not allowed)")
    try:
        out = [int(t) for t in outs]
    except ValueError:
        t = next(t for t in outs if not t.lstrip("-").isdigit())
        raise _LineError(f"index '{t}' is not an integer") from None
    n = len(coords) // 2
    return xy.reshape(n, 2), check_output(problem, n, out)


def _is_float(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


def read_pointer_file(path, problem):
    """Read and check a file; :class:`PointerData` or a one-line InputError naming file and line."""
    from ..compat import InputError

    if problem not in PROBLEMS:
        raise InputError(f"pointer_geometry: unknown problem {problem!r} (one of {', '.join(PROBLEMS)})")
    if not os.path.isfile(path):
        raise InputError(f"pointer_geometry: {path} not found")
    points, outputs, pofs, oofs = [], [], [0], [0]
    header = None
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.startswith("#"):
                if header is None and "=" in line:
                    header = _parse_header(line)
                continue
            if not line.strip():
                raise InputError(f"pointer_geometry: {path}:{lineno}: empty line")
            try:
                xy, out = _parse_line(problem, line)
            except _LineError as err:
                raise InputError(f"pointer_geometry: {path}:{lineno}: {err}") from None
            points.append(xy)
            outputs.append(out)
            pofs.append(pofs[-1] + len(xy))
            oofs.append(oofs[-1] + len(out))
    if not points:
        raise InputError(f"pointer_geometry: {path}: no examples")
    header = header or {}
    if header.get("problem") not in (None, problem):
        raise InputError(f"pointer_geometry: {path}: the file holds {header['problem']} examples, "
                         f"not {problem} (--problem)")
    return PointerData(problem, np.concatenate(points), np.array(pofs, dtype=np.int64),
                       np.concatenate(outputs).astype(np.int64), np.array(oofs, dtype=np.int64),
                       header, path)
