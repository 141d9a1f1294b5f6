"""Benchmark one system (one checkpoint, one or more decodings) and upsert its rows into a results JSON.

    python -m fairseq_nat_ext.evaluation.run --benchmark mask_predict \\
        --data-bin DATA_BIN --raw-ref ../shared/data/multi30k/test_2016_flickr.de.gz \\
        --src-lang en --tgt-lang de --system-ckpt checkpoint_best.pt \\
        --decoding iter=4,len_beam=3 --decoding iter=10,len_beam=3 --distilled \\
        --train-updates 30000 --train-wall-s 7200 --threads 2 --latency-sentences 200 \\
        --out benchmarks/results/mask_predict.json

For every ``--decoding`` it decodes ``--subset`` (default test) of ``--data-bin``, writes the
detokenised hypotheses to ``<dir of --out>/<benchmark>/<system>__<decoding>[__distilled].txt`` and
replaces (or adds) the row (system, decoding, distilled) of ``--out``; other rows are kept.  The
JSON is rewritten after every decoding.  ``--reference-row`` adds the reference's own row (see
:mod:`.results`); it needs only ``--raw-ref`` and ``--tgt-lang``.

Metrics: :mod:`.scoring` (BLEU, tokenised BLEU, repeat rate), :mod:`.timing` (latency protocol),
:mod:`.inference` (iterations).  ``--limit N`` benchmarks only the first N sentences (and the first N
reference lines): for smoke tests, not for published numbers.

``--language-check en,de,fr`` adds ``wrong_language_rate`` and ``mixed_language_rate`` to every row
written (the reference row too): the shares of its detokenised hypotheses identified as another of
those languages than ``--tgt-lang``, and mixing two of them (:mod:`.language_id`; needs py3langid).

``--valid-tune`` first decodes ``--valid-subset`` with every ``--decoding`` and logs its tokenised
BLEU against the data-bin's own (BPE-removed) valid target, so decoding choices can be made on valid
data; the scores go to ``<dir of --out>/<benchmark>/valid_tune.json`` (upserted per system, decoding
and checkpoint), not into the results' rows.

The ``command`` field of the results is this command line, or ``--command`` when given (benchmark
scripts pass their own invocation there, so that ``command`` reproduces the whole table).  Paths in the
results (``data``, ``command``, each row's ``hyp``, valid-tune checkpoints) are written relative to the
repository root, or to the current directory outside a checkout (:func:`.provenance.portable_path`):
never an absolute path of the machine that ran it.
"""
import argparse
import logging
import os
import sys

from . import decoding as dec
from . import results as res
from . import scoring

logger = logging.getLogger("fairseq_nat_ext.evaluation")

BATCH_SIZE_THROUGHPUT = 128


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m fairseq_nat_ext.evaluation.run",
        description="Benchmark a fairseq checkpoint (BLEU, latency, throughput, iterations, "
        "repeat rate) and upsert its rows into a results JSON.",
    )
    p.add_argument("--benchmark", required=True, help="benchmark name, e.g. mask_predict")
    p.add_argument("--out", required=True, help="results JSON (created or updated)")
    p.add_argument("--raw-ref", required=True,
                   help="ORIGINAL raw reference of the subset (plain or .gz), one line per sentence")
    p.add_argument("--tgt-lang", required=True)
    p.add_argument("--src-lang")
    p.add_argument("--data-bin", help="fairseq data-bin holding --subset")
    p.add_argument("--subset", default="test")
    p.add_argument("--data-name", help="the results' 'data' field (default: describes data-bin, "
                   "subset and reference)")
    p.add_argument("--system-ckpt", help="checkpoint (an ensemble: paths joined by ':')")
    p.add_argument("--system", help="row name (default: the arch in the checkpoint, "
                   "'fairseq:<arch>' for fairseq's own models)")
    p.add_argument("--decoding", action="append", default=[],
                   help="decoding string, e.g. beam=5 or iter=10,len_beam=3 (repeatable)")
    p.add_argument("--distilled", action=argparse.BooleanOptionalAction, default=False,
                   help="the system was trained on distilled targets")
    p.add_argument("--train-updates", type=int)
    p.add_argument("--train-wall-s", type=float)
    p.add_argument("--train-log", help="fairseq-train log to read updates / wall time from")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--latency-sentences", type=int, default=200,
                   help="time batch-1 decoding on the first N sentences (0: all; default 200)")
    p.add_argument("--warmup-sentences", type=int, default=5,
                   help="untimed warm-up before each timing: batch 1 on the first N sentences, and "
                        "one batch of the throughput batch size (default 5; 0 = none)")
    p.add_argument("--limit", type=int, help="benchmark only the first N sentences (smoke tests; with "
                   "--leaderboard also of the valid and unseen subsets)")
    p.add_argument("--reference-row", action="store_true",
                   help="add the reference row (bleu 100, repeat rate of the reference)")
    p.add_argument("--valid-tune", action="store_true",
                   help="first score each decoding on --valid-subset (tokenised BLEU) and record it in "
                        "<dir of --out>/<benchmark>/valid_tune.json")
    p.add_argument("--valid-only", action="store_true",
                   help="--valid-tune and nothing else: no test sentence is decoded, no row of --out "
                        "changes (e.g. to choose decodings or checkpoints while another job uses the CPU)")
    p.add_argument("--valid-subset", default="valid")
    p.add_argument("--generation-option", action="append", default=[], metavar="NAME=VALUE",
                   help="set a further generation option read by the generator (a string), e.g. "
                        "npd_teacher=teacher.pt for nat_fertility's noisy parallel decoding (repeatable)")
    p.add_argument("--cuda", action="store_true", help="decode on CUDA when available")
    p.add_argument("--no-plot", action="store_true",
                   help="accepted for old scripts and ignored: this harness draws no plot (the repository's "
                   "python -m benchmarks.plot OUT.json draws <benchmark>.png)")
    p.add_argument("--language-check", metavar="LANGS",
                   help="candidate languages joined by commas (e.g. en,de,fr; --tgt-lang among them): every row "
                        "written gets wrong_language_rate and mixed_language_rate of its hypotheses")
    p.add_argument("--command", help="text of the results' 'command' field")
    g = p.add_argument_group("leaderboard columns (every row written gets all of them, see .results)")
    g.add_argument("--leaderboard", action="store_true",
                   help="add chrF, valid BLEU/chrF, counted decoder passes, the training's seed, max-tokens and "
                        "words/s, its initialisation and machine, the run id, the speed baseline measured in "
                        "this run and the hypotheses of --blind test sets to every row")
    g.add_argument("--valid-raw-ref", help="ORIGINAL raw reference of --valid-subset (with --leaderboard)")
    g.add_argument("--blind", action="append", default=[], metavar="SUBSET",
                   help="a subset of --data-bin without a reference here (an unseen test set): decoded with "
                        "the same options, hypotheses written to <dir of --out>/<benchmark>/blind/"
                        "<row's hypothesis file stem>.<SUBSET>.txt (repeatable)")
    g.add_argument("--run-id", help="id of this measuring run (e.g. a UTC timestamp), the same for every call "
                   "of one leaderboard run")
    g.add_argument("--speed-baseline", default="fairseq:transformer/beam=5", metavar="SYSTEM/DECODING",
                   help="the row (of --out, measured in the same --run-id; or this call's own) whose batch-1 "
                        "latency and batch-128 throughput the speed-ups are relative to")
    g.add_argument("--init", default="scratch", help="what the system's weights started from (recorded)")
    g.add_argument("--trained-on", help="the machine the system was trained on (default: this one)")
    g.add_argument("--row-command", default="",
                   help="the commands that reproduce this system's rows (its training and this measuring)")
    g.add_argument("--train-seed", type=int, help="the training's --seed (default: the checkpoint's)")
    g.add_argument("--train-max-tokens", type=int,
                   help="the training's --max-tokens (default: the checkpoint's)")
    return p


def _check_args(p, args):
    if not args.system_ckpt and not args.reference_row:
        p.error("nothing to do: give --system-ckpt (with --decoding) and/or --reference-row")
    if args.system_ckpt:
        for name in ("data_bin", "src_lang"):
            if getattr(args, name) is None:
                p.error(f"--system-ckpt needs --{name.replace('_', '-')}")
        if not args.decoding:
            p.error("--system-ckpt needs at least one --decoding (e.g. beam=5)")
    elif args.decoding:
        p.error("--decoding needs --system-ckpt")
    if args.valid_only:
        if not args.system_ckpt or args.reference_row:
            p.error("--valid-only needs --system-ckpt and no --reference-row")
        args.valid_tune = True
    try:
        args.decoding = [dec.canonical_decoding(d) for d in args.decoding]
    except ValueError as err:
        p.error(str(err))
    if len(set(args.decoding)) != len(args.decoding):
        p.error("a --decoding is given twice")
    if args.threads < 1:
        p.error("--threads must be >= 1")
    if args.leaderboard:
        if not args.system_ckpt:
            p.error("--leaderboard needs --system-ckpt (the reference row has no leaderboard columns)")
        for name in ("valid_raw_ref", "run_id"):
            if not getattr(args, name):
                p.error(f"--leaderboard needs --{name.replace('_', '-')}")
        system, sep, decoding = args.speed_baseline.partition("/")
        try:
            args.speed_baseline = f"{system}/{dec.canonical_decoding(decoding)}"
        except ValueError as err:
            p.error(f"--speed-baseline {args.speed_baseline!r}: {err}")
        if not sep or not system:
            p.error(f"--speed-baseline {args.speed_baseline!r}: expected SYSTEM/DECODING, e.g. "
                    "fairseq:transformer/beam=5")
    elif args.blind or args.valid_raw_ref:
        p.error("--blind and --valid-raw-ref need --leaderboard")
    for name in ("latency_sentences", "warmup_sentences"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.limit is not None and args.limit < 1:
        p.error("--limit must be >= 1")
    args.generation_extra = parse_generation_options(args.generation_option, p.error)
    if not os.path.isfile(args.raw_ref):
        p.error(f"--raw-ref {args.raw_ref}: no such file")
    if args.language_check is not None:
        from . import language_id

        try:
            args.language_check = language_id.parse_langs(args.language_check)
            if args.tgt_lang not in args.language_check:
                raise ValueError(f"--tgt-lang {args.tgt_lang} is not among its languages")
            language_id.identifier(args.language_check)  # py3langid present, languages known: before decoding
        except (ValueError, ImportError) as err:
            p.error(f"--language-check: {err}")


def _portable_paths(paths):
    """A path, or an ensemble's paths joined by ':', as the results record it (no machine path)."""
    from .provenance import portable_path

    return ":".join(portable_path(p) for p in paths.split(":"))


def _open_results(args, hardware, command, data, signature):
    if os.path.exists(args.out):
        results = res.load_results(args.out)
        if results["benchmark"] != args.benchmark:
            raise SystemExit(
                f"error: {args.out} holds benchmark {results['benchmark']!r}, not {args.benchmark!r}"
            )
        if results["threads"] != args.threads and results["rows"]:
            raise SystemExit(
                f"error: {args.out} was measured with {results['threads']} threads, this run uses "
                f"{args.threads}: latencies would not be comparable (use --threads "
                f"{results['threads']} or another --out)"
            )
        if results["hardware"] != hardware and results["rows"]:
            logger.warning("hardware differs from %s's (%s): its latencies are not comparable",
                           args.out, results["hardware"])
        if results["sacrebleu_signature"] not in ("", signature) and results["rows"]:
            logger.warning("sacreBLEU signature differs from the file's (%s)",
                           results["sacrebleu_signature"])
        results.update(hardware=hardware, threads=args.threads, command=command, data=data,
                       sacrebleu_signature=signature)
        return results
    return res.new_results(args.benchmark, data, hardware, args.threads, command, signature)


def _write_lines(path, lines):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
    os.replace(tmp, path)


def valid_tune_path(results_json, benchmark):
    """``<dir of results_json>/<benchmark>/valid_tune.json``: the decodings' scores on valid."""
    return os.path.join(os.path.dirname(results_json) or ".", benchmark, "valid_tune.json")


def _save_valid_tune(args, entry):
    """Upsert ``entry`` (keyed by system, decoding, checkpoint) into the valid-tune record."""
    import json

    path = valid_tune_path(args.out, args.benchmark)
    entries = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            entries = json.load(f)["entries"]
    key = (entry["system"], entry["decoding"], entry["checkpoint"])
    entries = [e for e in entries if (e["system"], e["decoding"], e["checkpoint"]) != key] + [entry]
    record = {"benchmark": args.benchmark, "note": "tokenised BLEU of each decoding on the data-bin's valid "
              "split (BPE removed), used to choose decoding options before test is decoded", "entries": entries}
    _write_lines(path, json.dumps(record, indent=2).splitlines())  # atomic, like the hypothesis files


def _valid_tune(system, args, name, updates):
    from . import inference as inf

    task, models = system.task, system.models
    dataset = inf.load_split(task, args.valid_subset)
    batches = inf.make_batches(task, models, dataset, BATCH_SIZE_THROUGHPUT)
    tgt_dict = task.target_dictionary
    refs = {}
    for b in batches:
        for i, sid in enumerate(b["id"].tolist()):
            t = b["target"][i]
            refs[int(sid)] = scoring.remove_bpe(tgt_dict.string(t[t.ne(tgt_dict.pad())].int()))
    refs = [refs[i] for i in range(len(dataset))]
    for d in args.decoding:
        generator, _, post = _build_generator(task, models, d, args, "valid-tune")
        hyps = inf.in_order(inf.decode(task, generator, models, batches, system.use_cuda, postprocess=post),
                            len(dataset))
        tok = [scoring.remove_bpe(inf.hypothesis_string(h, tgt_dict, generator)) for h in hyps]
        bleu = scoring.tokenized_bleu(tok, refs).score
        iters, rep = inf.mean_iterations(hyps, generator), scoring.repeat_rate(tok)
        logger.info("valid-tune %s %s: tok BLEU %.2f, iterations %.2f, repeat rate %.4f",
                    args.valid_subset, d, bleu, iters, rep)
        _save_valid_tune(args, {"system": name, "decoding": d, "checkpoint": _portable_paths(args.system_ckpt),
                                "train_updates": int(updates), "subset": args.valid_subset,
                                "tok_bleu": round(bleu, 2), "iterations": round(iters, 3),
                                "repeat_rate": round(rep, 4)})


def _warn_if_busy():
    """Timing is only meaningful on an otherwise idle machine: say so when it is not."""
    from .provenance import available_cores

    try:
        load = os.getloadavg()[0]
    except OSError:
        return
    # the 1-minute load includes this process' own recent work (up to `threads`)
    if load > available_cores() + 0.5:
        logger.warning("load average %.1f on %d cores before timing: other processes compete for "
                       "the CPU, latency and throughput will be pessimistic", load,
                       available_cores())


def benchmark_system(args, refs, tok_refs, save_row):
    """Decode with every --decoding and hand each finished row to ``save_row``."""
    import torch

    from . import inference as inf
    from . import provenance
    from .timing import Stopwatch, latency_ms_per_sentence, sentences_per_second

    system = inf.load_system(args.system_ckpt, args.data_bin, args.src_lang, args.tgt_lang,
                             use_cuda=args.device == "cuda")
    task, models = system.task, system.models
    arch = provenance.arch_of_state(system.state)
    name = args.system or provenance.system_name(arch or "unknown", type(models[0]).__module__)
    try:
        updates, wall = provenance.resolve_training_stats(
            args.train_updates, args.train_wall_s, args.train_log, system.state
        )
    except ValueError as err:
        raise SystemExit(f"error: {args.system_ckpt}: {err}") from None
    logger.info("system %s (arch %s), %d train updates, %.0f s training", name, arch, updates, wall)

    if args.valid_tune:
        _valid_tune(system, args, name, updates)
        if args.valid_only:
            return

    dataset = inf.load_split(task, args.subset)
    dataset = inf.prefix_dataset(dataset, args.limit)
    n = len(dataset)
    if n != len(refs):
        raise SystemExit(
            f"error: {args.subset} of {args.data_bin} has {n} sentences but {args.raw_ref} "
            f"has {len(refs)} lines: is it the reference of this split?"
        )
    n_lat = n if args.latency_sentences == 0 else min(args.latency_sentences, n)
    warm = inf.make_batches(task, models, inf.prefix_dataset(dataset, args.warmup_sentences), 1) \
        if args.warmup_sentences else []
    # the first large batch pays one-off costs (allocator growth, kernel selection): not timed either
    warm_big = inf.make_batches(task, models, dataset, BATCH_SIZE_THROUGHPUT)[:1] if args.warmup_sentences else []
    lat_batches = inf.make_batches(task, models, inf.prefix_dataset(dataset, n_lat), 1)
    full_batches = inf.make_batches(task, models, dataset, BATCH_SIZE_THROUGHPUT)
    cuda = system.use_cuda
    board = _leaderboard_setup(args, system, wall) if args.leaderboard else None
    if board is not None:  # the speed baseline first, so the other decodings of this call can use it
        base_system, _, base_decoding = args.speed_baseline.partition("/")
        if name == base_system and base_decoding in args.decoding:
            args.decoding = [base_decoding] + [d for d in args.decoding if d != base_decoding]

    for d in args.decoding:
        generator, options, post = _build_generator(task, models, d, args, name)
        accepted = getattr(generator, "decoding_keys", None)
        if accepted is not None:  # the generator says which keys it reads (e.g. CTC: beam)
            unused = sorted(set(options) - set(accepted))
            if unused:
                raise SystemExit(
                    f"error: decoding {d}: {type(generator).__name__} of {name} does not read "
                    f"{', '.join(unused)} (it reads {', '.join(accepted)})"
                )
        else:
            kind = "ar" if inf.is_autoregressive(generator) else "nat"
            wrong = dec.decoding_kinds(options) - {kind}
            if wrong:
                raise SystemExit(
                    f"error: decoding {d} sets {'autoregressive' if 'ar' in wrong else 'iterative'} "
                    f"options but {name} uses {type(generator).__name__}"
                )
        _warn_if_busy()
        with torch.no_grad():
            inf.decode(task, generator, models, warm, cuda, postprocess=post)
            lat_watch = Stopwatch(cuda)
            with inf.count_decoder_calls(models) as counter:
                lat_hyps = inf.decode(task, generator, models, lat_batches, cuda, lat_watch, postprocess=post)
            inf.decode(task, generator, models, warm_big, cuda, postprocess=post)
            thr_watch = Stopwatch(cuda)
            hyps = inf.in_order(
                inf.decode(task, generator, models, full_batches, cuda, thr_watch, postprocess=post), n
            )
        latency = latency_ms_per_sentence(lat_watch.total, n_lat)
        logger.info(
            "%s %s: decoder passes per sentence at batch 1 (first %d sentences): %.2f counted, "
            "%.2f iterations from the hypotheses", name, d, n_lat, counter.calls / n_lat,
            inf.mean_iterations(list(lat_hyps.values()), generator),
        )
        speed = sentences_per_second(n, thr_watch.total)
        bpe_hyps = [inf.hypothesis_string(h, task.target_dictionary, generator) for h in hyps]
        scores = scoring.score_hypotheses(bpe_hyps, refs, args.tgt_lang, tok_refs)
        hyp_file = res.hyp_path(args.out, args.benchmark, name, d, args.distilled,
                                board["seed"] if board else None)
        _write_lines(hyp_file, scores.detok_hyps)
        columns = None
        if board is not None:
            columns = _leaderboard_columns(args, board, system, generator, post, name, d, refs, scores,
                                           latency, speed, counter.calls / n_lat, hyp_file)
        row = res.make_row(
            name, d, args.distilled, scores.bleu, scores.tok_bleu, latency, speed,
            inf.mean_iterations(hyps, generator), scores.repeat_rate, updates, wall,
            provenance.portable_path(hyp_file), _language_rates(args, scores.detok_hyps), columns,
        )
        logger.info(
            "%s %s: BLEU %.2f (tok %.2f), %.1f ms/sent b1 (%d sent), %.1f sent/s b%d, "
            "%.2f iterations, repeat rate %.4f", name, d, row["bleu"], row["tok_bleu"],
            row["latency_ms_b1"], n_lat, row["sent_per_s_b128"], BATCH_SIZE_THROUGHPUT,
            row["iterations"], row["repeat_rate"],
        )
        save_row(row, scores.signature)


def _leaderboard_setup(args, system, wall):
    """What every row of a --leaderboard call shares: the valid and blind batches, the valid reference,
    the training's seed, max-tokens, words/s, initialisation and machine."""
    from . import inference as inf
    from . import provenance

    task, models = system.task, system.models
    # --limit (smoke tests) cuts the valid and unseen subsets too
    valid = inf.prefix_dataset(inf.load_split(task, args.valid_subset), args.limit)
    valid_refs = scoring.read_lines(args.valid_raw_ref)[: args.limit or None]
    if len(valid_refs) != len(valid):
        raise SystemExit(f"error: {args.valid_subset} of {args.data_bin} has {len(valid)} sentences but "
                         f"--valid-raw-ref {args.valid_raw_ref} has {len(valid_refs)} lines")
    blind = {}
    for subset in args.blind:
        data = inf.prefix_dataset(inf.load_split(task, subset), args.limit)
        blind[subset] = (len(data), inf.make_batches(task, models, data, BATCH_SIZE_THROUGHPUT))
    seed, max_tokens = provenance.training_settings(system.state)
    seed = args.train_seed if args.train_seed is not None else seed
    max_tokens = args.train_max_tokens if args.train_max_tokens is not None else max_tokens
    if seed is None or max_tokens is None:
        raise SystemExit(f"error: {args.system_ckpt}: no training seed / max-tokens in the checkpoint: "
                         "pass --train-seed / --train-max-tokens")
    words = provenance.training_words_from_log(args.train_log) if args.train_log else None
    return {"valid": (len(valid), inf.make_batches(task, models, valid, BATCH_SIZE_THROUGHPUT)),
            "valid_refs": valid_refs, "blind": blind, "seed": seed, "max_tokens": max_tokens,
            "train_wps": (words / wall) if words is not None and wall > 0 else None,
            "trained_on": args.trained_on or provenance.hardware_description("cpu"),
            "measured_on": provenance.hardware_description(args.device)}


def _speed_baseline(args, name, d, latency, speed):
    """(batch-1 latency, batch-128 throughput) of --speed-baseline: this row's own when it is the
    baseline, else the row of --out measured in the same --run-id."""
    system, _, decoding = args.speed_baseline.partition("/")
    if (name, d) == (system, decoding):
        return latency, speed
    if os.path.exists(args.out):
        for row in res.load_results(args.out)["rows"]:
            if (row["system"], row["decoding"]) == (system, decoding) and row.get("run") == args.run_id:
                return row["latency_ms_b1"], row["sent_per_s_b128"]
    raise SystemExit(f"error: no row {system} {decoding} of run {args.run_id} in {args.out}: measure the speed "
                     "baseline first in the same run (--speed-baseline, --run-id)")


def _leaderboard_columns(args, board, system, generator, post, name, d, refs, scores, latency, speed, passes,
                         hyp_file):
    """The leaderboard columns of one row (valid and blind subsets decoded with the row's generator)."""
    from . import inference as inf
    from . import provenance

    task, models, tgt = system.task, system.models, system.task.target_dictionary
    with __import__("torch").no_grad():
        n_valid, valid_batches = board["valid"]
        hyps = inf.in_order(inf.decode(task, generator, models, valid_batches, system.use_cuda,
                                       postprocess=post), n_valid)
        valid = scoring.score_hypotheses([inf.hypothesis_string(h, tgt, generator) for h in hyps],
                                         board["valid_refs"], args.tgt_lang)
        blind = {}
        for subset, (n, batches) in board["blind"].items():
            hyps = inf.in_order(inf.decode(task, generator, models, batches, system.use_cuda, postprocess=post), n)
            lines = scoring.detokenize([scoring.remove_bpe(inf.hypothesis_string(h, tgt, generator)) for h in hyps],
                                       args.tgt_lang)
            path = res.blind_path(args.out, args.benchmark, hyp_file, subset)
            _write_lines(path, lines)
            blind[subset] = provenance.portable_path(path)
    base_latency, base_speed = _speed_baseline(args, name, d, latency, speed)
    columns = {
        "chrf": scoring.sacrebleu_chrf(scores.detok_hyps, refs).score,
        "valid_bleu": valid.bleu,
        "valid_chrf": scoring.sacrebleu_chrf(valid.detok_hyps, board["valid_refs"]).score,
        "decoder_passes": passes, "seed": board["seed"], "max_tokens": board["max_tokens"],
        "train_wps": board["train_wps"], "init": args.init, "trained_on": board["trained_on"],
        "measured_on": board["measured_on"], "run": args.run_id,
        "teacher_latency_ms_b1": base_latency, "teacher_sent_per_s_b128": base_speed,
        "blind": blind, "command": provenance.portable_text(args.row_command) or "",
    }
    logger.info("%s %s: chrF %.2f, valid BLEU %.2f chrF %.2f, %.2f decoder passes, speed-up b1 %.2fx b%d %.2fx",
                name, d, columns["chrf"], columns["valid_bleu"], columns["valid_chrf"], passes,
                base_latency / latency if latency else 0.0, BATCH_SIZE_THROUGHPUT,
                speed / base_speed if base_speed else 0.0)
    return columns


def parse_generation_options(items, error):
    """``--generation-option NAME=VALUE`` items -> {NAME: VALUE}; ``error(message)`` (a parser's) for a
    malformed one."""
    extra = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            error(f"--generation-option {item!r}: expected NAME=VALUE")
        extra[name] = value
    return extra


def _build_generator(task, models, d, args, name):
    """The task's generator for decoding string ``d`` -> (generator, its generation options, the
    hypothesis post-processing or None)."""
    parsed = dec.parse_decoding(d)
    options, task_options, info = dec.split_options(parsed)
    _check_info(info, args, models[0], d)
    for field_name, value in task_options.items():
        if not hasattr(task.cfg, field_name):
            raise SystemExit(f"error: decoding {d}: the {type(task).__name__} of {name} has no "
                             f"option {field_name}")
        setattr(task.cfg, field_name, value)
    extra = getattr(args, "generation_extra", {})
    generator = task.build_generator(models, dec.generation_options(options, **extra))
    return generator, options, dec.post_processing(parsed)


def _check_info(info, args, model, d):
    """``dir`` must be the benchmarked direction, ``loss`` the checkpoint's insertion loss, ``rollin``
    the checkpoint's Levenshtein roll-in, ``softmax`` its insertion softmax."""
    margs = getattr(model, "args", None)
    if "glat" in info:
        start, end = (getattr(margs, f"glat_ratio_{k}", None) for k in ("start", "end"))
        if not start:
            raise SystemExit(f"error: decoding {d}: glat= names a glancing-trained row but the checkpoint was "
                             "trained without glancing (--glat-ratio-start)")
        want = tuple(float(x) for x in info["glat"].split("-"))
        if want != (float(start), float(end if end is not None else start)):
            raise SystemExit(f"error: decoding {d}: glat={info['glat']} but the checkpoint was trained with "
                             f"--glat-ratio-start {start} --glat-ratio-end {end}")
    if "softmax" in info:
        from ..models.nat.insertion import insertion_softmax

        if margs is None or not hasattr(margs, "insertion_tau"):
            raise SystemExit(f"error: decoding {d}: softmax= names an insertion softmax but the model has none")
        if info["softmax"] != insertion_softmax(margs):
            raise SystemExit(f"error: decoding {d}: softmax={info['softmax']} but the checkpoint was trained "
                             f"with the {insertion_softmax(margs)} softmax (--insertion-softmax)")
    if "rollin" in info:
        if type(model).__name__ == "LevenshteinTransformerModel" and type(model).__module__.startswith("fairseq."):
            trained = "fairseq"  # fairseq's levenshtein_transformer: placeholders filled by its predictions
        elif margs is not None and hasattr(margs, "levt_rollin"):
            trained = margs.levt_rollin or "paper"
        else:
            raise SystemExit(f"error: decoding {d}: rollin= names a Levenshtein roll-in but the model has none")
        if info["rollin"] != trained:
            raise SystemExit(f"error: decoding {d}: rollin={info['rollin']} but the checkpoint was trained "
                             f"with the {trained} roll-in (--levt-rollin)")
    if "dir" in info and info["dir"] != f"{args.src_lang}-{args.tgt_lang}":
        raise SystemExit(f"error: decoding {d}: dir={info['dir']} but the run decodes "
                         f"{args.src_lang}-{args.tgt_lang} (--src-lang/--tgt-lang)")
    if "loss" in info:
        from ..models.nat.insertion import span_tau

        if margs is not None and hasattr(margs, "label_tau") and not hasattr(margs, "insertion_tau"):
            # fairseq's insertion_transformer: --label-tau unset = uniform slot weights
            trained = "uniform" if margs.label_tau is None else "binary_tree"
        elif margs is None or not hasattr(margs, "insertion_tau"):
            raise SystemExit(f"error: decoding {d}: loss= names an insertion loss but the model has none")
        else:
            trained = "uniform" if span_tau(margs) is None else "binary_tree"
        if info["loss"] != trained:
            raise SystemExit(f"error: decoding {d}: loss={info['loss']} but the checkpoint was trained "
                             f"with {trained} slot weights (--insertion-loss / fairseq's --label-tau)")


def _language_rates(args, lines):
    """:func:`.language_id.language_rates` of ``lines`` (target --tgt-lang), logged; None without
    --language-check."""
    if not getattr(args, "language_check", None):
        return None
    from .language_id import language_rates

    rates = language_rates(lines, args.tgt_lang, args.language_check)
    logger.info("language check (%s, target %s): wrong language %.2f%%, mixed %.2f%%, %d unidentified "
                "of %d", ",".join(args.language_check), args.tgt_lang, 100 * rates["wrong_language_rate"],
                100 * rates["mixed_language_rate"], rates["unidentified"], rates["sentences"])
    return rates


def reference_row(args, refs, tok_refs):
    """The reference scored against itself: only repeat_rate (and the language rates
    of --language-check) are informative (see .results)."""
    bleu = scoring.sacrebleu_score(refs, refs)
    tok = scoring.tokenized_bleu(tok_refs, tok_refs)
    row = res.make_row(
        res.REFERENCE_SYSTEM, res.REFERENCE_DECODING, False, bleu.score, tok.score, 0.0, 0.0,
        0.0, scoring.repeat_rate(tok_refs), 0, 0.0, _portable_paths(args.raw_ref),
        _language_rates(args, refs),
    )
    logger.info("reference: repeat rate %.4f", row["repeat_rate"])
    return row, bleu.signature


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    logging.basicConfig(format="[benchmark] %(message)s", level=logging.INFO, stream=sys.stderr,
                        force=True)
    for noisy in ("fairseq", "fairseq_cli", "fairseq_nat_ext.compat"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from . import provenance

    args.device = "cpu"
    if args.cuda:
        import torch

        if torch.cuda.is_available():
            args.device = "cuda"
        else:
            logger.warning("--cuda given but CUDA is not available: decoding on CPU")
    if args.system_ckpt:
        from .timing import set_threads

        set_threads(args.threads)
    hardware = provenance.hardware_description(args.device)
    command = provenance.portable_text(args.command) or (
        "python -m fairseq_nat_ext.evaluation.run " + provenance.portable_command(argv)
    )
    data = provenance.portable_text(args.data_name) or (
        (f"{provenance.portable_path(args.data_bin)} [{args.subset}, {args.src_lang}->{args.tgt_lang}], "
         if args.data_bin else "") + f"reference {provenance.portable_path(args.raw_ref)}"
        + (f" (first {args.limit} sentences)" if args.limit else "")
    )

    if args.valid_only:  # valid scores only: the test reference is not read
        benchmark_system(args, None, None, None)
        return 0
    refs = scoring.read_lines(args.raw_ref)
    if args.limit:
        refs = refs[: args.limit]
    tok_refs = scoring.tokenize(refs, args.tgt_lang)
    signature = scoring.sacrebleu_score(refs[:1], refs[:1]).signature
    results = _open_results(args, hardware, command, data, signature)

    def save_row(row, sig):
        results["sacrebleu_signature"] = sig
        res.upsert_row(results, row)
        res.save_results(args.out, results)
        logger.info("updated %s (%d rows)", args.out, len(results["rows"]))

    if args.system_ckpt:
        benchmark_system(args, refs, tok_refs, save_row)
    if args.reference_row:
        save_row(*reference_row(args, refs, tok_refs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
