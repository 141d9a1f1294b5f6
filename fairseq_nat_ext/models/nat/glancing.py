"""Glancing (GLAT, Qian et al., ACL 2021): which positions of the reference the decoder is shown.

A first decoder pass without gradient predicts the target; d = the Hamming distance between its argmax
and the reference (per sentence, over the positions the model is trained on); N = round(ratio * d)
positions are revealed -- their decoder inputs become the reference tokens' embeddings for the second,
trained pass.  Shared by the ``glat`` arch (positions = target positions), ``ctc_nat`` (positions = the
best CTC alignment's) and ``da_transformer`` (positions = the best path's vertices).

Departure, the same for all three: the N positions are drawn uniformly among the *wrong* ones (the paper
draws among all target positions); ratio <= 1 so N <= d and a position the first pass got right is never
revealed.  ``round`` is Python's (half to even), as ``torch.round``.
"""
import torch


def glancing_reveal(wrong, ratio, generator=None):
    """wrong bool (B, T): positions where the first pass' argmax differs from the reference (False off
    the trained positions); ratio in [0, 1] -> reveal bool (B, T), exactly round(ratio * wrong.sum(1))
    positions per row, all of them wrong, drawn uniformly at random."""
    if not 0.0 <= float(ratio) <= 1.0:
        raise ValueError(f"glancing ratio must be in [0, 1], got {ratio}")
    n = torch.round(float(ratio) * wrong.sum(1).double()).long()
    key = torch.rand(wrong.shape, device=wrong.device, generator=generator).masked_fill(~wrong, 2.0)
    rank = key.argsort(1).argsort(1)  # rank of each position among its row, wrong ones first
    return wrong & (rank < n.unsqueeze(1))


def glanced_tokens(reference, reveal, pad):
    """reference (B, T) long, reveal bool (B, T) -> (B, T): the reference at revealed positions, ``pad``
    elsewhere (what the decoders' ``glanced`` argument reads)."""
    return reference.masked_fill(~reveal, pad)
