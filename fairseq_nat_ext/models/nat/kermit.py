"""KERMIT (Chan et al. 2019), arch ``kermit`` (+ ``kermit_small``, ``kermit_tiny``); task ``kermit``.

One non-causal Transformer stack reads the concatenated canvas ``<s> x </s> y </s>``; a segment
embedding (0 up to and including the separating ``</s>``, 1 after it) is added to the token
embeddings, positions run over the whole canvas.  Slot k (between canvas tokens k and k+1) is the
linear map of its two neighbours' states, and the output layer (tied to the embeddings) gives a
distribution over the vocabulary in which ``</s>`` means "nothing more to insert here".  Slots
before the separator insert into x, the others into y.

Training (raw, not distilled, parallel data): every sentence pair draws one of five modes,
``--kermit-modes joint:1,x2y:1,y2x:1,x:1,y:1`` (weights): p(x, y) (both sides are random
subsequences, both generated), p(y | x) (x given whole, y generated), p(x | y), p(x) (y absent) and
p(y) (x absent).  A generated side keeps a uniformly drawn number of its tokens (a random subset, in
order, as in the Insertion Transformer); the insertion oracle (``oracles/insertion.py``,
balanced-binary-tree weights with ``--insertion-tau``, 0 = uniform) gives every slot of a generated
side its loss; slots of given or absent sides have none.

Decoding (``generators/kermit.py``): translation in either direction from one checkpoint (the side
named by ``--source-lang`` is given), unconditional generation, and cloze infilling.

Multilingual (``--lang-pairs en-de,en-fr,de-fr`` of task ``kermit``): one checkpoint over every pair;
each canvas is one pair ``<s> a </s> b </s>`` (a before b as in ``--lang-pairs``), and a language
embedding (``--kermit-langs``, one vector per language) is added to every position of a segment
beside the segment embedding.  The five modes then cover both directions of every pair, and the
marginals of every language.  A canvas holds two languages: three languages are generated as a
joint pair followed by a conditional (``generators/kermit.py``).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.models import BaseFairseqModel, register_model, register_model_architecture
from fairseq.models.transformer import base_architecture as transformer_base_architecture
from fairseq.models.transformer import Embedding

from ...compat import InputError
from ...modules.attention import add_attention_args
from ...modules.efficient_encoder import EfficientTransformerEncoder
from ...oracles.insertion import insertion_oracle
from .base import SMALL, TINY, arch_defaults, bert_init
from .edit_ops import delete_tokens
from .insertion import span_tau

MODES = ("joint", "x2y", "y2x", "x", "y")
#: (x generated, y generated, x present, y present) per mode
_MODE_SIDES = {"joint": (1, 1, 1, 1), "x2y": (0, 1, 1, 1), "y2x": (1, 0, 1, 1), "x": (1, 0, 1, 0),
               "y": (0, 1, 0, 1)}


def parse_modes(spec):
    """``"joint:1,x2y:2"`` -> {mode: weight}; a one-line error names the option."""
    weights = {}
    for item in filter(None, (s.strip() for s in str(spec).split(","))):
        name, _, w = item.partition(":")
        if name not in MODES:
            raise InputError(f"--kermit-modes: unknown mode '{name}' (choose from {', '.join(MODES)})")
        try:
            weights[name] = float(w) if w else 1.0
        except ValueError:
            raise InputError(f"--kermit-modes: weight of '{name}' must be a number, got '{w}'") from None
        if weights[name] < 0:
            raise InputError(f"--kermit-modes: weight of '{name}' must be >= 0")
    if not weights or sum(weights.values()) <= 0:
        raise InputError(f"--kermit-modes: no mode with a positive weight in '{spec}'")
    return weights


def parse_langs(spec):
    """``"en,de,fr"`` -> ["en", "de", "fr"] (empty/None -> []); one-line error for a repeated name."""
    langs = [s.strip() for s in str(spec or "").split(",") if s.strip()]
    if len(set(langs)) != len(langs):
        raise InputError(f"--kermit-langs: a language is repeated in '{spec}'")
    return langs


def parse_lang_pairs(spec):
    """``"en-de,en-fr"`` -> [("en", "de"), ("en", "fr")]; one-line errors name the option."""
    pairs = []
    for item in filter(None, (s.strip() for s in str(spec or "").split(","))):
        a, sep, b = item.partition("-")
        if not sep or not a or not b or "-" in b or a == b:
            raise InputError(f"--lang-pairs: '{item}' is not a pair of two languages like en-de")
        if (a, b) in pairs or (b, a) in pairs:
            raise InputError(f"--lang-pairs: the pair {item} is given twice")
        pairs.append((a, b))
    return pairs


def pair_languages(pairs):
    """The languages of ``pairs`` in order of first appearance."""
    return list(dict.fromkeys(lang for pair in pairs for lang in pair))


def pair_canvas(x, y, pad, bos):
    """x (B, Sx), y (B, Sy): right-padded ``content </s>`` (an absent side is just ``</s>``) ->
    (tokens (B, T) ``<s> x </s> y </s>`` right-padded, seg (B, T) 0/1, sep (B,) index of the middle
    ``</s>``)."""
    B = x.size(0)
    lx, ly = x.ne(pad).sum(1), y.ne(pad).sum(1)
    width = int((1 + lx + ly).max())
    out = x.new_full((B, width), pad)
    out[:, 0] = bos
    rows = torch.arange(B, device=x.device).unsqueeze(1)
    px = 1 + torch.arange(x.size(1), device=x.device).unsqueeze(0).expand(B, -1)
    py = (1 + lx).unsqueeze(1) + torch.arange(y.size(1), device=x.device).unsqueeze(0)
    out[rows.expand_as(px)[x.ne(pad)], px[x.ne(pad)]] = x[x.ne(pad)]
    out[rows.expand_as(py)[y.ne(pad)], py[y.ne(pad)]] = y[y.ne(pad)]
    sep = lx  # <s> + content of x, then its </s>
    seg = (torch.arange(width, device=x.device).unsqueeze(0) > sep.unsqueeze(1)).long()
    return out, seg, sep


def absent_like(x, pad, eos):
    """The row ``</s> <pad> ...`` of an absent side, shaped like x."""
    out = torch.full_like(x, pad)
    out[:, 0] = eos
    return out


def first_eos(tokens, eos):
    """(B,) index of the first ``</s>`` of every row (the separator of ``<s> x </s> y </s>``)."""
    return tokens.eq(eos).long().argmax(1)


def segments_of(tokens, eos, pad):
    """Segment ids of canvases ``<s> x </s> y </s>``: 0 up to the separator, 1 after it."""
    after = torch.arange(tokens.size(1), device=tokens.device).unsqueeze(0) > first_eos(tokens, eos).unsqueeze(1)
    return after.long().masked_fill(tokens.eq(pad), 0)


@register_model("kermit")
class KermitModel(BaseFairseqModel):
    def __init__(self, args, stack, dictionary):
        super().__init__()
        self.args = args
        self.stack = stack
        self.dictionary = dictionary
        d = args.encoder_embed_dim
        self.segment_embed = nn.Embedding(2, d)
        nn.init.normal_(self.segment_embed.weight, mean=0, std=d ** -0.5)
        self.slot_proj = nn.Linear(2 * d, d)
        self.pad, self.bos, self.eos, self.unk = dictionary.pad(), dictionary.bos(), dictionary.eos(), dictionary.unk()
        from ...tasks.nat_translation import MASK_SYMBOL

        self.mask_idx = dictionary.index(MASK_SYMBOL)
        self.modes = parse_modes(args.kermit_modes)
        self.langs = parse_langs(getattr(args, "kermit_langs", None))
        if self.langs:
            self.lang_embed = nn.Embedding(len(self.langs), d)
            nn.init.normal_(self.lang_embed.weight, mean=0, std=d ** -0.5)

    def lang_ids(self, x_lang, y_lang):
        """Language names of the two segments -> their ids in ``--kermit-langs`` (one-line error)."""
        out = []
        for name in (x_lang, y_lang):
            if name not in self.langs:
                raise InputError(f"kermit: language '{name}' is not one of the model's --kermit-langs "
                                 f"{','.join(self.langs)}")
            out.append(self.langs.index(name))
        return tuple(out)

    @staticmethod
    def add_args(parser):
        parser.add_argument("--encoder-layers", type=int, metavar="N", help="layers of the single stack")
        parser.add_argument("--encoder-embed-dim", type=int, metavar="N")
        parser.add_argument("--encoder-ffn-embed-dim", type=int, metavar="N")
        parser.add_argument("--encoder-attention-heads", type=int, metavar="N")
        parser.add_argument("--encoder-normalize-before", action="store_true")
        parser.add_argument("--encoder-learned-pos", action="store_true")
        parser.add_argument("--dropout", type=float, metavar="D")
        parser.add_argument("--attention-dropout", type=float, metavar="D")
        parser.add_argument("--activation-dropout", type=float, metavar="D")
        parser.add_argument("--max-source-positions", type=int, metavar="N",
                            help="longest canvas <s> x </s> y </s>")
        parser.add_argument("--apply-bert-init", action="store_true")
        parser.add_argument("--kermit-modes", type=str,
                            help="training modes and weights, e.g. joint:1,x2y:1,y2x:1,x:1,y:1")
        parser.add_argument("--insertion-loss", choices=["binary_tree", "uniform"],
                            help="span weights of the slot loss (as the Insertion Transformer's)")
        parser.add_argument("--insertion-tau", type=float,
                            help="balanced-binary-tree temperature (0 also means uniform)")
        parser.add_argument("--kermit-x-lang", type=str,
                            help="language of segment x (default: --source-lang at training)")
        parser.add_argument("--kermit-lang-pairs", type=str,
                            help="multilingual: the training --lang-pairs (set by the task; decoding reads the "
                                 "direction's segment order from it)")
        parser.add_argument("--kermit-langs", type=str,
                            help="multilingual: the languages of the language embedding, comma-separated "
                                 "(default: those of the task's --lang-pairs; none for a bilingual model)")
        add_attention_args(parser)

    @classmethod
    def build_model(cls, args, task):
        kermit_base(args)
        d = task.source_dictionary
        if task.target_dictionary is not None and len(task.target_dictionary) != len(d):
            raise InputError("kermit: needs one joined dictionary (fairseq-preprocess --joined-dictionary)")
        if getattr(task, "multi", False):  # training over every pair: the model keeps its pairs and languages
            args.kermit_lang_pairs = task.cfg.lang_pairs
            if not getattr(args, "kermit_langs", None):
                args.kermit_langs = ",".join(task.langs)
            if not set(task.langs) <= set(parse_langs(args.kermit_langs)):
                raise InputError(f"kermit: --kermit-langs {args.kermit_langs} lacks a language of --lang-pairs "
                                 f"({','.join(task.langs)})")
        elif not getattr(args, "kermit_x_lang", None) and not getattr(args, "kermit_langs", None):
            args.kermit_x_lang = task.cfg.source_lang  # bilingual: x is the training source language
        embed = Embedding(len(d), args.encoder_embed_dim, d.pad())
        stack = bert_init(args, EfficientTransformerEncoder(args, d, embed))
        return cls(args, stack, d)

    def max_positions(self):
        half = (self.stack.max_positions() - 1) // 2  # x and y share the canvas <s> x </s> y </s>
        return (half, half)

    def max_canvas(self):
        return self.stack.max_positions()

    def output_layer(self, h):
        return F.linear(h, self.stack.embed_tokens.weight)

    def forward_slots(self, tokens, seg=None, normalize=False, langs=None):
        """tokens (B, T) canvases -> (B, T-1, V) slot logits (``</s>`` = end of slot)."""
        logits = self.output_layer(self.slot_states(tokens, seg, langs))
        return F.log_softmax(logits.float(), -1) if normalize else logits

    def slot_log_probs(self, tokens, which, langs=None):
        """Log-probabilities (M, V) of the slots ``which`` (B, T-1) bool only, in row-major order: the
        decoder asks for the open slots, the vocabulary projection skips the others."""
        return F.log_softmax(self.output_layer(self.slot_states(tokens, langs=langs)[which]).float(), -1)

    def slot_states(self, tokens, seg=None, langs=None):
        """tokens (B, T) canvases -> (B, T-1, D) slot representations (before the output layer).

        ``langs``: a multilingual model's segment languages, ``(x_id, y_id)`` for the whole batch or
        two (B,) tensors; required when the model has ``--kermit-langs``."""
        if seg is None:
            seg = segments_of(tokens, self.eos, self.pad)
        if tokens.size(1) > self.max_canvas():
            raise InputError(f"kermit: canvas of {tokens.size(1)} tokens exceeds --max-source-positions "
                             f"{self.max_canvas()} (x and y together)")
        emb = self.stack.embed_tokens(tokens) + self.segment_embed(seg)
        if self.langs:
            if langs is None:
                raise InputError("kermit: a multilingual model (--kermit-langs) needs the languages of the "
                                 "two segments (task kermit with --lang-pairs, or -s/-t)")
            x_id, y_id = (torch.as_tensor(v, device=tokens.device).long().reshape(-1, 1) for v in langs)
            emb = emb + self.lang_embed(torch.where(seg.bool(), y_id, x_id))
        out = self.stack(tokens, src_lengths=tokens.ne(self.pad).sum(1), token_embeddings=emb)
        h = out["encoder_out"][0].transpose(0, 1)  # (B, T, D)
        return self.slot_proj(torch.cat([h[:, :-1], h[:, 1:]], -1))

    # ----- training --------------------------------------------------------------------------
    def sample_modes(self, n, device):
        names = list(self.modes)
        w = torch.tensor([self.modes[k] for k in names], dtype=torch.float, device=device)
        idx = torch.multinomial(w, n, replacement=True)
        sides = torch.tensor([_MODE_SIDES[k] for k in names], dtype=torch.bool, device=device)[idx]
        return sides.unbind(1)  # x_gen, y_gen, x_present, y_present: (B,) each

    def training_canvases(self, x, y, modes=None):
        """Build (full canvas ``<s> x </s> y </s>``, kept mask, x generated (B,), y generated (B,)).

        x, y: dataset rows ``content </s>``.  ``modes``: optional (x_gen, y_gen, x_present, y_present)."""
        pad, bos, eos = self.pad, self.bos, self.eos
        x_gen, y_gen, x_on, y_on = modes if modes is not None else self.sample_modes(x.size(0), x.device)
        x = torch.where(x_on.unsqueeze(1), x, absent_like(x, pad, eos))  # an absent side is just </s>
        y = torch.where(y_on.unsqueeze(1), y, absent_like(y, pad, eos))
        full, seg, sep = pair_canvas(x, y, pad, bos)
        content = full.ne(pad) & full.ne(bos) & full.ne(eos)
        gen_side = torch.where(seg.bool(), y_gen.unsqueeze(1), x_gen.unsqueeze(1)) & content
        # every generated side keeps a uniform number (0..n) of its tokens, a random subset in order
        score = torch.rand(full.shape, device=full.device).masked_fill(~gen_side, 2.0)
        n_x = (gen_side & ~seg.bool()).sum(1)
        n_y = (gen_side & seg.bool()).sum(1)
        keep_x = (torch.rand(n_x.shape, device=full.device) * (n_x + 1).float()).floor().long()
        keep_y = (torch.rand(n_y.shape, device=full.device) * (n_y + 1).float()).floor().long()
        # rank of each generated token inside its own side (random order)
        rank_x = score.masked_fill(seg.bool(), 2.0).argsort(1).argsort(1)
        rank_y = score.masked_fill(~seg.bool(), 2.0).argsort(1).argsort(1)
        kept_gen = torch.where(seg.bool(), rank_y < keep_y.unsqueeze(1), rank_x < keep_x.unsqueeze(1))
        keep = full.ne(pad) & (~gen_side | kept_gen)
        return full, keep, x_gen, y_gen

    def forward(self, src_tokens, src_lengths, tgt_tokens, modes=None, src_lang=None, tgt_lang=None, **unused):
        langs = None if src_lang is None else (src_lang, tgt_lang)
        if self.langs and langs is None:
            raise InputError("kermit: a multilingual model (--kermit-langs) trains on task kermit with "
                             "--lang-pairs (its batches carry the languages)")
        loss = self.insertion_loss(*self.training_canvases(src_tokens, tgt_tokens, modes), langs=langs)
        return {"kermit": {"loss": loss, "nll_loss": loss.detach(), "factor": 1.0}}

    def insertion_loss(self, full, keep, x_gen, y_gen, langs=None):
        """Mean over the trained slots (slots of generated sides) of the insertion loss of the canvas
        ``full[keep]``: oracle-weighted span cross-entropy, or -log p(end of slot) for a complete slot.
        The vocabulary distribution is computed for the trained slots only (a given or absent side's
        slots have no loss: about half the slots of a translation mode)."""
        canvas = delete_tokens(full, ~keep, self.pad, self.bos, self.eos)
        o = insertion_oracle(full, keep, self.pad, tau=span_tau(self.args))
        states = self.slot_states(canvas, langs=langs)  # (B, S, D)
        B, S = states.shape[:2]
        dev = states.device
        valid = torch.arange(S, device=dev).unsqueeze(0) < (canvas.ne(self.pad).sum(1) - 1).unsqueeze(1)
        # slot k (after canvas token k) inserts into x when it lies before the separator, else into y
        slot_y = torch.arange(S, device=dev).unsqueeze(0) >= first_eos(canvas, self.eos).unsqueeze(1)
        trained = valid & torch.where(slot_y, y_gen.unsqueeze(1), x_gen.unsqueeze(1))
        lp = F.log_softmax(self.output_layer(states[trained]).float(), -1)  # (M, V), M trained slots
        row = trained.flatten().long().cumsum(0).view(B, S) - 1  # row of lp of every trained slot
        slot = (o.slot - 1).clamp(0, S - 1)  # oracle slot s = canvas slot s-1 (after canvas token s-1)
        use = o.missing & trained.gather(1, slot)
        per_pos = lp[row.gather(1, slot).clamp_min(0), full] if lp.size(0) else torch.zeros_like(o.weight)
        span_loss = -(o.weight * per_pos).masked_fill(~use, 0.0)
        slot_loss = torch.zeros(B, S, device=dev).scatter_add(1, slot, span_loss)
        end = torch.zeros(B, S, device=dev).masked_scatter(trained, -lp[:, self.eos])
        slot_loss = slot_loss + torch.where(o.slot_done[:, 1:S + 1] & trained, end, torch.zeros_like(end))
        n = trained.sum().clamp_min(1)
        return (slot_loss.masked_fill(~trained, 0.0).sum() + 0.0 * states.sum()) / n


@register_model_architecture("kermit", "kermit")
def kermit_base(args):
    arch_defaults(args, kermit_modes="joint:1,x2y:1,y2x:1,x:1,y:1", insertion_loss="binary_tree", insertion_tau=1.0, dropout=0.3,
                  apply_bert_init=True, max_source_positions=256, kermit_x_lang=None, kermit_langs=None,
                  kermit_lang_pairs=None)
    transformer_base_architecture(args)


@register_model_architecture("kermit", "kermit_small")
def kermit_small(args):
    arch_defaults(args, **{k: v for k, v in SMALL.items() if k.startswith("encoder")})
    arch_defaults(args, encoder_layers=6)
    kermit_base(args)


@register_model_architecture("kermit", "kermit_tiny")
def kermit_tiny(args):
    arch_defaults(args, **{k: v for k, v in TINY.items() if not k.startswith("decoder")})
    kermit_base(args)
