"""PNG of predicted vs true outputs for a few examples (matplotlib, Agg backend): hulls and tours as
closed polygons (true: thick grey, predicted: thin coloured), Delaunay triangles as edges (true:
grey, predicted: coloured, dashed where the true triangulation lacks the edge)."""
import logging
import os

import numpy as np

from fairseq_nat_ext.evaluation.pointer_metrics import open_cycle


def _closed(points, seq):
    body = open_cycle(seq)
    return points[body + body[:1]] if body else np.zeros((0, 2))


def _edges(seq):
    seq = [int(v) for v in seq]
    out = set()
    for i in range(0, len(seq) - len(seq) % 3, 3):
        a, b, c = sorted(seq[i:i + 3])
        out |= {(a, b), (a, c), (b, c)}
    return out


def plot_examples(path, problem, examples, title=""):
    """examples: list of (points (n, 2), predicted seq, reference seq, caption); writes ``path``."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = max(1, len(examples))
    cols = min(k, 4)
    rows = (k + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.4 * rows), dpi=110, squeeze=False)
    for ax in axes.flat:
        ax.set_axis_off()
    for ax, (points, pred, ref, caption) in zip(axes.flat, examples):
        points = np.asarray(points, dtype=np.float64)
        ax.set_axis_on()
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_aspect("equal")
        if problem == "delaunay":
            true_edges = _edges(ref)
            for a, b in true_edges:
                ax.plot(*points[[a, b]].T, color="0.7", lw=3, zorder=1)
            for a, b in _edges(pred):
                ax.plot(*points[[a, b]].T, color="tab:red", lw=1,
                        ls="-" if (a, b) in true_edges else "--", zorder=2)
        else:
            ax.plot(*_closed(points, ref).T, color="0.7", lw=3, zorder=1, label="true")
            ax.plot(*_closed(points, pred).T, color="tab:red", lw=1, zorder=2, label="predicted")
        ax.scatter(points[:, 0], points[:, 1], s=6, color="k", zorder=3)
        ax.set_title(caption, fontsize=7)
    if examples and problem != "delaunay":
        axes.flat[0].legend(fontsize=6, loc="upper right")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
