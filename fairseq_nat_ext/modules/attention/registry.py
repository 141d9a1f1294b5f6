"""Registry of self-attention variants and their options.

Every variant is an ``nn.Module`` built as ``cls(num_heads, head_dim, opts)`` whose forward is

    forward(q, k, v, lengths, x=None) -> (B, H, N, d)

q, k, v: (B, H, N, d) per-head projections of a batch that is RIGHT-ALIGNED: the real tokens of
sequence b are positions 0 .. lengths[b]-1, everything after is padding with arbitrary content.
Variants lay their pattern over the real tokens only and never let a padding key contribute, so the
output at real positions does not depend on the padding.  ``x`` (B, N, C) is the layer input, for
variants that compute weights from tokens alone (synthesizer).  Outputs at padding positions are
ignored by the caller.  Variants see no fairseq internals (see ``mix.EfficientSelfAttention`` for
the fairseq-facing module that projects, right-aligns and mixes variants across heads).
"""

from dataclasses import dataclass, field, fields
from typing import Callable, Dict, Type

import torch.nn as nn

from fairseq_nat_ext.compat import InputError

ATTENTION_REGISTRY: Dict[str, Type[nn.Module]] = {}

#: variants allowed to build an N x N tensor; every other one must stay sub-quadratic in memory
QUADRATIC_VARIANTS = frozenset({"full", "full_explicit", "synthesizer_dense", "synthesizer_random"})

#: variants whose parameters or tables are sized by ``--max-positions``: longer inputs cannot work
POSITION_TIED_VARIANTS = frozenset({"linformer", "synthesizer_dense", "synthesizer_random", "bigbird", "lsh",
                                    "routing", "sinkhorn"})


def register_attention(name: str) -> Callable[[Type[nn.Module]], Type[nn.Module]]:
    def wrap(cls):
        if name in ATTENTION_REGISTRY:
            raise ValueError(f"attention variant {name!r} registered twice")
        cls.variant_name = name
        ATTENTION_REGISTRY[name] = cls
        return cls

    return wrap


@dataclass
class AttentionOptions:
    """Options of every variant; command-line flag = ``--`` + field name with ``-`` for ``_``."""

    attention_window: int = field(default=64, metadata={"help": "local/global/strided: each token sees this many neighbours on each side"})
    attention_stride: int = field(default=0, metadata={"help": "strided: keys at this stride (i - j divisible by it); 0: ceil(sqrt(--max-positions)), the Sparse Transformer's l = sqrt(N)"})
    strided_window: int = field(default=-1, metadata={"help": "strided: also a local window of this radius; -1: the stride (the Sparse Transformer's band of width l), 0: none"})
    global_tokens: int = field(default=16, metadata={"help": "global: number of global tokens"})
    global_mode: str = field(default="first", metadata={"help": "global: 'first' (the first g tokens of the sequence) or 'added' (g learned tokens prepended by the encoder)"})
    block_size: int = field(default=64, metadata={"help": "bigbird/sinkhorn: block size"})
    bigbird_window_blocks: int = field(default=3, metadata={"help": "bigbird: window blocks (odd: own block and its neighbours)"})
    bigbird_global_blocks: int = field(default=2, metadata={"help": "bigbird: the first blocks are global"})
    bigbird_random_blocks: int = field(default=3, metadata={"help": "bigbird: random key blocks per query block"})
    lsh_bucket_size: int = field(default=64, metadata={"help": "lsh: chunk (bucket) size"})
    lsh_rounds: int = field(default=4, metadata={"help": "lsh: hash rounds"})
    routing_clusters: int = field(default=0, metadata={"help": "routing: number of k-means clusters (0: ceil(sqrt(--max-positions)))"})
    routing_decay: float = field(default=0.999, metadata={"help": "routing: EMA decay of the centroids"})
    sinkhorn_iters: int = field(default=8, metadata={"help": "sinkhorn: Sinkhorn normalisation iterations"})
    sinkhorn_temperature: float = field(default=0.75, metadata={"help": "sinkhorn: temperature of the sorting logits"})
    linformer_k: int = field(default=256, metadata={"help": "linformer: projected length k"})
    compress_kernel: int = field(default=4, metadata={"help": "compressed: kernel = stride of the key/value convolution"})
    feature_map: str = field(default="elu", metadata={"help": "linear: elu | relu | performer"})
    performer_features: int = field(default=256, metadata={"help": "linear/performer: number of random features"})
    performer_redraw: int = field(default=1000, metadata={"help": "linear/performer: redraw features every this many training forwards (0: never)"})
    max_positions: int = field(default=1024, metadata={"help": "linformer/synthesizer: longest input (position-tied parameters)"})
    attention_seed: int = field(default=1, metadata={"help": "seed of the random patterns (bigbird blocks, lsh evaluation rotations, performer features, routing's initial centroids); every layer derives its own from it"})
    layer: int = field(default=0, metadata={"help": "(set by the encoder, not a flag) index of the layer; mixed into the seed"})

    def layer_seed(self) -> int:
        """Seed of this layer's random patterns: distinct per layer, a fixed function of
        (--attention-seed, layer), so checkpoints and runs reproduce."""
        return self.attention_seed * 1000003 + 7919 * self.layer


def layer_options(opts: "AttentionOptions", layer: int) -> "AttentionOptions":
    """``opts`` for encoder layer ``layer`` (its random patterns differ from every other layer's)."""
    from dataclasses import replace

    return replace(opts, layer=layer)


def options_from_args(args) -> AttentionOptions:
    """AttentionOptions from an argparse namespace / omegaconf config (missing fields: defaults)."""
    kw = {f.name: getattr(args, f.name) for f in fields(AttentionOptions)
          if f.name != "layer" and getattr(args, f.name, None) is not None}
    return AttentionOptions(**kw)


def add_attention_args(parser, prefix: str = "encoder") -> None:
    """Add ``--{prefix}-attention-type``, ``--{prefix}-attention-mix`` and every variant option."""
    names = ", ".join(sorted(ATTENTION_REGISTRY))
    parser.add_argument(f"--{prefix}-attention-type", default="full", metavar="NAME",
                        help=f"self-attention variant: {names}, or 'mix' with --{prefix}-attention-mix")
    parser.add_argument(f"--{prefix}-attention-mix", default=None, metavar="NAME:HEADS,...",
                        help="per-head mix, e.g. local:2,strided:2,global:2,linear:2 (heads must add up)")
    defaults = AttentionOptions()
    for f in fields(AttentionOptions):
        if f.name == "layer":
            continue
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, type=type(getattr(defaults, f.name)), default=None,
                            help=f.metadata.get("help", "") + f" (default {getattr(defaults, f.name)})")


def parse_mix(attention_type: str, mix: str, num_heads: int, option: str = "--encoder-attention-type"):
    """[(variant, heads), ...] for a layer with ``num_heads`` heads; InputError names the option."""
    if attention_type != "mix":
        if mix:
            raise InputError(f"{option.replace('type', 'mix')} is only used with {option} mix")
        spec = [(attention_type, num_heads)]
    else:
        if not mix:
            raise InputError(f"{option} mix needs {option.replace('type', 'mix')} NAME:HEADS,...")
        spec = []
        for part in mix.split(","):
            name, _, count = part.strip().partition(":")
            if not count.isdigit() or int(count) < 1:
                raise InputError(f"{option.replace('type', 'mix')}: '{part}' is not NAME:HEADS")
            spec.append((name, int(count)))
        total = sum(c for _, c in spec)
        if total != num_heads:
            raise InputError(f"{option.replace('type', 'mix')} {mix} assigns {total} heads but the layer has {num_heads}")
    for name, _ in spec:
        if name not in ATTENTION_REGISTRY:
            raise InputError(f"{option}: unknown attention type '{name}' (known: {', '.join(sorted(ATTENTION_REGISTRY))})")
    return spec


def build_attention(name: str, num_heads: int, head_dim: int, opts: AttentionOptions) -> nn.Module:
    if name not in ATTENTION_REGISTRY:
        raise InputError(f"unknown attention type '{name}' (known: {', '.join(sorted(ATTENTION_REGISTRY))})")
    return ATTENTION_REGISTRY[name](num_heads, head_dim, opts)
