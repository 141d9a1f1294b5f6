"""Write fertility files (``fairseq_nat_ext/data/fertility.py``) for the splits of a fairseq data-bin.

    python -m fairseq_nat_ext.data.make_fertility --data-bin DATA_BIN --out DIR --method aligner
    python -m fairseq_nat_ext.data.make_fertility --data-bin DATA_BIN --out DIR --method attention \\
        --teacher teacher.pt

* ``aligner``: the BPE-removed lines of the splits written (train and valid) are aligned together by
  eflomal (``pip install eflomal``; its forward links: every target word linked to at most one source
  word), or the
  Pharaoh files given by ``--alignments SPLIT=FILE`` are read instead; the word links are projected
  onto BPE pieces by ``oracles.fertility.bpe_fertility`` (rule in its module doc).
* ``attention``: one teacher-forced pass of the AT teacher (a fairseq checkpoint sharing the data-bin's
  dictionary) over every split; for every target content token the source token with the largest
  cross-attention weight (``--alignment-layer``, default the last layer, averaged over heads; ``</s>``
  excluded) gets one unit of fertility (``oracles.fertility.fertility_from_attention``).

The data-bin's own lines are used (for a distilled data-bin: the distilled targets), in its order.
Writes ``DIR/{split}.fert`` for every split found among ``--splits`` (default train,valid) and
``DIR/method``.  Languages: ``-s/-t``, else the only language pair of the data-bin.

Test splits are refused (a split named ``test`` or ``test<anything>``, e.g. ``test1``; one-line
error): fertilities are training supervision, decoding needs none (``nat_translation`` loads a split
without its ``.fert`` file), and eflomal aligns the lines it is given jointly, so test references
among them would shape the training split's alignments (a test-set leak).
"""
import argparse
import glob
import logging
import os
import re
import sys
import tempfile

import numpy as np

from . import fertility as ff

logger = logging.getLogger("fairseq_nat_ext.make_fertility")


def infer_langs(data_bin, split="train"):
    pairs = set()
    for path in glob.glob(os.path.join(data_bin, f"{split}.*-*.*.idx")):
        m = re.match(rf"{re.escape(split)}\.([^.-]+)-([^.-]+)\.([^.]+)\.idx$", os.path.basename(path))
        if m:
            pairs.add((m.group(1), m.group(2)))
    if len(pairs) != 1:
        raise SystemExit(f"error: {data_bin}: cannot tell the language pair ({sorted(pairs) or 'none'}); "
                         "give -s and -t")
    return pairs.pop()


#: the default --splits: the splits whose fertilities training reads (never a test split)
DEFAULT_SPLITS = "train,valid"


def is_test_split(name):
    """Whether ``name`` is a test split (``test``, ``test1``, ``test_2016_flickr``, ...)."""
    return name.lower().startswith("test")


def load_split(data_bin, split, src, tgt):
    """-> (src_dict, tgt_dict, sources, targets): lists of id arrays without ``</s>``, or None when the
    split is not in the data-bin."""
    from fairseq.data import Dictionary, data_utils

    src_dict = Dictionary.load(os.path.join(data_bin, f"dict.{src}.txt"))
    tgt_dict = Dictionary.load(os.path.join(data_bin, f"dict.{tgt}.txt"))
    prefix = os.path.join(data_bin, f"{split}.{src}-{tgt}.")
    if not os.path.exists(prefix + src + ".idx"):
        return None
    out = []
    for lang, d in ((src, src_dict), (tgt, tgt_dict)):
        ds = data_utils.load_indexed_dataset(prefix + lang, d, dataset_impl=None)
        rows = []
        for i in range(len(ds)):
            t = ds[i].numpy()
            rows.append(t[:-1] if t.size and t[-1] == d.eos() else t)
        out.append(rows)
    return src_dict, tgt_dict, out[0], out[1]


def pieces(ids, d):
    return [d[int(i)] for i in ids]


def run_eflomal(src_lines, tgt_lines):
    """Word lines -> forward Pharaoh links (one string per line)."""
    try:
        import eflomal
    except ImportError:
        raise SystemExit("error: --method aligner needs eflomal (pip install eflomal==2.0.0), or give "
                         "--alignments") from None
    with tempfile.TemporaryDirectory() as tmp:
        fwd = os.path.join(tmp, "fwd")
        # eflomal cannot read empty lines: an empty side becomes one dummy word (links to it are dropped)
        s = [line if line else "<empty>" for line in src_lines]
        t = [line if line else "<empty>" for line in tgt_lines]
        eflomal.Aligner().align(s, t, links_filename_fwd=fwd, quiet=True)
        with open(fwd, encoding="utf-8") as f:
            links = [line.rstrip("\n") for line in f]
    if len(links) != len(src_lines):
        raise SystemExit(f"error: eflomal returned {len(links)} lines for {len(src_lines)} sentences")
    return links


def aligner_fertility(splits, alignment_files):
    """splits: {name: (src_dict, tgt_dict, sources, targets)} -> {name: rows}."""
    texts, links = {}, {}
    for name, (sd, td, S, T) in splits.items():
        texts[name] = ([pieces(s, sd) for s in S], [pieces(t, td) for t in T])
    for name, path in alignment_files.items():
        if name not in splits:
            raise SystemExit(f"error: --alignments {name}={path}: split {name} is not being written")
        with open(path, encoding="utf-8") as f:
            links[name] = [line.rstrip("\n") for line in f]
        if len(links[name]) != len(texts[name][0]):
            raise SystemExit(f"error: {path} has {len(links[name])} lines, split {name} has "
                             f"{len(texts[name][0])} sentences")
    from ..oracles.fertility import bpe_fertility, parse_pharaoh, word_piece_counts, words_from_pieces

    todo = [n for n in splits if n not in links]
    if todo:
        src_words, tgt_words = [], []
        for n in todo:
            src_words += [" ".join(words_from_pieces(p)) for p in texts[n][0]]
            tgt_words += [" ".join(words_from_pieces(p)) for p in texts[n][1]]
        leaked = [n for n in todo if is_test_split(n)]
        if leaked:  # main() refuses them; a caller of this function must not pass them either
            raise SystemExit(f"error: eflomal would align test split(s) {', '.join(leaked)} together with "
                             "the training lines (a test-set leak); fertilities are needed for train and valid only")
        logger.info("eflomal: aligning %d sentence pairs (%s)", len(src_words), ", ".join(todo))
        flat = run_eflomal(src_words, tgt_words)
        k = 0
        for n in todo:
            links[n] = flat[k: k + len(texts[n][0])]
            k += len(texts[n][0])
    out = {}
    for n in splits:
        rows = []
        for line_no, (sp, tp, ln) in enumerate(zip(texts[n][0], texts[n][1], links[n]), 1):
            try:
                pairs = parse_pharaoh(ln)
                ns, nt = len(word_piece_counts(sp)), len(word_piece_counts(tp))
                pairs = [(i, j) for i, j in pairs if i < ns and j < nt]  # "<empty>" dummies
                rows.append(bpe_fertility(pairs, sp, tp))
            except ValueError as err:
                raise SystemExit(f"error: split {n} line {line_no}: {err}") from None
        out[n] = rows
    return out


def token_batches(S, T, max_tokens):
    """Indices sorted by length, cut into batches of at most ``max_tokens`` padded tokens (one side)."""
    order = sorted(range(len(S)), key=lambda i: (len(S[i]), len(T[i])))
    batches, cur, width = [], [], 0
    for i in order:
        w = max(width, len(S[i]) + 1, len(T[i]) + 1)
        if cur and w * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur, w = [], max(len(S[i]), len(T[i])) + 1
        cur.append(i)
        width = w
    if cur:
        batches.append(cur)
    return batches


def attention_fertility(splits, teacher_path, data_bin, layer, max_tokens, use_cuda):
    import torch
    from fairseq import checkpoint_utils
    from fairseq.data import data_utils

    from ..compat import fairseq_mask_warning_silenced
    from ..oracles.fertility import fertility_from_attention

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([teacher_path], arg_overrides={"data": data_bin})
    teacher = models[0].eval()
    if use_cuda:
        teacher.cuda()
    device = next(teacher.parameters()).device
    tdict = task.target_dictionary
    out = {}
    for name, (sd, td, S, T) in splits.items():
        if tdict.symbols != td.symbols:
            raise SystemExit(f"error: --teacher {teacher_path}: its target dictionary differs from {data_bin}'s")
        pad, eos = td.pad(), td.eos()
        rows = [None] * len(S)

        def collate(seqs, **kw):
            return data_utils.collate_tokens([torch.from_numpy(np.append(x, eos)) for x in seqs], pad,
                                             eos, **kw).to(device)

        for ids in token_batches(S, T, max_tokens):
            src = collate([S[j] for j in ids], left_pad=True)
            tgt = collate([T[j] for j in ids])
            prev = collate([T[j] for j in ids], move_eos_to_beginning=True)
            with torch.no_grad(), fairseq_mask_warning_silenced():
                _, extra = teacher(src, src.ne(pad).sum(1), prev, alignment_layer=layer)
            src_mask = src.ne(pad) & src.ne(eos)
            fert = fertility_from_attention(extra["attn"][0], src_mask, tgt.ne(pad) & tgt.ne(eos))
            fert, src_mask = fert.cpu(), src_mask.cpu()
            for b, j in enumerate(ids):
                rows[j] = fert[b][src_mask[b]].numpy()
        out[name] = rows
        logger.info("attention: %s, %d sentences", name, len(S))
    return out


def build_parser():
    p = argparse.ArgumentParser(prog="python -m fairseq_nat_ext.data.make_fertility",
                                description="Write fertility files DIR/{split}.fert for a fairseq data-bin.")
    p.add_argument("--data-bin", required=True)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--method", required=True, choices=["aligner", "attention"])
    p.add_argument("-s", "--source-lang")
    p.add_argument("-t", "--target-lang")
    p.add_argument("--splits", default=DEFAULT_SPLITS,
                   help="comma-separated; missing ones are skipped; test splits are refused (decoding needs "
                        "no fertilities; eflomal would align the test references with the rest) (default "
                        f"{DEFAULT_SPLITS})")
    p.add_argument("--alignments", action="append", default=[], metavar="SPLIT=FILE",
                   help="aligner: word alignments (Pharaoh i-j) of a split instead of running eflomal")
    p.add_argument("--teacher", help="attention: the AT teacher checkpoint")
    p.add_argument("--alignment-layer", type=int, help="attention: decoder layer (default the last)")
    p.add_argument("--max-tokens", type=int, default=4096, help="attention: batch size in tokens")
    p.add_argument("--cpu", action="store_true", help="attention: do not use CUDA")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(format="[make_fertility] %(message)s", level=logging.INFO, stream=sys.stderr)
    if not os.path.isdir(args.data_bin):
        raise SystemExit(f"error: --data-bin {args.data_bin}: no such directory")
    src, tgt = args.source_lang, args.target_lang
    if not (src and tgt):
        src, tgt = infer_langs(args.data_bin)
    alignment_files = {}
    for item in args.alignments:
        name, sep, path = item.partition("=")
        if not sep or not os.path.isfile(path):
            raise SystemExit(f"error: --alignments {item}: expected SPLIT=FILE with an existing file")
        alignment_files[name] = path
    names = [x for x in args.splits.split(",") if x]
    tests = [x for x in names if is_test_split(x)]
    if tests:
        raise SystemExit(f"error: --splits {args.splits}: refusing test split(s) {', '.join(tests)}: fertilities "
                         "are training supervision (decoding needs none) and eflomal would align the test "
                         f"references together with the training lines; use --splits {DEFAULT_SPLITS}")
    splits = {}
    for name in names:
        loaded = load_split(args.data_bin, name, src, tgt)
        if loaded is not None:
            splits[name] = loaded
    if "train" not in splits and "train" in args.splits.split(","):
        raise SystemExit(f"error: {args.data_bin} has no train split for {src}-{tgt}")
    if args.method == "aligner":
        rows = aligner_fertility(splits, alignment_files)
        method = "aligner " + ("given alignments" if alignment_files else "eflomal forward links") + \
            f", BPE projection: spread, splits {','.join(splits)}"
    else:
        if not args.teacher or not os.path.isfile(args.teacher):
            raise SystemExit(f"error: --method attention needs --teacher CKPT (got {args.teacher})")
        import torch

        rows = attention_fertility(splits, args.teacher, args.data_bin, args.alignment_layer, args.max_tokens,
                                   use_cuda=torch.cuda.is_available() and not args.cpu)
        method = f"attention teacher {os.path.abspath(args.teacher)} layer {args.alignment_layer or 'last'}"
    os.makedirs(args.out, exist_ok=True)
    for name, (sd, td, S, T) in splits.items():
        fname = ff.fertility_file(args.out, name)
        try:
            ff.check_fertility(rows[name], [len(x) for x in S], [len(x) for x in T], fname)
        except ValueError as err:
            raise SystemExit(f"error: {err}") from None
        ff.write_fertility_file(fname, rows[name])
        logger.info("wrote %s (%d lines)", fname, len(S))
    ff.write_method(args.out, method)
    return 0


if __name__ == "__main__":
    sys.exit(main())
