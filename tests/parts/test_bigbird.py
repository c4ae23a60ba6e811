"""``bigbird`` against HF transformers' BigBirdBlockSparseAttention (the version installed by the
``references`` extra; 5.24.0 when written), weights copied, float64, 10 blocks of 4, 2 random blocks,
right padding. HF draws no random blocks in eval (an all-zero table) and reseeds numpy in training, so
the reference runs in training mode (it has no dropout here) with its table replaced by ours: the test
checks the attention, given the same random blocks. Then the pattern itself: random blocks are seeded
(the same at every evaluation), distinct from the window and global blocks, and every key counts once
(the output equals dense attention under the pattern's mask)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import zoo
from zoo.attention.base import reference_attention

D, H = 32, 4


def test_bigbird_equals_hf_block_sparse_attention_given_the_same_random_blocks(monkeypatch):
    transformers = pytest.importorskip("transformers")
    from transformers.models.big_bird.modeling_big_bird import BigBirdBlockSparseAttention, BigBirdModel

    torch.manual_seed(0)
    size, n, r = 4, 10, 2
    t = size * n
    config = transformers.BigBirdConfig(
        hidden_size=D,
        num_attention_heads=H,
        attention_type="block_sparse",
        block_size=size,
        num_random_blocks=r,
        max_position_embeddings=64,
    )
    ref = BigBirdBlockSparseAttention(config, seed=0).double()
    attn = zoo.create_attention("bigbird", d_model=D, n_heads=H, block=size, random_blocks=r).double().eval()
    with torch.no_grad():
        for ours, theirs in ((attn.to_q, ref.query), (attn.to_k, ref.key), (attn.to_v, ref.value)):
            theirs.weight.copy_(ours.weight)
            theirs.bias.copy_(ours.bias)
    table, usable = attn.random_table(n)
    assert usable[1:-1].all()
    heads = [table[i, 1:-1].numpy().astype(np.int32) for i in range(H)]  # rows of query blocks 1 .. n - 2
    monkeypatch.setattr(ref, "_bigbird_block_rand_mask_with_head", lambda **kwargs: heads)
    x = torch.randn(2, t, D, dtype=torch.float64)
    pad = torch.ones(2, t, dtype=torch.bool)
    pad[1, 33:] = False
    blocked, band, from_mask, to_mask = BigBirdModel.create_masks_for_block_sparse_attn(pad.double(), size)
    with torch.no_grad():
        context = ref.train()(x, band, from_mask, to_mask, blocked, blocked)[0]
        expected = attn.to_out(context)
        ours = attn(x, pad_mask=pad).out
    torch.testing.assert_close(ours[pad], expected[pad], rtol=1e-10, atol=1e-10)


def test_random_blocks_are_seeded_distinct_and_every_key_counts_once():
    torch.manual_seed(1)
    size, n = 3, 11
    attn = zoo.create_attention("bigbird", d_model=D, n_heads=H, block=size, random_blocks=3, layer_index=2)
    attn = attn.double().eval()
    index, kept = attn.key_blocks(n)
    again, _ = attn.key_blocks(n)
    assert torch.equal(index, again), "evaluation draws the same random blocks"
    other = zoo.create_attention("bigbird", d_model=D, n_heads=H, block=size, random_blocks=3, layer_index=3)
    assert not torch.equal(other.key_blocks(n)[0], index), "each layer draws its own"
    t = size * n - 2  # a partial last block
    x = torch.randn(2, t, D, dtype=torch.float64)
    q, k, v = (attn.split_heads(p(x)) for p in (attn.to_q, attn.to_k, attn.to_v))
    blocks = torch.arange(t) // size
    allowed = torch.zeros(H, t, t, dtype=torch.bool)
    for head in range(H):
        for row in range(n):
            chosen = index[head, row][kept[row]]
            assert len(set(chosen.tolist())) == len(chosen), "a key block appears twice in a row"
            allowed[head, blocks == row] = torch.isin(blocks, chosen)[None, :]
    allowed[:, blocks == 0] = True  # the global query blocks see every key
    allowed[:, blocks == n - 1] = True
    expected = attn.to_out(attn.merge_heads(reference_attention(q, k, v, allowed[None])))
    torch.testing.assert_close(attn(x).out, expected, rtol=1e-10, atol=1e-10)


def biased_reference(q, k, v, allowed, bias):
    """softmax(q k^T / sqrt(k) + bias) v over the allowed pairs: q, k, v [b, h, t, k], allowed and bias [h, t, s]."""
    scores = torch.einsum("bhtk,bhsk->bhts", q, k) * q.shape[-1] ** -0.5 + bias
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    return weights @ v


@pytest.mark.parametrize("scheme", ["rope", "alibi", "t5_bias"])
def test_positions_inside_bigbird_equal_dense_attention_under_its_pattern(scheme):
    """rope (q and k rotated at their positions) and a pair bias b_h(i - j) on every score BigBird computes
    (window, global, random blocks, and the global rows) == dense attention under its pattern with them."""
    torch.manual_seed(2)
    size, n = 3, 9
    position = zoo.position.base.POSITION.get(scheme)(D, 64, n_heads=H)
    if scheme == "t5_bias":
        torch.nn.init.normal_(position.table)
    position = position.double()
    attn = zoo.create_attention("bigbird", d_model=D, n_heads=H, block=size, random_blocks=2, position=position)
    attn = attn.double().eval()
    t = size * n - 1
    x = torch.randn(2, t, D, dtype=torch.float64)
    q, k, v = (attn.split_heads(p(x)) for p in (attn.to_q, attn.to_k, attn.to_v))
    positions = torch.arange(t)
    if position.rotary:
        q, k = position.rotate(q, positions), position.rotate(k, positions)
    distance = positions[:, None] - positions[None, :]
    bias = position.bias(distance, causal=False) if position.pair_bias else torch.zeros(H, t, t, dtype=torch.float64)
    index, kept = attn.key_blocks(n)
    blocks = torch.arange(t) // size
    allowed = torch.zeros(H, t, t, dtype=torch.bool)
    for head in range(H):
        for row in range(n):
            allowed[head, blocks == row] = torch.isin(blocks, index[head, row][kept[row]])[None, :]
    allowed[:, (blocks == 0) | (blocks == n - 1)] = True
    mask = torch.ones(2, t, dtype=torch.bool)
    mask[1, -4:] = False
    expected = attn.to_out(attn.merge_heads(biased_reference(q, k, v, allowed & mask[:, None, None, :], bias)))
    torch.testing.assert_close(attn(x, pad_mask=mask).out[mask], expected[mask], rtol=1e-10, atol=1e-10)
