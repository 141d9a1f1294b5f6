"""Deterministic synthetic translation task with genuine multi-modality.

The task is small enough to train on CPU in minutes, yet hard for a
non-autoregressive (NAT) model trained on the raw data, because every source
sentence has several equally likely correct translations.  An autoregressive
teacher picks one of them consistently, so sequence-level knowledge
distillation (training the NAT on the teacher's outputs) visibly helps.

Source language (English-like, ASCII, lower case, already tokenised)
---------------------------------------------------------------------
Word classes (the class of every word is unique, so parsing is unambiguous)::

    DET   the a this that every some                       (6)
    ADJ   big small red blue ... brave lazy tired strange  (24)
    NOUN  dog cat man woman ... hill lake road shop        (40)
    VT    sees likes carries ... cleans opens              (16, transitive)
    VI    sleeps runs sings ... falls laughs               (10, intransitive)
    PREP  near behind under ... across with                (8)
    ADV   today again slowly ... now there                 (8)
    "."   sentence end

Grammar::

    S      -> NP VP PP{0,2} [ADV] "."
    NP     -> DET ADJ{0,2} NOUN
    VP     -> VT NP | VI
    PP     -> PREP NP

Sentences have 4 to 15 words, not counting the final ".".

Target language (invented words, ASCII)
---------------------------------------
Every source word except "." has three target synonyms, one per *style*
(0, 1, 2); "." translates to ".".  The lexicon is fixed (it does not depend on
the corpus seed) and all target forms are distinct, so a target word tells which
source word and which style it came from.

A translation is made word by word with three choices drawn independently for
each sentence:

* style ``s`` in {0, 1, 2} (uniform): every word of the sentence uses synonym
  ``s``.  Mixing styles within one sentence is *not* a valid translation.
* ``adj_after`` (probability ``reorder_prob``, default 0.5): in every noun
  phrase the adjectives follow the noun (``DET NOUN ADJ*``) instead of
  preceding it (``DET ADJ* NOUN``); adjective order is kept.
* ``verb_final`` (probability ``reorder_prob``): the verb moves to the end of
  the clause, just before "." (``NP [NP] PP* [ADV] V .``) instead of
  following the subject.

Hence a source sentence has up to 3 x 2 x 2 = 12 valid targets (fewer when it
has no adjective or nothing after the verb).  A NAT model trained on the raw
data tends to mix the modes, e.g. style 0 for one word and style 2 for the
next, or half of the adjectives before and half after the noun: such outputs
fail :func:`is_valid_translation`.  Source and target always have the same
number of tokens.

To make the multi-modality explicit in the training data, a fraction
``repeat_frac`` (default 0.1) of the *training* sources are drawn from a fixed
pool of ``pool_size`` (default 200) sentences, so the same source appears many
times with different valid targets.  Valid and test sources are always fresh
draws.

Command line::

    python -m fairseq_nat_ext.data.synthetic_corpus DIR [--seed 1] \\
        [--train 20000 --valid 500 --test 500]          (or --out DIR)

writes ``DIR/{train,valid,test}.{src,tgt}``, one sentence per line (UTF-8,
``\\n`` line ends).  The same arguments give byte-identical files.

Python API: :func:`generate_corpus`, :func:`write_corpus`,
:func:`valid_targets`, :func:`is_valid_translation`,
:func:`analyse_translation`, :func:`parse_source`.
"""

import argparse
import itertools
import os
import random
import sys
from typing import Dict, FrozenSet, List, NamedTuple, Optional, Sequence, Tuple

DETS = ["the", "a", "this", "that", "every", "some"]
ADJS = [
    "big", "small", "red", "blue", "green", "old", "young", "happy",
    "sad", "tall", "short", "quiet", "loud", "bright", "dark", "warm",
    "cold", "fast", "slow", "clever", "brave", "lazy", "tired", "strange",
]
NOUNS = [
    "dog", "cat", "man", "woman", "child", "boy", "girl", "bird",
    "horse", "car", "house", "tree", "river", "ball", "book", "table",
    "chair", "garden", "street", "city", "teacher", "doctor", "farmer", "painter",
    "cook", "fish", "apple", "bottle", "window", "door", "bridge", "boat",
    "hat", "coat", "shoe", "flower", "hill", "lake", "road", "shop",
]
VERBS_T = [
    "sees", "likes", "carries", "follows", "finds", "watches", "holds", "paints",
    "pushes", "pulls", "chases", "builds", "buys", "sells", "cleans", "opens",
]
VERBS_I = [
    "sleeps", "runs", "sings", "waits", "smiles", "jumps", "swims", "dances",
    "falls", "laughs",
]
PREPS = ["near", "behind", "under", "above", "beside", "inside", "across", "with"]
ADVS = ["today", "again", "slowly", "quickly", "quietly", "often", "now", "there"]
END = "."

NUM_STYLES = 3
MIN_WORDS = 4
MAX_WORDS = 15

WORD_CLASS: Dict[str, str] = {}
for _cls, _words in (
    ("DET", DETS), ("ADJ", ADJS), ("NOUN", NOUNS), ("VT", VERBS_T),
    ("VI", VERBS_I), ("PREP", PREPS), ("ADV", ADVS),
):
    for _w in _words:
        assert _w not in WORD_CLASS, _w
        WORD_CLASS[_w] = _cls
del _cls, _words, _w

# -- target lexicon -----------------------------------------------------------

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
           "sch", "kr", "tr", "st", "pl", "br", "h", "w"]
_VOWELS = ["a", "e", "i", "o", "u", "ei", "au", "ie"]
_CODAS = ["", "", "", "n", "r", "l", "s", "t", "ch", "m"]
_LEXICON_SEED = 20240601  # fixed: the lexicon never depends on the corpus seed


def _build_lexicon() -> Dict[str, Tuple[str, ...]]:
    rng = random.Random(_LEXICON_SEED)
    used = set(WORD_CLASS) | {END}
    lexicon: Dict[str, Tuple[str, ...]] = {}
    for src in sorted(WORD_CLASS):
        forms = []
        n_syll = 1 if WORD_CLASS[src] in ("DET", "PREP") else 2
        while len(forms) < NUM_STYLES:
            syllables = n_syll + rng.randint(0, 1)
            word = "".join(
                rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                for _ in range(syllables)
            )
            if word in used:
                continue
            used.add(word)
            forms.append(word)
        lexicon[src] = tuple(forms)
    return lexicon


LEXICON: Dict[str, Tuple[str, ...]] = _build_lexicon()
# target form -> (source word, style)
REVERSE_LEXICON: Dict[str, Tuple[str, int]] = {
    form: (src, style)
    for src, forms in LEXICON.items()
    for style, form in enumerate(forms)
}

# -- sentence structure -------------------------------------------------------


class Sentence(NamedTuple):
    """A parsed source sentence; every noun phrase is (det, adjs, noun)."""

    subj: Tuple[str, Tuple[str, ...], str]
    verb: str
    obj: Optional[Tuple[str, Tuple[str, ...], str]]
    pps: Tuple[Tuple[str, Tuple[str, Tuple[str, ...], str]], ...]
    adv: Optional[str]


def _np_words(np, adj_after: bool) -> List[str]:
    det, adjs, noun = np
    if adj_after:
        return [det, noun, *adjs]
    return [det, *adjs, noun]


def _ordered_words(sent: Sentence, adj_after: bool, verb_final: bool) -> List[str]:
    words = _np_words(sent.subj, adj_after)
    if not verb_final:
        words.append(sent.verb)
    if sent.obj is not None:
        words += _np_words(sent.obj, adj_after)
    for prep, np in sent.pps:
        words.append(prep)
        words += _np_words(np, adj_after)
    if sent.adv is not None:
        words.append(sent.adv)
    if verb_final:
        words.append(sent.verb)
    words.append(END)
    return words


def source_string(sent: Sentence) -> str:
    return " ".join(_ordered_words(sent, adj_after=False, verb_final=False))


def target_string(sent: Sentence, style: int, adj_after: bool, verb_final: bool) -> str:
    words = _ordered_words(sent, adj_after, verb_final)
    return " ".join(w if w == END else LEXICON[w][style] for w in words)


def parse_source(src: str) -> Sentence:
    """Parse a source sentence; raises ValueError when it is not in the language."""
    toks = src.split()
    pos = 0

    def peek() -> Optional[str]:
        return WORD_CLASS.get(toks[pos], "END" if toks[pos] == END else "?") if pos < len(toks) else None

    def take(cls: str) -> str:
        nonlocal pos
        if peek() != cls:
            got = toks[pos] if pos < len(toks) else "end of sentence"
            raise ValueError(f"expected {cls} at token {pos}, got {got!r}: {src!r}")
        pos += 1
        return toks[pos - 1]

    def noun_phrase():
        det = take("DET")
        adjs = []
        while peek() == "ADJ":
            adjs.append(take("ADJ"))
        return det, tuple(adjs), take("NOUN")

    subj = noun_phrase()
    if peek() == "VT":
        verb = take("VT")
        obj = noun_phrase()
    else:
        verb = take("VI")
        obj = None
    pps = []
    while peek() == "PREP":
        prep = take("PREP")
        pps.append((prep, noun_phrase()))
    adv = take("ADV") if peek() == "ADV" else None
    take("END")
    if pos != len(toks):
        raise ValueError(f"trailing tokens after '.': {src!r}")
    return Sentence(subj, verb, obj, tuple(pps), adv)


def valid_targets(src: str) -> FrozenSet[str]:
    """All valid translations (as space-joined strings) of a source sentence."""
    sent = parse_source(src)
    return frozenset(
        target_string(sent, style, adj_after, verb_final)
        for style, adj_after, verb_final in itertools.product(
            range(NUM_STYLES), (False, True), (False, True)
        )
    )


def analyse_translation(src: str, tgt: str) -> Optional[Tuple[int, bool, bool]]:
    """The modes (style, adj_after, verb_final) of a valid translation, or None.

    When the sentence makes a flag irrelevant (no adjective, nothing between the
    verb and "."), the first matching combination (flag False) is returned.
    """
    sent = parse_source(src)
    tgt_norm = " ".join(tgt.split())
    for style, adj_after, verb_final in itertools.product(
        range(NUM_STYLES), (False, True), (False, True)
    ):
        if target_string(sent, style, adj_after, verb_final) == tgt_norm:
            return style, adj_after, verb_final
    return None


def is_valid_translation(src: str, tgt: str) -> bool:
    """True when ``tgt`` is one of the valid translations of ``src``."""
    try:
        return analyse_translation(src, tgt) is not None
    except ValueError:
        return False


# -- sampling -----------------------------------------------------------------


def _sample_np(rng: random.Random):
    n_adj = rng.choices((0, 1, 2), weights=(0.4, 0.4, 0.2))[0]
    return rng.choice(DETS), tuple(rng.choice(ADJS) for _ in range(n_adj)), rng.choice(NOUNS)


def sample_sentence(rng: random.Random) -> Sentence:
    """Draw one source sentence of MIN_WORDS..MAX_WORDS words (without ".")."""
    while True:
        subj = _sample_np(rng)
        if rng.random() < 0.6:
            verb, obj = rng.choice(VERBS_T), _sample_np(rng)
        else:
            verb, obj = rng.choice(VERBS_I), None
        n_pp = rng.choices((0, 1, 2), weights=(0.5, 0.35, 0.15))[0]
        pps = tuple((rng.choice(PREPS), _sample_np(rng)) for _ in range(n_pp))
        adv = rng.choice(ADVS) if rng.random() < 0.3 else None
        sent = Sentence(subj, verb, obj, pps, adv)
        n_words = len(_ordered_words(sent, False, False)) - 1
        if MIN_WORDS <= n_words <= MAX_WORDS:
            return sent


def sample_translation(
    sent: Sentence, rng: random.Random, reorder_prob: float = 0.5, styles: int = NUM_STYLES
) -> str:
    style = rng.randrange(styles)
    adj_after = rng.random() < reorder_prob
    verb_final = rng.random() < reorder_prob
    return target_string(sent, style, adj_after, verb_final)


SPLITS = ("train", "valid", "test")


def generate_corpus(
    seed: int = 1,
    sizes: Optional[Dict[str, int]] = None,
    repeat_frac: float = 0.1,
    pool_size: int = 200,
    reorder_prob: float = 0.5,
    styles: int = NUM_STYLES,
) -> Dict[str, List[Tuple[str, str]]]:
    """Return {split: [(src, tgt), ...]} for the train, valid and test splits."""
    if sizes is None:
        sizes = {"train": 20000, "valid": 500, "test": 500}
    if not 1 <= styles <= NUM_STYLES:
        raise ValueError(f"styles must be in 1..{NUM_STYLES}")
    pool_rng = random.Random(f"synthetic-corpus:{seed}:pool")
    pool = [sample_sentence(pool_rng) for _ in range(pool_size)]
    corpus = {}
    for split in SPLITS:
        rng = random.Random(f"synthetic-corpus:{seed}:{split}")
        pairs = []
        for _ in range(sizes.get(split, 0)):
            if split == "train" and pool and rng.random() < repeat_frac:
                sent = pool[rng.randrange(len(pool))]
            else:
                sent = sample_sentence(rng)
            pairs.append((source_string(sent), sample_translation(sent, rng, reorder_prob, styles)))
        corpus[split] = pairs
    return corpus


def write_corpus(out_dir: str, corpus: Dict[str, Sequence[Tuple[str, str]]]) -> None:
    os.makedirs(out_dir, exist_ok=True)
    for split, pairs in corpus.items():
        for side, idx in (("src", 0), ("tgt", 1)):
            path = os.path.join(out_dir, f"{split}.{side}")
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8", newline="\n") as f:
                for pair in pairs:
                    f.write(pair[idx] + "\n")
            os.replace(tmp, path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_nat_ext.data.synthetic_corpus",
        description="Write a deterministic multi-modal synthetic translation corpus "
        "to OUT/{train,valid,test}.{src,tgt}.",
    )
    parser.add_argument("out_dir", nargs="?", metavar="OUT", help="output directory (or --out)")
    parser.add_argument("--out", help="output directory (the same as OUT)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--train", type=int, default=20000, help="train sentences")
    parser.add_argument("--valid", type=int, default=500, help="valid sentences")
    parser.add_argument("--test", type=int, default=500, help="test sentences")
    parser.add_argument("--repeat-frac", type=float, default=0.1,
                        help="fraction of train sources drawn from a fixed pool (repeated sources)")
    parser.add_argument("--pool-size", type=int, default=200)
    parser.add_argument("--reorder-prob", type=float, default=0.5,
                        help="probability of each reordering (adjective after noun, verb final)")
    parser.add_argument("--styles", type=int, default=NUM_STYLES,
                        help=f"number of lexical styles used (1..{NUM_STYLES})")
    args = parser.parse_args(argv)
    if (args.out is None) == (args.out_dir is None):
        parser.error("give the output directory once: OUT or --out OUT")
    args.out = args.out or args.out_dir
    for name in ("train", "valid", "test", "pool_size"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    try:
        corpus = generate_corpus(
            seed=args.seed,
            sizes={"train": args.train, "valid": args.valid, "test": args.test},
            repeat_frac=args.repeat_frac,
            pool_size=args.pool_size,
            reorder_prob=args.reorder_prob,
            styles=args.styles,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    write_corpus(args.out, corpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
