"""Does a KERMIT checkpoint read its source?  Its x2y insertion loss (x given whole, y generated; the
training loss of that mode) on validation batches with the true source, with another sentence's source
(the batch rolled by one row) and with no source (x absent).  A model that conditions on x has a clearly
lower loss with the true source; one that learnt only a target-side language model does not.

    python -m benchmarks.kermit_conditioning CKPT DATA_BIN [--src en --tgt de]
        [--subset valid] [--batches 8] [--batch-size 64] [--threads 2]

Prints one JSON line: {"true": ..., "shuffled": ..., "x_absent": ..., "batches": n, "sentences": m}.
The kept-token subsets of y are drawn with the same seed for the three conditions of a batch.
"""
import argparse
import json

import torch


def conditioning_losses(model, batches, seed=0):
    """Mean over ``batches`` (collated kermit batches) of the x2y insertion loss with the true source,
    a rolled (another row's) source and no source."""
    sums = {"true": 0.0, "shuffled": 0.0, "x_absent": 0.0}
    with torch.no_grad():
        for b in batches:
            x, y = b["net_input"]["src_tokens"], b["target"]
            on = torch.ones(x.size(0), dtype=torch.bool, device=x.device)
            off = ~on
            for name, xx, x_on in (("true", x, on), ("shuffled", x.roll(1, 0), on), ("x_absent", x, off)):
                torch.manual_seed(seed)  # the same kept subsets of y in every condition
                sums[name] += float(model.insertion_loss(*model.training_canvases(xx, y, (off, on, x_on, on))))
    return {k: v / max(1, len(batches)) for k, v in sums.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("data_bin")
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de")
    p.add_argument("--subset", default="valid")
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    from fairseq_nat_ext.evaluation.inference import load_split, load_system, make_batches
    from fairseq_nat_ext.evaluation.timing import set_threads

    set_threads(a.threads)
    system = load_system(a.checkpoint, a.data_bin, a.src, a.tgt)
    model = system.models[0]
    if not hasattr(model, "training_canvases"):
        raise SystemExit(f"error: {a.checkpoint} holds a {type(model).__name__}, not a kermit model")
    batches = make_batches(system.task, [model], load_split(system.task, a.subset), a.batch_size)[:a.batches]
    out = conditioning_losses(model, batches)
    out.update(batches=len(batches), sentences=sum(len(b["id"]) for b in batches))
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}))


if __name__ == "__main__":
    main()
