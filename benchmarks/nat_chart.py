"""The README's overview of the NAT methods on Multi30K: sacreBLEU against batch-1 speed-up over the AT
teacher (fairseq ``transformer``, beam 5) measured in the SAME run (matplotlib, Agg backend).

    python -m benchmarks.nat_chart                      # -> benchmarks/results/nat_overview.png
    python -m benchmarks.nat_chart A.json B.json --out chart.png

Speed-up = the teacher's ``beam=5`` batch-1 latency / the row's batch-1 latency, both from one results
file (the rows of one file were measured in one run, on one machine): a row is never compared with
another file's teacher, so a file without a ``fairseq:transformer`` ``beam=5`` row is left out (and
named under the chart).  Shown: the teacher (beam 5 at x = 1, and beam 1) and the NAT rows trained on
distilled data with their canonical decodings (no ``dedup=1`` post-processing); a system measured in
several files is drawn from the first file that has it (in the order given).  One marker per method
family, each point labelled with its decoding.  fairseq's own NAT implementations are left out: their
rows in mask_predict.json and fertility_refinement.json were measured in earlier runs than those files'
teacher rows (docs/benchmarks.md says which), so no speed-up of theirs is like for like here.
"""
import argparse
import os
import sys

from fairseq_nat_ext.evaluation.decoding import parse_decoding
from fairseq_nat_ext.evaluation.results import REFERENCE_SYSTEM, load_results

from . import REPO

RESULTS = os.path.join(REPO, "benchmarks", "results")
DEFAULT_BENCHMARKS = ("mask_predict", "ctc_imputer", "edit_based_insertion_like", "edit_based_levt", "npd_s33",
                      "fertility_refinement")
DEFAULT_OUT = os.path.join(RESULTS, "nat_overview.png")
TEACHER = ("fairseq:transformer", "beam=5")

# system -> (legend label, marker, colour); systems not listed get a generic style
FAMILIES = {
    "fairseq:transformer": ("AT teacher (fairseq transformer)", "*", "black"),
    "mask_predict": ("Mask-Predict", "o", "tab:blue"),
    "ctc_nat": ("CTC", "s", "tab:orange"),
    "imputer": ("Imputer", "D", "tab:green"),
    "nat_fertility": ("NAT + fertility (NPD)", "^", "tab:red"),
    "iterative_refinement": ("iterative refinement", "v", "tab:purple"),
    "levenshtein": ("Levenshtein Transformer", "P", "tab:brown"),
    "insertion": ("Insertion Transformer", "X", "tab:pink"),
    "kermit": ("KERMIT", "h", "tab:olive"),
}


def default_paths():
    return [os.path.join(RESULTS, f"{name}.json") for name in DEFAULT_BENCHMARKS]


def _label(row):
    """Short point label: the decoding string without what every row of its family shares."""
    parts = row["decoding"].split(",")
    if row["system"] == TEACHER[0]:
        return row["decoding"].replace("beam=", "beam ")
    if row["system"] in ("mask_predict", "fairseq:cmlm_transformer"):
        parts = [q for q in parts if not q.startswith("len_beam=")]
    if len(parts) > 1:
        parts = [q for q in parts if q != "iter=0"]
    return ", ".join(q.split("=", 1)[1] if q.startswith("fertility=") else q for q in parts)


def chart_points(paths):
    """(points, skipped): points are dicts {benchmark, system, decoding, label, bleu, latency_ms_b1,
    teacher_ms, speedup}, each row's speed-up taken against its own file's teacher; skipped lists
    (benchmark, reason) of the files left out."""
    points, skipped, seen = [], [], set()
    for path in paths:
        results = load_results(path)
        name = results["benchmark"]
        teacher = [r for r in results["rows"] if (r["system"], r["decoding"]) == TEACHER]
        if not teacher:
            skipped.append((name, "no fairseq:transformer beam=5 row in its run"))
            continue
        teacher_ms = teacher[0]["latency_ms_b1"]
        systems = set()
        for row in results["rows"]:
            system = row["system"]
            if system == REFERENCE_SYSTEM or system in seen:
                continue
            if system.startswith("fairseq:") and system != TEACHER[0]:
                continue  # another run's rows (see the module docstring)
            opts = parse_decoding(row["decoding"])
            if opts.get("dedup"):
                continue
            if system != TEACHER[0] and not row["distilled"]:
                continue
            systems.add(system)
            points.append({"benchmark": name, "system": system, "decoding": row["decoding"], "label": _label(row),
                           "bleu": row["bleu"], "latency_ms_b1": row["latency_ms_b1"], "teacher_ms": teacher_ms,
                           "speedup": teacher_ms / row["latency_ms_b1"]})
        seen |= systems
    return points, skipped


# label offsets tried in turn (points): right/above, right/below, left/above, left/below, further out
_OFFSETS = [(5, 3), (5, -9), (-5, 3), (-5, -9), (5, 10), (-5, 10), (5, -16), (-5, -16), (12, -3), (-12, -3)]


def _place_labels(fig, ax, points):
    """Annotate every point with its label at the first offset where the label's box lies inside the axes
    and overlaps no label placed before and no marker (boxes in display pixels; the axes limits and
    scale are final)."""
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    marks = []
    for p in points:
        x, y = ax.transData.transform((p["speedup"], p["bleu"]))
        marks.append(matplotlib_bbox(x - 4, y - 4, x + 4, y + 4))
    placed = []
    for p in points:
        colour = FAMILIES.get(p["system"], (None, None, "tab:gray"))[2]
        for dx, dy in _OFFSETS:
            ann = ax.annotate(p["label"], (p["speedup"], p["bleu"]), textcoords="offset points", xytext=(dx, dy),
                              fontsize=6.5, color=colour, zorder=4, ha="left" if dx > 0 else "right")
            box = ann.get_window_extent(renderer)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.overlaps(b) for b in placed + marks):
                break
            if (dx, dy) != _OFFSETS[-1]:
                ann.remove()
        placed.append(box)


def matplotlib_bbox(x0, y0, x1, y1):
    from matplotlib.transforms import Bbox

    return Bbox([[x0, y0], [x1, y1]])


def draw_chart(paths, png_path):
    """Write the chart of ``paths`` (results JSON files) to ``png_path``; returns (png_path, points, skipped)."""
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points, skipped = chart_points(paths)
    if not points:
        raise ValueError("no results file has a teacher (fairseq:transformer beam=5) row: nothing to draw")
    fig, ax = plt.subplots(figsize=(8.6, 5.6), dpi=130)
    for system in dict.fromkeys(p["system"] for p in points):
        label, marker, colour = FAMILIES.get(system, (system, "o", "tab:gray"))
        pts = [p for p in points if p["system"] == system]
        ax.scatter([p["speedup"] for p in pts], [p["bleu"] for p in pts], marker=marker,
                   s=110 if marker == "*" else 46, label=label, zorder=3,
                   color=colour, linewidths=1.3)
    teacher_bleu = [p["bleu"] for p in points if (p["system"], p["decoding"]) == TEACHER]
    ax.axvline(1.0, color="gray", lw=0.8, ls="--", zorder=1)
    if teacher_bleu:
        ax.axhline(teacher_bleu[0], color="gray", lw=0.8, ls=":", zorder=1)
    ax.set_xscale("log")
    xs, ys = [p["speedup"] for p in points], [p["bleu"] for p in points]
    ax.set_xlim(min(0.5, min(xs) / 1.3), max(xs) * 1.6)
    ax.set_ylim(min(ys) - 1.0, max(ys) + 1.0)
    ticks = [t for t in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_xlabel("speed-up over the AT teacher's beam 5, batch 1 (teacher latency / latency; log scale)")
    ax.set_ylabel("sacreBLEU (Multi30K test 2016, en-de)")
    ax.set_title("NAT methods on Multi30K: quality vs batch-1 speed-up over the same run's AT teacher",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="lower left", framealpha=0.9)
    runs = ", ".join(f"{b} (teacher {ms:.0f} ms)" for b, ms in
                     dict.fromkeys((p["benchmark"], p["teacher_ms"]) for p in points))
    note = (f"Each point is compared with the teacher measured in its own run: {runs}. Distilled training "
            "data, no dedup post-processing; fairseq's own NAT implementations are not shown (their rows come "
            "from other runs).")
    if skipped:
        note += " Not shown: " + "; ".join(f"{b} ({why})" for b, why in skipped) + "."
    fig.text(0.01, 0.005, note, fontsize=6.2, wrap=True, va="bottom", ha="left")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    _place_labels(fig, ax, points)  # after the layout: label boxes are measured in display pixels
    os.makedirs(os.path.dirname(os.path.abspath(png_path)), exist_ok=True)
    fig.savefig(png_path)
    plt.close(fig)
    return png_path, points, skipped


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.nat_chart", description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="*", help="results JSON files (default: the committed Multi30K NAT "
                   "benchmarks: " + ", ".join(DEFAULT_BENCHMARKS) + ")")
    p.add_argument("--out", default=DEFAULT_OUT, help="PNG to write [benchmarks/results/nat_overview.png]")
    args = p.parse_args(argv)
    try:
        png, points, skipped = draw_chart(args.results or default_paths(), args.out)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for name, why in skipped:
        print(f"[nat_chart] {name}: not shown ({why})", file=sys.stderr)
    for pt in points:
        print(f"[nat_chart] {pt['benchmark']:<22} {pt['system']:<48} {pt['decoding']:<40} "
              f"BLEU {pt['bleu']:6.2f}  speed-up {pt['speedup']:6.2f}x", file=sys.stderr)
    print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
