"""Vanilla and additive attention against plain reference maths; model-level decoding; seq2seq learning.

The KV cache itself (segments == one call, token by token, bounded by max_cache) is checked by the
state contract in tests/contracts/test_attention.py."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.attention.base import causal_allowed, reference_attention


def heads_of(attn, x, proj):
    return attn.split_heads(proj(x))


def vanilla_reference(attn, x, context=None, pad_mask=None):
    source = x if context is None else context
    q, k, v = heads_of(attn, x, attn.to_q), heads_of(attn, source, attn.to_k), heads_of(attn, source, attn.to_v)
    t, s = q.shape[2], k.shape[2]
    allowed = torch.ones(x.shape[0], 1, t, s, dtype=torch.bool)
    if attn.causal and context is None:
        allowed = allowed & causal_allowed(t, s)
    if pad_mask is not None:
        allowed = allowed & pad_mask[:, None, None, :]
    return attn.to_out(attn.merge_heads(reference_attention(q, k, v, allowed)))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_vanilla_equals_naive_softmax(causal, padded):
    attn = zoo.create_attention("vanilla", d_model=32, n_heads=4, causal=causal).eval()
    x = torch.randn(3, 11, 32)
    mask = torch.ones(3, 11, dtype=torch.bool)
    if padded:
        mask[0, 8:] = False
        mask[2, 5:] = False
    out = attn(x, pad_mask=mask if padded else None).out
    ref = vanilla_reference(attn, x, pad_mask=mask if padded else None)
    torch.testing.assert_close(out[mask], ref[mask], atol=1e-5, rtol=1e-4)


def test_vanilla_cross_attention_equals_naive():
    attn = zoo.create_attention("vanilla", d_model=32, n_heads=4).eval()
    x, ctx = torch.randn(2, 6, 32), torch.randn(2, 13, 32)
    mask = torch.ones(2, 13, dtype=torch.bool)
    mask[1, 9:] = False
    torch.testing.assert_close(
        attn(x, context=ctx, pad_mask=mask).out, vanilla_reference(attn, x, ctx, mask), atol=1e-5, rtol=1e-4
    )


def test_lm_incremental_generation_equals_full_forward():
    model = zoo.create_model("vanilla_lm", vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64).eval()
    tokens = torch.randint(0, 50, (2, 12))
    full = model(tokens).logits
    out = model(tokens[:, :5], state=model.init_state(2))
    steps = [out.logits]
    for i in range(5, 12):
        out = model(tokens[:, i : i + 1], state=out.state)
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-4, rtol=1e-4)
    assert out.state.offset == 12


def test_greedy_generate_matches_argmax_of_full_forward():
    torch.manual_seed(1)
    model = zoo.create_model("vanilla_lm", vocab_size=40, d_model=32, n_layers=2, n_heads=4, d_ff=64).eval()
    prompt = torch.randint(0, 40, (2, 4))
    generated = model.generate(prompt, 6, greedy=True)
    for i in range(4, 10):  # every generated token is the argmax given its prefix
        assert torch.equal(model(generated[:, :i]).logits[:, -1].argmax(-1), generated[:, i])


def test_state_from_another_batch_or_model_is_refused():
    model = zoo.create_model("vanilla_lm", vocab_size=20, d_model=16, n_layers=1, n_heads=2, d_ff=32)
    state = model(torch.randint(0, 20, (2, 4)), state=model.init_state(2)).state
    with pytest.raises(ValueError, match="batch size"):
        model(torch.randint(0, 20, (3, 1)), state=state)
    other = zoo.create_model("vanilla_lm", vocab_size=20, d_model=16, n_layers=2, n_heads=2, d_ff=32)
    with pytest.raises(ValueError, match="different model"):
        other(torch.randint(0, 20, (2, 1)), state=state)


@pytest.mark.parametrize("score", ["dot", "general", "concat"])
def test_additive_scores_match_their_formulas(score):
    attn = zoo.create_attention("additive", d_model=16, n_heads=2, score=score).eval()
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8)
    s = attn.scores(q, k)
    for h in range(2):
        for i in range(3):
            for j in range(5):
                qi, kj = q[0, h, i], k[0, h, j]
                if score == "dot":
                    expected = qi @ kj
                elif score == "general":
                    expected = qi @ attn.w_a[h] @ kj
                else:  # v^T tanh(W_s s + W_h h)
                    expected = attn.v_a[h] @ torch.tanh(qi @ attn.w_s[h] + kj @ attn.w_h[h])
                torch.testing.assert_close(s[0, h, i, j], expected, atol=1e-5, rtol=1e-4)


def test_additive_bad_score_refused():
    with pytest.raises(ValueError, match="score must be one of"):
        zoo.create_attention("additive", d_model=16, n_heads=2, score="cosine")


def copy_batch(b, t, vocab, g):
    src = torch.randint(3, vocab, (b, t), generator=g)
    out = src.flip(1)  # reverse task
    bos = torch.full((b, 1), 1)
    eos = torch.full((b, 1), 2)
    tgt_full = torch.cat([bos, out, eos], 1)
    return src, tgt_full[:, :-1], tgt_full[:, 1:]


def test_seq2seq_learns_to_reverse_and_decodes_greedy_and_beam():
    torch.manual_seed(0)
    vocab = 12
    model = zoo.create_model(
        "vanilla_seq2seq",
        vocab_size=vocab,
        d_model=48,
        n_layers=2,
        n_heads=4,
        d_ff=96,
        dropout=0.0,
        label_smoothing=0.0,
        residual="pre_norm",
    )
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        src, tgt, targets = copy_batch(32, 6, vocab, g)
        loss = model(src, tgt, targets).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    src, _, targets = copy_batch(64, 6, vocab, torch.Generator().manual_seed(123))
    greedy = model.generate(src, max_len=7)
    beam = model.generate(src, max_len=7, beam_size=3)
    for decoded in (greedy, beam):
        seq_acc = (decoded[:, :7] == targets).all(1).float().mean().item()
        assert seq_acc > 0.9, f"sequence accuracy {seq_acc:.2f}"


def test_seq2seq_incremental_decoder_equals_full():
    model = zoo.create_model("vanilla_seq2seq", vocab_size=20, d_model=32, n_layers=2, n_heads=4, d_ff=64).eval()
    src, tgt = torch.randint(3, 20, (2, 7)), torch.randint(3, 20, (2, 6))
    full = model(src, tgt).logits
    state = model.init_state(src)
    steps = []
    for i in range(6):
        out = model(None, tgt[:, i : i + 1], state=state)
        state = out.state
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-4, rtol=1e-4)


def test_three_way_tying():
    model = zoo.create_model("vanilla_seq2seq", vocab_size=20, d_model=16, n_layers=1, n_heads=2, d_ff=32)
    assert model.src_embed is model.tgt_embed and model.head.weight is model.tgt_embed.weight
    untied = zoo.create_model(
        "vanilla_seq2seq", vocab_size=20, src_vocab_size=30, d_model=16, n_layers=1, n_heads=2, d_ff=32
    )
    assert untied.src_embed is not untied.tgt_embed and untied.head.weight is untied.tgt_embed.weight
