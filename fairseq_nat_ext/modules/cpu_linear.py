"""``F.linear`` for decoding on CPU, with each weight laid out once for oneDNN's matrix product.

A NAT decoder at inference multiplies a few dozen rows (the positions of a handful of candidates) by
the same weights pass after pass.  torch's CPU ``linear`` (MKL) re-reads the weight in its stored
layout on every call and is inefficient for so few rows; oneDNN (bundled with torch's CPU builds) can
reorder a weight once into the blocked layout its kernel reads (``torch.ops.mkldnn._reorder_linear_weight``,
what ``torch.compile``'s CPU freezing pass uses) and then multiply any number of rows by it.  Measured
on the 2-core benchmark machine, fp32, d = 256: the vocabulary product (9,812 x 256) for 5 / 20 / 45
rows took 0.61 / 1.07 / 2.73 ms through torch's fastest route and 0.30 / 0.82 / 1.73 ms prepacked;
the layers' (1,024 x 256) product for 45 rows 0.25 vs 0.19 ms.

:func:`linear` equals ``F.linear`` up to float rounding (a different summation order: about 1e-6
relative here); it is used only without autograd, on CPU, for float32 tensors, and falls back to
``F.linear`` anywhere else (CUDA, training, other dtypes, a torch built without oneDNN).  The packed
copy of a weight is cached per weight tensor and rebuilt when the weight changes (in-place updates
bump its version), so a model keeps decoding correctly after more training steps.
"""
import weakref

import torch
import torch.nn.functional as F

#: id(weight tensor) -> (weak reference to it, (data_ptr, version), packed weight); an entry leaves
#: with its tensor (tensors compare elementwise, so they cannot key a WeakKeyDictionary)
_PACKED = {}


#: the row count oneDNN lays the weight out for (it multiplies any count); 64 was the fastest of
#: 1 / 64 / 1,024 / none for 1-600 rows on the benchmark machine
ROWS_HINT = 64

_available = None


def available():
    """True when this torch has oneDNN's prepacked linear and it computes ``F.linear`` (checked once)."""
    global _available
    if _available is None:
        try:
            w, b, x = torch.randn(8, 4), torch.randn(8), torch.randn(3, 4)
            pw = torch.ops.mkldnn._reorder_linear_weight(w, ROWS_HINT)
            y = torch.ops.mkldnn._linear_pointwise(x, pw, b, "none", [], "")
            _available = bool(torch.backends.mkldnn.is_available()) and torch.allclose(
                y, F.linear(x, w, b), atol=1e-5)
        except (AttributeError, RuntimeError, NotImplementedError):
            _available = False
    return _available


def usable(x, weight):
    """True when :func:`linear` takes the prepacked route for these tensors."""
    return (x.device.type == "cpu" and weight.device.type == "cpu" and x.dtype == torch.float32
            and weight.dtype == torch.float32 and weight.dim() == 2 and not torch.is_grad_enabled()
            and x.numel() > 0 and available())


def _forget(wid):
    def callback(ref):
        hit = _PACKED.get(wid)
        if hit is not None and hit[0] is ref:
            del _PACKED[wid]
    return callback


def packed_weight(weight):
    """oneDNN's layout of ``weight`` (out, in), cached until the weight changes."""
    key = (weight.data_ptr(), weight._version)
    wid = id(weight)
    hit = _PACKED.get(wid)
    if hit is None or hit[0]() is not weight or hit[1] != key:
        with torch.no_grad():
            pw = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)
        ref = weakref.ref(weight, _forget(wid))
        hit = (ref, key, pw)
        _PACKED[wid] = hit
    return hit[2]


def linear(x, weight, bias=None):
    """``F.linear(x, weight, bias)``: x (..., in), weight (out, in) -> (..., out)."""
    if not usable(x, weight):
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight(weight), bias, "none", [], "")


def module(lin, x):
    """``lin(x)`` for an ``nn.Linear``."""
    return linear(x, lin.weight, lin.bias)
