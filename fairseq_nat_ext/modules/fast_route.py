"""The one guard of the CPU decoding route: does a model's own forward compute what the route computes?

The route (:mod:`.nat_decoder_inference` for the NAT decoders, :mod:`.packed` for the Levenshtein and
Insertion decoders and the NPD teacher, :mod:`.encoder_inference` for encoders) re-implements fairseq's
Transformer layers for decoding.  It may stand in for a module only when nothing the user added would be
skipped; :func:`allows` checks, for the module and every submodule:

* the switch: ``--no-fast-decoding`` (a task option of ``nat_translation`` and ``kermit``, so a
  ``fairseq-generate`` option of every plugin generator) or the environment variable
  ``FAIRSEQ_NAT_EXT_NO_FAST_DECODING=1`` (library use) turn the route off everywhere: fairseq's forward
  runs instead;
* overrides: the methods the route replaces (a decoder's or encoder's ``forward_embedding``,
  ``extract_features``, ``extract_features_scriptable``, ``forward_scriptable``, ``output_layer``, a
  layer's ``forward`` and ``residual_connection``, an attention's ``forward``) must be fairseq's or this
  plugin's own: a subclass defined elsewhere that overrides one decodes through its override;
* projections: every ``nn.Linear`` is exactly ``torch.nn.Linear`` (a quantised, LoRA or other subclass is
  not), and the named projections of the layers (``q_proj``/``k_proj``/``v_proj``/``out_proj``,
  ``fc1``/``fc2``) are ``nn.Linear``; layer norms are torch's ``LayerNorm``;
* hooks: no submodule has a forward hook or pre-hook (the route calls ``F.linear`` on the weights and
  would bypass them).

The route-specific conditions (attention options, dropout at inference, ...) stay in each module's own
``supported``; every one of them calls :func:`allows` first.

Inside one decoding call (:func:`decoding_call`, entered by ``nat_translation``'s ``inference_step``, so
by ``fairseq-generate``, ``fairseq-interactive`` and the benchmark harness) each answer is computed once
per module (:func:`once`): a model's hooks, types and modes do not change while one batch decodes, and
the walks over the module tree are a measurable share of a one-pass decoder's batch-1 time (a 3-layer
NAT decoder decodes a sentence in about 5 ms; each walk takes about 50 us).  Between calls everything is
checked anew (a hook added after one batch is seen by the next).
"""
import contextlib
import os

import torch.nn as nn

from . import module_walk

ENV = "FAIRSEQ_NAT_EXT_NO_FAST_DECODING"
_OWN = ("fairseq.", "fairseq_nat_ext.")
_METHODS = ("forward_embedding", "extract_features", "extract_features_scriptable", "forward_scriptable",
            "output_layer", "residual_connection", "forward")
_PROJECTIONS = frozenset(("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"))
_switch = {"enabled": True}
_call = {"cache": None}  # {(name, id(module)): answer} inside a decoding call, else None


def set_enabled(flag: bool):
    """Turn the route on or off for this process (``--no-fast-decoding`` sets it off)."""
    _switch["enabled"] = bool(flag)


def enabled() -> bool:
    """False after ``set_enabled(False)`` or with ``FAIRSEQ_NAT_EXT_NO_FAST_DECODING`` set to 1/true/yes."""
    env = os.environ.get(ENV, "").strip().lower()
    return _switch["enabled"] and env not in ("1", "true", "yes", "on")


@contextlib.contextmanager
def decoding_call():
    """The guard's answers are computed once per module until the outermost ``with`` ends (see the
    module docstring); nested calls share the outer cache."""
    if _call["cache"] is not None:
        yield
        return
    _call["cache"] = {}
    try:
        yield
    finally:
        _call["cache"] = None


def once(name, module, compute):
    """``compute(module)``, remembered under ``(name, module)`` inside a :func:`decoding_call`."""
    cache = _call["cache"]
    if cache is None:
        return compute(module)
    key = (name, id(module))
    answer = cache.get(key)
    if answer is None:
        answer = cache[key] = compute(module)
    return answer


def _own(cls, name) -> bool:
    fn = getattr(cls, name, None)
    if fn is None:
        return True
    module = getattr(fn, "__module__", None) or ""
    return module.startswith(_OWN) or module.startswith("torch.")


#: type -> whether its replaced methods are fairseq's, torch's or this plugin's (types do not change)
_TYPE_OK = {}


def _type_ok(cls) -> bool:
    ok = _TYPE_OK.get(cls)
    if ok is None:
        if issubclass(cls, (nn.Linear, nn.LayerNorm)):
            ok = cls in (nn.Linear, nn.LayerNorm)  # a quantised / LoRA / other subclass is not a plain one
        else:
            ok = cls.__module__.startswith("torch.") or all(_own(cls, name) for name in _METHODS)
        _TYPE_OK[cls] = ok
    return ok


def allows(module) -> bool:
    """True when the CPU decoding route may stand in for ``module``'s forward (see the module docstring).
    One walk over the module tree (types checked once per type): tens of microseconds, once per module
    inside a :func:`decoding_call`."""
    return once("allows", module, _allows)


def _allows(module) -> bool:
    if not enabled():
        return False
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return False
    type_ok = _TYPE_OK
    for m in module_walk.submodules(module):
        if m._forward_hooks or m._forward_pre_hooks:
            return False
        ok = type_ok.get(type(m))
        if not (_type_ok(type(m)) if ok is None else ok):
            return False
        children = m._modules
        if children and not _PROJECTIONS.isdisjoint(children):
            if any(children[n] is not None and type(children[n]) is not nn.Linear
                   for n in _PROJECTIONS.intersection(children)):
                return False
    return True
