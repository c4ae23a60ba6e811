"""Transformer-XL relative attention, segment memory, and the GTrXL residuals against plain maths."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.attention.xl_rel import XLMemory, rel_shift, set_eval_memory
from zoo.position.base import sinusoid_table
from zoo.presets.factory import get_preset
from zoo.residual.gtrxl import GRUGate, IdentityMapReordered

D, H = 32, 4
XL_PRESETS = ["transformer_xl", "trxl_i", "gtrxl"]


def naive_xl(attn, x, memory=None, pad=None, allowed=None):
    """The four-term score a_ij = (q_i + u) k_j + (q_i + v) W_R r_{i-j} written position by position
    (a loop over query/key pairs), then a masked softmax: the reference for the shifted, blocked,
    SDPA-backed implementation."""
    b, t, d = x.shape
    keys_in = x if memory is None else torch.cat([memory, x], 1)
    m, s, hk = keys_in.shape[1] - t, keys_in.shape[1], attn.head_dim
    w = attn.to_qkv.weight
    q = (x @ w[:d].T).view(b, t, H, hk)
    k = (keys_in @ w[d : 2 * d].T).view(b, s, H, hk)
    v = (keys_in @ w[2 * d :].T).view(b, s, H, hk)
    scores = torch.full((b, H, t, s), float("-inf"))
    r_of = {}  # W_R r_dist, per distance
    for i in range(t):
        for j in range(s):
            dist = m + i - j
            if attn.causal and dist < 0:
                continue
            if attn.options.clamp_len:
                dist = max(-attn.options.clamp_len, min(attn.options.clamp_len, dist))
            if dist not in r_of:
                r_of[dist] = attn.to_r(sinusoid_table(torch.tensor([dist]), d))[0].view(H, hk)
            r = r_of[dist]
            scores[:, :, i, j] = ((q[:, i] + attn.u) * k[:, j]).sum(-1) + ((q[:, i] + attn.v) * r).sum(-1)
    if pad is not None:
        scores = scores.masked_fill(~pad[:, None, None, :], float("-inf"))
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores * hk**-0.5, -1)
    out = torch.einsum("bhts,bshk->bthk", weights, v).reshape(b, t, d)
    return attn.to_out(out)


def test_rel_shift_moves_each_row_to_key_order():
    c, n, top = 4, 7, 9  # the last row is at distance 9 from key 0
    dist = torch.arange(top, top - (n + c - 1), -1).float()  # column p holds distance top - p
    scores = dist.expand(c, -1) * 100 + torch.arange(c)[:, None]  # value encodes (row, distance)
    out = rel_shift(scores, n)
    for r in range(c):
        for j in range(n):
            assert out[r, j] == (top - (c - 1 - r) - j) * 100 + r


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("clamp_len", [0, 3])
def test_attention_equals_naive_four_term_score(causal, clamp_len):
    attn = zoo.create_attention(
        "xl_rel", d_model=D, n_heads=H, causal=causal, mem_len=6, clamp_len=clamp_len, block_size=3
    ).eval()
    x, mem = torch.randn(2, 7, D), torch.randn(2, 5, D)
    got = attn(x, state=XLMemory(mem)).out
    want = naive_xl(attn, x, mem)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # the fused (SDPA) path taken without gradients
        torch.testing.assert_close(attn(x, state=XLMemory(mem)).out, want, atol=1e-5, rtol=1e-4)
    # and with padding in both the memory and the segment
    mem_pad = torch.tensor([[True] * 5, [False, False, True, True, True]])
    pad = torch.tensor([[True] * 5 + [False] * 2, [True] * 7])
    want = naive_xl(attn, x, mem, pad=torch.cat([mem_pad, pad], 1))
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            got = attn(x, state=XLMemory(mem, mem_pad), pad_mask=pad).out
        torch.testing.assert_close(got[pad], want[pad], atol=1e-5, rtol=1e-4)


def reference_same_length_mask(t: int, m: int, mem_len: int) -> torch.Tensor:
    """kimiyoung/transformer-xl's dec_attn_mask with same_length, restated: with s = m + t keys and
    mask_len = s - mem_len, query row i hides keys j > m + i (the future) and keys j <= i - shift, where
    shift = t - mask_len if mask_len > 0 else t. Returns the keys it keeps, bool [t, s]."""
    s = m + t
    mask_len = s - mem_len
    shift = t - mask_len if mask_len > 0 else t
    rows, cols = torch.arange(t)[:, None], torch.arange(s)[None, :]
    return ~((cols > m + rows) | (cols <= rows - shift))


@pytest.mark.parametrize("t, m, mem_len", [(7, 5, 5), (7, 0, 5), (4, 3, 9), (7, 6, 6)])
def test_same_length_equals_the_reference_mask(t, m, mem_len):
    """Each query sees the last mem_len keys up to itself, as the reference's same_length evaluation."""
    attn = zoo.create_attention("xl_rel", d_model=D, n_heads=H, causal=True, mem_len=mem_len, block_size=3).eval()
    x, mem = torch.randn(2, t, D), torch.randn(2, m, D) if m else None
    state = XLMemory(mem) if m else XLMemory()
    want = naive_xl(attn, x, mem, allowed=reference_same_length_mask(t, m, mem_len))
    with attn.evaluation_memory(same_length=True):
        for grad in (True, False):  # the written-out path and the fused one
            with torch.set_grad_enabled(grad):
                torch.testing.assert_close(attn(x, state=state).out, want, atol=1e-5, rtol=1e-4)
    assert not attn.options.same_length  # restored after the block
    if m + t > mem_len:  # it changes something only where some query would see more than mem_len keys
        assert not torch.allclose(attn(x, state=state).out, want, atol=1e-4)


def test_block_size_does_not_change_the_maths():
    x = torch.randn(2, 21, D)
    ref = zoo.create_attention("xl_rel", d_model=D, n_heads=H, causal=True, block_size=64).eval()
    out = ref(x).out
    for block in (1, 4, 7):
        other = zoo.create_attention("xl_rel", d_model=D, n_heads=H, causal=True, block_size=block).eval()
        other.load_state_dict(ref.state_dict())
        torch.testing.assert_close(other(x).out, out, atol=1e-5, rtol=1e-4)


def tiny(name, **extra):
    return zoo.create_model(name, **{**get_preset(name).tiny, **extra}).eval()


@pytest.mark.parametrize("name", XL_PRESETS)
def test_segment_with_memory_equals_one_pass(name):
    """Feeding s2 with the memory of s1 == one pass over s1 + s2, at s2's positions (mem_len >= len(s1))."""
    model = tiny(name, attention={"mem_len": 16})
    tokens = torch.randint(0, 32, (3, 26))
    full = model(tokens).logits
    first = model(tokens[:, :12], state=model.init_state(3))
    second = model(tokens[:, 12:], state=first.state)
    torch.testing.assert_close(second.logits, full[:, 12:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(first.logits, full[:, :12], atol=1e-4, rtol=1e-4)
    with torch.no_grad():  # evaluation path: the memory's keys/values are reused, not re-projected
        state = model(tokens[:, :12], state=model.init_state(3)).state
        assert state.layers[0].attention.keys is not None
        torch.testing.assert_close(model(tokens[:, 12:], state=state).logits, full[:, 12:], atol=1e-4, rtol=1e-4)


def test_eval_mem_len_keeps_a_longer_memory_in_eval_mode():
    """Training keeps mem_len states, evaluation eval_mem_len (Dai et al. 2019, Section 4.1); the
    memory's being detached, bounded and exact is the state contract's (tests/contracts/test_attention.py)."""
    model = tiny("transformer_xl", attention={"mem_len": 10, "eval_mem_len": 25}).train()
    state = model.init_state(2)
    for _ in range(2):
        state = model(torch.randint(0, 32, (2, 7)), state=state).state
    assert all(layer.attention.length == 10 for layer in state.layers)
    model.eval()  # evaluation keeps the longer memory
    with torch.no_grad():
        for _ in range(5):
            state = model(torch.randint(0, 32, (2, 7)), state=state).state
    assert all(layer.attention.length == 25 for layer in state.layers)
    assert set_eval_memory(model, 3) == model.config.n_layers
    state = model(torch.randint(0, 32, (2, 7)), state=state).state
    assert all(layer.attention.length == 3 for layer in state.layers)


def test_generate_through_the_memory_equals_greedy_full_passes():
    """generate() feeds one token at a time through the memory: same as greedy decoding by full passes."""
    model = tiny("transformer_xl", attention={"mem_len": 64})
    prompt = torch.randint(0, 32, (2, 5))
    generated = model.generate(prompt, 6, greedy=True)
    seq = prompt
    for _ in range(6):
        seq = torch.cat([seq, model(seq).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(generated, seq)


def test_eval_memory_reaches_further_than_one_segment():
    """With memory, the last token of s2 depends on s1; with mem_len=0 it does not."""
    for mem_len, should_depend in ((16, True), (0, False)):
        model = tiny("transformer_xl", attention={"mem_len": mem_len})
        s1, s2 = torch.randint(0, 32, (1, 8)), torch.randint(0, 32, (1, 8))
        state = model(s1, state=model.init_state(1)).state
        other = model((s1 + 1) % 32, state=model.init_state(1)).state
        a, b = model(s2, state=state).logits, model(s2, state=other).logits
        assert (not torch.allclose(a, b)) == should_depend


def test_bad_memory_and_options_are_refused():
    with pytest.raises(ValueError, match="mem_len"):
        zoo.create_model("transformer_xl", **{**get_preset("transformer_xl").tiny, "attention": {"mem_len": -1}})
    with pytest.raises(ValueError, match="clamp_len"):
        zoo.create_attention("xl_rel", d_model=D, n_heads=H, causal=True, clamp_len=-2)
    model = tiny("transformer_xl")
    state = model(torch.randint(0, 32, (2, 6)), state=model.init_state(2)).state
    with pytest.raises(ValueError, match="batch size"):
        model(torch.randint(0, 32, (3, 6)), state=state)
    with pytest.raises(ValueError, match="different model"):
        tiny("gtrxl")(torch.randint(0, 32, (2, 6)), state=state)
    with pytest.raises(ValueError, match="float64"):
        model.double()(torch.randint(0, 32, (2, 6)), state=state)
    attn = zoo.create_attention("xl_rel", d_model=D, n_heads=H, causal=True)
    with pytest.raises(ValueError, match="batch size"):
        attn(torch.randn(2, 5, D), state=XLMemory(torch.randn(3, 4, D)))
    with pytest.raises(ValueError, match="d_model"):
        attn(torch.randn(2, 5, D), state=XLMemory(torch.randn(2, 4, D + 8)))
    with pytest.raises(ValueError, match="XLMemory"):
        attn(torch.randn(2, 5, D), state=[torch.randn(2, 4, D)])


def test_gru_gate_matches_its_equations_and_starts_near_identity():
    torch.manual_seed(0)
    gate = GRUGate(64)
    x, y = torch.randn(4, 9, 64), torch.relu(torch.randn(4, 9, 64))
    wr, wz, wg = gate.from_y.weight.chunk(3)
    ur, uz = gate.from_x.weight.chunk(2)
    r = torch.sigmoid(y @ wr.T + x @ ur.T)
    z = torch.sigmoid(y @ wz.T + x @ uz.T - 2.0)
    h = torch.tanh(y @ wg.T + (r * x) @ gate.from_rx.weight.T)
    torch.testing.assert_close(gate.gate(x, y), (1 - z) * x + z * h)
    # near the identity at initialisation: the mean update gate is about sigmoid(-2) = 0.12
    assert abs(z.mean().item() - torch.sigmoid(torch.tensor(-2.0)).item()) < 0.03
    deviation = (gate.gate(x, y) - x).norm() / x.norm()
    open_gate = GRUGate(64, gate_bias=0.0)
    open_gate.load_state_dict({**gate.state_dict(), "gate_bias": torch.zeros(64)})
    assert deviation < 0.2 and deviation < 0.5 * (open_gate.gate(x, y) - x).norm() / x.norm()
    # a whole gated block starts close to the identity too
    model = tiny("gtrxl")
    block = model.stack.blocks[0]
    xs = torch.randn(2, 10, model.config.d_model)
    assert (block(xs).x - xs).norm() / xs.norm() < 0.35


def test_identity_map_reordering_is_x_plus_relu_of_normed_sublayer():
    res = IdentityMapReordered(16)
    x = torch.randn(2, 5, 16)
    lin = torch.nn.Linear(16, 16)
    torch.testing.assert_close(res(x, lin), x + torch.relu(lin(res.norm(x))))


def test_delayed_recall_batch_layout():
    from zoo.data.delayed_recall import delayed_recall_batch, vocab_size

    batch = delayed_recall_batch(64, n_segments=3, segment_len=8, generator=torch.Generator().manual_seed(0))
    tokens, targets, cue = batch["tokens"], batch["targets"], batch["cue"]
    assert tokens.shape == targets.shape == (64, 24) and int(tokens.max()) < vocab_size()
    queries = torch.tensor([7, 15, 23])
    assert (tokens[:, queries] == 0).all() and (targets[:, queries] == cue[:, None]).all()
    others = torch.ones(24, dtype=torch.bool)
    others[queries] = False
    assert (targets[:, others] == -100).all()
    is_cue = (tokens >= 1) & (tokens <= 8)
    assert (is_cue[:, :7].sum(1) == 1).all() and not is_cue[:, 8:].any(), "one cue, in segment 0 only"
    with pytest.raises(ValueError, match="segment_len"):
        delayed_recall_batch(2, segment_len=1)


def test_share_biases_ties_u_and_v_across_layers():
    """The paper's and the reference code's one (u, v) pair for the model (``share_biases``)."""
    tiny = get_preset("transformer_xl").tiny
    shared = zoo.create_model("transformer_xl", **{**tiny, "attention": {**tiny["attention"], "share_biases": True}})
    own = zoo.create_model("transformer_xl", **tiny)
    layers = [block.attention for block in shared.stack.blocks]
    assert all(a.u is layers[0].u and a.v is layers[0].v for a in layers)
    saved = sum(p.numel() for p in own.parameters()) - sum(p.numel() for p in shared.parameters())
    assert saved == (len(layers) - 1) * 2 * layers[0].u.numel()
