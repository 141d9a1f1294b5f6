"""Translate a data-bin split with any checkpoint (ours or fairseq's) and score it with sacreBLEU.

Usage::

    fairseq-nat-translate DATA_BIN CKPT [--split test] [--out FILE] [--ref FILE] [decoding options]
    examples/translate.sh DATA_BIN CKPT [SPLIT] [options]          # the same, from the repository
    python -m fairseq_nat_ext.evaluation.translate DATA_BIN CKPT ...

What it does, in order:

1. loads CKPT (``a.pt:b.pt`` for an ensemble) with its own task, the plugin imported (its archs
   registered, checkpoints checked); the language pair is DATA_BIN's only pair (``--source-lang`` /
   ``--target-lang`` to choose, e.g. the direction of a KERMIT model);
2. chooses the generation options for the checkpoint's arch (:data:`DEFAULT_DECODING`, written in the
   decoding strings of :mod:`fairseq_nat_ext.evaluation.decoding`, which turns them into fairseq's
   generation options exactly as the benchmark harness does), e.g. ``mask_predict`` ->
   ``--iter-decode-max-iter 10 --iter-decode-with-beam 3``, ``transformer`` -> ``--beam 5``; the
   options used are printed as fairseq-generate flags.  Override them key by key (``--beam 1``,
   ``--iter 4``, ``--len-beam 5``, ``--block 2``, ``--npd 10``, ... one option per key of the decoding
   table), replace them (``--decoding iter=4,len_beam=3``), or set any further generation option the
   generator reads (``--generation-option npd_teacher=teacher.pt``);
3. decodes every sentence of ``--split`` (test order), removes the BPE (``@@ ``) and Moses-detokenises
   (sacremoses, the target language code; ``--moses-lang`` when the data-bin's code is not one);
4. writes the hypotheses, one line per sentence, to ``--out`` (default ``<CKPT without .pt>.<split>.<tgt>``
   beside the checkpoint) and prints sacreBLEU (default settings) with its signature, scored against
   the untokenised reference: ``--ref FILE``, else ``DATA_BIN/../raw/<split>.<tgt>`` (plain or ``.gz``),
   which ``examples/prepare_data.sh`` writes beside the data-bin (and ``examples/distill.sh`` copies for
   valid and test).  Without a reference the hypotheses are written and nothing is scored.

stdout holds only the score line, e.g.::

    BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3 = 31.20 62.1/38.5/25.3/17.0 (BP = ...)

Raw text in Python (fairseq's hub interface, the plugin's generators; BPE codes as written by
``examples/prepare_data.sh``)::

    from fairseq.models import ARCH_MODEL_REGISTRY
    import fairseq_nat_ext
    model = ARCH_MODEL_REGISTRY["mask_predict"].from_pretrained(
        "work/mask_predict", checkpoint_file="checkpoint_avg.pt", data_name_or_path="work/distill/data-bin",
        tokenizer="moses", bpe="fastbpe", bpe_codes="work/data/bpe.codes", source_lang="src", target_lang="tgt",
        user_dir=fairseq_nat_ext.__path__[0])
    model.translate(["the big dog sees a cat ."], iter_decode_max_iter=10, iter_decode_with_beam=3)

(``source_lang``/``target_lang``: the data-bin's pair, also the Moses rules' languages; any registered
class works: ``fairseq.models.transformer.TransformerModel.from_pretrained`` loads a
plugin checkpoint too, the arch comes from the checkpoint; ``translate`` takes the generation options as
keyword arguments, the names of :mod:`fairseq_nat_ext.evaluation.decoding`'s table).
"""
import argparse
import glob
import logging
import os
import sys
import time
import warnings

from . import decoding as dec

logger = logging.getLogger("fairseq_nat_ext.translate")

#: registered model (not arch) name -> default decoding string; unlisted autoregressive models get
#: AR_DEFAULT, unlisted non-autoregressive ones NAT_DEFAULT
DEFAULT_DECODING = {
    # this plugin
    "mask_predict": "iter=10,len_beam=3",
    "levenshtein": "iter=10",
    "insertion": "iter=10",
    "kermit": "iter=10",
    "ctc_nat": "beam=1",
    "imputer": "block=4",
    "nat_fertility": "npd=1",
    "iterative_refinement": "iter=10",
    "da_transformer": "decoder=lookahead",
    "glat": "len_beam=3",
    # fairseq's own
    "cmlm_transformer": "iter=10,len_beam=3",
    "levenshtein_transformer": "iter=10",
    "insertion_transformer": "iter=10",
    "nonautoregressive_transformer": "iter=0",
    "iterative_nonautoregressive_transformer": "iter=10",
}
AR_DEFAULT = "beam=5"
NAT_DEFAULT = "iter=10"
#: decoding keys that name a row of a results table and set nothing: no command-line option here
_NO_OPTION = tuple(key for key, (_, _, kind) in dec.KEYS.items() if kind == "info")


def _key_option(key):
    return "--" + key.replace("_", "-")


def build_parser():
    p = argparse.ArgumentParser(
        prog="fairseq-nat-translate",
        description="Translate a split of a fairseq data-bin with any checkpoint (this plugin's or "
        "fairseq's; generation options chosen for its arch), write detokenised hypotheses and print "
        "sacreBLEU with its signature.",
    )
    p.add_argument("data_bin", metavar="DATA_BIN")
    p.add_argument("checkpoint", metavar="CKPT", help="checkpoint (an ensemble: paths joined by ':')")
    p.add_argument("--split", default="test", help="split of DATA_BIN to translate (default test)")
    p.add_argument("--out", help="hypothesis file (default: <CKPT without .pt>.<split>.<tgt> beside CKPT)")
    p.add_argument("--ref", help="untokenised reference (default DATA_BIN/../raw/<split>.<tgt>[.gz])")
    p.add_argument("--source-lang", "-s", help="default: DATA_BIN's only language pair")
    p.add_argument("--target-lang", "-t")
    p.add_argument("--moses-lang", help="language code for the Moses detokeniser (default: --target-lang)")
    p.add_argument("--decoding", help="decoding string replacing the arch's default, e.g. beam=5 or "
                   "iter=10,len_beam=3 (see fairseq_nat_ext.evaluation.decoding)")
    g = p.add_argument_group("decoding options (each overrides one key of the arch's default decoding)")
    for key, (option, typ, kind) in dec.KEYS.items():
        if key in _NO_OPTION:
            continue
        target = {"task": f"task option --{option.replace('_', '-')}",
                  "post": "consecutive repeated tokens collapsed",
                  "label": "label checked against the checkpoint"}.get(kind, f"--{option.replace('_', '-')}")
        g.add_argument(_key_option(key), dest=f"key_{key}", metavar="V", help=f"{key}= ({target})")
    p.add_argument("--generation-option", action="append", default=[], metavar="NAME=VALUE",
                   help="set a further generation option read by the generator, e.g. npd_teacher=teacher.pt")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per batch (default 64)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's, the core count)")
    p.add_argument("--cpu", action="store_true", help="decode on CPU even when CUDA is available")
    return p


def language_pair(data_bin, split):
    """The only (src, tgt) of ``DATA_BIN/<split>.<src>-<tgt>.<src>.idx``; None when not exactly one."""
    pairs = set()
    for path in glob.glob(os.path.join(glob.escape(data_bin), f"{glob.escape(split)}.*-*.*.idx")):
        name = os.path.basename(path)[len(split) + 1:-len(".idx")]
        pair, _, lang = name.rpartition(".")
        src, _, tgt = pair.partition("-")
        if src and tgt and lang == src:
            pairs.add((src, tgt))
    return pairs.pop() if len(pairs) == 1 else None


def find_reference(data_bin, split, tgt):
    """``DATA_BIN/../raw/<split>.<tgt>`` (or ``.gz``) when present, else None."""
    base = os.path.join(os.path.dirname(os.path.abspath(data_bin.rstrip(os.sep))), "raw", f"{split}.{tgt}")
    for path in (base, base + ".gz"):
        if os.path.isfile(path):
            return path
    return None


def default_decoding(model_name, autoregressive):
    return DEFAULT_DECODING.get(model_name) or (AR_DEFAULT if autoregressive else NAT_DEFAULT)


def apply_overrides(decoding, overrides):
    """``decoding`` (a string) with the keys of ``overrides`` ({key: text}) replaced -> canonical string."""
    options = dec.parse_decoding(decoding)
    if overrides:
        new = dec.parse_decoding(",".join(f"{k}={v}" for k, v in overrides.items()))
        for pair in (("iter", "block"), ("block", "iter")):  # the same fairseq option
            if pair[0] in new:
                options.pop(pair[1], None)
        options.update(new)
    return dec.format_decoding(options)


def generate_flags(decoding):
    """The fairseq-generate command-line flags a decoding string stands for (labels excluded)."""
    flags = []
    for key, value in dec.parse_decoding(decoding).items():
        option, typ, kind = dec.KEYS[key]
        if kind in ("label", "info"):
            continue
        name = "--" + option.replace("_", "-")
        if typ is bool:
            if value:
                flags.append(name)
        else:
            flags += [name, dec._format_value(value)]
    return " ".join(flags)


def _is_autoregressive(models):
    from fairseq.models import FairseqEncoderDecoderModel
    from fairseq.models.nat import FairseqNATModel

    m = models[0]
    if isinstance(m, FairseqNATModel) or getattr(m, "generator_class", None) is not None:
        return False
    return isinstance(m, FairseqEncoderDecoderModel)


def _model_name(arch):
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    return ARCH_MODEL_NAME_REGISTRY.get(arch, arch)


def _check_keys(generator, decoding, autoregressive, name):
    """The generator reads every key of the decoding (its declared keys, else AR/NAT kind)."""
    options = dec.parse_decoding(decoding)
    accepted = getattr(generator, "decoding_keys", None)
    if accepted is not None:
        unused = sorted(set(options) - set(accepted) - set(_NO_OPTION) - {"dedup"})
        if unused:
            raise SystemExit(f"error: {name} ({type(generator).__name__}) does not read "
                             f"{', '.join(unused)} (it reads {', '.join(accepted)})")
        return
    wrong = dec.decoding_kinds(options) - {"ar" if autoregressive else "nat"}
    if wrong:
        raise SystemExit(f"error: decoding {decoding} sets {'autoregressive' if 'ar' in wrong else 'iterative'} "
                         f"options but {name} uses {type(generator).__name__}")


def default_out(checkpoint, split, tgt):
    first = checkpoint.split(os.pathsep)[0]
    stem = first[:-3] if first.endswith(".pt") else first
    return f"{stem}.{split}.{tgt}"


def translate(args):
    """Decode, write and score; returns (detokenised hypotheses, sacreBLEU result or None, signature)."""
    import torch

    from . import inference as inf
    from . import provenance, scoring
    from .run import _build_generator  # the harness' decoding string -> generator path

    data_bin = args.data_bin
    if not os.path.isdir(data_bin):
        raise SystemExit(f"error: DATA_BIN {data_bin} is not a directory")
    src, tgt = args.source_lang, args.target_lang
    if not (src and tgt):
        pair = language_pair(data_bin, args.split)
        if pair is None:
            raise SystemExit(f"error: cannot tell the language pair of {data_bin} (no single "
                             f"{args.split}.SRC-TGT.SRC.idx): pass --source-lang and --target-lang")
        src, tgt = src or pair[0], tgt or pair[1]
    if args.threads:
        torch.set_num_threads(args.threads)
    use_cuda = torch.cuda.is_available() and not args.cpu
    try:
        system = inf.load_system(args.checkpoint, data_bin, src, tgt, use_cuda=use_cuda)
    except FileNotFoundError as err:
        raise SystemExit(f"error: {err}") from None
    task, models = system.task, system.models
    arch = provenance.arch_of_state(system.state) or "unknown"
    model_name = _model_name(arch)
    name = provenance.system_name(arch, type(models[0]).__module__)
    autoregressive = _is_autoregressive(models)
    overrides = {k: getattr(args, f"key_{k}") for k in dec.KEYS if getattr(args, f"key_{k}", None) is not None}
    try:
        decoding = apply_overrides(args.decoding or default_decoding(model_name, autoregressive), overrides)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    extra = {}
    for item in args.generation_option:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise SystemExit(f"error: --generation-option {item!r}: expected NAME=VALUE")
        extra[key] = value
    ns = argparse.Namespace(src_lang=src, tgt_lang=tgt, generation_extra=extra)
    generator, _, post = _build_generator(task, models, decoding, ns, name)
    _check_keys(generator, decoding, inf.is_autoregressive(generator) or autoregressive, name)
    flags = generate_flags(decoding)
    logger.info("%s (arch %s), %s -> %s, decoding %s (fairseq-generate %s)", name, arch, src, tgt, decoding,
                flags or "defaults")

    dataset = inf.load_split(task, args.split)
    n = len(dataset)
    batches = inf.make_batches(task, models, dataset, args.batch_size)
    start, done, hyps_by_id, last = time.perf_counter(), 0, {}, time.perf_counter()
    with torch.no_grad():
        for i, batch in enumerate(batches):
            hyps_by_id.update(inf.decode(task, generator, models, [batch], use_cuda, postprocess=post,
                                         seed=inf.SEED if i == 0 else None))
            done += len(batch["id"])
            now = time.perf_counter()
            if now - last >= 30 or done == n:
                logger.info("decoded %d / %d sentences (%.1f sent/s)", done, n, done / max(now - start, 1e-9))
                last = now
    hyps = inf.in_order(hyps_by_id, n)
    tgt_dict = task.target_dictionary
    tok = [scoring.remove_bpe(inf.hypothesis_string(h, tgt_dict, generator)) for h in hyps]
    detok = scoring.detokenize(tok, args.moses_lang or tgt)

    out = args.out or default_out(args.checkpoint, args.split, tgt)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".tmp", "w", encoding="utf-8", newline="\n") as f:
        for line in detok:
            f.write(line + "\n")
    os.replace(out + ".tmp", out)
    logger.info("wrote %d hypotheses to %s", n, out)

    ref = args.ref or find_reference(data_bin, args.split, tgt)
    if ref is None:
        logger.warning("no reference (looked for %s[.gz]; give --ref FILE): not scored",
                       os.path.join(os.path.dirname(os.path.abspath(data_bin.rstrip(os.sep))), "raw",
                                    f"{args.split}.{tgt}"))
        return detok, None, None
    if not os.path.isfile(ref):
        raise SystemExit(f"error: --ref {ref}: no such file")
    refs = scoring.read_lines(ref)
    if len(refs) != n:
        raise SystemExit(f"error: {ref} has {len(refs)} lines but {args.split} of {data_bin} has {n} "
                         "sentences: is it the reference of this split?")
    from sacrebleu.metrics import BLEU

    metric = BLEU()
    result = metric.corpus_score(detok, [refs])
    signature = str(metric.get_signature())
    logger.info("scored against %s", ref)
    return detok, result, signature


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each record (main() may run many times in a
    process whose stderr is replaced between calls, e.g. by a test's capture)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def _setup_logging():
    """Our lines on stderr as ``[translate] ...``; fairseq's INFO lines off (as the benchmark harness)."""
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("[translate] %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for noisy in ("fairseq", "fairseq_cli", "fairseq_nat_ext.compat"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # fairseq's batch iterator asks for pinned memory whatever the device
    warnings.filterwarnings("ignore", message=".*pin_memory.*")


def main(argv=None):
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    _setup_logging()
    if args.batch_size < 1:
        raise SystemExit("error: --batch-size must be >= 1")
    _, result, signature = translate(args)
    if result is not None:
        print(result.format(signature=signature), flush=True)
    return 0


def cli_main():
    sys.exit(main())


if __name__ == "__main__":
    cli_main()
