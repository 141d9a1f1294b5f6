"""The attention speed/memory study's results file (``benchmarks/attention_speed.py``): validation and
the tables of docs/benchmarks.md (times and peak memory per variant and length, then each variant against the
issue's bars: speed-up over ``full``, memory against ``full_explicit`` and ``full``, growth from
8192 to 16384, and speed against the peer package at 4096)."""

from fairseq_nat_ext.evaluation.results import check_timing_results, command_lines

from .attention_peers import PEERS

SPEED_KEYS = ("variant", "impl", "n", "device", "fwd_bwd_ms", "peak_mem_mb", "oom")
PEER_OF = {variant: name for name, (_, variant) in PEERS.items()}  # our variant -> its peer package
DASH = "–"


def is_attention_speed(obj):
    return obj.get("benchmark") == "attention_speed"


def check_results(obj, path):
    return check_timing_results(obj, path, SPEED_KEYS)


def _index(rows):
    """{(impl, variant): {n: row}} in first-seen order."""
    out = {}
    for r in rows:
        out.setdefault((r["impl"], r["variant"]), {})[r["n"]] = r
    return out


def _cell(row):
    if row is None:
        return DASH
    if row["oom"]:
        return "OOM"
    if row["fwd_bwd_ms"] is None:
        return f"timeout ({row.get('timeout_s', '?')} s)"
    return f"{row['fwd_bwd_ms']:.0f} ({row['peak_mem_mb']:.0f})"


def _ms(table, key, n):
    row = table.get(key, {}).get(n)
    return None if row is None or row["oom"] or row["fwd_bwd_ms"] is None else row["fwd_bwd_ms"]


def _mb(table, key, n):
    row = table.get(key, {}).get(n)
    return None if row is None or row["oom"] or row["peak_mem_mb"] is None else max(row["peak_mem_mb"], 0.1)


def _ratio(a, b, fmt="{:.1f}x"):
    return DASH if a is None or b is None else fmt.format(a / b)


def _full_ms(table, key, n):
    """``full``'s time to compare row ``key`` at n with: the row's ``same_run_full_ms`` when it was
    re-measured in a later run that timed ``full`` too (ratios stay within one run), else the file's row."""
    row = table.get(key, {}).get(n)
    if row is not None and row.get("same_run_full_ms") is not None:
        return row["same_run_full_ms"]
    return _ms(table, ("ours", "full"), n)


def bar_rows(table):
    """One line per variant of ours: speed-up over full at 8192 and 16384 (against the same run's ``full``,
    see :func:`_full_ms`), memory ratios at 8192, time growth 16384 / 8192, and the peer's time / ours at 4096."""
    full, explicit = ("ours", "full"), ("ours", "full_explicit")
    lines = []
    for impl, variant in table:
        if impl != "ours" or variant in ("full", "full_explicit"):
            continue
        key = (impl, variant)
        peer = PEER_OF.get(variant)
        lines.append([
            f"`{variant}`",
            _ratio(_full_ms(table, key, 8192), _ms(table, key, 8192)),
            _ratio(_full_ms(table, key, 16384), _ms(table, key, 16384)),
            _ratio(_mb(table, explicit, 8192), _mb(table, key, 8192)),
            _ratio(_mb(table, key, 8192), _mb(table, full, 8192), "{:.2f}"),
            _ratio(_ms(table, key, 16384), _ms(table, key, 8192), "{:.2f}"),
            _ratio(_ms(table, (f"peer:{peer}", variant), 4096), _ms(table, key, 4096), "{:.2f}") if peer else DASH,
        ])
    return lines


def markdown_table(results):
    table = _index(results["rows"])
    ns = sorted({r["n"] for r in results["rows"]})
    passes = max((len(r.get("round_ms", [])) for r in results["rows"]), default=0)
    cells = (f"each cell the median of {passes} passes over the whole table (``round_ms`` in the JSON), each a "
             "fresh process") if passes > 1 else "each cell a fresh process"
    lines = [f"### {results['benchmark']}", "",
             f"- hardware: {results['hardware']}, {results['threads']} torch thread(s)",
             f"- command: `{results['command']}`",
             "- one attention layer (8 heads x 64, batch 1, fp32), forward + backward: ms (peak MB above the "
             f"process before the call); {cells}", "",
             "| impl | variant | " + " | ".join(f"N={n}" for n in ns) + " |",
             "| --- | --- | " + " | ".join("---:" for _ in ns) + " |"]
    for (impl, variant), by_n in table.items():
        lines.append(f"| {impl} | `{variant}` | " + " | ".join(_cell(by_n.get(n)) for n in ns) + " |")
    lines += ["", "| variant | faster than full @8192 | @16384 | less memory than full_explicit @8192 | "
                  "memory / full @8192 | time 16384 / 8192 | peer time / ours @4096 |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += ["| " + " | ".join(cells) + " |" for cells in bar_rows(table)]
    if results.get("notes"):
        lines += ["", f"Note: {results['notes']}"]
    return "\n".join(lines) + "\n"


# ---- ListOps accuracy (benchmarks/attention_listops.py) ------------------------------------------------

LISTOPS_KEYS = ("variant", "options", "max_length", "accuracy", "majority_rate", "train_updates", "sec_per_update")


def is_attention_listops(obj):
    return str(obj.get("benchmark", "")).startswith("attention_listops")


def check_listops_results(obj, path):
    check_timing_results(obj, path, LISTOPS_KEYS)
    for i, row in enumerate(obj["rows"]):
        for key in ("accuracy", "majority_rate"):
            if not 0.0 <= row[key] <= 1.0:
                raise ValueError(f"{path}: rows[{i}].{key}: {row[key]} is not a fraction in [0, 1]")
    return obj


def _options(row):
    opts = dict(row["options"])
    ablation = opts.pop("brackets", None) is False
    text = ", ".join(f"{k}={v}" for k, v in opts.items())
    if ablation:
        return "no brackets (ablation)" + (f", {text}" if text else "")
    return text or DASH


def listops_table(results):
    """One row per trained variant: accuracy, the majority-class rate of its test split, the margin in
    points, the budget and the training time per update. Rows trained on different machines (a row's own
    "hardware") get a machine column, since their times per update do not compare; a row's "note" becomes
    a footnote."""
    rows = results["rows"]
    machines = list(dict.fromkeys(r.get("hardware", results["hardware"]) for r in rows))
    lines = [f"### {results['benchmark']}", ""]
    if len(machines) > 1:
        lines += [f"- machine {chr(65 + i)}: {m}, {results['threads']} torch thread(s)" for i, m in enumerate(machines)]
    else:
        lines.append(f"- hardware: {machines[0] if machines else results['hardware']}, {results['threads']} torch thread(s)")
    lines += command_lines(results, rows, "the rows come from several runs of one budget")
    lines += [
              "- test accuracy of the last checkpoint; every row has the same number of updates", ""]
    head = ["variant", "options", "max length", "accuracy (%)", "majority class (%)", "margin (points)",
            "updates", "s / update"] + (["machine"] if len(machines) > 1 else [])
    lines += ["| " + " | ".join(head) + " |", "| --- | --- | " + " | ".join(["---:"] * (len(head) - 2)) + " |"]
    notes = []
    for r in rows:
        sec = DASH if r["sec_per_update"] is None else f"{r['sec_per_update']:.3f}"
        if r.get("note"):
            notes.append(r["note"])
            sec += f" [{len(notes)}]"
        cells = [f"`{r['variant']}`", _options(r), str(r["max_length"]), f"{100 * r['accuracy']:.1f}",
                 f"{100 * r['majority_rate']:.1f}", f"{100 * (r['accuracy'] - r['majority_rate']):+.1f}",
                 str(r["train_updates"]), sec]
        if len(machines) > 1:
            cells.append(chr(65 + machines.index(r.get("hardware", results["hardware"]))))
        lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines += [""] + [f"[{i + 1}] {n}" for i, n in enumerate(notes)]
    return "\n".join(lines) + "\n"
