"""Decoding of ``nat_fertility``: argmax fertilities, or noisy parallel decoding (NPD, Gu et al. 2018)
rescored by an autoregressive teacher.  Batched on tensors, CPU or CUDA (the device of the input).

Options (task config fields, read through ``configure``; fairseq-generate ``--npd-samples s
--npd-teacher AT.pt --npd-rank total|mean``):
* ``--npd-rank`` (decoding key ``rank``): how a candidate's score adds up its token log-probabilities.
  ``total`` (default, as the paper: Gu et al. 2018 keep the candidate of highest teacher
  log-probability log p_AR(y | x)) sums them; ``mean`` divides the sum by the number of scored
  tokens (length-normalised; this module's only ranking before the option existed, so results
  measured before it read ``rank=mean``).  With s > 1 it is the teacher's score of each candidate
  (its tokens and ``</s>``) and decides which candidate is returned; with s = 1 (one candidate, no
  teacher) it only sets the reported score (the NAT's own log-probabilities of the output tokens).
* s = 1 (default): every source token's argmax fertility; one decoder pass; score = the total (or
  mean, ``--npd-rank mean``) log-probability of the output tokens under the NAT.
* s > 1: the argmax fertilities plus s - 1 fertility sequences sampled from the classifier (every
  source token independently), i.e. s candidates per sentence.  All B * s candidates are decoded in
  ONE batched decoder pass (argmax token per position), then ALL are scored by the teacher in ONE
  teacher-forced forward pass (no autoregressive loop): score = the teacher's total (or mean)
  log-probability of the candidate's tokens and ``</s>``.  The best-scoring candidate of each
  sentence is returned (ties: the lowest candidate, i.e. the argmax one first).  A fertility
  sequence drawn more than once for a sentence is decoded and scored once (its copies share the
  result).  Large batches (e.g. 128
  sentences x 100 samples) are decoded and scored in length-sorted groups of at most
  ``NPD_CHUNK_TOKENS`` candidate tokens, one pass each, so memory stays bounded; one sentence's
  candidates are one group.  Only real (non-padding) positions are projected onto the vocabulary; with
  one model and one group (batch 1, or a batch whose candidates fit one group) the candidates' tokens
  are the argmax of their logits and only the returned candidate's log-probs are computed
  (``projection.best_logits``; where two top logits of a position round to one float32 log-prob, the
  larger logit wins there and the lower symbol id on the log-prob route of several groups).
  The same maths on less work (modules/packed.py; each tested against the padded forwards): the NAT
  decoder and a fairseq Transformer teacher run their position-wise products on real positions only;
  a pass of one source's candidates (batch 1) reads that source's encoder output unexpanded (keys and
  values projected once), and the teacher scores those candidates over their distinct prefixes (a
  prefix tree: a shared prefix is decoded and projected once).
  The teacher is a fairseq autoregressive checkpoint sharing the target dictionary (its symbols are
  a prefix of ours, which add ``<mask>``); it is loaded once per process and moved to the decoding
  device.
* A candidate has at least one output token: when all of its fertilities are 0, its first source
  token gets fertility 1.  Outputs are cut at the decoder's (and the teacher's) maximum length.
* ``--path a.pt:b.pt``: fertility and token probabilities are averaged over the models (log-mean-exp).
* ``--retain-iter-history``: one ``E-`` line per candidate (candidate order: argmax first).
Hypotheses: tokens (ending in ``</s>``), score, positional_scores (the NAT's own log-probs; 0 for
``</s>``), alignment=None, steps=1 (decoder passes; the teacher's pass is not a decoder pass), and
``npd_scores`` (the selection score of every candidate).

Benchmark decoding keys (``decoding_keys``): ``npd`` (= ``--npd-samples``), ``rank`` (=
``--npd-rank``) and ``fertility`` -- a label naming how the model's training fertilities were made
(``aligner``/``attention``); when the checkpoint's ``--fertility-path`` directory is present, its
``method`` file must agree with it.
"""
import math
import os

import torch

from ..compat import InputError, fairseq_mask_warning_silenced
from ..modules import cpu_linear, encoder_inference, packed
from ..models.nat.nat_fertility import source_fertility_mask
from .base import NATGeneratorBase, eval_mode
from .projection import (MAX_ELEMENTS, best_logits, best_tokens, row_log_probs, shared_target_log_probs,
                         target_log_probs, vocab_projection)

_TEACHERS = {}  # (checkpoint, data dir) -> teacher model, loaded once per process


def load_teacher(path, data_dir, tgt_dict):
    """The AT teacher of ``--npd-teacher`` (cached).  Its target dictionary must be a prefix of ours."""
    key = (os.path.abspath(path), data_dir)
    if key in _TEACHERS:
        return _TEACHERS[key]
    if not os.path.isfile(path):
        raise InputError(f"--npd-teacher {path}: no such file")
    from fairseq import checkpoint_utils
    from fairseq.models.nat import FairseqNATModel

    overrides = {"data": data_dir} if data_dir else {}
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides)
    teacher = models[0]
    if isinstance(teacher, FairseqNATModel) or not hasattr(teacher, "decoder"):
        raise InputError(f"--npd-teacher {path} holds a {type(teacher).__name__}, not an autoregressive "
                         "encoder-decoder (e.g. fairseq's transformer)")
    tdict = task.target_dictionary
    if len(tdict) > len(tgt_dict) or tdict.symbols != tgt_dict.symbols[: len(tdict)]:
        raise InputError(f"--npd-teacher {path}: its target dictionary ({len(tdict)} symbols) is not a "
                         f"prefix of this model's ({len(tgt_dict)})")
    for p in teacher.parameters():
        p.requires_grad_(False)
    _TEACHERS[key] = teacher.eval()
    return teacher


def candidate_fertilities(fert_lprobs, allowed, samples, real=None):
    """fert_lprobs (B, S, F+1) log-probs, allowed bool (B, S) -> long (B, s, S): candidate 0 the argmax
    fertilities, 1..s-1 sampled; 0 outside ``allowed``; every candidate sums to >= 1 (its first
    allowed position -- or first ``real`` one when none is allowed -- gets 1 when all are 0)."""
    B, S, K = fert_lprobs.shape
    cands = [fert_lprobs.argmax(-1).unsqueeze(1)]
    if samples > 1:
        drawn = torch.multinomial(fert_lprobs.exp().reshape(B * S, K), samples - 1, replacement=True)
        cands.append(drawn.view(B, S, samples - 1).permute(0, 2, 1))
    fert = torch.cat(cands, 1).masked_fill(~allowed.unsqueeze(1), 0)
    real = allowed if real is None else real
    first = torch.where(allowed.any(1), allowed.float().argmax(1), real.float().argmax(1))  # (B,)
    empty = fert.sum(-1).eq(0)  # (B, s)
    bump = torch.zeros_like(fert).scatter_(2, first.view(B, 1, 1).expand(B, fert.size(1), 1),
                                           empty.long().unsqueeze(-1))
    return fert + bump


def teacher_forced_inputs(tokens, lengths, pad, eos):
    """Candidates (N, T) right-padded, lengths (N,) -> (prev_output_tokens, target), both (N, T + 1):
    target = tokens ``</s>``, prev = ``</s>`` tokens (fairseq's convention), padded with ``pad``."""
    N, T = tokens.shape
    pos = torch.arange(T + 1, device=tokens.device).unsqueeze(0)
    target = torch.cat([tokens, tokens.new_full((N, 1), pad)], 1)
    target = target.masked_fill(pos >= lengths.unsqueeze(1), pad).masked_fill(pos == lengths.unsqueeze(1), eos)
    prev = torch.cat([tokens.new_full((N, 1), eos), target[:, :-1]], 1).masked_fill(target.eq(pad), pad)
    return prev, target


def cross_attention_rows(encoder, encoder_out, order):
    """The encoder output that candidate rows ``order`` (N,) cross-attend to.  When every row comes from
    one source (batch 1, or a group of one sentence's candidates), that source's output is NOT expanded:
    fairseq's MultiheadAttention, given a key batch that divides the query batch (its beam-search path,
    query rows grouped by key row), projects the source's keys and values once for all N rows.
    Otherwise the output is reordered to the N rows."""
    if order.numel() > 0 and bool((order == order[0]).all()):
        order = order[:1]
    return encoder.reorder_encoder_out(encoder_out, order)


def _shares_cross_attention(decoder):
    """Whether ``decoder``'s cross-attention is fairseq's MultiheadAttention, which takes a key batch that
    divides the query batch (fairseq's Transformer decoders, NAT ones included)."""
    from fairseq.models.transformer import TransformerDecoderBase

    return isinstance(decoder, TransformerDecoderBase)


#: ``--npd-rank`` values: how a candidate's token log-probabilities add up to its score
RANKS = ("total", "mean")


def reduce_log_probs(lp, keep, rank):
    """lp (N, T) token log-probs, keep bool (N, T) the scored positions -> (N,): their sum (``total``) or
    their mean (``mean``; a row without positions scores 0)."""
    if rank not in RANKS:
        raise InputError(f"--npd-rank must be one of {', '.join(RANKS)}, got {rank!r}")
    total = (lp * keep).sum(1)
    return total if rank == "total" else total / keep.sum(1).clamp(min=1)


@torch.no_grad()
def teacher_scores(teacher, src_tokens, src_lengths, order, tokens, lengths, pad, eos, encoder_out=None,
                   rank="mean"):
    """Log-probability of every candidate (and its ``</s>``) under the teacher, summed (``rank="total"``)
    or averaged over its tokens (``"mean"``), one teacher-forced pass: the teacher encodes the B
    sources once (or takes their ``encoder_out``), the candidate rows (N, ``order`` maps each to its
    source row) go through its decoder together -> (N,)."""
    prev, target = teacher_forced_inputs(tokens, lengths, pad, eos)
    enc = encoder_inference.forward(teacher.encoder, src_tokens, src_lengths) if encoder_out is None else encoder_out
    V = teacher.decoder.output_projection.out_features if getattr(teacher.decoder, "output_projection", None) \
        is not None else len(teacher.decoder.dictionary)
    if int(target.max()) >= V:
        raise InputError(f"npd: a candidate holds symbol {int(target.max())}, outside the teacher's {V}")
    keep = target.ne(pad)
    if _shares_cross_attention(teacher.decoder):
        enc = cross_attention_rows(teacher.encoder, enc, order)
    else:
        enc = teacher.encoder.reorder_encoder_out(enc, order)
    if packed.supports_decoder(teacher.decoder):  # the same maths on fewer positions
        if enc["encoder_out"][0].size(1) == 1:  # one source: each distinct candidate prefix once
            feats, node = packed.tree_decoder_features(teacher.decoder, prev, enc)
            lp = shared_target_log_probs(feats, vocab_projection(teacher.decoder), node, target, V)
        else:  # the real positions only
            feats = packed.decoder_features(teacher.decoder, prev, enc)
            lp = target_log_probs(feats, vocab_projection(teacher.decoder), target, V, keep=keep)
    else:
        with fairseq_mask_warning_silenced():
            feats, _ = teacher.decoder(prev, encoder_out=enc, features_only=True)
        lp = target_log_probs(feats, teacher.decoder.output_layer, target, V, keep=keep)
    return reduce_log_probs(lp, keep, rank)


#: candidate tokens per decoder / teacher pass (rows x the longest row): NPD over a large batch
#: (128 sentences x 100 samples) runs in as many length-sorted passes as this budget needs; one
#: sentence's 100 candidates fit in one
NPD_CHUNK_TOKENS = 16384


def length_chunks(lengths, max_tokens=None):
    """lengths (U,) -> index tensors covering 0..U-1 once: rows sorted by length, grouped so that rows x
    the group's longest row <= max_tokens (default ``NPD_CHUNK_TOKENS``; a longer row alone)."""
    max_tokens = NPD_CHUNK_TOKENS if max_tokens is None else max_tokens
    order = torch.argsort(lengths, stable=True)
    L = lengths[order].clamp(min=1).tolist()
    groups, start = [], 0
    for i, n in enumerate(L):
        if i > start and (i - start + 1) * n > max_tokens:
            groups.append(order[start:i])
            start = i
    if L:
        groups.append(order[start:])
    return groups


class NPDGenerator(NATGeneratorBase):
    #: the benchmark's decoding keys this generator reads (fairseq_nat_ext.evaluation.decoding)
    decoding_keys = ("npd", "rank", "fertility")

    def __init__(self, models, tgt_dict, npd_samples=None, teacher=None, teacher_path=None,
                 retain_history=False, fertility_label=None, npd_rank=None):
        super().__init__(models, tgt_dict, retain_history)
        self.npd_samples = npd_samples  # None: from the task config (configure), else 1
        self.npd_rank = npd_rank  # None: from the task config (configure), else "total"
        self.teacher = teacher
        self.teacher_path = teacher_path
        self.fertility_label = fertility_label

    @classmethod
    def from_generation_args(cls, models, tgt_dict, args):
        return cls(models, tgt_dict, npd_samples=getattr(args, "npd_samples", None),
                   teacher_path=getattr(args, "npd_teacher", None),
                   retain_history=getattr(args, "retain_iter_history", False),
                   fertility_label=getattr(args, "fertility_source", None),
                   npd_rank=getattr(args, "npd_rank", None))

    def configure(self, task_cfg):
        """Options from the task config (``--npd-samples``, ``--npd-teacher``, ``--npd-rank``) unless the
        generation options already set them; loads the teacher when s > 1."""
        if self.npd_samples is None:
            self.npd_samples = getattr(task_cfg, "npd_samples", 1)
        if self.npd_rank is None:
            self.npd_rank = getattr(task_cfg, "npd_rank", None)
        self.rank  # checked before any decoding
        if self.teacher_path is None:
            self.teacher_path = getattr(task_cfg, "npd_teacher", None)
        self._check_label(getattr(task_cfg, "fertility_path", None))
        if self.samples > 1 and self.teacher is None:
            self.teacher = self._load_teacher(getattr(task_cfg, "data", None))

    @property
    def samples(self):
        s = 1 if self.npd_samples is None else int(self.npd_samples)
        if s < 1:
            raise InputError(f"--npd-samples must be >= 1, got {s}")
        return s

    @property
    def rank(self):
        r = "total" if self.npd_rank is None else str(self.npd_rank)
        if r not in RANKS:
            raise InputError(f"--npd-rank must be one of {', '.join(RANKS)}, got {r!r}")
        return r

    def _check_label(self, fertility_path):
        from ..data.fertility import fertility_method

        if self.fertility_label is None:
            return
        if self.fertility_label not in ("aligner", "attention"):
            raise InputError(f"decoding fertility={self.fertility_label}: expected aligner or attention")
        method = fertility_method(fertility_path) if fertility_path and os.path.isdir(fertility_path) else None
        if method is not None and method != self.fertility_label:
            raise InputError(f"decoding fertility={self.fertility_label}, but the model was trained on "
                             f"{method} fertilities ({fertility_path})")

    def _load_teacher(self, data_dir):
        if not self.teacher_path:
            raise InputError(f"--npd-samples {self.samples} needs --npd-teacher (an AT checkpoint that "
                             "scores the candidates)")
        data_dir = data_dir.split(os.pathsep)[0] if data_dir else None
        return load_teacher(self.teacher_path, data_dir, self.tgt_dict)

    def _teacher_on(self, like):
        if self.teacher is None:
            self.teacher = self._load_teacher(None)
        p = next(self.teacher.parameters(), None)
        if p is not None and (p.device != like.device or p.dtype != like.dtype):
            self.teacher.to(device=like.device, dtype=like.dtype)
        return self.teacher

    def _ensemble(self, outs):
        if len(outs) == 1:
            return outs[0]
        return torch.logsumexp(torch.stack(outs), 0) - math.log(len(outs))

    def candidates(self, models, src_tokens, src_lengths, samples):
        """Encode, pick fertilities, decode every distinct candidate (one pass per length group of
        :func:`length_chunks`, ``chunks``; one group for one sentence).  -> dict with fert
        (B, s, S); tokens (N, T), lprobs (N, T), lengths (N,), order (N,) of all N = B * s
        candidates (candidate-major per sentence); ``unique`` (U,) the candidate row that stands for
        each distinct (sentence, fertilities) pair and ``inverse`` (N,) its position in ``unique``.
        Decoding is a function of the fertilities (argmax tokens), so a fertility sequence drawn
        twice for a sentence is decoded (and scored) once: with s = 100 most draws repeat.
        With s > 1, one model and one group whose (real positions x vocabulary) logits fit in
        ``projection.MAX_ELEMENTS`` (batch 1 always), ``lprobs`` is None and the dict holds the
        candidates' ``logits`` (M, V) and ``start`` (U,) instead (:func:`best_logits`; the teacher, not
        these log-probs, picks the candidate): :meth:`returned_log_probs` reads any candidate's."""
        B = src_tokens.size(0)
        enc = [m.encoder(src_tokens, src_lengths=src_lengths) for m in models]
        fert_lp = self._ensemble([m.decoder.forward_fertility(e, normalize=True) for m, e in zip(models, enc)])
        allowed = source_fertility_mask(src_tokens, self.pad, self.eos)
        fert = candidate_fertilities(fert_lp, allowed, samples, real=src_tokens.ne(self.pad))
        order = torch.arange(B, device=src_tokens.device).repeat_interleave(samples)
        flat = fert.view(B * samples, -1)
        if samples > 1:
            _, inverse = torch.unique(torch.cat([order.unsqueeze(1), flat], 1), dim=0, return_inverse=True)
            # the first candidate row of every distinct pair (scatter_reduce amin: lowest row index)
            rows = torch.arange(B * samples, device=flat.device)
            unique = torch.full((int(inverse.max()) + 1,), B * samples, dtype=torch.long, device=flat.device)
            unique = unique.scatter_reduce(0, inverse, rows, reduce="amin")
        else:
            unique, inverse = torch.arange(B, device=flat.device), torch.arange(B, device=flat.device)
        max_len = self.max_len
        if self.teacher is not None and samples > 1 and hasattr(self.teacher, "max_decoder_positions"):
            max_len = min(max_len, self.teacher.max_decoder_positions() - 1)
        u_len = flat[unique].sum(1).clamp(max=max_len)  # each distinct candidate's output length
        U, T = unique.numel(), int(u_len.max())
        tokens = torch.full((U, T), self.pad, dtype=torch.long, device=flat.device)
        lprobs = torch.zeros((U, T), dtype=torch.float, device=flat.device)
        chunks = length_chunks(u_len)
        # s > 1, one model, one pass: the teacher picks the candidate, so the NAT's log-probs are needed
        # for the returned candidate's tokens only -- the others keep just their tokens (best_logits)
        lazy = samples > 1 and len(models) == 1 and len(chunks) == 1
        out = {}
        for idx in chunks:
            rows, feats, valid = unique[idx], [], None
            src_rows = order[rows]
            for m, e in zip(models, enc):
                copied = m.decoder.copy_source(m.encoder.reorder_encoder_out(e, src_rows), flat[rows],
                                               max_len=max_len)
                valid = copied[1]
                cross = cross_attention_rows(m.encoder, e, src_rows)  # one source: its keys/values once
                packed_features = getattr(m.decoder, "packed_features", None)
                if packed_features is not None:  # real positions only: (M, C) rows at ``valid``
                    feats.append(packed_features(cross, copied))
                else:
                    feats.append(m.decoder(cross, copied=copied, features_only=True))
            n = valid.size(1)
            if lazy and int(valid.sum()) * len(self.tgt_dict) <= MAX_ELEMENTS:
                tok, logits = best_logits(feats[0], vocab_projection(models[0].decoder), self.forbidden, keep=valid)
                real = valid.sum(1)
                start = torch.empty_like(u_len)
                start[idx] = torch.cumsum(real, 0) - real  # each candidate's first row of ``logits``
                out = {"logits": logits, "start": start}
            else:
                tok, lp = best_tokens(feats, [vocab_projection(m.decoder) for m in models], len(self.tgt_dict),
                                      self.forbidden, keep=valid)
                lprobs[idx, :n] = lp  # 0 off ``valid`` (not projected)
            tokens[idx, :n] = tok.masked_fill(~valid, self.pad)
        out.update({"fert": fert, "tokens": tokens[inverse], "lengths": u_len[inverse],
                    "lprobs": None if "logits" in out else lprobs[inverse],
                    "order": order, "unique": unique, "inverse": inverse, "chunks": chunks})
        return out

    @staticmethod
    def returned_log_probs(c, rows):
        """The NAT's log-probs (K, T) of the candidates ``rows`` (K,) (0 off their lengths): from
        :meth:`candidates`' ``lprobs``, or read from its kept ``logits`` (:func:`best_logits`)."""
        if "logits" not in c:
            return c["lprobs"][rows]
        lengths = c["lengths"][rows]
        T = c["tokens"].size(1)
        keep = torch.arange(T, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)  # (K, T)
        first = c["start"][c["inverse"][rows]]
        at = (first.unsqueeze(1) + torch.arange(T, device=lengths.device).unsqueeze(0))[keep]
        out = c["logits"].new_zeros((rows.numel(), T))
        out[keep] = row_log_probs(c["logits"], at, c["tokens"][rows][keep])
        return out

    @torch.no_grad()
    @cpu_linear.decodes
    def generate(self, models, sample, prefix_tokens=None, constraints=None, **unused):
        if constraints is not None or prefix_tokens is not None:
            raise NotImplementedError("nat_fertility decoding: prefix and constrained decoding are not supported")
        models = models or self.models
        eval_mode(models)
        net = sample["net_input"]
        src_tokens, src_lengths = net["src_tokens"], net["src_lengths"]
        B, s = src_tokens.size(0), self.samples
        if s > 1:
            self._teacher_on(next(models[0].parameters()))
        c = self.candidates(models, src_tokens, src_lengths, s)
        lengths = c["lengths"]
        if s > 1:
            u = c["unique"]
            enc = encoder_inference.forward(self.teacher.encoder, src_tokens, src_lengths)
            u_scores = lengths.new_zeros(u.numel(), dtype=torch.float)
            for idx in c["chunks"]:  # the decoder's length-sorted groups (one at batch 1)
                rows = u[idx]
                n = int(lengths[rows].max())
                u_scores[idx] = teacher_scores(self.teacher, src_tokens, src_lengths, c["order"][rows],
                                               c["tokens"][rows, :n], lengths[rows], self.pad, self.eos,
                                               encoder_out=enc, rank=self.rank)
            scores = u_scores[c["inverse"]]
        else:  # one candidate: the NAT's own log-probabilities (0 off a row's length)
            keep = torch.arange(c["lprobs"].size(1), device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)
            scores = reduce_log_probs(c["lprobs"], keep, self.rank)
        best = scores.view(B, s).argmax(1) + torch.arange(B, device=scores.device) * s
        best_lp = self.returned_log_probs(c, best)
        c.pop("logits", None)  # (M, V): not needed any more
        finalized = []
        for b in range(B):
            row = int(best[b])
            n = int(lengths[row])
            hyp = {"tokens": self._with_eos(c["tokens"][row, :n]), "score": scores[row],
                   "positional_scores": torch.cat([best_lp[b, :n], best_lp.new_zeros(1)]),
                   "alignment": None, "steps": 1, "npd_scores": scores[b * s:(b + 1) * s].clone()}
            if self.retain_history:
                hyp["history"] = [{"tokens": self._with_eos(c["tokens"][r, : int(lengths[r])])}
                                  for r in range(b * s, (b + 1) * s)]
            finalized.append([hyp])
        return finalized

    def _with_eos(self, toks):
        return torch.cat([toks, toks.new_full((1,), self.eos)])
