"""Our batched Levenshtein oracle against fairseq's libnat on the same batches.

    python -m benchmarks.oracle_speed --out benchmarks/results/oracle.json \\
        [--batch 32 256] [--repeats 5] [--threads 2] [--device cpu]

Batches: targets of 10-40 tokens over a 1,000-symbol vocabulary; each hypothesis is its target with
~20% of tokens deleted, ~20% random tokens inserted and a few adjacent swaps (fixed seed), i.e. what a
Levenshtein Transformer sees during training.  libnat (``suggested_ed2_path``) takes Python lists, as
fairseq's LevT calls it, so its time includes the ``tolist()`` conversion; ours includes everything
(the table, the backtrace, deletion labels, placeholder counts, masked targets).  Rows:
``{"impl": "ours" | "libnat", "batch", "device", "ms_per_batch", "same_edit_count": bool}`` (edit
counts compared sequence by sequence; labels may differ only where ties allow).
"""

import argparse
import json
import os
import random
import statistics
import sys
import time

import torch

PAD = 1


def make_batch(batch, seed, vocab=1000):
    rng = random.Random(seed)
    hyps, tgts = [], []
    for _ in range(batch):
        t = [rng.randrange(4, vocab) for _ in range(rng.randint(10, 40))]
        h = [x for x in t if rng.random() > 0.2]
        for _ in range(int(0.2 * len(t))):
            h.insert(rng.randrange(len(h) + 1), rng.randrange(4, vocab))
        for _ in range(2):
            if len(h) > 1:
                i = rng.randrange(len(h) - 1)
                h[i], h[i + 1] = h[i + 1], h[i]
        hyps.append([0] + h + [2])  # <s> ... </s> as in LevT
        tgts.append([0] + t + [2])

    def pad(seqs):
        w = max(len(s) for s in seqs)
        return torch.tensor([s + [PAD] * (w - len(s)) for s in seqs])

    return pad(hyps), pad(tgts)


def libnat_counts(hyp, tgt):
    from fairseq import libnat

    in_list = [[x for x in row if x != PAD] for row in hyp.tolist()]
    out_list = [[x for x in row if x != PAD] for row in tgt.tolist()]
    labels = libnat.suggested_ed2_path(in_list, out_list, PAD)
    return [sum(row[-1]) + sum(1 for slot in row[:-1] for x in slot if x != PAD) for row in labels]


def ours_counts(hyp, tgt):
    from fairseq_nat_ext.oracles.levenshtein import levenshtein_oracle

    o = levenshtein_oracle(hyp, tgt, PAD, 3)
    return o.distance


def timed(fn, repeats, device):
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    return out, statistics.median(times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from fairseq_nat_ext.evaluation.provenance import hardware_description, portable_command

    rows = []
    for b in args.batch:
        hyp, tgt = make_batch(b, seed=b)
        ref, ms_lib = timed(lambda: libnat_counts(hyp, tgt), args.repeats, "cpu")
        h, t = hyp.to(args.device), tgt.to(args.device)
        ours_counts(h, t)  # warm-up
        dist, ms_ours = timed(lambda: ours_counts(h, t), args.repeats, args.device)
        same = dist.tolist() == ref
        rows.append({"impl": "libnat", "batch": b, "device": "cpu", "ms_per_batch": round(ms_lib, 2),
                     "same_edit_count": same})
        rows.append({"impl": "ours", "batch": b, "device": args.device, "ms_per_batch": round(ms_ours, 2),
                     "same_edit_count": same})
        print(f"[oracle_speed] batch {b}: ours {ms_ours:.1f} ms, libnat {ms_lib:.1f} ms, same counts: {same}",
              file=sys.stderr)
    out = {"benchmark": "oracle", "hardware": hardware_description(args.device), "threads": args.threads,
           "command": "python -m benchmarks.oracle_speed "
                      + portable_command(argv if argv is not None else sys.argv[1:]),
           "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
