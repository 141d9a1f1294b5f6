"""One caption in every language of a multilingual KERMIT checkpoint (task ``kermit --lang-pairs``).

    python -m fairseq_nat_ext.generators.kermit_languages DATA_BIN CKPT [-n 5] [--temperature 1]
        [--given fr [--subset test]] [--iter 10] [--eos-penalty 0] [--seed 1] [--cuda]

* unconditional (no ``--given``): the first pair (a, b) of ``--lang-pairs`` is generated jointly from
  empty canvases (p(a, b), mode ``joint``, each slot sampling at ``--temperature``), then every other
  language c is translated from a (p(c | a), argmax);
* from one language (``--given L``): the first ``-n`` sentences of L in ``--subset`` of DATA_BIN are
  translated into every other language (p(t | L), argmax).

Simplification, stated: a KERMIT canvas holds two segments (``<s> x </s> y </s>``), so three languages
are not one joint draw p(a, b, c) but a joint pair followed by a conditional.  Output: one block per
caption, ``L: text`` per language (BPE removed, Moses-detokenised).
"""
import argparse
import sys

import torch
from fairseq.data import data_utils

from ..compat import InputError
from .kermit import KermitGenerator


def _text(task, tokens, lang):
    from sacremoses import MosesDetokenizer

    d = task.target_dictionary
    s = d.string(tokens[tokens.ne(d.eos())].cpu(), "@@ ")
    return MosesDetokenizer(lang=lang).detokenize(s.split())


def _generate(task, model, src, tgt, mode, rows, args):
    gen = KermitGenerator([model], task.target_dictionary, src, tgt, mode=mode, max_iter=args.iter,
                          eos_penalty=args.eos_penalty, x_lang=task.pair_of(src, tgt)[0],
                          temperature=args.temperature if mode == "joint" else 0.0)
    rows = rows.to(next(model.parameters()).device)
    return [h[0] for h in gen.generate([model], {"net_input": {"src_tokens": rows, "src_lengths": None}})]


def _check_directions(task, src, targets):
    """Every direction src -> t is a pair of the checkpoint's --lang-pairs (the task's one-line error
    otherwise), checked before anything is decoded."""
    for t in targets:
        task.pair_of(src, t)


def captions(data_bin, ckpt, n=5, given=None, subset="test", temperature=1.0, iters=10, eos_penalty=0.0,
             seed=1, cuda=False):
    """[{lang: text}] of ``n`` captions (see the module docstring)."""
    from ..evaluation.inference import load_system

    torch.manual_seed(seed)
    probe = load_system(ckpt, data_bin, None, None, use_cuda=cuda)  # the checkpoint's --lang-pairs
    pairs = getattr(probe.task, "pairs", None)
    if not pairs:
        raise InputError(f"{ckpt}: not a multilingual KERMIT checkpoint (task kermit with --lang-pairs)")
    langs = probe.task.langs
    model = probe.models[0]
    args = argparse.Namespace(iter=iters, eos_penalty=eos_penalty, temperature=temperature)
    d = probe.task.target_dictionary
    pad, eos = d.pad(), d.eos()
    out = [dict() for _ in range(n)]
    task = probe.task
    if given is None:
        a, b = pairs[0]  # a is segment x: the printed side is b, "other_side" a
        src_lang, todo = a, [c for c in langs if c not in (a, b)]
        _check_directions(task, src_lang, todo)
        hyps = _generate(task, model, a, b, "joint", torch.full((n, 1), eos, dtype=torch.long), args)
        first = [h["other_side"] for h in hyps]
        for i, h in enumerate(hyps):
            out[i][a], out[i][b] = _text(task, first[i], a), _text(task, h["tokens"], b)
        source = first
    else:
        if given not in langs:
            raise InputError(f"--given: '{given}' is not one of the checkpoint's languages {','.join(langs)}")
        src_lang, todo = given, [c for c in langs if c != given]
        _check_directions(task, src_lang, todo)
        k = next(i for i, (a, b) in enumerate(pairs) if given in (a, b))  # the first pair holding `given`
        task.load_dataset(subset)  # every pair, one part each, in --lang-pairs order
        part = task.dataset(subset).datasets[k]
        side = "source" if pairs[k][0] == given else "target"
        source = [part[i][side] for i in range(min(n, len(part)))]
        out = out[:len(source)]
        for i, s in enumerate(source):
            out[i][given] = _text(task, s, given)
    for c in todo:
        rows = data_utils.collate_tokens(source, pad)  # each ends with its </s>: right-padded rows
        hyps = _generate(task, model, src_lang, c, "translate", rows, args)
        for i, h in enumerate(hyps):
            out[i][c] = _text(task, h["tokens"], c)
    return [{lang: row[lang] for lang in langs} for row in out]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fairseq_nat_ext.generators.kermit_languages",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("data_bin")
    p.add_argument("ckpt")
    p.add_argument("-n", type=int, default=5, help="captions (default 5)")
    p.add_argument("--given", help="language of the given captions (default: unconditional)")
    p.add_argument("--subset", default="test")
    p.add_argument("--temperature", type=float, default=1.0, help="joint sampling temperature (0: argmax)")
    p.add_argument("--iter", type=int, default=10)
    p.add_argument("--eos-penalty", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cuda", action="store_true")
    a = p.parse_args(argv)
    try:
        rows = captions(a.data_bin, a.ckpt, a.n, a.given, a.subset, a.temperature, a.iter, a.eos_penalty, a.seed,
                        a.cuda)
    except InputError as err:
        sys.exit(f"error: {err}")
    for i, row in enumerate(rows):
        print(f"# caption {i + 1}")
        for lang, text in row.items():
            print(f"{lang}: {text}")
    return rows


if __name__ == "__main__":
    main()
