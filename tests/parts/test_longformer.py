"""``longformer`` against HF transformers' LongformerSelfAttention (the version installed by the
``references`` extra; 5.24.0 when written): weights copied, float64 (theirs computes its softmax in float32,
so the tolerance is 1e-6), window 8, the first two tokens global with their own projections, right
padding. Dilation, which HF does not implement, against the paper's rule written out as a dense mask."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.attention.base import reference_attention

D, H = 32, 4


def copy_into_hf(attn, ref):
    with torch.no_grad():
        for ours, theirs in (
            (attn.to_q, ref.query),
            (attn.to_k, ref.key),
            (attn.to_v, ref.value),
            (attn.global_rows["q"], ref.query_global),
            (attn.global_rows["k"], ref.key_global),
            (attn.global_rows["v"], ref.value_global),
        ):
            theirs.weight.copy_(ours.weight)
            theirs.bias.copy_(ours.bias)


def test_longformer_equals_hf_longformer_self_attention():
    transformers = pytest.importorskip("transformers")
    from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

    torch.manual_seed(0)
    config = transformers.LongformerConfig(
        hidden_size=D, num_attention_heads=H, attention_window=[8], attention_probs_dropout_prob=0.0
    )
    ref = LongformerSelfAttention(config, layer_id=0).double().eval()
    attn = zoo.create_attention("longformer", d_model=D, n_heads=H, window=8, global_tokens=2).double().eval()
    copy_into_hf(attn, ref)
    t = 48
    x = torch.randn(2, t, D, dtype=torch.float64)
    pad = torch.ones(2, t, dtype=torch.bool)
    pad[1, 37:] = False
    mask = torch.zeros(2, t, dtype=torch.float64)  # theirs: -10000 padding, 0 local, +10000 global
    mask[~pad] = -10000.0
    mask[:, :2] = 10000.0
    with torch.no_grad():
        (out,) = ref(
            x,
            attention_mask=mask,
            is_index_masked=mask < 0,
            is_index_global_attn=mask > 0,
            is_global_attn=True,
        )[:1]
        expected = attn.to_out(out)
        ours = attn(x, pad_mask=pad).out
    torch.testing.assert_close(ours[pad], expected[pad], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_dilated_window_and_global_tokens_follow_the_papers_rule(causal):
    """Query i sees i + r d for |r| <= w (causal: 0 <= -r <= w) and the g first positions; a global row
    every key (causal: every earlier one). Dense masked reference over the ordinary projections."""
    torch.manual_seed(1)
    w, d, g, t = 3, 3, 2, 41
    attn = (
        zoo.create_attention(
            "longformer",
            d_model=D,
            n_heads=H,
            causal=causal,
            window=2 * w,
            dilation=d,
            global_tokens=g,
            global_projections=False,
        )
        .double()
        .eval()
    )
    x = torch.randn(2, t, D, dtype=torch.float64)
    q, k, v = (attn.split_heads(p(x)) for p in (attn.to_q, attn.to_k, attn.to_v))
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    back = i - j
    window = (back % d == 0) & ((back >= 0) & (back <= w * d) if causal else back.abs() <= w * d)
    allowed = window | (j < g) | (i < g)
    if causal:
        allowed &= back >= 0
    expected = attn.to_out(attn.merge_heads(reference_attention(q, k, v, allowed)))
    torch.testing.assert_close(attn(x).out, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("scheme", ["rope", "alibi", "t5_bias"])
@pytest.mark.parametrize("causal", [False, True])
def test_positions_inside_longformer_equal_dense_attention_under_its_rule(scheme, causal):
    """rope (q and k rotated at their positions, the global rows' Q_g and K_g too) and a pair bias
    b_h(i - j) on every pair Longformer scores: the dilated window (each residue class at its own
    positions), the global keys, the global rows (through their own projections when bidirectional);
    == dense attention under the paper's rule with the same rotation and bias, padding included."""
    torch.manual_seed(4)
    w, d, g, t = 3, 3, 2, 41
    position = zoo.position.base.POSITION.get(scheme)(D, 64, n_heads=H)
    if scheme == "t5_bias":
        torch.nn.init.normal_(position.table)
    position = position.double()
    options = dict(window=2 * w, dilation=d, global_tokens=g)
    attn = zoo.create_attention("longformer", d_model=D, n_heads=H, causal=causal, position=position, **options)
    attn = attn.double().eval()
    x = torch.randn(2, t, D, dtype=torch.float64)
    positions = torch.arange(t)

    def rotated(projections):
        q, k, v = (attn.split_heads(p(x)) for p in projections)
        return (position.rotate(q, positions), position.rotate(k, positions), v) if position.rotary else (q, k, v)

    i, j = positions[:, None], positions[None, :]
    back = i - j
    window = (back % d == 0) & ((back >= 0) & (back <= w * d) if causal else back.abs() <= w * d)
    allowed = window | (j < g) | (i < g)
    if causal:
        allowed &= back >= 0
    mask = torch.ones(2, t, dtype=torch.bool)
    mask[1, -5:] = False
    allowed = allowed & mask[:, None, None, :]
    bias = position.bias(back, causal=causal) if position.pair_bias else torch.zeros(H, t, t, dtype=torch.float64)

    def dense(q, k, v):
        scores = torch.einsum("bhtk,bhsk->bhts", q, k) * q.shape[-1] ** -0.5 + bias
        return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0) @ v

    heads = dense(*rotated((attn.to_q, attn.to_k, attn.to_v)))
    if attn.global_rows is not None:
        heads[:, :, :g] = dense(*rotated(tuple(attn.global_rows[n] for n in "qkv")))[:, :, :g]
    expected = attn.to_out(attn.merge_heads(heads))
    torch.testing.assert_close(attn(x, pad_mask=mask).out[mask], expected[mask], rtol=1e-10, atol=1e-10)
