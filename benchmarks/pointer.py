"""The pointer-network benchmark (Vinyals et al. 2015, tables 1-2 on CPU-sized budgets).

    python -m benchmarks.pointer --work-dir runs/pointer \
        --out benchmarks/results/pointer.json [--stages data,train,eval] [--experiments ...] [--archs ...]

Experiments (``--experiments``, default all):

==============  ===========  =======  ===================
name            problem      n train  n test
==============  ===========  =======  ===================
``hull50``      convex_hull  50       50
``hull5-50``    convex_hull  5-50     5, 10, 50, 100, 200
``delaunay5``   delaunay     5        5
``delaunay10``  delaunay     10       10
``tsp5-20``     tsp          5-20     5, 10, 20
==============  ===========  =======  ===================

Stages:

* ``data``: ``WORK/data/<problem>_<n train>/{train,valid}.txt`` (seeds 1 and 2) and
  ``WORK/data/<problem>_test/test_n<N>.txt`` (seed 1000 + N), generated when missing
  (:mod:`fairseq_nat_ext.data.pointer_geometry`; TSP references: Held-Karp up to n = 12, LKH above).
* ``train``: ``examples/train_pointer.sh`` per experiment and arch into ``WORK/ckpt/<exp>_<arch>``
  (budgets from the environment: ``MAX_UPDATE``, ``STOP_TIME_HOURS``, ``BATCH_SIZE``, ...; fairseq
  resumes from ``checkpoint_last.pt``; a finished run is not started again).
* ``eval``: every checkpoint (``checkpoint_best.pt``, else ``checkpoint_last.pt``) decodes every test
  set with each ``--beams`` width; one row per (experiment, arch, n test, beam) is upserted into
  ``--out`` (schema: :mod:`.pointer_results`), and ``<out dir>/<benchmark>/<problem>.png`` shows a few
  predicted vs true outputs.  Any invalid TSP tour stops the benchmark with an error.  ``--benchmark
  pointer_<name>``: the rows of a subset re-measured on other hardware, as their own benchmark (write
  them to their own ``--out``).
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

from fairseq_nat_ext.evaluation import pointer_metrics as pm

from . import REPO
from . import pointer_results as pr

EXPERIMENTS = {
    "hull50": ("convex_hull", "50", (50,)),
    "hull5-50": ("convex_hull", "5-50", (5, 10, 50, 100, 200)),
    "delaunay5": ("delaunay", "5", (5,)),
    "delaunay10": ("delaunay", "10", (10,)),
    "tsp5-20": ("tsp", "5-20", (5, 10, 20)),
}
ARCHS = ("pointer_lstm", "pointer_transformer")
TRAIN_SEED, VALID_SEED, TEST_SEED_BASE = 1, 2, 1000


def train_dir(work, problem, n_train):
    return os.path.join(work, "data", f"{problem}_{n_train}")


def test_dir(work, problem):
    return os.path.join(work, "data", f"{problem}_test")


def ckpt_dir(work, exp, arch):
    return os.path.join(work, "ckpt", f"{exp}_{arch}")


def _write(problem, n, count, seed, path, lkh_runs):
    from fairseq_nat_ext.data import pointer_geometry

    if os.path.exists(path):
        return
    argv = ["--problem", problem, "--n", str(n), "--count", str(count), "--seed", str(seed), "--out", path,
            "--lkh-runs", str(lkh_runs)]
    if pointer_geometry.main(argv) != 0:
        raise SystemExit(f"error: could not write {path}")


def stage_data(args, exps):
    for exp in exps:
        problem, n_train, tests = EXPERIMENTS[exp]
        d = train_dir(args.work_dir, problem, n_train)
        _write(problem, n_train, args.train_size, TRAIN_SEED, os.path.join(d, "train.txt"), args.lkh_runs)
        _write(problem, n_train, args.valid_size, VALID_SEED, os.path.join(d, "valid.txt"), args.lkh_runs)
        for n in tests:
            path = os.path.join(test_dir(args.work_dir, problem), f"test_n{n}.txt")
            _write(problem, n, args.test_size, TEST_SEED_BASE + n, path, args.lkh_runs)


def finished(save, budget):
    """Whether the training in ``save`` already ended under this ``budget`` ("MAX_UPDATE=... STOP_TIME_HOURS=..."
    as the recipe writes it): checkpoint_last.pt exists and the last run in train.log had the same budget and
    ended with fairseq-train's "done training" line (a killed run did not; a larger budget trains on)."""
    log = os.path.join(save, "train.log")
    if not (os.path.exists(os.path.join(save, "checkpoint_last.pt")) and os.path.exists(log)):
        return False
    with open(log, encoding="utf-8", errors="replace") as f:
        last = f.read().split("# train_pointer.sh ")[-1]  # the recipe starts every run's log with this line
    header = last.split("\n", 1)[0]
    return all(f" {item} " in f" {header} " for item in budget.split()) and "| done training in " in last


def stage_train(args, exps, archs):
    # the budget as train_pointer.sh writes it into train.log (its own defaults when unset)
    budget = f"MAX_UPDATE={os.environ.get('MAX_UPDATE', '20000')} STOP_TIME_HOURS={os.environ.get('STOP_TIME_HOURS', '0')}"
    for exp in exps:
        problem, n_train, _ = EXPERIMENTS[exp]
        for arch in archs:
            save = ckpt_dir(args.work_dir, exp, arch)
            if finished(save, budget):  # fairseq-train on a finished checkpoint would still make one more update
                print(f"[pointer] {exp} {arch}: training finished earlier ({save}), kept", flush=True)
                continue
            env = dict(os.environ, PROBLEM=problem, ARCH=arch)
            if arch != "pointer_transformer":
                env["INDEX_RANGE"] = "0"  # randomised index positions are pointer_transformer's option
            print(f"[pointer] training {exp} {arch} -> {save}", flush=True)
            subprocess.run(["bash", os.path.join(REPO, "examples", "train_pointer.sh"),
                            train_dir(args.work_dir, problem, n_train), save], env=env, check=True)


def find_checkpoint(save):
    for name in ("checkpoint_best.pt", "checkpoint_last.pt"):
        path = os.path.join(save, name)
        if os.path.exists(path):
            return path
    return None


def decode_split(generator, model, task, split, beam, batch_size, device):
    """Predictions (0-based output sequences without the end) for every example of ``split``."""
    import torch

    task.load_dataset(split)
    ds = task.dataset(split)
    preds = [None] * len(ds)
    itr = task.get_batch_iterator(ds, max_sentences=batch_size).next_epoch_itr(shuffle=False)
    for batch in itr:
        net = batch["net_input"]
        res = generator.search([model], net["src_coords"].to(device), net["src_lengths"].to(device), beam=beam)
        slots, lengths = res["slots"][:, 0].cpu(), res["lengths"][:, 0].cpu()
        for row, i in enumerate(batch["id"].tolist()):
            seq = slots[row, :int(lengths[row])].tolist()
            preds[i] = [s - 1 for s in seq if s > 0]  # drop the end, 0-based points
    return ds.data, preds


def score(problem, data, preds):
    refs = [data.output_of(i).tolist() for i in range(len(data))]
    pts = [data.points_of(i) for i in range(len(data))]
    out = {"accuracy": pm.sequence_accuracy(problem, preds, refs)}
    if problem == "convex_hull":
        out["area_coverage"] = float(np.mean([pm.hull_area_coverage(p, a, b) for p, a, b in zip(pts, preds, refs)]))
    elif problem == "delaunay":
        out["triangle_coverage"] = float(np.mean([pm.triangle_coverage(a, b) for a, b in zip(preds, refs)]))
    else:
        bad = [i for i, (p, a) in enumerate(zip(pts, preds)) if not pm.is_valid_tour(len(p), a)]
        if bad:
            raise SystemExit(f"error: {data.path}: {len(bad)} emitted tours are invalid (first: example "
                             f"{bad[0] + 1}: {[v + 1 for v in preds[bad[0]]]})")
        out["tour_length"] = float(np.mean([pm.tour_length(p, a) for p, a in zip(pts, preds)]))
        out["reference_tour_length"] = float(np.mean([pm.tour_length(p, b) for p, b in zip(pts, refs)]))
        kind = data.header.get("reference")
        if kind not in ("exact", "lkh"):
            raise SystemExit(f"error: {data.path}: header says reference={kind!r}; a test file needs "
                             "one reference kind (exact or lkh)")
        out["reference"] = kind
    return out


def stage_eval(args, exps, archs):
    import torch
    from fairseq import checkpoint_utils

    import fairseq_nat_ext  # noqa: F401  (registration)
    from .pointer_plots import plot_examples
    from fairseq_nat_ext.evaluation.provenance import (hardware_description, portable_command, portable_text,
                                                       resolve_training_stats)
    from fairseq_nat_ext.generators.pointer_geometry import PointerGenerator

    torch.set_num_threads(args.threads)
    device = "cuda" if args.cuda and torch.cuda.is_available() else "cpu"
    if os.path.exists(args.out):
        results = pr.load_results(args.out)
        if results["benchmark"] != args.benchmark:
            raise SystemExit(f"error: {args.out} holds benchmark {results['benchmark']!r}, not --benchmark "
                             f"{args.benchmark!r}; give this benchmark its own --out")
    else:
        results = pr.new_results("", args.threads, "", benchmark=args.benchmark)
    results.update(hardware=hardware_description(device), threads=args.threads,
                   command=portable_text(args.command)
                   or "python -m benchmarks.pointer " + portable_command(sys.argv[1:]))
    plots = {}
    for exp in exps:
        problem, n_train, tests = EXPERIMENTS[exp]
        for arch in archs:
            path = find_checkpoint(ckpt_dir(args.work_dir, exp, arch))
            if path is None:
                print(f"[pointer] {exp} {arch}: no checkpoint, skipped", flush=True)
                continue
            state = checkpoint_utils.load_checkpoint_to_cpu(path)
            log = os.path.join(os.path.dirname(path), "train.log")
            updates, wall = resolve_training_stats(log_path=log if os.path.exists(log) else None, state=state)
            models, _, task = checkpoint_utils.load_model_ensemble_and_task(
                [path], arg_overrides={"data": test_dir(args.work_dir, problem)})
            model = models[0].to(device).eval()
            if model.problem != problem:
                raise SystemExit(f"error: {path} was trained on {model.problem}, not {problem}")
            for n in tests:
                for beam in args.beams:
                    gen = PointerGenerator([model], task.target_dictionary, problem, beam=beam)
                    t0 = time.time()
                    data, preds = decode_split(gen, model, task, f"test_n{n}", beam, args.batch_size, device)
                    metrics = score(problem, data, preds)
                    row = pr.make_row(problem, arch, n_train, n, f"beam={beam}", train_updates=updates,
                                      train_wall_s=wall, **metrics)
                    row["command"] = results["command"]
                    pr.upsert_row(results, row)
                    pr.save_results(args.out, results)
                    print(f"[pointer] {exp} {arch} n={n} beam={beam}: "
                          + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in metrics.items()) + f" ({time.time() - t0:.1f}s)", flush=True)
                    if problem not in plots or (n, beam) > plots[problem][0]:
                        k = min(args.plot_examples, len(preds))
                        plots[problem] = ((n, beam), [
                            (data.points_of(i), preds[i], data.output_of(i).tolist(),
                             f"{arch} n={n} beam={beam} #{i + 1}") for i in range(k)])
    for problem, (_, examples) in plots.items():
        png = os.path.join(os.path.dirname(os.path.abspath(args.out)), args.benchmark, f"{problem}.png")
        plot_examples(png, problem, examples, title=f"{problem}: predicted (red) vs true (grey)")
        print(f"[pointer] wrote {png}")
    return results


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.pointer", description=__doc__.split("\n\n")[0])
    p.add_argument("--work-dir", default=os.path.join(REPO, "runs", "pointer"))
    p.add_argument("--out", default=None, help="results file [benchmarks/results/<benchmark>.json]")
    p.add_argument("--benchmark", default=pr.BENCHMARK,
                   help="results name: 'pointer', or 'pointer_<name>' for a subset re-measured elsewhere")
    p.add_argument("--stages", default="data,train,eval", help="comma-separated subset of data,train,eval")
    p.add_argument("--experiments", default=",".join(EXPERIMENTS), help=f"subset of {','.join(EXPERIMENTS)}")
    p.add_argument("--archs", default=",".join(ARCHS))
    p.add_argument("--train-size", type=int, default=100000)
    p.add_argument("--valid-size", type=int, default=1000)
    p.add_argument("--test-size", type=int, default=1000)
    p.add_argument("--lkh-runs", type=int, default=10)
    p.add_argument("--beams", default="1,5", help="beam widths to evaluate (1 = greedy)")
    p.add_argument("--batch-size", type=int, default=128, help="evaluation batch (sentences)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cuda", action="store_true", help="decode on CUDA when available")
    p.add_argument("--plot-examples", type=int, default=8)
    p.add_argument("--command", default="", help="how the run was made (recorded in the results)")
    args = p.parse_args(argv)
    stages = [s for s in args.stages.split(",") if s]
    exps = [e for e in args.experiments.split(",") if e]
    archs = [a for a in args.archs.split(",") if a]
    problems = [f"unknown stage {s!r}" for s in stages if s not in ("data", "train", "eval")]
    problems += [f"unknown experiment {e!r}" for e in exps if e not in EXPERIMENTS]
    problems += [f"unknown arch {a!r}" for a in archs if a not in ARCHS]
    if not pr.NAME_PATTERN.match(args.benchmark):
        problems.append(f"--benchmark {args.benchmark!r}: expected 'pointer' or 'pointer_<name>'")
    if args.out is None:
        args.out = os.path.join(REPO, "benchmarks", "results", f"{args.benchmark}.json")
    try:
        args.beams = [int(b) for b in args.beams.split(",") if b]
    except ValueError:
        problems.append(f"--beams {args.beams!r}: expected integers")
    if problems or any(b < 1 for b in args.beams) or min(args.train_size, args.valid_size, args.test_size) < 1:
        print("error: " + ("; ".join(problems) or "--beams and sizes must be >= 1"), file=sys.stderr)
        return 1
    if "data" in stages:
        stage_data(args, exps)
    if "train" in stages:
        stage_train(args, exps, archs)
    if "eval" in stages:
        stage_eval(args, exps, archs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
