"""Pointer-network data: generators against brute force, the text format and its one-line errors."""
import itertools
import math
import sys

import numpy as np
import pytest

import fairseq_nat_ext  # noqa: F401
from fairseq_nat_ext.compat import InputError
from fairseq_nat_ext.data import pointer_geometry as geo
from fairseq_nat_ext.data.pointer_format import read_pointer_file, write_pointer_file


def cross(o, a, b):
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def brute_hull_vertices(p):
    """A point is a hull vertex iff it lies in no triangle of three other points (general position)."""
    n = len(p)
    out = set()
    for i in range(n):
        inside = False
        for a, b, c in itertools.combinations([j for j in range(n) if j != i], 3):
            s = [cross(p[a], p[b], p[i]), cross(p[b], p[c], p[i]), cross(p[c], p[a], p[i])]
            if all(x > 0 for x in s) or all(x < 0 for x in s):
                inside = True
                break
        if not inside:
            out.add(i)
    return out


def brute_delaunay(p):
    """Triangles whose circumcircle holds no other point (general position)."""
    n = len(p)
    tris = set()
    for a, b, c in itertools.combinations(range(n), 3):
        ax, ay = p[a]
        bx, by = p[b]
        cx, cy = p[c]
        d = 2 * (ax * (by - cy) + bx * (cy - ay) + cx * (ay - by))
        if abs(d) < 1e-14:
            continue
        ux = ((ax ** 2 + ay ** 2) * (by - cy) + (bx ** 2 + by ** 2) * (cy - ay) + (cx ** 2 + cy ** 2) * (ay - by)) / d
        uy = ((ax ** 2 + ay ** 2) * (cx - bx) + (bx ** 2 + by ** 2) * (ax - cx) + (cx ** 2 + cy ** 2) * (bx - ax)) / d
        r2 = (ax - ux) ** 2 + (ay - uy) ** 2
        if all((p[j][0] - ux) ** 2 + (p[j][1] - uy) ** 2 > r2 for j in range(n) if j not in (a, b, c)):
            tris.add((a, b, c))
    return tris


def brute_tsp(p):
    n = len(p)
    best = math.inf
    for perm in itertools.permutations(range(1, n)):
        tour = (0,) + perm
        best = min(best, sum(math.dist(p[tour[i]], p[tour[(i + 1) % n]]) for i in range(n)))
    return best


@pytest.mark.parametrize("n", [3, 4, 5, 7, 9])
def test_convex_hull_matches_brute_force_ccw_from_lowest_index(n):
    rng = np.random.default_rng(n)
    for _ in range(20):
        p = geo.random_points(rng, n)
        hull = geo.convex_hull(p).tolist()
        assert set(hull) == brute_hull_vertices(p)
        assert hull[0] == min(hull)
        m = len(hull)
        for i in range(m):  # every turn is a left turn: counter-clockwise and strictly convex
            assert cross(p[hull[i]], p[hull[(i + 1) % m]], p[hull[(i + 2) % m]]) > 0
        for j in range(n):  # every point inside or on the hull
            assert all(cross(p[hull[i]], p[hull[(i + 1) % m]], p[j]) >= 0 for i in range(m))


@pytest.mark.parametrize("n", [4, 5, 6, 8])
def test_delaunay_matches_empty_circumcircle_brute_force_in_canonical_order(n):
    rng = np.random.default_rng(100 + n)
    for _ in range(15):
        p = geo.random_points(rng, n)
        tri = geo.delaunay(p)
        assert {tuple(t) for t in tri.tolist()} == brute_delaunay(p)
        assert (np.diff(tri, axis=1) > 0).all()  # each triple increasing
        assert [tuple(t) for t in tri.tolist()] == sorted(tuple(t) for t in tri.tolist())


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7])
def test_held_karp_matches_all_permutations(n):
    rng = np.random.default_rng(200 + n)
    pts = np.stack([geo.random_points(rng, n) for _ in range(8)])
    tours, lengths = geo.held_karp_batch(geo.distance_matrix(pts))
    for p, tour, length in zip(pts, tours, lengths):
        assert sorted(tour.tolist()) == list(range(n))
        assert tour[0] == 0 and (n < 3 or tour[1] < tour[-1])
        assert length == pytest.approx(brute_tsp(p), abs=1e-12)
        assert geo.tour_length(p, tour) == pytest.approx(length, abs=1e-12)


def test_held_karp_batched_equals_one_by_one_and_chunks():
    rng = np.random.default_rng(7)
    pts = np.stack([geo.random_points(rng, 9) for _ in range(6)])
    whole = geo.held_karp_batch(geo.distance_matrix(pts))
    chunked = geo.held_karp_batch(geo.distance_matrix(pts), max_chunk_bytes=1)  # one instance per chunk
    single = [geo.held_karp(p) for p in pts]
    assert np.array_equal(whole[0], chunked[0]) and np.allclose(whole[1], chunked[1])
    assert all(np.array_equal(t, s[0]) for t, s in zip(whole[0], single))


def test_lkh_finds_the_optimum_on_small_instances():
    pytest.importorskip("elkai")
    rng = np.random.default_rng(11)
    for _ in range(3):
        p = geo.random_points(rng, 10)
        tour = geo.lkh_tour(p)
        assert tour[0] == 0 and sorted(tour.tolist()) == list(range(10)) and tour[1] < tour[-1]
        assert geo.tour_length(p, tour) == pytest.approx(geo.held_karp(p)[1], abs=1e-6)


def test_lkh_without_elkai_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "elkai", None)
    with pytest.raises(InputError, match="pip install elkai"):
        geo.lkh_tour(np.random.default_rng(0).random((15, 2)))


def test_generation_is_seeded_and_mixes_exact_and_lkh(tmp_path):
    a, refs = geo.generate("tsp", (5, 7), 6, seed=3)
    b, _ = geo.generate("tsp", (5, 7), 6, seed=3)
    c, _ = geo.generate("tsp", (5, 7), 6, seed=4)
    assert all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(a, b))
    assert not all(np.array_equal(x[0], y[0]) for x, y in zip(a, c))
    assert refs == ["exact"] * 6
    assert geo.reference_kind(refs) == "exact"
    if _has_elkai():
        d, refs = geo.generate("tsp", (5, 7), 6, seed=3, exact_max_n=5)
        assert set(refs) == {"exact", "lkh"} and geo.reference_kind(refs) == "mixed"
        for (p, tour), (_, exact) in zip(d, a):  # LKH finds the optimum at this size
            assert geo.tour_length(p, tour) == pytest.approx(geo.tour_length(p, exact), abs=1e-6)


def _has_elkai():
    try:
        import elkai  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("problem", ["convex_hull", "delaunay", "tsp"])
def test_write_read_round_trip_is_self_consistent(tmp_path, problem):
    path = str(tmp_path / "train.txt")
    assert geo.main(["--problem", problem, "--n", "5-8", "--count", "12", "--seed", "2", "--out", path]) == 0
    data = read_pointer_file(path, problem)
    assert len(data) == 12 and data.header["problem"] == problem and data.header["seed"] == "2"
    if problem == "tsp":
        assert data.header["reference"] == "exact"
    lines = [ln for ln in open(path) if not ln.startswith("#")]
    for i in range(len(data)):
        p, out = data.points_of(i), data.output_of(i)
        assert 5 <= len(p) <= 8
        # the labels are those of the points as read back from the file
        if problem == "convex_hull":
            assert out.tolist() == geo.convex_hull(p).tolist() + [out[0]]
        elif problem == "delaunay":
            assert out.tolist() == geo.delaunay(p).reshape(-1).tolist()
        else:
            assert out[0] == out[-1] == 0
            assert geo.tour_length(p, out[:-1]) == pytest.approx(geo.held_karp(p)[1], abs=1e-9)
        toks = lines[i].split()
        assert toks[2 * len(p)] == "output" and [int(t) for t in toks[2 * len(p) + 1:]] == (out + 1).tolist()


def test_reader_canonicalises_published_style_outputs(tmp_path):
    pts = "0.0 0.0 1.0 0.0 1.0 1.0 0.0 1.0 0.5 0.5"
    path = tmp_path / "x.txt"
    path.write_text(f"{pts} output 3 4 1 2 3\n")  # closed, started elsewhere
    assert read_pointer_file(str(path), "convex_hull").output_of(0).tolist() == [0, 1, 2, 3, 0]
    path.write_text(f"{pts} output 3 4 1 2\n")  # open
    assert read_pointer_file(str(path), "convex_hull").output_of(0).tolist() == [0, 1, 2, 3, 0]
    path.write_text(f"{pts} output 5 3 2 4 1 5\n")  # tour from city 5
    assert read_pointer_file(str(path), "tsp").output_of(0).tolist() == [0, 3, 1, 2, 4, 0]
    path.write_text(f"{pts} output 5 2 1 4 3 5\n")
    assert read_pointer_file(str(path), "delaunay").output_of(0).tolist() == [0, 1, 4, 2, 3, 4]


P3 = "0.1 0.2 0.3 0.4 0.9 0.1"


@pytest.mark.parametrize("problem,line,message", [
    ("convex_hull", f"{P3} 1 2 3 1", "exactly one 'output'"),
    ("convex_hull", f"{P3} 0.5 output 1 2 3 1", "wrong count: 7 coordinates"),
    ("convex_hull", "0.1 0.2 0.3 0.4 output 1 2 1", "wrong count: 2 points"),
    ("convex_hull", f"0.1 nan 0.3 0.4 0.9 0.1 output 1 2 3 1", "coordinate 2 is 'nan'"),
    ("convex_hull", f"0.1 0.2 inf 0.4 0.9 0.1 output 1 2 3 1", "coordinate 3 is 'inf'"),
    ("convex_hull", f"0.1 0.2 0.3 abc 0.9 0.1 output 1 2 3 1", "coordinate 4 'abc' is not a number"),
    ("convex_hull", f"{P3} output 1 2 4 1", "index 4 out of range 1..3"),
    ("convex_hull", f"{P3} output 1 0 3 1", "index 0 out of range"),
    ("convex_hull", f"{P3} output 1 x 3 1", "index 'x' is not an integer"),
    ("convex_hull", f"{P3} output 1 2 1", "wrong count: a hull of 2 vertices"),
    ("convex_hull", f"{P3} output 1 2 2 3 1", "index 2 repeated"),
    ("delaunay", f"{P3} output 1 2 3 1", "not a positive multiple of 3"),
    ("delaunay", f"{P3} output 1 2 2", "repeats an index"),
    ("delaunay", f"{P3} output 1 2 3 3 2 1", "appears twice"),
    ("tsp", f"{P3} output 1 2 3", "wrong count: a tour of 3 indices, expected 4"),
    ("tsp", f"{P3} output 1 2 3 2", "does not return"),
    ("tsp", f"{P3} output 1 2 2 1", "city 2 visited twice"),
])
def test_reader_errors_name_file_and_line(tmp_path, problem, line, message):
    path = tmp_path / "bad.txt"
    path.write_text(f"# pointer_geometry problem={problem}\n{P3} output {'1 2 3 1' if problem != 'delaunay' else '1 2 3'}\n"
                    f"{line}\n")
    with pytest.raises(InputError) as info:
        read_pointer_file(str(path), problem)
    text = str(info.value)
    assert f"{path}:3:" in text and message in text and "\n" not in text


def test_reader_rejects_missing_file_empty_line_and_wrong_problem(tmp_path):
    with pytest.raises(InputError, match="not found"):
        read_pointer_file(str(tmp_path / "none.txt"), "tsp")
    path = tmp_path / "a.txt"
    path.write_text(f"{P3} output 1 2 3 1\n\n")
    with pytest.raises(InputError, match=r"a.txt:2: empty line"):
        read_pointer_file(str(path), "tsp")
    write_pointer_file(str(path), "tsp", [(np.zeros((3, 2)), np.arange(3))], {"problem": "tsp"})
    with pytest.raises(InputError, match="holds tsp examples, not convex_hull"):
        read_pointer_file(str(path), "convex_hull")


def test_cli_rejects_bad_n(capsys):
    assert geo.main(["--problem", "tsp", "--n", "2", "--count", "1", "--out", "/nonexistent/x"]) == 1
    assert "3 <= LO <= HI" in capsys.readouterr().err
