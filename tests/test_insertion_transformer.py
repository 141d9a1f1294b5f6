"""Insertion Transformer: slot loss against an explicit per-slot loop, decoding, CLI end to end."""
import math

import pytest
import torch

from conftest import build_model_and_task, train_then_generate

import fairseq_nat_ext  # noqa: F401


@pytest.fixture(scope="module")
def model_task(toy_databin):
    torch.manual_seed(0)  # the same model whatever ran before (loss comparisons below depend on it)
    task, model, _ = build_model_and_task(toy_databin[0], ["--arch", "insertion_tiny", "--dropout", "0"])
    task.load_dataset("valid")
    return model.eval(), task


def batch(task, n=5):
    ds = task.datasets["valid"]
    return ds.collater([ds[i] for i in range(n)])


def end_label(model):
    """The end-of-slot label as --insertion-end-symbol names it."""
    return {"pad": model.pad, "eos": model.eos}[model.args.insertion_end_symbol]


@pytest.mark.parametrize("end", ["pad", "eos"])
@pytest.mark.parametrize("tau", [0.0, 1.0, 2.5])
def test_loss_equals_explicit_per_slot_computation(model_task, tau, end):
    model, task = model_task
    model.args.insertion_tau = tau
    model.args.insertion_end_symbol = end
    try:
        _check_loss_against_loop(model, task, tau)
    finally:
        model.args.insertion_end_symbol = "pad"


def _check_loss_against_loop(model, task, tau):
    s = batch(task)
    torch.manual_seed(0)
    canvas = model.inject_noise(s["target"])
    src, lens = s["net_input"]["src_tokens"], s["net_input"]["src_lengths"]
    loss = model(src, lens, canvas, s["target"])["insertion"]["loss"]
    enc = model.encoder(src, src_lengths=lens)
    lp = model.decoder.forward_slots(canvas, enc, normalize=True)
    total, n = 0.0, 0
    for b in range(canvas.size(0)):
        c = [x for x in canvas[b].tolist() if x != model.pad]
        t = [model.bos] + [x for x in s["target"][b].tolist() if x != model.pad]
        # canvas = subsequence of t; the oracle's tie rule embeds it as far right as possible
        pos = canvas_positions(c, t)
        for k in range(len(c) - 1):
            span = t[pos[k] + 1:pos[k + 1]]
            if not span:
                total += -float(lp[b, k, end_label(model)])
            else:
                L = len(span)
                if tau > 0:
                    e = [math.exp(-abs(r - (L - 1) / 2) / tau) for r in range(L)]
                    w = [x / sum(e) for x in e]
                else:
                    w = [1 / L] * L
                total += -sum(wi * float(lp[b, k, tok]) for wi, tok in zip(w, span))
            n += 1
    assert abs(float(loss) - total / n) < 1e-4


@pytest.mark.parametrize("span_targets", ["sum", "fairseq"])
def test_span_targets_of_repeated_tokens(model_task, span_targets):
    """A token repeated within a missing span: Stern et al.'s loss sums its weights (``sum``); fairseq's
    ``_get_ins_targets`` scatters every occurrence into one (slot, token) cell, so only the last one's
    weight stays (``fairseq``).  Reference: a plain loop over the spans of empty canvases."""
    model, task = model_task
    saved_tau = model.args.insertion_tau
    model.args.insertion_span_targets, model.args.insertion_tau = span_targets, 1.0
    s = batch(task, 4)
    d = task.target_dictionary
    a, b_, c = d.nspecial, d.nspecial + 1, d.nspecial + 2
    tgt = torch.tensor([[a, b_, a, c, b_, d.eos()], [c, c, c, a, d.eos(), d.pad()],
                        [a, b_, c, d.eos(), d.pad(), d.pad()], [b_, a, a, b_, a, d.eos()]])
    B = tgt.size(0)
    canvas = torch.tensor([[model.bos, model.eos]] * B)  # one slot: the whole target is missing
    src, lens = s["net_input"]["src_tokens"], s["net_input"]["src_lengths"]
    try:
        loss = float(model(src, lens, canvas, tgt)["insertion"]["loss"])
    finally:
        model.args.insertion_span_targets, model.args.insertion_tau = "sum", saved_tau
    with torch.no_grad():
        lp = model.decoder.forward_slots(canvas, model.encoder(src, src_lengths=lens), normalize=True)
    total = 0.0
    for b in range(B):
        span = [x for x in tgt[b].tolist() if x not in (model.pad, model.eos)]
        L = len(span)
        e = [math.exp(-abs(r - (L - 1) / 2) / 1.0) for r in range(L)]
        w = [x / sum(e) for x in e]
        cell = {}
        for wi, tok in zip(w, span):
            cell[tok] = cell.get(tok, 0.0) + wi if span_targets == "sum" else wi
        total += -sum(v * float(lp[b, 0, tok]) for tok, v in cell.items())
    assert loss == pytest.approx(total / B, abs=1e-4)


def test_fairseq_span_targets_equal_fairseqs_own(model_task):
    """With ``--insertion-end-symbol pad --insertion-span-targets fairseq`` the loss is the cross-entropy
    against fairseq's own ``_get_ins_targets`` (libnat's edit path, its binary-tree scores, its scatter),
    on canvases whose alignment to the target is unique (kept tokens occur once in the target)."""
    pytest.importorskip("fairseq.libnat")
    from fairseq.models.nat.insertion_transformer import _get_ins_targets

    model, task = model_task
    d = task.target_dictionary
    a, b_, c, e = (d.nspecial + i for i in range(4))
    tgt = torch.tensor([[a, b_, a, c, b_, d.eos()], [c, c, e, c, a, d.eos()],
                        [a, b_, e, d.eos(), d.pad(), d.pad()], [b_, a, a, e, a, d.eos()]])
    canvas = torch.tensor([[d.bos(), c, d.eos(), d.pad()], [d.bos(), e, a, d.eos()],
                           [d.bos(), d.eos(), d.pad(), d.pad()], [d.bos(), e, d.eos(), d.pad()]])
    s = batch(task, 4)
    src, lens = s["net_input"]["src_tokens"], s["net_input"]["src_lengths"]
    saved = (model.args.insertion_end_symbol, model.args.insertion_tau)
    model.args.insertion_end_symbol, model.args.insertion_tau = "pad", 1.0
    model.args.insertion_span_targets = "fairseq"
    try:
        with torch.no_grad():
            loss = float(model(src, lens, canvas, tgt)["insertion"]["loss"])
            lp = model.decoder.forward_slots(canvas, model.encoder(src, src_lengths=lens), normalize=True)
    finally:
        model.args.insertion_end_symbol, model.args.insertion_tau = saved
        model.args.insertion_span_targets = "sum"
    full = torch.cat([torch.full((4, 1), d.bos()), tgt], 1)
    t = _get_ins_targets(canvas, full, d.pad(), d.unk(), len(d), tau=1.0).type_as(lp)
    masks = canvas[:, 1:].ne(d.pad())
    ref = float(-(t * lp).sum(-1)[masks].mean())
    assert loss == pytest.approx(ref, abs=1e-4)
    assert float(t.sum(-1)[masks].min()) < 0.99, "some span lost a repeated token's weight"


def test_fairseq_options_give_fairseqs_loss_on_any_canvas(model_task):
    """With every fairseq option (``--insertion-end-symbol pad --insertion-span-targets fairseq
    --insertion-alignment leftmost``) the loss is the cross-entropy against fairseq's own
    ``_get_ins_targets`` on any canvas, repeated tokens included: random targets over three symbols,
    canvases from fairseq's deletion noise."""
    pytest.importorskip("fairseq.libnat")
    from fairseq.models.nat.insertion_transformer import _get_ins_targets

    model, task = model_task
    d = task.target_dictionary
    s = batch(task, 5)
    src, lens = s["net_input"]["src_tokens"], s["net_input"]["src_lengths"]
    g = torch.Generator().manual_seed(5)
    rows = [torch.randint(d.nspecial, d.nspecial + 3, (int(n),), generator=g).tolist() + [d.eos()]
            for n in torch.randint(2, 14, (5,), generator=g)]
    T = max(map(len, rows))
    tgt = torch.tensor([r + [d.pad()] * (T - len(r)) for r in rows])
    opts = dict(insertion_end_symbol="pad", insertion_tau=1.0, insertion_span_targets="fairseq",
                insertion_alignment="leftmost", deletion_noise="fairseq")
    saved = {k: getattr(model.args, k) for k in opts}
    vars(model.args).update(opts)
    try:
        for seed in range(4):
            torch.manual_seed(seed)
            canvas = model.inject_noise(tgt)
            with torch.no_grad():
                loss = float(model(src, lens, canvas, tgt)["insertion"]["loss"])
                lp = model.decoder.forward_slots(canvas, model.encoder(src, src_lengths=lens),
                                                 normalize=True)
            full = torch.cat([torch.full((5, 1), d.bos()), tgt], 1)
            t = _get_ins_targets(canvas, full, d.pad(), d.unk(), len(d), tau=1.0).type_as(lp)
            masks = canvas[:, 1:].ne(d.pad())
            assert loss == pytest.approx(float(-(t * lp).sum(-1)[masks].mean()), abs=1e-4)
            model.args.insertion_alignment = "rightmost"
            with torch.no_grad():
                other = float(model(src, lens, canvas, tgt)["insertion"]["loss"])
            model.args.insertion_alignment = "leftmost"
            assert other != pytest.approx(loss, abs=1e-4), "the rows must hold repeated canvas tokens"
    finally:
        vars(model.args).update(saved)


def test_leftmost_alignment_is_the_greedy_embedding_and_libnats():
    """--insertion-alignment leftmost: each canvas token sits at its leftmost possible target position
    (a plain left-to-right loop), which is the alignment of libnat's edit path; rightmost is the loop
    from the right.  Random subsequences of targets over 3 symbols (many repeats)."""
    from fairseq_nat_ext.models.nat.insertion import leftmost_keep
    from fairseq_nat_ext.oracles.levenshtein import levenshtein_oracle

    libnat = pytest.importorskip("fairseq.libnat")
    g = torch.Generator().manual_seed(3)
    pad, mask = 1, 3
    B = 64
    tgts, canv = [], []
    for _ in range(B):
        n = int(torch.randint(1, 12, (1,), generator=g))
        t = [0] + torch.randint(4, 7, (n,), generator=g).tolist() + [2]
        keep = torch.rand(len(t) - 2, generator=g) < 0.5
        canv.append([0] + [x for x, k in zip(t[1:-1], keep.tolist()) if k] + [2])
        tgts.append(t)
    T, C = max(map(len, tgts)), max(map(len, canv))
    tgt = torch.tensor([t + [pad] * (T - len(t)) for t in tgts])
    canvas = torch.tensor([c + [pad] * (C - len(c)) for c in canv])
    left = leftmost_keep(canvas, tgt, pad, mask)
    right = levenshtein_oracle(canvas, tgt, pad, mask).keep_tgt
    ed = libnat.suggested_ed2_path(canv, tgts, pad)  # per row: cell k = inserts before canvas token k
    differ = 0
    for b in range(B):
        pos, j = [], 0
        for k, x in enumerate(tgts[b]):
            if j < len(canv[b]) and x == canv[b][j]:
                pos.append(k)
                j += 1
        assert j == len(canv[b])
        assert sorted(left[b].nonzero().flatten().tolist()) == pos
        assert sorted(right[b].nonzero().flatten().tolist()) == canvas_positions(canv[b], tgts[b])
        # libnat: the tokens inserted before each canvas token = the gaps between our kept positions
        gaps = [tgts[b][p0 + 1:p1] for p0, p1 in zip(pos, pos[1:])]
        assert [[x for x in ins if x != pad] for ins in ed[b][1:len(canv[b])]] == gaps
        differ += pos != canvas_positions(canv[b], tgts[b])
    assert differ > 5, "the sample must exercise repeated tokens"


@pytest.mark.parametrize("end", ["pad", "eos"])
def test_decoding_stops_slots_on_the_checkpoints_end_label(model_task, monkeypatch, end):
    """New models (the arch's default) label an empty slot <pad>, an output-only row of the shared
    embeddings (fairseq's insertion_transformer); checkpoints from before the option, </s>.  Decoding
    stops a slot on the model's label and never inserts the other symbol."""
    model, task = model_task
    from fairseq_nat_ext.generators.insertion import InsertionGenerator

    assert model.args.insertion_end_symbol == "pad", "the arch's default for new models"
    monkeypatch.setattr(model.args, "insertion_end_symbol", end)
    label, other = (model.pad, model.eos) if end == "pad" else (model.eos, model.pad)
    orig = model.decoder.forward_slots
    s = batch(task, 4)
    for boosted in (label, other):
        def forward_slots(tokens, enc, normalize=False, joint=False, kv=None):
            logits = orig(tokens, enc, kv=kv).float().clone()
            logits[..., boosted] += 1e4
            return torch.log_softmax(logits, -1) if normalize else logits

        monkeypatch.setattr(model.decoder, "forward_slots", forward_slots)
        gen = InsertionGenerator([model], task.target_dictionary, max_iter=3)
        for (h,) in gen.generate([model], s):
            toks = h["tokens"].tolist()
            if boosted == label:  # every slot ends in the first round: an empty output
                assert toks == [model.eos] and h["steps"] == 1
            else:  # the other symbol is never inserted; </s> only closes the output
                assert len(toks) > 1 and model.eos not in toks[:-1] and model.pad not in toks


def test_checkpoint_without_the_option_keeps_eos(model_task):
    """A checkpoint saved before --insertion-end-symbol was trained with </s> as the label; loading it
    must not take the new default (fairseq re-applies the arch's defaults when it builds the model)."""
    import argparse

    from fairseq.models import ARCH_CONFIG_REGISTRY
    from omegaconf import OmegaConf

    from fairseq_nat_ext.compat import apply_checkpoint_defaults, legacy_namespace
    from fairseq_nat_ext.models.nat.insertion import InsertionModel

    old = {"arch": "insertion_tiny", "_name": "insertion_tiny", "insertion_loss": "uniform"}
    ns = legacy_namespace(InsertionModel, "insertion_tiny", OmegaConf.create(old), from_checkpoint=True)
    assert ns.insertion_end_symbol == "eos" and ns.insertion_loss == "uniform"
    ns = legacy_namespace(InsertionModel, "insertion_tiny", OmegaConf.create(old), from_checkpoint=False)
    assert ns.insertion_end_symbol == "pad"
    stored = {**old, "insertion_end_symbol": "pad"}
    ns = legacy_namespace(InsertionModel, "insertion_tiny", OmegaConf.create(stored), from_checkpoint=True)
    assert ns.insertion_end_symbol == "pad"
    args = argparse.Namespace(**old)  # fairseq's own path (a Namespace in the checkpoint's cfg)
    apply_checkpoint_defaults(InsertionModel, args)
    ARCH_CONFIG_REGISTRY["insertion_tiny"](args)
    assert args.insertion_end_symbol == "eos"


def test_decoding_inserts_in_parallel_and_stops(model_task):
    model, task = model_task
    from fairseq_nat_ext.generators.insertion import InsertionGenerator

    gen = InsertionGenerator([model], task.target_dictionary, max_iter=4)
    for (h,) in gen.generate([model], batch(task, 4)):
        assert h["tokens"][-1] == model.eos and 1 <= h["steps"] <= 4
        assert len(h["tokens"]) <= 1 + (2 ** 4 - 1), "at most one token per slot per round"


def test_uniform_loss_option_equals_tau_zero(model_task):
    model, task = model_task
    s = batch(task)
    src, lens = s["net_input"]["src_tokens"], s["net_input"]["src_lengths"]
    losses = []
    for loss_kind, tau in (("uniform", 1.0), ("binary_tree", 0.0), ("binary_tree", 1.0)):
        model.args.insertion_loss, model.args.insertion_tau = loss_kind, tau
        torch.manual_seed(0)
        canvas = model.inject_noise(s["target"])
        losses.append(float(model(src, lens, canvas, s["target"])["insertion"]["loss"]))
    model.args.insertion_loss, model.args.insertion_tau = "binary_tree", 1.0
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)
    assert losses[0] != pytest.approx(losses[2], abs=1e-4), "the binary tree weights differ from uniform"


def test_sequential_decoding_inserts_one_token_per_round(model_task):
    model, task = model_task
    from types import SimpleNamespace

    from fairseq_nat_ext.generators.insertion import InsertionGenerator

    gen = InsertionGenerator([model], task.target_dictionary, max_iter=4, placeholder_penalty=50.0,
                             retain_history=True)
    gen.configure(SimpleNamespace(insertion_decoding="sequential"))
    assert gen.max_iter >= model.decoder.max_positions()
    for (h,) in gen.generate([model], batch(task, 3)):
        sizes = [len(x) for x in h["history"]]
        assert all(b - a == 1 for a, b in zip([1] + sizes, sizes)), sizes
        assert len(sizes) > 4, "the end-of-slot penalty forces insertions past --iter-decode-max-iter"
        assert len(h["tokens"]) - 1 == len(sizes), "one round per inserted token"
    with pytest.raises(ValueError, match="--insertion-decoding"):
        gen.configure(SimpleNamespace(insertion_decoding="beam"))


@pytest.mark.slow
def test_cli_train_then_generate(toy_databin, tmp_path):
    proc = train_then_generate(toy_databin[0], tmp_path / "ck",
                               "insertion_tiny", "insertion_loss", ["--iter-decode-max-iter", "5"])
    assert proc.stdout.count("\nH-") == 40


# --- --insertion-softmax joint (Stern et al.'s p(c, l)) ----------------------------------------------

def canvas_positions(c, t):
    """Target positions of the canvas tokens c in t (the oracle's tie rule: as far right as possible)."""
    pos, j = [], len(c) - 1
    for k in range(len(t) - 1, -1, -1):
        if j >= 0 and t[k] == c[j]:
            pos.append(k)
            j -= 1
    assert j == -1
    return pos[::-1]


def paper_joint_loss(logits, canvas, target, pad, bos, end, tau):
    """Stern et al. (2019), written from the paper with plain loops: log p(c, l) = logit[l, c] minus the
    log-sum-exp over every (slot, token) pair of the sentence; slot-loss(l) = sum_i -w_l(i) log p(y_i, l)
    over the span still missing at l (w: balanced binary tree, softmax of -|i - centre| / tau, or uniform
    for tau=None), or -log p(END, l) for an empty span (END: the end-of-slot label); loss = mean over the k+1 slots, then mean over
    the sentences."""
    logits = logits.detach().double().tolist()
    per_sentence = []
    for b in range(len(logits)):
        c = [x for x in canvas[b].tolist() if x != pad]
        t = [bos] + [x for x in target[b].tolist() if x != pad]
        pos = canvas_positions(c, t)
        n_slots = len(c) - 1
        flat = [v for k in range(n_slots) for v in logits[b][k]]
        peak = max(flat)
        log_z = peak + math.log(sum(math.exp(v - peak) for v in flat))
        total = 0.0
        for k in range(n_slots):
            span = t[pos[k] + 1:pos[k + 1]]
            if not span:
                total += -(logits[b][k][end] - log_z)
                continue
            L = len(span)
            if tau is None:
                w = [1.0 / L] * L
            else:
                e = [math.exp(-abs(i - (L - 1) / 2) / tau) for i in range(L)]
                w = [x / sum(e) for x in e]
            for wi, tok in zip(w, span):
                total += -wi * (logits[b][k][tok] - log_z)
        per_sentence.append(total / n_slots)
    return sum(per_sentence) / len(per_sentence)


@pytest.fixture
def joint(model_task):
    model, _ = model_task
    model.args.insertion_softmax = "joint"
    yield model
    model.args.insertion_softmax = "slot"
    model.args.insertion_loss, model.args.insertion_tau = "binary_tree", 1.0


@pytest.mark.parametrize("loss_kind,tau", [("uniform", None), ("binary_tree", 1.0), ("binary_tree", 0.5)])
def test_joint_loss_equals_paper_reference(model_task, joint, loss_kind, tau):
    model, task = model_task
    model.args.insertion_loss, model.args.insertion_tau = loss_kind, tau if tau is not None else 1.0
    s = batch(task, 6)
    torch.manual_seed(1)
    canvas = model.inject_noise(s["target"])
    src, lens = s["net_input"]["src_tokens"], s["net_input"]["src_lengths"]
    with torch.no_grad():
        loss = model(src, lens, canvas, s["target"])["insertion"]["loss"]
        logits = model.decoder.forward_slots(canvas, model.encoder(src, src_lengths=lens))
    ref = paper_joint_loss(logits, canvas, s["target"], model.pad, model.bos, end_label(model), tau)
    assert float(loss) == pytest.approx(ref, abs=1e-4)
    model.args.insertion_softmax = "slot"
    with torch.no_grad():
        per_slot = float(model(src, lens, canvas, s["target"])["insertion"]["loss"])
    assert abs(per_slot - ref) > 0.1, "the joint normalisation changes the loss"


def test_joint_log_probs_are_one_distribution_per_sentence(model_task):
    model, task = model_task
    s = batch(task, 6)
    torch.manual_seed(2)
    canvas = model.inject_noise(s["target"])
    src, lens = s["net_input"]["src_tokens"], s["net_input"]["src_lengths"]
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lens)
        lp = model.decoder.forward_slots(canvas, enc, normalize=True, joint=True)
        per_slot = model.decoder.forward_slots(canvas, enc, normalize=True)
    n_slots = canvas.ne(model.pad).sum(1) - 1
    assert bool((n_slots < canvas.size(1) - 1).any()), "the batch needs rows with padding slots"
    for b in range(canvas.size(0)):
        k = int(n_slots[b])
        assert float(lp[b, :k].double().exp().sum()) == pytest.approx(1.0, abs=1e-5)
        assert bool(torch.isinf(lp[b, k:]).all())
        # the same logits: per slot, joint and per-slot log-probs differ by a constant (log p(l))
        diff = lp[b, :k] - per_slot[b, :k].float()
        assert torch.allclose(diff, diff[:, :1].expand_as(diff), atol=1e-4)


def test_joint_loss_gradients_are_finite(model_task, joint):
    model, task = model_task
    s = batch(task, 6)
    torch.manual_seed(3)
    canvas = model.inject_noise(s["target"])
    model.zero_grad()
    src, lens = s["net_input"]["src_tokens"], s["net_input"]["src_lengths"]
    model(src, lens, canvas, s["target"])["insertion"]["loss"].backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads)
    model.zero_grad()


@pytest.mark.parametrize("mode", ["slot", "joint"])
def test_criterion_applies_label_smoothing(model_task, mode):
    """--label-smoothing eps: (1 - eps) * loss + eps * cross-entropy against the uniform distribution
    over the support (all tokens of each slot under slot, all (slot, token) pairs under joint)."""
    from fairseq_nat_ext.criterions.insertion_loss import InsertionLoss

    model, task = model_task
    model.args.insertion_softmax = mode
    try:
        s = batch(task, 6)
        torch.manual_seed(4)
        s["prev_target"] = model.inject_noise(s["target"])
        canvas, src, lens = s["prev_target"], s["net_input"]["src_tokens"], s["net_input"]["src_lengths"]
        with torch.no_grad():
            nll = float(model(src, lens, canvas, s["target"])["insertion"]["loss"])
            lp = model.decoder.forward_slots(canvas, model.encoder(src, src_lengths=lens), normalize=True,
                                             joint=mode == "joint").double()
            smooth_rows, n_all = [], 0
            for b in range(canvas.size(0)):
                k = int(canvas[b].ne(model.pad).sum()) - 1
                per_slot = [-float(lp[b, i].mean()) for i in range(k)]
                smooth_rows.append(per_slot)
                n_all += k
            if mode == "joint":
                smooth = sum(sum(r) / len(r) for r in smooth_rows) / len(smooth_rows)
            else:
                smooth = sum(sum(r) for r in smooth_rows) / n_all
            for eps in (0.0, 0.1):
                loss, size, log = InsertionLoss(task, label_smoothing=eps)(model, s)
                assert size == 1
                assert float(loss) == pytest.approx((1 - eps) * nll + eps * smooth, abs=1e-4)
                assert log["nll_loss"] == pytest.approx(nll, abs=1e-4)
    finally:
        model.args.insertion_softmax = "slot"


def test_joint_decoding_valid_and_same_tokens_as_per_slot(model_task, joint):
    """Parallel decoding: argmax_c p(c, l) = argmax_c p(c | l), so the tokens are those of the per-slot
    normalisation of the same logits; the scores are joint log-probabilities (lower)."""
    model, task = model_task
    from fairseq_nat_ext.generators.insertion import InsertionGenerator

    forbidden = {model.pad, model.bos, model.mask_idx, model.unk}
    s = batch(task, 5)
    out = {}
    for mode in ("joint", "slot"):
        model.args.insertion_softmax = mode
        gen = InsertionGenerator([model], task.target_dictionary, max_iter=4, placeholder_penalty=1.0)
        out[mode] = [h for (h,) in gen.generate([model], s)]
    for hj, hs in zip(out["joint"], out["slot"]):
        toks = hj["tokens"].tolist()
        assert toks[-1] == model.eos and model.eos not in toks[:-1] and not forbidden & set(toks)
        assert 1 <= hj["steps"] <= 4 and len(toks) <= 2 ** 4
        assert toks == hs["tokens"].tolist() and hj["steps"] == hs["steps"]
        assert bool((hj["positional_scores"] <= hs["positional_scores"] + 1e-5).all())
        assert bool(torch.isfinite(hj["positional_scores"]).all())


def test_joint_sequential_decoding_picks_the_best_pair(model_task, joint):
    model, task = model_task
    from types import SimpleNamespace

    from fairseq_nat_ext.generators.insertion import InsertionGenerator

    gen = InsertionGenerator([model], task.target_dictionary, max_iter=4, placeholder_penalty=50.0,
                             retain_history=True)
    gen.configure(SimpleNamespace(insertion_decoding="sequential"))
    s = batch(task, 2)
    hyps = [h for (h,) in gen.generate([model], s)]
    enc = model.encoder(s["net_input"]["src_tokens"], src_lengths=s["net_input"]["src_lengths"])
    for b, h in enumerate(hyps):
        sizes = [len(x) for x in h["history"]]
        assert all(n - m == 1 for m, n in zip([1] + sizes, sizes)), sizes
        # second round (two slots), re-done by hand: the most probable (slot, token) pair of the joint
        # distribution, end-of-slot and the forbidden symbols aside
        e = model.encoder.reorder_encoder_out(enc, torch.tensor([b]))
        canvas = torch.cat([torch.tensor([model.bos]), h["history"][0]]).unsqueeze(0)
        with torch.no_grad():
            lp = model.decoder.forward_slots(canvas, e, normalize=True, joint=True)[0]
        lp[:, [model.pad, model.bos, model.mask_idx, model.unk, model.eos]] = float("-inf")
        k, tok = divmod(int(lp.argmax()), lp.size(1))
        expected = canvas[0, 1:].tolist()
        expected.insert(k, tok)
        assert h["history"][1].tolist() == expected


@pytest.mark.slow
def test_cli_train_then_generate_joint(toy_databin, tmp_path):
    import os

    from conftest import PLUGIN_DIR, run_cli

    data_bin, ck = toy_databin[0], tmp_path / "ck"
    run_cli(["fairseq-train", data_bin, "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
             "--arch", "insertion_tiny", "--criterion", "insertion_loss", "--insertion-softmax", "joint",
             "--insertion-loss", "uniform", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "800",
             "--max-update", "4", "--save-dir", str(ck), "--no-epoch-checkpoints", "--num-workers", "0"])
    path = os.path.join(str(ck), "checkpoint_last.pt")
    state = torch.load(path, map_location="cpu", weights_only=False)
    margs = state["cfg"]["model"]
    assert getattr(margs, "insertion_softmax", None) == "joint", "fairseq-generate reads it from the checkpoint"
    proc = run_cli(["fairseq-generate", data_bin, "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                    "--path", path, "--max-tokens", "800", "--iter-decode-max-iter", "5"])
    assert proc.stdout.count("\nH-") == 40
    for line in proc.stdout.splitlines():
        if line.startswith("H-"):
            assert "<pad>" not in line and "<mask>" not in line
    # a checkpoint saved before --insertion-end-symbol (no such key) loads with </s>, what it was
    # trained with; a training run under another label refuses to continue it (one-line error)
    assert margs.insertion_end_symbol == "pad"
    from fairseq import checkpoint_utils

    del margs.insertion_end_symbol
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    torch.save(state, old_dir / "checkpoint_last.pt")
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(old_dir / "checkpoint_last.pt")],
                                                                 arg_overrides={"data": data_bin})
    assert models[0].args.insertion_end_symbol == "eos"
    resume = run_cli(["fairseq-train", data_bin, "--user-dir", PLUGIN_DIR, "--task", "nat_translation",
                      "--arch", "insertion_tiny", "--criterion", "insertion_loss", "--insertion-softmax", "joint",
                      "--insertion-loss", "uniform", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "800",
                      "--max-update", "6", "--save-dir", str(old_dir), "--no-epoch-checkpoints",
                      "--num-workers", "0"], check=False)
    assert resume.returncode != 0 and "trained with --insertion-end-symbol eos" in resume.stderr
