"""Shared pieces of the reliability tests (tests/test_reliability_*.py).

``ARCHS`` lists every translation arch of the plugin with the flags of a very small model: adding an
arch to the reliability tests is one entry here.  ``train_inprocess`` runs fairseq-train's own main()
inside the test process (no interpreter start-up, no fairseq import: seconds instead of ~10 s); tests
that are about the command line itself (one-line stderr, SIGKILL, torchrun, stdin) use ``run_cli``.
Task options (``--task``, ``-s``/``-t``) are part of an entry: ``task_args`` gives them to the
decoding tools.  ``nat_fertility`` trains on fertility files: ``FERTILITY`` in its entry stands for a
directory of them that ``arch_flags`` makes for the data-bin at hand (``toy_fertility``).
"""
import os
import subprocess

from conftest import PLUGIN_DIR, VENV_BIN, cli_env

import fairseq_nat_ext  # noqa: F401,E402  (compat: checkpoints load with the allow-list)

#: stands for the --fertility-path directory of the data-bin (arch_flags fills it in)
FERTILITY = "<fertility-dir>"

SMALL_DIMS = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
              "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
              "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]

#: name -> fairseq-train flags selecting task, arch and criterion (a tiny model); one line per arch
ARCHS = {
    "mask_predict": ["--task", "nat_translation", "--arch", "mask_predict_tiny", "--criterion", "mask_predict_loss"],
    "levenshtein": ["--task", "nat_translation", "--arch", "levenshtein_tiny", "--criterion", "levenshtein_loss"],
    "insertion": ["--task", "nat_translation", "--arch", "insertion_tiny", "--criterion", "insertion_loss"],
    "ctc_nat": ["--task", "nat_translation", "--arch", "ctc_nat_tiny", "--criterion", "ctc_nat_loss"],
    "imputer": ["--task", "nat_translation", "--arch", "imputer_tiny", "--criterion", "imputer_loss"],
    "efficient_transformer": ["--task", "nat_translation", "--arch", "efficient_transformer",
                              "--criterion", "label_smoothed_cross_entropy", "--encoder-attention-type", "local",
                              "--attention-window", "2", "--share-all-embeddings"],
    "iterative_refinement": ["--task", "nat_translation", "--arch", "iterative_refinement_tiny",
                             "--criterion", "iterative_refinement_loss"],
    "nat_fertility": ["--task", "nat_translation", "--arch", "nat_fertility_tiny", "--criterion", "nat_fertility_loss",
                      "--fertility-path", FERTILITY],
    "kermit": ["--task", "kermit", "-s", "src", "-t", "tgt", "--arch", "kermit_tiny", "--criterion", "kermit_loss"],
}
#: archs of one stack (no decoder options)
ENCODER_ONLY = {"kermit"}
#: options of the task that decoding needs too (--fertility-path is for training only)
TASK_OPTIONS = ("--task", "-s", "-t")

#: flags of every tiny training run (few updates, no validation, no epoch checkpoints)
TRAIN_BASE = ["--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "400", "--num-workers", "0",
              "--seed", "1", "--no-epoch-checkpoints", "--disable-validation", "--log-format", "simple"]


def small_dims(arch):
    """SMALL_DIMS of ``arch`` (only the encoder ones for a single-stack arch)."""
    if arch not in ENCODER_ONLY:
        return list(SMALL_DIMS)
    pairs = zip(SMALL_DIMS[::2], SMALL_DIMS[1::2])
    return [x for flag, value in pairs if not flag.startswith("--decoder-") for x in (flag, value)]


def toy_fertility(data_bin):
    """DATA_BIN/fertility: a fertility file per split of the data-bin (made once).  The toy corpus
    translates word by word, so every source word has fertility 1; a sentence whose sides differ in
    length (a corpus the bad-input tests edited) gives its last source word the difference, or 0s."""
    from fairseq_nat_ext.data import fertility as ff
    from fairseq_nat_ext.data.make_fertility import infer_langs, load_split

    out = os.path.join(str(data_bin), "fertility")
    src, tgt = infer_langs(data_bin)
    for split in ("train", "valid", "test"):
        name = ff.fertility_file(out, split)
        loaded = None if os.path.exists(name) else load_split(data_bin, split, src, tgt)
        if loaded is None:
            continue
        rows = []
        for s, t in zip(*(map(len, side) for side in loaded[2:])):
            row = [1] * min(s, t) + [0] * (s - min(s, t))
            if row:
                row[-1] += t - min(s, t)
            rows.append(row)
        ff.write_fertility_file(name, rows)
    return out


def arch_flags(arch, data_bin):
    """ARCHS[arch] for training on ``data_bin`` (FERTILITY replaced by its fertility directory)."""
    return [toy_fertility(data_bin) if f == FERTILITY else f for f in ARCHS[arch]]


def task_args(arch):
    """The task options of ``arch`` that decoding needs (``--task X`` and the language pair)."""
    flags = ARCHS[arch]
    return [x for i in range(0, len(flags) - 1) if flags[i] in TASK_OPTIONS for x in flags[i:i + 2]]


def train_args(data_bin, arch, save_dir, *extra, updates=2):
    return [data_bin, "--user-dir", PLUGIN_DIR, *arch_flags(arch, data_bin), *small_dims(arch), *TRAIN_BASE,
            "--max-update", str(updates), "--save-dir", str(save_dir), *extra]


def train_inprocess(argv):
    """fairseq-train's main() on ``argv`` (fairseq-train's arguments) in this process."""
    from fairseq import distributed_utils, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli.train import main

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(a) for a in argv])
    distributed_utils.call_main(convert_namespace_to_omegaconf(args), main)


def files_in(path):
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def popen_cli(args, log_path, env_extra=None):
    """Start a console script of the venv in its own session, output to ``log_path``."""
    env = cli_env()
    env.update(env_extra or {})
    exe = os.path.join(VENV_BIN, args[0])
    log = open(log_path, "w")
    return subprocess.Popen([exe, *map(str, args[1:])], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True), log


def one_error_line(stderr):
    """The error line of a failed command: exactly one line starting with 'error: ' and no traceback."""
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def inner_logs(text):
    """{update: train_inner record without its timings} from a json-format fairseq-train log."""
    import json
    import re

    out = {}
    for m in re.finditer(r"\| train_inner \| (\{.*\})\s*$", text, re.M):
        rec = json.loads(m.group(1))
        out[int(rec["num_updates"])] = {k: v for k, v in rec.items() if k not in ("wps", "ups", "wall", "train_wall")}
    return out


def checkpoint_params(path):
    """The model state dict of a fairseq checkpoint (loaded with the plugin's allow-list)."""
    from fairseq import checkpoint_utils

    return checkpoint_utils.load_checkpoint_to_cpu(str(path))["model"]
