"""Target corruption of the denoising refinement loss (Lee et al., 2018), on tensors.

All functions take tokens (B, T) and ``content`` bool (B, T) (the positions that hold target tokens:
not padding); positions outside ``content`` never change and are never read as a neighbour.  Each
position is drawn independently with probability p (``generator``: an optional torch.Generator).

* :func:`random_replace`: y_t := a token drawn uniformly from ``vocab`` (a 1-D tensor of ids; it may
  draw y_t itself).
* :func:`repeat_next`: y_t := y_(t+1) (only where t+1 is content).  Applied in parallel from the
  input, so neighbouring draws t, t+1 give y_(t+1), y_(t+2).
* :func:`swap_next`: y_t and y_(t+1) exchange (only where t+1 is content).  Swapped pairs never
  overlap: going left to right, a draw at t is dropped when t-1 swapped (within a run of consecutive
  draws starting at a, the swaps are at a, a+2, a+4, ...).
* :func:`corrupt`: the three in that order, each applied to the previous one's output (a noise with
  p = 0 draws nothing, so it consumes no random numbers).
"""
import torch


def _draw(content, p, generator):
    u = torch.rand(content.shape, device=content.device, generator=generator)
    return (u < p) & content


def _has_next(content):
    nxt = torch.zeros_like(content)
    nxt[:, :-1] = content[:, 1:]
    return content & nxt


def random_replace(tokens, content, p, vocab, generator=None):
    if p <= 0:
        return tokens
    drawn = _draw(content, p, generator)
    idx = torch.randint(0, vocab.numel(), tokens.shape, device=tokens.device, generator=generator)
    return torch.where(drawn, vocab.to(tokens.device)[idx], tokens)


def repeat_next(tokens, content, p, generator=None):
    if p <= 0:
        return tokens
    drawn = _draw(content, p, generator) & _has_next(content)
    nxt = torch.cat([tokens[:, 1:], tokens[:, -1:]], 1)
    return torch.where(drawn, nxt, tokens)


def swap_next(tokens, content, p, generator=None):
    if p <= 0:
        return tokens
    drawn = _draw(content, p, generator) & _has_next(content)
    T = tokens.size(1)
    pos = torch.arange(T, device=tokens.device).unsqueeze(0).expand_as(drawn)
    prev = torch.zeros_like(drawn)
    prev[:, 1:] = drawn[:, :-1]
    run_start = torch.where(drawn & ~prev, pos, torch.zeros_like(pos)).cummax(1).values
    swap = drawn & ((pos - run_start) % 2 == 0)  # position t swaps with t + 1
    second = torch.zeros_like(swap)
    second[:, 1:] = swap[:, :-1]  # position t takes y_(t-1)
    nxt = torch.cat([tokens[:, 1:], tokens[:, -1:]], 1)
    prv = torch.cat([tokens[:, :1], tokens[:, :-1]], 1)
    return torch.where(swap, nxt, torch.where(second, prv, tokens))


def corrupt(tokens, content, vocab, p_replace=0.0, p_repeat=0.0, p_swap=0.0, generator=None):
    out = random_replace(tokens, content, p_replace, vocab, generator)
    out = repeat_next(out, content, p_repeat, generator)
    return swap_next(out, content, p_swap, generator)
