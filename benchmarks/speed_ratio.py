"""Batch-1 speed of a decoding against the teacher's, both timed interleaved in one process.

    python -m benchmarks.speed_ratio --data-bin DATA_BIN --teacher TEACHER.pt [--teacher-decoding beam=5]
        --path CKPT --decoding iter=10,len_beam=3 [--generation-option npd_teacher=TEACHER.pt]
        [--sentences 200] [--rounds 3] [--threads 2] --out FILE.json

The benchmark harness (``fairseq_nat_ext.evaluation.run``) times the rows of a table one after the other,
each system in its own process, so a ratio of two rows carries whatever the machine did in between: on
the shared 2-core machine the teacher's beam-5 time at batch 1 (a decoding path no change touched) was
128.6 ms in one run and 93.7 / 91.1 ms in the runs of ``mask_predict_speed_before.json`` /
``_after.json`` an hour later.  Here both systems are loaded once and decode the same first
``--sentences`` sentences of the split at batch 1 alternately -- sentence i by the teacher, then by the
other system (the order swapped every other round) -- so a slow spell of the machine lands on both.
Both are warmed up on the first 10 sentences first; torch is seeded once per system and round, as the
harness does (NPD samples).  Interleaving cancels drift within one run, not between two runs (a before
and an after measurement): compare each system's own milliseconds there as well.

Written to ``--out``: the plugin's git commit and the machine, each system's milliseconds per sentence
over all rounds, the ratio (teacher time / other time: "x times faster than the teacher"), the ratio of
every round (their spread is the noise this protocol leaves within a run), the decoder passes per
sentence, and whether every round gave the system the same hypotheses.  CPU only (no CUDA
synchronisation or CUDA random state).  Decoding strings are the harness's
(``fairseq_nat_ext.evaluation.decoding``), built by the harness's own generator factory.
"""
import argparse
import os
import subprocess
import time
from types import SimpleNamespace

import torch

from benchmarks import REPO, write_json
from fairseq_nat_ext.evaluation import inference as inf
from fairseq_nat_ext.evaluation import provenance
from fairseq_nat_ext.evaluation import run as harness
from fairseq_nat_ext.evaluation.timing import set_threads

SEED = 1


def _commit():
    """The plugin's git commit (short), with ``+changes`` when its tracked files differ from it; None
    outside a git checkout."""
    root = REPO
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no",
                                "fairseq_nat_ext"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+changes" if dirty else "")


def _system(path, args, decoding, extra):
    system = inf.load_system(path, args.data_bin, args.src_lang, args.tgt_lang)
    task, models = system.task, system.models
    dataset = inf.prefix_dataset(inf.load_split(task, args.split), args.sentences)
    ns = SimpleNamespace(src_lang=args.src_lang, tgt_lang=args.tgt_lang, generation_extra=extra)
    generator, _, post = harness._build_generator(task, models, decoding, ns, os.path.basename(path))
    batches = inf.make_batches(task, models, dataset, 1)
    by_id = {int(b["id"][0]): b for b in batches}
    return SimpleNamespace(task=task, models=models, generator=generator, post=post, by_id=by_id,
                           seconds=0.0, rounds=[], hyps=None, same=True, calls=0)


def _decode_one(s, sample):
    """Seconds to decode one batch-1 sample (the harness's inference step) and its hypothesis tokens."""
    t0 = time.perf_counter()
    hypos = s.task.inference_step(s.generator, s.models, sample)
    if s.post is not None:
        hypos = s.post(hypos)
    return time.perf_counter() - t0, hypos[0][0]["tokens"].tolist()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-bin", required=True)
    p.add_argument("--teacher", required=True, help="the autoregressive teacher's checkpoint")
    p.add_argument("--teacher-decoding", default="beam=5")
    p.add_argument("--path", required=True, help="the checkpoint compared with the teacher")
    p.add_argument("--decoding", required=True)
    p.add_argument("--generation-option", action="append", default=[], metavar="NAME=VALUE",
                   help="as the harness's (e.g. npd_teacher=TEACHER.pt for noisy parallel decoding)")
    p.add_argument("--src-lang", default="en")
    p.add_argument("--tgt-lang", default="de")
    p.add_argument("--split", default="test")
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    extra = harness.parse_generation_options(args.generation_option, p.error)
    set_threads(args.threads)
    teacher = _system(args.teacher, args, args.teacher_decoding, {})
    other = _system(args.path, args, args.decoding, extra)
    ids = sorted(set(teacher.by_id) & set(other.by_id))
    if not ids:
        raise SystemExit("error: the two systems share no sentence of the split")
    with torch.no_grad():
        for s in (teacher, other):  # warm-up
            for i in ids[:10]:
                _decode_one(s, s.by_id[i])
        for r in range(args.rounds):
            order = (teacher, other) if r % 2 == 0 else (other, teacher)
            rngs = {}
            for s in order:  # each system's own random stream, seeded once per round (NPD's samples)
                torch.manual_seed(SEED)
                rngs[id(s)] = torch.get_rng_state()
            round_s = {id(s): 0.0 for s in order}
            hyps = {id(s): [] for s in order}
            with inf.count_decoder_calls(other.models) as counter:
                for i in ids:
                    for s in order:
                        torch.set_rng_state(rngs[id(s)])
                        sec, toks = _decode_one(s, s.by_id[i])
                        rngs[id(s)] = torch.get_rng_state()
                        round_s[id(s)] += sec
                        hyps[id(s)].append(toks)
            other.calls = counter.calls / len(ids)
            for s in order:
                s.seconds += round_s[id(s)]
                s.rounds.append(round_s[id(s)])
                if s.hyps is not None and s.hyps != hyps[id(s)]:
                    s.same = False
                s.hyps = hyps[id(s)]
            ratio = teacher.rounds[-1] / other.rounds[-1]
            print(f"round {r + 1}: teacher {1000 * teacher.rounds[-1] / len(ids):.1f} ms/sent, "
                  f"{args.decoding} {1000 * other.rounds[-1] / len(ids):.1f} ms/sent, {ratio:.2f}x", flush=True)
    n = len(ids) * args.rounds
    out = {
        "benchmark": "speed_ratio", "commit": _commit(), "hardware": provenance.hardware_description(),
        "threads": args.threads, "sentences": len(ids), "rounds": args.rounds,
        "split": args.split, "data_bin": os.path.relpath(args.data_bin),
        "teacher": {"checkpoint": os.path.relpath(args.teacher), "decoding": args.teacher_decoding,
                    "ms_per_sentence": round(1000 * teacher.seconds / n, 2), "same_hypotheses_every_round": teacher.same},
        "system": {"checkpoint": os.path.relpath(args.path), "decoding": args.decoding,
                   "generation_options": dict(extra), "ms_per_sentence": round(1000 * other.seconds / n, 2),
                   "decoder_passes_per_sentence": round(other.calls, 3),
                   "same_hypotheses_every_round": other.same},
        "ratio": round(teacher.seconds / other.seconds, 3),
        "ratio_per_round": [round(a / b, 3) for a, b in zip(teacher.rounds, other.rounds)],
    }
    options = out["system"]["generation_options"]
    if "npd_teacher" in options:  # a path: recorded relative, as the checkpoints
        options["npd_teacher"] = os.path.relpath(options["npd_teacher"])
    write_json(args.out, out)
    print(f"ratio {out['ratio']:.2f}x (per round {out['ratio_per_round']}); wrote {args.out}")


if __name__ == "__main__":
    main()
