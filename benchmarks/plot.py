"""BLEU vs batch-1 latency scatter of one benchmark (matplotlib, Agg backend).

    python -m benchmarks.plot benchmarks/results/mask_predict.json [...]

writes ``benchmarks/results/<benchmark>.png`` next to each results file.  The reference row (no
latency, BLEU 100 by construction) is not drawn.
"""
import argparse
import os
import sys

from fairseq_nat_ext.evaluation.results import REFERENCE_SYSTEM, load_results


def plot_results(results, png_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["rows"] if r["system"] != REFERENCE_SYSTEM]
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    systems = sorted({r["system"] for r in rows})
    markers = "osD^v<>pXh"
    for i, system in enumerate(systems):
        pts = [r for r in rows if r["system"] == system]
        ax.scatter([r["latency_ms_b1"] for r in pts], [r["bleu"] for r in pts],
                   marker=markers[i % len(markers)], s=40, label=system)
        for r in pts:
            label = r["decoding"] + (" (distilled)" if r["distilled"] else "")
            ax.annotate(label, (r["latency_ms_b1"], r["bleu"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
    ax.set_xlabel(f"latency, batch 1 (ms/sentence, {results['threads']} threads)")
    ax.set_ylabel("sacreBLEU")
    ax.set_title(f"{results['benchmark']}: BLEU vs latency", fontsize=10)
    ax.grid(True, alpha=0.3)
    if rows:
        ax.margins(y=0.1)
        # from 0 to past the slowest point, with room for its label (set_xlim(left=0) alone froze the
        # right limit at the last point, cutting it and its label in half)
        ax.set_xlim(0, 1.35 * max(r["latency_ms_b1"] for r in rows))
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    os.makedirs(os.path.dirname(png_path) or ".", exist_ok=True)
    fig.savefig(png_path)
    plt.close(fig)
    return png_path


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.plot",
                                description="BLEU vs latency scatter per results JSON")
    p.add_argument("results", nargs="+")
    args = p.parse_args(argv)
    for path in args.results:
        results = load_results(path)
        png = os.path.join(os.path.dirname(path) or ".", f"{results['benchmark']}.png")
        print(plot_results(results, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
