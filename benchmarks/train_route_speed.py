"""Training speed of a recipe with the plugin's packed decoder route on and off, runs alternating.

    python -m benchmarks.train_route_speed --data-bin DATA_BIN [--recipe train_levenshtein.sh]
        [--init-from TEACHER.pt] [--updates 25] [--skip 5] [--rounds 2] [--threads 2] --out FILE.json

The Levenshtein Transformer's training passes (and the Insertion Transformer's) run their decoder on
``modules/packed.py``'s packed rows when the CPU route's guard allows it; ``FAIRSEQ_NAT_EXT_NO_FAST_DECODING=1``
makes them run fairseq's own layers.  This script trains the recipe for ``--updates`` updates from the
same initialisation, once per route and round, the routes alternating (the order swapped every other
round, so a slow spell of the machine lands on both), and times the updates after the first ``--skip``
from fairseq's own ``wall`` clock of the log (start-up, data loading and the first updates are left out).
Nothing is saved (``--no-save``), validation is off.

fairseq logs ``wall`` in whole seconds, so time enough updates that the timed span is many seconds (the
defaults: 20 timed updates of a few seconds each); a span under a second gives 0 and no ratio.

Written to ``--out``: the plugin's git commit, the machine, the command, seconds per update of every run,
each route's mean, the ratio (fairseq's layers / packed: > 1 means the packed route is faster) and the
training loss of both routes at each logged update (the same maths; dropout draws differ between the
routes, so the losses agree closely, not exactly).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from . import REPO, write_json

LINE = re.compile(r"train_inner \|.*?[\s,]loss=([0-9.]+).*?[\s,]num_updates=(\d+).*?[\s,]wall=([0-9.]+)")


def parse_log(text):
    """fairseq's ``train_inner`` lines -> [(num_updates, loss, wall seconds)]."""
    return [(int(m.group(2)), float(m.group(1)), float(m.group(3))) for m in LINE.finditer(text)]


def seconds_per_update(points, skip):
    """(updates, loss, wall) points -> seconds per update between update ``skip`` and the last one."""
    by_update = {u: w for u, _, w in points}
    if skip not in by_update:
        raise ValueError(f"no log line at update {skip} (log every --skip updates)")
    last = max(by_update)
    if last <= skip:
        raise ValueError(f"the run stopped at update {last}, not after {skip}")
    return (by_update[last] - by_update[skip]) / (last - skip)


def run_once(args, packed, workdir):
    env = dict(os.environ, MAX_UPDATE=str(args.updates), AVG="0", SEED=str(args.seed), THREADS=str(args.threads))
    if args.init_from:
        env["INIT_FROM"] = args.init_from
    if packed:
        env.pop("FAIRSEQ_NAT_EXT_NO_FAST_DECODING", None)
    else:
        env["FAIRSEQ_NAT_EXT_NO_FAST_DECODING"] = "1"
    save = tempfile.mkdtemp(dir=workdir)
    cmd = ["bash", os.path.join(REPO, "examples", args.recipe), args.data_bin, save, "--log-interval", str(args.skip),
           "--no-save", "--disable-validation"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed (rc {proc.returncode}):\n{proc.stderr[-2000:]}")
    points = parse_log(proc.stdout + proc.stderr)
    return {"route": "packed" if packed else "fairseq", "s_per_update": seconds_per_update(points, args.skip),
            "process_wall_s": round(wall, 1), "loss": {u: l for u, l, _ in points}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-bin", required=True)
    p.add_argument("--recipe", default="train_levenshtein.sh")
    p.add_argument("--init-from", default=None)
    p.add_argument("--updates", type=int, default=25)
    p.add_argument("--skip", type=int, default=5, help="updates left out of the timing (also the log interval)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if not os.path.isdir(args.data_bin) or not any(f.startswith("dict.") for f in os.listdir(args.data_bin)):
        sys.exit(f"error: --data-bin {args.data_bin}: no dict.*.txt (a fairseq-preprocess output directory)")
    if args.updates <= args.skip or args.skip < 1:
        sys.exit("error: --updates must exceed --skip >= 1")
    from fairseq_nat_ext.evaluation.provenance import hardware_description, portable_command, portable_path

    from .speed_ratio import _commit

    runs = []
    with tempfile.TemporaryDirectory() as work:
        for r in range(args.rounds):
            for packed in ((True, False) if r % 2 == 0 else (False, True)):
                run = run_once(args, packed, work)
                run["round"] = r
                runs.append(run)
                print(f"[train_route_speed] round {r} {run['route']}: {run['s_per_update']:.3f} s/update",
                      file=sys.stderr, flush=True)
    mean = {k: statistics.mean(x["s_per_update"] for x in runs if x["route"] == k) for k in ("packed", "fairseq")}
    out = {"benchmark": "train_route_speed", "recipe": args.recipe, "data_bin": portable_path(args.data_bin),
           "init_from": portable_path(args.init_from), "updates": args.updates, "timed_after": args.skip,
           "rounds": args.rounds, "threads": args.threads, "seed": args.seed, "commit": _commit(),
           "hardware": hardware_description(),
           "command": portable_command(["python", "-m", "benchmarks.train_route_speed",
                                        *(argv if argv is not None else sys.argv[1:])]),
           "runs": runs, "s_per_update": mean, "wall_resolution_s": 1,
           # fairseq logs its wall clock in whole seconds: a run shorter than that has no ratio
           "fairseq_over_packed": mean["fairseq"] / mean["packed"] if mean["packed"] > 0 else None,
           "date": time.strftime("%Y-%m-%d", time.gmtime())}
    write_json(args.out, out)
    print(json.dumps({k: out[k] for k in ("s_per_update", "fairseq_over_packed")}))


if __name__ == "__main__":
    main()
