"""Markdown tables from results files, and the results section of ``docs/benchmarks.md``.

    python -m benchmarks.tables benchmarks/results/*.json
    python -m benchmarks.tables benchmarks/results/*.json --update-docs docs/benchmarks.md
    python -m benchmarks.tables benchmarks/results/studies/decoding_speed/*.json \
        --update-docs docs/studies/decoding_speed.md
    python -m benchmarks.tables --update-all

The first prints one table per benchmark (sorted by benchmark name).  The second replaces the text
between the lines ``<!-- results:begin -->`` and ``<!-- results:end -->`` of that page with those
tables; when the markers are missing (or out of order) it changes nothing and prints a one-line error.
The current tables live at the top level of ``benchmarks/results/`` and are shown in
``docs/benchmarks.md``; a study's own tables (before/after pairs, superseded runs) live in
``benchmarks/results/studies/<study>/`` and are shown in ``docs/studies/<study>.md`` (the third form).
``--update-all`` regenerates every such page (:func:`pages` lists them; the attention and pointer
tables are shown on their own pages, :data:`OTHER_PAGES`); on ``docs/benchmarks.md`` the BLEU tables
are compact (:func:`compact_table`: the command and the hypotheses are linked, not repeated), and the
``<!-- rows: TABLE SYSTEMS -->`` blocks of README.md and docs/ (a method's current result, e.g. in
docs/nat.md) are regenerated from their tables (:func:`rows_table`).
There, the links to the committed hypothesis files (paths from the repository root in the JSON) are
written relative to the page's folder (``../benchmarks/results/...`` from ``docs/``).
Every file is validated first (:mod:`fairseq_nat_ext.evaluation.results`; the pointer, oracle and
attention studies' files by their own checks, :mod:`.pointer_results`, :mod:`.attention_results`).
"""
import argparse
import glob
import json
import os
import re
import sys

from fairseq_nat_ext.evaluation.results import REFERENCE_SYSTEM, check_timing_results, load_results

from . import REPO, attention_results, leaderboard, pointer_results

RESULTS = os.path.join(REPO, "benchmarks", "results")
STUDIES = os.path.join(RESULTS, "studies")
DOCS = os.path.join(REPO, "docs")
BEGIN_MARKER = "<!-- results:begin -->"
END_MARKER = "<!-- results:end -->"

COLUMNS = [
    "system", "decoding", "distilled", "BLEU", "tok BLEU", "latency b1 (ms/sent)",
    "speed b128 (sent/s)", "iterations", "repeat rate (%)", "train updates", "train time (h)",
    "output",
]
# shown (after the repeat rate) only in a table with at least one row that has them (run --language-check)
LANGUAGE_COLUMNS = ["wrong language (%)", "mixed language (%)"]
LANGUAGE_KEYS = ("wrong_language_rate", "mixed_language_rate")
DASH = "–"


def hyp_link(hyp, link_dir=None):
    """The Markdown link target of a committed hypothesis file: ``hyp`` (a path from the repository root)
    as it is, or relative to the folder ``link_dir`` (the page that shows the table)."""
    if link_dir is None:
        return hyp
    rel = os.path.relpath(os.path.join(REPO, hyp), os.path.abspath(link_dir))
    return rel.replace(os.sep, "/")


def _has_language_rates(rows):
    return any(LANGUAGE_KEYS[0] in row for row in rows)


def _columns(rows):
    if not _has_language_rates(rows):
        return COLUMNS
    at = COLUMNS.index("repeat rate (%)") + 1
    return COLUMNS[:at] + LANGUAGE_COLUMNS + COLUMNS[at:]


def _cells(row, link_dir=None, language=False):
    """The row's cells; ``language``: with the language-rate cells (– for a row without them)."""
    ref = row["system"] == REFERENCE_SYSTEM
    hyp = row["hyp"]
    link = f"[txt]({hyp_link(hyp, link_dir)})" if not ref and not os.path.isabs(hyp) else DASH
    rates = [f"{100 * row[k]:.2f}" if k in row else DASH for k in LANGUAGE_KEYS] if language else []
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
        *rates,
        DASH if ref else str(row["train_updates"]),
        DASH if ref else f"{row['train_wall_s'] / 3600:.2f}",
        link,
    ]


def _json_link(results, path, link_dir):
    """`` [`NAME.json`](link) `` of a results file (relative to ``link_dir``, see :func:`hyp_link`)."""
    rel = os.path.relpath(os.path.abspath(path), REPO).replace(os.sep, "/")
    return f"[`{os.path.basename(rel)}`]({hyp_link(rel, link_dir)})"


#: shorter column names of :func:`compact_table`
COMPACT_NAMES = {"latency b1 (ms/sent)": "ms/sent b1", "speed b128 (sent/s)": "sent/s b128",
                 "iterations": "iter.", "repeat rate (%)": "repeat %", "train updates": "updates",
                 "train time (h)": "train h", "wrong language (%)": "wrong lang. %",
                 "mixed language (%)": "mixed lang. %"}


def compact_table(results, link_dir=None, path=None):
    """:func:`markdown_table` without the command line, the sacreBLEU signature (the protocol's) and the
    hypothesis links: the JSON file (``path``), which holds the command, and the hypotheses' folder are
    linked once instead, and the training targets (one kind per table) named once.  For the page of current tables (``docs/benchmarks.md``)."""
    language = _has_language_rates(results["rows"])
    columns = [COMPACT_NAMES.get(c, c) for c in _columns(results["rows"]) if c not in ("output", "distilled")]
    nat = [r for r in results["rows"] if r["system"] not in (REFERENCE_SYSTEM, "fairseq:transformer")]
    targets = {r["distilled"] for r in nat}
    trained = {frozenset([True]): "distilled", frozenset([False]): "raw"}.get(frozenset(targets), "mixed")
    hyps = sorted({os.path.dirname(r["hyp"]) for r in results["rows"]
                   if r["system"] != REFERENCE_SYSTEM and not os.path.isabs(r["hyp"])})
    where = _json_link(results, path, link_dir) if path else f"`{results['benchmark']}.json`"
    folders = ", ".join(f"[{os.path.basename(h)}/]({hyp_link(h, link_dir)})" for h in hyps)
    lines = [
        f"### {results['benchmark']}",
        "",
        f"{where} (its commands) · hypotheses {folders or DASH} · {results['hardware']}, "
        f"{results['threads']} threads · data: {results['data']}"
        + (f" · models other than the teacher trained on {trained} targets" if nat else ""),
        "",
        "| " + " | ".join(columns) + " |",
        "| " + " | ".join(["---"] * 2 + ["---:"] * (len(columns) - 2)) + " |",
    ]
    for row in results["rows"]:
        cells = _cells(row, link_dir, language)[:-1]
        lines.append("| " + " | ".join(cells[:2] + cells[3:]) + " |")
    return "\n".join(lines) + "\n"


def markdown_table(results, link_dir=None):
    """One benchmark as a Markdown section: heading, provenance lines, table (hypothesis links relative
    to ``link_dir`` when given, see :func:`hyp_link`).  The wrong- and mixed-language columns appear
    when a row has those rates."""
    language = _has_language_rates(results["rows"])
    columns = _columns(results["rows"])
    lines = [
        f"### {results['benchmark']}",
        "",
        f"- data: {results['data']}",
        f"- hardware: {results['hardware']}, {results['threads']} torch threads",
        f"- sacreBLEU: `{results['sacrebleu_signature']}`",
        f"- command: `{results['command']}`",
        "",
        "| " + " | ".join(columns) + " |",
        "| " + " | ".join(["---"] * 3 + ["---:"] * (len(columns) - 4) + ["---"]) + " |",
    ]
    for row in results["rows"]:
        lines.append("| " + " | ".join(_cells(row, link_dir, language)) + " |")
    return "\n".join(lines) + "\n"


ORACLE_KEYS = ("impl", "batch", "device", "ms_per_batch", "same_edit_count")


def check_oracle_results(obj, path):
    """The oracle benchmark's file (``benchmarks/oracle_speed.py``)."""
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
    return _load_with_path(path)[:2]


def _load_with_path(path):
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    if obj.get("benchmark") == "oracle":
        return check_oracle_results(obj, str(path)), oracle_table, path
    if attention_results.is_attention_listops(obj):
        return attention_results.check_listops_results(obj, str(path)), attention_results.listops_table, path
    if attention_results.is_attention_speed(obj):
        return attention_results.check_results(obj, str(path)), attention_results.markdown_table, path
    if pointer_results.is_pointer_results(obj):
        return pointer_results.check_results(obj, str(path)), pointer_results.markdown_table, path
    return load_results(path), markdown_table, path


def markdown_tables(paths, link_dir=None, compact=False):
    """Every results file's section, sorted by benchmark name; ``link_dir``: see :func:`markdown_table`;
    ``compact``: BLEU tables as :func:`compact_table`."""
    all_results = sorted((_load_with_path(p) for p in paths), key=lambda r: r[0]["benchmark"])
    names = [r["benchmark"] for r, _, _ in all_results]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"benchmark(s) {sorted(dup)} appear in more than one results file")

    def section(results, table, path):
        if table is not markdown_table:
            return table(results)
        if leaderboard.is_leaderboard(results):
            return leaderboard.markdown_table(results, link_dir)
        return compact_table(results, link_dir, path) if compact else markdown_table(results, link_dir)

    return "\n".join(section(*r) for r in all_results)


def replace_between_markers(text, content):
    """``text`` with the lines between the marker lines replaced by ``content``; ValueError when the
    markers are missing, repeated or out of order.  A marker counts only as a line of its own (the page
    may name the markers in its prose, e.g. inside backquotes)."""
    lines = text.splitlines(keepends=True)
    begins = [i for i, line in enumerate(lines) if line.strip() == BEGIN_MARKER]
    ends = [i for i, line in enumerate(lines) if line.strip() == END_MARKER]
    if not begins or not ends:
        raise ValueError(f"markers {BEGIN_MARKER} / {END_MARKER} not found (each on a line of its own)")
    if len(begins) > 1 or len(ends) > 1:
        raise ValueError("results markers appear more than once")
    begin, end = begins[0], ends[0]
    if end < begin:
        raise ValueError(f"{END_MARKER} comes before {BEGIN_MARKER}")
    head = "".join(lines[: begin + 1])
    if not head.endswith("\n"):
        head += "\n"
    return head + content.rstrip("\n") + "\n" + "".join(lines[end:])


def update_docs(page, content):
    """Replace the results section of the Markdown file ``page``; True when its text changed."""
    with open(page, encoding="utf-8") as f:
        text = f.read()
    new = replace_between_markers(text, content)
    if new != text:
        with open(page, "w", encoding="utf-8") as f:
            f.write(new)
    return new != text


def docs_page(results_dir):
    """The page that shows the tables of the folder ``results_dir``: ``docs/benchmarks.md`` for
    ``benchmarks/results/`` itself, ``docs/studies/<study>.md`` for ``benchmarks/results/studies/<study>/``."""
    folder = os.path.abspath(results_dir)
    if os.path.dirname(folder) == STUDIES:
        return os.path.join(DOCS, "studies", os.path.basename(folder) + ".md")
    if folder == RESULTS:
        return os.path.join(DOCS, "benchmarks.md")
    raise ValueError(f"{results_dir}: neither benchmarks/results/ nor one of its studies/<study>/ folders")


#: current tables shown on their subject's page instead of docs/benchmarks.md: (file-name prefix, page)
OTHER_PAGES = (("attention_", os.path.join(DOCS, "studies", "attention_speed_listops.md")),
               ("multilingual", os.path.join(DOCS, "studies", "multilingual_kermit.md")),
               ("nat_leaderboard", os.path.join(DOCS, "leaderboard.md")),
               ("pointer", os.path.join(DOCS, "pointer.md")))


def page_of(path):
    """The page that shows the results file ``path`` (a current table or a study's)."""
    folder = os.path.dirname(os.path.abspath(path))
    if folder == RESULTS:
        for prefix, page in OTHER_PAGES:
            if os.path.basename(path).startswith(prefix):
                return page
    return docs_page(folder)


def pages():
    """[(page, results files, compact)] of every generated page: the current tables (top level of
    ``benchmarks/results/``: ``docs/benchmarks.md``, compact, but for :data:`OTHER_PAGES`) and each
    study folder with at least one results file (its study page)."""
    files = sorted(glob.glob(os.path.join(RESULTS, "*.json")) + glob.glob(os.path.join(STUDIES, "*", "*.json")))
    by_page = {}
    for path in files:
        by_page.setdefault(page_of(path), []).append(path)
    main_page = docs_page(RESULTS)
    return [(page, by_page[page], page == main_page) for page in sorted(by_page)]


#: a method's result on a reference page: ``<!-- rows: TABLE SYSTEM[,SYSTEM...] [[!]DECODING-SUBSTRING] -->``
#: (TABLE: the results file under benchmarks/results/ without ``.json``), up to ``<!-- rows: end -->``
ROWS_RE = re.compile(r"^<!-- rows: (?P<table>[\w/]+) (?P<systems>[\w:,]+)(?: (?P<contains>\S+))? -->$")
ROWS_END = "<!-- rows: end -->"
TEACHER = ("fairseq:transformer", "beam=5")


def rows_table(table, systems, contains=None, link_dir=None):
    """The rows of ``systems`` (in file order; only decodings containing ``contains`` when given) of the
    results file ``benchmarks/results/<table>.json`` as a small Markdown table (BLEU, batch-1 latency,
    decoder passes; the full rows are in docs/benchmarks.md), with each row's batch-1
    speed-up over the teacher's beam 5 of the same file (none when the file has no teacher row), and a
    line that cites the file."""
    path = os.path.join(RESULTS, table + ".json")
    results = load_results(path)
    def wanted(r):  # ``contains``: a substring the decoding must hold, or "!X": one it must not
        if not contains:
            return True
        return contains[1:] not in r["decoding"] if contains.startswith("!") else contains in r["decoding"]

    rows = [r for r in results["rows"] if r["system"] in systems and wanted(r)]
    if not rows:
        raise ValueError(f"{table}.json: no row of {sorted(systems)}" + (f" with {contains!r}" if contains else ""))
    teacher = next((r for r in results["rows"] if (r["system"], r["decoding"]) == TEACHER), None)
    mixed = len({r["distilled"] for r in rows}) > 1  # a "targets" column only where rows differ in it
    lines = ["| system | decoding |" + (" targets |" if mixed else "") + " BLEU | ms/sent b1 | x teacher b1 | iter. |",
             "| --- | --- |" + (" --- |" if mixed else "") + " ---: | ---: | ---: | ---: |"]
    for r in rows:
        base = r.get("teacher_latency_ms_b1") or (teacher["latency_ms_b1"] if teacher else None)  # a leaderboard
        speedup = f"{base / r['latency_ms_b1']:.2f}x" if base and r["latency_ms_b1"] else DASH   # row: its own run's
        targets = f" {'distilled' if r['distilled'] else 'raw'} |" if mixed else ""
        lines.append(f"| `{r['system']}` | `{r['decoding']}` |{targets} {r['bleu']:.2f} | {r['latency_ms_b1']:.1f} | "
                     f"{speedup} | {r['iterations']:.2f} |")
    rel = os.path.relpath(path, REPO).replace(os.sep, "/")
    cite = f"[`{os.path.basename(rel)}`]({hyp_link(rel, link_dir)}), {results['hardware']}: "
    cite += (f"teacher beam 5 {teacher['bleu']:.2f} BLEU, {teacher['latency_ms_b1']:.1f} ms."
             if teacher else "no teacher row, so no speed-up.")
    return "\n".join(lines) + "\n\n" + cite + "\n"


def render_rows(text, link_dir=None):
    """``text`` (a Markdown page) with every ``<!-- rows: ... -->`` block regenerated (:func:`rows_table`,
    links relative to ``link_dir``); ValueError on a block without its end marker."""
    lines = text.splitlines(keepends=True)
    out, i = [], 0
    while i < len(lines):
        m = ROWS_RE.match(lines[i].strip())
        out.append(lines[i])
        i += 1
        if not m:
            continue
        end = next((j for j in range(i, len(lines)) if lines[j].strip() == ROWS_END), None)
        if end is None:
            raise ValueError(f"{lines[i - 1].strip()} has no {ROWS_END}")
        out.append(rows_table(m["table"], set(m["systems"].split(",")), m["contains"], link_dir))
        i = end
    return "".join(out)


def update_rows(page):
    """Regenerate every ``<!-- rows: ... -->`` block of the Markdown file ``page``; True when it changed."""
    with open(page, encoding="utf-8") as f:
        old = f.read()
    new = render_rows(old, os.path.dirname(os.path.abspath(page)))
    if new != old:
        with open(page, "w", encoding="utf-8") as f:
            f.write(new)
    return new != old


def row_pages():
    """The pages with ``<!-- rows: ... -->`` blocks (README.md and docs/**/*.md)."""
    found = []
    for page in [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)):
        with open(page, encoding="utf-8") as f:
            if any(ROWS_RE.match(line.strip()) for line in f):
                found.append(page)
    return found


#: the README's method table, generated from the leaderboard: between these two lines
METHODS_BEGIN = "<!-- leaderboard: methods -->"
METHODS_END = "<!-- leaderboard: end -->"


def update_methods(page):
    """Regenerate the ``<!-- leaderboard: methods -->`` block of ``page`` (:func:`.leaderboard.methods_table`);
    True when it changed, False when the page has no block or there is no leaderboard yet."""
    with open(page, encoding="utf-8") as f:
        text = f.read()
    lines = text.splitlines(keepends=True)
    begin = [i for i, line in enumerate(lines) if line.strip() == METHODS_BEGIN]
    end = [i for i, line in enumerate(lines) if line.strip() == METHODS_END]
    if not begin or not os.path.exists(leaderboard.PATH):
        return False
    if len(begin) > 1 or len(end) != 1 or end[0] < begin[0]:
        raise ValueError(f"{METHODS_BEGIN} needs exactly one {METHODS_END} after it")
    table = leaderboard.methods_table(load_results(leaderboard.PATH), os.path.dirname(os.path.abspath(page)))
    new = "".join(lines[: begin[0] + 1]) + table + "".join(lines[end[0]:])
    if new != text:
        with open(page, "w", encoding="utf-8") as f:
            f.write(new)
    return new != text


def update_all():
    """Regenerate the results section of every page of :func:`pages`; 0, or 1 after a one-line error."""
    status = 0
    for page, files, compact in pages():
        rel = os.path.relpath(page, REPO)
        if not os.path.isfile(page):
            print(f"error: {rel}: no such file", file=sys.stderr)
            status = 1
            continue
        try:
            changed = update_docs(page, markdown_tables(files, link_dir=os.path.dirname(page), compact=compact))
        except (OSError, ValueError) as err:
            print(f"error: {rel}: {err}; nothing changed", file=sys.stderr)
            status = 1
            continue
        print(f"{rel}: results section {'updated' if changed else 'unchanged'}")
    for page in row_pages():
        rel = os.path.relpath(page, REPO)
        try:
            changed = update_rows(page)
        except (OSError, ValueError) as err:
            print(f"error: {rel}: {err}; nothing changed", file=sys.stderr)
            status = 1
            continue
        print(f"{rel}: method results {'updated' if changed else 'unchanged'}")
    readme = os.path.join(REPO, "README.md")
    try:
        changed = update_methods(readme)
    except (OSError, ValueError) as err:
        print(f"error: README.md: {err}; nothing changed", file=sys.stderr)
        return 1
    print(f"README.md: method table {'updated' if changed else 'unchanged'}")
    return status


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.tables",
                                description="Markdown tables from benchmark results JSON files")
    p.add_argument("results", nargs="*", help="results JSON files")
    p.add_argument("--update-docs", metavar="PAGE",
                   help=f"replace the text between {BEGIN_MARKER} and {END_MARKER} of this Markdown page "
                   "(docs/benchmarks.md)")
    p.add_argument("--update-all", action="store_true",
                   help="regenerate docs/benchmarks.md from the top-level results files and every "
                   "docs/studies/<study>.md from benchmarks/results/studies/<study>/")
    args = p.parse_args(argv)
    if args.update_all:
        if args.results or args.update_docs:
            p.error("--update-all takes no results files and no --update-docs")
        return update_all()
    if not args.results:
        p.error("no results files (or --update-all)")
    page = args.update_docs
    if page and not os.path.isfile(page):
        print(f"error: {page}: no such file", file=sys.stderr)
        return 1
    try:
        content = markdown_tables(args.results, link_dir=os.path.dirname(os.path.abspath(page)) if page else None)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if not page:
        sys.stdout.write(content)
        return 0
    try:
        changed = update_docs(page, content)
    except ValueError as err:
        print(f"error: {page}: {err}; nothing changed", file=sys.stderr)
        return 1
    print(f"{page}: results section {'updated' if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
