"""Pointer-example augmentation: a transformed example carries exactly the label the generators compute
on its transformed points (slow reference: scipy's hull / Delaunay, Held-Karp), and the training split
draws it afresh per epoch, reproducibly, while other splits are left as written."""
import os

import numpy as np
import pytest

from conftest import PLUGIN_DIR

from fairseq_nat_ext.data import pointer_geometry as geo
from fairseq_nat_ext.data.pointer_augment import augment_example, dihedral, parse_augment
from fairseq_nat_ext.data.pointer_format import output_sequence

AUGMENT = [("dihedral",), ("permute",), ("dihedral", "permute")]


def reference_output(problem, points):
    """The generators' canonical output sequence for these points (recomputed from scratch)."""
    if problem == "tsp":
        label, _ = geo.held_karp(points)
    else:
        label = geo._label(problem, points)
    return output_sequence(problem, label)


@pytest.mark.parametrize("names", AUGMENT)
@pytest.mark.parametrize("problem,n", [("convex_hull", 9), ("delaunay", 8), ("tsp", 7)])
def test_augmented_label_equals_the_label_recomputed_on_the_transformed_points(problem, n, names):
    examples, _ = geo.generate(problem, (n, n), 24, seed=5)
    rng = np.random.default_rng(0)
    changed = 0
    for points, label in examples:
        out = output_sequence(problem, label)
        new_points, new_out = augment_example(problem, points, out, rng, names)
        assert new_points.shape == points.shape
        assert new_out.tolist() == reference_output(problem, new_points).tolist()
        changed += not np.array_equal(new_points, points)
    assert changed >= 16  # the identity is 1 of 8 symmetries / 1 of n! orders


def test_every_square_symmetry_maps_the_unit_square_onto_itself_and_flags_reflections():
    p = np.array([[0.1, 0.2], [0.7, 0.3], [0.4, 0.9]])
    seen = set()
    for code in range(8):
        q, reflected = dihedral(p, code)
        assert ((q >= 0) & (q <= 1)).all()
        # orientation of the triangle flips exactly for reflections
        area = lambda t: (t[1, 0] - t[0, 0]) * (t[2, 1] - t[0, 1]) - (t[1, 1] - t[0, 1]) * (t[2, 0] - t[0, 0])
        assert (area(q) < 0) == reflected
        seen.add(q.round(6).tobytes())
    assert len(seen) == 8
    assert np.array_equal(p, np.array([[0.1, 0.2], [0.7, 0.3], [0.4, 0.9]]))  # input untouched


def test_parse_augment():
    assert parse_augment("none") == () and parse_augment(None) == ()
    assert parse_augment("dihedral,permute") == ("dihedral", "permute")
    with pytest.raises(ValueError, match="unknown augmentation 'rotate'"):
        parse_augment("dihedral,rotate")


def _task(data_dir, augment, seed=1):
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [data_dir, "--user-dir", PLUGIN_DIR, "--task", "pointer_geometry",
                                                "--problem", "convex_hull", "--arch", "pointer_lstm",
                                                "--criterion", "pointer_cross_entropy", "--augment", augment,
                                                "--seed", str(seed)])
    return tasks.setup_task(args)


@pytest.fixture(scope="module")
def hull_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hull")
    for split, seed in (("train", 1), ("valid", 2)):
        assert geo.main(["--problem", "convex_hull", "--n", "6-9", "--count", "20", "--seed", str(seed),
                         "--out", str(d / f"{split}.txt")]) == 0
    return str(d)


def _examples(ds):
    return [(ds[i]["coords"].numpy().copy(), ds[i]["slots"].tolist()) for i in range(len(ds))]


def _same(xs, ys):
    return all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(xs, ys))


def test_training_split_is_augmented_per_epoch_and_reproducibly(hull_dir):
    task = _task(hull_dir, "dihedral,permute")
    task.load_dataset("train")
    task.load_dataset("valid")
    train = task.dataset("train")
    epoch1 = _examples(train)
    assert _same(_examples(train), epoch1)  # same epoch, same draw
    train.set_epoch(2)
    epoch2 = _examples(train)
    assert sum(not np.array_equal(a[0], b[0]) for a, b in zip(epoch1, epoch2)) >= 18
    for coords, slots in epoch2:  # each is a correctly labelled hull (the slow reference)
        assert slots[:-1] == (reference_output("convex_hull", coords.astype(np.float64)) + 1).tolist()
        assert slots[-1] == 0
    # another task with the same seed draws the same examples; another seed other ones
    again = _task(hull_dir, "dihedral,permute")
    again.load_dataset("train")
    again.dataset("train").set_epoch(2)
    assert _same(_examples(again.dataset("train")), epoch2)
    other = _task(hull_dir, "dihedral,permute", seed=7)
    other.load_dataset("train")
    other.dataset("train").set_epoch(2)
    assert not _same(_examples(other.dataset("train")), epoch2)
    # the validation split is read as written
    from fairseq_nat_ext.data.pointer_format import read_pointer_file

    data = read_pointer_file(os.path.join(hull_dir, "valid.txt"), "convex_hull")
    valid = task.dataset("valid")
    valid.set_epoch(3)
    for i in range(len(valid)):
        assert np.allclose(valid[i]["coords"].numpy(), data.points_of(i))
        assert valid[i]["slots"][:-1].tolist() == (data.output_of(i) + 1).tolist()


def test_unknown_augmentation_is_a_one_line_error(hull_dir):
    from fairseq_nat_ext.compat import InputError

    with pytest.raises(InputError, match="--augment flip"):
        _task(hull_dir, "flip")
