"""Choose ``--iter-decode-eos-penalty`` on the VALIDATION split (never the test split): decode it once per
penalty with fairseq-generate and keep the penalty with the highest BLEU.

An insertion model that ends its slots too early emits short hypotheses (BLEU's brevity penalty then
dominates); subtracting a penalty from the end-of-slot log-probability lengthens them.  The score is
fairseq-generate's own corpus BLEU4 on the tokenised, BPE-removed output (``--remove-bpe``): a
selection criterion, not the reported test score.

    python -m fairseq_nat_ext.evaluation.tune_eos_penalty DATA_BIN CKPT --penalties 0,0.5,1,2,3 \\
        [--subset valid] [--task kermit] [--src en --tgt de] [--iter 10] [--batch-size 128] \\
        [--threads 2] [--out FILE.json] [-- extra fairseq-generate options]

Prints one line per penalty and writes (with ``--out``) {"checkpoint", "data_bin", "subset", "src",
"tgt", "command", "rows": [{"eos_penalty", "bleu", "length_ratio"}], "best": penalty}.
"""
import argparse
import json
import os
import re
import subprocess
import sys

from ..compat import InputError

_BLEU_RE = re.compile(r"BLEU4? = ([0-9.]+),.*?ratio=([0-9.]+)")


def parse_bleu(text):
    """(bleu, length ratio) from fairseq-generate's final score line; InputError when it has none."""
    found = _BLEU_RE.findall(text)
    if not found:
        tail = text.strip().splitlines()[-1:] or ["(no output)"]
        raise InputError(f"tune_eos_penalty: fairseq-generate printed no BLEU line (last line: {tail[0]})")
    bleu, ratio = found[-1]
    return float(bleu), float(ratio)


def best_penalty(rows):
    """The penalty with the highest BLEU (the smallest penalty among equals)."""
    return max(rows, key=lambda r: (r["bleu"], -r["eos_penalty"]))["eos_penalty"]


def generate_command(args, penalty):
    return ["fairseq-generate", args.data_bin, "--user-dir", os.path.dirname(os.path.dirname(__file__)),
            "--task", args.task, "-s", args.src, "-t", args.tgt, "--path", args.checkpoint,
            "--gen-subset", args.subset, "--batch-size", str(args.batch_size),
            "--iter-decode-max-iter", str(args.iter), "--iter-decode-eos-penalty", str(penalty),
            "--remove-bpe", "--quiet", *args.extra]


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    given = list(argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data_bin")
    p.add_argument("checkpoint")
    p.add_argument("--penalties", default="0,0.5,1,2,3", help="comma-separated, each >= 0")
    p.add_argument("--subset", default="valid")
    p.add_argument("--task", default="kermit")
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de")
    p.add_argument("--iter", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out")
    args = p.parse_args(argv)
    args.extra = extra
    if args.subset == "test":
        raise InputError("tune_eos_penalty: --subset test would tune on the test split; use valid")
    try:
        penalties = [float(x) for x in args.penalties.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"tune_eos_penalty: --penalties must be numbers, got '{args.penalties}'") from None
    if not penalties or min(penalties) < 0:
        raise InputError(f"tune_eos_penalty: --penalties needs numbers >= 0, got '{args.penalties}'")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    rows = []
    for pen in penalties:
        cmd = generate_command(args, pen)
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if out.returncode != 0:
            raise InputError(f"tune_eos_penalty: fairseq-generate failed (exit {out.returncode}): "
                             f"{(out.stderr.strip().splitlines() or [''])[-1]}")
        bleu, ratio = parse_bleu(out.stdout + out.stderr)
        rows.append({"eos_penalty": pen, "bleu": bleu, "length_ratio": ratio})
        print(f"[tune_eos_penalty] {args.src}->{args.tgt} eos_penalty={pen:g}: BLEU4 {bleu:.2f}, "
              f"length ratio {ratio:.3f}", flush=True)
    best = best_penalty(rows)
    print(f"[tune_eos_penalty] best eos_penalty={best:g}", flush=True)
    if args.out:
        from .provenance import portable_command, portable_path

        record = {"checkpoint": portable_path(args.checkpoint), "data_bin": portable_path(args.data_bin),
                  "subset": args.subset, "src": args.src, "tgt": args.tgt,
                  "command": "python -m fairseq_nat_ext.evaluation.tune_eos_penalty " + portable_command(given),
                  "rows": rows, "best": best}
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
