"""The NAT leaderboard (``benchmarks/results/nat_leaderboard.json``, written by
``examples/benchmark/nat_leaderboard.sh``): its table, its chart and the README's method table.

    python -m benchmarks.leaderboard                 # print the table
    python -m benchmarks.leaderboard --chart         # -> benchmarks/results/nat_leaderboard.png

Every row carries the speed baseline measured in the same measuring run (``teacher_latency_ms_b1``,
``teacher_sent_per_s_b128``: the teacher's beam 5), so a row's speed-up never compares two runs:
speed-up b1 = teacher latency / row latency, speed-up b128 = row throughput / teacher throughput.
The chart draws sacreBLEU against both speed-ups (one panel each, log x), one point per row, the teacher
marked, and the Pareto front (rows no other row beats on both BLEU and speed-up).
``tables.py --update-all`` renders the table into ``docs/leaderboard.md`` and the README's
``<!-- leaderboard: methods -->`` block from this file.
"""
import argparse
import os
import sys

from fairseq_nat_ext.evaluation.results import LEADERBOARD_ROW_FIELDS, load_results

from . import REPO

RESULTS = os.path.join(REPO, "benchmarks", "results")
PATH = os.path.join(RESULTS, "nat_leaderboard.json")
CHART = os.path.join(RESULTS, "nat_leaderboard.png")
TEACHER = "fairseq:transformer"
DASH = "–"


def is_leaderboard(results):
    """True for a results object whose rows carry the leaderboard columns."""
    rows = results.get("rows") or []
    return bool(rows) and all(all(k in r for k in LEADERBOARD_ROW_FIELDS) for r in rows)


def speedups(row):
    """(batch-1 speed-up, batch-128 speed-up) of a row over the teacher of its own measuring run."""
    b1 = row["teacher_latency_ms_b1"] / row["latency_ms_b1"] if row["latency_ms_b1"] else 0.0
    b128 = row["sent_per_s_b128"] / row["teacher_sent_per_s_b128"] if row["teacher_sent_per_s_b128"] else 0.0
    return b1, b128


def pareto_front(points):
    """Indices of the points (speed, bleu) that no other point dominates (>= on both, > on one), by
    increasing speed."""
    keep = []
    for i, (s, b) in enumerate(points):
        dominated = any((s2 >= s and b2 >= b) and (s2 > s or b2 > b) for j, (s2, b2) in enumerate(points) if j != i)
        if not dominated:
            keep.append(i)
    return sorted(keep, key=lambda i: points[i][0])


def runs_by_machine(results):
    """{machine the rows were decoded and timed on (``measured_on``): its measuring runs}, both in order
    of first run (a run's rows share its teacher and its machine)."""
    runs = {}
    for r in sorted(results["rows"], key=lambda r: r["run"]):
        runs.setdefault(r["measured_on"], {})[r["run"]] = None
    return runs


def machines(results):
    """The machines of :func:`runs_by_machine`, joined."""
    return "; ".join(runs_by_machine(results))


def measured_on(results):
    """The machines with their runs (just the machine when there is one)."""
    runs = runs_by_machine(results)
    if len(runs) == 1:
        return next(iter(runs))
    return "; ".join(f"{hw} (runs {', '.join(rs)})" for hw, rs in runs.items())


def markdown_table(results, link_dir=None):
    """The leaderboard as a Markdown section (rows by decreasing test BLEU; links relative to
    ``link_dir``)."""
    from .tables import hyp_link

    rows = sorted(results["rows"], key=lambda r: -r["bleu"])
    lines = [
        f"### {results['benchmark']}",
        "",
        f"- data: {results['data']}",
        f"- measured on: {measured_on(results)}, {results['threads']} torch threads (speed-ups against the "
        "teacher's beam 5 measured in the same run as the row)",
        f"- sacreBLEU: `{results['sacrebleu_signature']}`; chrF: sacreBLEU's default chrF",
        "",
        "| system | decoding | targets | seed | init | BLEU | chrF | valid BLEU | valid chrF | x teacher b1 "
        "| x teacher b128 | decoder passes | repeat % | updates | max tokens | train h | words/s | output |",
        "| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | --- |",
    ]
    for r in rows:
        b1, b128 = speedups(r)
        blind = " · ".join(f"[{name.replace('test_', '')}]({hyp_link(path, link_dir)})"
                           for name, path in sorted(r["blind"].items()))
        lines.append(
            f"| `{r['system']}` | `{r['decoding']}` | {'distilled' if r['distilled'] else 'raw'} | {r['seed']} | "
            f"{r['init']} | {r['bleu']:.2f} | {r['chrf']:.2f} | {r['valid_bleu']:.2f} | {r['valid_chrf']:.2f} | "
            f"{b1:.2f}x | {b128:.2f}x | {r['decoder_passes']:.2f} | {100 * r['repeat_rate']:.2f} | "
            f"{r['train_updates']} | {r['max_tokens']} | {r['train_wall_s'] / 3600:.2f} | "
            f"{DASH if r['train_wps'] is None else format(r['train_wps'], '.0f')} | "
            f"[test]({hyp_link(r['hyp'], link_dir)}) · {blind} |"
        )
    lines += ["", "Each row's commands (its training, then this measuring):", ""]
    for cmd in dict.fromkeys(r["command"] for r in rows):
        lines.append(f"- `{cmd}`")
    trained = sorted({r["trained_on"] for r in rows if r["system"] != TEACHER})
    if trained:
        lines += ["", "Trained on: " + "; ".join(trained) + "."]
    return "\n".join(lines) + "\n"


def methods_table(results, link_dir=None):
    """The README's method table: one line per system and decoding with its seeds side by side (``a / b``
    in seed order) in test BLEU, chrF, the speed-ups (each against the teacher of the row's own run) and
    the decoder passes; one budget.  Lines sorted by their mean BLEU."""
    groups = {}
    for r in sorted(results["rows"], key=lambda r: r["seed"]):
        groups.setdefault((r["system"], r["decoding"]), []).append(r)
    budgets = sorted({r["train_updates"] for r in results["rows"] if r["system"] != TEACHER})
    lines = ["| system | decoding | seeds | BLEU | chrF | x teacher b1 | x teacher b128 | decoder passes |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    columns = (lambda r: f"{r['bleu']:.2f}", lambda r: f"{r['chrf']:.2f}", lambda r: f"{speedups(r)[0]:.2f}x",
               lambda r: f"{speedups(r)[1]:.2f}x")
    for (system, decoding), rs in sorted(groups.items(), key=lambda kv: -sum(r["bleu"] for r in kv[1]) / len(kv[1])):
        seeds = ", ".join(str(r["seed"]) for r in rs)
        values = [" / ".join(col(r) for r in rs) for col in columns]
        values.append(" / ".join(dict.fromkeys(f"{r['decoder_passes']:.1f}" for r in rs)))  # once if equal
        lines.append(f"| `{system}` | `{decoding}` | {seeds} | {' | '.join(values)} |")
    from .tables import hyp_link

    rel = os.path.relpath(PATH, REPO).replace(os.sep, "/")
    lines += ["", f"From [`{os.path.basename(rel)}`]({hyp_link(rel, link_dir)}) (every NAT row "
              f"{', '.join(map(str, budgets)) or DASH} updates from the teacher's weights or, for the Imputer, this "
              f"table's CTC model; measured on {machines(results)}); all columns and the "
              "commands: [docs/leaderboard.md](" + hyp_link("docs/leaderboard.md", link_dir) + "); the decoding keys: "
              "[docs/benchmarks.md](" + hyp_link("docs/benchmarks.md", link_dir)
              + "#decoding-keys-and-their-fairseq-generate-flags)."]
    return "\n".join(lines) + "\n"


def draw_chart(results, out=CHART):
    """BLEU against the batch-1 and batch-128 speed-ups, Pareto front drawn, teacher marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharey=True)
    for ax, which, title in ((axes[0], 0, "batch 1"), (axes[1], 1, "batch 128")):
        pts = [(speedups(r)[which], r["bleu"]) for r in rows]
        for r, (x, y) in zip(rows, pts):
            teacher = r["system"] == TEACHER
            colour = "black" if teacher else ("tab:orange" if r["system"].startswith("fairseq:") else "tab:blue")
            ax.scatter([x], [y], marker="*" if teacher else "o", s=140 if teacher else 40, color=colour, zorder=3)
            ax.annotate(f"{r['system'].replace('fairseq:', 'fs:')} {r['decoding']}"
                        + ("" if r["seed"] == 1 else f" s{r['seed']}"), (x, y), textcoords="offset points",
                        xytext=(4, 3), fontsize=7)
        front = pareto_front(pts)
        ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "--", color="grey", zorder=2,
                label="Pareto front")
        ax.set_xscale("log")
        ax.set_xlabel(f"speed-up over the teacher's beam 5 ({title}, same run)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower left", fontsize=8)
    axes[0].set_ylabel("test_2016_flickr sacreBLEU")
    budgets = sorted({r["train_updates"] for r in rows if r["system"] != TEACHER})
    fig.suptitle("NAT leaderboard, Multi30K En→De (* teacher; blue: this plugin, orange: fairseq's; "
                 f"{', '.join(map(str, budgets))} updates)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.leaderboard", description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="?", default=PATH)
    p.add_argument("--chart", nargs="?", const=CHART, metavar="PNG", help="draw the chart (default %(const)s)")
    args = p.parse_args(argv)
    try:
        results = load_results(args.results)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if not is_leaderboard(results):
        print(f"error: {args.results}: its rows have no leaderboard columns (run --leaderboard)", file=sys.stderr)
        return 1
    if args.chart:
        print(draw_chart(results, args.chart))
    else:
        print(markdown_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
