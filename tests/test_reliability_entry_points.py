"""Every plugin translation arch (tests/reliability_utils.ARCHS) through fairseq's other entry points:
fairseq-generate, fairseq-interactive reading stdin, the hub interface (from_pretrained, then
translate / generate), and fairseq-hydra-train with the YAML config in examples/hydra/ (the plugin
named by common.user_dir).  The interactive and hydra runs start the real command-line tools, two at
a time; generate and the hub run in this process (the generate CLI itself is exercised per arch by
tests/test_e2e_mask_predict.py, test_levenshtein.py, test_insertion_transformer.py and
test_efficient_encoder.py)."""
import os
import re
import subprocess

import pytest
import torch

from conftest import PLUGIN_DIR, ROOT, VENV_BIN, cli_env
from reliability_utils import ARCHS, SMALL_DIMS

import fairseq_nat_ext  # noqa: F401

SENTENCES = ["w1 w2 w3", "w10 w4", "w7 w7 w7 w7 w2"]
DECODE = ["--iter-decode-max-iter", "2", "--beam", "2"]


def _hyps(text):
    """{id: hypothesis} from the H- lines fairseq prints."""
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^H-(\d+)\t\S+\t(.*)$", text, re.M)}


def _run_two_at_a_time(commands, **kw):
    """[(args, stdin bytes)] -> CompletedProcess-like tuples (returncode, stdout, stderr), in order."""
    results = [None] * len(commands)
    for start in range(0, len(commands), 2):
        procs = []
        for i in range(start, min(start + 2, len(commands))):
            args, stdin = commands[i]
            p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=cli_env(), **kw)
            procs.append((i, p, stdin))
        for i, p, stdin in procs:
            out, err = p.communicate(stdin, timeout=400)
            results[i] = (p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
    return results


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
        five_sentence_bin, "--user-dir", PLUGIN_DIR, "--task", "nat_translation", "--path",
        str(tiny_checkpoints(arch)), "--gen-subset", "test", "--batch-size", "2", "--results-path", str(tmp_path),
        "--max-len-b", "12", *DECODE])
    generate.main(args)
    out = (tmp_path / "generate-test.txt").read_text()
    hyps = _hyps(out)
    assert sorted(hyps) == list(range(5)), "one hypothesis per test sentence"
    _check_words_in_dictionary(five_sentence_bin, hyps)
    assert "BLEU4" in out


# ---- fairseq-interactive (stdin) and the hub interface ---------------------------------------------

@pytest.fixture(scope="module")
def interactive_outputs(tiny_checkpoints, toy_databin):
    data_bin = toy_databin[0]
    cmds = [([os.path.join(VENV_BIN, "fairseq-interactive"), data_bin, "--user-dir", PLUGIN_DIR,
              "--task", "nat_translation", "--path", str(tiny_checkpoints(arch)), "--buffer-size", "2", *DECODE],
             ("\n".join(SENTENCES) + "\n").encode()) for arch in sorted(ARCHS)]
    return dict(zip(sorted(ARCHS), _run_two_at_a_time(cmds)))


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_fairseq_interactive_reads_stdin(arch, interactive_outputs, toy_databin):
    rc, out, err = interactive_outputs[arch]
    assert rc == 0, err[-3000:]
    hyps = _hyps(out)
    assert sorted(hyps) == [0, 1, 2], out
    for i, s in enumerate(SENTENCES):
        assert re.search(rf"^S-{i}\t{re.escape(s)}$", out, re.M), "sources echoed in input order"
    _check_words_in_dictionary(toy_databin[0], hyps)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_hub_interface_translates_like_interactive(arch, interactive_outputs, tiny_checkpoints, toy_databin):
    from fairseq.models import ARCH_MODEL_REGISTRY

    ckpt = tiny_checkpoints(arch)
    arch_name = ARCHS[arch][ARCHS[arch].index("--arch") + 1]
    hub = ARCH_MODEL_REGISTRY[arch_name].from_pretrained(
        str(ckpt.parent), checkpoint_file=ckpt.name, data_name_or_path=toy_databin[0], user_dir=PLUGIN_DIR)
    hub.eval()
    translations = hub.translate(SENTENCES, beam=2, iter_decode_max_iter=2)
    rc, out, _ = interactive_outputs[arch]
    assert rc == 0
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

def _hydra_overrides(arch, data_bin, save):
    flags = ARCHS[arch] + SMALL_DIMS
    model = {"_name": flags[flags.index("--arch") + 1]}
    criterion = flags[flags.index("--criterion") + 1]
    i = 0
    while i < len(flags):  # the remaining "--key value" / "--switch" flags become model.key=value
        if flags[i] in ("--task", "--arch", "--criterion"):
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
             "checkpoint.no_epoch_checkpoints=true", "lr_scheduler.warmup_updates=1"]
            + [f"{'' if k in known else '+'}model.{k}={v}" for k, v in model.items()])


def test_fairseq_hydra_train_with_the_example_config(tiny_checkpoints, toy_databin, tmp_path):
    from fairseq import checkpoint_utils

    data_bin = toy_databin[0]
    exe = os.path.join(VENV_BIN, "fairseq-hydra-train")
    cmds = [([exe, "--config-dir", os.path.join(ROOT, "examples", "hydra"), "--config-name", "mask_predict",
              *_hydra_overrides(arch, data_bin, tmp_path / arch)], b"") for arch in sorted(ARCHS)]
    results = _run_two_at_a_time(cmds, cwd=ROOT)  # common.user_dir in the YAML is relative to the repo root
    for arch, (rc, out, err) in zip(sorted(ARCHS), results):
        assert rc == 0, f"{arch}:\n{err[-3000:]}"
        ckpt = tmp_path / arch / "checkpoint_last.pt"
        state = checkpoint_utils.load_checkpoint_to_cpu(str(ckpt))
        assert state["optimizer_history"][-1]["num_updates"] == 2
        # a hydra checkpoint keeps its model config as a DictConfig: it must load like a CLI one,
        # with the arch's own sizes, and give the same parameter names as fairseq-train's
        models, _ = checkpoint_utils.load_model_ensemble([str(ckpt)], arg_overrides={"data": data_bin})
        cli = checkpoint_utils.load_checkpoint_to_cpu(str(tiny_checkpoints(arch)))["model"]
        ours = models[0].state_dict()
        assert ours.keys() == cli.keys(), arch
        assert all(ours[k].shape == cli[k].shape for k in cli), f"{arch}: hydra built other sizes"
