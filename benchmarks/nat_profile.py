"""Per-pass profile of Mask-Predict decoding: where the time of one decoder pass goes.

    python -m benchmarks.nat_profile --data-bin DATA_BIN --path CKPT [--decoding iter=10,len_beam=3]
        [--sentences 200] [--batch 128] [--threads 2] --out benchmarks/results/profiles/mask_predict.json

Decodes the first ``--sentences`` test sentences one at a time (batch 1) and then the whole split in
batches of ``--batch`` sentences (fairseq's length-sorted batching), twice each: with the generator's
decoding forward (``fast``: modules/nat_decoder_inference.py) and with the decoder's own forward on
every pass (``slow``, what the generator ran before), and writes, per mode and batch size, the
milliseconds per sentence spent in

* ``encoder`` (once per sentence), ``cross_kv`` (the cross-attention key/value projections: once per
  sentence in fast mode, every pass and length candidate in slow mode), ``self_attention``,
  ``cross_attention`` (its query/output projections and the attention itself), ``feed_forward``,
  ``vocabulary`` (the projection onto the vocabulary and its log-softmax),
* ``other``: the rest of the measured time (embeddings, length prediction, re-masking, bookkeeping,
  Python's own overhead),

plus the decoder passes per sentence (calls of the decoder stack) and whether both modes gave the same
hypotheses.  Timers wrap the modules (forward hooks) and the fast path's sublayer functions; their own
cost lands in the component they time.  Run it on an otherwise idle machine.
"""
import argparse
import json
import os
import time
from contextlib import contextmanager

import torch

from fairseq_nat_ext.evaluation import decoding as dec
from fairseq_nat_ext.evaluation import inference as inf
from fairseq_nat_ext.evaluation.timing import set_threads

COMPONENTS = ["encoder", "cross_kv", "self_attention", "cross_attention", "feed_forward", "vocabulary"]


class Clock:
    """Accumulated seconds per component; nested timers of the same component count once."""

    def __init__(self):
        self.seconds = dict.fromkeys(COMPONENTS, 0.0)
        self._open = {}

    def start(self, name):
        if self._open.get(name, 0) == 0:
            self._open[name + "@"] = time.perf_counter()
        self._open[name] = self._open.get(name, 0) + 1

    def stop(self, name):
        self._open[name] -= 1
        if self._open[name] == 0:
            self.seconds[name] += time.perf_counter() - self._open.pop(name + "@")


def _hook_module(module, clock, name, handles):
    handles.append(module.register_forward_pre_hook(lambda *_: clock.start(name)))
    handles.append(module.register_forward_hook(lambda *_: clock.stop(name)))


@contextmanager
def instrumented(model, clock):
    """Timers on ``model``'s encoder and decoder sublayers, for both decoding paths."""
    from fairseq_nat_ext.generators import mask_predict as mp
    from fairseq_nat_ext.models.nat import mask_predict as mp_model
    from fairseq_nat_ext.modules import nat_decoder_inference as fast

    handles, patched = [], []
    _hook_module(model.encoder, clock, "encoder", handles)
    for layer in model.decoder.layers:  # the decoder's own forward
        _hook_module(layer.self_attn, clock, "self_attention", handles)
        _hook_module(layer.encoder_attn.k_proj, clock, "cross_kv", handles)
        _hook_module(layer.encoder_attn.v_proj, clock, "cross_kv", handles)
        _hook_module(layer.fc1, clock, "feed_forward", handles)
        _hook_module(layer.fc2, clock, "feed_forward", handles)
    _hook_module(model.decoder.output_projection, clock, "vocabulary", handles)

    def timed(owner, attr, name):
        original = getattr(owner, attr)

        def wrapper(*args, **kwargs):
            clock.start(name)
            try:
                return original(*args, **kwargs)
            finally:
                clock.stop(name)

        setattr(owner, attr, wrapper)
        patched.append((owner, attr, original))

    timed(fast, "cross_kv", "cross_kv")
    timed(fast, "self_attention", "self_attention")
    timed(fast, "feed_forward", "feed_forward")
    timed(mp, "vocab_logits", "vocabulary")
    timed(mp, "best_vocab_tokens", "vocabulary")
    timed(mp_model, "vocab_logits", "vocabulary")  # the decoder's own forward
    timed(mp.F, "log_softmax", "vocabulary")  # the fast path's log-softmax (torch.nn.functional)
    # slow path: encoder_attn = cross-attention, without its key/value projections (timed apart)
    for layer in model.decoder.layers:
        handles.append(layer.encoder_attn.register_forward_pre_hook(lambda *_: clock.start("cross_attention")))
        handles.append(layer.encoder_attn.register_forward_hook(lambda *_: clock.stop("cross_attention")))
    timed(fast, "cross_attention", "cross_attention")
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for owner, attr, original in reversed(patched):
            setattr(owner, attr, original)


def profile(system, generator, batches, n):
    clock = Clock()
    model = system.models[0]
    with instrumented(model, clock), inf.count_decoder_calls(system.models) as counter:
        t0 = time.perf_counter()
        hyps = inf.decode(system.task, generator, system.models, batches)
        total = time.perf_counter() - t0
    sec = dict(clock.seconds)
    # the cross-attention timer of the slow path includes its key/value projections
    if not generator.fast_decoder:
        sec["cross_attention"] -= sec["cross_kv"]
    ms = {k: 1000.0 * v / n for k, v in sec.items()}
    ms["other"] = 1000.0 * total / n - sum(ms.values())
    ms["total"] = 1000.0 * total / n
    return {"ms_per_sentence": {k: round(v, 3) for k, v in ms.items()},
            "passes_per_sentence": round(counter.calls / n, 3)}, hyps


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-bin", required=True)
    p.add_argument("--path", required=True, help="Mask-Predict checkpoint")
    p.add_argument("--src-lang", default="en")
    p.add_argument("--tgt-lang", default="de")
    p.add_argument("--split", default="test")
    p.add_argument("--decoding", default="iter=10,len_beam=3")
    p.add_argument("--sentences", type=int, default=200, help="sentences decoded at batch 1")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--limit", type=int, help="batched part: only the first N sentences of the split")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", required=True, help="results JSON (rewritten)")
    args = p.parse_args(argv)
    set_threads(args.threads)
    system = inf.load_system(args.path, args.data_bin, args.src_lang, args.tgt_lang)
    dataset = inf.load_split(system.task, args.split)
    options, _, _ = dec.split_options(dec.parse_decoding(args.decoding))
    generator = system.task.build_generator(system.models, dec.generation_options(options))
    if not hasattr(generator, "fast_decoder"):
        raise SystemExit(f"error: {type(generator).__name__} has no fast_decoder switch (Mask-Predict only)")
    b1 = inf.make_batches(system.task, system.models, inf.prefix_dataset(dataset, args.sentences), 1)
    dataset = inf.prefix_dataset(dataset, args.limit)
    big = inf.make_batches(system.task, system.models, dataset, args.batch)
    inf.decode(system.task, generator, system.models, b1[:10])  # warm-up
    results, same = {}, {}
    for batches, n, key in ((b1, len(b1), "batch_1"), (big, len(dataset), f"batch_{args.batch}")):
        hyps = {}
        for mode in ("slow", "fast"):
            generator.fast_decoder = mode == "fast"
            with torch.no_grad():
                results[f"{mode}/{key}"], hyps[mode] = profile(system, generator, batches, n)
            print(f"{mode:4s} {key}: {results[f'{mode}/{key}']}", flush=True)
        same[key] = sum(hyps["slow"][i]["tokens"].tolist() == hyps["fast"][i]["tokens"].tolist()
                        for i in hyps["slow"])
    out = {"benchmark": "nat_profile", "checkpoint": os.path.relpath(args.path), "decoding": args.decoding,
           "threads": args.threads, "sentences_batch_1": len(b1), "sentences": len(dataset),
           "identical_hypotheses": same, "profiles": results}
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
