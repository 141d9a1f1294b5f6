"""Every plugin translation arch (tests/reliability_utils.ARCHS) through fairseq's other entry points:
fairseq-generate, fairseq-interactive reading stdin, the hub interface (from_pretrained, then
translate / generate), and fairseq-hydra-train with the YAML config in examples/hydra/ (the plugin
named by common.user_dir; another task is an override, e.g. task._name=kermit).  The decoding tools
get each arch's task options (``task_args``).  Each tool's own main() runs in this process for every
arch (no interpreter start-up: ~10 s saved per run); the interactive and hydra commands also run for
real (stdin pipe; config discovery, working directory, and a task override for hydra).  The generate
command itself runs per arch in tests/test_e2e_mask_predict.py, test_levenshtein.py,
test_insertion_transformer.py, test_efficient_encoder.py, test_ctc_e2e.py, test_refinement_e2e.py,
test_fertility_e2e.py and test_kermit.py."""
import os
import re
import subprocess
import warnings

import pytest
import torch

from conftest import PLUGIN_DIR, ROOT, VENV_BIN, cli_env
from reliability_utils import ARCHS, arch_flags, small_dims, task_args

import fairseq_nat_ext  # noqa: F401

SENTENCES = ["w1 w2 w3", "w10 w4", "w7 w7 w7 w7 w2"]
DECODE = ["--iter-decode-max-iter", "2", "--beam", "2"]


def _hyps(text):
    """{id: hypothesis} from the H- lines fairseq prints."""
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^H-(\d+)\t\S+\t(.*)$", text, re.M)}


def _check_words_in_dictionary(data_bin, hyps):
    with open(os.path.join(data_bin, "dict.tgt.txt"), encoding="utf-8") as f:
        vocab = {line.split()[0] for line in f} | {"<unk>"}  # an untrained model may predict <unk>
    for h in hyps.values():
        assert set(h.split()) <= vocab, h


# ---- fairseq-generate ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def five_sentence_bin(toy_databin, tmp_path_factory):
    """The toy data-bin's dictionaries with a 'test' split of its first 5 test sentences (an untrained
    model decodes slowly: it predicts long outputs)."""
    from fairseq import options
    from fairseq_cli import preprocess

    data_bin, raw = toy_databin
    root = tmp_path_factory.mktemp("five")
    for lang in ("src", "tgt"):
        with open(os.path.join(raw, f"test.{lang}"), encoding="utf-8") as f:
            (root / f"test.{lang}").write_text("\n".join(f.read().splitlines()[:5]) + "\n", encoding="utf-8")
    args = options.get_preprocessing_parser().parse_args([
        "--source-lang", "src", "--target-lang", "tgt", "--testpref", str(root / "test"), "--destdir",
        str(root / "bin"), "--joined-dictionary", "--srcdict", os.path.join(data_bin, "dict.src.txt"),
        "--workers", "1"])
    preprocess.main(args)
    return str(root / "bin")


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_fairseq_generate(arch, tiny_checkpoints, five_sentence_bin, tmp_path):
    from fairseq import options
    from fairseq_cli import generate

    parser = options.get_generation_parser()
    args = options.parse_args_and_arch(parser, [
        five_sentence_bin, "--user-dir", PLUGIN_DIR, *task_args(arch), "--path",
        str(tiny_checkpoints(arch)), "--gen-subset", "test", "--batch-size", "2", "--results-path", str(tmp_path),
        "--max-len-b", "12", *DECODE])
    generate.main(args)
    out = (tmp_path / "generate-test.txt").read_text()
    hyps = _hyps(out)
    assert sorted(hyps) == list(range(5)), "one hypothesis per test sentence"
    _check_words_in_dictionary(five_sentence_bin, hyps)
    assert "BLEU4" in out


# ---- fairseq-interactive (stdin) and the hub interface ---------------------------------------------

def _interactive_args(arch, tiny_checkpoints, data_bin):
    return [data_bin, "--user-dir", PLUGIN_DIR, *task_args(arch), "--path", str(tiny_checkpoints(arch)),
            "--buffer-size", "2", *DECODE]


@pytest.fixture(scope="module")
def interactive_outputs(tiny_checkpoints, toy_databin):
    """arch -> stdout of fairseq-interactive's main() run in this process on SENTENCES as stdin."""
    import io
    import sys
    from contextlib import redirect_stdout

    from fairseq import distributed_utils, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import interactive

    outputs = {}
    for arch in sorted(ARCHS):
        args = options.parse_args_and_arch(options.get_interactive_generation_parser(),
                                           _interactive_args(arch, tiny_checkpoints, toy_databin[0]))
        stdin, out = sys.stdin, io.StringIO()
        sys.stdin = io.TextIOWrapper(io.BytesIO(("\n".join(SENTENCES) + "\n").encode()))
        try:
            with redirect_stdout(out):
                distributed_utils.call_main(convert_namespace_to_omegaconf(args), interactive.main)
        finally:
            sys.stdin = stdin
        outputs[arch] = out.getvalue()
    return outputs


def _check_interactive_output(out, data_bin):
    hyps = _hyps(out)
    assert sorted(hyps) == [0, 1, 2], out
    for i, s in enumerate(SENTENCES):
        assert re.search(rf"^S-{i}\t{re.escape(s)}$", out, re.M), "sources echoed in input order"
    _check_words_in_dictionary(data_bin, hyps)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_fairseq_interactive_reads_stdin(arch, interactive_outputs, toy_databin):
    _check_interactive_output(interactive_outputs[arch], toy_databin[0])


def test_fairseq_interactive_command_reads_a_stdin_pipe(interactive_outputs, tiny_checkpoints, toy_databin):
    """The real command with a pipe (one arch; the others through the same main() above)."""
    arch = "mask_predict"
    proc = subprocess.run([os.path.join(VENV_BIN, "fairseq-interactive"),
                           *_interactive_args(arch, tiny_checkpoints, toy_databin[0])],
                          input=("\n".join(SENTENCES) + "\n").encode(), capture_output=True, env=cli_env(),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    out = proc.stdout.decode()
    _check_interactive_output(out, toy_databin[0])
    assert _hyps(out) == _hyps(interactive_outputs[arch]), "the command and main() agree"


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_hub_interface_translates_like_interactive(arch, interactive_outputs, tiny_checkpoints, toy_databin):
    from fairseq.models import ARCH_MODEL_REGISTRY

    ckpt = tiny_checkpoints(arch)
    arch_name = ARCHS[arch][ARCHS[arch].index("--arch") + 1]
    hub = ARCH_MODEL_REGISTRY[arch_name].from_pretrained(
        str(ckpt.parent), checkpoint_file=ckpt.name, data_name_or_path=toy_databin[0], user_dir=PLUGIN_DIR)
    hub.eval()
    translations = hub.translate(SENTENCES, beam=2, iter_decode_max_iter=2)
    out = interactive_outputs[arch]
    assert translations == [_hyps(out)[i] for i in range(len(SENTENCES))], "hub == fairseq-interactive"
    # generate() on token ids: hypotheses carry tokens ending in </s>, inside the vocabulary
    tokens = [hub.encode(s) for s in SENTENCES]
    results = hub.generate(tokens, beam=2, iter_decode_max_iter=2)
    V = len(hub.task.target_dictionary)
    for res in results:
        toks = res[0]["tokens"]
        assert toks.dtype == torch.long and toks.numel() >= 1 and int(toks[-1]) == hub.task.target_dictionary.eos()
        assert int(toks.min()) >= 0 and int(toks.max()) < V


# ---- fairseq-hydra-train ---------------------------------------------------------------------------

#: task options of ARCHS -> keys of the hydra config's `task` (the example YAML sets only _name and data)
HYDRA_TASK_KEYS = {"--task": "task._name", "-s": "+task.source_lang", "-t": "+task.target_lang",
                   "--fertility-path": "+task.fertility_path"}


def _hydra_overrides(arch, data_bin, save):
    flags = arch_flags(arch, data_bin) + small_dims(arch)
    model = {"_name": flags[flags.index("--arch") + 1]}
    criterion = flags[flags.index("--criterion") + 1]
    task = []
    i = 0
    while i < len(flags):  # the remaining "--key value" / "--switch" flags become model.key=value
        if flags[i] in HYDRA_TASK_KEYS:
            task.append(f"{HYDRA_TASK_KEYS[flags[i]]}={flags[i + 1]}")
            i += 2
            continue
        if flags[i] in ("--arch", "--criterion"):
            i += 2
            continue
        key = flags[i][2:].replace("-", "_")
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            model[key], i = flags[i + 1], i + 2
        else:
            model[key], i = "true", i + 1
    known = {"_name", "encoder_layers", "decoder_layers", "encoder_embed_dim", "decoder_embed_dim",
             "encoder_ffn_embed_dim", "decoder_ffn_embed_dim", "encoder_attention_heads", "decoder_attention_heads",
             "share_all_embeddings", "encoder_attention_type"}
    return ([f"task.data={data_bin}", f"checkpoint.save_dir={save}", f"criterion._name={criterion}",
             "optimization.max_update=2", "dataset.max_tokens=400", "dataset.disable_validation=true",
             "checkpoint.no_epoch_checkpoints=true", "lr_scheduler.warmup_updates=1"] + task
            + [f"{'' if k in known else '+'}model.{k}={v}" for k, v in model.items()])


def _check_hydra_checkpoint(arch, save, data_bin, tiny_checkpoints):
    from fairseq import checkpoint_utils

    ckpt = save / "checkpoint_last.pt"
    state = checkpoint_utils.load_checkpoint_to_cpu(str(ckpt))
    assert state["optimizer_history"][-1]["num_updates"] == 2
    assert state["cfg"]["task"]["_name"] == ARCHS[arch][ARCHS[arch].index("--task") + 1], "the arch's own task"
    # a hydra checkpoint keeps its model config as a DictConfig: it must load like a CLI one, with the
    # arch's own sizes, and hold the same parameters (names and shapes) as fairseq-train's
    models, _ = checkpoint_utils.load_model_ensemble([str(ckpt)], arg_overrides={"data": data_bin})
    cli_state = checkpoint_utils.load_checkpoint_to_cpu(str(tiny_checkpoints(arch)))
    for key in ("source_lang", "target_lang", "left_pad_source", "left_pad_target"):  # the task's own defaults
        assert state["cfg"]["task"][key] == cli_state["cfg"]["task"][key], (arch, key)
    cli = cli_state["model"]
    ours = models[0].state_dict()
    assert ours.keys() == cli.keys(), arch
    assert all(ours[k].shape == cli[k].shape for k in cli), f"{arch}: hydra built other sizes"
    # options whose checkpoints from before them load with an older value (checkpoint_defaults): a new
    # hydra checkpoint stores the arch's value and loads with it, as a CLI one
    for key in getattr(type(models[0]), "checkpoint_defaults", {}):
        assert state["cfg"]["model"][key] == getattr(cli_state["cfg"]["model"], key), (arch, key)
        assert getattr(models[0].args, key) == getattr(cli_state["cfg"]["model"], key), (arch, key)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_fairseq_hydra_train_with_the_example_config(arch, tiny_checkpoints, toy_databin, tmp_path):
    """fairseq-hydra-train's main on examples/hydra/mask_predict.yaml, composed by hydra in this process."""
    from hydra import compose, initialize_config_dir

    from fairseq.dataclass.initialize import hydra_init
    from fairseq_cli.hydra_train import _hydra_main

    hydra_init("mask_predict")
    # version_base 1.1: what fairseq assumes (it still calls hydra.experimental.initialize itself)
    with initialize_config_dir(config_dir=os.path.join(ROOT, "examples", "hydra"), version_base="1.1"):
        cfg = compose(config_name="mask_predict", overrides=_hydra_overrides(arch, toy_databin[0], tmp_path / arch))
    cwd = os.getcwd()
    os.chdir(ROOT)  # common.user_dir in the YAML is relative to the repository root
    try:
        _hydra_main(cfg)
    finally:
        os.chdir(cwd)
    _check_hydra_checkpoint(arch, tmp_path / arch, toy_databin[0], tiny_checkpoints)


@pytest.mark.parametrize("arch", ["mask_predict", "kermit"])
def test_fairseq_hydra_train_command(arch, tiny_checkpoints, toy_databin, tmp_path):
    """The real command (the example config as it is, and with another task; the other archs through
    the same main() above)."""
    def run(save):
        return subprocess.run([os.path.join(VENV_BIN, "fairseq-hydra-train"), "--config-dir",
                               os.path.join(ROOT, "examples", "hydra"), "--config-name", "mask_predict",
                               *_hydra_overrides(arch, toy_databin[0], save)],
                              cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=400)

    proc = run(tmp_path / arch)
    if proc.returncode < 0:
        # Killed by a signal: in one CI run (2026-11-29, kermit) the process aborted with SIGABRT
        # ("terminate called without an active exception": a C++ std::thread destroyed while joinable,
        # from torch or fairseq, not from plugin code); 10 reruns here never reproduced it.  A fresh run
        # must then succeed; the first one's output is kept in the warning.
        warnings.warn(f"fairseq-hydra-train ({arch}) killed by signal {-proc.returncode}; rerun once.\n"
                      f"stdout: {proc.stdout[-1500:]}\nstderr: {proc.stderr[-1500:]}")
        tmp_path = tmp_path / "rerun"
        proc = run(tmp_path / arch)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    _check_hydra_checkpoint(arch, tmp_path / arch, toy_databin[0], tiny_checkpoints)
    assert not os.path.exists(os.path.join(ROOT, "outputs")) and not os.path.exists(os.path.join(ROOT, ".hydra")), \
        "the config keeps hydra from writing into the working directory"
