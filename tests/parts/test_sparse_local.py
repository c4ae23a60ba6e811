"""Sparse Transformer (strided, fixed) and Image Transformer (local 1D, 2D) patterns.

The papers' set definitions are written out here, independently of the blocked implementations,
as dense boolean [t, t] masks (test references only). Checked: the attended (i, j) pairs equal
those sets exactly; outputs and gradients equal dense masked attention to 1e-5, causal and
bidirectional, for lengths that are and are not multiples of the block/stride, with padding;
cost grows sub-quadratically (saved activations); bad configurations and inputs are refused.
With a pair bias (ALiBi, T5 buckets: ``zoo/position``), outputs and gradients equal the dense masked
attention with the bias b_h(i - j) added to every score, for every pattern and combination.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd.graph import saved_tensors_hooks

import zoo
from zoo.attention.base import guard_empty_rows, reference_attention
from zoo.position.base import POSITION
from zoo.train.activation_meter import ActivationMeter

# -- the papers' sets, as dense [t, t] masks (i = query row, j = key column) ---------------------


def grid(t):
    return torch.arange(t)[:, None], torch.arange(t)[None, :]


def strided_sets(t, stride, causal):
    """Child et al. 2019, Section 4.2: A1 = {t, ..., i}, t = max(0, i - l); A2 = {j : (i - j) mod l = 0}."""
    i, j = grid(t)
    if causal:
        return (j >= (i - stride).clamp(min=0)) & (j <= i), ((i - j) % stride == 0) & (j <= i)
    return (i - j).abs() <= stride, (i - j) % stride == 0


def fixed_sets(t, stride, c, causal):
    """A1 = {j : floor(j / l) = floor(i / l)}; A2 = {j : j mod l in {l - c, ..., l - 1}}."""
    i, j = grid(t)
    a1, a2 = (j // stride == i // stride), (j % stride >= stride - c)
    if causal:
        a1, a2 = a1 & (j <= i), a2 & (j <= i)
    return a1, a2


def local_1d_set(t, block, memory, causal):
    """Parmar et al. 2018: the query block plus l_m positions before it, masked causally."""
    i, j = grid(t)
    start = (i // block) * block
    return (j >= start - memory) & ((j <= i) if causal else (j < start + block))


def local_2d_set(t, width, qh, qw, fh, fw, causal):
    """Memory block = the query block extended f_h rows up and f_w columns left and right."""
    i, j = grid(t)
    r, c, rj, cj = i // width, i % width, j // width, j % width
    top, left = (r // qh) * qh, (c // qw) * qw
    allowed = (rj >= top - fh) & (rj < top + qh) & (cj >= left - fw) & (cj < left + qw + fw)
    return allowed & (j <= i) if causal else allowed


def expected_heads(attn, t, sets):
    """[h, t, t]: what each head of a factorised layer must attend to."""
    a1, a2 = sets
    pick = {"A1": a1, "A2": a2, "A1|A2": a1 | a2}
    return torch.stack([pick[p].expand(t, t) for p in attn.head_patterns()])


# -- extracting the pattern the efficient implementation really attends to -----------------------


def attended_pairs(attn, t, pad_mask=None, h=4):
    """With q = 0 every attended key gets weight 1/|A(i)| > 0; v = identity reads the set off."""
    q = torch.zeros(1, h, t, t)
    k = torch.randn(1, h, t, t)
    v = torch.eye(t).expand(1, h, t, t)
    out = attn.attend(q, k, v, None if pad_mask is None else pad_mask[None])
    return out[0] > 1e-7


def reference(q, k, v, allowed, bias=None):
    """Dense masked softmax (plus ``bias`` [h, t, t] on the scores); rows with no allowed key give 0
    (as the mechanisms do)."""
    has_key = allowed.any(-1, keepdim=True)
    if bias is None:
        return reference_attention(q, k, v, guard_empty_rows(allowed)) * has_key
    scores = torch.einsum("bhtk,bhsk->bhts", q, k) * q.shape[-1] ** -0.5 + bias
    weights = torch.softmax(scores.masked_fill(~guard_empty_rows(allowed), float("-inf")), dim=-1)
    return torch.einsum("bhts,bhsk->bhtk", weights, v) * has_key


def check_against_reference(attn, t, allowed, pad_mask=None, b=2, h=4, dk=8, bias=None):
    """allowed [h, t, t]: forward and gradients of attn.attend equal the dense reference."""
    g = torch.Generator().manual_seed(t)
    q, k, v = (torch.randn(b, h, t, dk, generator=g, requires_grad=True) for _ in range(3))
    weight = torch.randn(b, h, t, dk, generator=g)
    full = allowed[None].expand(b, -1, -1, -1)
    if pad_mask is not None:
        full = full & pad_mask[:, None, None, :]
    out = attn.attend(q, k, v, pad_mask)
    ref = reference(q, k, v, full, bias)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * weight).sum(), (q, k, v))
    for name, got, want in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"d/d{name}: {m}")


def padding(b, t):
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[0, -max(1, t // 3) :] = False
    if b > 1:
        mask[1, : max(1, t // 4)] = False
    return mask


def build(name, causal, layer_index=0, **options):
    return zoo.create_attention(name, d_model=32, n_heads=4, causal=causal, layer_index=layer_index, **options).eval()


def local_1d_with_sinks(t, causal):
    """local_1d's set plus the first 2 positions (sinks), before the query when causal."""
    i, j = grid(t)
    sinks = (j < 2) & ((j <= i) if causal else True)
    return (local_1d_set(t, 5, 3, causal) | sinks).expand(4, t, t)


def pattern_cases():
    """(id, name, layer, options, allowed(attn, t, causal) -> [h, t, t]) for every pattern and combination."""
    cases = []
    for combine, layer in COMBINE:
        cases.append(
            (f"sparse_strided-{combine}{layer}", "sparse_strided", layer, dict(stride=5, combine=combine),
             lambda attn, t, causal: expected_heads(attn, t, strided_sets(t, 5, causal)))
        )  # fmt: skip
        cases.append(
            (f"sparse_fixed-{combine}{layer}", "sparse_fixed", layer, dict(stride=5, c=2, combine=combine),
             lambda attn, t, causal: expected_heads(attn, t, fixed_sets(t, 5, 2, causal)))
        )  # fmt: skip
    cases.append(
        ("local_1d", "local_1d", 0, dict(block=5, memory=7), lambda a, t, c: local_1d_set(t, 5, 7, c).expand(4, t, t))
    )
    cases.append(
        ("local_1d-sinks", "local_1d", 0, dict(block=5, memory=3, sinks=2), lambda a, t, c: local_1d_with_sinks(t, c))
    )
    cases.append(
        ("local_2d", "local_2d", 0, SHAPES_2D[0], lambda a, t, c: local_2d_set(t, 6, 2, 3, 2, 2, c).expand(4, t, t))
    )
    return cases


CAUSAL = [True, False]
COMBINE = [("interleaved", 0), ("interleaved", 1), ("union", 0), ("per_head", 0)]


# -- sparse_strided ----------------------------------------------------------------------------


@pytest.mark.parametrize("causal", CAUSAL, ids=["causal", "bidir"])
@pytest.mark.parametrize("combine,layer", COMBINE, ids=[f"{c}{i}" for c, i in COMBINE])
@pytest.mark.parametrize("t", [16, 19, 3])
def test_strided_pattern_is_the_papers_sets(causal, combine, layer, t):
    attn = build("sparse_strided", causal, layer, stride=4, combine=combine)
    want = expected_heads(attn, t, strided_sets(t, 4, causal))
    assert torch.equal(attended_pairs(attn, t), want)


@pytest.mark.parametrize("causal", CAUSAL, ids=["causal", "bidir"])
@pytest.mark.parametrize("combine,layer", COMBINE, ids=[f"{c}{i}" for c, i in COMBINE])
@pytest.mark.parametrize("t,pad", [(20, False), (23, False), (23, True)])
def test_strided_equals_dense_reference(causal, combine, layer, t, pad):
    attn = build("sparse_strided", causal, layer, stride=5, combine=combine)
    check_against_reference(
        attn, t, expected_heads(attn, t, strided_sets(t, 5, causal)), padding(2, t) if pad else None
    )


# -- sparse_fixed ------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", CAUSAL, ids=["causal", "bidir"])
@pytest.mark.parametrize("combine,layer", COMBINE, ids=[f"{c}{i}" for c, i in COMBINE])
@pytest.mark.parametrize("t,c", [(16, 2), (19, 1), (18, 4), (3, 2)])
def test_fixed_pattern_is_the_papers_sets(causal, combine, layer, t, c):
    attn = build("sparse_fixed", causal, layer, stride=4, c=c, combine=combine)
    want = expected_heads(attn, t, fixed_sets(t, 4, c, causal))
    assert torch.equal(attended_pairs(attn, t), want)


@pytest.mark.parametrize("causal", CAUSAL, ids=["causal", "bidir"])
@pytest.mark.parametrize("combine,layer", COMBINE, ids=[f"{c}{i}" for c, i in COMBINE])
@pytest.mark.parametrize("t,pad", [(20, False), (23, False), (23, True)])
def test_fixed_equals_dense_reference(causal, combine, layer, t, pad):
    attn = build("sparse_fixed", causal, layer, stride=5, c=2, combine=combine)
    check_against_reference(
        attn, t, expected_heads(attn, t, fixed_sets(t, 5, 2, causal)), padding(2, t) if pad else None
    )


def test_auto_stride_is_ceil_sqrt_t():
    attn = build("sparse_strided", True, stride=0, combine="union")
    t = 30  # l = 6
    want = expected_heads(attn, t, strided_sets(t, 6, True))
    assert torch.equal(attended_pairs(attn, t), want)


def test_interleaving_follows_depth_in_a_model():
    model = zoo.create_model(
        "sparse_transformer",
        vocab_size=16,
        d_model=16,
        n_layers=3,
        n_heads=2,
        d_ff=16,
        attention={"combine": "interleaved", "stride": 4, "c": 1},
    )
    patterns = [block.attention.head_patterns()[0] for block in model.stack.blocks]
    assert patterns == ["A1", "A2", "A1"]


# -- local_1d ----------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", CAUSAL, ids=["causal", "bidir"])
@pytest.mark.parametrize("memory", [0, 3, 4, 6])
@pytest.mark.parametrize("t", [16, 19, 3])
def test_local_1d_pattern_is_the_papers_set(causal, memory, t):
    attn = build("local_1d", causal, block=4, memory=memory)
    assert torch.equal(attended_pairs(attn, t), local_1d_set(t, 4, memory, causal).expand(4, t, t))


@pytest.mark.parametrize("causal", CAUSAL, ids=["causal", "bidir"])
@pytest.mark.parametrize("t,pad", [(20, False), (23, False), (23, True)])
def test_local_1d_equals_dense_reference(causal, t, pad):
    attn = build("local_1d", causal, block=5, memory=7)
    check_against_reference(attn, t, local_1d_set(t, 5, 7, causal).expand(4, t, t), padding(2, t) if pad else None)


# -- local_2d ----------------------------------------------------------------------------------

SHAPES_2D = [
    dict(width=6, query_height=2, query_width=3, flange_height=2, flange_width=2),
    dict(width=7, query_height=3, query_width=2, flange_height=1, flange_width=0),
]


@pytest.mark.parametrize("causal", CAUSAL, ids=["causal", "bidir"])
@pytest.mark.parametrize("shape", SHAPES_2D, ids=["6wide", "7wide"])
@pytest.mark.parametrize("rows_extra", [(4, 0), (5, 3), (1, 2)], ids=["4rows", "5rows+3", "1row+2"])
def test_local_2d_pattern_is_the_papers_set(causal, shape, rows_extra):
    t = rows_extra[0] * shape["width"] + rows_extra[1]
    attn = build("local_2d", causal, **shape)
    want = local_2d_set(
        t,
        shape["width"],
        shape["query_height"],
        shape["query_width"],
        shape["flange_height"],
        shape["flange_width"],
        causal,
    )
    assert torch.equal(attended_pairs(attn, t), want.expand(4, t, t))


@pytest.mark.parametrize("causal", CAUSAL, ids=["causal", "bidir"])
@pytest.mark.parametrize("t,pad", [(24, False), (29, False), (29, True)])
def test_local_2d_equals_dense_reference(causal, t, pad):
    shape = SHAPES_2D[0]
    attn = build("local_2d", causal, **shape)
    allowed = local_2d_set(t, 6, 2, 3, 2, 2, causal).expand(4, t, t)
    check_against_reference(attn, t, allowed, padding(2, t) if pad else None)


def test_local_2d_with_image_size_and_prefix():
    attn = build("local_2d", True, width=6, height=4, query_height=2, query_width=3, flange_height=2, flange_width=2)
    for t in (24, 10):  # the whole image, and a raster prefix (generation)
        check_against_reference(attn, t, local_2d_set(t, 6, 2, 3, 2, 2, True).expand(4, t, t))


# -- bad input ---------------------------------------------------------------------------------


def test_bad_configurations_and_inputs_are_refused():
    with pytest.raises(ValueError, match=r"c \(9\) must be <= stride"):
        build("sparse_fixed", True, stride=8, c=9)
    auto = build("sparse_fixed", True, stride=0, c=8)
    with pytest.raises(ValueError, match=r"c \(8\) must be <= stride l \(4\)"):
        auto(torch.randn(1, 16, 32))
    with pytest.raises(ValueError, match="combine must be one of"):
        build("sparse_strided", True, combine="merged")
    with pytest.raises(ValueError, match="n_heads >= 2"):
        zoo.create_attention("sparse_strided", d_model=8, n_heads=1, causal=True, combine="per_head")
    image = build("local_2d", False, width=6, height=4)
    with pytest.raises(ValueError, match="not height x width = 4 x 6 = 24"):
        image(torch.randn(1, 23, 32))
    with pytest.raises(ValueError, match="does not fit the image"):
        build("local_2d", True, width=6, height=4)(torch.randn(1, 25, 32))
    with pytest.raises(ValueError, match="block must be an int >= 1"):
        build("local_1d", True, block=0)


def test_lengths_that_do_not_suit_the_block_are_padded_not_refused():
    for name, options in [
        ("sparse_strided", dict(stride=8)),
        ("sparse_fixed", dict(stride=8, c=2)),
        ("local_1d", dict(block=8)),
        ("local_2d", dict(width=5)),
    ]:
        out = build(name, True, **options)(torch.randn(2, 13, 32)).out
        assert out.shape == (2, 13, 32) and torch.isfinite(out).all()


# -- cost: no t x t anywhere; saved activations grow ~ t sqrt(t) (sparse) or ~ t (local) -------


def saved_bytes(attn, t):
    x = torch.randn(1, t, 32, requires_grad=True)
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with saved_tensors_hooks(pack, lambda tensor: tensor):
        attn(x)
    return total


@pytest.mark.parametrize(
    "name,options,max_slope",
    [
        ("sparse_strided", dict(stride=0, combine="union"), 1.65),
        ("sparse_strided", dict(stride=0, combine="per_head"), 1.65),
        ("sparse_fixed", dict(stride=0, c=4, combine="union"), 1.65),
        ("sparse_fixed", dict(stride=0, c=4, combine="per_head"), 1.65),
        ("local_1d", dict(block=32, memory=32), 1.1),
        ("local_2d", dict(width=32, query_height=4, query_width=8, flange_height=4, flange_width=8), 1.1),
    ],
    ids=["strided-union", "strided-heads", "fixed-union", "fixed-heads", "local_1d", "local_2d"],
)
def test_saved_activations_grow_subquadratically(name, options, max_slope):
    attn = build(name, True, **options).train()
    small, large = saved_bytes(attn, 1024), saved_bytes(attn, 4096)
    slope = math.log(large / small) / math.log(4)
    assert slope < max_slope, f"{name}: saved activations grow as t^{slope:.2f}"


# -- local_2d on a sequence shorter than its image (issue 15, item 2) -----------------------------

IMAGE_PRESET_2D = dict(height=32, width=96, query_height=8, query_width=32, flange_height=8, flange_width=32)


def unique_saved_bytes(attn, t):
    """Exact bytes autograd keeps for backward (each storage once, parameters excluded)."""
    with ActivationMeter(attn) as meter:
        attn(torch.randn(1, t, 32, requires_grad=True))
    return meter.bytes


def test_local_2d_prefix_pads_to_query_block_rows_not_the_image():
    """The Image Transformer preset's 32 x 96 geometry: 256 tokens (3 rows) are padded to one
    query-block row (8 rows), not to the whole image, so they cost about a quarter of 3,072."""
    attn = build("local_2d", True, **IMAGE_PRESET_2D).train()
    short, image = unique_saved_bytes(attn, 256), unique_saved_bytes(attn, 3072)
    assert short < 0.3 * image, f"256 tokens save {short} bytes, the whole 3,072-token image {image}"


def test_local_2d_prefix_of_the_preset_geometry_equals_dense_reference(caplog):
    attn = build("local_2d", True, **IMAGE_PRESET_2D)
    for t in (256, 8 * 96 + 5):  # inside one query-block row; just past it
        allowed = local_2d_set(t, 96, 8, 32, 8, 32, True).expand(4, t, t)
        check_against_reference(attn, t, allowed, padding(2, t), dk=4)


def test_local_2d_says_once_what_shape_it_expects(caplog):
    attn = build("local_2d", True, height=5, width=7, query_height=2, query_width=3)
    with caplog.at_level("WARNING", logger="zoo.attention.local"):
        for t in (20, 21, 13):
            attn(torch.randn(1, t, 32))
        attn(torch.randn(1, 35, 32))  # the whole image: nothing to say
    notes = [r.getMessage() for r in caplog.records if "local_2d expects" in r.getMessage()]
    assert len(notes) == 1 and "5 x 7 = 35" in notes[0] and "first 3 rows" in notes[0]


# -- a pair bias on the pairs each pattern computes ---------------------------------------------

PATTERN_CASES = pattern_cases()


@pytest.mark.parametrize("scheme", ["alibi", "t5_bias"])
@pytest.mark.parametrize("causal", CAUSAL, ids=["causal", "bidir"])
@pytest.mark.parametrize("pad", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("case", PATTERN_CASES, ids=[c[0] for c in PATTERN_CASES])
def test_a_pair_bias_equals_the_dense_reference_with_the_bias(case, pad, causal, scheme):
    """b_h(i - j) from the position part (T5: a random table) on exactly the pairs of the pattern's sets."""
    _, name, layer, options, sets = case
    t = 24 if name == "local_2d" else 23
    part = POSITION.get(scheme)(
        32, 64, n_heads=4, **({"buckets": 8, "max_distance": 12} if scheme == "t5_bias" else {})
    )
    attn = build(name, causal, layer, position=part, **options)
    i, j = grid(t)
    bias = part.bias(i - j, causal=causal)  # [h, t, t], the reference's only
    check_against_reference(attn, t, sets(attn, t, causal), padding(2, t) if pad else None, bias=bias)
