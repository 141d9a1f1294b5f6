"""Batch-1 decoding speed and hypotheses of this checkout against an earlier commit, runs alternating.

    python -m benchmarks.route_regression --before REF --data-bin DATA_BIN
        --system NAME CKPT DECODING [--system ...] [--system-option NAME OPTION=VALUE] [--sentences 200]
        [--rounds 2] [--threads 2] --out FILE.json

A change to the plugin's decoding code must leave each decoder's speed and output where they were.  A
before/after pair of harness tables carries whatever the machine did between the two runs (on the
shared 2-core machine the same decoding's batch-1 time moved by a third within an hour); two versions of
the plugin cannot share one process.  So this script checks ``REF`` out once as a detached git worktree
(beside this checkout, removed at the end), and for every system decodes the first ``--sentences``
sentences of the split at batch 1 in one fresh process per version and round, the versions alternating
(before, after; then after, before; ...), each process importing the plugin from its own tree
(``PYTHONPATH``; the process checks where ``fairseq_nat_ext`` came from).  Each process loads the
checkpoint, builds the harness's generator (``fairseq_nat_ext.evaluation.run``'s factory, as
``benchmarks.speed_ratio``), warms up on the first 10 sentences, seeds torch once (NPD samples) and times
every sentence's inference step; loading is not timed.

Written to ``--out``: both commits, the machine, the command, and per system each version's milliseconds
per sentence in every round and over all rounds, the ratio after / before (< 1: this checkout is
faster), whether it is within ``--tolerance`` (default 5%), and whether the two versions gave identical
hypotheses (token ids and detokenised strings) on every sentence of every round.  A checkpoint whose task
options include ones the earlier commit does not know (fairseq refuses to load it there) is decoded by
the earlier code from a copy without them; the file names them (``task_options_left_out_before``).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD_SEED = 1


def _child(argv):
    """One process: import the plugin from ``--tree``, decode, write ms per sentence and the hypotheses."""
    p = argparse.ArgumentParser()
    for a in ("--tree", "--path", "--decoding", "--data-bin", "--split", "--src-lang", "--tgt-lang", "--out",
              "--extra"):
        p.add_argument(a, required=True)
    p.add_argument("--sentences", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    args = p.parse_args(argv)
    tree = os.path.realpath(args.tree)
    sys.path.insert(0, tree)
    import fairseq_nat_ext  # noqa: F401

    where = os.path.realpath(fairseq_nat_ext.__file__)
    if not where.startswith(tree + os.sep):
        sys.exit(f"error: fairseq_nat_ext imported from {where}, not from {tree}")
    import torch

    from benchmarks.speed_ratio import _decode_one, _system
    from fairseq_nat_ext.evaluation.timing import set_threads

    set_threads(args.threads)
    path, dropped = _loadable(args.path, os.path.dirname(args.out))
    s = _system(path, args, args.decoding, json.loads(args.extra))
    ids = sorted(s.by_id)
    tgt_dict = s.task.target_dictionary
    with torch.no_grad():
        for i in ids[:10]:
            _decode_one(s, s.by_id[i])
        torch.manual_seed(CHILD_SEED)
        seconds, tokens = 0.0, []
        for i in ids:
            sec, toks = _decode_one(s, s.by_id[i])
            seconds += sec
            tokens.append(toks)
    strings = [tgt_dict.string(torch.tensor(t, dtype=torch.long)) for t in tokens]
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"plugin": where, "dropped_task_options": dropped, "sentences": len(ids),
                   "ms_per_sentence": 1000 * seconds / len(ids), "tokens": tokens, "strings": strings}, f)


def _loadable(path, workdir):
    """``path``, or where its task options unknown to this process's plugin (options added after the
    earlier commit, e.g. ``no_fast_decoding``) are left out of a copy -> (path, the options left out).
    fairseq refuses a checkpoint whose task config has a key its task's dataclass lacks."""
    import torch
    from fairseq import checkpoint_utils
    from fairseq.tasks import TASK_DATACLASS_REGISTRY
    from omegaconf import open_dict

    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    task_cfg = (state.get("cfg") or {}).get("task")
    dc = TASK_DATACLASS_REGISTRY.get(task_cfg.get("_name")) if task_cfg is not None else None
    if dc is None:
        return path, {}
    dropped = {k: task_cfg[k] for k in list(task_cfg.keys()) if k != "_name" and k not in dc.__dataclass_fields__}
    if not dropped:
        return path, {}
    with open_dict(task_cfg):
        for k in dropped:
            del task_cfg[k]
    copy = os.path.join(workdir, "before_" + os.path.basename(path))
    torch.save(state, copy)
    return copy, {k: str(v) for k, v in dropped.items()}


def _git(*args):
    from benchmarks import REPO

    return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, check=True).stdout.strip()


def _run_child(tree, system, args, extra, workdir):
    from benchmarks import REPO

    out = os.path.join(workdir, "child.json")
    cmd = [sys.executable, "-m", "benchmarks.route_regression", "--child", "--tree", tree, "--path", system[1],
           "--decoding", system[2], "--data-bin", args.data_bin, "--split", args.split, "--src-lang",
           args.src_lang, "--tgt-lang", args.tgt_lang, "--out", out, "--extra", json.dumps(extra),
           "--sentences", str(args.sentences), "--threads", str(args.threads)]
    # the after tree's benchmarks package (this file), the plugin from `tree` (the child puts it first)
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop("FAIRSEQ_NAT_EXT_NO_FAST_DECODING", None)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"error: decoding {system[0]} with the plugin of {tree} failed (rc {proc.returncode}):\n"
                 f"{proc.stderr[-3000:]}")
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def compare(before, after, tolerance):
    """Per-round results of both versions -> the summary of one system (ms, ratio, identical outputs)."""
    mb = sum(r["ms_per_sentence"] for r in before) / len(before)
    ma = sum(r["ms_per_sentence"] for r in after) / len(after)
    ratio = ma / mb
    ref = before[0]
    same = all(r["tokens"] == ref["tokens"] and r["strings"] == ref["strings"] for r in before + after)
    return {"before_ms_per_sentence": round(mb, 2), "after_ms_per_sentence": round(ma, 2),
            "before_ms_per_round": [round(r["ms_per_sentence"], 2) for r in before],
            "after_ms_per_round": [round(r["ms_per_sentence"], 2) for r in after],
            "ratio_after_over_before": round(ratio, 3), "within_tolerance": ratio <= 1 + tolerance,
            "identical_hypotheses": same, "sentences": ref["sentences"],
            "task_options_left_out_before": ref.get("dropped_task_options", {})}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        return _child(argv[1:])
    from benchmarks import REPO, write_json
    from fairseq_nat_ext.evaluation import provenance
    from fairseq_nat_ext.evaluation import run as harness

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="git commit (or ref) of the code compared against")
    p.add_argument("--data-bin", required=True)
    p.add_argument("--system", nargs=3, action="append", required=True, metavar=("NAME", "CKPT", "DECODING"),
                   help="a decoding to compare (the harness's decoding string); repeat for more")
    p.add_argument("--system-option", nargs=2, action="append", default=[], metavar=("NAME", "OPTION=VALUE"),
                   help="a harness generation option of system NAME (e.g. npd_teacher=TEACHER.pt for NPD)")
    p.add_argument("--src-lang", default="en")
    p.add_argument("--tgt-lang", default="de")
    p.add_argument("--split", default="test")
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    names = [name for name, _, _ in args.system]
    if len(set(names)) != len(names):
        p.error(f"--system names must differ, got {names}")
    for name, ckpt, _ in args.system:
        if not os.path.isfile(ckpt):
            p.error(f"--system {name}: checkpoint {ckpt} not found")
    extra = {name: {} for name in names}
    for name, item in args.system_option:
        if name not in extra:
            p.error(f"--system-option {name}: no --system of that name")
        extra[name].update(harness.parse_generation_options([item], p.error))
    if args.sentences < 11:
        p.error("--sentences must be at least 11 (the first 10 warm up)")
    try:
        before_commit = _git("rev-parse", "--short", args.before + "^{commit}")
    except subprocess.CalledProcessError:
        p.error(f"--before {args.before}: not a commit of {REPO}")
    from benchmarks.speed_ratio import _commit

    after_commit = _commit()  # this checkout's commit, "+changes" when the plugin's tracked files differ
    workdir = tempfile.mkdtemp(prefix="route_regression_")
    before_tree = os.path.join(workdir, "before")
    _git("worktree", "add", "--detach", before_tree, before_commit)
    results = {}
    try:
        for name, ckpt, decoding in args.system:
            runs = {"before": [], "after": []}
            for r in range(args.rounds):
                order = ("before", "after") if r % 2 == 0 else ("after", "before")
                for version in order:
                    tree = before_tree if version == "before" else REPO
                    runs[version].append(_run_child(tree, (name, ckpt, decoding), args, extra[name], workdir))
                print(f"{name} round {r + 1}: before {runs['before'][-1]['ms_per_sentence']:.1f} ms/sent, "
                      f"after {runs['after'][-1]['ms_per_sentence']:.1f} ms/sent", flush=True)
            options = {k: provenance.portable_path(v) if os.path.isfile(v) else v for k, v in extra[name].items()}
            results[name] = dict(checkpoint=provenance.portable_path(ckpt), decoding=decoding,
                                 generation_options=options, **compare(runs["before"], runs["after"], args.tolerance))
            s = results[name]
            print(f"{name}: after/before {s['ratio_after_over_before']:.3f} "
                  f"({'within' if s['within_tolerance'] else 'OUTSIDE'} {args.tolerance:.0%}), "
                  f"identical hypotheses: {s['identical_hypotheses']}", flush=True)
            write_json(args.out, _summary(args, argv, before_commit, after_commit, results, provenance))
    finally:
        subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", before_tree], capture_output=True)
    print(f"wrote {args.out}")


def _summary(args, argv, before_commit, after_commit, results, provenance):
    """The results file: written after every system, so that an interrupted run keeps what it measured."""
    return {"benchmark": "route_regression", "before_commit": before_commit,
            "after_commit": after_commit,
            "hardware": provenance.hardware_description(), "threads": args.threads, "split": args.split,
            "sentences": args.sentences, "rounds": args.rounds, "tolerance": args.tolerance,
            "data_bin": provenance.portable_path(args.data_bin),
            "command": provenance.portable_command(["python", "-m", "benchmarks.route_regression", *argv]),
            "systems": results, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


if __name__ == "__main__":
    main()
