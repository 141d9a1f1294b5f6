"""modules/packed.py: decoder layers over the real positions only equal the modules' own padded forwards
(fairseq's Transformer decoder, post- and pre-norm; our fertility NAT decoder), for a key batch of N rows
and of one shared source, on ragged rows including a length-1 row."""
import contextlib

import pytest
import torch

from conftest import build_model_and_task
from fairseq_nat_ext.modules import cpu_linear, packed


def _scope(decoding, model):
    """A generator's decoding scope (prepacked products, ReLU and residuals fused) or none."""
    return cpu_linear.decoding([model]) if decoding else contextlib.nullcontext()


def _teacher(data_bin, extra=()):
    from fairseq import options, tasks

    args = options.parse_args_and_arch(options.get_training_parser(), [
        data_bin, "--task", "translation", "--arch", "transformer", "--share-all-embeddings",
        "--encoder-layers", "1", "--decoder-layers", "2", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
        "--decoder-attention-heads", "4", "--dropout", "0", *extra])
    torch.manual_seed(2)
    return tasks.setup_task(args).build_model(args).eval()


def _ragged_prev(pad, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    prev = torch.randint(4, 30, (len(lengths), T), generator=g)
    for i, n in enumerate(lengths):
        prev[i, n:] = pad
    return prev


@pytest.mark.parametrize("decoding", [False, True])
@pytest.mark.parametrize("extra", [(), ("--decoder-normalize-before", "--layernorm-embedding")])
def test_decoder_features_equal_fairseqs_forward_at_the_real_positions(toy_databin, extra, decoding):
    teacher = _teacher(toy_databin[0], extra)
    assert packed.supports_decoder(teacher.decoder)
    pad = teacher.decoder.padding_idx
    src = torch.tensor([[5, 6, 7, 2], [pad, 8, 9, 2]])  # left-padded, as fairseq batches
    lengths = [5, 1, 3, 4]
    prev = _ragged_prev(pad, lengths)
    valid = prev.ne(pad)
    with torch.no_grad(), _scope(decoding, teacher):
        enc = teacher.encoder(src, src_lengths=torch.tensor([4, 3]))
        for order in (torch.tensor([0, 1, 1, 0]), torch.tensor([1, 1, 1, 1])):
            expanded = teacher.encoder.reorder_encoder_out(enc, order)
            ref = teacher.decoder(prev, encoder_out=expanded, features_only=True)[0][valid]
            torch.testing.assert_close(packed.decoder_features(teacher.decoder, prev, expanded), ref, atol=1e-5, rtol=1e-5)
        one = teacher.encoder.reorder_encoder_out(enc, torch.tensor([1]))  # a shared source, key batch 1
        torch.testing.assert_close(packed.decoder_features(teacher.decoder, prev, one), ref, atol=1e-5, rtol=1e-5)


def test_a_source_without_padding_is_read_without_a_mask(toy_databin):
    """encoder_states drops an all-false padding mask (batch 1: torch's attention is faster without one)
    and keeps a real one; the packed decoder over an unpadded shared source equals fairseq's forward."""
    teacher = _teacher(toy_databin[0])
    pad = teacher.decoder.padding_idx
    src = torch.tensor([[5, 6, 7, 2], [pad, 8, 9, 2]])
    prev = _ragged_prev(pad, [5, 1, 3, 4], seed=1)
    with torch.no_grad(), cpu_linear.decoding([teacher]):
        enc = teacher.encoder(src, src_lengths=torch.tensor([4, 3]))
        unpadded, padded = (teacher.encoder.reorder_encoder_out(enc, torch.tensor([i])) for i in (0, 1))
        assert not unpadded["encoder_padding_mask"][0].any() and packed.encoder_states(unpadded)[1] is None
        assert torch.equal(packed.encoder_states(padded)[1], torch.tensor([[True, False, False, False]]))
        expanded = teacher.encoder.reorder_encoder_out(enc, torch.zeros(4, dtype=torch.long))
        ref = teacher.decoder(prev, encoder_out=expanded, features_only=True)[0][prev.ne(pad)]
        torch.testing.assert_close(packed.decoder_features(teacher.decoder, prev, unpadded), ref, atol=1e-5, rtol=1e-5)


def test_unsupported_decoders_are_refused(toy_databin):
    teacher = _teacher(toy_databin[0])
    teacher.decoder.train()
    assert packed.supports_decoder(teacher.decoder)  # training: the layers' dropout modules act
    teacher.decoder.decoder_layerdrop = 0.1  # dropped layers are not implemented here
    assert not packed.supports_decoder(teacher.decoder)
    teacher.decoder.decoder_layerdrop = 0.0
    teacher.decoder.eval()
    teacher.decoder.layers[0].self_attn.add_zero_attn = True
    assert not packed.supports_decoder(teacher.decoder)


@pytest.mark.parametrize("decoding", [False, True])
def test_fertility_packed_features_equal_forward_at_the_real_positions(toy_databin, decoding):
    torch.manual_seed(0)
    task, model, _ = build_model_and_task(toy_databin[0], ["--arch", "nat_fertility_tiny", "--dropout", "0"])
    model.eval()
    task.load_dataset("test")
    ds = task.dataset("test")
    sample = ds.collater([ds[i] for i in range(3)])
    src, src_len = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    fert = torch.zeros(4, src.size(1), dtype=torch.long)
    fert[0, -3] = 1  # a length-1 row
    fert[1, -4:-1] = torch.tensor([2, 0, 3])
    fert[2, -3:-1] = torch.tensor([1, 1])
    fert[3, -6:-1] = torch.tensor([1, 2, 1, 1, 2])
    with torch.no_grad(), _scope(decoding, model):
        enc = model.encoder(src, src_lengths=src_len)
        for order, cross_order in ((torch.tensor([0, 2, 1, 2]), None), (torch.tensor([1, 1, 1, 1]), torch.tensor([1]))):
            rows = model.encoder.reorder_encoder_out(enc, order)
            copied = model.decoder.copy_source(rows, fert)
            ref = model.decoder(rows, copied=copied, features_only=True)[copied[1]]
            cross = rows if cross_order is None else model.encoder.reorder_encoder_out(enc, cross_order)
            got = model.decoder.packed_features(cross, copied)
            assert got.shape == (int(fert.sum()), ref.size(-1))
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_prefix_tree_against_brute_force():
    pad = 1
    prev = torch.tensor([[2, 5, 6, 7], [2, 5, 6, pad], [2, 5, 8, 7], [2, 9, pad, pad], [2, 5, 6, 7]])
    node, ancestor = packed.prefix_tree(prev, pad)
    prefixes = {}
    for n in range(prev.size(0)):
        for t in range(prev.size(1)):
            if prev[n, t] == pad:
                assert node[n, t] == -1
                continue
            key = tuple(prev[n, :t + 1].tolist())
            assert prefixes.setdefault(key, int(node[n, t])) == int(node[n, t])  # one id per prefix
    assert sorted(prefixes.values()) == list(range(len(prefixes)))  # distinct prefixes, distinct ids
    for a, i in prefixes.items():
        for b, j in prefixes.items():
            assert bool(ancestor[i, j]) == (len(b) <= len(a) and a[:len(b)] == b)


def test_tree_teacher_scores_equal_fairseqs_forward_on_rows_sharing_prefixes(toy_databin):
    """One source's candidates sharing prefixes (and one repeated): scored over the prefix tree's nodes,
    the same mean log-probabilities as fairseq's decoder over every padded row."""
    from fairseq_nat_ext.generators.nat_fertility import teacher_forced_inputs, teacher_scores
    from fairseq_nat_ext.generators.projection import target_log_probs

    for extra in ((), ("--decoder-normalize-before",)):
        teacher = _teacher(toy_databin[0], extra)
        pad, eos = teacher.decoder.padding_idx, teacher.decoder.dictionary.eos()
        tokens = torch.tensor([[5, 6, 7, 8], [5, 6, 9, pad], [5, 6, 7, 8], [10, pad, pad, pad], [5, 11, 7, 8]])
        lengths = tokens.ne(pad).sum(1)
        src, src_len = torch.tensor([[12, 13, 14, 2]]), torch.tensor([4])
        order = torch.zeros(5, dtype=torch.long)
        with torch.no_grad():
            got = teacher_scores(teacher, src, src_len, order, tokens, lengths, pad, eos)
            prev, target = teacher_forced_inputs(tokens, lengths, pad, eos)
            enc = teacher.encoder.reorder_encoder_out(teacher.encoder(src, src_lengths=src_len), order)
            feats = teacher.decoder(prev, encoder_out=enc, features_only=True)[0]
            keep = target.ne(pad)
            V = teacher.decoder.output_projection.out_features
            ref = target_log_probs(feats, teacher.decoder.output_layer, target, V, keep=keep).sum(1) / keep.sum(1)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
        assert got[0] == got[2]  # a repeated row: the very same nodes


@pytest.mark.parametrize("extra", [(), ("--decoder-normalize-before",)])
def test_levenshtein_states_equal_fairseqs_forward_values_and_gradients(toy_databin, extra):
    """The LevT decoder's passes (no future mask, key padding) on the real positions only, train mode
    without dropout: the same states at the real positions and the same parameter gradients as fairseq's
    padded ``extract_features``; passes sharing one cross-attention key / value projection (cross_kv) equal
    passes projecting their own."""
    from fairseq_nat_ext.models.nat.edit_ops import pad_to

    torch.manual_seed(0)
    task, model, _ = build_model_and_task(toy_databin[0], ["--arch", "levenshtein_tiny", "--dropout", "0", *extra])
    model.train()
    dec = model.decoder
    assert packed.supports_decoder(dec)
    task.load_dataset("test")
    ds = task.dataset("test")
    sample = ds.collater([ds[i] for i in range(4)])
    src, src_len = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    pad = dec.padding_idx
    a = pad_to(_ragged_prev(pad, [5, 2, 7, 1], seed=1), 7, pad)
    b = _ragged_prev(pad, [3, 6, 2, 4], seed=2)
    weight = torch.randn(4, 7, dec.embed_dim)

    def run(fn):
        model.zero_grad()
        enc = model.encoder(src, src_lengths=src_len)
        ha, hb = fn(a, enc), fn(b, enc)
        loss = (ha * a.ne(pad).unsqueeze(-1) * weight).sum() + (hb * b.ne(pad).unsqueeze(-1) * weight[:, :b.size(1)]).sum()
        loss.backward()
        return ha[a.ne(pad)], hb[b.ne(pad)], {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref = run(lambda t, enc: dec.extract_features(t, encoder_out=enc, full_context_alignment=True)[0])
    own = run(lambda t, enc: packed.nat_decoder_features(dec, t, enc))
    shared = {}

    def with_shared(t, enc):
        if "kv" not in shared or shared["enc"] is not enc:
            shared.update(enc=enc, kv=packed.cross_kv(dec, enc))
        return packed.nat_decoder_features(dec, t, enc, kv=shared["kv"])

    both = run(with_shared)
    for got in (own, both):
        torch.testing.assert_close(got[0], ref[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[1], ref[1], atol=1e-5, rtol=1e-5)
        assert got[2].keys() == ref[2].keys()
        for name in ref[2]:
            torch.testing.assert_close(got[2][name], ref[2][name], atol=1e-5, rtol=1e-4, msg=name)


def test_packed_training_applies_the_decoders_dropout(toy_databin):
    """With dropout the packed pass is random in training (two calls differ) and deterministic in eval."""
    torch.manual_seed(0)
    task, model, _ = build_model_and_task(toy_databin[0], ["--arch", "levenshtein_tiny", "--dropout", "0.3",
                                                           "--attention-dropout", "0.2", "--activation-dropout", "0.1"])
    task.load_dataset("test")
    ds = task.dataset("test")
    sample = ds.collater([ds[i] for i in range(2)])
    src, src_len = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    prev = _ragged_prev(model.decoder.padding_idx, [4, 3])
    for training in (True, False):
        model.train(training)
        with torch.no_grad():
            enc = model.encoder(src, src_lengths=src_len)
            x, y = (packed.nat_decoder_features(model.decoder, prev, enc) for _ in range(2))
        assert torch.equal(x, y) != training


def _prefix_tree_loop(prev, pad):
    """The prefix tree by its definition, one position at a time: a node is (its parent node, its
    token); the new nodes of a position are numbered after all earlier positions' nodes, in the order
    of (parent id, token)."""
    N, T = prev.shape
    node = torch.full((N, T), -1, dtype=torch.long)
    count = 0
    for t in range(T):
        pairs = sorted({(int(node[n, t - 1]) if t else -1, int(prev[n, t])) for n in range(N) if prev[n, t] != pad})
        ids = {p: count + i for i, p in enumerate(pairs)}
        for n in range(N):
            if prev[n, t] != pad:
                node[n, t] = ids[(int(node[n, t - 1]) if t else -1, int(prev[n, t]))]
        count += len(pairs)
    return node


@pytest.mark.parametrize("seed", range(6))
def test_prefix_tree_numbers_nodes_as_the_position_loop_does(seed):
    """Random rows over 3 symbols (many shared prefixes), right-padded to random lengths (some rows
    empty): the same node ids as the loop over positions (the numbering the teacher's features follow)."""
    g = torch.Generator().manual_seed(seed)
    pad = 1
    N, T = int(torch.randint(1, 12, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
    prev = torch.randint(4, 7, (N, T), generator=g)
    prev[:, 0] = 2  # every teacher-forced row starts with </s>
    lengths = torch.randint(0, T + 1, (N,), generator=g)
    prev = prev.masked_fill(torch.arange(T).unsqueeze(0) >= lengths.unsqueeze(1), pad)
    node, ancestor = packed.prefix_tree(prev, pad)
    assert node.tolist() == _prefix_tree_loop(prev, pad).tolist()
    K = int(node.max()) + 1 if bool(node.ge(0).any()) else 0
    assert ancestor.shape == (K, K)


def test_whole_rows_pack_and_unpack_as_indexed_rows():
    """Rows.whole (every position real) packs and unpacks by reshaping: the same tensors as the index route."""
    x = torch.randn(2, 5, 3)
    whole, indexed = packed.Rows.whole(2, 5), packed.Rows(torch.ones(2, 5, dtype=torch.bool))
    assert whole.dense and not indexed.dense and torch.equal(whole.index, indexed.index)
    assert torch.equal(whole.pack(x), indexed.pack(x))
    rows = torch.randn(10, 4)
    assert torch.equal(whole.unpack(rows), indexed.unpack(rows))


def test_encoder_kv_in_a_decoding_scope_is_the_two_projections(toy_databin):
    """Inside a decoding scope the keys and values come from ONE product with k_proj and v_proj stacked:
    the same (Bk, H, S, d) tensors as the two projections fairseq's MultiheadAttention runs."""
    teacher = _teacher(toy_databin[0])
    mha = teacher.decoder.layers[0].encoder_attn
    enc = torch.randn(6, 3, 32)  # (S, Bk, C)
    H, d = mha.num_heads, 32 // mha.num_heads
    ref_k = mha.k_proj(enc).permute(1, 0, 2).reshape(3, 6, H, d).transpose(1, 2)
    ref_v = mha.v_proj(enc).permute(1, 0, 2).reshape(3, 6, H, d).transpose(1, 2)
    from fairseq_nat_ext.modules.attention import mix

    for decoding in (False, True):
        with torch.no_grad(), _scope(decoding, teacher):
            assert cpu_linear.caching() == decoding
            k, v = packed.encoder_kv(mha, enc)
        torch.testing.assert_close(k, ref_k, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v, ref_v, atol=1e-5, rtol=1e-5)
        assert (mix.KV in mix._STACKED.get(mha, {})) == decoding  # the stacked product ran (and only then)


def test_stacked_weights_are_cached_per_module_and_projections(toy_databin):
    """In a decoding scope, q/k/v and k/v stacks of one module are two cache entries, each the
    concatenation of its weights, and a stack follows an in-place update of one of its weights."""
    from fairseq_nat_ext.modules.attention import mix

    mha = _teacher(toy_databin[0]).decoder.layers[0].encoder_attn
    with torch.no_grad(), cpu_linear.decoding():
        qkv, _ = mix.stacked_qkv_weight(mha)
        kv, kv_bias = mix.stacked_qkv_weight(mha, mix.KV)
        assert mix.stacked_qkv_weight(mha)[0] is qkv and mix.stacked_qkv_weight(mha, mix.KV)[0] is kv
        assert torch.equal(qkv, torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight]))
        assert torch.equal(kv, torch.cat([mha.k_proj.weight, mha.v_proj.weight]))
        assert torch.equal(kv_bias, torch.cat([mha.k_proj.bias, mha.v_proj.bias]))
        mha.v_proj.weight.add_(1.0)
        kv2, _ = mix.stacked_qkv_weight(mha, mix.KV)
        assert kv2 is not kv and torch.equal(kv2, torch.cat([mha.k_proj.weight, mha.v_proj.weight]))
