"""Timing protocol (the same for every system of every benchmark).

* Threads: ``torch.set_num_threads(threads)`` (default 2) before anything runs; recorded as
  ``threads`` in the results.  Inter-op threads are set to the same number when torch still allows.
* Model loading, dataset loading and batching (collation) are excluded: batches are built first, only
  ``task.inference_step`` calls are timed (``time.perf_counter``; CUDA is synchronised around each).
* Warm-up: the first ``warmup`` sentences are decoded once at batch size 1, untimed.
* ``latency_ms_b1``: mean milliseconds per sentence decoding the first ``latency_sentences``
  sentences of the split (test order) one at a time (batch size 1).
* ``sent_per_s_b128``: sentences per second decoding the whole split in batches of up to 128
  sentences (fairseq's length-sorted batching); these are also the batches whose hypotheses are
  scored.
"""
import time

import torch


def set_threads(threads):
    torch.set_num_threads(int(threads))
    try:
        torch.set_num_interop_threads(int(threads))
    except RuntimeError:  # only allowed before the first inter-op parallel work
        pass
    return torch.get_num_threads()


class Stopwatch:
    """Accumulates the wall time of ``with watch:`` blocks; synchronises CUDA when used."""

    def __init__(self, cuda=False):
        self.cuda = cuda
        self.laps = []

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
        self.laps.append(time.perf_counter() - self._start)
        return False

    @property
    def total(self):
        return sum(self.laps)


def latency_ms_per_sentence(total_seconds, sentences):
    if sentences <= 0:
        raise ValueError("latency: no sentences were timed")
    return 1000.0 * total_seconds / sentences


def sentences_per_second(sentences, total_seconds):
    if total_seconds <= 0:
        raise ValueError("throughput: zero elapsed time")
    return sentences / total_seconds
