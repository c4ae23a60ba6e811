"""The schemes acting inside attention, part by part: their papers' numbers, their options, and
StreamingLLM's numbering inside a cache (``cache_positions``)."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.position.alibi import slopes
from zoo.position.base import POSITION
from zoo.position.t5_bias import relative_bucket

D, H = 32, 4


def test_alibi_slopes_follow_the_paper():
    """8 heads: 1/2 ... 1/256 (Section 3); 16: the geometric means in between; a head count that is not a
    power of two: the lower power's slopes, then every other slope of the next power (the paper's code)."""
    assert slopes(8) == pytest.approx([2.0**-i for i in range(1, 9)])
    assert slopes(16) == pytest.approx([2.0 ** (-i / 2) for i in range(1, 17)])
    assert slopes(6) == pytest.approx([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3])
    alibi = POSITION.get("alibi")(D, 64, n_heads=H)
    bias = alibi.bias(torch.tensor([[0, 3], [-3, 7]]), causal=False)
    torch.testing.assert_close(bias[1], -torch.tensor([[0.0, 3.0], [3.0, 7.0]]) / 16)  # symmetric, slope 1/16


def test_t5_buckets_are_exact_near_then_logarithmic_then_capped():
    distance = torch.arange(0, 300)
    causal = relative_bucket(distance, causal=True, buckets=32, max_distance=128)
    assert torch.equal(causal[:16], torch.arange(16))  # B/2 exact buckets
    assert bool((causal.diff() >= 0).all()) and int(causal[128:].min()) == 31 == int(causal.max())
    both = relative_bucket(torch.cat([-distance, distance]), causal=False, buckets=32, max_distance=128)
    later, earlier = both[1:300], both[300:]  # keys after the query take the upper half, earlier ones the lower
    assert int(later.min()) == 17 and int(later.max()) == 31 and int(earlier.max()) == 15
    assert torch.equal(relative_bucket(-distance, causal=True, buckets=32, max_distance=128), torch.zeros(300).long())


def test_rope_options_are_checked_and_the_layouts_are_one_rotation_on_permuted_dimensions():
    with pytest.raises(ValueError, match="rotates no pair"):
        POSITION.get("rope")(D, 64, n_heads=H, fraction=0.1)
    with pytest.raises(ValueError, match="layout"):
        POSITION.get("rope")(D, 64, n_heads=H, layout="interleaved")
    pairs, halves = (POSITION.get("rope")(D, 64, n_heads=H, layout=layout) for layout in ("pairs", "halves"))
    x, positions = torch.randn(2, H, 5, D // H), torch.arange(3, 8)
    order = torch.arange(D // H).view(2, -1).t().flatten()  # pair index -> halves index
    torch.testing.assert_close(pairs.rotate(x[..., order], positions), halves.rotate(x, positions)[..., order])


def test_the_universal_stack_refuses_a_second_owner_of_positions():
    with pytest.raises(ValueError, match="positions would be added twice"):
        zoo.create_model("universal_transformer", vocab_size=16, d_model=D, n_heads=H, position={"name": "rope"})


def attention(scheme: str, cache_positions: bool):
    part = POSITION.get(scheme)(D, 64, n_heads=H, cache_positions=cache_positions)
    return zoo.create_attention("vanilla", d_model=D, n_heads=H, causal=True, max_cache=8, sinks=2, position=part)


@pytest.mark.parametrize("scheme", ["rope", "alibi", "t5_bias"])
def test_cache_positions_number_the_keys_by_their_place_in_the_cache(scheme):
    """StreamingLLM (Xiao et al. 2023, Section 3.2): after eviction the next token is scored as if the cache
    (2 sinks + the 6 most recent keys) and itself were a fresh sequence at positions 0 ... 8 (one layer:
    the keys are the layer's own projections, so recomputing the kept tokens gives the same keys). Before
    eviction it equals one call; without the option the stream's own positions are kept instead."""
    torch.manual_seed(0)
    attn = attention(scheme, True).eval()
    plain = attention(scheme, False).eval()
    plain.load_state_dict(attn.state_dict())
    x = torch.randn(2, 30, D)
    with torch.no_grad():
        state, outs = attn.init_state(2), []
        for i in range(30):
            result = attn(x[:, i : i + 1], state=state)
            state = result.state
            outs.append(result.out)
        torch.testing.assert_close(torch.cat(outs[:8], 1), attn(x[:, :8]).out, atol=1e-5, rtol=1e-4)
        kept = [0, 1, *range(23, 29), 29]  # what the cache held when token 29 came, and token 29
        torch.testing.assert_close(outs[-1][:, 0], attn(x[:, kept]).out[:, -1], atol=1e-5, rtol=1e-4)
        state, last = plain.init_state(2), None
        for i in range(30):
            result = plain(x[:, i : i + 1], state=state)
            state, last = result.state, result.out
        assert not torch.allclose(last[:, 0], outs[-1][:, 0], atol=1e-4), "the stream's positions differ here"


def test_cache_positions_is_refused_where_a_state_does_not_number_its_keys():
    part = POSITION.get("rope")(D, 64, n_heads=H, cache_positions=True)
    with pytest.raises(ValueError, match="cache_positions"):
        zoo.create_attention("local_1d", d_model=D, n_heads=H, causal=True, position=part)


@pytest.mark.parametrize("scheme", ["rope", "alibi", "t5_bias"])
def test_adaptive_span_with_the_scheme_and_a_cache_equals_the_dense_reference(scheme):
    """Eq. (4) of Sukhbaatar et al. over every pair, with the scheme: keys at distances 1 ... S weighted
    m_z(x) exp(s), s = q . k / sqrt(k) + b(x) (or rotated q, k at their positions in the stream); across a
    cache of 15 inputs, blocks not dividing t; forward and the T5 table's gradient."""
    from zoo.attention.adaptive_span import SpanCache, soft_mask

    part = POSITION.get(scheme)(D, 64, n_heads=H).double()
    attn = zoo.create_attention(
        "adaptive_span", d_model=D, n_heads=H, causal=True, max_span=12, ramp=4, block_size=5, position=part
    ).double()
    with torch.no_grad():
        attn.span_param.copy_(torch.tensor([0.0, 2.5, 7.0, 12.0]) / 12)
    g = torch.Generator().manual_seed(1)
    past, x = (torch.randn(2, n, D, generator=g, dtype=torch.float64) for n in (15, 20))
    out = attn(x, state=SpanCache(past, next=15)).out

    inputs = torch.cat([past, x], 1)
    q, k, v = attn.split_heads(attn.to_q(x)), attn.split_heads(attn.to_k(inputs)), attn.split_heads(attn.to_v(inputs))
    distance = torch.arange(20)[:, None] + 15 - torch.arange(35)[None, :]  # [t, s]
    scores = torch.einsum("bhtk,bhsk->bhts", attn.rotate(q, torch.arange(15, 35)), attn.rotate(k, torch.arange(35)))
    scores = scores * (D // H) ** -0.5
    if part.pair_bias:
        scores = scores + part.bias(distance, causal=True).double()
    mask = soft_mask(distance.double(), attn.spans(x)[:, None, None], 4) * (distance >= 1) * (distance <= 12)
    weights = mask * torch.exp(scores - scores.amax(-1, keepdim=True))
    weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-300)
    reference = attn.to_out(attn.merge_heads(torch.einsum("bhts,bhsk->bhtk", weights, v)))
    torch.testing.assert_close(out, reference, atol=1e-10, rtol=1e-8)
    if scheme == "t5_bias":
        (ours,) = torch.autograd.grad(out.square().sum(), part.table, retain_graph=True)
        (theirs,) = torch.autograd.grad(reference.square().sum(), part.table)
        assert ours.abs().sum() > 0
        torch.testing.assert_close(ours, theirs, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
def test_dense_attention_with_t5_in_query_blocks_gives_the_dense_gradients(causal):
    """vanilla's blocked pair bias (each block's mask a view of one distance vector, recomputed in backward)
    against softmax(q k^T / sqrt(k) + table[bucket(i - j)]) v over the whole [t, t], float64, with padding:
    the output, and the gradients of the table and of the projections."""
    part = POSITION.get("t5_bias")(D, 512, n_heads=H).double()
    attn = zoo.create_attention("vanilla", d_model=D, n_heads=H, causal=causal, position=part).double()
    x = torch.randn(2, 300, D, dtype=torch.float64)  # two query blocks of 256
    pad = torch.ones(2, 300, dtype=torch.bool)
    pad[1, :40] = False
    q, k, v = (attn.split_heads(proj(x)) for proj in (attn.to_q, attn.to_k, attn.to_v))
    i = torch.arange(300)
    scores = torch.einsum("bhtk,bhsk->bhts", q, k) * (D // H) ** -0.5 + part.bias(
        i[:, None] - i[None, :], causal=causal
    )
    allowed = pad[:, None, None, :] & ((i[:, None] >= i[None, :]) if causal else True)
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
    reference = attn.to_out(attn.merge_heads(torch.einsum("bhts,bhsk->bhtk", weights, v)))
    out = attn(x, pad_mask=pad).out
    real = pad if causal else torch.ones_like(pad)  # a causal padded query sees nothing: both give bias-only rows
    torch.testing.assert_close(out[real], reference[real], atol=1e-10, rtol=1e-8)
    weight = torch.randn_like(out) * real[..., None]
    ours = torch.autograd.grad((out * weight).sum(), (part.table, attn.to_q.weight), retain_graph=True)
    theirs = torch.autograd.grad((reference * weight).sum(), (part.table, attn.to_q.weight))
    for got, want in zip(ours, theirs):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("scheme", ["rope", "alibi", "t5_bias"])
def test_a_bounded_cache_keeps_every_key_at_its_true_distance(scheme):
    """The recurrence x-transformers' users saw break with rotary and ALiBi (lucidrains/x-transformers#223,
    #242): a bounded cache carried past its size. With one layer, token i fed after a stream sees the 8
    most recent keys; with a relative scheme that is exactly one call over x[i - 8 ... i], wherever the
    stream started (positions in the stream, distances preserved)."""
    part = POSITION.get(scheme)(D, 64, n_heads=H)
    attn = zoo.create_attention("vanilla", d_model=D, n_heads=H, causal=True, max_cache=8, position=part).eval()
    x = torch.randn(2, 40, D)
    with torch.no_grad():
        state = attn.init_state(2)
        for start in range(0, 40, 5):  # segments of 5: the cache evicts in the middle of them
            result = attn(x[:, start : start + 5], state=state)
            state = result.state
            for offset in range(5):  # query start + offset sees the 8 keys before it (cache of 8 + its segment)
                i = start + offset
                window = attn(x[:, max(0, i - 8 - offset) : i + 1]).out[:, -1]
                if i >= 8 + offset:
                    torch.testing.assert_close(result.out[:, offset], window, atol=1e-5, rtol=1e-4)
