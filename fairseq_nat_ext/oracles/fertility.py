"""Fertility targets for the fertility NAT (Gu et al., 2018): how many target units each source unit
produces.  Two sources, pure numpy / tensor functions (no model code):

**Word alignments** (e.g. eflomal's forward links, Pharaoh format ``i-j``: source word i, target word
j).  Alignments are between *words*; the encoder sees BPE pieces, so fertilities are projected onto
pieces.  The rule, for one sentence pair:

1. Every target word j gets exactly one source word a(j) (:func:`target_sources`):
   * linked once: that source word; linked several times: the smallest linked source index;
   * not linked: a(j) of the nearest linked target word on its left, else on its right;
   * no target word linked at all: the proportional position ``floor(j * n_src / n_tgt)``.
2. Word fertility of source word i = the number of target *BPE pieces* of the words j with a(j) = i
   (:func:`word_fertility`), so the fertilities sum to the target length in pieces.
3. A source word of p pieces with word fertility f = q * p + r spreads it over its pieces in order:
   the first r pieces get q + 1, the others q (:func:`spread`).  Every piece's embedding is then
   copied about equally often, instead of all copies going to one piece.

Target pieces are counted, not words, so the fertilities of a sentence always sum to its target length
in BPE pieces (the decoder's output length); ``</s>`` gets fertility 0 (it is not a piece of the line).

**An AT teacher's cross-attention** (:func:`fertility_from_attention`): for every target content
token the source position with the largest attention weight (``</s>`` and padding excluded), counted
per source position.  The sum is again the number of target content tokens.

BPE words: pieces ending in ``@@`` continue into the next piece (subword-nmt / fastBPE convention);
a final piece ending in ``@@`` still ends its word.
"""
import numpy as np
import torch

BPE_MARKER = "@@"


def parse_pharaoh(line):
    """``"0-0 2-1"`` -> [(0, 0), (2, 1)] (source, target) word index pairs.  ValueError when a link
    is not ``i-j`` with non-negative integers."""
    links = []
    for item in line.split():
        i, sep, j = item.partition("-")
        if not sep or not i.isdigit() or not j.isdigit():
            raise ValueError(f"not a Pharaoh link 'i-j': {item!r}")
        links.append((int(i), int(j)))
    return links


def word_piece_counts(pieces, marker=BPE_MARKER):
    """BPE pieces of a line -> number of pieces of every word, e.g. ``a@@ b c`` -> [2, 1]."""
    counts, n = [], 0
    for k, piece in enumerate(pieces):
        n += 1
        if not piece.endswith(marker) or k == len(pieces) - 1:
            counts.append(n)
            n = 0
    return counts


def words_from_pieces(pieces, marker=BPE_MARKER):
    """BPE pieces -> words (markers removed, pieces joined), e.g. ``a@@ b c`` -> ["ab", "c"]."""
    words, cur = [], []
    for k, piece in enumerate(pieces):
        cont = piece.endswith(marker) and k < len(pieces) - 1
        cur.append(piece[: -len(marker)] if piece.endswith(marker) else piece)
        if not cont:
            words.append("".join(cur))
            cur = []
    return words


def target_sources(links, n_src, n_tgt):
    """The source word of every target word (rule 1 of the module doc) -> int array (n_tgt,)."""
    if n_tgt == 0:
        return np.zeros(0, dtype=np.int64)
    if n_src == 0:
        raise ValueError(f"{n_tgt} target words but an empty source: nothing to copy from")
    src = np.full(n_tgt, -1, dtype=np.int64)
    for i, j in links:
        if not (0 <= i < n_src and 0 <= j < n_tgt):
            raise ValueError(f"link {i}-{j} outside {n_src} source x {n_tgt} target words")
        if src[j] < 0 or i < src[j]:
            src[j] = i
    linked = np.flatnonzero(src >= 0)
    if linked.size == 0:
        return (np.arange(n_tgt) * n_src) // n_tgt
    # nearest linked target word on the left, else the first one on the right
    pos = np.arange(n_tgt)
    left = np.searchsorted(linked, pos, side="right") - 1  # index into linked, -1 when none
    nearest = np.where(left >= 0, linked[np.maximum(left, 0)], linked[0])
    return src[nearest]


def word_fertility(links, n_src, n_tgt, tgt_weights=None):
    """Fertility of every source word: sum of ``tgt_weights`` (default 1; the number of BPE pieces of
    each target word) over the target words assigned to it -> int array (n_src,)."""
    sources = target_sources(links, n_src, n_tgt)
    w = np.ones(n_tgt, dtype=np.int64) if tgt_weights is None else np.asarray(tgt_weights, dtype=np.int64)
    if w.shape != (n_tgt,):
        raise ValueError(f"tgt_weights has {w.size} entries for {n_tgt} target words")
    return np.bincount(sources, weights=w, minlength=n_src).astype(np.int64)


def spread(word_fert, pieces_per_word):
    """Word fertilities -> piece fertilities (rule 3): f = q * p + r gives the first r of the word's
    p pieces q + 1 and the others q."""
    word_fert = np.asarray(word_fert, dtype=np.int64)
    p = np.asarray(pieces_per_word, dtype=np.int64)
    if word_fert.shape != p.shape:
        raise ValueError(f"{word_fert.size} word fertilities for {p.size} words")
    if (p < 1).any():
        raise ValueError("every word has at least one piece")
    q, r = word_fert // p, word_fert % p
    rank = np.arange(int(p.sum())) - np.repeat(np.cumsum(p) - p, p)  # piece index inside its word
    return np.repeat(q, p) + (rank < np.repeat(r, p))


def bpe_fertility(links, src_pieces, tgt_pieces, marker=BPE_MARKER):
    """Fertility of every source BPE piece from word links (the whole rule of the module doc).

    links: (source word, target word) pairs over the words of the BPE-removed lines.  Returns an int
    array (len(src_pieces),) summing to len(tgt_pieces)."""
    src_words = word_piece_counts(src_pieces, marker)
    tgt_words = word_piece_counts(tgt_pieces, marker)
    wf = word_fertility(links, len(src_words), len(tgt_words), tgt_weights=tgt_words)
    return spread(wf, src_words) if src_words else np.zeros(0, dtype=np.int64)


def fertility_from_attention(attn, src_mask, tgt_mask):
    """Teacher attention -> fertilities.

    attn (B, T, S) cross-attention weights (one head or the head average); src_mask bool (B, S): the
    source positions that may receive a target token (real tokens, not ``</s>``); tgt_mask bool (B, T):
    the target positions that count (content tokens, not ``</s>`` or padding).  Returns long (B, S):
    for every counted target position the argmax source position, counted per source position (ties:
    the lowest position)."""
    if attn.dim() != 3 or src_mask.shape != (attn.size(0), attn.size(2)) or tgt_mask.shape != attn.shape[:2]:
        raise ValueError(f"shapes: attn {tuple(attn.shape)}, src_mask {tuple(src_mask.shape)}, "
                         f"tgt_mask {tuple(tgt_mask.shape)}")
    empty = ~src_mask.any(1) & tgt_mask.any(1)
    if bool(empty.any()):
        raise ValueError(f"row {int(empty.nonzero()[0])} has target tokens but no source token to copy from")
    scores = attn.float().masked_fill(~src_mask.unsqueeze(1), float("-inf"))
    best = scores.argmax(-1)  # (B, T)
    counts = torch.zeros(src_mask.shape, dtype=torch.long, device=attn.device)
    return counts.scatter_add_(1, best, tgt_mask.long())
