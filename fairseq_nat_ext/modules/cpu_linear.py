"""``F.linear`` for decoding on CPU, with each weight laid out once for oneDNN's matrix product.

A NAT decoder at inference multiplies a few dozen rows (the positions of a handful of candidates) by
the same weights pass after pass.  torch's CPU ``linear`` (MKL) re-reads the weight in its stored
layout on every call and is inefficient for so few rows; oneDNN (bundled with torch's CPU builds) can
reorder a weight once into the blocked layout its kernel reads (``torch.ops.mkldnn._reorder_linear_weight``,
what ``torch.compile``'s CPU freezing pass uses) and then multiply any number of rows by it.  Measured
on the 2-core benchmark machine, fp32, d = 256: the vocabulary product (9,812 x 256) for 5 / 20 / 45
rows took 0.61 / 1.07 / 2.73 ms through torch's fastest route and 0.30 / 0.82 / 1.73 ms prepacked;
the layers' (1,024 x 256) product for 45 rows 0.25 vs 0.19 ms.

Scope.  The prepacked route (and every other decoding-time weight cache, e.g.
``attention.mix.stacked_qkv_weight``) is active only inside :func:`decoding`, which the plugin's
generators enter in ``generate`` (decorator :func:`decodes`); everywhere else -- training, the no-grad
passes of a training step (Levenshtein roll-ins, the Imputer's alignments), validation -- :func:`linear`
is ``F.linear`` and nothing is cached, so training computes exactly what it did without this module.
Inside, :func:`linear` equals ``F.linear`` up to float rounding (a different summation order: about
1e-6 relative here) for float32 CPU tensors without autograd, and is ``F.linear`` otherwise (CUDA,
other dtypes, inference tensors, a torch built without oneDNN).

Staleness.  A packed copy is keyed by its weight's storage address, version counter, shape and dtype
(and keeps the old storage alive, so a new weight cannot take its address).  Updates through
``param.data`` -- what fairseq's optimizers do -- bump no version counter, so :func:`decoding` caches
nothing for models any of whose parameters holds a gradient (a model inside a training process:
fairseq's ``--eval-bleu`` validation, a REINFORCE stage); fairseq-generate and the benchmark harness
never compute one.  Code that edits a decoding model's weights through ``.data`` by hand between
``generate`` calls must call :func:`clear`.
"""
import contextlib
import functools
import weakref

import torch
import torch.nn.functional as F

from .module_walk import any_grad

#: id(weight tensor) -> (weak reference to it, key, packed weight, the weight's storage kept alive);
#: an entry leaves with its tensor (tensors compare elementwise, so they cannot key a WeakKeyDictionary)
_PACKED = {}

#: functions that empty the other decoding-time caches (registered by their modules), run by :func:`clear`
_CLEARERS = []

#: the row count oneDNN lays the weight out for (it multiplies any count); 64 was the fastest of
#: 1 / 64 / 1,024 / none for 1-600 rows on the benchmark machine
ROWS_HINT = 64

_available = None
_fused = None
_depth = 0  # nesting depth of caching decoding() scopes


def available():
    """True when this torch has oneDNN's prepacked linear and it computes ``F.linear`` (checked once)."""
    global _available
    if _available is None:
        try:
            # a private generator: the check runs at the first product of a process's first decoding,
            # and drawing from torch's global one there would shift every later sample (NPD's
            # fertilities) against a run where the check had already happened
            g = torch.Generator().manual_seed(0)
            w, b, x = (torch.randn(*shape, generator=g) for shape in ((8, 4), (8,), (3, 4)))
            pw = torch.ops.mkldnn._reorder_linear_weight(w, ROWS_HINT)
            y = torch.ops.mkldnn._linear_pointwise(x, pw, b, "none", [], "")
            _available = bool(torch.backends.mkldnn.is_available()) and torch.allclose(
                y, F.linear(x, w, b), atol=1e-5)
        except (AttributeError, RuntimeError, NotImplementedError):
            _available = False
    return _available


def fused_available():
    """True when oneDNN's products with a fused ReLU or residual add (``_linear_pointwise`` with the
    "relu" post-op, ``_linear_pointwise.binary`` "add") compute exactly ``relu(linear)`` and
    ``linear + residual`` (checked once, bit for bit: the post-op acts on the product's float32
    result, as the separate operation would)."""
    global _fused
    if _fused is None:
        _fused = False
        if available():
            try:
                g = torch.Generator().manual_seed(1)  # private, as in available()
                w, b, x, r = (torch.randn(*shape, generator=g) for shape in ((8, 4), (8,), (3, 4), (3, 8)))
                pw = torch.ops.mkldnn._reorder_linear_weight(w, ROWS_HINT)
                y = torch.ops.mkldnn._linear_pointwise(x, pw, b, "none", [], "")
                _fused = (torch.equal(torch.ops.mkldnn._linear_pointwise(x, pw, b, "relu", [], ""), torch.relu(y))
                          and torch.equal(torch.ops.mkldnn._linear_pointwise.binary(x, r, pw, b, "add"), y + r))
            except (AttributeError, RuntimeError, NotImplementedError):
                _fused = False
    return _fused


def caching():
    """True inside a :func:`decoding` scope that may cache weights (and not under inference mode)."""
    return _depth > 0 and not torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


def clear():
    """Forget every packed and cached decoding weight."""
    _PACKED.clear()
    for fn in _CLEARERS:
        fn()


def register_clearer(fn):
    _CLEARERS.append(fn)
    return fn


@contextlib.contextmanager
def decoding(models=()):
    """Decoding scope: weight caches (prepacked products, stacked q/k/v) are used and kept across
    scopes.  Caches nothing when a parameter of ``models`` holds a gradient (a model being trained:
    its optimizer updates weights through ``.data``, which no cache key sees)."""
    global _depth
    if any(any_grad(m) for m in models):
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1


def decodes(generate):
    """Decorator for a generator's ``generate(self, models, sample, ...)``: runs it in :func:`decoding`
    of ``models`` (or ``self.models``)."""
    @functools.wraps(generate)
    def wrapper(self, models, *args, **kwargs):
        with decoding(models or getattr(self, "models", None) or ()):
            return generate(self, models, *args, **kwargs)
    return wrapper


def usable(x, weight):
    """True when :func:`linear` takes the prepacked route for these tensors."""
    return (caching() and x.device.type == "cpu" and weight.device.type == "cpu"
            and x.dtype == torch.float32 and weight.dtype == torch.float32 and weight.dim() == 2
            and x.numel() > 0 and not weight.is_inference() and available())


def _forget(wid):
    def callback(ref):
        hit = _PACKED.get(wid)
        if hit is not None and hit[0] is ref:
            del _PACKED[wid]
    return callback


def packed_weight(weight):
    """oneDNN's layout of ``weight`` (out, in), cached until the weight changes (see the module doc)."""
    key = (weight.data_ptr(), weight._version, tuple(weight.shape), weight.stride(), weight.dtype)
    wid = id(weight)
    hit = _PACKED.get(wid)
    if hit is None or hit[0]() is not weight or hit[1] != key:
        with torch.no_grad():
            pw = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)
        hit = (weakref.ref(weight, _forget(wid)), key, pw, weight.detach())
        _PACKED[wid] = hit
    return hit[2]


def linear(x, weight, bias=None):
    """``F.linear(x, weight, bias)``: x (..., in), weight (out, in) -> (..., out)."""
    if not usable(x, weight):
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight(weight), bias, "none", [], "")


def prepacked(x, packed, bias=None, relu=False):
    """``F.linear`` (then ReLU when ``relu``) with a weight already laid out by :func:`packed_weight`;
    only where :func:`usable` held for it (and :func:`fused_available` for ``relu``)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "relu" if relu else "none", [], "")


def prepacked_add(x, packed, bias, residual):
    """``residual + F.linear(x, weight, bias)`` with the weight laid out by :func:`packed_weight`, the
    addition fused into the product where :func:`fused_available` (the same float32 sums)."""
    if fused_available():
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, packed, bias, "add")
    return residual + torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def module(lin, x):
    """``lin(x)`` for an ``nn.Linear``."""
    return linear(x, lin.weight, lin.bias)
