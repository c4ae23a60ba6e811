"""The projection options every mechanism takes or refuses (zoo/attention/projections.py).

By flag (``projection_features``), never by name: grouped-query attention (``n_kv_heads``) equals the
same mechanism with every query head given its own copy of its group's key/value weights, and where the
mechanism keeps a state, segments and token by token equal one call while the state holds n_heads /
n_kv_heads times fewer bytes (as ``zoo.bench --generate`` counts them); QK-norm makes a layer blind to
the scale of its query and key weights; soft-capping equals the written-out cap * tanh(scores / cap).
A mechanism without a feature refuses it when built, with its reason.
"""

from __future__ import annotations

import pytest
import torch
from test_attention import run_stream

import zoo
from zoo.attention.base import ATTENTION, causal_allowed
from zoo.bench.generate import state_bytes
from zoo.models.base import map_tensors

D, H, KV = 32, 4, 2
NAMES = zoo.list_attention()


def has(name, feature):
    return feature in ATTENTION.get(name).projection_features


def modes(name):
    cls = ATTENTION.get(name)
    return [True] if cls.causal_only else [False, True] if cls.supports_causal else [False]


def build(name, causal, seed=0, **extra):
    torch.manual_seed(seed)
    cls = ATTENTION.get(name)
    return zoo.create_attention(name, d_model=D, n_heads=H, causal=causal, **{**cls.contract_options(), **extra}).eval()


def inputs(t, seed=0):
    return torch.randn(2, t, D, generator=torch.Generator().manual_seed(seed))


def widened(grouped, name, causal):
    """The same mechanism with n_kv_heads = n_heads whose key/value heads are copies of ``grouped``'s:
    query head i reads key head i // (H / KV), the grouping GQA promises."""
    full = build(name, causal)
    state = dict(grouped.state_dict())
    for key, value in state.items():
        if key.split(".")[0] in ("to_k", "to_v"):
            heads = value.unflatten(0, (KV, -1))
            state[key] = heads.repeat_interleave(H // KV, dim=0).flatten(0, 1)
    full.load_state_dict(state)
    return full


GROUPED = [(n, c) for n in NAMES if has(n, "grouped_kv") for c in modes(n)]


@pytest.mark.parametrize("name,causal", GROUPED, ids=[f"{n}-{'causal' if c else 'bidir'}" for n, c in GROUPED])
def test_grouped_kv_equals_every_head_with_its_groups_keys(name, causal):
    grouped = build(name, causal, n_kv_heads=KV)
    assert grouped.to_k.weight.shape[0] == KV * D // H  # fewer key/value parameters, as asked
    full = widened(grouped, name, causal)
    mask = torch.ones(2, 19, dtype=torch.bool)
    mask[1, 13:] = False
    for pad_mask in (None, mask):
        x = inputs(19)
        torch.testing.assert_close(grouped(x, pad_mask=pad_mask).out, full(x, pad_mask=pad_mask).out)


STREAMING = [n for n in NAMES if has(n, "grouped_kv") and ATTENTION.get(n).supports_memory]


@pytest.mark.parametrize("name", STREAMING)
def test_grouped_kv_streams_exactly_with_a_state_smaller_by_the_group(name):
    grouped = build(name, True, n_kv_heads=KV)
    contract = ATTENTION.get(name).contract_state()
    total = min(33, contract.exact_for or 33)
    x = inputs(total, seed=3)
    whole = grouped(x).out
    one_by_one, state = run_stream(grouped, x, [1] * total)
    segments, _ = run_stream(grouped, x, [5, 1, total - 6])
    torch.testing.assert_close(one_by_one, whole, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(segments, whole, atol=1e-5, rtol=1e-4)
    _, ungrouped = run_stream(build(name, True), x, [1] * total)
    assert key_value_bytes(state) * (H // KV) == key_value_bytes(ungrouped) > 0
    # what zoo.bench --generate reports: smaller by the keys and values saved (positions, padding stay)
    assert state_bytes(ungrouped) - state_bytes(state) == key_value_bytes(state) * (H // KV - 1)


def key_value_bytes(state):
    """Bytes of the cached keys and values of a state: its float tensors laid out per head [b, h, s, k] (not
    their positions, nor what is kept per block of the model width, as Sinkhorn's block sums [b, n, d])."""
    found = []
    map_tensors(state, lambda v: found.append(v) or v)
    return sum(v.nbytes for v in found if v.is_floating_point() and v.dim() == 4)


def test_multi_query_attention_keeps_one_key_head_in_the_kv_cache():
    model = zoo.create_model("vanilla_lm", vocab_size=16, d_model=D, n_heads=H, n_layers=2, d_ff=48)
    mqa = zoo.create_model(
        "vanilla_lm", vocab_size=16, d_model=D, n_heads=H, n_layers=2, d_ff=48, attention={"n_kv_heads": 1}
    )
    tokens = torch.randint(0, 16, (1, 12))
    full, single = (m.eval()(tokens, state=m.init_state(1)).state for m in (model, mqa))
    assert state_bytes(single) * H == state_bytes(full)
    assert single.layers[0].attention.k.shape[1] == 1


@pytest.mark.parametrize("name", [n for n in NAMES if not has(n, "grouped_kv")])
def test_a_mechanism_without_grouped_kv_refuses_it_with_the_reason(name):
    cls = ATTENTION.get(name)
    with pytest.raises(ValueError, match=f"cannot take n_kv_heads=2: {cls.no_projection_reason[:20]}"):
        build(name, modes(name)[-1], n_kv_heads=KV)


@pytest.mark.parametrize("bad", [3, 8])
def test_n_kv_heads_must_divide_n_heads(bad):
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        build("vanilla", True, n_kv_heads=bad)


QK = [(n, c) for n in NAMES if has(n, "qk_norm") for c in modes(n)]


@pytest.mark.parametrize("name,causal", QK, ids=[f"{n}-{'causal' if c else 'bidir'}" for n, c in QK])
def test_qk_norm_makes_the_layer_blind_to_the_scale_of_its_query_and_key_weights(name, causal):
    """RMSNorm per head divides out a scale of W_q, b_q (and of W_k, b_k); without the norm the scores
    change (checked too, so the test can tell the norm is there)."""
    x = inputs(19)
    for norm in ("rmsnorm", "none"):
        attn = build(name, causal, qk_norm=norm)
        before = attn(x).out
        with torch.no_grad():
            for proj in (attn.to_q, attn.to_k):
                proj.weight.mul_(7.0)
                if proj.bias is not None:
                    proj.bias.mul_(7.0)
        after = attn(x).out
        if norm == "rmsnorm":
            torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-4)
        else:
            assert not torch.allclose(after, before, atol=1e-3)


@pytest.mark.parametrize("name", [n for n in NAMES if not has(n, "qk_norm")])
def test_a_mechanism_without_qk_norm_refuses_it_with_the_reason(name):
    with pytest.raises(ValueError, match="cannot take qk_norm='rmsnorm'"):
        build(name, modes(name)[-1], qk_norm="rmsnorm")


def test_qk_norm_weights_are_per_head_and_trained():
    attn = build("vanilla", True, qk_norm="rmsnorm", n_kv_heads=KV)
    assert attn.to_q.head_norm.weight.shape == (D // H,) and attn.to_k.head_norm.weight.shape == (D // H,)
    attn(inputs(7)).out.sum().backward()
    assert attn.to_q.head_norm.weight.grad is not None and attn.to_k.head_norm.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("causal", [False, True])
def test_softcap_equals_the_written_out_capped_scores(causal):
    cap, t = 2.0, 300  # longer than one block of queries
    attn = build("vanilla", causal, softcap=cap, n_kv_heads=KV).double()
    x = inputs(t).double()
    q = attn.split_heads(attn.to_q(x))
    k, v = (attn.split_heads(p(x)).repeat_interleave(H // KV, 1) for p in (attn.to_k, attn.to_v))
    scores = cap * torch.tanh(q @ k.transpose(-1, -2) / (D // H) ** 0.5 / cap)
    if causal:
        scores = scores.masked_fill(~causal_allowed(t, t), float("-inf"))
    want = attn.to_out(attn.merge_heads(torch.softmax(scores, -1) @ v))
    torch.testing.assert_close(attn(x).out, want)
    uncapped = build("vanilla", causal, n_kv_heads=KV).double()
    assert not torch.allclose(uncapped(x).out, want, atol=1e-3)  # the cap changed the scores


@pytest.mark.parametrize("name", [n for n in NAMES if not has(n, "softcap")])
def test_a_mechanism_without_softcap_refuses_it_with_the_reason(name):
    with pytest.raises(ValueError, match="cannot take softcap=30.0"):
        build(name, modes(name)[-1], softcap=30.0)


def test_softcap_streams_and_takes_a_pair_bias():
    model = zoo.create_model(
        "vanilla_lm",
        vocab_size=16,
        d_model=D,
        n_heads=H,
        n_layers=2,
        d_ff=48,
        dropout=0.0,
        position="alibi",
        attention={"softcap": 3.0, "n_kv_heads": 1},
    ).eval()
    tokens = torch.randint(0, 16, (2, 20))
    state, outs = model.init_state(2), []
    for i in range(20):
        out = model(tokens[:, i : i + 1], state=state)
        state = out.state
        outs.append(out.logits)
    torch.testing.assert_close(torch.cat(outs, 1), model(tokens).logits, atol=1e-5, rtol=1e-4)
