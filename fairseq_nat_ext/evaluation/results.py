"""The results file: one JSON per benchmark, e.g. ``benchmarks/results/mask_predict.json``.

Schema (exactly these keys, nothing else, but the optional row keys below)::

    {"benchmark": str, "data": str, "hardware": str, "threads": int, "command": str,
     "sacrebleu_signature": str, "rows": [row, ...]}

    row = {"system": str, "decoding": str, "distilled": bool, "bleu": float, "tok_bleu": float,
           "latency_ms_b1": float, "sent_per_s_b128": float, "iterations": float,
           "repeat_rate": float, "train_updates": int, "train_wall_s": float, "hyp": str}
    optional, both or neither (``run --language-check LANGS``, :mod:`.language_id`):
          "wrong_language_rate": float, "mixed_language_rate": float
    optional, all or none (``run --leaderboard``, the NAT leaderboard's columns, :data:`LEADERBOARD_ROW_FIELDS`):
          "chrf", "valid_bleu", "valid_chrf", "decoder_passes", "train_wps", "teacher_latency_ms_b1",
          "teacher_sent_per_s_b128": float; "seed", "max_tokens": int; "init", "trained_on", "measured_on", "run": str;
          "command": str; "blind": {test set name: hypothesis file}

* ``system``: the registered arch for this plugin's models (``mask_predict``), ``fairseq:<arch>`` for
  fairseq's built-ins (``fairseq:transformer``, ``fairseq:cmlm_transformer``), ``reference`` for the
  human reference row.
* ``decoding``: canonical decoding string (:mod:`.decoding`), e.g. ``beam=5``, ``iter=10,len_beam=3``;
  ``none`` for the reference row only.
* ``bleu``/``tok_bleu`` in [0, 100]; ``repeat_rate`` is a fraction in [0, 1]; latency, throughput,
  iterations, train_updates and train_wall_s are >= 0.
* ``wrong_language_rate``/``mixed_language_rate``: fractions in [0, 1] of the row's detokenised
  hypotheses identified as a candidate language other than the target, and mixing two candidate
  languages (:mod:`.language_id` defines both); absent when the run had no ``--language-check``.
* ``hyp``: the committed hypothesis file ``<folder of the JSON>/<benchmark>/<file>`` (e.g.
  ``benchmarks/results/<benchmark>/<file>``, or ``benchmarks/results/studies/<study>/...``) where ``<file>``
  is :func:`hyp_filename` (``:`` replaced by ``_``; ``__distilled`` appended for rows of systems
  trained on distilled data, so that a raw and a distilled run of one system never share a file).
  For the reference row it is the raw reference file itself.

The reference row (``--reference-row``) scores the reference against itself: ``bleu`` and
``tok_bleu`` 100.0, ``latency_ms_b1``, ``sent_per_s_b128``, ``iterations``, ``train_updates`` and
``train_wall_s`` 0, ``distilled`` false; only its ``repeat_rate`` (and the language rates, when
given) is informative.

Rows are keyed by (system, decoding, distilled, seed) (seed None for rows without the leaderboard
columns): :func:`upsert_row` replaces the row with the same key
(in place) and keeps every other row.
"""
import json
import math
import os
import tempfile

from .decoding import is_canonical_decoding

TOP_FIELDS = {
    "benchmark": str,
    "data": str,
    "hardware": str,
    "threads": int,
    "command": str,
    "sacrebleu_signature": str,
    "rows": list,
}
ROW_FIELDS = {
    "system": str,
    "decoding": str,
    "distilled": bool,
    "bleu": float,
    "tok_bleu": float,
    "latency_ms_b1": float,
    "sent_per_s_b128": float,
    "iterations": float,
    "repeat_rate": float,
    "train_updates": int,
    "train_wall_s": float,
    "hyp": str,
}
OPTIONAL_ROW_FIELDS = {  # all or none of them
    "wrong_language_rate": float,
    "mixed_language_rate": float,
}
#: the leaderboard's columns (``run --leaderboard``): all or none of them
LEADERBOARD_ROW_FIELDS = {
    "chrf": float,                      # sacreBLEU chrF (default settings) on the test subset
    "valid_bleu": float,                # sacreBLEU BLEU / chrF on the valid subset (same decoding)
    "valid_chrf": float,
    "decoder_passes": float,            # decoder forward calls per sentence at batch 1 (counted)
    "seed": int,                        # the training run's --seed
    "max_tokens": int,                  # the training run's --max-tokens
    "train_wps": float,                 # target tokens per second of training wall time (null: no log)
    "init": str,                        # what the weights started from ("scratch", "teacher", ...)
    "trained_on": str,                  # the machine the training ran on
    "measured_on": str,                 # the machine the decoding and timing ran on (the run's)
    "run": str,                         # id of the measuring run (one call of the leaderboard script)
    "teacher_latency_ms_b1": float,     # the speed baseline measured in the same run
    "teacher_sent_per_s_b128": float,
    "blind": dict,                      # unseen test set name -> committed hypothesis file
    "command": str,                     # the commands that reproduce the row (training, measuring)
}
OPTIONAL_ROW_GROUPS = (OPTIONAL_ROW_FIELDS, LEADERBOARD_ROW_FIELDS)
#: optional fields that may be null (JSON null: not known, e.g. a shared teacher's words/s without its log)
NULLABLE_FIELDS = ("train_wps",)
REFERENCE_SYSTEM = "reference"
REFERENCE_DECODING = "none"
_RANGES = {
    "bleu": (0.0, 100.0),
    "tok_bleu": (0.0, 100.0),
    "repeat_rate": (0.0, 1.0),
    "latency_ms_b1": (0.0, math.inf),
    "sent_per_s_b128": (0.0, math.inf),
    "iterations": (0.0, math.inf),
    "train_updates": (0, math.inf),
    "train_wall_s": (0.0, math.inf),
    "wrong_language_rate": (0.0, 1.0),
    "mixed_language_rate": (0.0, 1.0),
    "chrf": (0.0, 100.0),
    "valid_bleu": (0.0, 100.0),
    "valid_chrf": (0.0, 100.0),
    "decoder_passes": (0.0, math.inf),
    "seed": (0, math.inf),
    "max_tokens": (0, math.inf),
    "train_wps": (0.0, math.inf),
    "teacher_latency_ms_b1": (0.0, math.inf),
    "teacher_sent_per_s_b128": (0.0, math.inf),
}


def command_lines(results, rows, several):
    """Markdown lines naming the command(s) behind ``rows``: one ``- command:`` line, or, when rows carry
    different ``"command"`` values (rows without one fall back to the file's), a list introduced by
    ``- commands (<several>; each row names its own in the JSON):``."""
    commands = list(dict.fromkeys(r.get("command", results["command"]) for r in rows)) or [results["command"]]
    if len(commands) == 1:
        return [f"- command: `{commands[0]}`"]
    return [f"- commands ({several}; each row names its own in the JSON):"] + [f"  - `{c}`" for c in commands]


def _type_ok(value, typ):
    if typ is float:  # a JSON number; bool is not a number here
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, typ)


def _check_fields(obj, fields, where, optional=None):
    """Missing, unexpected and mistyped keys; ``optional``: a dict of keys that may be absent (all
    together), or a tuple of such dicts (each group all or none)."""
    errors = []
    groups = (optional,) if isinstance(optional, dict) else tuple(optional or ())
    optional = {k: v for g in groups for k, v in g.items()}
    if not isinstance(obj, dict):
        return [f"{where}: expected an object, got {type(obj).__name__}"]
    for key in fields:
        if key not in obj:
            errors.append(f"{where}: missing key {key!r}")
    for group in groups:
        present = [key for key in group if key in obj]
        if present and len(present) != len(group):
            errors.append(f"{where}: {', '.join(repr(k) for k in present)} without "
                          f"{', '.join(repr(k) for k in group if k not in obj)}")
    for key in obj:
        if key not in fields and key not in optional:
            errors.append(f"{where}: unexpected key {key!r}")
    for key, typ in {**fields, **optional}.items():
        if key in obj and obj[key] is None and key in NULLABLE_FIELDS:
            continue
        if key in obj and not _type_ok(obj[key], typ):
            errors.append(f"{where}.{key}: expected {typ.__name__}, got {obj[key]!r}")
    return errors


def check_timing_results(obj, path, row_keys):
    """A timing benchmark's own file (no BLEU schema: oracle, attention speed): its top-level keys and
    ``row_keys`` in every row; ValueError naming the file and what is wrong."""
    for key in ("benchmark", "hardware", "threads", "command", "rows"):
        if key not in obj:
            raise ValueError(f"{path}: missing key '{key}'")
    for i, row in enumerate(obj["rows"]):
        missing = [k for k in row_keys if k not in row]
        if missing:
            raise ValueError(f"{path}: rows[{i}]: missing {', '.join(missing)}")
    return obj


def row_key(row):
    """(system, decoding, distilled, seed): a leaderboard row's training seed is part of its key (a
    second seed of one system is a row of its own); rows without one have seed None."""
    return (row["system"], row["decoding"], bool(row["distilled"]), row.get("seed"))


def validate_row(row, where="row"):
    """List of problems with one row (empty when valid)."""
    errors = _check_fields(row, ROW_FIELDS, where, OPTIONAL_ROW_GROUPS)
    if errors:
        return errors
    if "blind" in row:
        for name, path in row["blind"].items():
            if not (isinstance(name, str) and isinstance(path, str) and name and path):
                errors.append(f"{where}.blind: expected test set name -> hypothesis file, got {name!r}: {path!r}")
    for key, (lo, hi) in _RANGES.items():
        if key in row and row[key] is not None and not lo <= row[key] <= hi:
            errors.append(f"{where}.{key}: {row[key]} outside [{lo}, {hi}]")
    if not row["system"].strip():
        errors.append(f"{where}.system: empty")
    if not row["hyp"].strip():
        errors.append(f"{where}.hyp: empty")
    if row["system"] == REFERENCE_SYSTEM:
        if row["decoding"] != REFERENCE_DECODING:
            errors.append(f"{where}.decoding: the reference row's decoding must be 'none'")
    elif not is_canonical_decoding(row["decoding"]):
        errors.append(
            f"{where}.decoding: {row['decoding']!r} is not a canonical decoding string "
            "(key=value joined by commas, e.g. beam=5 or iter=10,len_beam=3)"
        )
    return errors


def validate_results(obj):
    """List of problems with a results object (empty when it follows the schema)."""
    errors = _check_fields(obj, TOP_FIELDS, "results")
    if any("rows" in e for e in errors) or not isinstance(obj, dict):
        return errors
    if "threads" in obj and _type_ok(obj["threads"], int) and obj["threads"] < 1:
        errors.append("results.threads: must be >= 1")
    if "benchmark" in obj and isinstance(obj["benchmark"], str) and not obj["benchmark"].strip():
        errors.append("results.benchmark: empty")
    seen = set()
    for i, row in enumerate(obj["rows"]):
        row_errors = validate_row(row, f"rows[{i}]")
        errors.extend(row_errors)
        if not row_errors:
            key = row_key(row)
            if key in seen:
                errors.append(f"rows[{i}]: duplicate row for {key}")
            seen.add(key)
    return errors


class ResultsSchemaError(ValueError):
    pass


def check_results(obj, source="results"):
    errors = validate_results(obj)
    if errors:
        raise ResultsSchemaError(f"{source}: " + "; ".join(errors))
    return obj


def load_results(path):
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    return check_results(obj, str(path))


def save_results(path, obj):
    """Validate, then write atomically (2-space indent, trailing newline)."""
    check_results(obj, str(path))
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".results.", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def new_results(benchmark, data, hardware, threads, command, sacrebleu_signature):
    return {
        "benchmark": benchmark,
        "data": data,
        "hardware": hardware,
        "threads": int(threads),
        "command": command,
        "sacrebleu_signature": sacrebleu_signature,
        "rows": [],
    }


def make_row(system, decoding, distilled, bleu, tok_bleu, latency_ms_b1, sent_per_s_b128,
             iterations, repeat_rate, train_updates, train_wall_s, hyp, language_rates=None, leaderboard=None):
    """A row with the schema's types (floats rounded to 4 decimals for stable diffs); ``language_rates``:
    a dict with ``wrong_language_rate`` and ``mixed_language_rate`` (e.g. :func:`.language_id.language_rates`'s),
    or None for a row without them; ``leaderboard``: a dict with every key of :data:`LEADERBOARD_ROW_FIELDS`, or
    None."""
    row = {
        "system": str(system),
        "decoding": str(decoding),
        "distilled": bool(distilled),
        "bleu": round(float(bleu), 4),
        "tok_bleu": round(float(tok_bleu), 4),
        "latency_ms_b1": round(float(latency_ms_b1), 4),
        "sent_per_s_b128": round(float(sent_per_s_b128), 4),
        "iterations": round(float(iterations), 4),
        "repeat_rate": round(float(repeat_rate), 6),
        "train_updates": int(train_updates),
        "train_wall_s": round(float(train_wall_s), 1),
        "hyp": str(hyp),
    }
    if language_rates is not None:
        for key in OPTIONAL_ROW_FIELDS:
            row[key] = round(float(language_rates[key]), 6)
    if leaderboard is not None:
        for key, typ in LEADERBOARD_ROW_FIELDS.items():
            value = leaderboard[key]
            if value is None and key in NULLABLE_FIELDS:
                row[key] = None
            else:
                row[key] = round(float(value), 4) if typ is float else (dict(value) if typ is dict else typ(value))
    errors = validate_row(row)
    if errors:
        raise ResultsSchemaError("; ".join(errors))
    return row


def upsert_row(results, row):
    """Replace the row with the same key (:func:`row_key`) in place, else append it."""
    key = row_key(row)
    for i, old in enumerate(results["rows"]):
        if row_key(old) == key:
            results["rows"][i] = row
            return results
    results["rows"].append(row)
    return results


def hyp_filename(system, decoding, distilled, seed=None):
    """``fairseq:transformer``, ``beam=5`` -> ``fairseq_transformer__beam=5.txt``; a training seed other
    than 1 (a leaderboard's second seed) is appended as ``__seed<N>``."""
    name = f"{system.replace(':', '_').replace(os.sep, '_')}__{decoding}"
    if distilled:
        name += "__distilled"
    if seed is not None and int(seed) != 1:
        name += f"__seed{int(seed)}"
    return name + ".txt"


def hyp_path(results_json, benchmark, system, decoding, distilled, seed=None):
    """``<dir of results_json>/<benchmark>/<hyp_filename>``."""
    return os.path.join(
        os.path.dirname(results_json) or ".", benchmark, hyp_filename(system, decoding, distilled, seed)
    )


def blind_path(results_json, benchmark, hyp_file, test_set):
    """``<dir of results_json>/<benchmark>/blind/<stem of hyp_file>.<test_set>.txt``: a row's hypotheses
    of an unseen test set (no reference here)."""
    stem = os.path.splitext(os.path.basename(hyp_file))[0]
    return os.path.join(os.path.dirname(results_json) or ".", benchmark, "blind", f"{stem}.{test_set}.txt")
