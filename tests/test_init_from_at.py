"""Initialising a NAT model from an autoregressive Transformer (fairseq_nat_ext.init_from_at)."""
import os
import sys

import pytest
import torch

from conftest import PLUGIN_DIR, build_model_and_task, cli_env, run_cli

import fairseq_nat_ext  # noqa: F401
from fairseq_nat_ext.compat import InputError
from fairseq_nat_ext.init_from_at import transfer_state

TINY = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32",
        "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings"]


def test_transfer_rule_on_small_states():
    at = {"enc.w": torch.randn(3, 4), "emb": torch.randn(5, 4), "dec.only_at": torch.ones(2)}
    nat = {"enc.w": torch.zeros(3, 4), "emb": torch.zeros(6, 4), "len.w": torch.full((2,), 7.0)}
    out, report = transfer_state(nat, at)
    assert torch.equal(out["enc.w"], at["enc.w"])
    assert torch.equal(out["emb"][:5], at["emb"]) and torch.equal(out["emb"][5], torch.zeros(4))
    assert torch.equal(out["len.w"], nat["len.w"])
    assert report == {"copied": ["enc.w"], "grown": ["emb"], "nat_only": ["len.w"],
                      "at_only": ["dec.only_at"]}
    assert torch.equal(nat["enc.w"], torch.zeros(3, 4)), "input state must not be modified"


@pytest.mark.parametrize("nat_shape", [(3, 8), (40, 4), (2, 4)])
def test_shape_mismatch_is_one_line_error(nat_shape):
    with pytest.raises(InputError) as err:
        transfer_state({"w": torch.zeros(*nat_shape)}, {"w": torch.zeros(3, 4)}, at_name="t.pt")
    msg = str(err.value)
    assert "\n" not in msg and "t.pt" in msg and "w" in msg and "(3, 4)" in msg


def test_nothing_in_common_is_an_error():
    with pytest.raises(InputError, match="no parameter in common"):
        transfer_state({"a": torch.zeros(1)}, {"b": torch.zeros(1)})


def test_nat_encoder_computes_exactly_what_the_at_encoder_computes(toy_databin):
    """After the transfer the NAT encoder is the AT encoder (same outputs on real batches)."""
    data_bin, _ = toy_databin
    from fairseq import options, tasks

    parser = options.get_training_parser()
    at_args = options.parse_args_and_arch(
        parser, [data_bin, "--task", "translation", "--arch", "transformer"] + TINY)
    at_task = tasks.setup_task(at_args)
    at_model = at_task.build_model(at_args).eval()
    _, nat_model, _ = build_model_and_task(data_bin, ["--arch", "mask_predict_tiny"] + TINY)
    nat_model.eval()
    state, report = transfer_state(nat_model.state_dict(), at_model.state_dict())
    nat_model.load_state_dict(state)
    assert report["at_only"] == [] and report["copied"]
    src = torch.tensor([[5, 6, 7, 8, 2], [1, 9, 10, 11, 2]])  # 1 = pad (left-padded), 2 = eos
    lengths = torch.tensor([5, 4])
    with torch.no_grad():
        a = at_model.encoder(src, src_lengths=lengths)["encoder_out"][0]
        b = nat_model.encoder(src, src_lengths=lengths)["encoder_out"][0]
    torch.testing.assert_close(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["ours", "fairseq"])
def test_cli_initialise_then_finetune(toy_databin, tmp_path, impl):
    data_bin, _ = toy_databin
    at_dir = tmp_path / "at"
    common = ["--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500", "--max-update", "2",
              "--num-workers", "0", "--no-epoch-checkpoints", "--no-progress-bar"] + TINY
    run_cli(["fairseq-train", data_bin, "--task", "translation", "--arch", "transformer",
             "--save-dir", str(at_dir)] + common)
    teacher = str(at_dir / "checkpoint_last.pt")
    if impl == "ours":
        system = ["--task", "nat_translation", "--arch", "mask_predict_tiny",
                  "--criterion", "mask_predict_loss"]
    else:
        system = ["--task", "translation_lev", "--noise", "random_mask", "--arch", "cmlm_transformer",
                  "--criterion", "nat_loss"]
    nat_dir = tmp_path / "nat"
    train_args = [data_bin, "--user-dir", PLUGIN_DIR, "--save-dir", str(nat_dir)] + system + common
    init = str(tmp_path / "init.pt")
    proc = run_cli([sys.executable, "-m", "fairseq_nat_ext.init_from_at", "--teacher", teacher,
                    "--out", init, "--"] + train_args)
    assert "copied" in proc.stdout and os.path.exists(init)
    proc = run_cli(["fairseq-train"] + train_args + ["--finetune-from-model", init])
    assert "loading pretrained model from " + init in proc.stdout + proc.stderr
    # the fine-tuned model started from the teacher: its encoder embedding rows still match closely
    from fairseq import checkpoint_utils

    at_emb = checkpoint_utils.load_checkpoint_to_cpu(teacher)["model"]["encoder.embed_tokens.weight"]
    nat_emb = checkpoint_utils.load_checkpoint_to_cpu(str(nat_dir / "checkpoint_last.pt"))["model"][
        "encoder.embed_tokens.weight"]
    assert (nat_emb[: at_emb.shape[0]] - at_emb).abs().max() < 0.05


def test_cli_refuses_a_teacher_of_another_size(toy_databin, tmp_path):
    data_bin, _ = toy_databin
    path = tmp_path / "small.pt"
    torch.save({"model": {"encoder.embed_tokens.weight": torch.zeros(3, 7)}, "args": None,
                "optimizer_history": [{"criterion_name": "x", "optimizer_name": "adam",
                                       "lr_scheduler_state": {}, "num_updates": 0}],
                "extra_state": {"train_iterator": {"epoch": 1}}}, path)
    proc = run_cli([sys.executable, "-m", "fairseq_nat_ext.init_from_at", "--teacher", str(path),
                    "--out", str(tmp_path / "o.pt"), "--", data_bin, "--user-dir", PLUGIN_DIR,
                    "--task", "nat_translation", "--arch", "mask_predict_tiny"] + TINY, check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "small.pt" in last and "shape" in last
    assert not (tmp_path / "o.pt").exists()


def test_single_stack_takes_encoder_then_decoder_layers_without_cross_attention():
    """KERMIT's stack: AT encoder layers first, then the AT decoder's (self-attention, norms, FFN),
    the embeddings from the encoder; cross-attention is left out (at_only)."""
    t = lambda v: torch.full((2, 2), float(v))  # noqa: E731
    at = {
        "encoder.embed_tokens.weight": t(1),
        "encoder.layers.0.fc1.weight": t(2), "encoder.layers.1.fc1.weight": t(3),
        "decoder.embed_tokens.weight": t(4),
        "decoder.layers.0.fc1.weight": t(5), "decoder.layers.0.encoder_attn.k_proj.weight": t(6),
        "decoder.layers.0.encoder_attn_layer_norm.weight": t(7), "decoder.output_projection.weight": t(8),
    }
    nat = {"stack.embed_tokens.weight": t(0), "stack.layers.0.fc1.weight": t(0),
           "stack.layers.1.fc1.weight": t(0), "stack.layers.2.fc1.weight": t(0),
           "segment_embed.weight": t(0)}
    out, report = transfer_state(nat, at)
    assert [float(out[k][0, 0]) for k in nat] == [1, 2, 3, 5, 0]
    assert report["nat_only"] == ["segment_embed.weight"]
    assert not any("encoder_attn" in k for k in report["copied"])
    assert report["at_only"] == ["decoder.embed_tokens.weight", "decoder.layers.0.encoder_attn.k_proj.weight",
                                 "decoder.layers.0.encoder_attn_layer_norm.weight",
                                 "decoder.output_projection.weight"]
