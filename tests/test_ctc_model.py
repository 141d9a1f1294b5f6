"""ctc_nat model and criterion in-process: the blank symbol, upsampling, the feasibility filter."""
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import build_model_and_task
from fairseq_nat_ext.tasks.nat_translation import BLANK_SYMBOL, MASK_SYMBOL

ARCH = ["--arch", "ctc_nat_tiny", "--criterion", "ctc_nat_loss"]


@pytest.fixture(scope="module")
def built(toy_databin):
    torch.manual_seed(0)
    task, model, args = build_model_and_task(toy_databin[0], ARCH + ["--upsample-ratio", "2"])
    return task, model.eval(), args


def test_blank_symbol_is_appended_once_for_ctc_archs_only(toy_databin, built):
    task, model, _ = built
    d = task.target_dictionary
    assert d[len(d) - 1] == BLANK_SYMBOL and d[len(d) - 2] == MASK_SYMBOL
    assert model.blank_idx == len(d) - 1
    assert task.source_dictionary == d, "joined dictionaries stay equal (share-all-embeddings)"
    assert model.decoder.output_projection.out_features == len(d)
    n = len(d)
    model.__class__.build_model(model.args, task)  # building again adds nothing
    assert len(d) == n
    # other NAT archs keep their dictionary (and existing checkpoints their embedding size)
    task2, _, _ = build_model_and_task(toy_databin[0], ["--arch", "mask_predict_tiny",
                                                         "--criterion", "mask_predict_loss"])
    assert BLANK_SYMBOL not in task2.target_dictionary.indices
    assert len(task2.target_dictionary) == n - 1


def _left_pad(seqs, pad):
    T = max(len(s) for s in seqs)
    return torch.tensor([[pad] * (T - len(s)) + s for s in seqs])


def test_upsampled_outputs_do_not_depend_on_padding(built):
    task, model, _ = built
    pad, eos = task.source_dictionary.pad(), task.source_dictionary.eos()
    seqs = [[5, 6, 7, eos], [8, 9, 10, 11, 12, 13, eos], [14, eos]]
    src = _left_pad(seqs, pad)
    lengths = torch.tensor([len(s) for s in seqs])
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)
        lp = model.decoder(enc, normalize=True)
        up_lengths = model.decoder.upsample(enc)[1]
        assert up_lengths.tolist() == [2 * len(s) for s in seqs]
        for b, s in enumerate(seqs):
            one = torch.tensor([s])
            e1 = model.encoder(one, src_lengths=torch.tensor([len(s)]))
            lp1 = model.decoder(e1, normalize=True)
            assert lp1.shape[1] == 2 * len(s)
            assert torch.allclose(lp[b, : 2 * len(s)], lp1[0], atol=1e-5)


def _sample(task, src_seqs, tgt_seqs):
    d = task.target_dictionary
    pad, eos = d.pad(), d.eos()
    src = _left_pad([s + [eos] for s in src_seqs], pad)
    T = max(len(t) for t in tgt_seqs) + 1
    tgt = torch.tensor([t + [eos] + [pad] * (T - len(t) - 1) for t in tgt_seqs])
    return {"net_input": {"src_tokens": src, "src_lengths": src.ne(pad).sum(1)},
            "target": tgt, "prev_target": tgt, "ntokens": int(tgt.ne(pad).sum())}


def test_criterion_filters_and_counts_infeasible_pairs(built):
    task, model, args = built
    model.train()
    crit = task.build_criterion(args)
    crit.eps = 0.0
    # ratio 2, sources of n tokens (+ </s>): L = 2 (n + 1)
    src = [[5, 6], [5], [5, 6, 7], [5]]
    tgt = [[8, 9, 10], [8, 9, 10, 11], [8, 8, 8, 8, 9], [8, 8, 8]]  # needs 3, 4, 8, 5 positions
    L = [6, 4, 8, 4]
    feasible = [True, True, True, False]
    sample = _sample(task, src, tgt)
    torch.manual_seed(0)
    loss, sample_size, log = crit(model, sample)
    assert log["ctc_filtered"] == 1 and log["ctc_pairs"] == 4
    assert torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    # the loss is the CTC loss of the feasible pairs only, per target token
    torch.manual_seed(0)
    out = model(**crit.model_inputs(sample))["ctc"]
    keep = torch.tensor(feasible)
    want = F.ctc_loss(out["ctc_lprobs"][keep].transpose(0, 1), out["targets"][keep],
                      out["input_lengths"][keep], out["target_lengths"][keep],
                      blank=model.blank_idx, reduction="sum") / sum(len(t) for t, f in zip(tgt, feasible) if f)
    assert out["input_lengths"].tolist() == L
    assert math.isclose(loss.item(), want.item(), rel_tol=1e-5)
    model.zero_grad()
    # every pair infeasible: a zero loss that still back-propagates, never inf/NaN
    bad = _sample(task, [[5], [6]], [[8, 8, 8], [9, 9, 9, 9]])
    loss, _, log = crit(model, bad)
    assert loss.item() == 0.0 and log["ctc_filtered"] == 2
    loss.backward()


def test_filtered_counts_are_summed_in_the_logs():
    from fairseq import metrics

    from fairseq_nat_ext.criterions.ctc_nat_loss import CTCNATLoss

    logs = [{"loss": 1.0, "nll_loss": 1.0, "sample_size": 1, "ctc_filtered": 2, "ctc_pairs": 10},
            {"loss": 1.0, "nll_loss": 1.0, "sample_size": 1, "ctc_filtered": 1, "ctc_pairs": 7}]
    with metrics.aggregate() as agg:
        CTCNATLoss.reduce_metrics(logs)
        CTCNATLoss.reduce_metrics(logs[:1])
    vals = agg.get_smoothed_values()
    assert vals["ctc_filtered"] == 5 and vals["ctc_pairs"] == 27


@pytest.mark.parametrize("ratio", ["0", "-1"])
def test_bad_upsample_ratio_is_a_one_line_input_error(toy_databin, ratio):
    from fairseq_nat_ext.compat import InputError

    with pytest.raises(InputError, match="--upsample-ratio must be an integer >= 1") as err:
        build_model_and_task(toy_databin[0], ARCH + ["--upsample-ratio", ratio])
    assert "\n" not in str(err.value)


def test_greedy_generator_matches_the_model_argmax(built):
    from fairseq_nat_ext.generators.ctc_nat import CTCGenerator, ctc_greedy

    task, model, _ = built
    pad, eos = task.source_dictionary.pad(), task.source_dictionary.eos()
    src = _left_pad([[5, 6, 7, eos], [8, 9, eos]], pad)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(pad).sum(1)}}
    gen = CTCGenerator([model], task.target_dictionary, beam=1)
    hyps = gen.generate([model], sample)
    with torch.no_grad():
        lp = model.decoder(model.encoder(src, src_lengths=src.ne(pad).sum(1)), normalize=True)
    lp[..., gen.forbidden] = float("-inf")
    toks, n, align, pos = ctc_greedy(lp, torch.tensor([8, 6]), model.blank_idx, pad)
    for b in range(2):
        h = hyps[b][0]
        assert h["tokens"].tolist() == toks[b, : int(n[b])].tolist() + [eos]
        assert math.isclose(h["positional_scores"].sum().item(), pos[b].sum().item(), rel_tol=1e-5)
        assert h["steps"] == 1 and len(h["positional_scores"]) == len(h["tokens"])
    # an ensemble of a model with itself decodes like the model
    twice = CTCGenerator([model, model], task.target_dictionary, beam=3).generate([model, model], sample)
    once = CTCGenerator([model], task.target_dictionary, beam=3).generate([model], sample)
    assert [h[0]["tokens"].tolist() for h in twice] == [h[0]["tokens"].tolist() for h in once]


def test_decoding_strings_reach_the_ctc_and_imputer_generators(toy_databin, built):
    from fairseq_nat_ext.evaluation import decoding as dec
    from fairseq_nat_ext.generators.ctc_nat import CTCGenerator
    from fairseq_nat_ext.generators.imputer import ImputerGenerator

    task, model, _ = built
    assert dec.canonical_decoding("block=4") == "block=4"
    with pytest.raises(ValueError, match="both iter and block"):
        dec.parse_decoding("iter=4,block=4")
    g = task.build_generator([model], dec.generation_options(dec.parse_decoding("beam=5")))
    assert isinstance(g, CTCGenerator) and g.beam == 5 and g.decoding_keys == ("beam",)
    assert task.build_generator([model], dec.generation_options({"beam": 1})).beam == 1
    task2, imp, _ = build_model_and_task(toy_databin[0], ["--arch", "imputer_tiny", "--criterion", "imputer_loss"])
    g = task2.build_generator([imp], dec.generation_options(dec.parse_decoding("block=4")))
    assert isinstance(g, ImputerGenerator) and g.block == 4 and g.decoding_keys == ("block",)


def test_filtered_pair_count_of_a_data_split(toy_databin, built):
    from fairseq_nat_ext.evaluation.ctc_filtered import count_infeasible

    task, _, _ = built
    task.load_dataset("train")
    ds = task.dataset("train")
    d = task.target_dictionary
    for ratio in (1, 2):
        slow = 0
        for i in range(len(ds)):
            tgt = ds.tgt[i].tolist()[:-1]  # without </s>
            need = len(tgt) + sum(1 for j in range(1, len(tgt)) if tgt[j] == tgt[j - 1])
            slow += int(ratio * int(ds.src_sizes[i]) < need)
        assert count_infeasible(ds, ratio, d.pad(), d.eos()) == (slow, len(ds))
    assert count_infeasible(ds, 1, d.pad(), d.eos())[0] > 0, "the toy data has infeasible pairs at ratio 1"
