"""Decoding of ``da_transformer``: one decoder pass, then a search over the DAG, batched on tensors (CPU or
CUDA, the device of the input; Python loops run over decoding steps only).

Notation: the graph of a sentence has L vertices; vertex 0 emits ``<s>`` and vertex L - 1 ``</s>`` (as in
training), every other vertex one token other than ``pad``, ``<s>``, ``</s>``, ``<mask>``.  A hypothesis is a
path 0 = a_1 < ... < a_M = L - 1 with a token at each vertex; its joint score is
log P(A, Y | X) = sum_k log E[a_k, a_{k+1}] + sum_k log P(y_k | v_{a_k}) (``<s>`` and ``</s>`` included), and
e(j) below is the best token log-prob of vertex j (log P(<s> | v_0), log P(</s> | v_{L-1}) at the ends).

``--dag-decoder`` (task option ``dag_decoder``; the generation options' ``dag_decoder`` first when set):
* ``greedy``: from vertex 0 repeatedly move to argmax_j E[i, j] until the last vertex; the argmax token of
  every visited vertex.
* ``lookahead`` (default): the next vertex is argmax_j (log E[i, j] + e(j)); the argmax tokens.
* ``viterbi``: joint Viterbi (Shao et al. 2022): for every path length M the maximum over paths and tokens
  of log P(A, Y | X) (dynamic programming), then the length of highest log P / M^alpha, alpha =
  ``--dag-viterbi-lenpen`` (default 1; M counts ``<s>`` and ``</s>``, the DA-Transformer paper's notation;
  alpha = 0: the joint maximum over all lengths).
* ``beam``: beam search over (vertex, token) -- ``--dag-beam-size`` K partial hypotheses (a path prefix and
  its tokens, scored by their joint log-prob); each grows to any later vertex with one of that vertex's
  ``--dag-topk`` most probable tokens, or ends at the last vertex (then scored by log P / M^alpha as
  ``viterbi``); hypotheses of one token sequence over different paths are not merged; no n-gram LM.
  With K and ``--dag-topk`` covering the whole space it returns the joint Viterbi output (tested).
* ``sample``: ``--dag-sample-size`` s candidates per sentence, the lookahead output and s - 1 sampled ones
  (path from the transitions, each token from its vertex's ``--dag-topk`` most probable tokens,
  renormalised); with ``--npd-teacher AT.pt`` they are scored by the teacher in one teacher-forced pass
  (as noisy parallel decoding, ``--npd-rank total|mean``), otherwise by log P(A, Y | X) / M^alpha.
Consecutive identical tokens are NOT collapsed (the DA-Transformer has no CTC collapse; the paper's
reference code merges them: add the task's ``--collapse-repeats`` to do so).  Outputs hold at most
``--max-target-positions`` - 2 tokens before ``</s>`` (longer greedy/lookahead/sample paths are cut; Viterbi
and beam search consider no longer hypothesis).  One model only (no ``--path`` ensembles).  ``--nbest`` F:
``beam`` returns the F best finished hypotheses of its search (F <= ``--dag-beam-size``), ``sample`` its F
best candidates (not deduplicated: a sample may repeat the lookahead output), best first; ``greedy``,
``lookahead`` and ``viterbi`` one hypothesis per sentence.
Hypotheses: tokens (ending in ``</s>``), score (the joint log-prob per output token, ``</s>`` included),
positional_scores (each token's log-prob plus the transition into its vertex; ``</s>`` also carries
``<s>``'s; their sum is log P(A, Y | X); beam: the score spread evenly), alignment=None, steps=1 (one
decoder pass; the teacher's is not a decoder pass), and ``dag_path`` (the vertices, ends included).
"""
import torch

from ..compat import InputError
from ..criterions.dag_loss import valid_links
from ..modules import cpu_linear
from ..modules.vocab_projection import best_vocab_tokens, vocab_logits
from .base import NATGeneratorBase, eval_mode

NEG_INF = float("-inf")
DECODERS = ("greedy", "lookahead", "viterbi", "beam", "sample")
RANK_CHUNK = 256  # vertices projected at a time for the top-k tokens


# -- searches on (B, L, L) log transitions, every sentence at once ------------------------------------------

def walk(choice, lengths):
    """Follow ``choice`` (B, L): the next vertex of every vertex, from vertex 0 until each row's last vertex.
    -> (path (B, P) vertices, -1 after the end; path lengths (B,) in vertices)."""
    B = choice.size(0)
    cur = torch.zeros(B, dtype=torch.long, device=choice.device)
    last = lengths - 1
    done = cur.eq(last)
    steps = [cur]
    for _ in range(int(lengths.max()) - 1):
        if bool(done.all()):
            break
        nxt = choice.gather(1, cur.unsqueeze(1)).squeeze(1)
        cur = torch.where(done, cur, nxt)
        steps.append(torch.where(done, torch.full_like(cur, -1), cur))
        done = done | cur.eq(last)
    path = torch.stack(steps, 1)
    return path, path.ge(0).sum(1)


def dag_greedy(links, lengths):
    """Greedy: next vertex = argmax_j E[i, j].  links (B, L, L) log-probs -> :func:`walk`'s (path, lengths)."""
    return walk(valid_links(links, lengths).argmax(-1), lengths)


def dag_lookahead(links, vertex_scores, lengths):
    """Lookahead: next vertex = argmax_j (log E[i, j] + e(j)).  vertex_scores (B, L) = e."""
    return walk((valid_links(links, lengths) + vertex_scores.unsqueeze(1)).argmax(-1), lengths)


def dag_viterbi(links, vertex_scores, lengths, lenpen=1.0, max_vertices=None):
    """Joint Viterbi: delta_M[j] = max over paths of M vertices from 0 to j of sum transitions + sum e, for
    M = 2 .. min(L, ``max_vertices``); the length maximising delta_M[L - 1] / M^lenpen; backtracking.
    -> (path (B, P), path lengths (B,), joint scores (B,) unnormalised)."""
    B, L, _ = links.shape
    dev = links.device
    links = valid_links(links.float(), lengths)
    e = vertex_scores.float()
    K = L if max_vertices is None else max(2, min(L, int(max_vertices)))
    rows = torch.arange(B, device=dev)
    last = lengths - 1
    delta = torch.full((B, L), NEG_INF, device=dev)
    delta[:, 0] = e[:, 0]
    back, finals = [], []
    for _ in range(2, K + 1):
        delta, bp = (delta.unsqueeze(-1) + links).max(1)
        delta = delta + e
        back.append(bp)
        finals.append(delta[rows, last])
    finals = torch.stack(finals, 0)  # (K - 1, B): paths of 2 .. K vertices
    m = torch.arange(2, K + 1, device=dev, dtype=torch.float).unsqueeze(1)
    best, k = (finals / m.pow(float(lenpen))).max(0)
    n = k + 2  # vertices
    joint = finals[k, rows]
    path = torch.full((B, K), -1, dtype=torch.long, device=dev)
    v = last.clone()
    for pos in range(K - 1, -1, -1):
        on = pos < n
        path[:, pos] = torch.where(on, v, path[:, pos])
        if pos > 0:
            take = on & (pos <= n - 1)
            prev = back[pos - 1][rows, v]
            v = torch.where(take, prev, v)
    return path, n, joint


def dag_beam_search(links, top_lp, top_tok, first_lp, last_lp, lengths, beam, lenpen=1.0, max_len=None, nbest=1):
    """Beam search over the DAG (see the module doc).  links (B, L, L) log transitions; top_lp, top_tok
    (B, L, T): each vertex's T candidate tokens and their log-probs (-inf: none); first_lp, last_lp (B,):
    log P(<s> | v_0), log P(</s> | v_{L-1}); ``max_len``: longest content; ``nbest`` F: the F best finished
    hypotheses of the whole search are kept.  -> (tokens (B, F, N) content padded with -1, content lengths
    (B, F), joint scores (B, F), normalised scores (B, F), paths (B, F, N + 2) with -1), best first (a slot
    without a hypothesis: normalised score -inf)."""
    B, L, T = top_lp.shape
    dev = links.device
    K = int(beam)
    links = valid_links(links.float(), lengths)
    max_len = L - 2 if max_len is None else min(int(max_len), L - 2)
    N = max(max_len, 1)
    last = lengths - 1
    vert = torch.zeros((B, K), dtype=torch.long, device=dev)
    score = torch.full((B, K), NEG_INF, device=dev)
    score[:, 0] = first_lp.float()
    toks = torch.full((B, K, N), -1, dtype=torch.long, device=dev)
    paths = torch.full((B, K, N + 2), -1, dtype=torch.long, device=dev)
    paths[:, :, 0] = 0
    n = torch.zeros((B, K), dtype=torch.long, device=dev)
    F = int(nbest)
    fin_norm = torch.full((B, F), NEG_INF, device=dev)
    fin_joint = torch.full((B, F), NEG_INF, device=dev)
    fin_toks = torch.full((B, F, N), -1, dtype=torch.long, device=dev)
    fin_n = torch.zeros((B, F), dtype=torch.long, device=dev)
    fin_path = torch.full((B, F, N + 2), -1, dtype=torch.long, device=dev)
    inner = torch.arange(L, device=dev).view(1, 1, L) < last.view(B, 1, 1)  # intermediate vertices
    for _ in range(max_len + 1):
        out = links.gather(1, vert.unsqueeze(-1).expand(B, K, L))  # (B, K, L)
        # finish: move to the last vertex, which emits </s>
        end = score + out.gather(2, last.view(B, 1, 1).expand(B, K, 1)).squeeze(-1) + last_lp.float().unsqueeze(1)
        norm = end / (n + 2).float().pow(float(lenpen))
        # the F best of the kept and the newly finished (stable: on a tie the one finished earlier stays)
        keep = torch.cat([fin_norm, norm], 1).sort(dim=1, descending=True, stable=True)[1][:, :F]
        p = paths.clone()
        p.scatter_(2, (n + 1).unsqueeze(-1), last.view(B, 1, 1).expand(B, K, 1))

        def pick(kept, new):
            both = torch.cat([kept, new], 1)
            return both.gather(1, keep.view(B, F, *([1] * (both.dim() - 2))).expand(B, F, *both.shape[2:]))

        fin_norm, fin_joint, fin_n = pick(fin_norm, norm), pick(fin_joint, end), pick(fin_n, n)
        fin_toks, fin_path = pick(fin_toks, toks), pick(fin_path, p)
        # grow: a later intermediate vertex j and one of its tokens
        cand = score.view(B, K, 1, 1) + out.masked_fill(~inner, NEG_INF).unsqueeze(-1) + top_lp.unsqueeze(1)
        cand = cand.masked_fill((n >= max_len).view(B, K, 1, 1), NEG_INF).view(B, -1)
        s, idx = cand.topk(min(K, cand.size(1)), dim=1)
        if not bool(torch.isfinite(s).any()):
            break
        src, rest = idx // (L * T), idx % (L * T)
        j, t = rest // T, rest % T
        live = torch.isfinite(s)
        toks = toks.gather(1, src.unsqueeze(-1).expand(-1, -1, N))
        paths = paths.gather(1, src.unsqueeze(-1).expand(-1, -1, N + 2))
        n_src = n.gather(1, src)
        tok = top_tok.view(B, L * T).gather(1, j * T + t)
        toks.scatter_(2, n_src.clamp(max=N - 1).unsqueeze(-1), tok.unsqueeze(-1))
        paths.scatter_(2, (n_src + 1).unsqueeze(-1), j.unsqueeze(-1))
        k_new = s.size(1)
        vert = torch.where(live, j, torch.zeros_like(j))
        score = s.masked_fill(~live, NEG_INF)
        n = n_src + 1
        if k_new < K:  # fewer candidates than beams: pad with dead beams
            pad = K - k_new
            vert = torch.cat([vert, vert.new_zeros(B, pad)], 1)
            score = torch.cat([score, score.new_full((B, pad), NEG_INF)], 1)
            n = torch.cat([n, n.new_zeros(B, pad)], 1)
            toks = torch.cat([toks, toks.new_full((B, pad, N), -1)], 1)
            paths = torch.cat([paths, paths.new_full((B, pad, N + 2), -1)], 1)
    return fin_toks, fin_n, fin_joint, fin_norm, fin_path


def dag_sample_paths(links, top_lp, top_tok, lengths, samples, generator=None):
    """``samples`` random hypotheses per sentence: each next vertex drawn from the transitions, each token
    from its vertex's candidates (softmax of ``top_lp``).  -> (paths (B * s, P), path lengths (B * s,),
    tokens (B * s, P) at the path's vertices, -1 elsewhere, their log-probs (B * s, P), 0 elsewhere); rows
    sentence-major.  The end vertices hold ``pad`` / -inf here (they emit ``<s>`` / ``</s>``)."""
    B, L, T = top_lp.shape
    links = valid_links(links.float(), lengths)
    S = int(samples)
    lk = links.repeat_interleave(S, 0)  # (B * s, L, L)
    lens = lengths.repeat_interleave(S)
    rows = torch.arange(B * S, device=links.device)
    cur = torch.zeros(B * S, dtype=torch.long, device=links.device)
    done = cur.eq(lens - 1)
    steps = [cur]
    for _ in range(int(lengths.max()) - 1):
        if bool(done.all()):
            break
        probs = lk[rows, cur].exp()
        probs = torch.where(done.unsqueeze(1), torch.ones_like(probs), probs)
        nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        cur = torch.where(done, cur, nxt)
        steps.append(torch.where(done, torch.full_like(cur, -1), cur))
        done = done | cur.eq(lens - 1)
    path = torch.stack(steps, 1)
    plen = path.ge(0).sum(1)
    # tokens: one draw per (row, vertex) from the vertex's candidates
    sent = rows // S
    flat = top_lp.repeat_interleave(S, 0).gather(1, path.clamp(min=0).unsqueeze(-1).expand(-1, -1, T))
    probs = flat.softmax(-1).nan_to_num(0.0)
    probs = torch.where(probs.sum(-1, keepdim=True) > 0, probs, torch.ones_like(probs))
    pick = torch.multinomial(probs.view(-1, T), 1, generator=generator).view(B * S, -1)
    tok = top_tok[sent.unsqueeze(1), path.clamp(min=0), pick]
    tok_lp = flat.gather(2, pick.unsqueeze(-1)).squeeze(-1)
    return path, plen, tok.masked_fill(path < 0, -1), tok_lp.masked_fill(path < 0, 0.0)


class DAGenerator(NATGeneratorBase):
    #: the benchmark's decoding keys this generator reads (fairseq_nat_ext.evaluation.decoding)
    decoding_keys = ("decoder",)

    def __init__(self, models, tgt_dict, dag_decoder=None, lenpen=None, beam_size=None, sample_size=None,
                 topk=None, teacher=None, teacher_path=None, npd_rank=None, nbest=1, retain_history=False):
        if len(models) != 1:
            raise InputError(f"da_transformer decoding: one model only (--path got {len(models)})")
        super().__init__(models, tgt_dict, retain_history)
        self.dag_decoder, self.lenpen, self.beam_size = dag_decoder, lenpen, beam_size
        self.sample_size, self.topk = sample_size, topk
        self.teacher, self.teacher_path, self.npd_rank = teacher, teacher_path, npd_rank
        self.nbest = nbest
        self._check()

    @classmethod
    def from_generation_args(cls, models, tgt_dict, args):
        g = lambda name: getattr(args, name, None)  # noqa: E731
        return cls(models, tgt_dict, dag_decoder=g("dag_decoder"), lenpen=g("dag_viterbi_lenpen"),
                   beam_size=g("dag_beam_size"), sample_size=g("dag_sample_size"), topk=g("dag_topk"),
                   teacher_path=g("npd_teacher"), npd_rank=g("npd_rank"), nbest=1 if g("nbest") is None else g("nbest"),
                   retain_history=getattr(args, "retain_iter_history", False))

    def configure(self, task_cfg):
        """Options from the task config unless the generation options set them; loads the teacher for
        ``--dag-decoder sample`` with ``--npd-teacher``."""
        for attr, field in (("dag_decoder", "dag_decoder"), ("lenpen", "dag_viterbi_lenpen"),
                            ("beam_size", "dag_beam_size"), ("sample_size", "dag_sample_size"),
                            ("topk", "dag_topk"), ("teacher_path", "npd_teacher"), ("npd_rank", "npd_rank")):
            if getattr(self, attr) is None:
                setattr(self, attr, getattr(task_cfg, field, None))
        self._check()
        if self.decoder == "sample" and self.teacher_path and self.teacher is None:
            from .nat_fertility import load_teacher

            data = getattr(task_cfg, "data", None)
            self.teacher = load_teacher(self.teacher_path, data.split(":")[0] if data else None, self.tgt_dict)

    # option values with their defaults, checked
    @property
    def decoder(self):
        return self.dag_decoder or "lookahead"

    def _check(self):
        if self.decoder not in DECODERS:
            raise InputError(f"--dag-decoder must be one of {', '.join(DECODERS)}, got {self.dag_decoder!r}")
        for name, v in (("--dag-beam-size", self.beam_size), ("--dag-sample-size", self.sample_size),
                        ("--dag-topk", self.topk)):
            if v is not None and int(v) < 1:
                raise InputError(f"{name} must be >= 1, got {v}")
        if self.lenpen is not None and not float(self.lenpen) == float(self.lenpen):
            raise InputError(f"--dag-viterbi-lenpen must be a number, got {self.lenpen}")
        if not isinstance(self.nbest, int) or self.nbest < 1:
            raise InputError(f"--nbest must be an integer >= 1, got {self.nbest!r}")
        if self.npd_rank is not None and self.npd_rank not in ("total", "mean"):
            raise InputError(f"--npd-rank must be one of total, mean, got {self.npd_rank!r}")

    def _opt(self, name, default):
        v = getattr(self, name)
        return default if v is None else v

    # -- the decoder pass -----------------------------------------------------------------------------------
    def vertex_scores(self, model, feats, lengths):
        """-> (best tokens (B, L), e (B, L)): the most probable allowed token of every intermediate vertex and
        its log-prob; ``<s>`` / ``</s>`` and their log-probs at the first / last vertex; -inf and ``pad``
        beyond the graph."""
        B, L, _ = feats.shape
        rows = torch.arange(B, device=feats.device)
        last = lengths - 1
        inside = torch.arange(L, device=feats.device).unsqueeze(0) < lengths.unsqueeze(1)
        lp, tok = best_vocab_tokens(model.decoder, feats[inside], self.forbidden)
        e = torch.full((B, L), NEG_INF, device=feats.device).masked_scatter(inside, lp.float())
        best = torch.full((B, L), self.pad, dtype=torch.long, device=feats.device).masked_scatter(inside, tok)
        ends = vocab_logits(model.decoder, torch.stack([feats[:, 0], feats[rows, last]], 1))
        ends = torch.log_softmax(ends.float(), -1)
        e[:, 0] = ends[:, 0, self.bos]
        e[rows, last] = ends[:, 1, self.eos]
        best[:, 0] = self.bos
        best[rows, last] = self.eos
        return best, e

    def vertex_topk(self, model, feats, lengths, k):
        """-> (log-probs, tokens) (B, L, k) of every intermediate vertex's k most probable allowed tokens
        (-inf / ``pad`` at the ends and beyond the graph)."""
        B, L, _ = feats.shape
        inner = torch.arange(L, device=feats.device).unsqueeze(0) < (lengths - 1).unsqueeze(1)
        inner[:, 0] = False
        x = feats[inner]
        k = min(int(k), len(self.tgt_dict) - len(self.forbidden))
        lps, toks = [], []
        for a in range(0, x.size(0), RANK_CHUNK):
            lp = torch.log_softmax(vocab_logits(model.decoder, x[a:a + RANK_CHUNK]).float(), -1)
            lp[:, self.forbidden] = NEG_INF
            v, i = lp.topk(k, -1)
            lps.append(v)
            toks.append(i)
        top_lp = torch.full((B, L, k), NEG_INF, device=feats.device)
        top_tok = torch.full((B, L, k), self.pad, dtype=torch.long, device=feats.device)
        if lps:
            top_lp[inner] = torch.cat(lps)
            top_tok[inner] = torch.cat(toks)
        return top_lp, top_tok

    @torch.no_grad()
    @cpu_linear.decodes
    def generate(self, models, sample, prefix_tokens=None, constraints=None, **unused):
        if constraints is not None or prefix_tokens is not None:
            raise NotImplementedError("da_transformer decoding: prefix and constrained decoding are not supported")
        models = models or self.models
        if len(models) != 1:
            raise InputError(f"da_transformer decoding: one model only (--path got {len(models)})")
        model = models[0]
        eval_mode(models)
        net = sample["net_input"]
        enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
        graph = model.decoder.graph(enc)
        feats = model.decoder.features(enc, graph=graph)
        lengths = graph[1]
        links = model.decoder.links(feats, lengths)
        lenpen = float(self._opt("lenpen", 1.0))
        best, e = self.vertex_scores(model, feats, lengths)
        method = self.decoder
        if method in ("greedy", "lookahead", "viterbi"):
            if method == "greedy":
                path, plen = dag_greedy(links, lengths)
            elif method == "lookahead":
                path, plen = dag_lookahead(links, e, lengths)
            else:
                path, plen, _ = dag_viterbi(links, e, lengths, lenpen, max_vertices=self.max_len + 2)
            return self._finalize(path, plen, best.gather(1, path.clamp(min=0)), links, e)
        top_lp, top_tok = self.vertex_topk(model, feats, lengths, self._opt("topk", 5))
        if method == "beam":
            first, last = e[:, 0], e[torch.arange(e.size(0), device=e.device), lengths - 1]
            K = self._opt("beam_size", 5)
            toks, n, joint, norm, path = dag_beam_search(links, top_lp, top_tok, first, last, lengths, K, lenpen,
                                                         max_len=self.max_len, nbest=min(self.nbest, K))
            out = []
            for b in range(toks.size(0)):
                hyps = []
                for f in range(toks.size(1)):
                    if f > 0 and not bool(torch.isfinite(norm[b, f])):
                        break
                    m = int(n[b, f])
                    s = joint[b, f] / (m + 1)
                    hyps.append({"tokens": self._with_eos(toks[b, f, :m]), "score": s,
                                 "positional_scores": s.expand(m + 1).clone(), "alignment": None, "steps": 1,
                                 "dag_path": path[b, f, : m + 2].clone()})
                out.append(hyps)
            return out
        return self._sample(net, links, e, best, top_lp, top_tok, lengths, lenpen)

    def _sample(self, net, links, e, best, top_lp, top_tok, lengths, lenpen):
        B = lengths.numel()
        S = int(self._opt("sample_size", 8))
        path, plen = dag_lookahead(links, e, lengths)
        path, plen = path.unsqueeze(1), plen.unsqueeze(1)
        toks = best.gather(1, path[:, 0].clamp(min=0)).unsqueeze(1)
        tok_lp = e.gather(1, path[:, 0].clamp(min=0)).unsqueeze(1)
        if S > 1:
            p, pl, t, tl = dag_sample_paths(links, top_lp, top_tok, lengths, S - 1)
            rows = torch.arange(B * (S - 1), device=p.device) // (S - 1)
            ends = p.eq(0) | p.eq((lengths - 1)[rows].unsqueeze(1))
            t = torch.where(ends, best[rows].gather(1, p.clamp(min=0)), t)  # <s> / </s>
            tl = torch.where(ends, e[rows].gather(1, p.clamp(min=0)), tl)
            P = max(path.size(2), p.size(1))

            def widen(x, fill):
                return torch.cat([x, x.new_full(x.shape[:-1] + (P - x.size(-1),), fill)], -1)

            path = torch.cat([widen(path, -1), widen(p, -1).view(B, S - 1, P)], 1)
            toks = torch.cat([widen(toks, self.pad), widen(t, self.pad).view(B, S - 1, P)], 1)
            tok_lp = torch.cat([widen(tok_lp, 0.0), widen(tl, 0.0).view(B, S - 1, P)], 1)
            plen = torch.cat([plen, pl.view(B, S - 1)], 1)
        P = path.size(2)
        path, toks, tok_lp, plen = path.reshape(B * S, P), toks.reshape(B * S, P), tok_lp.reshape(B * S, P), \
            plen.reshape(-1)
        order = torch.arange(B, device=path.device).repeat_interleave(S)
        joint, pos = self._joint(path, plen, links[order], tok_lp)
        content, clen = self._content(toks, plen)
        if self.teacher is not None and S > 1:
            from .nat_fertility import teacher_scores

            w = next(self.teacher.parameters())
            if w.device != path.device:
                self.teacher.to(path.device)
            n = max(int(clen.max()), 1)
            score = teacher_scores(self.teacher, net["src_tokens"], net["src_lengths"], order,
                                   content[:, :n].masked_fill(content[:, :n] < 0, self.pad), clen, self.pad,
                                   self.eos, rank=self.npd_rank or "total")
        else:
            score = joint / (clen + 2).float().pow(lenpen)
        # the nbest best candidates of each sentence, best first (stable: the lookahead output wins a tie)
        ranked = score.view(B, S).sort(dim=1, descending=True, stable=True)[1][:, : min(self.nbest, S)]
        out = []
        for b in range(B):
            hyps = []
            for r in (ranked[b] + b * S).tolist():
                hyp = self._hypothesis(content[r], clen[r], plen[r], pos[r], path[r])
                hyp["dag_sample_scores"] = score[b * S:(b + 1) * S].clone()
                hyps.append(hyp)
            out.append(hyps)
        return out

    # -- hypotheses -----------------------------------------------------------------------------------------
    def _joint(self, path, plen, links, tokens_lp):
        """path (N, P) vertices (-1 after the end), plen (N,), links (N, L, L), tokens_lp (N, P) the log-prob of
        the token at each path vertex -> (log P(A, Y | X) (N,), positional scores (N, P - 1): entry i = the
        transition into the path's vertex i + 1 plus its token's log-prob (content tokens, then ``</s>``, which
        also carries ``<s>``'s log-prob), 0 after the end)."""
        N, P = path.shape
        rows = torch.arange(N, device=path.device).unsqueeze(1)
        v = path.clamp(min=0)
        step = (links[rows, v[:, :-1], v[:, 1:]] + tokens_lp[:, 1:]).masked_fill(path[:, 1:] < 0, 0.0)
        end = (plen - 2).clamp(min=0).unsqueeze(1)
        pos = step.scatter_add(1, end, tokens_lp[:, :1])
        return pos.sum(1), pos

    def _content(self, toks, plen):
        """Tokens at the path's vertices -> (content (N, P) without ``<s>`` / ``</s>``, -1 padded, cut to
        max_len; lengths (N,))."""
        content = toks[:, 1:].clone()
        n = (plen - 2).clamp(min=0)
        ar = torch.arange(content.size(1), device=toks.device).unsqueeze(0)
        content = content.masked_fill(ar >= n.unsqueeze(1), -1)
        return content, n.clamp(max=self.max_len)

    def _finalize(self, path, plen, tokens, links, e):
        """Best-token paths (tokens = each vertex's best token, whose log-prob is e) -> fairseq hypotheses."""
        _, pos = self._joint(path, plen, links, e.gather(1, path.clamp(min=0)))
        content, clen = self._content(tokens, plen)
        return [[self._hypothesis(content[b], clen[b], plen[b], pos[b], path[b])] for b in range(path.size(0))]

    def _hypothesis(self, content, clen, plen, pos, path):
        m, full = int(clen), int(plen) - 2
        ps = pos[: full + 1]
        if full > m:  # cut at max_len: the scores of the cut tokens go to </s>
            ps = torch.cat([ps[:m], ps[m:].sum(0, keepdim=True)])
        return {"tokens": self._with_eos(content[:m]), "score": ps.sum() / ps.numel(), "positional_scores": ps,
                "alignment": None, "steps": 1, "dag_path": path[: int(plen)].clone()}

    def _with_eos(self, toks):
        return torch.cat([toks, toks.new_full((1,), self.eos)])
