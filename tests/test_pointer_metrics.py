"""Pointer-network metrics against hand-computed cases, and the PNG of examples."""
import numpy as np
import pytest

from fairseq_nat_ext.evaluation import pointer_metrics as pm
from benchmarks.pointer_plots import plot_examples

# unit square (0-3) with its centre (4)
SQUARE = np.array([[0, 0], [1, 0], [1, 1], [0, 1], [0.5, 0.5]], dtype=float)


def test_area_coverage_hand_computed():
    ref = [0, 1, 2, 3, 0]
    assert pm.polygon_area(SQUARE, ref) == pytest.approx(1.0)
    assert pm.polygon_area(SQUARE, [0, 3, 2, 1]) == pytest.approx(-1.0)  # clockwise
    assert pm.hull_area_coverage(SQUARE, ref, ref) == pytest.approx(1.0)
    assert pm.hull_area_coverage(SQUARE, [0, 1, 2, 0], ref) == pytest.approx(0.5)
    assert pm.hull_area_coverage(SQUARE, [0, 1, 4, 3, 0], ref) == pytest.approx(0.5)  # notch to the centre
    assert pm.hull_area_coverage(SQUARE, [0, 3, 2, 1, 0], ref) == pytest.approx(1.0)  # orientation ignored
    assert pm.hull_area_coverage(SQUARE, [0, 2, 1, 3, 0], ref) == 0.0  # bow-tie: not simple
    assert pm.hull_area_coverage(SQUARE, [0, 1, 0], ref) == 0.0  # fewer than 3 vertices
    assert pm.hull_area_coverage(SQUARE, [0, 1, 2, 1, 3, 0], ref) == 0.0  # repeated vertex


def test_simple_polygon_detects_touching_edges():
    pts = np.array([[0, 0], [2, 0], [2, 2], [1, 0], [0, 2]], dtype=float)  # vertex 3 lies on edge 0-1
    assert not pm.is_simple_polygon(pts, [0, 1, 2, 3, 4])
    assert pm.is_simple_polygon(pts, [0, 1, 2, 4])


def test_sequence_accuracy_uses_canonical_forms():
    refs = [[0, 1, 2, 3, 0], [0, 2, 1, 3, 0]]
    assert pm.sequence_accuracy("convex_hull", [[1, 2, 3, 0, 1], [0, 2, 1, 3, 0]], refs) == 1.0
    assert pm.sequence_accuracy("convex_hull", [[0, 3, 2, 1, 0], [0, 2, 1, 3, 0]], refs) == 0.5  # orientation counts
    assert pm.sequence_accuracy("tsp", [[0, 3, 2, 1, 0], [1, 2, 0, 3, 1]], refs) == 1.0  # direction does not
    assert pm.sequence_accuracy("delaunay", [[2, 1, 0, 3, 4, 2]], [[0, 1, 2, 2, 3, 4]]) == 1.0
    assert pm.sequence_accuracy("delaunay", [[0, 1, 2]], [[0, 1, 2, 2, 3, 4]]) == 0.0
    with pytest.raises(ValueError):
        pm.sequence_accuracy("tsp", [[0]], [])


def test_triangle_coverage_hand_computed():
    ref = [0, 1, 2, 1, 2, 3, 2, 3, 4, 0, 3, 4]
    assert pm.triangle_coverage([2, 1, 0, 4, 3, 2], ref) == pytest.approx(0.5)
    assert pm.triangle_coverage([0, 1, 4], ref) == 0.0
    assert pm.triangle_coverage(ref, ref) == 1.0


def test_tour_length_validity_and_gap():
    assert pm.tour_length(SQUARE, [0, 1, 2, 3, 0]) == pytest.approx(4.0)
    assert pm.tour_length(SQUARE, [0, 1, 2, 3]) == pytest.approx(4.0)
    assert pm.tour_length(SQUARE, [0, 2, 1, 3, 0]) == pytest.approx(2 + 2 * np.sqrt(2))
    assert pm.is_valid_tour(4, [0, 2, 1, 3, 0]) and pm.is_valid_tour(4, [0, 2, 1, 3])
    assert not pm.is_valid_tour(4, [0, 2, 2, 3, 0]) and not pm.is_valid_tour(5, [0, 2, 1, 3, 0])
    assert pm.mean_gap([4.2, 3.8], [4.0, 3.6]) == pytest.approx(8.0 / 7.6 - 1)


@pytest.mark.parametrize("problem", ["convex_hull", "delaunay", "tsp"])
def test_plot_writes_a_png(tmp_path, problem):
    ref = [0, 1, 2, 3, 0] if problem != "delaunay" else [0, 1, 4, 1, 2, 4, 2, 3, 4, 0, 3, 4]
    pred = [0, 1, 2, 0] if problem != "delaunay" else [0, 1, 4, 0, 2, 3]
    path = plot_examples(str(tmp_path / f"{problem}.png"), problem,
                         [(SQUARE, pred, ref, "a"), (SQUARE, ref, ref, "b")], title=problem)
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
