"""Per-pass profile of Mask-Predict decoding: where the time of one decoder pass goes.

    python -m benchmarks.nat_profile --data-bin DATA_BIN --path CKPT [--decoding iter=10,len_beam=3]
        [--sentences 200] [--batch 128] [--threads 2] --out benchmarks/results/studies/decoding_speed/profiles/mask_predict.json

Decodes the first ``--sentences`` test sentences one at a time (batch 1) and then the whole split in
batches of ``--batch`` sentences (fairseq's length-sorted batching), twice each: with the generator's
decoding forward (``fast``: modules/nat_decoder_inference.py) and with the decoder's own forward on
every pass (``slow``, what the generator ran before), and writes, per mode and batch size, the
milliseconds per sentence spent in

* ``encoder`` (once per sentence), ``cross_kv`` (the cross-attention key/value projections: once per
  sentence in fast mode, every pass and length candidate in slow mode), ``self_attention``,
  ``cross_attention`` (its query/output projections and the attention itself), ``feed_forward``,
  ``decoder_layers`` (the fast path's packed CPU route, ``nat_decoder_inference._packed_layers``, whose
  sublayers run inline: the decoder's share of the three components before it is then 0 and this one
  holds it),
  ``vocabulary`` (the projection onto the vocabulary and its log-softmax),
* ``other``: the rest of the measured time (embeddings, length prediction, re-masking, bookkeeping,
  Python's own overhead),

plus the decoder passes per sentence (calls of the decoder stack) and whether both modes gave the same
hypotheses.  Timers wrap the modules (forward hooks) and the fast path's sublayer functions; their own
cost lands in the component they time.  Each component's time is exclusive (:class:`Clock`): a timer
nested in another component's pauses it, except inside ``encoder``, which keeps its sublayers' time.
Run it on an otherwise idle machine.

Matrix-product arithmetic (``--count-flops``) and its share of the time (``--profiler-share``), for any
checkpoint and decoding the harness runs (``--decoding beam=5`` for the autoregressive teacher, whose
generator has no ``fast_decoder`` switch: the per-pass timing above is then skipped, as with
``--no-timing``)::

    python -m benchmarks.nat_profile --data-bin DATA_BIN --path CKPT --decoding iter=10,len_beam=3 \
        --sentences 100 --no-timing --count-flops --profiler-share --out FLOPS.json

decode the first ``--sentences`` sentences at batch 1 once more and write ``flops`` (and
``profiler_share``) into the JSON.  Counted products (:func:`counting_products`):

* ``linear`` -- every product of activations with a weight matrix, x (..., in) @ W^T (out, in):
  ``torch.nn.functional.linear`` (``nn.Linear`` modules, torch's multi-head attention's projections)
  and the plugin's ``modules/cpu_linear.linear`` (its oneDNN prepacked products and ``cpu_linear.module``)
  and ``cpu_linear.prepacked`` / ``prepacked_add`` (products on weights laid out in advance),
  each call 2 * rows * out * in FLOPs, rows = x.numel() / in, the bias not counted.  A
  ``cpu_linear.linear`` that falls back on ``F.linear`` counts once.  This is the definition of the
  GFLOP numbers in docs/nat.md (Mask-Predict vs the teacher).
* ``attention`` (apart; not in ``linear``) -- activation-by-activation products: ``F.scaled_dot_product_attention``
  (2 * batch * L * S * (E + Ev): scores and weighted values) and ``torch.matmul`` / ``torch.bmm`` /
  ``torch.baddbmm`` (2 * output elements * contracted dimension; fairseq's attention).  Products written
  with the ``@`` operator, ``Tensor.matmul`` or ``torch.einsum`` are not seen (the decoders profiled here
  use none at decoding time).

Per sentence = total over the decoded sentences / sentences.  ``--profiler-share`` runs the same decode
under ``torch.profiler`` and reports the self CPU time of the products' kernels (``LINEAR_KERNELS``:
oneDNN's prepacked product and MKL's ``addmm`` / ``mm``; ``ATTENTION_KERNELS``) as a share of the
profiler's total self CPU time (its table's Self CPU % summed; the docs' "58 %" is this share of
``mkldnn::_linear_pointwise`` alone) and of the decode's wall time, the kernels' GFLOP/s, and the ten
largest kernels' shares.  The patched functions are restored on exit, also after an error.
"""
import argparse
import os
import time
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from benchmarks import write_json
from fairseq_nat_ext.evaluation import decoding as dec
from fairseq_nat_ext.evaluation import inference as inf
from fairseq_nat_ext.evaluation.timing import set_threads

COMPONENTS = ["encoder", "cross_kv", "self_attention", "cross_attention", "feed_forward", "decoder_layers",
              "vocabulary"]


#: components that keep the time of timers nested in them (the fast encoder runs the decoder path's
#: ``self_attention`` / ``feed_forward``, which are timed too: that time is the encoder's)
INCLUSIVE = {"encoder"}


class Clock:
    """Exclusive seconds per component: while a timer runs inside another component's (the key/value
    projections inside the slow path's cross-attention), only the inner component accumulates, except
    inside an ``INCLUSIVE`` one, which keeps everything nested in it; nested timers of the same component
    count once.  ``stop`` must close the innermost open timer."""

    def __init__(self, now=time.perf_counter):
        self.seconds = dict.fromkeys(COMPONENTS, 0.0)
        self._now = now
        self._stack = []  # open timers, innermost last: (name, the component credited)
        self._since = 0.0  # when the innermost open timer last started accumulating

    def start(self, name):
        now = self._now()
        credited = name
        if self._stack:
            outer = self._stack[-1][1]
            self.seconds[outer] += now - self._since
            if outer in INCLUSIVE:
                credited = outer
        self._stack.append((name, credited))
        self._since = now

    def stop(self, name):
        now = self._now()
        if not self._stack or self._stack[-1][0] != name:
            raise RuntimeError(f"nat_profile: timer {name!r} stopped while "
                               f"{self._stack[-1][0] if self._stack else 'none'!r} is the innermost open one")
        self.seconds[self._stack.pop()[1]] += now - self._since
        self._since = now


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
    timed(fast, "_packed_layers", "decoder_layers")
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for owner, attr, original in reversed(patched):
            setattr(owner, attr, original)


PRODUCT_KINDS = ("linear", "attention")

#: the CPU kernels of ``linear`` products in torch's profiler (oneDNN's prepacked product, MKL's)
LINEAR_KERNELS = ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm")
#: the CPU kernels of ``attention`` products (the fused attention of ``scaled_dot_product_attention``,
#: fairseq's ``bmm``s)
ATTENTION_KERNELS = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::bmm", "aten::baddbmm")


def _arg(args, kwargs, i, name):
    return args[i] if len(args) > i else kwargs[name]


def linear_flops(args, kwargs, out):
    """2 * rows * out_features * in_features of ``linear(x, weight, bias)`` (the bias not counted)."""
    x, w = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "weight")
    rows = x.numel() // x.size(-1) if x.size(-1) else 0
    return 2 * rows * (w.size(0) if w.dim() == 2 else 1) * w.size(-1)


def prepacked_flops(args, kwargs, out):
    """``cpu_linear.prepacked(x, packed, ...)`` / ``prepacked_add``: 2 * rows * out * in, read from x
    and the output (oneDNN's laid-out weight does not keep the (out, in) shape)."""
    x = _arg(args, kwargs, 0, "x")
    return 2 * x.numel() * out.size(-1)


def matmul_flops(args, kwargs, out, first=0):
    """2 * output elements * the contracted dimension (``matmul``, ``bmm``; ``baddbmm``: first=1)."""
    a = _arg(args, kwargs, first, "batch1" if first else "input")
    return 2 * out.numel() * a.size(-1)


def sdpa_flops(args, kwargs, out):
    """``scaled_dot_product_attention(q (..., L, E), k (..., S, E), v (..., S, Ev))``: the scores
    (2 * batch * L * S * E) and the weighted values (2 * batch * L * S * Ev)."""
    q, k, v = (_arg(args, kwargs, i, n) for i, n in enumerate(("query", "key", "value")))
    rows = out.numel() // out.size(-1)  # batch * L
    return 2 * rows * k.size(-2) * (q.size(-1) + v.size(-1))


class ProductCounter:
    """FLOPs and calls per kind of product (``linear``, ``attention``), see the module doc."""

    def __init__(self):
        self.flops = dict.fromkeys(PRODUCT_KINDS, 0)
        self.calls = dict.fromkeys(PRODUCT_KINDS, 0)
        self.depth = 0  # a counted product inside another (cpu_linear's F.linear fallback) counts once


@contextmanager
def counting_products():
    """``with counting_products() as c: ...`` -> ``c.flops`` / ``c.calls`` per kind: patches
    ``F.linear``, ``cpu_linear.linear`` / ``prepacked`` / ``prepacked_add``,
    ``F.scaled_dot_product_attention``, ``torch.matmul``,
    ``torch.bmm`` and ``torch.baddbmm`` (module attributes, so every caller that looks them up at call
    time is seen) and restores them on exit."""
    from fairseq_nat_ext.modules import cpu_linear

    counter, patched = ProductCounter(), []

    def patch(owner, attr, kind, flops):
        original = getattr(owner, attr)

        def wrapper(*args, **kwargs):
            if counter.depth:
                return original(*args, **kwargs)
            counter.depth += 1
            try:
                out = original(*args, **kwargs)
            finally:
                counter.depth -= 1
            counter.flops[kind] += flops(args, kwargs, out)
            counter.calls[kind] += 1
            return out

        patched.append((owner, attr, original))
        setattr(owner, attr, wrapper)

    try:
        patch(F, "linear", "linear", linear_flops)
        patch(cpu_linear, "linear", "linear", linear_flops)
        patch(cpu_linear, "prepacked", "linear", prepacked_flops)
        patch(cpu_linear, "prepacked_add", "linear", prepacked_flops)
        patch(F, "scaled_dot_product_attention", "attention", sdpa_flops)
        patch(torch, "matmul", "attention", matmul_flops)
        patch(torch, "bmm", "attention", matmul_flops)
        patch(torch, "baddbmm", "attention", lambda a, k, o: matmul_flops(a, k, o, first=1))
        yield counter
    finally:
        for owner, attr, original in reversed(patched):
            setattr(owner, attr, original)


def _sentences(batches):
    return sum(len(b["id"]) for b in batches)


def count_flops(system, generator, batches):
    """Matrix-product GFLOP per sentence (and calls, decoder passes) decoding ``batches``."""
    n = _sentences(batches)
    with torch.no_grad(), counting_products() as c, inf.count_decoder_calls(system.models) as passes:
        inf.decode(system.task, generator, system.models, batches)
    out = {"sentences": n, "batch_size": max(len(b["id"]) for b in batches)}
    for kind in PRODUCT_KINDS:
        out[f"{kind}_gflop_per_sentence"] = round(c.flops[kind] / n / 1e9, 4)
        out[f"{kind}_calls_per_sentence"] = round(c.calls[kind] / n, 2)
    out["passes_per_sentence"] = round(passes.calls / n, 3)
    return out


def profiler_share(system, generator, batches):
    """Shares of the profiler's self CPU time in the products' kernels while decoding ``batches``."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    n = _sentences(batches)
    with torch.no_grad(), counting_products() as c:  # plain wrappers: no profiler events of their own
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            inf.decode(system.task, generator, system.models, batches)
            wall = time.perf_counter() - t0
    events = prof.key_averages()
    self_cpu = sum(e.self_cpu_time_total for e in events) / 1e6
    out = {"sentences": n, "ms_per_sentence_profiled": round(1000.0 * wall / n, 3),
           "self_cpu_ms_per_sentence": round(1000.0 * self_cpu / n, 3)}
    for kind, names in (("linear", LINEAR_KERNELS), ("attention", ATTENTION_KERNELS)):
        sec = sum(e.self_cpu_time_total for e in events if e.key in names) / 1e6
        out[f"{kind}_kernels_ms_per_sentence"] = round(1000.0 * sec / n, 3)
        out[f"{kind}_kernels_share_of_self_cpu"] = round(sec / self_cpu, 4) if self_cpu else None
        out[f"{kind}_kernels_share_of_wall"] = round(sec / wall, 4)
        out[f"{kind}_kernels_gflop_per_s"] = round(c.flops[kind] / sec / 1e9, 2) if sec else None
    out["top_self_cpu"] = [[e.key, round(e.self_cpu_time_total / 1e6 / self_cpu, 4)] for e in
                           sorted(events, key=lambda e: -e.self_cpu_time_total)[:10]] if self_cpu else []
    return out


def profile(system, generator, batches, n):
    clock = Clock()
    model = system.models[0]
    with instrumented(model, clock), inf.count_decoder_calls(system.models) as counter:
        t0 = time.perf_counter()
        hyps = inf.decode(system.task, generator, system.models, batches)
        total = time.perf_counter() - t0
    ms = {k: 1000.0 * v / n for k, v in clock.seconds.items()}
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
    p.add_argument("--count-flops", action="store_true",
                   help="also count the matrix products' FLOPs per sentence at batch 1 (see the module doc)")
    p.add_argument("--profiler-share", action="store_true",
                   help="also measure, under torch.profiler, the share of the batch-1 time in those products")
    p.add_argument("--no-timing", action="store_true",
                   help="skip the per-pass component timing (slow/fast modes, batch 1 and --batch)")
    args = p.parse_args(argv)
    set_threads(args.threads)
    system = inf.load_system(args.path, args.data_bin, args.src_lang, args.tgt_lang)
    dataset = inf.load_split(system.task, args.split)
    options, _, _ = dec.split_options(dec.parse_decoding(args.decoding))
    generator = system.task.build_generator(system.models, dec.generation_options(options))
    counts = args.count_flops or args.profiler_share
    timing = not args.no_timing
    if timing and not hasattr(generator, "fast_decoder"):
        if not counts:
            raise SystemExit(f"error: {type(generator).__name__} has no fast_decoder switch (Mask-Predict "
                             "only); --count-flops / --profiler-share work for any generator")
        print(f"{type(generator).__name__} has no fast_decoder switch: per-pass timing skipped", flush=True)
        timing = False
    b1 = inf.make_batches(system.task, system.models, inf.prefix_dataset(dataset, args.sentences), 1)
    dataset = inf.prefix_dataset(dataset, args.limit)
    inf.decode(system.task, generator, system.models, b1[:10])  # warm-up
    results, same = {}, {}
    runs = []
    if timing:
        big = inf.make_batches(system.task, system.models, dataset, args.batch)
        runs = ((b1, len(b1), "batch_1"), (big, len(dataset), f"batch_{args.batch}"))
    for batches, n, key in runs:
        hyps = {}
        for mode in ("slow", "fast"):
            generator.fast_decoder = mode == "fast"
            with torch.no_grad():
                results[f"{mode}/{key}"], hyps[mode] = profile(system, generator, batches, n)
            print(f"{mode:4s} {key}: {results[f'{mode}/{key}']}", flush=True)
        same[key] = sum(hyps["slow"][i]["tokens"].tolist() == hyps["fast"][i]["tokens"].tolist()
                        for i in hyps["slow"])
    out = {"benchmark": "nat_profile", "checkpoint": os.path.relpath(args.path), "decoding": args.decoding,
           "threads": args.threads, "sentences_batch_1": len(b1)}
    if timing:
        out.update({"sentences": len(dataset), "identical_hypotheses": same, "profiles": results})
    if counts and hasattr(generator, "fast_decoder"):
        out["fast_decoder"] = bool(generator.fast_decoder)
    if args.count_flops:
        out["flops"] = count_flops(system, generator, b1)
        print(f"flops: {out['flops']}", flush=True)
    if args.profiler_share:
        out["profiler_share"] = profiler_share(system, generator, b1)
        print(f"profiler_share: {out['profiler_share']}", flush=True)
    write_json(args.out, out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
