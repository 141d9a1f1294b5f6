"""Encoders built from the attention registry: drop-in for fairseq, padding-invariant, CLI end to end."""
import pytest
import torch

from conftest import PLUGIN_DIR, run_cli

import fairseq_nat_ext  # noqa: F401
from fairseq_nat_ext.modules.attention import ATTENTION_REGISTRY

TINY = ["--encoder-layers", "2", "--decoder-layers", "1", "--encoder-embed-dim", "16",
        "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings",
        "--dropout", "0"]
ATTN = ["--attention-window", "2", "--global-tokens", "2", "--block-size", "2", "--lsh-bucket-size", "2",
        "--linformer-k", "4", "--max-positions", "64", "--performer-features", "8"]


def build(data_bin, extra, task="translation", arch="efficient_transformer", attn=True):
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, [data_bin, "--task", task, "--arch", arch, "--user-dir", PLUGIN_DIR] + TINY + (ATTN if attn else []) + extra)
    t = tasks.setup_task(args)
    return t.build_model(args).eval()


def test_full_is_exactly_fairseqs_transformer(toy_databin):
    ours = build(toy_databin[0], [])
    theirs = build(toy_databin[0], [], arch="transformer", attn=False)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    ours.load_state_dict(theirs.state_dict())
    src = torch.tensor([[1, 5, 6, 2], [7, 8, 9, 2]])
    a = ours.encoder(src, src_lengths=torch.tensor([3, 4]))["encoder_out"][0]
    b = theirs.encoder(src, src_lengths=torch.tensor([3, 4]))["encoder_out"][0]
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("variant", sorted(ATTENTION_REGISTRY) + ["mix"])
def test_encoder_output_ignores_padding(toy_databin, variant):
    extra = ["--encoder-attention-type", variant]
    if variant == "mix":
        extra += ["--encoder-attention-mix", "local:1,lsh:1"]
    model = build(toy_databin[0], extra)
    enc = model.encoder
    seq = torch.tensor([5, 6, 7, 8, 9, 10, 2])
    alone = enc(seq[None], src_lengths=torch.tensor([7]))["encoder_out"][0][:, 0]
    padded = torch.cat([torch.ones(5, dtype=torch.long), seq])  # fairseq left-pads with index 1
    batch = torch.stack([padded, torch.arange(3, 15)])
    out = enc(batch, src_lengths=torch.tensor([7, 12]))["encoder_out"][0]
    torch.testing.assert_close(out[5:, 0], alone, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("extra", [["--encoder-attention-type", "bigbird"], ["--encoder-attention-type", "lsh"],
                                   ["--encoder-attention-type", "routing"],
                                   ["--encoder-attention-type", "linear", "--feature-map", "performer"],
                                   ["--encoder-attention-type", "lsh", "--checkpoint-activations"]])
def test_every_layer_draws_its_own_random_pattern(toy_databin, extra):
    """BigBird's random blocks, LSH's evaluation rotations, routing's initial centroids and the Performer's
    features differ between layers (one --attention-seed, a seed per layer) and are the same when the
    model is built again (checkpoints and runs reproduce)."""
    def patterns(model):
        out = []
        for layer in model.encoder.layers:
            attn = getattr(layer, "_checkpoint_wrapped_module", layer).self_attn
            out.append([b.clone() for m in attn.variants for b in m.buffers() if b.is_floating_point()])
        return out

    first, again = patterns(build(toy_databin[0], extra)), patterns(build(toy_databin[0], extra))
    assert first[0], "the variant keeps its random pattern in buffers"
    assert any(not torch.equal(a, b) for a, b in zip(first[0], first[1])), "layers 0 and 1 share a pattern"
    for layer, layer_again in zip(first, again):
        assert all(torch.equal(a, b) for a, b in zip(layer, layer_again))


def test_added_global_tokens_are_used_and_removed_from_the_output(toy_databin):
    model = build(toy_databin[0], ["--encoder-attention-type", "global", "--global-mode", "added"])
    enc = model.encoder
    assert enc.num_added_tokens == 2
    src = torch.tensor([[1, 1, 5, 6, 2], [7, 8, 9, 10, 2]])
    out = enc(src, src_lengths=torch.tensor([3, 5]))
    assert out["encoder_out"][0].shape == (5, 2, 16)
    assert torch.equal(out["encoder_padding_mask"][0], src.eq(1))
    with torch.no_grad():
        enc.added_tokens.add_(1.0)
    changed = enc(src, src_lengths=torch.tensor([3, 5]))["encoder_out"][0]
    assert not torch.allclose(changed, out["encoder_out"][0])


def test_nat_model_takes_the_same_attention_options(toy_databin):
    model = build(toy_databin[0], ["--encoder-attention-type", "mix", "--encoder-attention-mix",
                                   "linformer:1,bigbird:1"], task="nat_translation", arch="mask_predict_tiny")
    attn = model.encoder.layers[0].self_attn
    assert [name for name, _ in attn.spec] == ["linformer", "bigbird"]


@pytest.mark.slow
def test_cli_train_and_generate_with_mixed_heads(toy_databin, tmp_path):
    data_bin, _ = toy_databin
    save = tmp_path / "ckpt"
    run_cli(["fairseq-train", data_bin, "--user-dir", PLUGIN_DIR, "--task", "translation",
             "--arch", "efficient_transformer", "--encoder-attention-type", "mix",
             "--encoder-attention-mix", "local:1,linear:1", "--feature-map", "performer",
             "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500", "--max-update", "3",
             "--save-dir", str(save), "--no-epoch-checkpoints", "--num-workers", "0"] + TINY + ATTN)
    proc = run_cli(["fairseq-generate", data_bin, "--user-dir", PLUGIN_DIR, "--task", "translation",
                    "--path", str(save / "checkpoint_last.pt"), "--beam", "2", "--max-tokens", "500"])
    assert proc.stdout.count("\nH-") == 40


def test_cli_unknown_attention_type_is_one_line_error(toy_databin, tmp_path):
    proc = run_cli(["fairseq-train", toy_databin[0], "--user-dir", PLUGIN_DIR, "--task", "translation",
                    "--arch", "efficient_transformer", "--encoder-attention-type", "sparse_magic",
                    "--max-update", "1", "--max-tokens", "500", "--save-dir", str(tmp_path)] + TINY + ATTN,
                   check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "--encoder-attention-type" in last and "sparse_magic" in last
    assert "Traceback" not in proc.stderr
