"""Adapters that time peer packages' attention layers with the benchmark's shapes.

The packages are installed only for the benchmark, e.g. into a separate directory:

    pip install --target PEERS_DIR --no-deps local-attention linformer performer-pytorch \\
        reformer-pytorch sinkhorn-transformer routing-transformer einops axial-positional-embedding \\
        product-key-memory
    ATTENTION_PEERS_PATH=PEERS_DIR python -m benchmarks.attention_speed --peers ...

Each adapter returns (fn: x (N, 1, C) -> output, options, our corresponding variant) with the same
settings as our row (window 256, k=256, 256 features, bucket 64 x 4 hashes, sqrt(N) clusters, blocks
of 64).  Layers that are only the attention core (local-attention, routing's KmeansAttention) get the
same q/k/v/out projections as ours, so every row times a whole attention layer.
"""

import importlib
import math
import os
import sys

PEERS = {  # name -> (module to import, our variant)
    "local-attention": ("local_attention", "local"),
    "linformer": ("linformer", "linformer"),
    "performer-pytorch": ("performer_pytorch", "linear_performer"),
    "reformer-pytorch": ("reformer_pytorch", "lsh"),
    "sinkhorn-transformer": ("sinkhorn_transformer", "sinkhorn"),
    "routing-transformer": ("routing_transformer", "routing"),
}


def _path():
    extra = os.environ.get("ATTENTION_PEERS_PATH")
    if extra and extra not in sys.path:
        sys.path.insert(0, extra)


def available_peers():
    _path()
    found = []
    for name, (module, _) in PEERS.items():
        try:
            importlib.import_module(module)
            found.append(name)
        except Exception as err:  # a peer that does not import is reported and skipped
            print(f"[attention_peers] {name} not available: {type(err).__name__}: {err}", file=sys.stderr)
    return found


class _Projected:
    """q/k/v/out projections around an attention core taking (B, H, N, d)."""

    def __init__(self, core, heads, head_dim, device):
        import torch.nn as nn

        dim = heads * head_dim
        self.core, self.heads, self.d = core, heads, head_dim
        self.proj = nn.ModuleList(nn.Linear(dim, dim) for _ in range(4)).to(device)

    def __call__(self, x):
        N, B, C = x.shape
        h = x.transpose(0, 1)
        q, k, v = [p(h).view(B, N, self.heads, self.d).transpose(1, 2) for p in self.proj[:3]]
        out = self.core(q, k, v)
        out = out[0] if isinstance(out, tuple) else out
        return self.proj[3](out.transpose(1, 2).reshape(B, N, C)).transpose(0, 1)


def build_peer(name, n, heads, head_dim, device):
    _path()
    dim = heads * head_dim
    batch_first = lambda layer: (lambda x: layer(x.transpose(0, 1)).transpose(0, 1))  # noqa: E731
    if name == "local-attention":
        from local_attention import LocalAttention

        core = LocalAttention(window_size=256, causal=False, look_backward=1, look_forward=1, dim=head_dim,
                              autopad=True, use_rotary_pos_emb=False).to(device)
        return _Projected(core, heads, head_dim, device), {"window_size": 256, "look_backward": 1, "look_forward": 1}, "local"
    if name == "linformer":
        from linformer import LinformerSelfAttention

        layer = LinformerSelfAttention(dim=dim, seq_len=n, k=256, heads=heads).to(device)
        return batch_first(layer), {"k": 256}, "linformer"
    if name == "performer-pytorch":
        from performer_pytorch import SelfAttention

        layer = SelfAttention(dim=dim, heads=heads, dim_head=head_dim, nb_features=256, causal=False).to(device)
        return batch_first(layer), {"nb_features": 256}, "linear_performer"
    if name == "reformer-pytorch":
        from reformer_pytorch import LSHSelfAttention

        layer = LSHSelfAttention(dim=dim, heads=heads, bucket_size=64, n_hashes=4, causal=False).to(device)
        return batch_first(layer), {"bucket_size": 64, "n_hashes": 4}, "lsh"
    if name == "sinkhorn-transformer":
        from sinkhorn_transformer import SinkhornSelfAttention

        layer = SinkhornSelfAttention(dim=dim, bucket_size=64, max_seq_len=n, heads=heads).to(device)
        return batch_first(layer), {"bucket_size": 64}, "sinkhorn"
    if name == "routing-transformer":
        from routing_transformer.routing_transformer import KmeansAttention

        clusters = int(math.ceil(math.sqrt(n)))
        core = KmeansAttention(num_clusters=clusters, window_size=n // clusters, num_heads=heads,
                               head_dim=head_dim, causal=False).to(device)
        return _Projected(core, heads, head_dim, device), {"num_clusters": clusters, "window_size": n // clusters}, "routing"
    raise ValueError(f"unknown peer {name!r} (known: {', '.join(PEERS)})")
