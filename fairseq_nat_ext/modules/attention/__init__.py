"""Efficient self-attention variants (one file each) behind one registry; see registry.py."""

from .registry import (  # noqa: F401
    ATTENTION_REGISTRY,
    QUADRATIC_VARIANTS,
    AttentionOptions,
    add_attention_args,
    build_attention,
    layer_options,
    options_from_args,
    parse_mix,
    register_attention,
)
from . import full, local, strided, global_tokens, bigbird, lsh, routing, sinkhorn, linformer, compressed, linear, synthesizer  # noqa: F401,E402
from .mix import EfficientSelfAttention  # noqa: F401,E402
