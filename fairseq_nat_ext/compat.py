"""Version shims, applied once when the plugin is imported (``--user-dir`` imports it).

Every shim is listed in :data:`SHIMS` with the fairseq/torch/numpy versions it targets, its scope
(only the plugin's own archs and tasks, or every fairseq caller) and a check that turns it off when the
installed fairseq already has the fix.  Each keeps fairseq's behaviour for every input fairseq handled
before; ``docs/compat.md`` lists them with what loading the plugin changes.  Targeted builds: fairseq
0.12.2 and fairseq-fixed 0.12.3.1 (fairseq main of 2022-2023), torch >= 2.6, numpy 2.

1. ``weights_only``: torch >= 2.6 loads checkpoints with ``weights_only=True``; fairseq checkpoints
   pickle an ``argparse.Namespace`` (old ``args``) and omegaconf containers (``cfg``), so plain
   ``fairseq-generate`` fails with "Unsupported global".  We allow-list exactly the types fairseq
   writes (:data:`FAIRSEQ_CHECKPOINT_GLOBALS`) and keep the safe unpickler on: any other pickled
   object is refused with a one-line error naming the checkpoint and the offending global.
2. ``one_line_errors``: a user-facing error (bad input, unsafe checkpoint) reads as one line, not a
   traceback: errors deriving from :class:`UserFacingError` (raised by the plugin only) are printed as
   ``error: ...`` by an excepthook (``FAIRSEQ_NAT_EXT_TRACEBACK=1`` shows the full traceback).
3. ``user_dir_realpath``: fairseq's ``import_user_module`` compares the ``--user-dir`` path with the
   imported package's ``__path__`` literally, so the same directory reached through a symlink or a
   relative path raises "not globally unique".  We compare real paths instead (same otherwise).
4. ``checkpoint_mismatch``: a checkpoint whose parameters do not fit the model being built makes
   fairseq print a multi-line state-dict dump (``--path``) or "please ensure that the architectures
   match" (resume / ``--restore-file``).  We re-raise one line naming the file, the arch it holds and
   the arch (and task) expected; the exception still chains the original one.
5. ``hydra_legacy_archs``: ``fairseq-hydra-train`` (and ``--path`` on a checkpoint it wrote) hand a
   legacy arch an omegaconf ``DictConfig``; fairseq's ``TransformerConfig.from_namespace`` copies extra
   keys with ``vars()``, which on a DictConfig drops every option the arch adds itself.  Only for the
   plugin's archs, we turn the DictConfig into the argparse namespace fairseq-train would have built.
6. ``interactive_utf8``: ``fairseq-interactive`` decodes its input strictly and dies with a traceback
   on the first bad byte; we read bytes where the input has them (a file, a binary-backed stdin) and
   report ``<stdin> line N: not valid UTF-8``.  A text stream without bytes (``io.StringIO``) is read as
   text, as fairseq does; line splitting is fairseq's (universal newlines).
7. ``cpu_torchrun``: ``torchrun`` on CPU: fairseq's default world size is the number of CUDA devices
   (so 1 on CPU: it ignores torchrun and every process trains alone, racing on the checkpoint files).
   Without CUDA we take world size and rank from torchrun's environment (GPU runs are unchanged).
8. ``checkpoint_crc`` (in shim 1's wrapper): torch reads a checkpoint's zip members without checking
   their CRCs, so a corrupted file loads with wrong weights; we check them before loading and report
   "truncated or corrupted" naming the file.
9. ``nat_reranker``: fairseq's ``IterativeRefinementGenerator.rerank`` reads an attribute of the old
   NamedTuple encoder output and raises AttributeError; same computation on today's dict output.
10. ``numpy_compat``: fairseq's ``LanguagePairDataset`` (with ``--pad-to-bucket`` style buckets) and
   ``TokenBlockDataset`` (``break_mode="eos"``) use ``np.compat.long``, removed in numpy 2.  We give
   numpy back a ``numpy.compat`` holding ``long = int`` (what numpy 1.x had), only when numpy has none.
   A ``numpy<2`` pin was the alternative; it would force a numpy downgrade on the user's whole
   environment (torch, scipy and matplotlib wheels built for numpy 2), so the shim was chosen.
11. ``keep_last_batch``: fairseq's ``data_utils.batch_by_size`` drops the last batch when its size is
   not a multiple of ``--required-batch-size-multiple`` (default 8; fairseq issues #5036, #5351,
   #5094), although its docstring promises batches "less than N or a multiple of N": ``fairseq-generate``
   silently translates fewer sentences (3-sentence split: none) and validation skips sentences.  We
   keep that tail as one last, smaller batch, for every caller: evaluation loses nothing, and
   training no longer skips the same (longest) sentences every epoch.  Every other batch is unchanged.
12. ``resume_batches``: fairseq's ``FairseqTask.get_batch_iterator`` orders the training examples under
   ``numpy_seed(seed + epoch)`` and keeps the batches it builds for every later epoch of the process, so an
   uninterrupted run trains on epoch 1's batches and a run resumed at epoch e on batches built under
   seed + e: sentences of equal length change batches and the resumed run departs from the uninterrupted
   one (fairseq's own ``test_reproducibility``).  A reusable iterator is built with epoch 1's batches, then
   set to its epoch; runs from epoch 1, per-epoch rebuilt and unshuffled iterators are unchanged.
13. ``insertion_label_tau``: fairseq's ``insertion_transformer`` with ``--label-tau`` (binary-tree slot
   weights) fails on its first batch (a float64 tensor of numpy weights scattered into float32
   targets).  The weights are handed over as Python floats: float32 targets, the same values; without
   ``--label-tau`` nothing changes.
"""
import argparse
import collections
import contextlib
import logging
import os
import pickle
import re
import sys
import typing
import warnings
import zipfile

import torch

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def fairseq_mask_warning_silenced():
    """Silence torch's "Support for mismatched key_padding_mask and attn_mask" warning, which
    fairseq's own Transformer decoder triggers on every padded teacher-forced batch (a bool padding
    mask beside its float causal mask); for calls into fairseq's models only."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Support for mismatched key_padding_mask")
        yield


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


def damaged_checkpoint_message(path, detail):
    """One line for a checkpoint that cannot be read; for checkpoint_last.pt, how to resume anyway."""
    hint = ""
    if os.path.basename(str(path)) == "checkpoint_last.pt":
        hint = ("; to resume from the newest intact checkpoint run "
                "python fairseq_nat_ext/checkpoint_resume.py SAVE_DIR (the recipes do)")
    return f"cannot read checkpoint {path}: it is truncated or corrupted ({detail}){hint}"


def _explain_load_failure(path, err):
    msg = str(err)
    m = _GLOBAL_RE.search(msg)
    if m:
        return (
            f"refusing to load checkpoint {path}: it contains the pickled object '{m.group(1)}', which is "
            "not a type fairseq checkpoints hold (allow-list: fairseq_nat_ext/compat.py); loading "
            "it could execute arbitrary code"
        )
    lines = [line.strip() for line in msg.splitlines() if line.strip()]
    if "WeightsUnpickler error:" in msg:  # torch's safe unpickler met bytes that are no pickle
        after = msg.split("WeightsUnpickler error:", 1)[1]
        lines = [line.strip() for line in after.splitlines() if line.strip()] or lines
    detail = (lines[0] if lines else type(err).__name__)[:200]
    return damaged_checkpoint_message(path, detail)


def _patch_checkpoint_loading():
    from fairseq import checkpoint_utils

    original = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(original, "_nat_ext_wrapped", False):
        return

    def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        # torch reads a zip checkpoint without checking the members' CRCs: a corrupted file would
        # load with wrong weights.  Check them first (a truncated zip fails below, in torch).
        if isinstance(path, (str, os.PathLike)) and os.path.isfile(path) and zipfile.is_zipfile(path):
            from .checkpoint_resume import damage

            why = damage(path)
            if why is not None:
                raise UnsafeCheckpointError(damaged_checkpoint_message(path, why))
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


def checkpoint_arch(state):
    """(arch, task) names recorded in a loaded checkpoint state (None where unknown)."""
    cfg = state.get("cfg") if isinstance(state, dict) else None
    arch = task = None
    if cfg is not None:
        model_cfg = cfg.get("model") if hasattr(cfg, "get") else None
        task_cfg = cfg.get("task") if hasattr(cfg, "get") else None
        arch = getattr(model_cfg, "arch", None) or getattr(model_cfg, "_name", None)
        task = getattr(task_cfg, "_name", None) or getattr(task_cfg, "task", None)
    args = state.get("args") if isinstance(state, dict) else None
    if args is not None:
        arch = arch or getattr(args, "arch", None)
        task = task or getattr(args, "task", None)
    return arch, task


def _describe_checkpoint(path):
    """'<arch>' model (task <task>) as recorded in ``path``, read again on an error path."""
    from fairseq import checkpoint_utils

    try:
        arch, task = checkpoint_arch(checkpoint_utils.load_checkpoint_to_cpu(path))
    except Exception:  # noqa: BLE001  (the error being explained is more useful than this one)
        return "a model"
    return f"a '{arch or '?'}' model (task {task or '?'})"


_SIZE_RE = re.compile(r"size mismatch for ([\w\.]+): copying a param with shape torch.Size\((\[[^\]]*\])\) "
                      r"from checkpoint, the shape in current model is torch.Size\((\[[^\]]*\])\)")
_KEYS_RE = re.compile(r"(Missing|Unexpected) key\(s\) in state_dict: (.*)")


def summarise_state_dict_error(err):
    """One phrase for torch's multi-line load_state_dict error (or any other exception)."""
    text = str(err)
    m = _SIZE_RE.search(text)
    if m:
        return f"{m.group(1)} has shape {m.group(2)} in the checkpoint but {m.group(3)} in the model"
    parts = []
    for kind, keys in _KEYS_RE.findall(text):
        names = re.findall(r'"([^"]+)"', keys)
        if names:
            parts.append(f"{len(names)} {kind.lower()} parameters (e.g. {names[0]})")
    if parts:
        return ", ".join(parts)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def task_name(task):
    """The registered name of a task object (its class name when not registered)."""
    from fairseq.tasks import TASK_REGISTRY

    return next((n for n, c in TASK_REGISTRY.items() if c is type(task)), type(task).__name__)


def _model_arch_name(model_cfg):
    return getattr(model_cfg, "arch", None) or getattr(model_cfg, "_name", None) or "?"


def _patch_trainer_checkpoint_loading():
    from fairseq import trainer as trainer_module

    cls = trainer_module.Trainer
    original = cls.load_checkpoint
    if getattr(original, "_nat_ext_wrapped", False):
        return

    def load_checkpoint(self, filename, *args, **kwargs):
        check_checkpoint_options(self.get_model(), filename)
        try:
            return original(self, filename, *args, **kwargs)
        except UserFacingError:
            raise
        except Exception as err:  # noqa: BLE001
            if "Cannot load model parameters from checkpoint" not in str(err):
                raise
            cause = err.__cause__ or err.__context__ or err
            raise InputError(
                f"checkpoint {filename} holds {_describe_checkpoint(filename)} whose parameters do not fit "
                f"the '{_model_arch_name(self.cfg.model)}' model of this run (--arch, task "
                f"{getattr(self.cfg.task, '_name', '?')}): {summarise_state_dict_error(cause)}; "
                "train into another --save-dir or give the matching --arch and options"
            ) from err

    load_checkpoint._nat_ext_wrapped = True
    cls.load_checkpoint = load_checkpoint


def _patch_ensemble_loading():
    from fairseq import checkpoint_utils

    original = checkpoint_utils.load_model_ensemble_and_task
    if getattr(original, "_nat_ext_wrapped", False):
        return

    def load_model_ensemble_and_task(filenames, arg_overrides=None, task=None, *args, **kwargs):
        try:
            return original(filenames, arg_overrides, task, *args, **kwargs)
        except UserFacingError:
            raise
        except (RuntimeError, KeyError, AttributeError, TypeError, ValueError, AssertionError, IndexError) as err:
            # the model built from the checkpoint's config does not fit its weights or this task / data
            found = ", ".join(f"{f} holds {_describe_checkpoint(f)}" for f in filenames)
            expected = f" for task {task_name(task)}" if task is not None else ""
            raise InputError(
                f"--path {found}, which cannot be loaded{expected} with this data: "
                f"{summarise_state_dict_error(err)}"
            ) from err  # FAIRSEQ_NAT_EXT_TRACEBACK=1 shows the original traceback

    load_model_ensemble_and_task._nat_ext_wrapped = True
    load_model_ensemble_and_task.__wrapped__ = original
    checkpoint_utils.load_model_ensemble_and_task = load_model_ensemble_and_task


def _plugin_root():
    return __name__.split(".")[0]


def legacy_namespace(model_cls, arch, cfg, from_checkpoint=False):
    """The argparse namespace fairseq-train builds for a legacy ``arch``, from a DictConfig.  For a
    checkpoint (``from_checkpoint``), an option it does not hold takes the model class'
    ``checkpoint_defaults`` value (what it was trained with, before the option existed) instead of
    the arch's default for new models."""
    from fairseq.models import ARCH_CONFIG_REGISTRY
    from omegaconf import OmegaConf

    parser = argparse.ArgumentParser(allow_abbrev=False)
    group = parser.add_argument_group("model", argument_default=argparse.SUPPRESS)
    model_cls.add_args(group)
    ns, _ = parser.parse_known_args([])
    for key, value in OmegaConf.to_container(cfg, resolve=True).items():
        if value is not None or not hasattr(ns, key):
            setattr(ns, key, value)
    if from_checkpoint:
        apply_checkpoint_defaults(model_cls, ns)
    ns.arch = arch
    ns._name = arch
    ARCH_CONFIG_REGISTRY[arch](ns)
    return ns


def apply_checkpoint_defaults(model_cls, args):
    """Give ``args`` (a loaded checkpoint's model options) the values of ``model_cls.checkpoint_defaults``
    that it does not hold: options added after the checkpoint was saved whose default for new models
    differs from what the checkpoint was trained with."""
    for key, value in getattr(model_cls, "checkpoint_defaults", {}).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)


def _saved_option(model_cfg, key):
    """``key`` of a checkpoint's model options (Namespace or DictConfig); None when it is absent."""
    if model_cfg is None:
        return None
    if isinstance(model_cfg, argparse.Namespace):
        return getattr(model_cfg, key, None)
    try:
        return model_cfg.get(key, None)
    except Exception:  # noqa: BLE001 -- a struct config without the key
        return None


def check_checkpoint_options(model, filename):
    """Before a training run loads ``filename`` (resume, --restore-file, --finetune-from-model): each
    option of ``type(model).checkpoint_defaults`` must have the value the checkpoint was trained with
    (a checkpoint without the option: the class' value), else a one-line error -- continuing under
    another value would silently change what the model learns (e.g. insertion's end-of-slot label)."""
    defaults = getattr(type(model), "checkpoint_defaults", None)
    if not defaults or not isinstance(filename, (str, os.PathLike)) or not os.path.isfile(filename):
        return
    from fairseq import checkpoint_utils

    state = checkpoint_utils.load_checkpoint_to_cpu(str(filename))
    cfg = state.get("cfg")
    saved = cfg.get("model") if cfg is not None else state.get("args")
    for key, old in defaults.items():
        trained = _saved_option(saved, key)
        trained = old if trained is None else trained
        current = getattr(getattr(model, "args", None), key, None)
        if current is not None and current != trained:
            opt = "--" + key.replace("_", "-")
            raise InputError(f"checkpoint {filename} was trained with {opt} {trained}, this run has {opt} "
                             f"{current}: give {opt} {trained} to continue it, or train into another --save-dir")


def _patch_legacy_model_build():
    from fairseq import models
    from omegaconf import OmegaConf, open_dict

    original = models.build_model
    if getattr(original, "_nat_ext_wrapped", False):
        return

    def build_model(cfg, task, from_checkpoint=False):
        arch = getattr(cfg, "_name", None) or getattr(cfg, "arch", None)
        model_cls = models.ARCH_MODEL_REGISTRY.get(arch)
        if (OmegaConf.is_config(cfg) and model_cls is not None
                and model_cls.__module__.split(".")[0] == _plugin_root()
                and arch not in models.MODEL_DATACLASS_REGISTRY):
            ns = legacy_namespace(model_cls, arch, cfg, from_checkpoint)
            if not from_checkpoint:  # a new model: the checkpoint it saves (this cfg) holds these values
                with open_dict(cfg):
                    for key in getattr(model_cls, "checkpoint_defaults", {}):
                        cfg[key] = getattr(ns, key, None)
            cfg = ns
        elif from_checkpoint and model_cls is not None and isinstance(cfg, argparse.Namespace):
            apply_checkpoint_defaults(model_cls, cfg)  # before fairseq applies the arch's defaults
        return original(cfg, task, from_checkpoint)

    build_model._nat_ext_wrapped = True
    models.build_model = build_model


def _utf8_lines(stream, name, encoding="utf-8"):
    """Lines of a binary stream decoded strictly, split like a text stream (universal newlines:
    \\n, \\r\\n and a lone \\r end a line); a bad byte is a one-line :class:`InputError`."""
    for lineno, raw in enumerate(stream, 1):
        try:
            raw.decode(encoding)
        except UnicodeDecodeError as e:
            raise InputError(f"fairseq-interactive: {name} line {lineno}: not valid {encoding.upper()} "
                             f"(byte 0x{raw[e.start]:02x} at byte {e.start + 1})") from None
        # bytes.splitlines ends lines at \n, \r\n and \r only, as a text stream does (str.splitlines
        # would also split at \x0b, \x1c, \u2028, ...)
        yield from (piece.decode(encoding) for piece in raw.splitlines())


def buffered_read_utf8(input, buffer_size):
    """fairseq_cli.interactive.buffered_read (same lines, same buffers), with a bad byte reported as
    one line naming the input and the line.  ``-`` reads ``sys.stdin``: its bytes when it has them (in
    its own encoding), else its text as it is (``io.StringIO`` and other text-only streams)."""
    buffer = []
    if input == "-":
        raw = getattr(sys.stdin, "buffer", None)
        encoding = getattr(sys.stdin, "encoding", None) or "utf-8"
        lines = _utf8_lines(raw, "<stdin>", encoding) if raw is not None else sys.stdin
        stream = None
    else:
        stream = open(input, "rb")
        lines = _utf8_lines(stream, input)
    try:
        for line in lines:
            buffer.append(line.strip())
            if len(buffer) >= buffer_size:
                yield buffer
                buffer = []
    finally:
        if stream is not None:
            stream.close()
    if buffer:
        yield buffer


def _patch_interactive_input():
    import fairseq_cli.interactive as interactive

    if getattr(interactive.buffered_read, "_nat_ext_wrapped", False):
        return
    buffered_read_utf8._nat_ext_wrapped = True
    buffered_read_utf8.__wrapped__ = interactive.buffered_read
    interactive.buffered_read = buffered_read_utf8


def _interactive_present():
    try:
        import fairseq_cli.interactive  # noqa: F401
    except ImportError:  # fairseq without its command-line package
        return False
    return True


def _patch_cpu_torchrun():
    from fairseq.distributed import utils as dist_utils

    original = dist_utils.infer_init_method
    if getattr(original, "_nat_ext_wrapped", False):
        return

    def infer_init_method(cfg, force_distributed=False):
        env = os.environ
        if (cfg.distributed_init_method is None and not getattr(cfg, "tpu", False)
                and not torch.cuda.is_available()
                and all(k in env for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"))
                and int(env["WORLD_SIZE"]) > 1):
            cfg.distributed_init_method = "env://"
            cfg.distributed_world_size = int(env["WORLD_SIZE"])
            cfg.distributed_rank = int(env["RANK"])
            cfg.device_id = 0
            cfg.distributed_no_spawn = True  # torchrun started the processes
            return
        return original(cfg, force_distributed)

    infer_init_method._nat_ext_wrapped = True
    dist_utils.infer_init_method = infer_init_method


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


def _patch_numpy_compat():
    import types

    import numpy

    module = types.ModuleType("numpy.compat")
    module.__doc__ = "numpy 1.x's numpy.compat names that fairseq 0.12 still uses (fairseq_nat_ext.compat)."
    module.long = int  # numpy 1.x: numpy.compat.long is int
    sys.modules["numpy.compat"] = module
    numpy.compat = module


def _numpy_compat_missing():
    import numpy

    return not hasattr(numpy, "compat")


def _patch_batch_by_size():
    """Keep the tail batch that ``data_utils.batch_by_size`` drops.  Every module of fairseq calls it as
    ``data_utils.batch_by_size`` (an attribute look-up at call time), so patching the module suffices."""
    import numpy as np
    from fairseq.data import data_utils

    original = data_utils.batch_by_size
    if getattr(original, "_nat_ext_wrapped", False):
        return

    def batch_by_size(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None, max_sentences=None,
                      required_batch_size_multiple=1, fixed_shapes=None):
        if not isinstance(indices, np.ndarray):
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        batches = original(indices, num_tokens_fn, num_tokens_vec, max_tokens, max_sentences,
                           required_batch_size_multiple, fixed_shapes)
        # the batchers cut ``indices`` into consecutive runs in order; fairseq drops the last run
        kept = sum(len(b) for b in batches)
        if fixed_shapes is None and kept < len(indices):
            batches = list(batches) + [indices[kept:]]
        return batches

    batch_by_size._nat_ext_wrapped = True
    batch_by_size.__wrapped__ = original
    data_utils.batch_by_size = batch_by_size


def _patch_resume_batches():
    """Build a reusable training iterator's batches as a run from epoch 1 does, whatever epoch it starts at.

    fairseq's ``FairseqTask.get_batch_iterator`` orders the examples under ``numpy_seed(seed + epoch)``
    (ties of equal length are broken by that permutation) and, when the dataset's batches may be reused
    across epochs (the default), builds them once and keeps them for every later epoch of the process.
    An uninterrupted run therefore trains every epoch on the batches of epoch 1, while a run resumed at
    epoch e builds them under seed + e: equal-length sentences change batches and the resumed run
    departs from the uninterrupted one (fairseq's own ``test_reproducibility`` fails whenever such a
    tie straddles a batch boundary, which depends on the data).  A reusable iterator is now built with
    the batches of epoch 1 and then set to the requested epoch; the per-epoch shuffle of the batches
    (``seed + epoch``) is unchanged, and so is every run that starts at epoch 1, every iterator that is
    rebuilt per epoch (``--rebuild-batches``, sharded data, non-reusable datasets) and every unshuffled
    one (validation, generation)."""
    import functools
    import inspect

    from fairseq.tasks.fairseq_task import FairseqTask

    original = FairseqTask.get_batch_iterator
    if getattr(original, "_nat_ext_wrapped", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def get_batch_iterator(self, dataset, *args, **kwargs):
        bound = signature.bind(self, dataset, *args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        epoch = a.get("epoch") or 1
        reusable = (not a.get("disable_iterator_cache") and not a.get("update_epoch_batch_itr")
                    and not getattr(getattr(self, "cfg", None), "rebuild_batches", False)
                    and self.can_reuse_epoch_itr(dataset))
        if epoch <= 1 or not reusable or dataset in getattr(self, "dataset_to_epoch_iter", {}):
            return original(*bound.args, **bound.kwargs)
        a["epoch"] = 1
        itr = original(*bound.args, **bound.kwargs)
        dataset.set_epoch(epoch)
        itr.epoch = epoch  # EpochBatchIterator keeps the epoch it starts from; nothing else depends on it
        return itr

    get_batch_iterator._nat_ext_wrapped = True
    FairseqTask.get_batch_iterator = get_batch_iterator


def _batch_order_seeded_by_start_epoch():
    from fairseq.tasks.fairseq_task import FairseqTask

    fn = getattr(FairseqTask.get_batch_iterator, "__wrapped__", FairseqTask.get_batch_iterator)
    return source_contains(fn, "numpy_seed(seed + epoch)") and source_contains(fn, "make_batches(dataset, epoch)")


def source_contains(obj, snippet):
    """Whether ``obj``'s source holds ``snippet`` (spaces ignored): how a shim sees that the installed
    fairseq still has the code it fixes.  Unreadable source counts as unfixed."""
    import inspect

    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):
        return True
    return snippet.replace(" ", "") in source.replace(" ", "")


def _batch_by_size_drops_tail():
    from fairseq.data import data_utils

    return source_contains(getattr(data_utils.batch_by_size, "__wrapped__", data_utils.batch_by_size),
                           "b = b[:-1]")


def _reranker_reads_namedtuple():
    from fairseq.iterative_refinement_generator import IterativeRefinementGenerator

    return source_contains(IterativeRefinementGenerator.rerank, "encoder_out.encoder_out")


def _patch_insertion_label_tau():
    """fairseq's ``insertion_transformer`` with ``--label-tau`` (binary-tree slot weights) crashes on every
    batch: ``NegativeDistanceScore`` returns numpy float64 weights, ``_get_ins_targets`` turns them into a
    float64 tensor and scatters it into a float32 one (``scatter(): Expected self.dtype to be equal to
    src.dtype``).  The scorer's values are returned as Python floats, so the tensor is float32, as the
    float32 targets it fills; ``--label-tau`` unset (uniform, ``1 / L``) is unchanged."""
    from fairseq.models.nat import insertion_transformer as it

    if getattr(it.neg_scorer, "_nat_ext_wrapped", False):
        return
    scorer = it.neg_scorer

    class FloatScore:
        _nat_ext_wrapped = True

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def __call__(self, i, L, tau):
            return float(self.inner(i, L, tau))

    it.neg_scorer = FloatScore(scorer)


def _insertion_label_tau_breaks():
    try:
        from fairseq.models.nat import insertion_transformer as it
    except ImportError:
        return False
    return source_contains(it._get_ins_targets, "torch.tensor(list(a), device=in_tokens.device)")


def _torch_loads_weights_only():
    return hasattr(torch.serialization, "add_safe_globals")


def _allow_list_fairseq_globals():
    torch.serialization.add_safe_globals(fairseq_checkpoint_globals())


def _always():
    return True


class Shim(typing.NamedTuple):
    """One global patch: what it fixes, for which versions, on which callers, and when it is needed."""

    name: str
    targets: str  # the versions whose behaviour it fixes
    scope: str  # "plugin": only the plugin's own archs/tasks/errors; "fairseq": every fairseq caller
    needed: typing.Callable[[], bool]  # False when the installed versions already have the fix
    patch: typing.Callable[[], None]


#: Every shim, in the order applied (see the module docstring for the why of each).
SHIMS = (
    Shim("weights_only", "torch >= 2.6 with fairseq <= 0.12.3", "fairseq",
         _torch_loads_weights_only, _allow_list_fairseq_globals),
    Shim("checkpoint_crc", "torch (any): zip members' CRCs unchecked", "fairseq", _always,
         _patch_checkpoint_loading),
    Shim("user_dir_realpath", "fairseq 0.12.x import_user_module", "fairseq", _always,
         _patch_user_module_import),
    Shim("checkpoint_mismatch", "fairseq 0.12.x Trainer.load_checkpoint / load_model_ensemble_and_task",
         "fairseq", _always, _patch_trainer_checkpoint_loading),
    Shim("checkpoint_mismatch_path", "fairseq 0.12.x load_model_ensemble_and_task", "fairseq", _always,
         _patch_ensemble_loading),
    Shim("hydra_legacy_archs", "fairseq 0.12.x build_model with a DictConfig", "plugin", _always,
         _patch_legacy_model_build),
    Shim("interactive_utf8", "fairseq 0.12.x fairseq_cli.interactive.buffered_read", "fairseq",
         _interactive_present, _patch_interactive_input),
    Shim("cpu_torchrun", "fairseq 0.12.x infer_init_method without CUDA", "fairseq", _always,
         _patch_cpu_torchrun),
    Shim("nat_reranker", "fairseq 0.12.x IterativeRefinementGenerator.rerank", "fairseq",
         _reranker_reads_namedtuple, _patch_nat_reranker),
    Shim("numpy_compat", "fairseq 0.12.x on numpy >= 2", "fairseq", _numpy_compat_missing,
         _patch_numpy_compat),
    Shim("keep_last_batch", "fairseq 0.12.x data_utils.batch_by_size", "fairseq",
         _batch_by_size_drops_tail, _patch_batch_by_size),
    Shim("resume_batches", "fairseq 0.12.3 FairseqTask.get_batch_iterator (seed + epoch)", "fairseq",
         _batch_order_seeded_by_start_epoch, _patch_resume_batches),
    Shim("insertion_label_tau", "fairseq 0.12.x insertion_transformer --label-tau on torch >= 2", "fairseq",
         _insertion_label_tau_breaks, _patch_insertion_label_tau),
    Shim("one_line_errors", "the plugin's own UserFacingError", "plugin", _always, _install_excepthook),
)

#: names of the shims :func:`apply` installed (the others were not needed here)
APPLIED = []


def apply():
    if APPLIED:
        return
    for shim in SHIMS:
        if shim.needed():
            shim.patch()
            APPLIED.append(shim.name)
