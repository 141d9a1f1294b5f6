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
