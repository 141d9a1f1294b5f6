"""The CPU decoding route's one guard (modules/fast_route.py): the switch (--no-fast-decoding and the
environment variable), a user's subclass that overrides a replaced method, hooked and non-plain
projections -- each makes decoding run the model's own forward -- and, switched off, every generator with a
fast route returns the fast route's hypotheses without calling it."""
import pytest
import torch
import torch.nn as nn

from conftest import PLUGIN_DIR, build_model_and_task, run_cli

import fairseq_nat_ext  # noqa: F401,E402
from fairseq_nat_ext.generators.ctc_nat import CTCGenerator
from fairseq_nat_ext.generators.da_transformer import DAGenerator
from fairseq_nat_ext.generators.glat import GLATGenerator
from fairseq_nat_ext.generators.iterative_refinement import RefinementGenerator
from fairseq_nat_ext.generators.mask_predict import MaskPredictGenerator
from fairseq_nat_ext.models.nat.mask_predict import MaskPredictDecoder
from fairseq_nat_ext.modules import encoder_inference, fast_route, packed
from fairseq_nat_ext.modules import nat_decoder_inference as fast

SRC = torch.tensor([[1, 5, 6, 7, 2], [8, 9, 10, 11, 2], [1, 1, 12, 5, 2]])
SAMPLE = {"net_input": {"src_tokens": SRC, "src_lengths": SRC.ne(1).sum(1)}}


@pytest.fixture
def switch_restored(monkeypatch):
    monkeypatch.delenv(fast_route.ENV, raising=False)
    yield
    fast_route.set_enabled(True)


def _model(toy_databin, arch, *extra):
    task, model, _ = build_model_and_task(toy_databin[0], ["--arch", arch, *extra])
    torch.manual_seed(0)
    with torch.no_grad():  # decisive logits: no near-ties that float rounding could flip between routes
        model.decoder.embed_tokens.weight.mul_(8.0)
    return task, model.eval()


def test_switch_and_environment_variable(toy_databin, switch_restored, monkeypatch):
    _, model = _model(toy_databin, "mask_predict_tiny")
    assert fast.supported(model.decoder) and encoder_inference.supported(model.encoder)
    assert packed.supports_decoder(model.decoder)
    fast_route.set_enabled(False)
    assert not fast.supported(model.decoder) and not encoder_inference.supported(model.encoder)
    assert not packed.supports_decoder(model.decoder)
    fast_route.set_enabled(True)
    monkeypatch.setenv(fast_route.ENV, "1")
    assert not fast.supported(model.decoder) and not packed.supports_decoder(model.decoder)
    monkeypatch.setenv(fast_route.ENV, "0")
    assert fast.supported(model.decoder)


class ShiftedDecoder(MaskPredictDecoder):
    """A user's subclass: its features push every position towards one token."""

    target = 7

    def extract_features(self, prev_output_tokens, encoder_out=None, **kwargs):
        x, extra = super().extract_features(prev_output_tokens, encoder_out=encoder_out, **kwargs)
        return x + 100.0 * self.embed_tokens.weight[self.target].detach(), extra


class EmbeddingOverride(MaskPredictDecoder):
    def forward_embedding(self, prev_output_tokens, states=None):
        return super().forward_embedding(prev_output_tokens, states)


def test_a_subclass_override_decodes_through_the_override(toy_databin):
    _, model = _model(toy_databin, "mask_predict_tiny")
    gen = MaskPredictGenerator([model], model.decoder.dictionary, max_iter=2)
    before = gen.generate([model], SAMPLE)
    assert not all(set(h[0]["tokens"][:-1].tolist()) == {ShiftedDecoder.target} for h in before)
    model.decoder.__class__ = ShiftedDecoder
    assert not fast.supported(model.decoder) and not packed.supports_decoder(model.decoder)
    for h in gen.generate([model], SAMPLE):
        assert set(h[0]["tokens"][:-1].tolist()) == {ShiftedDecoder.target}
    model.decoder.__class__ = EmbeddingOverride
    assert not fast.supported(model.decoder)
    model.decoder.__class__ = MaskPredictDecoder
    assert fast.supported(model.decoder)


class LoRALinear(nn.Linear):
    """A projection that is not a plain nn.Linear (a low-rank update)."""

    def forward(self, x):
        return super().forward(x) + 0.0 * x.sum(-1, keepdim=True)


def test_hooked_or_non_plain_projections_fall_back(toy_databin):
    _, model = _model(toy_databin, "mask_predict_tiny")
    layer = model.decoder.layers[0]
    handle = layer.fc1.register_forward_hook(lambda m, i, o: o)
    assert not fast.supported(model.decoder) and not packed.supports_decoder(model.decoder)
    handle.remove()
    handle = model.encoder.layers[0].self_attn.q_proj.register_forward_pre_hook(lambda m, i: None)
    assert not encoder_inference.supported(model.encoder)
    handle.remove()
    assert fast.supported(model.decoder) and encoder_inference.supported(model.encoder)
    plain = layer.self_attn.out_proj
    lora = LoRALinear(plain.in_features, plain.out_features)
    lora.load_state_dict(plain.state_dict())
    layer.self_attn.out_proj = lora
    assert not fast.supported(model.decoder)
    layer.self_attn.out_proj = plain
    assert fast.supported(model.decoder)


GENERATORS = [
    ("mask_predict_tiny", (), lambda m: MaskPredictGenerator([m], m.decoder.dictionary, max_iter=4, length_beam=2)),
    ("ctc_nat_tiny", (), lambda m: CTCGenerator([m], m.decoder.dictionary, beam=1)),
    ("ctc_nat_tiny", (), lambda m: CTCGenerator([m], m.decoder.dictionary, beam=3)),
    ("iterative_refinement_tiny", (), lambda m: RefinementGenerator([m], m.decoder.dictionary, max_iter=3)),
    ("glat_tiny", (), lambda m: GLATGenerator([m], m.decoder.dictionary, length_beam=2)),
    ("da_transformer_tiny", ("--dag-upsample-ratio", "4"),
     lambda m: DAGenerator([m], m.decoder.dictionary, dag_decoder="lookahead")),
]


@pytest.mark.parametrize("arch,extra,make", GENERATORS, ids=[g[0] + str(i) for i, g in enumerate(GENERATORS)])
def test_switched_off_every_generator_gives_the_same_hypotheses_without_the_route(
        toy_databin, switch_restored, monkeypatch, arch, extra, make):
    _, model = _model(toy_databin, arch, *extra)
    gen = make(model)
    on = gen.generate([model], SAMPLE)
    fast_route.set_enabled(False)

    def refuse(*a, **k):
        raise AssertionError("the fast route ran although it was switched off")

    for mod, name in ((fast, "decoder_features"), (fast, "token_features"), (fast, "cross_kv"),
                      (encoder_inference, "encode"), (packed, "decoder_features")):
        monkeypatch.setattr(mod, name, refuse)
    off = gen.generate([model], SAMPLE)
    for a, b in zip(on, off):
        assert a[0]["tokens"].tolist() == b[0]["tokens"].tolist()
        assert abs(float(a[0]["score"]) - float(b[0]["score"])) < 1e-3


def test_no_fast_decoding_is_a_task_option_that_build_generator_applies(toy_databin, switch_restored):
    from fairseq import options, tasks

    _, model = _model(toy_databin, "mask_predict_tiny")
    for flag, want in (([], True), (["--no-fast-decoding"], False), ([], True)):
        parser = options.get_generation_parser()
        args = options.parse_args_and_arch(parser, [toy_databin[0], "--user-dir", PLUGIN_DIR, "--task",
                                                    "nat_translation", *flag])
        task = tasks.setup_task(args)
        task.build_generator([model], args)
        assert fast_route.enabled() is want
        assert fast.supported(model.decoder) is want


def test_no_fast_decoding_in_training_switches_the_packed_training_passes_off(toy_databin, switch_restored):
    from fairseq import options, tasks

    _, model = _model(toy_databin, "levenshtein_tiny")
    model.train()
    for flag, want in (([], True), (["--no-fast-decoding"], False), ([], True)):
        parser = options.get_training_parser()
        args = options.parse_args_and_arch(parser, [toy_databin[0], "--user-dir", PLUGIN_DIR, "--task",
                                                    "nat_translation", "--arch", "levenshtein_tiny", *flag])
        tasks.setup_task(args)
        assert fast_route.enabled() is want and packed.supports_decoder(model.decoder) is want


def test_fairseq_generate_accepts_no_fast_decoding(toy_databin, tmp_path):
    save = str(tmp_path / "ckpt")
    run_cli(["fairseq-train", toy_databin[0], "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
             "--arch", "mask_predict_tiny", "--criterion", "mask_predict_loss", "--optimizer", "adam",
             "--lr", "1e-3", "--max-tokens", "800", "--max-update", "2", "--save-dir", save,
             "--no-epoch-checkpoints", "--num-workers", "0", "--seed", "1"])
    p = run_cli(["fairseq-generate", toy_databin[0], "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                 "--path", f"{save}/checkpoint_last.pt", "--gen-subset", "test", "--batch-size", "8",
                 "--iter-decode-max-iter", "3", "--no-fast-decoding"])
    assert sum(line.startswith("H-") for line in p.stdout.splitlines()) == 40


@pytest.mark.parametrize("route", ["padded", "packed"])
def test_decoder_layerdrop_draws_what_fairseqs_forward_draws_on_both_routes(toy_databin, route):
    """fairseq's LayerDropModuleList draws one uniform per layer whenever it is iterated (eval mode too):
    one decoder pass on either fast route draws as many as one pass of fairseq's forward, so seeded
    sampling after it is the same."""
    from fairseq_nat_ext.modules import cpu_linear

    _, model = _model(toy_databin, "mask_predict_tiny", "--decoder-layerdrop", "0.2")
    src = SRC[:2]
    enc = model.encoder(src, src_lengths=src.ne(1).sum(1))
    tokens = torch.tensor([[model.mask_idx] * 4, [model.mask_idx] * 3 + [1]])
    torch.manual_seed(0)
    with torch.enable_grad():
        want = model.decoder(tokens, enc, normalize=True)  # fairseq's layer loop
    after_fairseq = torch.rand(4)
    with torch.no_grad(), cpu_linear.decoding([model]):
        cross = fast.cross_kv(model.decoder, enc)
        if route == "padded":
            cross.plan = None
        else:
            assert cross.plan is not None and cross.plan.layerdrop == 2
        torch.manual_seed(0)
        feats = fast.token_features(model.decoder, tokens, cross)
        after_fast = torch.rand(4)
    assert torch.equal(after_fast, after_fairseq)
    valid = tokens.ne(1)
    got = torch.log_softmax(model.decoder.output_layer(feats).float(), -1)
    torch.testing.assert_close(got[valid], want.detach()[valid], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("extra", [["--layernorm-embedding"], ["--no-scale-embedding"],
                                   ["--layernorm-embedding", "--no-scale-embedding", "--decoder-normalize-before"]],
                         ids=["layernorm_embedding", "no_scale_embedding", "all"])
def test_nat_decoder_route_equals_fairseqs_forward_with_embedding_options(toy_databin, extra):
    from fairseq_nat_ext.modules import cpu_linear

    _, model = _model(toy_databin, "mask_predict_tiny", *extra)
    if "--layernorm-embedding" in extra:
        assert model.decoder.layernorm_embedding is not None
    if "--no-scale-embedding" in extra:
        assert model.decoder.embed_scale == 1.0
    src = SRC
    enc = model.encoder(src, src_lengths=src.ne(1).sum(1))
    tokens = torch.tensor([[model.mask_idx, 9, model.mask_idx, 5], [7, model.mask_idx, 1, 1],
                           [model.mask_idx] * 4])
    with torch.enable_grad():
        want = model.decoder(tokens, enc, normalize=True).detach()  # fairseq's extract_features
    valid = tokens.ne(1)
    for plan in (False, True):
        with torch.no_grad(), cpu_linear.decoding([model]):
            cross = fast.cross_kv(model.decoder, enc)
            if not plan:
                cross.plan = None
            feats = fast.token_features(model.decoder, tokens, cross)
            got = torch.log_softmax(model.decoder.output_layer(feats).float(), -1)
        torch.testing.assert_close(got[valid], want[valid], atol=1e-4, rtol=1e-4)


def test_guard_is_computed_once_per_module_inside_a_decoding_call(toy_databin, switch_restored, monkeypatch):
    from fairseq_nat_ext.modules import module_walk

    _, model = _model(toy_databin, "mask_predict_tiny")
    walks = []
    real = module_walk.submodules
    monkeypatch.setattr(module_walk, "submodules", lambda m: walks.append(m) or real(m))

    def decoder_walks():
        return sum(m is model.decoder for m in walks)

    for _ in range(3):
        assert fast.supported(model.decoder)
    outside = decoder_walks()
    assert outside >= 3  # no decoding call: every question walks the tree again
    walks.clear()
    with fast_route.decoding_call():
        with fast_route.decoding_call():  # nested: the outer call's answers
            for _ in range(3):
                assert fast.supported(model.decoder) and fast_route.allows(model.decoder)
                assert encoder_inference.supported(model.encoder) and packed.supports_decoder(model.decoder)
    assert decoder_walks() == outside // 3  # the walks of one supported(), however often each is asked
    # a hook added after the call is seen by the next one (the answers do not outlive their call)
    handle = model.decoder.layers[0].fc1.register_forward_hook(lambda *a: None)
    with fast_route.decoding_call():
        assert not fast.supported(model.decoder) and not fast_route.allows(model.decoder)
        assert not packed.supports_decoder(model.decoder)
    handle.remove()
    with pytest.raises(RuntimeError):  # an error inside a call ends it too
        with fast_route.decoding_call():
            assert fast.supported(model.decoder)
            raise RuntimeError
    assert fast_route._call["cache"] is None


def test_inference_step_is_one_decoding_call(toy_databin, switch_restored, monkeypatch):
    from fairseq_nat_ext.modules import module_walk

    task, model = _model(toy_databin, "glat_tiny")
    gen = GLATGenerator([model], model.decoder.dictionary, length_beam=2)
    walks = []
    real = module_walk.submodules
    monkeypatch.setattr(module_walk, "submodules", lambda m: walks.append(m) or real(m))
    with torch.no_grad():
        gen.generate([model], SAMPLE)
        direct = sum(m is model.decoder for m in walks)
        walks.clear()
        task.inference_step(gen, [model], SAMPLE)
    via_task = sum(m is model.decoder for m in walks)
    assert via_task < direct  # GLAT's generator and model both ask: once per call through the task
