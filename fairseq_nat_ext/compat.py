"""Version shims, applied once when the plugin is imported.  Each shim says why it exists.

1. torch >= 2.6 loads checkpoints with ``weights_only=True``; fairseq checkpoints pickle an
   ``argparse.Namespace`` (old ``args``) and omegaconf containers (``cfg``), so plain
   ``fairseq-generate`` fails with "Unsupported global".  We allow-list exactly the types fairseq
   writes (:data:`FAIRSEQ_CHECKPOINT_GLOBALS`) and keep the safe unpickler on: any other pickled
   object is refused with a one-line error naming the checkpoint and the offending global.
2. A user-facing error (bad input, unsafe checkpoint) should read as one line, not a traceback:
   errors deriving from :class:`UserFacingError` are printed as ``error: ...`` by an excepthook when
   they end a command-line run (set ``FAIRSEQ_NAT_EXT_TRACEBACK=1`` for the full traceback).
3. fairseq's ``import_user_module`` compares the ``--user-dir`` path with the imported package's
   ``__path__`` literally, so the same directory reached through a symlink or a relative path raises
   "not globally unique".  We compare real paths instead (same behaviour otherwise).
"""
import argparse
import collections
import logging
import os
import pickle
import re
import sys
import typing

import torch

logger = logging.getLogger(__name__)


def _omegaconf_types():
    from omegaconf import DictConfig, ListConfig, nodes
    from omegaconf.base import Container, ContainerMetadata, Metadata, Node

    node_types = [
        getattr(nodes, name)
        for name in (
            "AnyNode", "StringNode", "IntegerNode", "FloatNode", "BooleanNode", "EnumNode",
            "BytesNode", "PathNode", "ValueNode",
        )
        if hasattr(nodes, name)
    ]
    return [DictConfig, ListConfig, ContainerMetadata, Metadata, Container, Node] + node_types


def fairseq_checkpoint_globals():
    """Every non-tensor type that fairseq (and this plugin) write into a checkpoint."""
    return [
        argparse.Namespace,  # legacy ``args``
        typing.Any,  # omegaconf metadata ``ref_type`` / ``object_type``
        collections.defaultdict,  # omegaconf metadata flags
        dict, list, tuple, set, int, float, bool, str,  # omegaconf ``object_type`` fields
    ] + _omegaconf_types()


class UserFacingError(Exception):
    """An error caused by the user's input, reported as one line naming the file/line/option."""


class InputError(UserFacingError, ValueError):
    """Bad data or an impossible option combination."""


class UnsafeCheckpointError(UserFacingError, RuntimeError):
    """A checkpoint holds a pickled object outside the fairseq allow-list, or is unreadable."""


def _install_excepthook():
    previous = sys.excepthook
    if getattr(previous, "_nat_ext_hook", False):
        return

    def hook(exc_type, exc, tb):
        if issubclass(exc_type, UserFacingError) and not os.environ.get("FAIRSEQ_NAT_EXT_TRACEBACK"):
            sys.stderr.write(f"error: {exc}\n")
            sys.stderr.flush()
            return
        previous(exc_type, exc, tb)

    hook._nat_ext_hook = True
    sys.excepthook = hook


_GLOBAL_RE = re.compile(r"GLOBAL ([\w\.]+)")


def _explain_load_failure(path, err):
    msg = str(err)
    m = _GLOBAL_RE.search(msg)
    if isinstance(err, pickle.UnpicklingError) or "weights_only" in msg.lower():
        what = m.group(1) if m else msg.splitlines()[0]
        return (
            f"refusing to load checkpoint {path}: it contains the pickled object '{what}', which is "
            "not a type fairseq checkpoints hold (allow-list: fairseq_nat_ext/compat.py); loading "
            "it could execute arbitrary code"
        )
    return f"cannot read checkpoint {path}: it is truncated or corrupted ({msg.splitlines()[0]})"


def _patch_checkpoint_loading():
    from fairseq import checkpoint_utils

    original = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(original, "_nat_ext_wrapped", False):
        return

    def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        try:
            return original(path, arg_overrides, load_on_all_ranks)
        except FileNotFoundError:
            raise
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as err:
            if isinstance(err, UnsafeCheckpointError):
                raise
            text = str(err)
            if isinstance(err, (pickle.UnpicklingError, EOFError)) or any(
                s in text for s in ("weights_only", "zip archive", "PytorchStreamReader",
                                    "invalid load key", "pickle data was truncated")
            ):
                raise UnsafeCheckpointError(_explain_load_failure(path, err)) from None
            raise

    load_checkpoint_to_cpu._nat_ext_wrapped = True
    load_checkpoint_to_cpu.__wrapped__ = original
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu


def _patch_user_module_import():
    from fairseq import utils

    original = utils.import_user_module
    if getattr(original, "_nat_ext_wrapped", False):
        return

    def import_user_module(args):
        user_dir = getattr(args, "user_dir", None)
        if user_dir is not None:
            real = os.path.realpath(user_dir)
            name = os.path.basename(real)
            mod = sys.modules.get(name)
            if mod is not None and any(
                os.path.realpath(p) == real for p in getattr(mod, "__path__", [])
            ):
                return  # the same package is already imported (and registered)
        return original(args)

    import_user_module._nat_ext_wrapped = True
    utils.import_user_module = import_user_module


def _patch_nat_reranker():
    """fairseq's IterativeRefinementGenerator.rerank (``--iter-decode-with-external-reranker``) reads
    ``encoder_out.encoder_out``, an attribute of the old NamedTuple encoder output; Transformer encoders
    now return dicts, so it raises AttributeError.  Same computation, batch size from the source."""
    from fairseq.iterative_refinement_generator import IterativeRefinementGenerator

    if getattr(IterativeRefinementGenerator.rerank, "_nat_ext_wrapped", False):
        return

    def rerank(self, reranker, finalized, encoder_input, beam_size):
        hyps = [f[0]["tokens"] for f in finalized]  # <s> y </s>, B * beam_size rows, sentence-major
        tokens = hyps[0].new_full((len(hyps), max(h.size(0) for h in hyps)), self.pad)
        for i, h in enumerate(hyps):
            tokens[i, : h.size(0)] = h
        tokens[:, 0] = self.eos  # the AR model's decoder input starts with </s>
        order = torch.arange(encoder_input[0].size(0), device=tokens.device).repeat_interleave(beam_size)
        enc = reranker.encoder.reorder_encoder_out(reranker.encoder(*encoder_input), order)
        lprobs = reranker.get_normalized_probs(reranker.decoder(tokens[:, :-1], enc), True, None)
        scores = lprobs.gather(2, tokens[:, 1:, None])[:, :, 0]
        keep = tokens[:, 1:].ne(self.pad)
        scores = scores.masked_fill(~keep, 0).sum(1) / keep.sum(1).type_as(scores)
        for i in range(len(finalized)):
            finalized[i][0]["score"] = scores[i]
        return finalized

    rerank._nat_ext_wrapped = True
    IterativeRefinementGenerator.rerank = rerank


_applied = False


def apply():
    global _applied
    if _applied:
        return
    torch.serialization.add_safe_globals(fairseq_checkpoint_globals())
    _patch_checkpoint_loading()
    _patch_user_module_import()
    _patch_nat_reranker()
    _install_excepthook()
    _applied = True
