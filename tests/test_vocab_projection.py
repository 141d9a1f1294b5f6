"""vocab_logits: the (W @ x^T)^T product equals the decoder's output_layer (x @ W^T)."""
import pytest
import torch
from torch import nn

from fairseq_nat_ext.modules.vocab_projection import vocab_logits


class _Decoder(nn.Module):
    def __init__(self, d, v, bias):
        super().__init__()
        self.output_projection = nn.Linear(d, v, bias=bias)
        self.adaptive_softmax = None

    def output_layer(self, x):
        return self.output_projection(x)


@pytest.mark.parametrize("shape", [(1, 8), (7, 8), (3, 5, 8), (0, 8)])
@pytest.mark.parametrize("bias", [False, True])
def test_equals_output_layer(shape, bias):
    torch.manual_seed(0)
    dec = _Decoder(8, 37, bias)
    x = torch.randn(*shape)
    with torch.no_grad():
        got, want = vocab_logits(dec, x), dec.output_layer(x)
    assert got.shape == want.shape == (*shape[:-1], 37)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.log_softmax(-1), want.log_softmax(-1), rtol=1e-5, atol=1e-5)


def test_training_keeps_the_decoders_own_layer():
    dec = _Decoder(8, 11, False)
    calls = []
    dec.output_layer = lambda x: calls.append(1) or dec.output_projection(x)
    x = torch.randn(4, 8, requires_grad=True)
    vocab_logits(dec, x).sum().backward()  # autograd on: the decoder's own output_layer
    assert calls == [1] and x.grad is not None


def test_generator_projections_of_kept_positions_equal_the_full_projection():
    """generators.projection: best_tokens / target_log_probs with ``keep`` project only those positions
    (as 2-D rows) and equal the dense (N, T, V) log-softmax there; 0 elsewhere.  Also in small chunks."""
    import torch.nn.functional as F

    from fairseq_nat_ext.generators.projection import best_tokens, target_log_probs

    torch.manual_seed(0)
    N, T, C, V = 3, 5, 8, 11
    proj = torch.nn.Linear(C, V)
    feats = torch.randn(T, N, C).transpose(0, 1)  # non-contiguous, as decoders return them
    keep = torch.rand(N, T) > 0.4
    target = torch.randint(0, V, (N, T))
    forbidden = [0, 3]
    with torch.no_grad():
        full = F.log_softmax(proj(feats), -1)  # slow reference: every position, dense
        allowed = full.clone()
        allowed[..., forbidden] = float("-inf")
        want_lp, want_tok = allowed.max(-1)
        want_t = full.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        for max_elements in (1 << 25, V):  # one chunk; one row per chunk
            tok, lp = best_tokens([feats], [proj], V, forbidden, max_elements=max_elements, keep=keep)
            assert torch.equal(tok[keep], want_tok[keep]) and not tok[~keep].any()
            assert torch.allclose(lp[keep], want_lp[keep], atol=1e-5) and not lp[~keep].any()
            t = target_log_probs(feats, proj, target, V, max_elements=max_elements, keep=keep)
            assert torch.allclose(t[keep], want_t[keep], atol=1e-5) and not t[~keep].any()
        tok, lp = best_tokens([feats], [proj], V, forbidden)  # no keep: every position
        assert torch.equal(tok, want_tok) and torch.allclose(lp, want_lp, atol=1e-5)
        assert torch.allclose(target_log_probs(feats, proj, target, V), want_t, atol=1e-5)


@pytest.mark.parametrize("everywhere", [True, False])  # a forbidden symbol wins every state / some
@pytest.mark.parametrize("bias", [False, True])
def test_best_vocab_tokens_equal_log_softmax_argmax_without_forbidden_symbols(bias, everywhere):
    import torch.nn.functional as F

    from fairseq_nat_ext.modules.vocab_projection import best_vocab_tokens

    torch.manual_seed(0)

    class Dec(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.output_projection = torch.nn.Linear(16, 50, bias=bias)

    dec = Dec()
    with torch.no_grad():
        feats = torch.randn(7, 16)
        if everywhere:  # a forbidden symbol that wins every state
            feats = feats.abs()
            dec.output_projection.weight[3] += 5.0
        else:  # states 0 and 4 point at forbidden symbol 3, the others at allowed ones
            feats[[0, 4]] = 4.0 * dec.output_projection.weight[3]
        lp, tok = best_vocab_tokens(dec, feats, [1, 3], block=3)  # blocks of 3, 3 and 1 states
    winners = dec.output_projection(feats).argmax(-1)
    assert bool(winners.eq(3).all()) if everywhere else (winners.eq(3).any() and not winners.eq(3).all())
    for i in range(7):  # plain reference, one state at a time
        ref = F.log_softmax(dec.output_projection(feats[i]), -1)
        ref[[1, 3]] = float("-inf")
        assert int(tok[i]) == int(ref.argmax())
        assert abs(float(lp[i]) - float(ref.max())) < 1e-5


@pytest.mark.parametrize("group", [4, 128])
def test_first_max_is_torch_max_with_its_first_index(group, monkeypatch):
    """first_max against a plain loop over each row (the largest value, the first index holding it):
    ties inside a group and across groups, the maximum in the tail group, -inf rows, a NaN row."""
    from fairseq_nat_ext.modules import vocab_projection
    from fairseq_nat_ext.modules.vocab_projection import first_max

    monkeypatch.setattr(vocab_projection, "FIRST_MAX_ROWS", 1)  # the grouped route for these 9 rows
    torch.manual_seed(0)
    V = 3 * 128 + 37  # a tail shorter than a group
    x = torch.randn(9, V)
    x[1, 5] = x[1, 6] = 9.0  # a tie inside one group
    x[2, 7] = x[2, 300] = 9.0  # a tie across groups
    x[3, V - 1] = 9.0  # the maximum in the tail
    x[4, 200:] = 9.0  # a tie from the middle to the end
    x[5] = float("-inf")
    x[5, 250] = -1e30
    x[6] = float("-inf")  # no finite value: index 0, as torch
    x[7, [10, 11]] = float("inf")
    values, index = first_max(x, group=group)
    for r in range(9):
        row = x[r].tolist()
        best = max(row)
        assert float(values[r]) == best and int(index[r]) == row.index(best)
    y = torch.randn(3, V)
    y[1, 17] = float("nan")
    nan = first_max(y, group=group)  # a NaN: torch's max (NaN and its index)
    assert torch.equal(nan[1], y.max(-1).indices) and bool(nan[0][1].isnan())
