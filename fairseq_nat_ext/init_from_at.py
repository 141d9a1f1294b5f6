"""Initialise a non-autoregressive model from a trained autoregressive Transformer.

    python -m fairseq_nat_ext.init_from_at --teacher AT.pt --out INIT.pt -- \\
        DATA_BIN --user-dir fairseq_nat_ext --task ... --arch ... [the fairseq-train arguments]

then train with ``fairseq-train ... --finetune-from-model INIT.pt`` (fairseq resets optimizer,
scheduler, meters and data iterator, and resumes from ``checkpoint_last.pt`` instead once one
exists).  The NAT model is built exactly as fairseq-train builds it from the same arguments, so this
works for our archs and for fairseq's built-ins (``cmlm_transformer``, ...) alike, and one
benchmark can give every system the same start.

Transfer rule: every NAT parameter whose name exists in the AT checkpoint is copied (encoder and
decoder layers, layer norms, embeddings; the AT decoder's causal self-attention weights become the
NAT decoder's non-causal ones).  Embedding matrices may have a few more rows in the NAT model:
NAT tasks append symbols such as ``<mask>`` to the same dictionary, so the first rows (the AT
dictionary) are copied and the extra rows keep their fresh initialisation.  Anything else is an
error: a shape mismatch (different model size), or nothing in common (not an AT Transformer).
NAT-only parameters (length predictor, ...) keep their initialisation and are listed.

Single-stack models (KERMIT: one Transformer ``stack`` over [x ; y]): the AT encoder's layers become
the stack's first layers and the AT decoder's layers the following ones, without their cross-attention
(``encoder.layers.i`` -> ``stack.layers.i``, ``decoder.layers.j`` -> ``stack.layers.{E + j}`` with E the
AT encoder's depth; ``encoder.embed_tokens`` -> ``stack.embed_tokens``); see :func:`as_single_stack`.
"""

import argparse
import logging
import sys
from typing import Dict, List, Tuple

import torch

from fairseq_nat_ext.compat import InputError

logger = logging.getLogger("fairseq_nat_ext.init_from_at")

#: an embedding may grow by at most this many appended symbols (<mask>, <blank>, placeholders)
MAX_EXTRA_SYMBOLS = 8


def as_single_stack(at_names) -> Dict[str, str]:
    """{single-stack name: AT name} for the AT encoder-decoder's tensors (see the module docstring);
    the decoder's cross-attention (``encoder_attn*``) and output projection have no counterpart."""
    depth = 1 + max((int(k.split(".")[2]) for k in at_names if k.startswith("encoder.layers.")), default=-1)
    names = {}
    for name in at_names:
        parts = name.split(".")
        if parts[0] == "encoder":
            names["stack." + name[len("encoder."):]] = name
        elif parts[:2] == ["decoder", "layers"] and not parts[3].startswith("encoder_attn"):
            names[".".join(["stack", "layers", str(depth + int(parts[2]))] + parts[3:])] = name
    return names


def transfer_state(
    nat_state: Dict[str, torch.Tensor], at_state: Dict[str, torch.Tensor], at_name: str = "teacher"
) -> Tuple[Dict[str, torch.Tensor], Dict[str, List[str]]]:
    """Return (new NAT state, report) with every transferable AT tensor copied in.

    ``report`` has lists ``copied``, ``grown`` (embeddings with extra NAT rows), ``nat_only`` and
    ``at_only`` parameter names.  Raises :class:`InputError` on a shape mismatch or when the two
    models share no parameter.
    """
    at_names = set(at_state)  # for the report, under the AT checkpoint's own names
    if any(k.startswith("stack.") for k in nat_state) and not any(k.startswith("stack.") for k in at_state):
        names = as_single_stack(at_state)
        at_names -= {names[k] for k in names if k in nat_state}
        at_state = {k: at_state[v] for k, v in names.items()}
    out = {k: v.clone() for k, v in nat_state.items()}
    report: Dict[str, List[str]] = {"copied": [], "grown": [], "nat_only": [], "at_only": []}
    for name, value in nat_state.items():
        if name not in at_state:
            report["nat_only"].append(name)
            continue
        src = at_state[name]
        if src.shape == value.shape:
            out[name] = src.to(dtype=value.dtype).clone()
            report["copied"].append(name)
        elif (
            src.dim() == 2
            and value.dim() == 2
            and src.shape[1] == value.shape[1]
            and 0 < value.shape[0] - src.shape[0] <= MAX_EXTRA_SYMBOLS
        ):
            out[name][: src.shape[0]] = src.to(dtype=value.dtype)
            report["grown"].append(name)
        else:
            raise InputError(
                f"{at_name}: parameter {name} has shape {tuple(src.shape)} but the model being "
                f"initialised has {tuple(value.shape)}; the AT and NAT models must have the same "
                "size (layers, dims, vocabulary)"
            )
    report["at_only"] = sorted(at_names - set(nat_state))
    if not report["copied"]:
        raise InputError(
            f"{at_name}: no parameter in common with the model being initialised; "
            "is it a fairseq Transformer checkpoint?"
        )
    return out, report


def build_nat_model(train_args: List[str]):
    """Build (cfg, task, model) from fairseq-train arguments, as fairseq-train does."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=train_args)
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    return cfg, task, model


def make_init_checkpoint(teacher: str, out: str, train_args: List[str]) -> Dict[str, List[str]]:
    from fairseq import checkpoint_utils
    from omegaconf import OmegaConf

    at = checkpoint_utils.load_checkpoint_to_cpu(teacher)
    if "model" not in at:
        raise InputError(f"{teacher}: not a fairseq checkpoint (no 'model' entry)")
    cfg, _, model = build_nat_model(train_args)
    state, report = transfer_state(model.state_dict(), at["model"], at_name=teacher)
    model.load_state_dict(state, strict=True)  # proves the checkpoint is loadable as-is
    checkpoint = {
        "args": None,
        "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "model": model.state_dict(),
        "criterion": {},
        "optimizer_history": [
            {
                "criterion_name": "none",
                "optimizer_name": "none",
                "lr_scheduler_state": {"best": None},
                "num_updates": 0,
            }
        ],
        "task_state": {},
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "version": 2}},
        "last_optimizer_state": None,
        "init_from_at": {"teacher": teacher, **{k: len(v) for k, v in report.items()}},
    }
    torch.save(checkpoint, out)
    return report


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        print("error: put the fairseq-train arguments after '--'", file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", required=True, help="fairseq AT Transformer checkpoint")
    parser.add_argument("--out", required=True, help="where to write the initial NAT checkpoint")
    ours = parser.parse_args(argv[:split])
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    report = make_init_checkpoint(ours.teacher, ours.out, argv[split + 1:])
    print(
        f"{ours.out}: copied {len(report['copied'])} tensors from {ours.teacher}"
        f" ({len(report['grown'])} embeddings grown by appended symbols); "
        f"freshly initialised: {', '.join(report['nat_only']) or 'none'}; "
        f"unused from the AT model: {', '.join(report['at_only']) or 'none'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
