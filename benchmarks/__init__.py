"""The project's benchmark studies, plots and table writers (not installed; run from the repository root).

    python -m benchmarks.<module> ...

Everything a user needs to score or time their own model lives in the installed package,
:mod:`fairseq_nat_ext.evaluation` (scoring, decoding options, inference, timing, provenance, the results
JSON and the per-system harness ``python -m fairseq_nat_ext.evaluation.run``).  This folder holds what
only the project's own benchmarks use:

* :mod:`.tables`              Markdown tables from results files; regenerates ``docs/benchmarks.md``
* :mod:`.plot`                BLEU vs latency scatter per benchmark (``<benchmark>.png``)
* :mod:`.nat_chart`           the README's NAT overview chart (BLEU vs speed-up over each benchmark's teacher)
* :mod:`.attention_speed`     one attention layer, every variant and peer package, N = 512 ... 16384
* :mod:`.attention_peers`     adapters for the peer packages (local-attention, linformer, performer, ...)
* :mod:`.attention_listops`   ListOps accuracy per attention variant
* :mod:`.attention_results`   the attention studies' results files and tables
* :mod:`.attention_plots`     attention patterns, speed curves, LRA-style bubble chart
* :mod:`.oracle_speed`        our batched Levenshtein oracle against fairseq's libnat
* :mod:`.pointer`             Vinyals et al.'s pointer-network tables (data, training, evaluation)
* :mod:`.pointer_results`     the pointer benchmark's results file and table
* :mod:`.pointer_plots`       predicted vs true hulls / tours
* :mod:`.kermit_conditioning` KERMIT's conditional losses on a split
* :mod:`.nat_profile`         Mask-Predict's per-pass profile and any decoding's product FLOPs
* :mod:`.speed_ratio`         a decoding's batch-1 speed against the teacher's, timed interleaved
* :mod:`.route_regression`    a decoding's batch-1 speed and output with this checkout and an earlier commit
* :mod:`.train_route_speed`   a recipe's training speed with the packed decoder route on and off

Nothing under ``fairseq_nat_ext/`` imports this package (``tests/test_layout.py``).
"""
import json
import os

#: the repository root (this folder's parent)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def repo_env(env=None):
    """``env`` (default: ``os.environ``) with the repository root first on ``PYTHONPATH``, so that a
    subprocess can run ``python -m benchmarks.<module>`` from any working directory."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def write_json(path, obj):
    """Write ``obj`` to ``path`` as JSON (indent 1) through a temporary file and a rename: an interrupted
    run leaves the old file, never half of a new one."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)
