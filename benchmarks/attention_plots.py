"""Pictures for the attention study.

    python -m benchmarks.attention_plots patterns OUT.png [--n 64]
    python -m benchmarks.attention_plots curves SPEED.json OUT.png
    python -m benchmarks.attention_plots bubble SPEED.json LISTOPS.json OUT.png [--n 4096]

``patterns``: for every variant, which query (row) sees which key (column) on one random sequence of n
tokens with small settings (window 4, stride 8, 4 global tokens, blocks of 8, ...).  For lsh / routing
the sets come from the variant's own hashing / clustering of random queries (all rounds); for
sinkhorn the blocks with a sorted-block weight > 0.05; linformer, compressed, linear and the
synthesizers mix every key (drawn full).
``curves``: time and peak memory against N (log-log) for every variant and peer package.
``bubble``: the LRA-style chart, x = speed relative to ``full`` at length n, y = ListOps accuracy,
bubble area = peak memory at length n.
"""

import argparse
import json
import logging
import sys

import torch


def pattern_of(name, n, seed=0):
    from fairseq_nat_ext.modules.attention import AttentionOptions, build_attention

    opts = AttentionOptions(attention_window=4, attention_stride=8, strided_window=2, global_tokens=4,
                            block_size=8, bigbird_window_blocks=3, bigbird_global_blocks=1,
                            bigbird_random_blocks=1, lsh_bucket_size=8, lsh_rounds=2, routing_clusters=8,
                            max_positions=n)
    mod = build_attention(name, 1, 16, opts).eval()
    lengths = torch.tensor([n])
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, n, 16, generator=g), torch.randn(1, 1, n, 16, generator=g)
    if hasattr(mod, "pattern"):
        see = mod.pattern(lengths, n)
        return see[0, 0] if see.dim() == 4 else see[0]
    ranks = lambda order: torch.empty_like(order).scatter_(-1, order, torch.arange(n).expand_as(order).contiguous())  # noqa: E731
    if name == "lsh":
        see = torch.zeros(n, n, dtype=torch.bool)
        for rnd in range(opts.lsh_rounds):
            chunk = ranks(mod.sorted_order(q, lengths, rnd))[0, 0] // opts.lsh_bucket_size
            diff = chunk[:, None] - chunk[None, :]
            see |= (diff == 0) | (diff == 1) | (diff == -int(chunk.max()))  # chunk 0 looks back to the last one
        return see
    if name == "routing":  # query i sees key j when some centroid picked both
        iq, ik = mod.routes(q, k, lengths)  # (B, H, C, w) positions
        pick_q = torch.zeros(iq.size(2), n, dtype=torch.bool).scatter_(1, iq[0, 0].long(), True)
        pick_k = torch.zeros(ik.size(2), n, dtype=torch.bool).scatter_(1, ik[0, 0].long(), True)
        return (pick_q.float().t() @ pick_k.float()) > 0
    if name == "sinkhorn":
        P = mod.permutation(k, lengths)[0, 0]
        blocks = torch.eye(P.size(0), dtype=torch.bool) | (P > 0.05)
        bs = opts.block_size
        return blocks.repeat_interleave(bs, 0).repeat_interleave(bs, 1)[:n, :n]
    return torch.ones(n, n, dtype=torch.bool)


def draw_patterns(out, n=64):
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fairseq_nat_ext.modules.attention import ATTENTION_REGISTRY

    names = [x for x in sorted(ATTENTION_REGISTRY) if x != "full_explicit"]
    cols = 5
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3 * cols, 3 * rows))
    for ax in axes.flat:
        ax.axis("off")
    for ax, name in zip(axes.flat, names):
        see = pattern_of(name, n)
        ax.imshow(see.float().numpy(), cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(f"{name} ({see.float().mean():.0%} of pairs)", fontsize=9)
    fig.suptitle(f"which query (row) sees which key (column), n = {n}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def draw_bubble(speed_json, listops_json, out, n=4096):
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    speed = json.load(open(speed_json))["rows"]
    acc = json.load(open(listops_json))["rows"]
    at_n = {r["variant"]: r for r in speed if r["n"] == n and r["impl"] == "ours" and not r["oom"]}
    if "full" not in at_n:
        raise SystemExit(f"error: {speed_json} has no 'full' row at n={n}")
    base = at_n["full"]["fwd_bwd_ms"]
    fig, ax = plt.subplots(figsize=(7, 5))
    for row in acc:
        if row["options"].get("brackets") is False:
            continue
        name = row["variant"]
        if name == "linear":  # the speed study names linear attention by its feature map
            name = f"linear_{row['options'].get('feature_map', 'elu')}"
        s = at_n.get(name)
        if s is None:
            print(f"[attention_plots] {name}: no speed row at n={n}, not drawn", file=sys.stderr)
            continue
        x, y = base / s["fwd_bwd_ms"], 100 * row["accuracy"]
        ax.scatter([x], [y], s=max(20.0, s["peak_mem_mb"]), alpha=0.5)
        ax.annotate(name, (x, y), fontsize=8, ha="center")
    majority = [r["majority_rate"] for r in acc if r["options"].get("brackets") is not False]
    if majority:
        ax.axhline(100 * majority[0], color="grey", linestyle="--", linewidth=1, label="majority class")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel(f"speed relative to full (forward+backward, n = {n})")
    ax.set_ylabel("ListOps test accuracy (%)")
    ax.set_title("accuracy vs speed; bubble area = peak memory")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def draw_curves(speed_json, out):
    """Time and peak memory against N (log-log), one line per (impl, variant); OOM / timeout points
    are left out (the table lists them)."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = json.load(open(speed_json))["rows"]
    lines = {}
    for r in rows:
        if not r["oom"] and r["fwd_bwd_ms"] is not None:
            lines.setdefault((r["impl"], r["variant"]), []).append((r["n"], r["fwd_bwd_ms"], r["peak_mem_mb"]))
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(13, 5.5))
    variants = list(dict.fromkeys(v for _, v in lines))
    palette = plt.get_cmap("tab20")
    color = {v: palette(i % 20) for i, v in enumerate(variants)}  # a peer shares its variant's colour
    for (impl, variant), pts in lines.items():
        pts.sort()
        label = variant if impl == "ours" else f"{impl[5:]} ({variant})"
        style = "-" if impl == "ours" else ":"
        width = 2.5 if variant in ("full", "full_explicit") else 1.2
        ns = [p[0] for p in pts]
        ax_t.plot(ns, [p[1] / 1000 for p in pts], style, marker="o", ms=3, lw=width, label=label, color=color[variant])
        ax_m.plot(ns, [max(p[2], 1.0) for p in pts], style, marker="o", ms=3, lw=width, label=label,
                  color=color[variant])
    for ax, what in ((ax_t, "forward + backward (s)"), (ax_m, "peak memory above baseline (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    ax_m.legend(fontsize=7, ncol=2, loc="upper left")
    fig.suptitle("one attention layer, 8 heads x 64, batch 1, fp32 (dotted: peer packages)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("patterns")
    a.add_argument("out")
    a.add_argument("--n", type=int, default=64)
    b = sub.add_parser("bubble")
    b.add_argument("speed")
    b.add_argument("listops")
    b.add_argument("out")
    b.add_argument("--n", type=int, default=4096)
    c = sub.add_parser("curves")
    c.add_argument("speed")
    c.add_argument("out")
    args = p.parse_args(argv)
    if args.cmd == "patterns":
        draw_patterns(args.out, args.n)
    elif args.cmd == "curves":
        draw_curves(args.speed, args.out)
    else:
        draw_bubble(args.speed, args.listops, args.out, args.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
