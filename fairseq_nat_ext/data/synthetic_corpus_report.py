"""Share of valid translations per system on the synthetic corpus (a multi-modality metric).

    python -m fairseq_nat_ext.data.synthetic_corpus_report RAW_TEST_SRC RESULTS_JSON

For every row of the results file it reads the row's hypothesis file and counts the outputs that are
exactly one valid translation of their source (one synonym style, one adjective order, one verb
position: see :mod:`fairseq_nat_ext.data.synthetic_corpus`).  A NAT model that mixes modes fails this
check even when its BLEU looks fine.  Hypotheses are detokenised text, so they are re-tokenised first.
"""
import argparse
import json
import os

from sacremoses import MosesTokenizer

from .synthetic_corpus import is_valid_translation


def valid_rate(sources, hyps):
    if len(sources) != len(hyps):
        raise ValueError(f"{len(hyps)} hypotheses for {len(sources)} sources")
    tok = MosesTokenizer(lang="en")
    ok = sum(is_valid_translation(s, tok.tokenize(h, return_str=True, escape=False))
             for s, h in zip(sources, hyps))
    return ok / max(len(sources), 1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("test_src")
    p.add_argument("results")
    a = p.parse_args(argv)
    with open(a.test_src, encoding="utf-8") as f:
        sources = f.read().splitlines()
    with open(a.results, encoding="utf-8") as f:
        res = json.load(f)
    base = os.path.dirname(os.path.abspath(a.results))
    print("| system | decoding | distilled | valid translations |")
    print("| --- | --- | --- | --- |")
    for row in res["rows"]:
        hyp = row.get("hyp") or ""
        path = hyp if os.path.exists(hyp) else os.path.join(base, res["benchmark"], os.path.basename(hyp))
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            hyps = f.read().splitlines()
        print(f"| {row['system']} | {row['decoding']} | {row['distilled']} | "
              f"{valid_rate(sources, hyps):.3f} |")


if __name__ == "__main__":
    main()
