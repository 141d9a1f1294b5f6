"""Planar point sets and their labels for pointer networks (Vinyals et al. 2015), with fixed seeds.

    python -m fairseq_nat_ext.data.pointer_geometry --problem convex_hull --n 50 --count 100000 \
        --seed 1 --out DIR/train.txt
    python -m fairseq_nat_ext.data.pointer_geometry --problem tsp --n 5-20 ...      # n uniform in 5..20

Points are uniform in [0, 1]^2, written with 6 decimals; every label is computed on the points as
they are read back from the file, so a file is self-consistent.  Indices are 0-based here and 1-based
in the files (:mod:`.pointer_format`).  Canonical forms:

* convex hull: the hull vertices (scipy ``ConvexHull``, Qhull) counter-clockwise, starting from the
  lowest index; the file repeats the first index at the end (the closed polygon, as published).
* Delaunay: scipy ``Delaunay`` triangles, each triple sorted increasingly, the list sorted
  lexicographically.
* TSP: the optimal tour by our Held-Karp dynamic programme for n <= ``exact_max_n`` (12), else
  LKH-3's tour through ``elkai`` (near-optimal); the tour starts at city 0 and runs in the direction
  whose second city has the lower index of the two neighbours of city 0; the file closes the cycle.

Degenerate point sets (Qhull errors, e.g. collinear points) are redrawn from the same random stream,
so a seed still fixes everything.  The first line of a written file is a ``#`` header naming the
problem, n, count, seed and, for TSP, the reference (``exact``, ``lkh`` or ``mixed``).
"""
import argparse
import math
import sys

import numpy as np

from .pointer_format import DECIMALS, PROBLEMS, canonical_tour, canonical_triangles  # noqa: F401

EXACT_MAX_N = 12  # Held-Karp above this size costs O(2^n n^2) memory and time


# ---- point sets ---------------------------------------------------------------------------------

def parse_n_range(text):
    """``"50"`` -> (50, 50); ``"5-50"`` -> (5, 50); ValueError with a one-line message otherwise."""
    parts = str(text).split("-")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (None, None)
    except ValueError:
        lo = hi = None
    if lo is None or lo < 3 or hi < lo:
        raise ValueError(f"--n {text!r}: expected N or LO-HI with 3 <= LO <= HI")
    return lo, hi


def quantize(points):
    """(n, 2) -> the points exactly as written with ``DECIMALS`` decimals and parsed back."""
    text = np.char.mod(f"%.{DECIMALS}f", np.asarray(points, dtype=np.float64))
    return text.astype(np.float64)


def random_points(rng, n):
    """(n, 2) float64, uniform in [0, 1]^2, quantised to the file's precision."""
    return quantize(rng.random((n, 2)))


# ---- labels ---------------------------------------------------------------------------------------

def convex_hull(points):
    """Hull vertex indices (0-based), counter-clockwise, starting from the lowest index (open cycle)."""
    from scipy.spatial import ConvexHull

    vertices = ConvexHull(points).vertices  # counter-clockwise for 2-D input
    start = int(np.argmin(vertices))
    return np.roll(vertices, -start).astype(np.int64)


def delaunay(points):
    """Delaunay triangles (m, 3), 0-based, in canonical order."""
    from scipy.spatial import Delaunay

    return canonical_triangles(Delaunay(points).simplices)


def distance_matrix(points):
    """(..., n, 2) -> (..., n, n) Euclidean distances."""
    diff = points[..., :, None, :] - points[..., None, :, :]
    return np.sqrt((diff ** 2).sum(-1))


def tour_length(points, tour):
    """Length of the closed tour through ``points`` in the order ``tour`` (open or closed)."""
    tour = np.asarray(tour, dtype=np.int64)
    p = points[tour]
    return float(np.sqrt(((p - np.roll(p, -1, axis=0)) ** 2).sum(-1)).sum())


def held_karp_batch(dist, max_chunk_bytes=64 << 20):
    """Exact TSP for a batch of equal-size instances by Held-Karp bitmask DP.

    dist: (b, n, n) -> (tours (b, n) int64 canonical, lengths (b,) float64).  City 0 is the start;
    the state dp[mask, k] (mask over cities 1..n-1) is the shortest path 0 -> ... -> k visiting
    exactly ``mask``; each level (subset size) is one vectorised numpy step over all masks and ends.
    """
    dist = np.asarray(dist, dtype=np.float64)
    b, n, _ = dist.shape
    if n <= 3:  # one tour up to direction
        tours = np.stack([canonical_tour(np.arange(n))] * b) if b else np.zeros((0, n), np.int64)
        return tours, np.array([tour_length_from_dist(d, t) for d, t in zip(dist, tours)])
    m = n - 1
    size = 1 << m
    widest = max(math.comb(m, k) for k in range(m + 1))
    per_instance = widest * m * m * 8 * 3 + size * m * 9  # a level's temporaries + dp and parent
    chunk = max(1, min(b, max_chunk_bytes // per_instance))
    if chunk < b:
        parts = [held_karp_batch(dist[i:i + chunk], max_chunk_bytes) for i in range(0, b, chunk)]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    masks = np.arange(size)
    bits = 1 << np.arange(m)
    has = (masks[:, None] & bits[None, :]) != 0  # (size, m): city k+1 in mask
    popcount = has.sum(1)
    inner = dist[:, 1:, 1:]  # (b, m, m): j -> k
    inner_t = np.swapaxes(inner, 1, 2)  # [b, k, j] = cost j -> k
    dp = np.full((b, size, m), np.inf)
    parent = np.zeros((b, size, m), dtype=np.int8)
    dp[:, bits, np.arange(m)] = dist[:, 0, 1:]
    for level in range(2, m + 1):
        sel = masks[popcount == level]  # (M,)
        prev = sel[:, None] ^ bits[None, :]  # (M, m): sel without k (only meaningful if k in sel)
        cand = dp[:, prev, :] + inner_t[:, None, :, :]  # (b, M, k, j)
        arg = cand.argmin(-1)
        best = np.take_along_axis(cand, arg[..., None], -1)[..., 0]
        best = np.where(has[sel][None], best, np.inf)
        dp[:, sel, :] = best
        parent[:, sel, :] = arg
    total = dp[:, size - 1, :] + dist[:, 1:, 0]  # (b, m)
    last = total.argmin(1)
    lengths = total[np.arange(b), last]
    tours = np.zeros((b, n), dtype=np.int64)
    mask = np.full(b, size - 1)
    cur = last
    rows = np.arange(b)
    for pos in range(n - 1, 0, -1):
        tours[:, pos] = cur + 1
        nxt = parent[rows, mask, cur].astype(np.int64)
        mask = mask ^ (1 << cur)
        cur = nxt
    return np.stack([canonical_tour(t) for t in tours]), lengths


def tour_length_from_dist(dist, tour):
    tour = np.asarray(tour)
    return float(dist[tour, np.roll(tour, -1)].sum())


def held_karp(points):
    """Optimal tour (canonical, open) and its length for one instance."""
    tours, lengths = held_karp_batch(distance_matrix(np.asarray(points, dtype=np.float64))[None])
    return tours[0], float(lengths[0])


def lkh_tour(points, runs=10):
    """Near-optimal tour (canonical, open) by LKH-3 through elkai (distances scaled to integers)."""
    try:
        import elkai
    except ImportError:
        from ..compat import InputError

        raise InputError("TSP with n > 12 needs elkai (LKH-3): pip install elkai==2.0.1") from None
    n = len(points)
    dist = distance_matrix(np.asarray(points, dtype=np.float64))
    if n <= 3:
        return canonical_tour(np.arange(n))
    scaled = np.rint(dist * 1e7).astype(np.int64).tolist()
    tour = elkai.DistanceMatrix(scaled).solve_tsp(runs=runs)[:-1]
    return canonical_tour(tour)


# ---- generation -------------------------------------------------------------------------------

def _label(problem, points):
    if problem == "convex_hull":
        return convex_hull(points)
    if problem == "delaunay":
        return delaunay(points).reshape(-1)
    raise ValueError(problem)


def generate(problem, n_range, count, seed, exact_max_n=EXACT_MAX_N, lkh_runs=10):
    """List of (points (n, 2), label) with labels 0-based: hull vertices (open), flattened Delaunay
    triples, or the TSP tour (open); plus the TSP reference kind per example ("exact"/"lkh")."""
    if problem not in PROBLEMS:
        raise ValueError(f"unknown problem {problem!r}; expected one of {', '.join(PROBLEMS)}")
    from scipy.spatial import QhullError

    lo, hi = n_range
    rng = np.random.default_rng(seed)
    examples, refs = [], []
    while len(examples) < count:
        n = int(rng.integers(lo, hi + 1))
        points = random_points(rng, n)
        if problem == "tsp":
            examples.append((points, None))
            refs.append("exact" if n <= exact_max_n else "lkh")
            continue
        try:
            examples.append((points, _label(problem, points)))
        except QhullError:
            continue  # degenerate set: draw again from the same stream
    if problem == "tsp":
        _solve_tsp(examples, exact_max_n, lkh_runs)
    return examples, refs


def _solve_tsp(examples, exact_max_n, lkh_runs):
    """Fill the tours in place: Held-Karp batched by n for small n, LKH one by one otherwise."""
    by_n = {}
    for i, (points, _) in enumerate(examples):
        by_n.setdefault(len(points), []).append(i)
    for n, idx in sorted(by_n.items()):
        if n <= exact_max_n:
            pts = np.stack([examples[i][0] for i in idx])
            tours, _ = held_karp_batch(distance_matrix(pts))
            for i, t in zip(idx, tours):
                examples[i] = (examples[i][0], t)
        else:
            for i in idx:
                examples[i] = (examples[i][0], lkh_tour(examples[i][0], lkh_runs))


def reference_kind(refs):
    kinds = sorted(set(refs))
    return kinds[0] if len(kinds) == 1 else "mixed"


def main(argv=None):
    from .pointer_format import write_pointer_file

    p = argparse.ArgumentParser(prog="python -m fairseq_nat_ext.data.pointer_geometry",
                                description="write a pointer-network geometry file (published text format)")
    p.add_argument("--problem", required=True, choices=PROBLEMS)
    p.add_argument("--n", required=True, help="number of points: N or LO-HI (uniform per example)")
    p.add_argument("--count", type=int, required=True, help="number of examples")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True, help="output file, e.g. DIR/train.txt")
    p.add_argument("--exact-max-n", type=int, default=EXACT_MAX_N,
                   help="TSP: Held-Karp up to this n, LKH (elkai) above")
    p.add_argument("--lkh-runs", type=int, default=10, help="TSP: LKH runs per instance")
    args = p.parse_args(argv)
    try:
        n_range = parse_n_range(args.n)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.count < 1:
        print("error: --count must be >= 1", file=sys.stderr)
        return 1
    if args.exact_max_n > 16:
        print("error: --exact-max-n above 16 needs too much memory for Held-Karp", file=sys.stderr)
        return 1
    examples, refs = generate(args.problem, n_range, args.count, args.seed, args.exact_max_n, args.lkh_runs)
    header = {"problem": args.problem, "n": args.n, "count": args.count, "seed": args.seed}
    if args.problem == "tsp":
        header["reference"] = reference_kind(refs)
        header["exact_max_n"] = args.exact_max_n
        if "lkh" in refs:
            header["lkh_runs"] = args.lkh_runs
    write_pointer_file(args.out, args.problem, examples, header)
    print(f"{args.out}: {len(examples)} {args.problem} examples, n={args.n}, seed={args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
