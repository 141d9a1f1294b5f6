"""Count the training pairs a CTC checkpoint (``ctc_nat`` / ``imputer``) cannot align.

    python -m fairseq_nat_ext.evaluation.ctc_filtered --ckpt ctc.pt --data-bin DATA_BIN \\
        --src-lang en --tgt-lang de [--subset train]

A pair is infeasible when ``upsample_ratio * source length`` (``</s>`` included: the encoder states)
is shorter than the target content plus its adjacent repeats (``oracles.ctc_alignment.ctc_feasible``,
the test the criterions apply).  Prints one JSON line ``{"filtered": k, "pairs": n,
"upsample_ratio": r, "subset": ...}`` (``--text``: ``k of n (upsample ratio r)``, what the
benchmark script writes into the results' ``data``).
"""
import argparse
import json
import logging
import sys

import torch

CHUNK = 4096


def count_infeasible(dataset, ratio, pad, eos):
    """(filtered, pairs) over a LanguagePairDataset (sources and targets end in ``</s>``)."""
    from ..oracles.ctc_alignment import ctc_feasible

    n = len(dataset)
    filtered = 0
    for start in range(0, n, CHUNK):
        idx = range(start, min(n, start + CHUNK))
        src_len = torch.tensor([int(dataset.src_sizes[i]) for i in idx])
        tgts = [dataset.tgt[i] for i in idx]
        tgts = [t[:-1] if len(t) and int(t[-1]) == eos else t for t in tgts]  # content only
        S = max([len(t) for t in tgts] + [1])
        tg = torch.full((len(tgts), S), pad, dtype=torch.long)
        for j, t in enumerate(tgts):
            tg[j, : len(t)] = t
        tl = torch.tensor([len(t) for t in tgts])
        filtered += int((~ctc_feasible(src_len * ratio, tg, tl)).sum())
    return filtered, n


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fairseq_nat_ext.evaluation.ctc_filtered",
                                description="count training pairs a CTC checkpoint cannot align")
    p.add_argument("--ckpt", required=True, help="ctc_nat or imputer checkpoint")
    p.add_argument("--data-bin", required=True)
    p.add_argument("--src-lang", required=True)
    p.add_argument("--tgt-lang", required=True)
    p.add_argument("--subset", default="train")
    p.add_argument("--text", action="store_true",
                   help="print 'k of n (upsample ratio r)' instead of JSON")
    args = p.parse_args(argv)
    logging.basicConfig(format="[ctc_filtered] %(message)s", level=logging.WARNING, stream=sys.stderr,
                        force=True)

    from . import inference as inf

    try:
        system = inf.load_system(args.ckpt, args.data_bin, args.src_lang, args.tgt_lang)
    except FileNotFoundError as err:
        p.error(str(err))
    model = system.models[0]
    ratio = getattr(model, "upsample_ratio", None)
    if ratio is None:
        p.error(f"{args.ckpt}: {type(model).__name__} is not a CTC model (ctc_nat or imputer)")
    dataset = inf.load_split(system.task, args.subset)
    d = system.task.target_dictionary
    filtered, pairs = count_infeasible(dataset, ratio, d.pad(), d.eos())
    if args.text:
        print(f"{filtered} of {pairs} (upsample ratio {ratio})")
    else:
        print(json.dumps({"filtered": filtered, "pairs": pairs, "upsample_ratio": ratio,
                          "subset": args.subset}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
