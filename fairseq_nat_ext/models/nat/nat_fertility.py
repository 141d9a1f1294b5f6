"""Non-autoregressive Transformer with fertility (Gu et al., 2018), arch ``nat_fertility`` (+ ``_small``,
``_tiny``); criterion ``nat_fertility_loss``, generator ``generators/nat_fertility.py``.

* Encoder: fairseq's Transformer encoder (with the attention registry).  On top of it a fertility
  classifier (Linear -> ReLU -> Linear) predicts, for every source token, a fertility 0..F
  (``--max-fertility`` F).  ``</s>`` and padding always get fertility 0.
* Decoder input: the source token embeddings (the encoder's scaled lookup) copied by fertility --
  source token i appears f_i times, in source order -- so the output length is the sum of the
  fertilities (:func:`copy_by_fertility`).  Training copies by the reference fertilities
  (``sample["fertility"]``, from ``--fertility-path``); decoding by predicted ones.
* Decoder layers (:class:`FertilityDecoderLayer`): self-attention without the causal mask in which no
  query attends to its own position; then positional attention (queries and keys are the position
  embeddings, values the hidden states); then encoder attention and the feed-forward block.  Layer
  parameter names are fairseq's (plus ``pos_attn*``), so ``init_from_at`` copies an AT decoder.
* Loss: token cross-entropy on the copied positions plus the fertility classifier's cross-entropy
  (targets above F are clamped to F for the classifier; the copy uses the real values).
* ``--fertility-reinforce`` (fine-tuning, after the main training): also a REINFORCE loss on the
  fertility classifier, -mean_{k,b} (r_kb - baseline_b) log p_F(f_kb | x_b) (:func:`reinforce_objective`).
  k = ``--fertility-reinforce-samples`` fertility sequences per sentence are sampled from the
  classifier and decoded in one pass (no gradient); ``--fertility-reinforce-reward`` says what
  rewards them:

  - ``teacher`` (Gu et al. 2018's fine-tuning signal; needs ``--fertility-teacher AT.pt``, a fairseq
    autoregressive checkpoint sharing the target dictionary): r = the teacher's total
    log-probability log p_AR(y^ | x) of the translation y^ decoded (argmax tokens, dropout off) from
    the sampled fertilities, ``</s>`` included, in one teacher-forced pass (the NPD scorer,
    ``generators/nat_fertility.teacher_scores``); baseline = the same reward of the sentence's argmax
    fertilities (the paper's f-bar).  The teacher is loaded once, on the first REINFORCE batch, is
    not part of the model (neither trained nor saved in its checkpoints), and follows the model's
    device and dtype.  The paper's reward is the reverse-KL term sum_t sum_y p_NA(y_t) log p_AR(y_t |
    y^_<t, x), the expectation of this one under the NAT's token distribution; here each position
    takes the NAT's argmax token (exact for a peaked NAT).  The paper's other fine-tuning terms (the
    word-level reverse-KL loss of the decoder, the external-fertility term, the lambda mix with
    distillation) are not implemented.
  - ``reference`` (default; this model's REINFORCE stage before the option existed): r = minus the
    translation loss of the output against the reference: the mean over max(output, reference
    length) positions of -log p(reference token) where both have a token, and log V (a uniform
    guess) for each position only one of them has.  Baseline: the mean reward of the sentence's k
    samples.  No teacher; the reference's own tokens score the decoder (teacher-forced by position).

Target convention (as Mask-Predict): the decoder produces the target content, ``</s>`` is appended to
hypotheses.
"""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.models import register_model, register_model_architecture
from fairseq.models.nat import FairseqNATDecoder
from fairseq.models.transformer import TransformerConfig
from fairseq.modules import LayerNorm, MultiheadAttention
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase

from ...compat import InputError
from ...modules.attention.partials import additive
from .base import SMALL, TINY, PluginNATModel, arch_defaults, nat_base_architecture
from .mask_predict import content_target


def fertility_copy_index(fertility, max_len=None):
    """fertility long (B, S) >= 0 -> (index long (B, T): the source position copied to each output
    position (0 beyond a row's length), valid bool (B, T), lengths (B,)).  T = the longest row;
    ``max_len`` cuts rows longer than it."""
    B, S = fertility.shape
    cum = fertility.cumsum(1)
    lengths = cum[:, -1] if S > 0 else fertility.new_zeros(B)
    if max_len is not None:
        lengths = lengths.clamp(max=max_len)
    T = int(lengths.max()) if B > 0 else 0
    pos = torch.arange(T, device=fertility.device).unsqueeze(0).expand(B, T).contiguous()
    index = torch.searchsorted(cum.contiguous(), pos, right=True).clamp(max=max(S - 1, 0))
    valid = pos < lengths.unsqueeze(1)
    return index.masked_fill(~valid, 0), valid, lengths


def copy_by_fertility(states, fertility, max_len=None):
    """states (B, S, C), fertility (B, S) -> (copied (B, T, C), zero beyond each row's length;
    valid bool (B, T); lengths (B,)).  Output position t of row b is source position s with
    cum_{s-1} <= t < cum_s (cum: the running sum of the row's fertilities)."""
    index, valid, lengths = fertility_copy_index(fertility, max_len)
    out = states.gather(1, index.unsqueeze(-1).expand(-1, -1, states.size(-1)))
    return out * valid.unsqueeze(-1).type_as(out), valid, lengths


def no_self_attention_mask(T, dtype, device):
    """(T, T) additive mask: a large negative number on the diagonal (no query attends to itself).
    Finite, so a row whose only real key is itself (a length-1 output) still attends to it."""
    big = -1e8 if dtype == torch.float32 or dtype == torch.float64 else -1e4
    return torch.diag(torch.full((T,), big, dtype=dtype, device=device))


class FertilityDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer with positional attention after the self-attention block."""

    def __init__(self, cfg, no_encoder_attn=False):
        super().__init__(cfg, no_encoder_attn)
        if self.c_attn is not None or self.attn_ln is not None or self.w_resid is not None \
                or self.ffn_layernorm is not None or self.cross_self_attention:
            raise InputError("nat_fertility: --scale-heads/--scale-attn/--scale-fc/--scale-resids and "
                             "--cross-self-attention are not supported")
        self.pos_attn = MultiheadAttention(self.embed_dim, cfg.decoder.attention_heads,
                                           dropout=cfg.attention_dropout)
        self.pos_attn_layer_norm = LayerNorm(self.embed_dim, export=cfg.export)

    def _block(self, x, norm, fn):
        residual = x
        if self.normalize_before:
            x = norm(x)
        x = self.dropout_module(fn(x))
        x = residual + x
        return x if self.normalize_before else norm(x)

    def forward(self, x, encoder_out=None, encoder_padding_mask=None, self_attn_mask=None,
                self_attn_padding_mask=None, positions=None, **unused):
        """x (T, B, C); positions (T, B, C) position embeddings (the positional attention's queries
        and keys); self_attn_mask: float, (T, T) or (B * heads, T, T) with the padding already in it;
        self_attn_padding_mask: bool (B, T), for the positional attention."""
        x = self._block(x, self.self_attn_layer_norm, lambda h: self.self_attn(
            query=h, key=h, value=h, need_weights=False, attn_mask=self_attn_mask)[0])
        x = self._block(x, self.pos_attn_layer_norm, lambda h: self.pos_attn(
            query=positions, key=positions, value=h, key_padding_mask=self_attn_padding_mask,
            need_weights=False)[0])
        if self.encoder_attn is not None and encoder_out is not None:
            x = self._block(x, self.encoder_attn_layer_norm, lambda h: self.encoder_attn(
                query=h, key=encoder_out, value=encoder_out, key_padding_mask=encoder_padding_mask,
                static_kv=True, need_weights=False)[0])
        return self._block(x, self.final_layer_norm, lambda h: self.fc2(
            self.activation_dropout_module(self.activation_fn(self.fc1(h)))))


class FertilityDecoder(FairseqNATDecoder):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        F_ = getattr(args, "max_fertility", None)
        if F_ is None or int(F_) != F_ or F_ < 1:
            raise InputError(f"nat_fertility: --max-fertility must be an integer >= 1, got {F_}")
        if self.embed_positions is None:
            raise InputError("nat_fertility: positional attention needs position embeddings "
                             "(drop --no-token-positional-embeddings)")
        self.max_fertility = int(F_)
        self.mask_idx = dictionary.index("<mask>")
        C = args.encoder_embed_dim
        self.fertility_proj = nn.Sequential(nn.Linear(C, C), nn.ReLU(), nn.Linear(C, self.max_fertility + 1))
        self.copy_proj = None
        if args.encoder_embed_dim != args.decoder_embed_dim:
            self.copy_proj = nn.Linear(args.encoder_embed_dim, args.decoder_embed_dim, bias=False)

    def build_decoder_layer(self, args, no_encoder_attn=False):
        cfg = TransformerConfig.from_namespace(args)
        layer = FertilityDecoderLayer(cfg, no_encoder_attn)
        if cfg.checkpoint_activations:
            layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
        return layer

    def forward_fertility(self, encoder_out, normalize=False):
        """-> (B, S, F + 1) fertility logits (log-probs with ``normalize``) of every source position."""
        enc = encoder_out["encoder_out"][0].transpose(0, 1)
        out = self.fertility_proj(enc)
        return F.log_softmax(out.float(), -1) if normalize else out

    def copy_source(self, encoder_out, fertility, max_len=None):
        """The decoder input: source embeddings copied by ``fertility`` (B, S) -> (x (B, T, C), valid)."""
        emb = encoder_out["encoder_embedding"][0]  # (B, S, C_enc), scaled token embeddings
        if self.copy_proj is not None:
            emb = self.copy_proj(emb)
        x, valid, _ = copy_by_fertility(emb, fertility, max_len)
        return x, valid

    def forward(self, encoder_out, fertility=None, copied=None, normalize=False, features_only=False,
                **unused):
        """Either ``fertility`` (B, S) or ``copied`` = :meth:`copy_source`'s result -> logits (B, T, V)
        (log-probs with ``normalize``; decoder features with ``features_only``)."""
        x, valid = copied if copied is not None else self.copy_source(encoder_out, fertility)
        pad = ~valid
        T = x.size(1)
        if T > self.embed_positions.max_positions:
            raise InputError(f"nat_fertility: {T} output positions exceed the decoder's "
                             f"{self.embed_positions.max_positions} (--max-target-positions)")
        dummy = pad.long() * self.padding_idx + valid.long() * self.dictionary.unk()
        positions = self.embed_positions(dummy)
        x = x + positions
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x).transpose(0, 1)
        positions = positions.transpose(0, 1)
        enc = encoder_out["encoder_out"][0]
        enc_pad = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        mask = no_self_attention_mask(T, x.dtype, x.device)
        self_pad = None
        if bool(pad.any()):
            # a row without any position (all fertilities 0) would attend to nothing (NaN): let it see
            # its first (padding) position; its outputs are never read
            self_pad = pad.clone()
            self_pad[:, 0] &= valid.any(1)
            # the self-attention gets the padding inside its float mask, (B * heads, T, T): fairseq
            # passes key_padding_mask as bool, and torch warns about a bool one beside a float attn_mask
            heads = self.layers[0].self_attn.num_heads if len(self.layers) else 1
            mask = (mask.unsqueeze(0) + additive(~self_pad, x.dtype).unsqueeze(1)).repeat_interleave(heads, 0)
        for layer in self.layers:
            x = layer(x, enc, enc_pad, self_attn_mask=mask, self_attn_padding_mask=self_pad,
                      positions=positions)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        if features_only:
            return x
        out = self.output_layer(x)
        return F.log_softmax(out.float(), -1) if normalize else out


    def packed_features(self, encoder_out, copied):
        """Inference: :meth:`forward`'s features at the real positions only, (M, C) row-major, i.e.
        ``forward(encoder_out, copied=copied, features_only=True)[valid]`` -- every position-wise product
        runs on the M real rows, not on the padded N x T (modules/packed.py); the positional attention's
        queries and keys (position embeddings, the same in every row) are projected once.
        ``encoder_out``'s batch is N, or 1 when every row reads that one source."""
        from ...modules import packed

        x, valid = copied
        rows = packed.Rows(valid)
        N, T = valid.shape
        if T > self.embed_positions.max_positions:
            raise InputError(f"nat_fertility: {T} output positions exceed the decoder's "
                             f"{self.embed_positions.max_positions} (--max-target-positions)")
        full = self.embed_positions(valid.new_full((1, T), self.dictionary.unk(), dtype=torch.long))[0]  # (T, C)
        h = rows.pack(x) + full.unsqueeze(0).expand(N, T, -1)[valid]
        if self.layernorm_embedding is not None:
            h = self.layernorm_embedding(h)
        key_ok = valid.clone()
        key_ok[:, 0] |= ~valid.any(1)  # a row without positions reads its first (padding) one, as in forward
        # (N, 1, T, T): forward's mask (padding keys -inf, the diagonal a finite -1e8)
        self_mask = (additive(key_ok, h.dtype)[:, None, :] + no_self_attention_mask(T, h.dtype, h.device)).unsqueeze(1)
        enc, enc_pad = packed.encoder_states(encoder_out)
        key_mask = additive(key_ok, h.dtype)[:, None, None, :]  # once for every layer's positional attention
        for layer in self.layers:
            h = packed.block(layer, h, layer.self_attn_layer_norm,
                             lambda y: packed.self_attention(layer.self_attn, y, rows, mask=self_mask))
            h = packed.block(layer, h, layer.pos_attn_layer_norm,
                             lambda y: packed.positional_attention(layer.pos_attn, full, y, rows, key_mask))
            if layer.encoder_attn is not None:
                h = packed.block(layer, h, layer.encoder_attn_layer_norm,
                                 lambda y: packed.cross_attention(layer.encoder_attn, y, rows, enc, enc_pad))
            h = packed.block(layer, h, layer.final_layer_norm, lambda y: packed.feed_forward(layer, y))
        if self.layer_norm is not None:
            h = self.layer_norm(h)
        if self.project_out_dim is not None:
            h = self.project_out_dim(h)
        return h


#: ``--fertility-reinforce-reward`` values
REINFORCE_REWARDS = ("reference", "teacher")


def reinforce_objective(fert_lprobs, samples, allowed, advantage):
    """The REINFORCE loss of the fertility classifier: fert_lprobs (B, S, F+1) log-probs, samples long
    (k, B, S) sampled fertilities, allowed bool (B, S) the positions they are drawn at, advantage (k, B)
    (reward minus baseline, no gradient) -> -mean_{k,b} advantage_kb * sum_{s allowed} log p(f_kbs)."""
    k = samples.size(0)
    logp = fert_lprobs.unsqueeze(0).expand(k, -1, -1, -1).gather(-1, samples.unsqueeze(-1)).squeeze(-1)
    logp = (logp * allowed.unsqueeze(0)).sum(-1)  # (k, B)
    return -(advantage * logp).mean()


def source_fertility_mask(src_tokens, pad, eos):
    """bool (B, S): the source positions that may have a fertility above 0 (not padding, not </s>)."""
    return src_tokens.ne(pad) & src_tokens.ne(eos)


@register_model("nat_fertility")
class FertilityNATModel(PluginNATModel):
    decoder_class = FertilityDecoder

    @property
    def generator_class(self):
        from ...generators.nat_fertility import NPDGenerator

        return NPDGenerator

    @property
    def allow_length_beam(self):
        return False

    @property
    def max_fertility(self):
        return self.decoder.max_fertility

    @staticmethod
    def add_args(parser):
        PluginNATModel.add_args(parser)
        parser.add_argument("--max-fertility", type=int,
                            help="largest fertility the classifier predicts (classes 0..F), default 50")
        parser.add_argument("--fertility-reinforce", action="store_true",
                            help="fine-tuning: add a REINFORCE loss on the fertility classifier "
                                 "(reward: --fertility-reinforce-reward)")
        parser.add_argument("--fertility-reinforce-samples", type=int,
                            help="fertility samples per sentence for --fertility-reinforce (>= 2 for the "
                                 "reference reward, whose baseline is their mean; >= 1 for the teacher "
                                 "reward, whose baseline is the argmax fertilities'), default 4")
        parser.add_argument("--fertility-reinforce-reward", choices=REINFORCE_REWARDS,
                            help="what rewards a sampled fertility sequence: 'teacher' (Gu et al. 2018: "
                                 "the --fertility-teacher's log-probability of the translation decoded "
                                 "from it, baseline the argmax fertilities') or 'reference' (minus the "
                                 "decoder's translation loss against the reference, baseline the mean of "
                                 "the samples), default reference")
        parser.add_argument("--fertility-teacher", metavar="AT.pt",
                            help="the autoregressive teacher checkpoint of --fertility-reinforce-reward "
                                 "teacher (shares the target dictionary; not trained, not saved)")

    def inject_noise(self, target):
        """The decoder reads copied source embeddings, not the target: the content target stands in
        for ``prev_target``."""
        return content_target(target, self.eos, self.pad)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, tgt_tokens, tgt_fertility=None,
                **kwargs):
        if tgt_fertility is None:
            raise InputError("nat_fertility: the batch has no fertility targets; train with --task "
                             "nat_translation --fertility-path DIR (DIR/{train,valid}.fert from "
                             "examples/fertility.sh)")
        tgt = content_target(tgt_tokens, self.eos, self.pad)
        tgt_len = tgt.ne(self.pad).sum(1)
        allowed = source_fertility_mask(src_tokens, self.pad, self.eos)
        tgt_fertility = tgt_fertility.masked_fill(~allowed, 0)
        if not torch.equal(tgt_fertility.sum(1), tgt_len):
            b = int((tgt_fertility.sum(1) != tgt_len).nonzero()[0])
            raise InputError(f"nat_fertility: fertilities of a batch row sum to {int(tgt_fertility[b].sum())}"
                             f" but its target has {int(tgt_len[b])} tokens")
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths)
        fert_logits = self.decoder.forward_fertility(encoder_out)
        copied = self.decoder.copy_source(encoder_out, tgt_fertility)
        T = copied[0].size(1)
        word_out = self.decoder(encoder_out, copied=copied)
        out = {
            "word_ins": {"out": word_out, "tgt": tgt[:, :T], "mask": copied[1]},
            "fertility": {"out": fert_logits, "tgt": tgt_fertility.clamp(max=self.max_fertility),
                          "mask": allowed, "ls": 0.0, "factor": 1.0},
        }
        if self.training and getattr(self.args, "fertility_reinforce", False):
            out["fertility_reinforce"] = self.reinforce_loss(encoder_out, fert_logits, allowed, tgt,
                                                             src_tokens=src_tokens, src_lengths=src_lengths)
        return out

    @property
    def reinforce_reward(self):
        r = getattr(self.args, "fertility_reinforce_reward", None) or "reference"
        if r not in REINFORCE_REWARDS:
            raise InputError(f"nat_fertility: --fertility-reinforce-reward must be one of "
                             f"{', '.join(REINFORCE_REWARDS)}, got {r!r}")
        return r

    def reinforce_loss(self, encoder_out, fert_logits, allowed, tgt, src_tokens=None, src_lengths=None):
        """REINFORCE on the fertility classifier (module doc) -> {"loss", "nll_loss", "factor"}."""
        reward_kind = self.reinforce_reward
        k = int(getattr(self.args, "fertility_reinforce_samples", 4) or 4)
        if k < (1 if reward_kind == "teacher" else 2):
            raise InputError(f"nat_fertility: --fertility-reinforce-samples must be >= "
                             f"{1 if reward_kind == 'teacher' else 2} with the {reward_kind} reward, got {k}")
        B, S, _ = fert_logits.shape
        lp = F.log_softmax(fert_logits.float(), -1)
        with torch.no_grad():
            samples = torch.multinomial(lp.exp().view(B * S, -1), k, replacement=True)
            samples = samples.view(B, S, k).permute(2, 0, 1).masked_fill(~allowed, 0)  # (k, B, S)
            if reward_kind == "teacher":
                argmax = lp.argmax(-1).masked_fill(~allowed, 0).unsqueeze(0)  # (1, B, S)
                both = torch.cat([samples, argmax]).reshape((k + 1) * B, S)
                order = torch.arange(B, device=both.device).repeat(k + 1)
                reward = self.teacher_rewards(encoder_out, src_tokens, src_lengths, both, order).view(k + 1, B)
                advantage = reward[:k] - reward[k:]  # baseline: the argmax fertilities' reward
            else:
                reward = self._sample_rewards(encoder_out, samples.reshape(k * B, S), tgt.repeat(k, 1), k)
                reward = reward.view(k, B)
                advantage = reward - reward.mean(0, keepdim=True)
        loss = reinforce_objective(lp, samples, allowed, advantage)
        return {"loss": loss, "nll_loss": loss.detach() * 0.0, "factor": 1.0}

    def fertility_teacher(self, like):
        """The ``--fertility-teacher`` model (loaded once per process by the NPD generator's cached loader;
        kept outside the module tree so it is neither trained nor saved), on ``like``'s device and dtype."""
        teacher = self.__dict__.get("_fertility_teacher")
        if teacher is None:
            path = getattr(self.args, "fertility_teacher", None)
            if not path:
                raise InputError("nat_fertility: --fertility-reinforce-reward teacher needs --fertility-teacher "
                                 "AT.pt (an autoregressive checkpoint sharing the target dictionary)")
            from ...generators.nat_fertility import load_teacher

            data = getattr(self.args, "data", None)
            data_dir = str(data).split(os.pathsep)[0] if data else None
            teacher = load_teacher(path, data_dir, self.decoder.dictionary)
            self.__dict__["_fertility_teacher"] = teacher  # not a submodule
        p = next(teacher.parameters(), None)
        if p is not None and (p.device != like.device or p.dtype != like.dtype):
            teacher.to(device=like.device, dtype=like.dtype)
        return teacher.eval()

    @torch.no_grad()
    def teacher_rewards(self, encoder_out, src_tokens, src_lengths, fert, order, teacher=None):
        """fert (N, S) fertility sequences of the sources ``order`` (N,) -> (N,) the teacher's total
        log-probability of the translation decoded from each (argmax tokens, dropout off, special
        symbols and symbols outside the teacher's dictionary excluded; ``</s>`` scored)."""
        from ...generators.nat_fertility import teacher_scores

        if src_tokens is None:
            raise InputError("nat_fertility: the teacher reward needs the source tokens")
        teacher = teacher if teacher is not None else self.fertility_teacher(encoder_out["encoder_out"][0])
        d = self.decoder.dictionary
        V = teacher.decoder.output_projection.out_features if getattr(teacher.decoder, "output_projection", None) \
            is not None else len(teacher.decoder.dictionary)
        max_len = self.decoder.embed_positions.max_positions
        if hasattr(teacher, "max_decoder_positions"):
            max_len = min(max_len, teacher.max_decoder_positions() - 1)
        enc = self.encoder.reorder_encoder_out(encoder_out, order)
        was_training = self.decoder.training
        self.decoder.eval()
        try:
            copied = self.decoder.copy_source(enc, fert, max_len=max_len)
            lengths = copied[1].sum(1)
            if copied[0].size(1) == 0:
                tokens = fert.new_full((fert.size(0), 0), d.pad())
            else:
                logits = self.decoder(enc, copied=copied).float()
                banned = torch.zeros(logits.size(-1), dtype=torch.bool, device=logits.device)
                banned[V:] = True
                banned[[d.pad(), d.bos(), d.eos(), self.decoder.mask_idx]] = True
                tokens = logits.masked_fill(banned, float("-inf")).argmax(-1).masked_fill(~copied[1], d.pad())
        finally:
            self.decoder.train(was_training)
        return teacher_scores(teacher, src_tokens, src_lengths, order, tokens, lengths, d.pad(), d.eos(),
                              rank="total").float()

    def _sample_rewards(self, encoder_out, fert, tgt, k):
        """fert (k*B, S) sampled fertilities, tgt (k*B, T*) -> reward (k*B,) = -translation loss."""
        B = fert.size(0) // k
        order = torch.arange(B, device=fert.device).repeat(k)
        enc = self.encoder.reorder_encoder_out(encoder_out, order)
        max_len = self.decoder.embed_positions.max_positions
        copied = self.decoder.copy_source(enc, fert, max_len=max_len)
        lengths = copied[1].sum(1)
        ref_len = tgt.ne(self.pad).sum(1)
        if copied[0].size(1) == 0:
            overlap_loss = torch.zeros_like(ref_len, dtype=torch.float)
        else:
            lprobs = self.decoder(enc, copied=copied, normalize=True)  # (N, T, V)
            n = min(lprobs.size(1), tgt.size(1))
            both = copied[1][:, :n] & tgt[:, :n].ne(self.pad)
            tok = lprobs[:, :n].gather(-1, tgt[:, :n].unsqueeze(-1)).squeeze(-1)
            overlap_loss = -torch.where(both, tok, torch.zeros_like(tok)).sum(1)
        mismatch = (lengths - ref_len).abs().float() * math.log(len(self.decoder.dictionary))
        total = torch.maximum(lengths, ref_len).clamp(min=1).float()
        return -(overlap_loss + mismatch) / total


@register_model_architecture("nat_fertility", "nat_fertility")
def nat_fertility_base(args):
    """The paper's base size: 6+6 layers, d=512, 8 heads; fertilities 0..50."""
    nat_base_architecture(
        args,
        dropout=0.3, share_all_embeddings=True, max_fertility=50, fertility_reinforce=False,
        fertility_reinforce_samples=4, fertility_reinforce_reward="reference", fertility_teacher=None,
        apply_bert_init=False,
        max_source_positions=256, max_target_positions=256,
    )


@register_model_architecture("nat_fertility", "nat_fertility_small")
def nat_fertility_small(args):
    """Multi30K size, the same as the shared teacher: 3+3 layers, d=256, 4 heads, FFN 1024."""
    arch_defaults(args, **SMALL)
    nat_fertility_base(args)


@register_model_architecture("nat_fertility", "nat_fertility_tiny")
def nat_fertility_tiny(args):
    """For tests: 2+2 layers, d=128, fertilities 0..8."""
    arch_defaults(args, max_fertility=8, **TINY)
    nat_fertility_base(args)
