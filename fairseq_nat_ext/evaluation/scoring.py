"""Scoring: BPE removal, Moses (de)tokenisation, BLEU and repeat rate.

Two BLEU numbers are reported for every system:

``bleu`` (sacreBLEU, the headline number)
    hypotheses (BPE form) -> remove ``@@ `` -> Moses-detokenise (sacremoses, target language,
    XML entities unescaped) -> ``sacrebleu`` corpus BLEU with its default settings (13a tokeniser,
    mixed case, exp smoothing) against the ORIGINAL raw reference file (plain or ``.gz``), never a
    distilled or tokenised one.  The sacreBLEU signature string is recorded with the results.

``tok_bleu`` (tokenised BLEU, like ``fairseq-generate --scoring bleu`` with ``--remove-bpe``)
    sacreBLEU with ``tokenize="none"`` on the BPE-removed, still Moses-tokenised hypotheses against
    the reference Moses-tokenised here the way the training data was prepared
    (``sacremoses -l L tokenize``: default rules, XML special characters escaped, no aggressive
    dash splitting).  Word-level, case-sensitive, 4-gram BLEU with brevity penalty; it differs from
    ``bleu`` only by the tokenisation of both sides.

``chrf`` (sacreBLEU chrF, default settings: character 6-grams, beta 2, no word n-grams)
    on the same detokenised hypotheses and raw references as ``bleu`` (:func:`sacrebleu_chrf`).

``repeat_rate``
    the fraction of output words equal to the previous word of the same sentence (words = whitespace
    tokens of the BPE-removed tokenised text), pooled over the corpus: (number of such words) /
    (number of words).  Consecutive repeats are the typical failure of non-autoregressive decoders
    ("der der Hund"); the reference's own rate is the baseline.
"""
import gzip
import io
from dataclasses import dataclass
from functools import lru_cache

BPE_SYMBOL = "@@ "


def read_lines(path):
    """Lines of a UTF-8 text file, plain or gzip (by the ``.gz`` suffix), without their newlines."""
    opener = gzip.open if str(path).endswith(".gz") else io.open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n").rstrip("\r") for line in f]


def remove_bpe(line, bpe_symbol=BPE_SYMBOL):
    """Undo subword-nmt / fastBPE segmentation exactly as fairseq's ``--remove-bpe`` (``@@ ``) does."""
    return (line + " ").replace(bpe_symbol, "").rstrip()


@lru_cache(maxsize=None)
def _tokenizer(lang):
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


@lru_cache(maxsize=None)
def _detokenizer(lang):
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang=lang)


def detokenize(lines, lang):
    """Moses-detokenise tokenised lines (XML entities such as ``&apos;`` are unescaped)."""
    detok = _detokenizer(lang)
    return [detok.detokenize(line.split(), return_str=True, unescape=True) for line in lines]


def tokenize(lines, lang):
    """Moses-tokenise raw lines like ``sacremoses -l LANG tokenize`` (entities escaped)."""
    tok = _tokenizer(lang)
    return [tok.tokenize(line, return_str=True, escape=True) for line in lines]


@dataclass
class BleuScore:
    score: float
    signature: str


def _check_lengths(hyps, refs):
    if len(hyps) != len(refs):
        raise ValueError(
            f"BLEU: {len(hyps)} hypotheses but {len(refs)} reference lines (the reference file must "
            "hold exactly the decoded sentences, in order)"
        )


def sacrebleu_score(detok_hyps, raw_refs):
    """sacreBLEU corpus BLEU (default settings) of detokenised hypotheses vs raw references."""
    from sacrebleu.metrics import BLEU

    _check_lengths(detok_hyps, raw_refs)
    metric = BLEU()
    result = metric.corpus_score(list(detok_hyps), [list(raw_refs)])
    return BleuScore(float(result.score), str(metric.get_signature()))


def sacrebleu_chrf(detok_hyps, raw_refs):
    """sacreBLEU corpus chrF (default settings) of detokenised hypotheses vs raw references."""
    from sacrebleu.metrics import CHRF

    _check_lengths(detok_hyps, raw_refs)
    metric = CHRF()
    result = metric.corpus_score(list(detok_hyps), [list(raw_refs)])
    return BleuScore(float(result.score), str(metric.get_signature()))


def tokenized_bleu(tok_hyps, tok_refs):
    """Word-level BLEU of tokenised (BPE-removed) hypotheses vs tokenised references."""
    from sacrebleu.metrics import BLEU

    _check_lengths(tok_hyps, tok_refs)
    metric = BLEU(tokenize="none", force=True)
    result = metric.corpus_score(list(tok_hyps), [list(tok_refs)])
    return BleuScore(float(result.score), str(metric.get_signature()))


def repeat_rate(tok_lines):
    """Fraction of words (whitespace tokens) equal to the previous word of the same line; 0.0 if none."""
    words = repeats = 0
    for line in tok_lines:
        toks = line.split()
        words += len(toks)
        repeats += sum(1 for prev, cur in zip(toks, toks[1:]) if prev == cur)
    return repeats / words if words else 0.0


@dataclass
class Scores:
    bleu: float
    tok_bleu: float
    repeat_rate: float
    signature: str
    detok_hyps: list


def score_hypotheses(bpe_hyps, raw_refs, tgt_lang, tok_refs=None):
    """All metrics for hypotheses in BPE form (one per reference line, in order).

    ``tok_refs`` (the tokenised reference) is computed from ``raw_refs`` when not given.
    """
    tok_hyps = [remove_bpe(h) for h in bpe_hyps]
    detok_hyps = detokenize(tok_hyps, tgt_lang)
    if tok_refs is None:
        tok_refs = tokenize(raw_refs, tgt_lang)
    bleu = sacrebleu_score(detok_hyps, raw_refs)
    tok = tokenized_bleu(tok_hyps, tok_refs)
    return Scores(bleu.score, tok.score, repeat_rate(tok_hyps), bleu.signature, detok_hyps)
