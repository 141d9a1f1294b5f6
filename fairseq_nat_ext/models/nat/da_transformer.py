"""Directed Acyclic Transformer (DA-Transformer, Huang et al., ICML 2022), arch ``da_transformer``
(+ ``da_transformer_small``, ``da_transformer_tiny``).

Encoder: fairseq's Transformer encoder (with the attention registry), as ``ctc_nat``.  Graph: the decoder
has L = lambda * n vertices, n the source length counted as ``ctc_nat`` counts it (real tokens, ``</s>``
included), lambda = ``--dag-upsample-ratio`` (the paper's default 8; at least 2 vertices).  Decoder input:
the uniform copy of the source token embeddings (vertex t of a graph of L vertices reads source token
round(t (n - 1) / (L - 1)), fairseq's ``_uniform_assignment``; the scaled embeddings the encoder reads,
before its positions; ``ctc_nat``'s linear upsampling is not used) plus the decoder's position embedding.
Decoder: Transformer layers without the causal mask, attending to the encoder.  Every vertex v_i predicts a
token distribution (the vocabulary projection) and a transition distribution over the later vertices by
link attention: with V_i = [h_i ; p_i] (its final state and a learned link position embedding, the paper's
"feature:position"), Q = V W_Q, K = V W_K, E[i, j] = softmax_{i < j < L}(Q_i K_j^T / sqrt(d)).  Vertex 0
emits ``<s>`` and vertex L - 1 ``</s>`` of the target (criterion ``dag_loss``); decoding:
``generators/da_transformer.py``.

Simplifications (see the docs draft): one link-attention head (the paper's; the reference code's later
multi-head gated links are not used), no ``--max-transition-length``, no length predictor (the graph size
always comes from the source length, the paper's setting).  ``--glat-ratio-start`` of ``dag_loss``:
glancing over the best path (:meth:`DATransformerModel.glance`).

Initialisable from an autoregressive Transformer (``fairseq_nat_ext.init_from_at``): encoder, decoder layers
and embeddings are copied; the link attention (``decoder.link_query``, ``decoder.link_key``,
``decoder.link_positions``) starts fresh.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.models import register_model, register_model_architecture
from fairseq.models.nat import FairseqNATDecoder

from ...compat import InputError
from ...modules import nat_decoder_inference as fast
from ...modules.vocab_projection import vocab_logits
from ...tasks.nat_translation import MASK_SYMBOL
from .base import SMALL, TINY, PluginNATModel, arch_defaults, nat_base_architecture
from .ctc_nat import front_align
from .glancing import glancing_reveal

NEG_INF = float("-inf")


def uniform_copy_index(src_lengths, graph_lengths, L):
    """(B,) source and graph lengths -> long (B, L): the source position vertex t copies,
    round(t (n - 1) / (L_b - 1)); 0 beyond a row's graph."""
    t = torch.arange(L, device=src_lengths.device, dtype=torch.float).unsqueeze(0)
    step = (src_lengths - 1).float() / (graph_lengths - 1).clamp(min=1).float()
    idx = torch.round(t * step.unsqueeze(1)).long()
    idx = torch.minimum(idx, (src_lengths - 1).clamp(min=0).unsqueeze(1))
    return idx.masked_fill(t >= graph_lengths.unsqueeze(1).float(), 0)


def link_log_probs(scores, graph_lengths):
    """Raw link scores (B, L, L) -> log E (B, L, L) float32: log-softmax over i < j < L_b, -inf elsewhere
    (rows without a later vertex -- the last vertex, padding -- are all -inf)."""
    B, L, _ = scores.shape
    ar = torch.arange(L, device=scores.device)
    valid = (ar.view(1, 1, L) > ar.view(1, L, 1)) & (ar.view(1, 1, L) < graph_lengths.view(B, 1, 1))
    has = valid.any(-1, keepdim=True)
    scores = scores.float().masked_fill(~valid, NEG_INF).masked_fill(~has, 0.0)
    return F.log_softmax(scores, -1).masked_fill(~valid, NEG_INF)


class DAGDecoder(FairseqNATDecoder):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        name = getattr(args, "arch", "da_transformer")
        self.mask_idx = dictionary.index(MASK_SYMBOL)
        if self.mask_idx == dictionary.unk():
            raise InputError(f"{name}: the target dictionary has no {MASK_SYMBOL}; use --task nat_translation")
        ratio = getattr(args, "dag_upsample_ratio", None)
        if ratio is None or int(ratio) != ratio or ratio < 1:
            raise InputError(f"{name}: --dag-upsample-ratio must be an integer >= 1, got {ratio}")
        if args.encoder_embed_dim != args.decoder_embed_dim:
            raise InputError(f"{name}: the decoder copies source embeddings: --encoder-embed-dim "
                             f"({args.encoder_embed_dim}) must equal --decoder-embed-dim ({args.decoder_embed_dim})")
        self.upsample_ratio = int(ratio)
        d = self.output_embed_dim
        self.link_positions = nn.Embedding(self.max_target_positions, d)
        nn.init.normal_(self.link_positions.weight, mean=0.0, std=d ** -0.5)
        self.link_query = nn.Linear(2 * d, d)
        self.link_key = nn.Linear(2 * d, d)

    def graph(self, encoder_out):
        """-> (decoder input before positions (B, L, C): the uniformly copied source embeddings,
        graph lengths (B,) = ratio * source lengths, at least 2)."""
        emb = encoder_out["encoder_embedding"][0]  # (B, n, C), scaled token embeddings
        pad = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        emb, src_lengths = front_align(emb, pad)
        lengths = (src_lengths * self.upsample_ratio).clamp(min=2)
        L = int(lengths.max())
        if L > self.max_positions():
            raise InputError(f"da_transformer: a graph of {L} vertices (--dag-upsample-ratio {self.upsample_ratio} "
                             f"x the source length) exceeds the decoder's {self.max_positions()} positions "
                             "(--max-target-positions)")
        idx = uniform_copy_index(src_lengths, lengths, L)
        return emb.gather(1, idx.unsqueeze(-1).expand(-1, -1, emb.size(-1))), lengths

    def graph_padding(self, lengths, L):
        return torch.arange(L, device=lengths.device).unsqueeze(0) >= lengths.unsqueeze(1)

    def features(self, encoder_out, graph=None, glanced=None, cross=None):
        """The vertices' final states (B, L, C).  ``graph``: :meth:`graph`'s result when the caller has it;
        ``glanced`` (B, L) long: target tokens whose embeddings replace the copied input at the revealed
        vertices (``pad`` elsewhere; glancing).  In eval mode without autograd the layers run through
        modules/nat_decoder_inference.py (the same maths)."""
        states, lengths = graph if graph is not None else self.graph(encoder_out)
        B, L, _ = states.shape
        pad_mask = self.graph_padding(lengths, L)
        x = states
        if glanced is not None:
            reveal = glanced.ne(self.padding_idx)
            x = torch.where(reveal.unsqueeze(-1), self.embed_scale * self.embed_tokens(glanced), x)
        if self.embed_positions is not None:
            dummy = pad_mask.long() * self.padding_idx + (~pad_mask).long() * self.dictionary.unk()
            x = x + self.embed_positions(dummy)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        self_pad = pad_mask if bool(pad_mask.any()) else None
        if not self.training and not torch.is_grad_enabled() and fast.supported(self):
            cross = cross if cross is not None else fast.cross_kv(self, encoder_out, checked=True)
            return fast.decoder_features(self, x, self_pad, cross)
        x = self.dropout_module(x).transpose(0, 1)  # (L, B, C)
        enc = encoder_out["encoder_out"][0]
        enc_pad = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        for layer in self.layers:
            x, _, _ = layer(x, enc, enc_pad, None, self_attn_mask=None, self_attn_padding_mask=self_pad)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x

    def links(self, feats, lengths):
        """Link attention: states (B, L, C), graph lengths (B,) -> log transition probabilities (B, L, L)
        float32 (:func:`link_log_probs`)."""
        B, L, d = feats.shape
        pos = self.link_positions.weight[:L].to(feats.dtype).unsqueeze(0).expand(B, L, d)
        v = torch.cat([feats, pos], -1)
        q, k = self.link_query(v).float(), self.link_key(v).float()
        return link_log_probs(torch.bmm(q, k.transpose(1, 2)) / math.sqrt(d), lengths)

    def forward(self, encoder_out, graph=None, glanced=None, normalize=False, **unused):
        """-> (token logits (B, L, V) (log-probs with ``normalize``), log transitions (B, L, L),
        graph lengths (B,))."""
        graph = graph if graph is not None else self.graph(encoder_out)
        x = self.features(encoder_out, graph=graph, glanced=glanced)
        out = vocab_logits(self, x)
        out = F.log_softmax(out.float(), -1) if normalize else out
        return out, self.links(x, graph[1]), graph[1]


@register_model("da_transformer")
class DATransformerModel(PluginNATModel):
    decoder_class = DAGDecoder

    @property
    def generator_class(self):
        from ...generators.da_transformer import DAGenerator

        return DAGenerator

    @property
    def upsample_ratio(self):
        return self.decoder.upsample_ratio

    @property
    def allow_length_beam(self):
        return False

    @staticmethod
    def add_args(parser):
        PluginNATModel.add_args(parser)
        parser.add_argument("--dag-upsample-ratio", type=int,
                            help="graph vertices per source token (</s> included), default 8")

    def max_positions(self):
        """A source of n tokens needs ratio * n decoder positions."""
        return min(self.encoder.source_limit()[0], self.decoder.max_positions() // self.upsample_ratio), \
            self.target_limit()[0]

    def length_limits(self):
        enc_n, why = self.encoder.source_limit()
        n = self.decoder.max_positions() // self.upsample_ratio
        if n < enc_n:
            why = (f"--max-target-positions {self.decoder.max_positions()} / --dag-upsample-ratio "
                   f"{self.upsample_ratio} graph vertices")
        return {"source": why, "target": self.target_limit()[1]}

    def inject_noise(self, target):
        """The DAG reads no target-side input (glancing reveals target tokens inside :meth:`forward`)."""
        return target

    def dag_targets(self, tgt_tokens):
        """Dataset target (B, T): content ``</s>`` right-padded -> (``<s>`` content ``</s>`` (B, T + 1),
        lengths M (B,))."""
        tgt = torch.cat([tgt_tokens.new_full((tgt_tokens.size(0), 1), self.bos), tgt_tokens], 1)
        return tgt, tgt.ne(self.pad).sum(1)

    @torch.no_grad()
    def glance(self, encoder_out, graph, targets, target_lengths, ratio):
        """GLAT over the DAG: first pass without gradient, best path emitting the target (Viterbi), d = its
        argmax tokens' Hamming distance to the target (``<s>`` / ``</s>`` vertices included, as the reference
        code counts them); reveal round(ratio * d) wrong vertices of the path (random among the wrong ones).
        -> (glanced (B, L) target tokens at the revealed vertices, ``pad`` elsewhere; number revealed)."""
        from ...criterions.dag_loss import dag_best_alignment

        lprobs, links, lengths = self.decoder(encoder_out, graph=graph, normalize=True)
        B, L, _ = lprobs.shape
        M = targets.size(1)
        match = lprobs.gather(-1, targets.unsqueeze(1).expand(-1, L, -1)).transpose(1, 2)
        path, _ = dag_best_alignment(match, links, lengths, target_lengths)
        on = path >= 0  # -1 beyond the target and on pairs without a path
        pred = lprobs.argmax(-1).gather(1, path.clamp(min=0))  # (B, M)
        reveal = glancing_reveal(on & pred.ne(targets), ratio)
        glanced = targets.new_full((B, L), self.pad)
        rows, ks = reveal.nonzero(as_tuple=True)
        glanced[rows, path[rows, ks]] = targets[rows, ks]
        return glanced, int(reveal.sum())

    def forward(self, src_tokens, src_lengths, prev_output_tokens, tgt_tokens, glat_ratio=None, **kwargs):
        targets, tgt_lengths = self.dag_targets(tgt_tokens)
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths)
        graph = self.decoder.graph(encoder_out)
        glanced, revealed = None, None
        if glat_ratio:
            glanced, revealed = self.glance(encoder_out, graph, targets, tgt_lengths, float(glat_ratio))
        lprobs, links, lengths = self.decoder(encoder_out, graph=graph, glanced=glanced, normalize=True)
        part = {"dag_lprobs": lprobs, "links": links, "graph_lengths": lengths, "targets": targets,
                "target_lengths": tgt_lengths, "factor": 1.0}
        if revealed is not None:
            part["glat_revealed"] = revealed
        return {"dag": part}


@register_model_architecture("da_transformer", "da_transformer")
def da_transformer_base(args):
    """The base size: 6+6 layers, d=512, 8 heads; 8 vertices per source token; 1024 decoder positions
    (sources up to 128 tokens at ratio 8)."""
    nat_base_architecture(
        args,
        dropout=0.1, share_all_embeddings=True, dag_upsample_ratio=8, apply_bert_init=False,
        max_source_positions=256, max_target_positions=1024,
    )


@register_model_architecture("da_transformer", "da_transformer_small")
def da_transformer_small(args):
    """Multi30K size, the same as the shared teacher: 3+3 layers, d=256, 4 heads, FFN 1024."""
    arch_defaults(args, **SMALL)
    da_transformer_base(args)


@register_model_architecture("da_transformer", "da_transformer_tiny")
def da_transformer_tiny(args):
    """For tests: 2+2 layers, d=128 (128 decoder positions: sources up to 16 tokens at ratio 8)."""
    arch_defaults(args, **TINY)
    da_transformer_base(args)
