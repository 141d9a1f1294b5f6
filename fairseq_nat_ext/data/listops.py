"""ListOps (Nangia & Bowman 2018) as specified by Long Range Arena (Tay et al. 2021), with brackets kept.

    python -m fairseq_nat_ext.data.listops --out DIR [--train 96000 --valid 2000 --test 2000]
        [--min-length 500 --max-length 2000] [--seed 1]

Trees follow LRA's generator: at depth < 10 a node is a leaf digit (0-9) with probability 0.75
(r > 0.25), otherwise an operator MAX / MIN / MED (median, truncated to int) / SM (sum mod 10) over
2..10 arguments; at depth 10 every node is a leaf.  Sequences are written as tokens, operators with
their opening bracket (``[MAX``) and a closing ``]`` token:

    [MAX 2 9 [MIN 4 7 ] 0 ]        -> label 9

LRA's published input pipeline lost the brackets when tokenising, which makes the task ambiguous;
here they stay (``--no-brackets`` writes the ablation without them: ``MAX 2 9 MIN 4 7 0``).
Only sequences whose token count lies in [min_length, max_length] are kept (rejection sampling),
duplicates are dropped across all splits, and the seed fixes everything.  Files:
``{split}.src`` (one sequence per line) and ``{split}.label`` (the value 0-9).
"""

import argparse
import os
import random
import sys
from typing import List, Tuple, Union

OPERATORS = ("MAX", "MIN", "MED", "SM")
MAX_DEPTH = 10
MAX_ARGS = 10
VALUE_P = 0.25  # LRA: a node is a leaf when random() > VALUE_P

Tree = Union[int, Tuple[str, list]]


def generate_tree(rng: random.Random, depth: int = 1) -> Tuple[Tree, int]:
    """(tree, token count) following LRA's generate_tree."""
    r = rng.random() if depth < MAX_DEPTH else 1.0
    if r > VALUE_P:
        return rng.randrange(10), 1
    n_args = rng.randint(2, MAX_ARGS)
    args, length = [], 2  # operator token + closing bracket
    for _ in range(n_args):
        sub, sub_len = generate_tree(rng, depth + 1)
        args.append(sub)
        length += sub_len
    return (rng.choice(OPERATORS), args), length


def evaluate(tree: Tree) -> int:
    if isinstance(tree, int):
        return tree
    op, args = tree
    values = [evaluate(a) for a in args]
    if op == "MAX":
        return max(values)
    if op == "MIN":
        return min(values)
    if op == "SM":
        return sum(values) % 10
    values.sort()  # MED: numpy's median truncated to int, as LRA does
    n = len(values)
    return values[n // 2] if n % 2 else int((values[n // 2 - 1] + values[n // 2]) / 2)


def to_tokens(tree: Tree, brackets: bool = True) -> List[str]:
    if isinstance(tree, int):
        return [str(tree)]
    op, args = tree
    out = ["[" + op if brackets else op]
    for a in args:
        out.extend(to_tokens(a, brackets))
    if brackets:
        out.append("]")
    return out


def generate(n_total: int, min_length: int, max_length: int, seed: int, max_tries: int = 50_000_000):
    """Yield n_total distinct (tokens, label) pairs with min_length <= len(tokens) <= max_length."""
    rng = random.Random(seed)
    seen = set()
    tries = 0
    while len(seen) < n_total:
        tries += 1
        if tries > max_tries:
            raise RuntimeError(f"listops: only {len(seen)} of {n_total} sequences of {min_length}-{max_length} "
                               f"tokens after {max_tries} trees; widen the length range")
        tree, length = generate_tree(rng)
        if not (min_length <= length <= max_length):
            continue
        tokens = tuple(to_tokens(tree))
        if tokens in seen:
            continue
        seen.add(tokens)
        yield tree, evaluate(tree)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--train", type=int, default=96000)
    p.add_argument("--valid", type=int, default=2000)
    p.add_argument("--test", type=int, default=2000)
    p.add_argument("--min-length", type=int, default=500)
    p.add_argument("--max-length", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-brackets", action="store_true", help="ablation: drop the bracket tokens")
    a = p.parse_args(argv)
    if a.min_length > a.max_length:
        p.error(f"--min-length {a.min_length} > --max-length {a.max_length}")
    os.makedirs(a.out, exist_ok=True)
    splits = [("train", a.train), ("valid", a.valid), ("test", a.test)]
    items = generate(sum(n for _, n in splits), a.min_length, a.max_length, a.seed)
    for split, n in splits:
        with open(os.path.join(a.out, f"{split}.src"), "w") as fs, open(os.path.join(a.out, f"{split}.label"), "w") as fl:
            for _ in range(n):
                tree, label = next(items)
                fs.write(" ".join(to_tokens(tree, brackets=not a.no_brackets)) + "\n")
                fl.write(f"{label}\n")
        print(f"[listops] {split}: {n} sequences -> {a.out}/{split}.src", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
