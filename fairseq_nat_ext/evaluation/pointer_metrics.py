"""Metrics of the pointer-network benchmark (Vinyals et al. 2015, section 4).  Pure numpy; indices
0-based; a prediction is the output sequence without the end (hull and tour closed or open).

* ``sequence_accuracy``: share of examples whose prediction equals the reference after bringing both
  to the canonical form of the problem (hull: rotated to its lowest index, orientation kept; tour:
  rotated and direction fixed; triangulation: the set of triangles).
* ``hull_area_coverage``: area of the predicted polygon / area of the true hull, 0 when the
  prediction is not a simple polygon of >= 3 distinct points (the paper's failures); the mean over
  examples is reported.
* ``triangle_coverage``: share of the true triangles that the prediction contains; mean over examples.
* TSP: ``tour_length`` of the closed tour; ``is_valid_tour``; ``mean_gap`` = mean predicted length /
  mean reference length - 1.
"""
import numpy as np


def open_cycle(seq):
    """Drop the closing repetition of a closed cycle (hull, tour)."""
    seq = [int(v) for v in seq]
    return seq[:-1] if len(seq) >= 2 and seq[0] == seq[-1] else seq


def canonical_hull(seq):
    body = open_cycle(seq)
    if not body:
        return ()
    k = body.index(min(body))
    return tuple(body[k:] + body[:k])


def canonical_tour(seq):
    body = open_cycle(seq)
    if not body:
        return ()
    k = body.index(min(body))
    body = body[k:] + body[:k]
    if len(body) >= 3 and body[1] > body[-1]:
        body = body[:1] + body[1:][::-1]
    return tuple(body)


def triangle_set(seq):
    seq = [int(v) for v in seq]
    return {tuple(sorted(seq[i:i + 3])) for i in range(0, len(seq) - len(seq) % 3, 3)}


def canonical_output(problem, seq):
    if problem == "convex_hull":
        return canonical_hull(seq)
    if problem == "tsp":
        return canonical_tour(seq)
    if problem == "delaunay":
        seq = [int(v) for v in seq]
        return frozenset(triangle_set(seq)) if len(seq) % 3 == 0 else None
    raise ValueError(problem)


def sequence_accuracy(problem, preds, refs):
    """Share of exact matches (canonical forms)."""
    if len(preds) != len(refs):
        raise ValueError(f"{len(preds)} predictions for {len(refs)} references")
    if not refs:
        return 0.0
    hits = sum(canonical_output(problem, p) == canonical_output(problem, r) for p, r in zip(preds, refs))
    return hits / len(refs)


def polygon_area(points, cycle):
    """Shoelace area (positive counter-clockwise) of the polygon through ``points[cycle]``."""
    body = open_cycle(cycle)
    if len(body) < 3:
        return 0.0
    p = np.asarray(points, dtype=np.float64)[body]
    q = np.roll(p, -1, axis=0)
    return 0.5 * float((p[:, 0] * q[:, 1] - q[:, 0] * p[:, 1]).sum())


def _cross(o, a, b):
    return (a[..., 0] - o[..., 0]) * (b[..., 1] - o[..., 1]) - (a[..., 1] - o[..., 1]) * (b[..., 0] - o[..., 0])


def is_simple_polygon(points, cycle):
    """True when the closed polygon has >= 3 distinct vertices and no two non-adjacent edges touch."""
    body = open_cycle(cycle)
    m = len(body)
    if m < 3 or len(set(body)) != m:
        return False
    p = np.asarray(points, dtype=np.float64)[body]
    a, b = p, np.roll(p, -1, axis=0)  # edge i: a[i] -> b[i]
    i, j = np.triu_indices(m, k=1)
    keep = (j - i > 1) & ~((i == 0) & (j == m - 1))  # edges sharing a vertex are adjacent
    i, j = i[keep], j[keep]
    if len(i) == 0:
        return True
    d1, d2 = _cross(a[j], b[j], a[i]), _cross(a[j], b[j], b[i])
    d3, d4 = _cross(a[i], b[i], a[j]), _cross(a[i], b[i], b[j])
    proper = (d1 * d2 < 0) & (d3 * d4 < 0)
    eps = 1e-15

    def on_segment(o, e, q, d):  # q collinear with o-e and inside its box
        inside = (np.minimum(o, e) - eps <= q) & (q <= np.maximum(o, e) + eps)
        return (np.abs(d) <= eps) & inside.all(-1)

    touch = (on_segment(a[j], b[j], a[i], d1) | on_segment(a[j], b[j], b[i], d2)
             | on_segment(a[i], b[i], a[j], d3) | on_segment(a[i], b[i], b[j], d4))
    return not bool((proper | touch).any())


def hull_area_coverage(points, pred, ref):
    """Predicted polygon area / true hull area (0 for an invalid polygon), capped at 1."""
    true_area = abs(polygon_area(points, ref))
    if true_area <= 0 or not is_simple_polygon(points, pred):
        return 0.0
    return min(1.0, abs(polygon_area(points, pred)) / true_area)


def triangle_coverage(pred, ref):
    """Share of the reference triangles present in the prediction."""
    true = triangle_set(ref)
    return len(true & triangle_set(pred)) / len(true) if true else 0.0


def is_valid_tour(n, seq):
    """A closed or open tour visiting each of the n cities exactly once."""
    body = open_cycle(seq)
    return len(body) == n and sorted(body) == list(range(n))


def tour_length(points, seq):
    body = open_cycle(seq)
    p = np.asarray(points, dtype=np.float64)[body]
    return float(np.sqrt(((p - np.roll(p, -1, axis=0)) ** 2).sum(-1)).sum())


def mean_gap(pred_lengths, ref_lengths):
    return float(np.mean(pred_lengths) / np.mean(ref_lengths) - 1.0)
