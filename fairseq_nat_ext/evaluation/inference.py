"""Decode a data-bin split with a loaded checkpoint, the way ``fairseq-generate`` does.

``load_system`` loads the checkpoint(s) with ``checkpoint_utils.load_model_ensemble_and_task`` after
importing this plugin (so its compat shims and registrations apply); ``make_batches`` batches the
split with ``task.get_batch_iterator``; ``decode`` calls ``task.inference_step`` per batch and returns
the best hypothesis of every sentence keyed by its dataset id, so :func:`in_order` restores the split
order.

``iterations`` of a hypothesis (:func:`hypothesis_iterations`) is the number of decoder passes it
took, from what the generator measured:

* this plugin's NAT generators: ``steps`` (decoder passes; with a length beam, the most any
  candidate of the sentence took);
* fairseq's IterativeRefinementGenerator (``cmlm_transformer`` ...): ``steps + 1``, because it
  numbers its passes from 0 (``steps`` is the index of the last pass; ``--iter-decode-max-iter 10``
  allows up to 11 passes); with a length beam this is the chosen candidate's count;
* fairseq's autoregressive SequenceGenerator (no ``steps``): the output length in tokens including
  </s>, i.e. the decoder steps of that sentence decoded alone (batch 1).  With beam > 1 the search
  may run a few steps past the best hypothesis' end; those are not counted.

:func:`count_decoder_calls` counts the decoder's passes directly; the harness uses it at batch
size 1 to cross-check these numbers in its log.
"""
import logging
import os
from dataclasses import dataclass

import numpy as np
import torch

logger = logging.getLogger(__name__)

PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class LoadedSystem:
    models: list
    task: object
    cfg: object
    state: dict  # the first checkpoint, as fairseq loads it (for arch / training stats)
    use_cuda: bool


def load_system(paths, data_bin, src_lang, tgt_lang, use_cuda=False, arg_overrides=None):
    import fairseq_nat_ext  # noqa: F401  (compat shims + registrations before loading)
    from fairseq import checkpoint_utils

    if isinstance(paths, str):
        paths = paths.split(os.pathsep)
    for p in paths:
        if not os.path.isfile(p):
            raise FileNotFoundError(f"checkpoint {p} not found")
    overrides = {
        "data": data_bin,
        "source_lang": src_lang,
        "target_lang": tgt_lang,
        "user_dir": PLUGIN_DIR,
    }
    overrides.update(arg_overrides or {})
    state = checkpoint_utils.load_checkpoint_to_cpu(paths[0], overrides)
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        paths, arg_overrides=overrides
    )
    for m in models:
        m.eval()
        if use_cuda:
            m.cuda()
    state = {k: state.get(k) for k in ("cfg", "args", "optimizer_history", "extra_state")}
    return LoadedSystem(models, task, cfg, state, use_cuda)


def load_split(task, subset):
    task.load_dataset(subset)
    return task.dataset(subset)


def prefix_dataset(dataset, n):
    """A view of the first ``n`` sentences of ``dataset`` (ids unchanged); ``dataset`` if n >= len."""
    if n is None or n >= len(dataset):
        return dataset
    if n <= 0:
        raise ValueError("prefix_dataset: n must be positive")
    from fairseq.data import BaseWrapperDataset

    class _Prefix(BaseWrapperDataset):
        def __len__(self):
            return n

        @property
        def sizes(self):
            sizes = self.dataset.sizes
            return sizes[:n] if sizes is not None else None

        def ordered_indices(self):
            order = self.dataset.ordered_indices()
            return order[order < n]

        def num_tokens_vec(self, indices):
            return self.dataset.num_tokens_vec(indices)

        def filter_indices_by_size(self, indices, max_sizes):
            return self.dataset.filter_indices_by_size(indices, max_sizes)

    return _Prefix(dataset)


def make_batches(task, models, dataset, batch_size):
    """Collated batches of at most ``batch_size`` sentences (fairseq's length-sorted order)."""
    from fairseq import utils

    itr = task.get_batch_iterator(
        dataset=dataset,
        max_tokens=None,
        max_sentences=batch_size,
        max_positions=utils.resolve_max_positions(
            task.max_positions(), *[m.max_positions() for m in models]
        ),
        ignore_invalid_inputs=False,
        required_batch_size_multiple=1,
        seed=1,
        num_shards=1,
        shard_id=0,
        num_workers=0,
        disable_iterator_cache=True,
    ).next_epoch_itr(shuffle=False)
    batches = [b for b in itr if b]
    n = sum(len(b["id"]) for b in batches)
    if n != len(dataset):
        raise RuntimeError(f"batching lost sentences: {n} of {len(dataset)}")
    return batches


#: torch's seed at the start of every :func:`decode` (fairseq-generate's default ``--seed``): sampling
#: decoders (NPD's fertility samples) give the same hypotheses whatever ran before in the process
SEED = 1


def decode(task, generator, models, batches, use_cuda=False, stopwatch=None, postprocess=None, seed=SEED):
    """{dataset id: best hypothesis dict} over ``batches``; times each inference_step (and
    ``postprocess``, a function over its output, when given) in ``stopwatch`` (a
    :class:`.timing.Stopwatch`) when given.  Seeds torch (CPU and CUDA) with ``seed`` first (None:
    not), as fairseq-generate does once before decoding."""
    from contextlib import nullcontext

    from fairseq import utils

    if seed is not None:
        torch.manual_seed(seed)  # every device's generator
    out = {}
    for sample in batches:
        if use_cuda:
            sample = utils.move_to_cuda(sample)
        with stopwatch if stopwatch is not None else nullcontext():
            hypos = task.inference_step(generator, models, sample)
            if postprocess is not None:
                hypos = postprocess(hypos)
        for i, sid in enumerate(sample["id"].tolist()):
            out[int(sid)] = hypos[i][0]
    return out


def in_order(hyps_by_id, n):
    missing = [i for i in range(n) if i not in hyps_by_id]
    if missing:
        raise RuntimeError(f"no hypothesis for {len(missing)} sentences (first id {missing[0]})")
    return [hyps_by_id[i] for i in range(n)]


def symbols_to_strip(generator):
    """What fairseq-generate strips from printed hypotheses (besides </s>, always stripped)."""
    return getattr(generator, "symbols_to_strip_from_output", None) or {generator.eos}


def hypothesis_string(hypo, tgt_dict, generator):
    """The hypothesis in BPE form, as fairseq-generate's H- line before --remove-bpe."""
    return tgt_dict.string(
        hypo["tokens"].int().cpu(), extra_symbols_to_ignore=symbols_to_strip(generator)
    )


def steps_offset(generator):
    """What to add to a hypothesis' ``steps`` to get decoder passes (1 for fairseq's
    IterativeRefinementGenerator, which counts from 0; 0 otherwise)."""
    from fairseq.iterative_refinement_generator import IterativeRefinementGenerator

    return 1 if isinstance(generator, IterativeRefinementGenerator) else 0


def hypothesis_iterations(hypo, offset=0):
    steps = hypo.get("steps")
    if steps is not None:
        return float(steps.item() if torch.is_tensor(steps) else steps) + offset
    return float(hypo["tokens"].numel())


def mean_iterations(hypos, generator=None):
    offset = steps_offset(generator) if generator is not None else 0
    return float(np.mean([hypothesis_iterations(h, offset) for h in hypos])) if hypos else 0.0


class count_decoder_calls:
    """``with count_decoder_calls(models) as c: ...`` -> ``c.calls``: passes of the first model's
    decoder (or, for a single-stack model such as KERMIT, its ``stack``), counted as calls of its first
    layer: every pass runs it exactly once, whichever method drives the layers (fairseq's
    ``extract_features``, an edit model's classifiers, our own decoders' ``forward``, an AR decoder's
    incremental steps).  A decoder without layers falls back to counting ``extract_features`` (or
    ``forward``), wrapped on the instance (fairseq's SequenceGenerator calls the decoder's methods
    directly, which bypasses the decoder's own hooks).  A decoder's ``packed_features`` (inference over the
    real positions, modules/packed.py, which reads the layers' parameters without calling them) is counted
    as one pass too, and so is a call of modules/nat_decoder_inference.decoder_features / token_features
    on it (the decoding forward that runs the layers' sublayers itself; seen through its
    ``PASS_OBSERVERS``).  Length prediction is not a pass."""

    def __init__(self, models):
        model = models[0]
        # a single-stack model (KERMIT) has no decoder: its stack makes the passes
        self.decoder = model.decoder if hasattr(model, "decoder") else getattr(model, "stack", None)
        layers = getattr(self.decoder, "layers", None)
        self.layer = layers[0] if isinstance(layers, torch.nn.ModuleList) and len(layers) else None
        self.method = "extract_features" if hasattr(self.decoder, "extract_features") else "forward"
        self.calls = 0
        self._hook = None

    def _count(self, *unused):
        self.calls += 1

    def __enter__(self):
        self._wrapped = []
        if self.layer is not None:
            self._hook = self.layer.register_forward_pre_hook(self._count)
            if getattr(self.decoder, "packed_features", None) is not None:
                self._wrap("packed_features")
        elif self.decoder is not None:
            self._wrap(self.method)
        if self.layer is not None:
            from ..modules import nat_decoder_inference as fast

            def observe(decoder):
                if decoder is self.decoder:
                    self._count()

            self._observers = fast.PASS_OBSERVERS
            self._observers.append(observe)
            self._observer = observe
        return self  # nothing known to count: calls stays 0

    def _wrap(self, method):
        original = getattr(self.decoder, method)

        def counted(*args, **kwargs):
            self._count()
            return original(*args, **kwargs)

        setattr(self.decoder, method, counted)
        self._wrapped.append(method)

    def __exit__(self, *exc):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        for method in self._wrapped:
            delattr(self.decoder, method)  # the class' method is visible again
        self._wrapped = []
        if getattr(self, "_observer", None) is not None:
            self._observers.remove(self._observer)
            self._observer = None
        return False


def is_autoregressive(generator):
    from fairseq.sequence_generator import SequenceGenerator

    return isinstance(generator, SequenceGenerator)
