"""Language identification of translation outputs: wrong-language and mixed-language rates.

    python -m fairseq_nat_ext.evaluation.language_id --langs en,de,fr --target de hyps.txt

prints, as JSON, the rates of one hypothesis file (plain or .gz, one sentence per line); the benchmark
harness (``python -m fairseq_nat_ext.evaluation.run --language-check en,de,fr``) writes the two rates
into every row of a results file.  The identifier is py3langid's Naive Bayes model (it ships its
model), restricted to the candidate languages ``langs`` on an instance of its own (py3langid's global
identifier is left alone), with normalised probabilities.

Per sentence (the detokenised text, one line):

* **unidentified**: the line has no letter (empty, or only digits and punctuation).  Such a line is
  neither wrong-language nor mixed, and it stays in the denominator of both rates (every rate is a
  share of *all* lines); ``unidentified`` counts them.
* **language**: the candidate language with the highest probability for the whole line.  The line is
  **wrong-language** when that language is not the target language (whatever its probability: among
  a few candidates a Multi30K caption of ~12 words is identified with ~100% accuracy; the references
  of test_2016_flickr en/de/fr are all identified correctly).
* **mixed**: every run of ``WINDOW`` (4) consecutive whitespace-separated words (sliding by one word)
  is identified on its own; a window is *confident* for language L when L's probability is at least
  ``THRESHOLD`` (0.9).  The line is mixed when confident windows name **at least two different
  candidate languages**, i.e. a stretch of >= 4 words is clearly in one language and another stretch
  of >= 4 words (the two may overlap) clearly in another.  This does not depend on the target: a line
  wholly in the wrong language is wrong-language but not mixed; a line mostly in the wrong language
  with a target-language stretch is both.  A line of at most 4 words has one window and is never
  mixed.  Calibration on Multi30K test_2016_flickr (1,000 captions in each of en, de, fr): 2 of the
  3,000 references are flagged mixed (0.07%), and 90% of 1,800 synthetic half/half sentences (the
  first half of a caption's words in one language, the second half of its translation in another; all
  six pairs) are flagged; the misses are mostly halves of 3 or fewer words.

``wrong_language_rate`` = wrong-language lines / lines, ``mixed_language_rate`` = mixed lines / lines
(fractions in [0, 1]; 0 for no line).
"""
import argparse
import json
import sys
from dataclasses import dataclass
from functools import lru_cache

WINDOW = 4
THRESHOLD = 0.9
PACKAGE = "py3langid"


def parse_langs(text):
    """``"en,de,fr"`` -> ``["en", "de", "fr"]``; ValueError (one line) unless two or more distinct codes."""
    langs = [lang.strip() for lang in str(text).split(",")]
    if any(not lang for lang in langs):
        raise ValueError(f"language list {text!r}: expected codes joined by commas, e.g. en,de,fr")
    if len(set(langs)) != len(langs):
        raise ValueError(f"language list {text!r}: a language is given twice")
    if len(langs) < 2:
        raise ValueError(f"language list {text!r}: give at least two candidate languages, e.g. en,de,fr")
    return langs


def _import_langid():
    try:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier
    except ImportError:
        raise ImportError(f"language identification needs the package {PACKAGE} "
                          f"(pip install {PACKAGE})") from None
    return LanguageIdentifier, MODEL_FILE


@lru_cache(maxsize=8)
def _identifier(langs):
    LanguageIdentifier, model_file = _import_langid()
    ident = LanguageIdentifier.from_model_file(model_file, norm_probs=True)
    try:
        ident.set_languages(list(langs))
    except ValueError:
        known = set(ident.nb_classes)
        unknown = sorted(set(langs) - known)
        raise ValueError(f"language(s) {', '.join(unknown)} unknown to {PACKAGE} "
                         "(it uses ISO 639-1 codes such as en, de, fr, cs)") from None
    return ident


def identifier(langs):
    """A py3langid ``LanguageIdentifier`` of its own, restricted to ``langs``, normalised probabilities
    (cached per language set)."""
    return _identifier(tuple(sorted(set(langs))))


def _has_letter(line):
    return any(ch.isalpha() for ch in line)


def identify(lines, langs):
    """``[(lang, probability), ...]``, one per line: the most probable language of ``langs``, or
    ``(None, 0.0)`` for a line without a letter."""
    ident = identifier(langs)
    out = []
    for line in lines:
        if _has_letter(line):
            lang, prob = ident.classify(line)
            out.append((lang, float(prob)))
        else:
            out.append((None, 0.0))
    return out


@dataclass(frozen=True)
class LineLanguage:
    """One line's identification: ``lang`` None when unidentified; ``window_langs``: the languages for
    which some window of the line is confident (sorted)."""
    lang: object
    prob: float
    window_langs: tuple

    @property
    def mixed(self):
        return len(self.window_langs) >= 2


def analyse(lines, langs, window=WINDOW, threshold=THRESHOLD):
    """One :class:`LineLanguage` per line (see the module's rules)."""
    if window < 1 or not 0.0 < threshold <= 1.0:
        raise ValueError("window must be >= 1 and threshold in (0, 1]")
    ident = identifier(langs)
    cache = {}  # window text -> (lang, prob): NAT outputs and captions repeat n-grams

    def classify(text):
        if text not in cache:
            lang, prob = ident.classify(text)
            cache[text] = (lang, float(prob))
        return cache[text]

    out = []
    for (lang, prob), line in zip(identify(lines, langs), lines):
        if lang is None:
            out.append(LineLanguage(None, 0.0, ()))
            continue
        words = line.split()
        found = set()
        if len(words) > window:  # a single window is the whole line: nothing to compare
            for i in range(len(words) - window + 1):
                text = " ".join(words[i:i + window])
                if not _has_letter(text):
                    continue
                w_lang, w_prob = classify(text)
                if w_prob >= threshold:
                    found.add(w_lang)
        out.append(LineLanguage(lang, prob, tuple(sorted(found))))
    return out


def language_rates(lines, target_lang, langs, window=WINDOW, threshold=THRESHOLD):
    """Rates and counts over ``lines`` (detokenised sentences) for the target ``target_lang`` among the
    candidates ``langs``::

        {"sentences": n, "unidentified": int, "wrong_language": int, "mixed_language": int,
         "wrong_language_rate": float, "mixed_language_rate": float, "languages": {lang: count}}

    ``languages`` counts the lines identified as each candidate (unidentified lines under none)."""
    langs = list(langs)
    if target_lang not in langs:
        raise ValueError(f"target language {target_lang!r} is not among the candidates {','.join(langs)}")
    return _rates(analyse(list(lines), langs, window, threshold), target_lang, langs)


def _rates(result, target_lang, langs):
    n = len(result)
    wrong = sum(1 for r in result if r.lang is not None and r.lang != target_lang)
    mixed = sum(1 for r in result if r.mixed)
    languages = {lang: sum(1 for r in result if r.lang == lang) for lang in langs}
    return {
        "sentences": n,
        "unidentified": sum(1 for r in result if r.lang is None),
        "wrong_language": wrong,
        "mixed_language": mixed,
        "wrong_language_rate": wrong / n if n else 0.0,
        "mixed_language_rate": mixed / n if n else 0.0,
        "languages": languages,
    }


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m fairseq_nat_ext.evaluation.language_id",
        description="Wrong-language and mixed-language rates of a file of detokenised sentences "
                    "(printed as JSON).")
    p.add_argument("file", help="one sentence per line (plain or .gz)")
    p.add_argument("--langs", required=True, help="candidate languages, e.g. en,de,fr")
    p.add_argument("--target", required=True, help="the language the lines should be in")
    p.add_argument("--flagged", action="store_true",
                   help="also list the wrong-language, mixed and unidentified lines (1-based line numbers)")
    args = p.parse_args(argv)
    try:
        langs = parse_langs(args.langs)
        if args.target not in langs:
            raise ValueError(f"--target {args.target} is not in --langs {args.langs}")
        from .scoring import read_lines

        lines = read_lines(args.file)
        result = analyse(lines, langs)
        rates = _rates(result, args.target, langs)
        if args.flagged:
            rates["flagged"] = [
                {"line": i + 1, "lang": r.lang, "prob": round(r.prob, 4), "window_langs": list(r.window_langs),
                 "text": line}
                for i, (r, line) in enumerate(zip(result, lines))
                if r.lang is None or r.lang != args.target or r.mixed
            ]
    except (OSError, ValueError, ImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    json.dump(rates, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
