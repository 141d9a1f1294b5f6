"""Training-time augmentation of pointer examples by the symmetries that keep both the input
distribution (points uniform in [0, 1]^2, in no particular order) and the label.

* ``dihedral``: one of the 8 symmetries of the unit square (swap x and y, mirror x, mirror y) applied
  to the coordinates.  Hull vertices, Delaunay triangles and the edges of an optimal tour are the same
  index sets afterwards.  A reflection (an odd number of the three flips) reverses orientation, so the
  counter-clockwise hull is read backwards from its lowest index; the canonical tour (from city 1, the
  second city lower than the last) and the sorted triangles depend on indices only and do not change.
* ``permute``: the points in a random order; the output follows its points and is brought back to the
  canonical form (hull rotated to its lowest index, tour from city 1 in the canonical direction,
  triangles sorted).

Sequence accuracy, area coverage, triangle coverage and tour length are all invariant under both, so
an augmented example is a new, correctly labelled example of the same distribution (tested against the
generators' labels recomputed on the transformed points).  Outputs are 0-based output sequences as
:class:`~fairseq_nat_ext.data.pointer_format.PointerData` holds them (hull and tour closed).
"""
import numpy as np

from .pointer_format import canonical_sequence

AUGMENTATIONS = ("dihedral", "permute")


def parse_augment(text):
    """'none' | 'dihedral' | 'permute' | 'dihedral,permute' -> tuple of names (ValueError naming the bad one)."""
    names = tuple(t for t in (text or "none").split(",") if t and t != "none")
    for t in names:
        if t not in AUGMENTATIONS:
            raise ValueError(f"unknown augmentation {t!r} (none, or a comma-separated subset of "
                             f"{', '.join(AUGMENTATIONS)})")
    return names


def dihedral(points, code):
    """Apply symmetry ``code`` in 0..7 (bit 0: swap x/y, bit 1: x -> 1 - x, bit 2: y -> 1 - y);
    returns (points, whether it reverses orientation)."""
    p = points[:, ::-1] if code & 1 else points
    p = p.copy()
    if code & 2:
        p[:, 0] = 1.0 - p[:, 0]
    if code & 4:
        p[:, 1] = 1.0 - p[:, 1]
    return p, bin(code).count("1") % 2 == 1


def augment_example(problem, points, out, rng, names):
    """points (n, 2), out (k,) 0-based canonical output sequence, rng a numpy Generator, names from
    :func:`parse_augment` -> (points, out) of a transformed example."""
    points = np.asarray(points)
    out = np.asarray(out, dtype=np.int64)
    if "dihedral" in names:
        points, reflected = dihedral(points, int(rng.integers(8)))
        if reflected and problem == "convex_hull":
            out = out[::-1].copy()  # closed: [a, ..., a] reversed is still closed on a
    if "permute" in names:
        perm = rng.permutation(len(points))  # new point i is old point perm[i]
        inverse = np.empty_like(perm)
        inverse[perm] = np.arange(len(perm))
        points = points[perm]
        out = inverse[out]
    return points, canonical_sequence(problem, out)
