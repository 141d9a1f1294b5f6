"""ListOps accuracy per attention variant, with one fixed training budget for every row.

    python -m benchmarks.attention_listops --data DIR --no-brackets-data DIR_NB \\
        --out benchmarks/results/attention_listops.json --work runs/listops \\
        [--variants full local ...] [--max-update 1500] [--threads 2]

For each variant: ``fairseq-train`` (task listops, arch efficient_classifier, the speed benchmark's
variant settings scaled to the data's length) for exactly ``--max-update`` updates, then
``fairseq-validate`` of the last checkpoint on the test split.  ``sec_per_update`` is fairseq's
train_wall summed over the epochs (validation excluded) divided by the updates.  Also: the majority-class
rate of the test split and a ``full`` row trained on the no-brackets ablation (``variant: "full"``, ``options: {"brackets": false}``).
Runs resume: a variant whose log shows the budget reached is not trained again (fairseq-train
would make one more update on a finished checkpoint), only re-validated.
"""

import argparse
import json
import os
import re
import subprocess
import sys
from collections import Counter

from fairseq_nat_ext.evaluation.provenance import hardware_description, portable_command, training_stats_from_log

from . import REPO

PLUGIN = os.path.join(REPO, "fairseq_nat_ext")

# variant -> fairseq options (CPU-sized: windows/blocks scaled to ListOps lengths of <= 2k)
SETTINGS = {
    "full": {},
    "local": {"attention_window": 64},
    "strided": {"attention_stride": 0, "strided_window": -1},  # defaults: l = ceil(sqrt(max positions)), band l
    "global": {"global_tokens": 16, "attention_window": 64},
    "bigbird": {"block_size": 32, "bigbird_window_blocks": 3, "bigbird_global_blocks": 1, "bigbird_random_blocks": 2},
    "linformer": {"linformer_k": 128},
    "compressed": {"compress_kernel": 4},
    "linear_elu": {"encoder_attention_type": "linear", "feature_map": "elu"},
    "linear_performer": {"encoder_attention_type": "linear", "feature_map": "performer", "performer_features": 128},
    "lsh": {"lsh_bucket_size": 32, "lsh_rounds": 2},
    "routing": {"routing_clusters": 16},
    "sinkhorn": {"block_size": 32},
    "synthesizer_dense": {},
    "synthesizer_random": {},
}


def flags(options):
    out = []
    for key, value in options.items():
        out += ["--" + key.replace("_", "-"), str(value)]
    return out


def majority_rate(data_dir, split="test"):
    with open(os.path.join(data_dir, f"{split}.label")) as f:
        labels = f.read().split()
    return Counter(labels).most_common(1)[0][1] / len(labels)


def max_length(data_dir):
    longest = 0
    for split in ("train", "valid", "test"):
        with open(os.path.join(data_dir, f"{split}.src")) as f:
            longest = max([longest] + [len(line.split()) for line in f])
    return longest


def _train_seconds(log):
    """Training time without validation: the sum over epochs of fairseq's per-epoch ``train_wall`` (each
    epoch-end "| train | epoch N |" line holds that epoch's own time; the last line alone covers only the
    last epoch).  A resumed run restores its meters from the checkpoint and logs the epoch it resumed in
    again, with the whole epoch's time: the last line of each epoch counts."""
    per_epoch = {}
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.search(r"\| train \| epoch (\d+) \|.*?train_wall[ =|]+([0-9.]+)", line)
            if m:
                per_epoch[int(m.group(1))] = float(m.group(2))
    return sum(per_epoch.values()) or None


def run_variant(name, options, data_dir, save_dir, args, max_pos):
    variant = options.get("encoder_attention_type", name)
    opts = {k: v for k, v in options.items() if k != "encoder_attention_type"}
    if getattr(args, "encoder_layers", None):  # a deeper classifier than the arch's 2 layers (in the row's options)
        opts["encoder_layers"] = args.encoder_layers
    common = [data_dir, "--user-dir", PLUGIN, "--task", "listops", "--criterion", "classification_cross_entropy",
              "--max-positions", str(max_pos), "--batch-size", str(args.batch_size), "--num-workers", "0"]
    log = os.path.join(save_dir, "train.log")
    os.makedirs(save_dir, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    train = ["fairseq-train"] + common + [
        "--arch", "efficient_classifier", "--encoder-attention-type", variant, "--optimizer", "adam",
        "--adam-betas", "(0.9,0.98)", "--lr", str(args.lr), "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", str(min(200, args.max_update // 5)), "--weight-decay", "0.01", "--clip-norm", "1.0",
        "--max-update", str(args.max_update), "--save-dir", save_dir, "--no-epoch-checkpoints",
        "--log-format", "simple", "--log-interval", "50", "--seed", "1"] + flags(opts)
    done = os.path.exists(os.path.join(save_dir, "checkpoint_last.pt")) and os.path.exists(log) \
        and (training_stats_from_log(log)[0] or 0) >= args.max_update
    if not done:  # fairseq-train on a finished checkpoint would still make one more update
        with open(log, "a") as f:
            subprocess.run(train, stdout=f, stderr=subprocess.STDOUT, env=env, check=True)
    proc = subprocess.run(["fairseq-validate"] + common + ["--path", os.path.join(save_dir, "checkpoint_last.pt"),
                                                           "--valid-subset", "test"],
                          capture_output=True, text=True, env=env, check=True)
    m = re.findall(r"accuracy[ =|]+([0-9.]+)", proc.stdout + proc.stderr)
    if not m:
        raise RuntimeError(f"no accuracy in fairseq-validate output for {name}:\n{proc.stderr[-2000:]}")
    updates, wall = training_stats_from_log(log)
    sec = _train_seconds(log)
    sec = sec / updates if sec and updates else (wall / updates if wall and updates else None)
    return {"variant": variant, "options": opts, "max_length": max_pos, "accuracy": float(m[-1]) / 100.0,
            "train_updates": updates, "sec_per_update": round(sec, 3) if sec else None}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--no-brackets-data", help="the same split written with --no-brackets")
    p.add_argument("--out", required=True)
    p.add_argument("--work", required=True, help="directory for checkpoints and logs")
    p.add_argument("--variants", nargs="+", default=list(SETTINGS))
    p.add_argument("--max-update", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--encoder-layers", type=int,
                   help="layers of every row's classifier (default: the efficient_classifier arch's 2); "
                        "recorded in each row's options")
    p.add_argument("--benchmark", default="attention_listops",
                   help="the results' benchmark name (a study apart from the main table, e.g. "
                        "attention_listops_brackets); must start with attention_listops")
    args = p.parse_args(argv)
    if not args.benchmark.startswith("attention_listops"):
        p.error(f"--benchmark {args.benchmark}: must start with attention_listops")
    max_pos = max_length(args.data) + 1  # + <s>
    majority = majority_rate(args.data)
    rows = []
    if os.path.exists(args.out):
        with open(args.out) as f:
            rows = json.load(f).get("rows", [])

    command = "python -m benchmarks.attention_listops " + portable_command(argv or sys.argv[1:])

    def upsert(row):
        row["hardware"] = hardware_description("cpu")
        row["command"] = command
        key = (row["variant"], json.dumps(row["options"], sort_keys=True))
        rows[:] = [r for r in rows if (r["variant"], json.dumps(r["options"], sort_keys=True)) != key] + [row]
        out = {"benchmark": args.benchmark, "threads": args.threads, "command": command,
               "hardware": "; ".join(dict.fromkeys(r.get("hardware", row["hardware"]) for r in rows)), "rows": rows}
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)

    for name in args.variants:
        row = run_variant(name, SETTINGS[name], args.data, os.path.join(args.work, name), args, max_pos)
        row["majority_rate"] = majority
        upsert(row)
        print(f"[attention_listops] {name}: accuracy {row['accuracy']:.3f} (majority {majority:.3f}), "
              f"{row['sec_per_update']} s/update", file=sys.stderr, flush=True)
    if args.no_brackets_data and "full" in args.variants:  # the ablation belongs to `full`
        row = run_variant("full", {}, args.no_brackets_data, os.path.join(args.work, "full_no_brackets"), args, max_pos)
        row["options"]["brackets"] = False
        row["majority_rate"] = majority_rate(args.no_brackets_data)
        upsert(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
