"""Decoding strings: the ``decoding`` column of the results and the ``--decoding`` CLI option.

A decoding string is ``key=value`` pairs joined by commas without spaces, e.g. ``beam=5`` or
``iter=10,len_beam=3``.  Each short key stands for one standard fairseq generation option:

==============  ===============================  =======  ==========================================
key             fairseq option                   type     used by
==============  ===============================  =======  ==========================================
``glat``        (checked: the checkpoint's)      str      glancing training: ``START-END`` ratios
                                                          (``--glat-ratio-start`` / ``--glat-ratio-end``)
``beam``        ``--beam``                       int      autoregressive beam search
``lenpen``      ``--lenpen``                     float    autoregressive beam search
``max_len_a``   ``--max-len-a``                  float    autoregressive beam search
``max_len_b``   ``--max-len-b``                  int      autoregressive beam search
``iter``        ``--iter-decode-max-iter``       int      iterative (NAT) decoding
``len_beam``    ``--iter-decode-with-beam``      int      iterative (NAT) decoding: length beam
``force``       ``--iter-decode-force-max-iter`` bool     iterative (NAT) decoding: no early stop
``eos_penalty`` ``--iter-decode-eos-penalty``    float    fairseq's IterativeRefinementGenerator
``reranker``    ``--iter-decode-with-external-   bool     fairseq's IterativeRefinementGenerator: the
                reranker``                                last ``--path`` model rescores the length beam
``block``       ``--iter-decode-max-iter``       int      Imputer: block size B = decoding steps
``fertility``   (label, sets nothing)            choice   nat_fertility: ``aligner`` or ``attention``
``npd``         ``--npd-samples`` (task option)  int      nat_fertility: noisy parallel decoding
``rank``        ``--npd-rank`` (task option)     choice   nat_fertility: ``total`` (the paper's) or
                                                          ``mean`` teacher log-probability ranks NPD
``order``       task ``--insertion-decoding``    str      Insertion Transformer: parallel/sequential
``dir``         (checked: ``SRC-TGT``)           str      a model that translates both ways (KERMIT)
``loss``        (checked: the checkpoint's)      str      which training loss the row's model used
``rollin``      (checked: the checkpoint's)      choice   Levenshtein: ``paper`` or ``fairseq`` roll-in
``softmax``     (checked: the checkpoint's)      choice   Insertion: ``slot`` p(c | l) or ``joint`` p(c, l)
``dedup``       task ``--collapse-repeats``      bool     any system: consecutive repeated tokens of each
                                                          hypothesis collapsed (by the harness)
``decoder``     ``--dag-decoder``                choice   DA-Transformer: ``greedy``, ``lookahead``,
                                                          ``viterbi``, ``beam`` or ``sample``
==============  ===============================  =======  ==========================================

``glat`` names a glancing-trained row (the harness checks it against the checkpoint's
``--glat-ratio-start``/``--glat-ratio-end``); ``decoder`` is set on the generation options as
``dag_decoder`` (the DA-Transformer generator reads it there before the task's ``--dag-decoder``).
``order`` is set on the task's config before its generator is built.  ``dir``, ``loss``, ``rollin``
and ``softmax`` set nothing: they name the row, and the harness checks them against the run
(``--src-lang``/``--tgt-lang``; the checkpoint's ``--insertion-loss``; its ``--levt-rollin``, fairseq's
``levenshtein_transformer`` being ``fairseq``; its ``--insertion-softmax``).  ``dedup`` is applied by the harness to the
hypotheses of every kind of system (fairseq's built-in models and the teacher included, inside the
timed decoding) with the same function as nat_translation's ``--collapse-repeats``
(``generators/postprocess.py``).

``block`` and ``iter`` name the same fairseq option (the Imputer takes exactly B steps), so a string
gives at most one of them.  ``iter=0`` is allowed for fairseq's IterativeRefinementGenerator, which
counts passes from 0 (``iter=0``: a single pass, e.g. fairseq's ``nonautoregressive_transformer``);
this plugin's generators treat it as 1.  ``npd`` is set on the generation options as ``npd_samples``
(the nat_fertility generator reads it there before the task's ``--npd-samples``), and so is ``rank``
as ``npd_rank`` (before the task's ``--npd-rank``, default ``total``); ``fertility`` names
how the system's training fertilities were made and is checked by that generator against the
checkpoint's fertility directory when present.  ``beam`` is also CTC prefix beam search (``ctc_nat``; ``beam=1`` greedy).
A generator may declare the keys it reads (``decoding_keys``); the harness then refuses the others.

:func:`format_decoding` writes the canonical form: keys in the order of the table, integers (and
integral floats) without a decimal point, booleans as ``1``/``0``.  ``parse_decoding`` followed by
``format_decoding`` is the identity on canonical strings.  Options not named keep fairseq-generate's
defaults (:func:`generation_options`).
"""
import argparse
import re

# key -> (fairseq option name, type, kind)
KEYS = {
    "glat": (None, str, "info"),
    "beam": ("beam", int, "ar"),
    "lenpen": ("lenpen", float, "ar"),
    "max_len_a": ("max_len_a", float, "ar"),
    "max_len_b": ("max_len_b", int, "ar"),
    "iter": ("iter_decode_max_iter", int, "nat"),
    "len_beam": ("iter_decode_with_beam", int, "nat"),
    "force": ("iter_decode_force_max_iter", bool, "nat"),
    "eos_penalty": ("iter_decode_eos_penalty", float, "nat"),
    "reranker": ("iter_decode_with_external_reranker", bool, "nat"),
    "block": ("iter_decode_max_iter", int, "nat"),
    "fertility": ("fertility_source", str, "label"),
    "npd": ("npd_samples", int, "nat"),
    "rank": ("npd_rank", str, "nat"),
    "order": ("insertion_decoding", str, "task"),
    "dir": (None, str, "info"),
    "loss": (None, str, "info"),
    "rollin": (None, str, "info"),
    "softmax": (None, str, "info"),
    "dedup": ("collapse_repeats", bool, "post"),
    "decoder": ("dag_decoder", str, "nat"),
}
#: allowed values of the string keys (the others: one word)
CHOICES = {"fertility": ("aligner", "attention"), "order": ("parallel", "sequential"), "rank": ("total", "mean"),
           "loss": ("binary_tree", "uniform"), "rollin": ("paper", "fairseq"),
           "softmax": ("slot", "joint"), "decoder": ("greedy", "lookahead", "viterbi", "beam", "sample")}
#: keys whose value has its own form (checked by the pattern instead of the one-word rule)
PATTERNS = {"glat": re.compile(r"^\d+(?:\.\d+)?-\d+(?:\.\d+)?$")}
_WORD_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
#: integer keys whose smallest value is 0 (the others: 1)
ZERO_OK = ("max_len_b", "iter")
_PAIR_RE = re.compile(r"^([a-z_]+)=([^,=\s]+)$")
_TRUE, _FALSE = {"1", "true", "yes"}, {"0", "false", "no"}


def _parse_value(key, text):
    _, typ, _ = KEYS[key]
    if typ is bool:
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"decoding: {key}={text}: expected 1/0 (or true/false)")
    if typ is str:
        if key in CHOICES and text not in CHOICES[key]:
            raise ValueError(f"decoding: {key}={text}: expected one of {', '.join(CHOICES[key])}")
        if key in PATTERNS:
            if not PATTERNS[key].match(text):
                raise ValueError(f"decoding: {key}={text}: expected START-END ratios, e.g. 0.5-0.3")
            return text
        if not _WORD_RE.match(text):
            raise ValueError(f"decoding: {key}={text}: expected a word (letters, digits, - and _)")
        return text
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"decoding: {key}={text}: not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"decoding: {key}={text}: not a finite number")
    if typ is int:
        if not value.is_integer():
            raise ValueError(f"decoding: {key}={text}: expected an integer")
        value = int(value)
        low = 0 if key in ZERO_OK else 1
        if value < low:
            raise ValueError(f"decoding: {key}={text}: must be >= {low}")
    return value


def parse_decoding(text):
    """``"iter=10,len_beam=3"`` -> ``{"iter": 10, "len_beam": 3}`` (ValueError on anything else)."""
    if not isinstance(text, str) or not text:
        raise ValueError("decoding: empty decoding string (expected e.g. beam=5 or iter=10,len_beam=3)")
    out = {}
    for pair in text.split(","):
        m = _PAIR_RE.match(pair)
        if not m:
            raise ValueError(f"decoding: {text!r}: {pair!r} is not key=value (no spaces)")
        key, value = m.groups()
        if key not in KEYS:
            raise ValueError(f"decoding: unknown key {key!r} in {text!r} (known: {', '.join(KEYS)})")
        if key in out:
            raise ValueError(f"decoding: {key!r} given twice in {text!r}")
        out[key] = _parse_value(key, value)
    if "iter" in out and "block" in out:
        raise ValueError(f"decoding: {text!r} gives both iter and block (the same fairseq option)")
    return out


def _format_value(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def format_decoding(options):
    """``{"len_beam": 3, "iter": 10}`` -> ``"iter=10,len_beam=3"`` (canonical order and values)."""
    unknown = [k for k in options if k not in KEYS]
    if unknown:
        raise ValueError(f"decoding: unknown keys {unknown}")
    if not options:
        raise ValueError("decoding: no options")
    return ",".join(f"{k}={_format_value(options[k])}" for k in KEYS if k in options)


def canonical_decoding(text):
    return format_decoding(parse_decoding(text))


def is_canonical_decoding(text):
    try:
        return canonical_decoding(text) == text
    except ValueError:
        return False


def decoding_kinds(options):
    """The set of generator kinds (``"ar"``, ``"nat"``) the options are meant for (labels, task
    options and row names excluded)."""
    return {KEYS[k][2] for k in options} - {"label", "task", "info", "post"}


def post_processing(options):
    """The hypothesis post-processing the options ask for: a function over generate()'s output, or None."""
    if options.get("dedup"):
        from fairseq_nat_ext.generators.postprocess import collapse_all

        return collapse_all
    return None


def split_options(options):
    """-> (generation options (ar, nat and label keys), task-config options {cfg field: value},
    info options {key: value}); post-processing keys are read by :func:`post_processing`."""
    gen = {k: v for k, v in options.items() if KEYS[k][2] in ("ar", "nat", "label")}
    task = {KEYS[k][0]: v for k, v in options.items() if KEYS[k][2] == "task"}
    info = {k: v for k, v in options.items() if KEYS[k][2] == "info"}
    return gen, task, info


def generation_options(options, **extra):
    """fairseq-generate's default generation options with ``options`` (short keys) applied.

    Returns an ``argparse.Namespace`` as ``task.build_generator(models, args)`` expects; ``extra``
    sets further fairseq option names directly.
    """
    from fairseq.dataclass.configs import GenerationConfig

    defaults = GenerationConfig()
    ns = argparse.Namespace(
        **{name: getattr(defaults, name) for name in GenerationConfig.__dataclass_fields__}
    )
    for key, value in options.items():
        if KEYS[key][2] in ("ar", "nat", "label"):
            setattr(ns, KEYS[key][0], value)
    for name, value in extra.items():
        setattr(ns, name, value)
    return ns
