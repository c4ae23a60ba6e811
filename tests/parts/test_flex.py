"""The FlexAttention backend equals each mechanism's own path (forward, no gradient: torch 2.13 runs only
FlexAttention's forward on the CPU) for every pattern and option, both causalities, padding, lengths that
are not a multiple of any block, and streams continued from a state; and its block mask never builds a
[t, s] tensor while skipping the blocks the pattern leaves empty."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

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
# the default run: each pattern's first option set at one length through FlexAttention's semantics written
# densely; every case through the compiled kernel is marked slow (each compiles FlexAttention anew: 30-100 s
# on this CPU with a cold inductor cache, as on a fresh machine, and its compile workers take the other core)
FIRST = [case for case in ALL if case[1] == VARIANTS.get(case[0], [{}])[0]]
DEFAULT = {(case[0], case[2], "semantics") for case in FIRST}


def slow_unless(default: bool) -> tuple:
    return () if default else (pytest.mark.slow,)


CASES = [
    pytest.param(*case, (19,), kernel, marks=slow_unless((case[0], case[2], kernel) in DEFAULT))
    for case in FIRST
    for kernel in ("semantics", "compiled")
] + [pytest.param(*case, (7, 19, 45), "compiled", marks=pytest.mark.slow) for case in ALL]


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
    name, options, causal, lengths, kernel = case.values
    options = "-".join(f"{k}{v}" for k, v in options.items())
    return f"{name}-{options}-{'causal' if causal else 'bidir'}-{len(lengths)}-{kernel}"


@pytest.mark.parametrize(
    "name,options,causal,lengths,kernel", CASES, ids=[case_id(c) for c in CASES], indirect=["kernel"]
)
@torch.no_grad()
def test_flex_equals_the_native_path(name, options, causal, lengths, kernel):
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


@pytest.fixture
def kernel(request, monkeypatch):
    """``compiled``: torch's compiled FlexAttention (a compile per shape and rule: 30-100 s a case on this CPU
    with a cold cache); ``semantics``: FlexAttention's semantics written densely (:func:`dense_flex`, no
    compile), which checks everything the zoo hands the kernel (block mask, score_mod, cache layout)."""
    if request.param == "semantics":
        monkeypatch.setattr(flex, "compiled_flex", lambda: dense_flex([]))
    return request.param


@pytest.mark.parametrize(
    "name,kernel",
    [
        pytest.param(n, kernel, marks=slow_unless(kernel == "semantics"))
        for n in FLEX
        if ATTENTION.get(n).supports_memory
        for kernel in ("semantics", "compiled")
    ],
    indirect=["kernel"],
)
@torch.no_grad()
def test_flex_continues_a_stream_like_the_native_cache(name, kernel):
    """The fourth piece meets 40 keys (a last tile of 8 in the CPU kernel: see test_cpu_keys_are_padded...)
    in a cache that appends in place, its unfilled capacity right after the keys."""
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


def dense_flex(handed: list):
    """FlexAttention's semantics written densely (no compile): a key is scored where its block is listed
    full, or listed partial and mask_mod allows it; ``handed`` records the key count the kernel got."""

    def listed(num: Tensor, index: Tensor, n_kv: int) -> Tensor:  # [b, h, n_q] counts -> [b, h, n_q, n_kv] bool
        order = torch.arange(index.shape[-1])
        hit = torch.zeros(*index.shape[:-1], n_kv + 1, dtype=torch.bool)
        return hit.scatter(-1, torch.where(order < num[..., None], index.long(), n_kv), True)[..., :n_kv]

    def kernel(q: Tensor, k: Tensor, v: Tensor, *, score_mod, block_mask) -> Tensor:
        handed.append(k.shape[2])
        t, s = q.shape[2], k.shape[2]
        b, h, i, j = (torch.arange(n).view(-1, *[1] * (3 - d)) for d, n in enumerate((q.shape[0], q.shape[1], t, s)))
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        scores = scores if score_mod is None else score_mod(scores, b, h, i, j)
        n_kv = -(-s // flex.BLOCK)
        full = listed(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, n_kv)
        partial = listed(block_mask.kv_num_blocks, block_mask.kv_indices, n_kv)
        def per_key(blocks):
            return blocks.repeat_interleave(flex.BLOCK, 2).repeat_interleave(flex.BLOCK, 3)[..., :t, :s]

        allowed = per_key(full) | (per_key(partial) & block_mask.mask_mod(b, h, i, j))
        return torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1).nan_to_num() @ v

    return kernel


@torch.no_grad()
def test_cpu_keys_are_padded_to_whole_kernel_tiles_and_the_padding_is_masked(monkeypatch):
    """torch 2.13's compiled CPU kernel scores a last tile of 8 keys (of its 16-key tiles) as a whole one,
    reading 8 keys past the end and writing past its row (flex.py's docstring): wrong outputs over a cache
    whose unfilled capacity follows the keys. flex_attend hands it keys padded to a multiple of 16 and
    masks the padding out; checked through FlexAttention's semantics written densely (no compile) against
    dense attention at 40 keys, with a cache offset, key padding and a distance bias (score_mod)."""
    handed = []
    monkeypatch.setattr(flex, "compiled_flex", lambda: dense_flex(handed))
    g = torch.Generator().manual_seed(0)
    b, h, t, s = 2, 2, 13, 40
    q = torch.randn(b, h, t, 8, generator=g)
    k, v = torch.randn(2, b, h, s, 8, generator=g)
    padded = torch.ones(b, s, dtype=torch.bool)
    padded[1, :5] = False
    keys = torch.arange(s)
    queries = keys[s - t :]
    low = int(queries.min() - keys.max())
    bias = flex.DistanceBias(torch.randn(h, t + s - 1, generator=g), low, queries, keys)
    scores = q @ k.transpose(-1, -2) / 8**0.5 + bias.table[:, queries[:, None] - keys[None, :] - low]
    # causal (the padding's block is partial anyway) and bidirectional (all of it allowed but the padding)
    for causal, valid in ((True, None), (True, padded), (False, None)):
        out = flex.flex_attend(
            q,
            k,
            v,
            (lambda h, i, j: j <= i) if causal else (lambda h, i, j: j >= 0),
            query_positions=queries,
            key_positions=keys,
            valid=valid,
            heads_differ=False,
            cache_key=("padded-keys-test", causal),
            bias=bias,
        )
        allowed = (keys[None, :] <= queries[:, None]) | (not causal)
        allowed = allowed & (True if valid is None else valid[:, None, None, :])
        expected = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    assert handed == [48] * 3


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


# the default run: every pattern with every scheme through FlexAttention's dense semantics; on the compiled
# kernel, marked slow
POSITION_CASES = [
    pytest.param(name, scheme, kernel, marks=slow_unless(kernel == "semantics"))
    for name in FLEX
    for scheme in SCHEMES
    for kernel in ("semantics", "compiled")
]


@pytest.mark.parametrize("name,scheme,kernel", POSITION_CASES, indirect=["kernel"])
@torch.no_grad()
def test_a_position_inside_attention_runs_on_flex_as_on_the_native_path(name, scheme, kernel):
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
