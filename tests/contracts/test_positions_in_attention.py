"""The contract of positions acting inside attention, over every mechanism that accepts the scheme.

Parametrised over the registries (``POSITION`` parts with ``kinds()``, ``ATTENTION`` mechanisms), so a
new scheme or mechanism is checked the moment it registers; cases follow capability flags
(``position_kinds``, ``position_refusal``), never names:

- a mechanism refuses a scheme it cannot apply when it is built, with the reason, and accepts the others;
- the scheme changes the output (it is applied, not ignored);
- causality (by perturbation and by gradient) and padding invariance hold with the scheme;
- a state threaded through segments equals one call, and token by token equals the full pass, under
  the mechanism's state contract;
- relative schemes: shifting every position by the same amount changes nothing (for rope, a part
  rotating at positions + 1,000; at the model level, a dense cache starting at position 1,000), while an
  absolute signal does change (the check can fail);
- gradients reach T5's table (shared by the layers of a model).
"""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.attention.base import ATTENTION
from zoo.attention.vanilla import KVCache
from zoo.position.base import POSITION

D, H, MAX_LEN = 32, 4, 256
SCHEMES = [name for name in POSITION.list() if POSITION.get(name).kinds()]
MECHANISMS = zoo.list_attention()


def part(name: str, **options):
    cls = POSITION.get(name)
    return cls(D, MAX_LEN, n_heads=H, **{**cls.contract_options(), **options})


def modes(name: str) -> list[bool]:
    cls = ATTENTION.get(name)
    return [True] if cls.causal_only else [False, True] if cls.supports_causal else [False]


def build(name: str, causal: bool, position):
    cls = ATTENTION.get(name)
    attn = zoo.create_attention(name, d_model=D, n_heads=H, causal=causal, position=position, **cls.contract_options())
    return attn.eval()


def refusal(name: str, causal: bool, scheme: str) -> str | None:
    """The reason the mechanism gives when built with the scheme (None: it accepts it)."""
    try:
        build(name, causal, part(scheme))
    except ValueError as error:
        return str(error)
    return None


CASES = [(m, c, s) for m in MECHANISMS for c in modes(m) for s in SCHEMES if refusal(m, c, s) is None]
IDS = [f"{m}-{'causal' if c else 'bidir'}-{s}" for m, c, s in CASES]
STREAMING = [(m, s) for m, c, s in CASES if c and build(m, True, part(s)).stream_refusal() is None]


def inputs(b: int, t: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, t, D, generator=torch.Generator().manual_seed(seed))


def length(name: str) -> int:
    return ATTENTION.get(name).contract_lengths()[-1]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("name", MECHANISMS)
def test_a_mechanism_refuses_a_scheme_it_cannot_apply_with_the_reason(name, scheme):
    cls = ATTENTION.get(name)
    for causal in modes(name):
        reason = refusal(name, causal, scheme)
        missing = set(POSITION.get(scheme).kinds()) - set(cls.position_kinds)
        if missing:
            assert reason and "cannot take position" in reason and any(kind in reason for kind in missing), reason
        if reason is not None:
            assert f"{name!r}" in reason and f"{scheme!r}" in reason and len(reason) > 60, reason


def test_every_mechanism_of_a_dense_pattern_and_more_takes_every_scheme():
    """The issue's list: dense (SDPA), blocked local, strided/fixed, the span band and LSH all apply
    rope, ALiBi and T5; only XL (its own relative terms) refuses every one."""
    for name in ("vanilla", "local_1d", "local_2d", "sparse_strided", "sparse_fixed", "adaptive_span", "lsh"):
        for scheme in SCHEMES:
            assert refusal(name, True, scheme) is None, (name, scheme)
    assert all(refusal("xl_rel", True, scheme) for scheme in SCHEMES)
    assert "relative_keys" in (refusal_with("adaptive_span", relative_keys=True) or "")


def refusal_with(name: str, **options) -> str | None:
    cls = ATTENTION.get(name)
    try:
        zoo.create_attention(
            name, d_model=D, n_heads=H, causal=True, position=part("alibi"), **{**cls.contract_options(), **options}
        )
    except ValueError as error:
        return str(error)
    return None


@pytest.mark.parametrize("name,causal,scheme", CASES, ids=IDS)
def test_the_scheme_is_applied_and_keeps_causality_and_padding(name, causal, scheme):
    torch.manual_seed(0)
    attn, plain = build(name, causal, part(scheme)), build(name, causal, None)
    plain.load_state_dict(attn.state_dict())
    t = length(name)
    x = inputs(2, t)
    out = attn(x).out
    assert torch.isfinite(out).all() and not torch.allclose(out, plain(x).out, atol=1e-4), "the scheme is ignored"
    mask = torch.ones(2, t, dtype=torch.bool)
    mask[0, -t // 3 :], mask[1, : t // 4] = False, False
    xg = x.clone().requires_grad_(True)
    padded = attn(xg, pad_mask=mask).out
    (grad,) = torch.autograd.grad((padded * mask[..., None]).sum(), xg)
    assert grad[~mask].abs().max() == 0, "real outputs depend on padded inputs"
    if not causal:
        return
    for i in (0, t // 2, t - 2):
        (grad,) = torch.autograd.grad(attn(xg).out[:, i].sum(), xg)
        assert grad[:, i + 1 :].abs().max() == 0, f"position {i} receives gradient from the future"
    if not ATTENTION.get(name).content_routed:
        changed = x.clone()
        changed[:, t // 2 :] += torch.randn_like(changed[:, t // 2 :])
        torch.testing.assert_close(attn(changed).out[:, : t // 2], out[:, : t // 2], atol=1e-5, rtol=1e-4)


def stream(attn, x, pieces, state=None):
    state, outs, start = state or attn.init_state(x.shape[0]), [], 0
    for n in pieces:
        result = attn(x[:, start : start + n], state=state)
        state, start = result.state, start + n
        outs.append(result.out)
    return torch.cat(outs, 1)


@pytest.mark.parametrize("name,scheme", STREAMING, ids=[f"{m}-{s}" for m, s in STREAMING])
def test_segments_with_state_equal_one_call_and_token_by_token_the_full_pass(name, scheme):
    attn = build(name, True, part(scheme))
    contract = ATTENTION.get(name).contract_state()
    total = min(48, contract.exact_for or 48)
    x = inputs(2, total, seed=1)
    with torch.no_grad():
        whole = attn(x).out
        torch.testing.assert_close(stream(attn, x, [1] * total), whole, atol=1e-5, rtol=1e-4)
        pieces = [7, 1, 19, 1, total - 28]
        torch.testing.assert_close(stream(attn, x, pieces), whole, atol=1e-5, rtol=1e-4)


class ShiftedRope(POSITION.get("rope")):
    """rope rotating every query and key at its position + 1,000: a relative use cannot tell."""

    def rotate(self, x, positions):
        return super().rotate(x, positions + 1000)


ROTARY = [(m, c) for m, c, s in CASES if s == "rope"]


@pytest.mark.parametrize("name,causal", ROTARY, ids=[f"{m}-{'causal' if c else 'bidir'}" for m, c in ROTARY])
def test_rope_is_invariant_to_a_shift_of_every_position(name, causal):
    attn = build(name, causal, part("rope"))
    shifted = build(name, causal, ShiftedRope(D, MAX_LEN, n_heads=H, **POSITION.get("rope").contract_options()))
    shifted.load_state_dict(attn.state_dict())
    x = inputs(2, length(name), seed=2)
    with torch.no_grad():
        torch.testing.assert_close(shifted(x).out, attn(x).out, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("scheme", [*SCHEMES, "sinusoidal"])
def test_a_model_continuing_at_position_1000_equals_one_starting_at_0_only_for_relative_schemes(scheme):
    """A vanilla LM whose caches start at position 1,000 (nothing cached) gives the logits of one starting at
    0 for every scheme acting inside attention; an absolute signal at the input does not (the check fails)."""
    model = zoo.create_model(
        "vanilla_lm", vocab_size=24, d_model=D, n_heads=H, n_layers=2, d_ff=48, position={"name": scheme}, dropout=0.0
    ).eval()
    tokens = torch.randint(0, 24, (2, 40), generator=torch.Generator().manual_seed(3))
    state = model.init_state(2)
    state.offset = 1000
    for layer in state.layers:
        assert isinstance(layer.attention, KVCache) and layer.attention.length == 0
        layer.attention.next = 1000
    with torch.no_grad():
        late, early = model(tokens, state=state).logits, model(tokens).logits
    if POSITION.get(scheme).kinds():
        torch.testing.assert_close(late, early, atol=2e-5, rtol=1e-4)
    else:
        assert not torch.allclose(late, early, atol=1e-3)


T5_CASES = [(m, c) for m, c, s in CASES if s == "t5_bias"]


@pytest.mark.parametrize("name,causal", T5_CASES, ids=[f"{m}-{'causal' if c else 'bidir'}" for m, c in T5_CASES])
def test_gradients_reach_the_t5_table(name, causal):
    table_part = part("t5_bias")
    attn = build(name, causal, table_part).train()
    (attn(inputs(2, length(name))).out ** 2).mean().backward()
    grad = table_part.table.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    assert not any(p is table_part.table for p in attn.parameters()), "the table belongs to the model, once"


def test_t5_table_is_shared_by_the_layers_and_the_decoder_has_its_own():
    lm = zoo.create_model(
        "vanilla_lm", vocab_size=24, d_model=D, n_heads=H, n_layers=3, d_ff=48, position={"name": "t5_bias"}
    )
    assert [k for k in lm.state_dict() if "table" in k] == ["position.table"]
    assert all(block.attention.position is lm.position for block in lm.stack.blocks)
    seq2seq = zoo.create_model(
        "vanilla_seq2seq", vocab_size=24, d_model=D, n_heads=H, n_layers=2, d_ff=48, position={"name": "t5_bias"}
    )
    assert sorted(k for k in seq2seq.state_dict() if "table" in k) == ["decoder_position.table", "position.table"]
    assert all(block.cross_attention.position is None for block in seq2seq.decoder.blocks)
