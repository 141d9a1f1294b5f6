"""Markdown tables from results files, and the README's results section.

    python -m fairseq_nat_ext.benchmark.tables benchmarks/results/*.json
    python -m fairseq_nat_ext.benchmark.tables benchmarks/results/*.json --update-readme README.md

The first prints one table per benchmark (sorted by benchmark name).  The second replaces the text
between the lines ``<!-- results:begin -->`` and ``<!-- results:end -->`` of the README with those
tables; when the markers are missing (or out of order) it changes nothing and prints a one-line error.
Every file is validated first (:mod:`.results`; the pointer benchmark's file by
:mod:`.pointer_results`, which has its own columns).
"""
import argparse
import json
import os
import sys

from . import attention_results, pointer_results
from .results import REFERENCE_SYSTEM, check_timing_results, load_results

BEGIN_MARKER = "<!-- results:begin -->"
END_MARKER = "<!-- results:end -->"

COLUMNS = [
    "system", "decoding", "distilled", "BLEU", "tok BLEU", "latency b1 (ms/sent)",
    "speed b128 (sent/s)", "iterations", "repeat rate (%)", "train updates", "train time (h)",
    "output",
]
DASH = "–"


def _cells(row):
    ref = row["system"] == REFERENCE_SYSTEM
    hyp = row["hyp"]
    link = f"[txt]({hyp})" if not ref and not os.path.isabs(hyp) else DASH
    return [
        f"`{row['system']}`",
        DASH if ref else f"`{row['decoding']}`",
        "yes" if row["distilled"] else "no",
        DASH if ref else f"{row['bleu']:.2f}",
        DASH if ref else f"{row['tok_bleu']:.2f}",
        DASH if ref else f"{row['latency_ms_b1']:.1f}",
        DASH if ref else f"{row['sent_per_s_b128']:.1f}",
        DASH if ref else f"{row['iterations']:.2f}",
        f"{100 * row['repeat_rate']:.2f}",
        DASH if ref else str(row["train_updates"]),
        DASH if ref else f"{row['train_wall_s'] / 3600:.2f}",
        link,
    ]


def markdown_table(results):
    """One benchmark as a Markdown section: heading, provenance lines, table."""
    lines = [
        f"### {results['benchmark']}",
        "",
        f"- data: {results['data']}",
        f"- hardware: {results['hardware']}, {results['threads']} torch threads",
        f"- sacreBLEU: `{results['sacrebleu_signature']}`",
        f"- command: `{results['command']}`",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "| " + " | ".join(["---"] * 3 + ["---:"] * (len(COLUMNS) - 4) + ["---"]) + " |",
    ]
    for row in results["rows"]:
        lines.append("| " + " | ".join(_cells(row)) + " |")
    return "\n".join(lines) + "\n"


ORACLE_KEYS = ("impl", "batch", "device", "ms_per_batch", "same_edit_count")


def check_oracle_results(obj, path):
    """The oracle benchmark's file (``benchmark/oracle_speed.py``)."""
    return check_timing_results(obj, path, ORACLE_KEYS)


def oracle_table(results):
    lines = [f"### {results['benchmark']}", "",
             f"- hardware: {results['hardware']}, {results['threads']} torch thread(s)",
             f"- command: `{results['command']}`", "",
             "| impl | batch | device | ms per batch | same edit counts as libnat |",
             "| --- | ---: | --- | ---: | --- |"]
    for r in results["rows"]:
        lines.append(f"| {r['impl']} | {r['batch']} | {r['device']} | {r['ms_per_batch']:.2f} | "
                     f"{'yes' if r['same_edit_count'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def _load_any(path):
    """(results, table function): the BLEU schema, or the pointer / oracle / attention speed benchmarks'
    own schemas."""
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    if obj.get("benchmark") == "oracle":
        return check_oracle_results(obj, str(path)), oracle_table
    if attention_results.is_attention_listops(obj):
        return attention_results.check_listops_results(obj, str(path)), attention_results.listops_table
    if attention_results.is_attention_speed(obj):
        return attention_results.check_results(obj, str(path)), attention_results.markdown_table
    if pointer_results.is_pointer_results(obj):
        return pointer_results.check_results(obj, str(path)), pointer_results.markdown_table
    return load_results(path), markdown_table


def markdown_tables(paths):
    all_results = sorted((_load_any(p) for p in paths), key=lambda r: r[0]["benchmark"])
    names = [r["benchmark"] for r, _ in all_results]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"benchmark(s) {sorted(dup)} appear in more than one results file")
    return "\n".join(table(r) for r, table in all_results)


def replace_between_markers(text, content):
    """``text`` with the lines between the markers replaced by ``content``; ValueError when the
    markers are missing, repeated or out of order."""
    begin, end = text.find(BEGIN_MARKER), text.find(END_MARKER)
    if begin < 0 or end < 0:
        raise ValueError(f"markers {BEGIN_MARKER} / {END_MARKER} not found")
    if text.count(BEGIN_MARKER) > 1 or text.count(END_MARKER) > 1:
        raise ValueError("results markers appear more than once")
    if end < begin:
        raise ValueError(f"{END_MARKER} comes before {BEGIN_MARKER}")
    head = text[: begin + len(BEGIN_MARKER)]
    tail = text[end:]
    return head + "\n" + content.rstrip("\n") + "\n" + tail


def update_readme(readme, content):
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    new = replace_between_markers(text, content)
    if new != text:
        with open(readme, "w", encoding="utf-8") as f:
            f.write(new)
    return new != text


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fairseq_nat_ext.benchmark.tables",
                                description="Markdown tables from benchmark results JSON files")
    p.add_argument("results", nargs="+", help="results JSON files")
    p.add_argument("--update-readme", metavar="README",
                   help=f"replace the text between {BEGIN_MARKER} and {END_MARKER}")
    args = p.parse_args(argv)
    try:
        content = markdown_tables(args.results)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if not args.update_readme:
        sys.stdout.write(content)
        return 0
    if not os.path.isfile(args.update_readme):
        print(f"error: {args.update_readme}: no such file", file=sys.stderr)
        return 1
    try:
        changed = update_readme(args.update_readme, content)
    except ValueError as err:
        print(f"error: {args.update_readme}: {err}; nothing changed", file=sys.stderr)
        return 1
    print(f"{args.update_readme}: results section {'updated' if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
