"""Positions inside attention against references we did not write, weights copied.

- x-transformers (``make peers``): its ``Attention`` layer with its ``RotaryEmbedding``,
  ``AlibiPositionalBias`` and T5 ``RelativePositionBias``, against ``vanilla`` built with ``rope``,
  ``alibi`` and ``t5_bias`` (q/k/v/out weights copied; T5's table copied with x-transformers' scale
  folded in: it adds table x sqrt(d_head) to the scaled scores, we add the table). Also the failure
  its users reported for its KV cache with rotary (lucidrains/x-transformers#311): ours token by token
  through the cache equals its full pass.
- HF transformers (if installed): a Llama attention layer (``rotate_half`` layout, theta 500,000)
  against ``vanilla`` with ``position.layout=halves``; and the paper's pair layout against it with
  W_q, W_k rows permuted (the two layouts are one rotation on permuted dimensions).

Both skip cleanly when their library is absent (neither is in the default install).
"""

from __future__ import annotations

import math

import pytest
import torch

import zoo
from zoo.position.base import POSITION
from zoo.position.t5_bias import relative_bucket

D, H, T = 64, 4, 300  # head dim 16; T past T5's max_distance 128 and several of our query blocks
K = D // H


def position(name: str, **options):
    return POSITION.get(name)(D, 512, n_heads=H, **options)


def ours(part, causal=True, **options):
    return zoo.create_attention("vanilla", d_model=D, n_heads=H, causal=causal, bias=False, position=part, **options)


def copy_projections(mine, theirs) -> None:
    with torch.no_grad():
        mine.to_q.weight.copy_(theirs.to_q.weight)
        mine.to_k.weight.copy_(theirs.to_k.weight)
        mine.to_v.weight.copy_(theirs.to_v.weight)
        mine.to_out.weight.copy_(theirs.to_out.weight)


def x_attention(causal: bool):
    xt = pytest.importorskip("x_transformers.x_transformers")
    return xt, xt.Attention(dim=D, dim_head=K, heads=H, causal=causal).eval()


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
def test_rope_equals_x_transformers_rotary(causal):
    xt, theirs = x_attention(causal)
    part = position("rope")  # the pair layout, x-transformers' too
    mine = ours(part, causal).eval()
    copy_projections(mine, theirs)
    x = torch.randn(2, T, D)
    freqs = xt.RotaryEmbedding(K).forward_from_seq_len(T)
    with torch.no_grad():
        torch.testing.assert_close(mine(x).out, theirs(x, rotary_pos_emb=freqs), atol=2e-5, rtol=1e-4)


def test_partial_rope_equals_x_transformers_partial_rotary():
    xt, theirs = x_attention(True)
    part = position("rope", fraction=0.5)  # x-transformers' rotary_emb_dim = half the head
    mine = ours(part).eval()
    copy_projections(mine, theirs)
    x = torch.randn(2, T, D)
    freqs = xt.RotaryEmbedding(K // 2).forward_from_seq_len(T)
    with torch.no_grad():
        torch.testing.assert_close(mine(x).out, theirs(x, rotary_pos_emb=freqs), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("heads", [4, 6], ids=["4-heads", "6-heads"])
def test_alibi_slopes_and_layer_equal_x_transformers(heads):
    """Six heads: the paper's rule for a head count that is not a power of two."""
    xt = pytest.importorskip("x_transformers.x_transformers")
    d = heads * K
    part = POSITION.get("alibi")(d, 512, n_heads=heads)
    reference = xt.AlibiPositionalBias(heads=heads)
    torch.testing.assert_close(part.slopes, reference.slopes.flatten())
    for causal in (True, False):
        theirs = xt.Attention(dim=d, dim_head=K, heads=heads, causal=causal).eval()
        mine = zoo.create_attention("vanilla", d_model=d, n_heads=heads, causal=causal, bias=False, position=part)
        copy_projections(mine, theirs)
        x = torch.randn(2, T, d)
        with torch.no_grad():
            torch.testing.assert_close(mine.eval()(x).out, theirs(x, rel_pos=reference), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
def test_t5_bias_equals_x_transformers_relative_position_bias(causal):
    xt, theirs = x_attention(causal)
    reference = xt.RelativePositionBias(scale=K**0.5, causal=causal, num_buckets=32, max_distance=128, heads=H)
    part = position("t5_bias")
    with torch.no_grad():
        part.table.copy_(reference.relative_attention_bias.weight * K**0.5)  # their scale, folded in
    mine = ours(part, causal).eval()
    copy_projections(mine, theirs)
    x = torch.randn(2, T, D)
    with torch.no_grad():
        torch.testing.assert_close(mine(x).out, theirs(x, rel_pos=reference), atol=2e-5, rtol=1e-4)
    distance = torch.arange(-400, 400)  # the bucket rule itself, over both directions and past max_distance
    theirs_bucket = reference._relative_position_bucket(-distance, causal=causal, num_buckets=32, max_distance=128)
    mine_bucket = relative_bucket(distance, causal=causal, buckets=32, max_distance=128)
    assert torch.equal(mine_bucket, theirs_bucket)


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_token_by_token_through_the_cache_equals_x_transformers_full_pass(name):
    """x-transformers#311: its KV cache with rotary gave other logits than the full pass. Ours, fed one
    token at a time (and in uneven pieces) through the cache, equals its full pass."""
    xt, theirs = x_attention(True)
    part = position(name)
    mine = ours(part).eval()
    copy_projections(mine, theirs)
    x = torch.randn(2, 70, D)
    with torch.no_grad():
        if name == "rope":
            full = theirs(x, rotary_pos_emb=xt.RotaryEmbedding(K).forward_from_seq_len(70))
        else:
            full = theirs(x, rel_pos=xt.AlibiPositionalBias(heads=H))
        for pieces in ([1] * 70, [13, 1, 30, 26]):
            state, outs, start = mine.init_state(2), [], 0
            for n in pieces:
                result = mine(x[:, start : start + n], state=state)
                state, start = result.state, start + n
                outs.append(result.out)
            torch.testing.assert_close(torch.cat(outs, 1), full, atol=2e-5, rtol=1e-4)


def llama_attention(theta: float):
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    config = llama.LlamaConfig(
        hidden_size=D, num_attention_heads=H, num_key_value_heads=H, attention_bias=False, rope_theta=theta
    )
    config._attn_implementation = "eager"
    layer = llama.LlamaAttention(config, layer_idx=0).eval()
    rotary = llama.LlamaRotaryEmbedding(config)
    return layer, rotary


def llama_out(layer, rotary, x: torch.Tensor) -> torch.Tensor:
    t = x.shape[1]
    cos, sin = rotary(x, torch.arange(t)[None])
    causal = torch.full((t, t), float("-inf")).triu(1)[None, None]
    return layer(x, position_embeddings=(cos, sin), attention_mask=causal)[0]


@pytest.mark.parametrize("layout", ["halves", "pairs"])
def test_rope_equals_hf_llama_attention(layout):
    """HF's rotate_half pairs dimension i with i + r/2. ``halves`` copies the weights as they are;
    ``pairs`` (the paper's) equals it once W_q and W_k rows are permuted per head to (0, r/2, 1, r/2 + 1, ...)."""
    layer, rotary = llama_attention(500000.0)
    mine = ours(position("rope", base=500000.0, layout=layout)).eval()
    order = torch.arange(K).view(2, K // 2).t().flatten()  # pair layout index -> halves index
    rows = (torch.arange(H)[:, None] * K + (order if layout == "pairs" else torch.arange(K))[None]).flatten()
    with torch.no_grad():
        mine.to_q.weight.copy_(layer.q_proj.weight[rows])
        mine.to_k.weight.copy_(layer.k_proj.weight[rows])
        mine.to_v.weight.copy_(layer.v_proj.weight)
        mine.to_out.weight.copy_(layer.o_proj.weight)
        x = torch.randn(2, T, D)
        torch.testing.assert_close(mine(x).out, llama_out(layer, rotary, x), atol=2e-5, rtol=1e-4)


def test_rope_angles_stay_exact_far_into_a_stream():
    """At position 10^6 the rotation still equals float64 maths (angles are computed in float64)."""
    part = position("rope")
    x = torch.randn(1, 1, 3, K, dtype=torch.float64)
    positions = torch.tensor([0, 999_999, 1_000_000])
    got = part.rotate(x.float(), positions).double()
    theta = 10000.0 ** (-torch.arange(0, K, 2, dtype=torch.float64) / K)
    angle = positions.double()[:, None] * theta
    a, b = x[..., 0::2], x[..., 1::2]
    want = torch.stack([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()], -1).flatten(-2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert math.isclose(float(part.inv_freq[1]), 10000.0 ** (-2 / K), rel_tol=1e-12)
