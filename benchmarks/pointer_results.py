"""The pointer-network results file ``benchmarks/results/pointer.json`` and its Markdown table.

Schema (exactly these keys)::

    {"benchmark": "pointer" | "pointer_<name>", "hardware": str, "threads": int, "command": str,
     "rows": [row, ...]}

    row = {"problem": "convex_hull" | "delaunay" | "tsp", "system": str (our arch),
           "n_train": str ("50", "5-50", ...), "n_test": int, "decoding": str ("beam=1", "beam=5"),
           "accuracy": float, "area_coverage": float | null, "triangle_coverage": float | null,
           "tour_length": float | null, "reference_tour_length": float | null,
           "reference": "exact" | "lkh" | null, "train_updates": int, "train_wall_s": float}

A row may also carry ``"command"`` (str): the evaluation command that produced it, when the rows of
one file come from several runs (``stage_eval`` writes it; the table then lists every command).
``accuracy``, ``area_coverage`` and ``triangle_coverage`` are fractions in [0, 1].  A metric that
does not apply is null: ``area_coverage`` is set for convex_hull only, ``triangle_coverage`` for
delaunay only, ``tour_length`` / ``reference_tour_length`` / ``reference`` for tsp only (mean
lengths over the test set; ``reference`` says whether the reference tours are exact (Held-Karp) or
LKH's).  Rows are keyed by (problem, system, n_train, n_test, decoding); :func:`upsert_row` replaces
the row with the same key.  A subset re-measured on other hardware is its own benchmark
``pointer_<name>`` (its own file and table), so one file never mixes machines.
"""
import json
import math
import os
import re
import tempfile

from fairseq_nat_ext.evaluation.decoding import is_canonical_decoding
from fairseq_nat_ext.evaluation.results import command_lines

BENCHMARK = "pointer"
NAME_PATTERN = re.compile(r"^pointer(_[a-z0-9_]+)?$")
PROBLEMS = ("convex_hull", "delaunay", "tsp")
TOP_FIELDS = ("benchmark", "hardware", "threads", "command", "rows")
ROW_FIELDS = ("problem", "system", "n_train", "n_test", "decoding", "accuracy", "area_coverage",
              "triangle_coverage", "tour_length", "reference_tour_length", "reference", "train_updates",
              "train_wall_s")
ONLY_FOR = {"area_coverage": "convex_hull", "triangle_coverage": "delaunay", "tour_length": "tsp",
            "reference_tour_length": "tsp", "reference": "tsp"}
ROW_OPTIONAL = ("command",)
FRACTIONS = ("accuracy", "area_coverage", "triangle_coverage")


def _natural(text):
    """Sort key reading digit runs as numbers: beam=5 before beam=10."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text)]


class PointerResultsError(ValueError):
    pass


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate_row(row, where="row"):
    if not isinstance(row, dict):
        return [f"{where}: expected an object"]
    errors = [f"{where}: missing key {k!r}" for k in ROW_FIELDS if k not in row]
    errors += [f"{where}: unexpected key {k!r}" for k in row if k not in ROW_FIELDS + ROW_OPTIONAL]
    if "command" in row and (not isinstance(row["command"], str) or not row["command"].strip()):
        errors.append(f"{where}.command: expected a non-empty string")
    if errors:
        return errors
    problem = row["problem"]
    if problem not in PROBLEMS:
        return [f"{where}.problem: {problem!r} is not one of {', '.join(PROBLEMS)}"]
    for key in ("system", "n_train", "decoding"):
        if not isinstance(row[key], str) or not row[key].strip():
            errors.append(f"{where}.{key}: expected a non-empty string")
    if isinstance(row["decoding"], str) and not is_canonical_decoding(row["decoding"]):
        errors.append(f"{where}.decoding: {row['decoding']!r} is not canonical (e.g. beam=5)")
    for key in ("n_test", "train_updates"):
        if not isinstance(row[key], int) or isinstance(row[key], bool) or row[key] < 0:
            errors.append(f"{where}.{key}: expected an integer >= 0")
    if not _number(row["train_wall_s"]) or row["train_wall_s"] < 0:
        errors.append(f"{where}.train_wall_s: expected a number >= 0")
    if not _number(row["accuracy"]):
        errors.append(f"{where}.accuracy: expected a number")
    for key, owner in ONLY_FOR.items():
        value = row[key]
        if problem != owner:
            if value is not None:
                errors.append(f"{where}.{key}: must be null for {problem}")
        elif key == "reference":
            if value not in ("exact", "lkh"):
                errors.append(f"{where}.reference: expected 'exact' or 'lkh', got {value!r}")
        elif not _number(value) or value < 0:
            errors.append(f"{where}.{key}: expected a number >= 0 for {problem}")
    for key in FRACTIONS:
        if _number(row[key]) and not 0.0 <= row[key] <= 1.0:
            errors.append(f"{where}.{key}: {row[key]} outside [0, 1]")
    return errors


def row_key(row):
    return (row["problem"], row["system"], row["n_train"], row["n_test"], row["decoding"])


def validate_results(obj):
    if not isinstance(obj, dict):
        return ["results: expected an object"]
    errors = [f"results: missing key {k!r}" for k in TOP_FIELDS if k not in obj]
    errors += [f"results: unexpected key {k!r}" for k in obj if k not in TOP_FIELDS]
    if errors:
        return errors
    if not isinstance(obj["benchmark"], str) or not NAME_PATTERN.match(obj["benchmark"]):
        errors.append(f"results.benchmark: expected {BENCHMARK!r} or '{BENCHMARK}_<name>'")
    if not isinstance(obj["threads"], int) or isinstance(obj["threads"], bool) or obj["threads"] < 1:
        errors.append("results.threads: expected an integer >= 1")
    for key in ("hardware", "command"):
        if not isinstance(obj[key], str):
            errors.append(f"results.{key}: expected a string")
    if not isinstance(obj["rows"], list):
        return errors + ["results.rows: expected a list"]
    seen = set()
    for i, row in enumerate(obj["rows"]):
        row_errors = validate_row(row, f"rows[{i}]")
        errors += row_errors
        if not row_errors:
            if row_key(row) in seen:
                errors.append(f"rows[{i}]: duplicate row for {row_key(row)}")
            seen.add(row_key(row))
    return errors


def check_results(obj, source="results"):
    errors = validate_results(obj)
    if errors:
        raise PointerResultsError(f"{source}: " + "; ".join(errors))
    return obj


def is_pointer_results(obj):
    return isinstance(obj, dict) and isinstance(obj.get("benchmark"), str) and bool(NAME_PATTERN.match(obj["benchmark"]))


def load_results(path):
    with open(path, encoding="utf-8") as f:
        return check_results(json.load(f), str(path))


def new_results(hardware, threads, command, benchmark=BENCHMARK):
    if not NAME_PATTERN.match(benchmark):
        raise PointerResultsError(f"benchmark name {benchmark!r}: expected {BENCHMARK!r} or '{BENCHMARK}_<name>'")
    return {"benchmark": benchmark, "hardware": hardware, "threads": int(threads), "command": command,
            "rows": []}


def make_row(problem, system, n_train, n_test, decoding, accuracy, train_updates, train_wall_s,
             area_coverage=None, triangle_coverage=None, tour_length=None, reference_tour_length=None,
             reference=None):
    def r(v, digits=6):
        return None if v is None else round(float(v), digits)

    row = {"problem": problem, "system": str(system), "n_train": str(n_train), "n_test": int(n_test),
           "decoding": str(decoding), "accuracy": r(accuracy), "area_coverage": r(area_coverage),
           "triangle_coverage": r(triangle_coverage), "tour_length": r(tour_length, 5),
           "reference_tour_length": r(reference_tour_length, 5), "reference": reference,
           "train_updates": int(train_updates), "train_wall_s": round(float(train_wall_s), 1)}
    errors = validate_row(row)
    if errors:
        raise PointerResultsError("; ".join(errors))
    return row


def upsert_row(results, row):
    for i, old in enumerate(results["rows"]):
        if row_key(old) == row_key(row):
            results["rows"][i] = row
            return results
    results["rows"].append(row)
    return results


def save_results(path, obj):
    """Validate, then write atomically (2-space indent, trailing newline)."""
    check_results(obj, str(path))
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".pointer.", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


DASH = "–"
COLUMNS = ["problem", "system", "n train", "n test", "decoding", "accuracy (%)", "area coverage (%)",
           "triangle coverage (%)", "tour length", "reference length", "gap (%)", "reference",
           "train updates", "train time (h)"]


def _pct(v):
    return DASH if v is None else f"{100 * v:.1f}"


def markdown_table(results):
    lines = [
        f"### {results['benchmark']}",
        "",
        f"- hardware: {results['hardware']}, {results['threads']} torch threads",
        *command_lines(results, results["rows"], "the rows come from several evaluation runs"),
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "| " + " | ".join(["---", "---", "---:", "---:", "---"] + ["---:"] * 6 + ["---", "---:", "---:"]) + " |",
    ]
    order = sorted(results["rows"], key=lambda r: (PROBLEMS.index(r["problem"]), r["n_train"], r["system"],
                                                   r["n_test"], _natural(r["decoding"])))
    for r in order:
        tsp = r["problem"] == "tsp"
        gap = (100 * (r["tour_length"] / r["reference_tour_length"] - 1)
               if tsp and r["reference_tour_length"] else None)
        lines.append("| " + " | ".join([
            f"`{r['problem']}`", f"`{r['system']}`", r["n_train"], str(r["n_test"]), f"`{r['decoding']}`",
            _pct(r["accuracy"]), _pct(r["area_coverage"]), _pct(r["triangle_coverage"]),
            f"{r['tour_length']:.3f}" if tsp else DASH,
            f"{r['reference_tour_length']:.3f}" if tsp else DASH,
            DASH if gap is None else f"{gap:.2f}", r["reference"] or DASH, str(r["train_updates"]),
            f"{r['train_wall_s'] / 3600:.2f}",
        ]) + " |")
    return "\n".join(lines) + "\n"
