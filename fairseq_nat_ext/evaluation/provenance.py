"""Where a row comes from: system name, training cost, hardware.

Training cost (``train_updates``, ``train_wall_s``) is taken, in this order of precedence, from
explicit values (CLI), a fairseq training log, or the checkpoint:

* checkpoint: fairseq's ``Trainer.state_dict`` stores ``optimizer_history[-1]["num_updates"]`` and
  ``extra_state["previous_training_time"]`` (cumulative wall seconds of training, carried over
  restarts); older checkpoints may only hold the ``wall`` meter in ``extra_state["metrics"]``.
  Stripped checkpoints (e.g. the shared teacher) may lack the time: then it must be given.
* log: the last line of a ``fairseq-train`` log that reports both ``num_updates`` and ``wall``
  (``train_inner`` or end-of-epoch ``train`` lines; simple, tqdm or JSON log format).

Paths and commands in results name no machine: :func:`portable_path`, :func:`portable_command` and
:func:`portable_text` write them relative to the repository root (the git checkout holding the current
directory: ``runs/x``, ``../shared/data/x`` for a folder next to the checkout), or to the current
directory outside a checkout.
"""
import os
import re
import shlex

_UPDATES_RE = re.compile(r"\bnum_updates\"?\s*[:=|]?\s*\"?(\d+)")
_WALL_RE = re.compile(r"\bwall\"?\s*[:=|]?\s*\"?(\d+(?:\.\d+)?)")


def repository_root(start=None):
    """The top folder of the git checkout holding ``start`` (default: the current directory), or None."""
    folder = os.path.abspath(start or os.getcwd())
    while True:
        if os.path.exists(os.path.join(folder, ".git")):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def portable_path(path, root=None):
    """``path`` as a results file records it: relative to ``root`` (default: :func:`repository_root`, else
    the current directory), with ``/`` separators, never absolute; a relative ``path`` is read from the
    current directory.  Empty stays empty; a path on another drive (Windows) is returned as given."""
    if not path:
        return path
    base = root or repository_root() or os.getcwd()
    try:
        rel = os.path.relpath(os.path.abspath(path), os.path.abspath(base))
    except ValueError:
        return path
    return rel.replace(os.sep, "/")


def _portable_word(word, root=None):
    """One command-line word: an absolute path, ``NAME=/abs/path`` or ``--opt=/a.pt:/b.pt`` (an
    ensemble) with every absolute path made portable; anything else unchanged."""
    cut = 0 if os.path.isabs(word) else next(
        (i + 1 for i, ch in enumerate(word) if ch == "=" and os.path.isabs(word[i + 1:])), 0)
    head, value = word[:cut], word[cut:]
    parts = value.split(":")
    if not any(os.path.isabs(part) for part in parts):
        return word
    return head + ":".join(portable_path(part, root) if os.path.isabs(part) else part for part in parts)


def portable_command(words, root=None):
    """A shell command line from ``words`` (program and arguments), each quoted, absolute paths made
    portable (:func:`portable_path`)."""
    return " ".join(shlex.quote(_portable_word(str(w), root)) for w in words)


# an absolute path inside free text: after the start, whitespace, a quote, '=', '(', ',' or ':' (so
# "words/s" or "en->de" are not paths), up to whitespace, a quote, ':', ';', ',' or a bracket
_TEXT_PATH_RE = re.compile(r"(?<![^\s'\"=(,:])/[A-Za-z0-9_.~+-][^\s'\"`:;,()\[\]]*")


def portable_text(text, root=None):
    """Free text (a ``--command`` or ``--data-name`` given by a script) with every absolute path in it
    made portable (:func:`portable_path`); a trailing full stop stays outside the path."""
    if not text:
        return text

    def repl(match):
        path = match.group(0)
        stop = "." if path.endswith(".") and not path.endswith("..") else ""
        return portable_path(path[:len(path) - len(stop)], root) + stop

    return _TEXT_PATH_RE.sub(repl, text)


def _field(obj, name):
    if obj is None:
        return None
    if hasattr(obj, "get") and not isinstance(obj, type):  # dict, DictConfig
        try:
            return obj.get(name)
        except Exception:  # omegaconf raises on missing keys of structured configs
            return None
    return getattr(obj, name, None)


def arch_of_state(state):
    """Registered arch name stored in a checkpoint dict (``cfg.model.arch``/``_name`` or legacy
    ``args.arch``); None when absent."""
    cfg = state.get("cfg")
    for holder in (_field(cfg, "model"), cfg, state.get("args")):
        for name in ("arch", "_name"):
            value = _field(holder, name)
            if isinstance(value, str) and value:
                return value
    return None


def system_name(arch, model_module):
    """``mask_predict`` for this plugin's archs, ``fairseq:<arch>`` for fairseq's own."""
    if model_module.split(".")[0] == "fairseq_nat_ext":
        return arch
    return f"fairseq:{arch}"


def training_stats_from_state(state):
    """(num_updates or None, wall seconds or None) from a loaded fairseq checkpoint dict."""
    updates = wall = None
    history = state.get("optimizer_history") or []
    if history and history[-1].get("num_updates") is not None:
        updates = int(history[-1]["num_updates"])
    extra = state.get("extra_state") or {}
    if extra.get("previous_training_time") is not None:
        wall = float(extra["previous_training_time"])
    else:
        for entry in (extra.get("metrics") or {}).get("default", []) or []:
            # MetersDict.state_dict(): (priority, key, meter class name, meter state)
            if len(entry) == 4 and entry[1] == "wall" and isinstance(entry[3], dict):
                wall = float(entry[3].get("init", 0.0))
    return updates, wall


_STAMP_RE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \| ")
_RUN_START = "fairseq_cli.train | {"  # fairseq-train logs its whole config when a process starts
_PREAMBLE_S = 60  # a process's log lines before its config (imports) come within this many seconds


def training_stats_from_log(path):
    """(num_updates or None, wall seconds or None) from a fairseq-train log (``tee -a`` of every run).

    Updates: the last line with ``num_updates``.  Wall time: summed over the runs of a resumed training
    (each run starts where fairseq-train logs its config), from the first to the last timestamped line
    of each run; a resumed run's own ``wall`` meter restarts (and fairseq logs 0 after a resume), so the
    meter is used only for logs without timestamps.  A process logs a few lines (imports) before its
    config: lines less than ``_PREAMBLE_S`` seconds before a run's start belong to that run, not to the
    previous one (which may have been killed hours earlier)."""
    from datetime import datetime, timedelta

    updates = meter = None
    runs = []  # the timestamps of each run's lines
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            u, w = _UPDATES_RE.search(line), _WALL_RE.search(line)
            if u and w:
                updates, meter = int(u.group(1)), float(w.group(1))
            m = _STAMP_RE.match(line)
            if m:
                t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
                if _RUN_START in line and runs:
                    cut = t - timedelta(seconds=_PREAMBLE_S)
                    preamble = [x for x in runs[-1] if x >= cut]
                    runs[-1] = [x for x in runs[-1] if x < cut] or runs[-1][:1]
                    runs.append(preamble + [t])
                elif not runs:
                    runs.append([t])
                else:
                    runs[-1].append(t)
    if updates is None:
        return None, None
    if runs:
        return updates, float(sum((max(r) - min(r)).total_seconds() for r in runs))
    return updates, meter


_EPOCH_LINE_RE = re.compile(r"\| train \| epoch \d+ \|.*\bwpb ([0-9.]+) \|.*\bnum_updates (\d+)\b")


def training_words_from_log(path):
    """Target tokens trained on, from a fairseq-train log's end-of-epoch ``train`` lines (words per batch x
    the epoch's updates, each run of a resumed training counted from where it resumed); None when the log
    has none."""
    words, last, seen = 0.0, 0, False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _EPOCH_LINE_RE.search(line)
            if m:
                wpb, updates = float(m.group(1)), int(m.group(2))
                if updates > last:
                    words += wpb * (updates - last)
                    last, seen = updates, True
    return words if seen else None


def training_settings(state):
    """(seed, max_tokens) of the training run, from a loaded checkpoint's config (None where absent)."""
    cfg, args = state.get("cfg"), state.get("args")
    common, dataset = _field(cfg, "common"), _field(cfg, "dataset")
    seed = _field(common, "seed") if common is not None else _field(args, "seed")
    max_tokens = _field(dataset, "max_tokens") if dataset is not None else _field(args, "max_tokens")
    return (None if seed is None else int(seed)), (None if max_tokens is None else int(max_tokens))


def resolve_training_stats(explicit_updates=None, explicit_wall=None, log_path=None, state=None):
    """Combine the sources (explicit > log > checkpoint); ValueError naming what is missing."""
    updates, wall = explicit_updates, explicit_wall
    for source in (
        (lambda: training_stats_from_log(log_path)) if log_path else None,
        (lambda: training_stats_from_state(state)) if state is not None else None,
    ):
        if source is None or (updates is not None and wall is not None):
            continue
        u, w = source()
        updates = u if updates is None else updates
        wall = w if wall is None else wall
    missing = [n for n, v in (("train updates", updates), ("train wall time", wall)) if v is None]
    if missing:
        raise ValueError(
            f"{' and '.join(missing)} not found in the checkpoint"
            + (" or the training log" if log_path else "")
            + ": pass --train-updates / --train-wall-s (or --train-log)"
        )
    if updates < 0 or wall < 0:
        raise ValueError("train updates and wall time must be >= 0")
    return int(updates), float(wall)


def cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


def available_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def hardware_description(device="cpu"):
    """``"<CPU model>, N cores"`` or ``"<CUDA device name> (CUDA), host <CPU model>, N cores"``."""
    host = f"{cpu_model()}, {available_cores()} cores"
    if str(device).startswith("cuda"):
        import torch

        return f"{torch.cuda.get_device_name(torch.device(device))} (CUDA), host {host}"
    return host
