"""Context parallelism without processes: chunk layouts, the keys a pattern says a later chunk reads
(the same rule as the streaming cache), the ring's block algebra, and refusals asked of the parts."""

from __future__ import annotations

import re

import pytest
import torch

import zoo
from zoo.attention.base import reference_attention
from zoo.parallel import ring
from zoo.parallel.chunk import Layout
from zoo.parallel.context import context_refusal, pick_layout


@pytest.mark.parametrize("kind", ["contiguous", "zigzag"])
@pytest.mark.parametrize("size", [1, 2, 4])
def test_layout_pieces_cover_the_sequence_once_and_round_trip(kind, size):
    layout = Layout(kind, size, 24)
    positions = torch.cat([layout.positions(r) for r in range(size)])
    assert sorted(positions.tolist()) == list(range(24))
    x = torch.randn(2, 24, 3)
    parts = [layout.shard(x, r) for r in range(size)]
    assert all(p.shape == (2, 24 // size, 3) for p in parts)
    torch.testing.assert_close(layout.unshard(parts), x)
    if kind == "zigzag":  # rank r holds pieces r and 2N - 1 - r: every rank the same causal work
        piece = 24 // (2 * size)
        assert layout.pieces(0) == ((0, piece), (24 - piece, 24))


def test_layout_refuses_a_length_it_cannot_split():
    with pytest.raises(ValueError, match="multiple of 8"):
        Layout("zigzag", 4, 20)
    with pytest.raises(ValueError, match="layout must be one of"):
        Layout("striped", 2, 20)


PATTERNS = [
    ("local_1d", {"block": 4, "memory": 6}),
    ("local_1d", {"block": 4, "memory": 6, "sinks": 3}),
    ("local_1d", {"block": 3, "memory": 0}),
    ("local_2d", {"width": 5, "query_height": 2, "query_width": 2, "flange_height": 1, "flange_width": 1}),
    ("sparse_strided", {"stride": 4, "combine": "union"}),
    ("sparse_strided", {"stride": 4, "combine": "interleaved", "layer_index": 0}),
    ("sparse_fixed", {"stride": 4, "c": 2, "combine": "union"}),
    ("sparse_fixed", {"stride": 4, "c": 2, "combine": "interleaved", "layer_index": 0}),
    ("sparse_fixed", {"stride": 4, "c": 2, "combine": "per_head"}),
    ("longformer", {"window": 6, "dilation": 2, "global_tokens": 2}),
]


@pytest.mark.parametrize("name,options", PATTERNS)
def test_kept_positions_name_exactly_what_the_stream_cache_keeps(name, options):
    """What a later chunk reads of the earlier ones (kept_positions, over absolute positions) is what
    a stream's cache holds after them (kept): the rule context parallelism sends by."""
    attn = zoo.create_attention(name, d_model=8, n_heads=2, causal=True, **options)
    for start in (1, 5, 8, 13, 20):
        positions = torch.arange(start)
        k = torch.randn(1, 2, start, 4)
        cache = attn.kept(k, k, positions, None, start)
        assert cache.position.tolist() == positions[attn.kept_positions(positions, start)].tolist()


@pytest.mark.parametrize("name,options", PATTERNS)
def test_a_shift_period_leaves_the_pattern_alone_and_bounds_it(name, options):
    """Where a pattern names a shift period, moving queries and keys by a multiple of it changes nothing,
    and past state_bound() queries see no key before the shift: a later chunk's blocked pass is exact there."""
    attn = zoo.create_attention(name, d_model=8, n_heads=2, causal=True, **options)
    period = attn.shift_period()
    if period is None:
        assert attn.state_bound() is None or attn.sinks, name
        return
    i, j = torch.arange(30)[:, None], torch.arange(30)[None, :]
    for shift in (period, 3 * period):
        assert torch.equal(attn.allowed(i + shift, j + shift), attn.allowed(i, j))
        late = torch.arange(shift + attn.state_bound(), shift + 40)[:, None]
        assert not attn.allowed(late, torch.arange(shift)[None, :]).any()


def test_kept_positions_of_a_bounded_window_is_its_halo():
    """local_1d: the sinks and the l_m + l_q - 1 keys before the chunk, no more (one short would fail
    the process tests: see test_a_halo_one_key_short_is_caught)."""
    attn = zoo.create_attention("local_1d", d_model=8, n_heads=2, causal=True, block=4, memory=6, sinks=2)
    kept = torch.arange(40)[attn.kept_positions(torch.arange(40), 40)]
    assert kept.tolist() == [0, 1, *range(40 - 9, 40)]


def test_ring_blocks_merge_to_softmax_attention_and_its_gradient():
    """The ring's pieces on one process: blocks merged by online softmax == causal attention, and the
    per-block backward with the merged output == autograd's, through the fused kernel and plain matmuls."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    allowed = torch.ones(12, 12, dtype=torch.bool).tril()
    ref = reference_attention(q, k, v, allowed)
    dout = torch.randn_like(ref)
    ref.backward(dout)
    pieces = [(0, 4), (4, 8), (8, 12)]
    for fused in (True, False):
        ring.FUSED = fused
        try:
            outs, lses = [], []
            for qa, qb in pieces:
                acc = None
                for ka, kb in pieces:
                    how = ring.relation((qa, qb), (ka, kb))
                    if how is not None:
                        o, lse = ring.block_forward(
                            q[:, :, qa:qb].detach(),
                            k[:, :, ka:kb].detach(),
                            v[:, :, ka:kb].detach(),
                            causal=how == "causal",
                            bias=None,
                            scale=0.5,
                        )
                        acc = ring.merge(acc, o, lse)
                outs.append(acc[0])
                lses.append(acc[1])
            out, lse = torch.cat(outs, 2), torch.cat(lses, 2)
            torch.testing.assert_close(out, ref.detach(), rtol=0, atol=1e-12)
            dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
            for qa, qb in pieces:
                for ka, kb in pieces:
                    how = ring.relation((qa, qb), (ka, kb))
                    if how is not None:
                        g = ring.block_backward(
                            dout[:, :, qa:qb],
                            q[:, :, qa:qb].detach(),
                            k[:, :, ka:kb].detach(),
                            v[:, :, ka:kb].detach(),
                            out[:, :, qa:qb],
                            lse[:, :, qa:qb],
                            causal=how == "causal",
                            bias=None,
                            scale=0.5,
                        )
                        dq[:, :, qa:qb] += g[0]
                        dk[:, :, ka:kb] += g[1]
                        dv[:, :, ka:kb] += g[2]
            for got, leaf in zip((dq, dk, dv), (q, k, v)):
                torch.testing.assert_close(got, leaf.grad, rtol=0, atol=1e-12)
        finally:
            ring.FUSED = True


def tiny(name, **overrides):
    return zoo.create_model(name, vocab_size=16, d_model=8, n_heads=2, n_layers=2, **overrides)


@pytest.mark.parametrize(
    "name,overrides,reason",
    [
        ("reformer", {}, "layer 0: attention 'lsh' routes keys by content"),
        ("reformer_full", {}, "attention 'shared_qk' lets a token see its own key only when nothing else"),
        ("vanilla_lm", {"attention": {"name": "additive"}}, "attention 'additive' \\(score=concat\\) is dense"),
        ("universal_transformer", {}, "stack 'universal' adds its own position signal"),
        ("vanilla_classifier", {}, "causal language model's sequences; 'vanilla_classifier' is a 'classifier'"),
        ("al_rfou_lm", {}, "aux_losses"),
        ("vanilla_lm", {"attention_dropout": 0.1}, "ring attention merges blocks of the fused kernel without"),
        ("vanilla_lm", {"attention": {"name": "vanilla", "max_cache": 8}}, "carries a KV cache"),
        ("vanilla_lm", {"attention": {"name": "vanilla", "backend": "flex"}}, "ring attention runs its own blocks"),
        ("sparse_transformer", {"attention": {"name": "sparse_fixed", "stride": 0}}, "stride=0 picks l"),
        ("vanilla_lm", {"attention": {"name": "synthesizer"}}, "attention 'synthesizer' gives each query a score row"),
        ("vanilla_lm", {"attention": {"name": "sinkhorn"}}, "attention 'sinkhorn' sorts blocks by a learned"),
        ("vanilla_lm", {"position": "alibi"}, "with position 'alibi': ring attention merges blocks without a distance"),
        ("vanilla_lm", {"position": "t5_bias"}, "with position 't5_bias': ring attention merges blocks without"),
    ],
)
def test_what_cannot_be_split_is_refused_with_the_parts_reason(name, overrides, reason):
    refusal = context_refusal(tiny(name, **overrides))
    assert refusal is not None and re.search(reason, refusal), refusal


@pytest.mark.parametrize(
    "name,overrides",
    [
        ("vanilla_lm", {}),
        ("transformer_xl", {}),
        ("gtrxl", {}),
        ("trxl_i", {}),
        ("adaptive_span_lm", {}),
        ("sparse_transformer", {}),
        ("image_transformer", {}),
        ("vanilla_lm", {"attention": {"name": "linear"}}),
        ("vanilla_lm", {"attention": {"name": "performer"}}),
        ("vanilla_lm", {"attention": {"name": "longformer"}}),
        ("vanilla_lm", {"attention": {"name": "local_1d"}, "stack": "reversible", "residual": "pre_norm"}),
        ("vanilla_lm", {"position": "rope"}),
        ("vanilla_lm", {"attention": {"name": "local_1d"}, "position": "alibi"}),
        ("sparse_transformer", {"position": "t5_bias"}),
    ],
)
def test_supported_models_are_not_refused(name, overrides):
    assert context_refusal(tiny(name, **overrides)) is None


def test_layout_auto_is_zigzag_for_dense_attention_and_contiguous_for_patterns():
    assert pick_layout(tiny("vanilla_lm"), "auto") == "zigzag"
    assert pick_layout(tiny("sparse_transformer"), "auto") == "contiguous"
    assert pick_layout(tiny("vanilla_lm"), "contiguous") == "contiguous"
    with pytest.raises(ValueError, match="trainer.context_layout=zigzag: attention 'sparse_fixed' runs on contiguous"):
        pick_layout(tiny("sparse_transformer"), "zigzag")
