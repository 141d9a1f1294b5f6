"""Speed and memory of one self-attention layer, forward + backward, per variant and length.

    python -m benchmarks.attention_speed --out benchmarks/results/attention_speed.json \\
        [--n 512 1024 2048 4096 8192 16384] [--variants full full_explicit local ...] [--peers [NAME ...]] \\
        [--threads 2] [--device cpu|cuda] [--timeout 900] [--mem-limit-gb 20] [--update] [--rounds 2]

Shapes (issue defaults): batch 1, 8 heads of dimension 64 (model dim 512), fp32.  Each (variant, N)
runs in a FRESH subprocess: it warms up at N=256, records its RSS, runs one timed forward+backward at
N (``peak_mem_mb`` = peak RSS minus that RSS; on CUDA the allocator's peak), then repeats the timed
call while the total stays under a few seconds, at least 3 calls in all (the first call at N also pays
for fresh pages: with 2 calls the median was their mean), and reports the median ``fwd_bwd_ms``.  A run that
cannot allocate (address-space limit ``--mem-limit-gb``, CUDA OOM) or is killed gets ``"oom": true``.

Variant settings (the issue's): window 256; strided at its defaults (stride and band radius ceil(sqrt(N))); 16 global tokens plus window
256; bigbird blocks of 64 with 3 window, 2 global and 3 random blocks; linformer k=256; compressed
kernel = stride = 4; linear with elu and with performer (256 features); lsh bucket 64 with 4 rounds;
routing sqrt(N) clusters; sinkhorn blocks of 64.  Peer packages (``--peers``) are timed with the
same shapes through small adapters in ``attention_peers.py`` when they are installed.
"""

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

from . import repo_env

DEFAULT_N = [512, 1024, 2048, 4096, 8192, 16384]
HEADS, HEAD_DIM = 8, 64
MIN_CALLS = 3  # timed calls per (variant, N) at least; their median is the row's fwd_bwd_ms

# (row variant name, registry name, options) -- options as recorded in the JSON
VARIANTS = {
    "full": ("full", {}),
    "full_explicit": ("full_explicit", {}),
    "local": ("local", {"attention_window": 256}),
    "strided": ("strided", {"attention_stride": 0, "strided_window": -1}),  # defaults: l = ceil(sqrt(N)), band l
    "global": ("global", {"global_tokens": 16, "attention_window": 256}),
    "bigbird": ("bigbird", {"block_size": 64, "bigbird_window_blocks": 3, "bigbird_global_blocks": 2,
                            "bigbird_random_blocks": 3}),
    "linformer": ("linformer", {"linformer_k": 256}),
    "compressed": ("compressed", {"compress_kernel": 4}),
    "linear_elu": ("linear", {"feature_map": "elu"}),
    "linear_performer": ("linear", {"feature_map": "performer", "performer_features": 256}),
    "lsh": ("lsh", {"lsh_bucket_size": 64, "lsh_rounds": 4}),
    "routing": ("routing", {"routing_clusters": "sqrt(N)"}),
    "sinkhorn": ("sinkhorn", {"block_size": 64}),
    "synthesizer_dense": ("synthesizer_dense", {}),
    "synthesizer_random": ("synthesizer_random", {}),
}


def _rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def build_layer(variant, n, device):
    """(layer callable x -> out, options dict) for one of our variants at length n."""
    import torch

    from fairseq_nat_ext.modules.attention import AttentionOptions, EfficientSelfAttention

    name, options = VARIANTS[variant]
    opts = dict(options)
    if opts.get("routing_clusters") == "sqrt(N)":
        opts["routing_clusters"] = int(math.ceil(math.sqrt(n)))
    layer = EfficientSelfAttention(HEADS * HEAD_DIM, HEADS, [(name, HEADS)],
                                   AttentionOptions(max_positions=max(n, 256), **opts)).to(device)
    return (lambda x: layer(x, x, x)[0]), options


def child(variant, n, device, threads, mem_limit_gb):
    """Runs in its own process; prints one JSON row."""
    import torch

    torch.set_num_threads(threads)
    if device == "cpu" and mem_limit_gb:
        limit = int(mem_limit_gb * 1024 ** 3)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    impl = "ours"
    if variant.startswith("peer:"):
        from benchmarks.attention_peers import build_peer

        impl, (fn, options, variant) = variant, build_peer(variant.split(":", 1)[1], n, HEADS, HEAD_DIM, device)
        make = lambda m: fn if m == n else build_peer(impl.split(":", 1)[1], m, HEADS, HEAD_DIM, device)[0]  # noqa: E731
    else:
        fn, options = build_layer(variant, n, device)
        make = lambda m: fn if m == n else build_layer(variant, m, device)[0]  # noqa: E731
    row = {"variant": variant, "impl": impl, "options": options, "n": n, "device": device,
           "fwd_bwd_ms": None, "peak_mem_mb": None, "oom": False}

    def once(f, m):
        x = torch.randn(m, 1, HEADS * HEAD_DIM, device=device, requires_grad=True)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        f(x).sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1000.0

    try:
        once(make(256), 256)  # warm-up at a small length: kernels, allocator, lazy imports
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        else:
            base = _rss_mb()
        times = [once(fn, n)]
        if device == "cuda":
            row["peak_mem_mb"] = round((torch.cuda.max_memory_allocated() - base) / 2 ** 20, 1)
        else:
            row["peak_mem_mb"] = round(max(_peak_rss_mb() - base, 0.0), 1)
        while (sum(times) < 3000 or len(times) < MIN_CALLS) and len(times) < 10:
            times.append(once(fn, n))
        row["fwd_bwd_ms"] = round(statistics.median(times), 2)
    except (MemoryError, RuntimeError) as err:
        text = str(err).lower()
        if isinstance(err, MemoryError) or "out of memory" in text or "allocate" in text:
            row["oom"] = True
        else:
            raise
    print(json.dumps(row))


def run_one(variant, n, args):
    cmd = [sys.executable, "-m", "benchmarks.attention_speed", "--child", variant, str(n),
           "--device", args.device, "--threads", str(args.threads), "--mem-limit-gb", str(args.mem_limit_gb)]
    env = repo_env(dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"variant": variant, "impl": "ours", "options": {}, "n": n, "device": args.device,
                "fwd_bwd_ms": None, "peak_mem_mb": None, "oom": False, "timeout_s": args.timeout}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    if proc.returncode < 0 or "MemoryError" in proc.stderr or "allocate" in proc.stderr:
        name = variant.split(":", 1)[-1]
        return {"variant": name, "impl": "ours" if ":" not in variant else variant, "options": {},
                "n": n, "device": args.device, "fwd_bwd_ms": None, "peak_mem_mb": None, "oom": True}
    raise RuntimeError(f"attention_speed child {variant} N={n} failed:\n{proc.stderr[-3000:]}")


def combine_rounds(runs):
    """One row from the rows of several passes over the same (variant, N): the median time and peak memory
    of the passes that ran, ``round_ms`` the passes' own times; out of memory if any pass ran out (a row
    that runs out of memory now and then is not one to rely on); one pass: its row unchanged."""
    if len(runs) == 1:
        return runs[0]
    ok = [r for r in runs if r["fwd_bwd_ms"] is not None]
    row = dict(ok[0] if ok else runs[0])  # a timed-out pass's row lacks the options
    row["round_ms"] = [r["fwd_bwd_ms"] for r in runs]
    row["oom"] = any(r["oom"] for r in runs)
    if row["oom"] or not ok:
        row["fwd_bwd_ms"] = row["peak_mem_mb"] = None
    else:
        row["fwd_bwd_ms"] = round(statistics.median(r["fwd_bwd_ms"] for r in ok), 2)
        row["peak_mem_mb"] = round(statistics.median(r["peak_mem_mb"] for r in ok), 1)
    row.pop("timeout_s", None)
    if not ok and not row["oom"]:  # every pass ran past --timeout
        row["timeout_s"] = runs[0].get("timeout_s")
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out")
    p.add_argument("--n", type=int, nargs="+", default=DEFAULT_N)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--peers", nargs="*", metavar="NAME",
                   help="also time the installed peer packages (all of them, or only those named, e.g. "
                        "routing-transformer)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--timeout", type=int, default=900, help="seconds per (variant, N) subprocess")
    p.add_argument("--mem-limit-gb", type=float, default=20.0)
    p.add_argument("--update", action="store_true",
                   help="keep the other rows of --out and replace only the (impl, variant, n) measured now; "
                        "the file's command then lists every run")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure every (variant, N) this many times, in whole passes one after the other, and "
                        "report the median of the passes (each row keeps the passes' times in round_ms): this "
                        "machine's speed drifts by 10-30%% within minutes, and a ratio of two rows measured "
                        "minutes apart drifts with it")
    p.add_argument("--child", nargs=2, metavar=("VARIANT", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]), args.device, args.threads, args.mem_limit_gb)
        return 0
    if not args.out:
        p.error("--out is required")
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown} (known: {', '.join(VARIANTS)})")
    jobs = list(args.variants)
    if args.peers is not None:
        from benchmarks.attention_peers import PEERS, available_peers

        wrong = [name for name in args.peers if name not in PEERS]
        if wrong:
            p.error(f"unknown peers {wrong} (known: {', '.join(PEERS)})")
        jobs += [f"peer:{name}" for name in available_peers() if not args.peers or name in args.peers]
    from fairseq_nat_ext.evaluation.provenance import hardware_description, portable_command

    by_job = {}
    for r in range(args.rounds):  # whole passes one after the other: a slow spell of the machine hits every row
        for variant in jobs:
            for n in args.n:
                row = run_one(variant, n, args)
                by_job.setdefault((variant, n), []).append(row)
                print(f"[attention_speed] round {r + 1}/{args.rounds} {row['impl']:>24} {row['variant']:>18} "
                      f"N={n:>6} {row['fwd_bwd_ms']} ms  {row['peak_mem_mb']} MB  oom={row['oom']}",
                      file=sys.stderr, flush=True)
    rows = [combine_rounds(runs) for runs in by_job.values()]
    command = "python -m benchmarks.attention_speed " + portable_command(
        argv if argv is not None else sys.argv[1:])
    if args.update and os.path.exists(args.out):
        with open(args.out) as f:
            old = json.load(f)
        if old.get("threads") != args.threads or old.get("hardware") != hardware_description(args.device):
            p.error(f"--update: {args.out} was measured with other hardware/threads; measure it all again")
        new = {(r["impl"], r["variant"], r["n"]): r for r in rows}
        kept = [new.pop((r["impl"], r["variant"], r["n"]), r) for r in old["rows"]]  # in place, old order
        rows = kept + list(new.values())
        command = old["command"] + "; then " + command
    out = {"benchmark": "attention_speed", "hardware": hardware_description(args.device),
           "threads": args.threads, "command": command, "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"[attention_speed] wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
