"""Average the parameters of the last N fairseq checkpoints of a run.

    python -m fairseq_nat_ext.checkpoint_average SAVE_DIR N OUT.pt \\
        [--kind auto|epoch|update] [--keep-optimizer-state]

Checkpoints are the files fairseq-train writes in SAVE_DIR: ``checkpointE.pt``
(end of epoch E) and ``checkpoint_E_U.pt`` (after update U, with
``--save-interval-updates``); ``checkpoint_best.pt`` / ``checkpoint_last.pt``
are never used.  ``--kind auto`` (default) merges both kinds and orders them by
their number of updates (read from the file name, or from the state of an epoch
checkpoint): fairseq writes an epoch checkpoint *instead of* the update one when
an update interval ends exactly at an epoch end, so neither kind alone is
complete.  ``--kind epoch`` / ``update`` use only that kind.

Each file is loaded with ``fairseq.checkpoint_utils.load_checkpoint_to_cpu``
(this package's checkpoint compatibility makes that work with torch's
``weights_only`` loading).  Floating-point tensors of ``state["model"]`` are
averaged in float64 and cast back to their dtype; other entries (integer
buffers such as ``version``) are taken from the newest checkpoint.  The output
keeps the rest of the newest checkpoint's state (cfg, extra_state, ...), with
the optimizer state dropped unless ``--keep-optimizer-state``, and is written
with ``torch.save``.

Errors (fewer than N checkpoints, parameter names or shapes that differ) are
printed as one ``error: ...`` line and exit status 1.
"""

import argparse
import os
import re
import sys
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

import torch

import fairseq_nat_ext  # noqa: F401  (activates the checkpoint compatibility layer)

_EPOCH_RE = re.compile(r"^checkpoint(\d+)\.pt$")
_UPDATE_RE = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")


def find_checkpoints(save_dir: str, kind: str = "auto") -> Tuple[str, List[str]]:
    """Return (kind, paths) with paths sorted oldest first.

    ``kind`` is "epoch", "update" or "auto" (update checkpoints if any exist).
    """
    if kind not in ("auto", "epoch", "update"):
        raise ValueError(f"unknown checkpoint kind {kind!r}")
    if not os.path.isdir(save_dir):
        raise ValueError(f"{save_dir}: no such directory")
    epochs: List[Tuple[int, str]] = []
    updates: List[Tuple[Tuple[int, int], str]] = []
    for name in os.listdir(save_dir):
        m = _EPOCH_RE.match(name)
        if m:
            epochs.append((int(m.group(1)), os.path.join(save_dir, name)))
            continue
        m = _UPDATE_RE.match(name)
        if m:
            updates.append(((int(m.group(2)), int(m.group(1))), os.path.join(save_dir, name)))
    if kind == "auto":
        merged = {upd: path for (upd, _), path in updates}
        for _, path in epochs:
            merged.setdefault(_num_updates(path), path)
        return "auto", [merged[u] for u in sorted(merged)]
    chosen = sorted(updates) if kind == "update" else sorted(epochs)
    return kind, [path for _, path in chosen]


def _num_updates(path: str) -> int:
    state = _load(path)
    return int(state["optimizer_history"][-1].get("num_updates", 0))


def last_checkpoints(save_dir: str, n: int, kind: str = "auto") -> List[str]:
    """The last ``n`` checkpoints of ``save_dir`` (oldest first); ValueError if fewer."""
    if n < 1:
        raise ValueError(f"N must be >= 1, got {n}")
    kind, paths = find_checkpoints(save_dir, kind)
    if len(paths) < n:
        pattern = {"update": "checkpoint_E_U.pt", "epoch": "checkpointE.pt"}.get(
            kind, "checkpointE.pt or checkpoint_E_U.pt")
        raise ValueError(
            f"{save_dir} has {len(paths)} {kind} checkpoints ({pattern}), fewer than the {n} asked for"
        )
    return paths[-n:]


def _load(path: str) -> dict:
    from fairseq import checkpoint_utils

    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except Exception as e:  # one line whatever went wrong
        raise ValueError(f"{path}: cannot load checkpoint: {type(e).__name__}: {e}") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise ValueError(f"{path}: not a fairseq checkpoint (no 'model' state dict)")
    return state


def average_states(model_states: Sequence[Dict[str, torch.Tensor]], names: Sequence[str]) -> "OrderedDict[str, torch.Tensor]":
    """Average a list of model state dicts (the last one gives non-float entries)."""
    reference = model_states[-1]
    keys = list(reference.keys())
    for state, name in zip(model_states, names):
        if set(state.keys()) != set(keys):
            missing = sorted(set(keys) - set(state.keys()))
            extra = sorted(set(state.keys()) - set(keys))
            detail = f"missing {missing[:3]}" if missing else f"unexpected {extra[:3]}"
            raise ValueError(f"{name}: parameter names differ from {names[-1]} ({detail})")
    averaged: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    for key in keys:
        ref = reference[key]
        if not (torch.is_tensor(ref) and torch.is_floating_point(ref)):
            averaged[key] = ref
            continue
        total = torch.zeros(ref.shape, dtype=torch.float64)
        for state, name in zip(model_states, names):
            value = state[key]
            if not torch.is_tensor(value) or value.shape != ref.shape:
                shape = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
                raise ValueError(f"{name}: {key} has shape {shape}, {names[-1]} has {tuple(ref.shape)}")
            total += value.detach().to(torch.float64)
        averaged[key] = (total / len(model_states)).to(ref.dtype)
    return averaged


def _plain_cfg(cfg):
    """load_checkpoint_to_cpu turns cfg into a DictConfig; fairseq saves a plain container."""
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(cfg):
            return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    except ImportError:
        pass
    return cfg


def average_checkpoints(paths: Sequence[str], keep_optimizer_state: bool = False) -> dict:
    """Load ``paths`` (oldest first) and return the newest state with averaged model params."""
    if not paths:
        raise ValueError("no checkpoints to average")
    states = [_load(p) for p in paths]
    new_state = states[-1]
    new_state["model"] = average_states([s["model"] for s in states], list(paths))
    if new_state.get("cfg") is not None:
        new_state["cfg"] = _plain_cfg(new_state["cfg"])
    if not keep_optimizer_state:
        new_state["last_optimizer_state"] = None
    new_state.setdefault("extra_state", {})
    if isinstance(new_state["extra_state"], dict):
        new_state["extra_state"]["averaged_checkpoints"] = [os.path.basename(p) for p in paths]
    return new_state


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_nat_ext.checkpoint_average",
        description="Average the model parameters of the last N checkpoints in SAVE_DIR.",
    )
    parser.add_argument("save_dir")
    parser.add_argument("n", type=int, metavar="N")
    parser.add_argument("output", metavar="OUT.pt")
    parser.add_argument("--kind", choices=("auto", "epoch", "update"), default="auto",
                        help="checkpointE.pt (epoch) or checkpoint_E_U.pt (update) files; "
                        "auto: update files when present")
    parser.add_argument("--keep-optimizer-state", action="store_true",
                        help="keep the newest checkpoint's optimizer state (dropped by default)")
    args = parser.parse_args(argv)
    try:
        paths = last_checkpoints(args.save_dir, args.n, args.kind)
        state = average_checkpoints(paths, keep_optimizer_state=args.keep_optimizer_state)
        out_dir = os.path.dirname(os.path.abspath(args.output))
        os.makedirs(out_dir, exist_ok=True)
        tmp = args.output + ".tmp"
        torch.save(state, tmp)
        os.replace(tmp, args.output)
    except (ValueError, OSError) as e:
        msg = str(e).replace("\n", " ").replace("\r", " ")
        print(f"error: {msg}", file=sys.stderr)
        return 1
    print(f"averaged {len(paths)} checkpoints ({', '.join(os.path.basename(p) for p in paths)}) -> {args.output}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
