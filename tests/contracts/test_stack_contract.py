"""The contract every registered stack keeps, selected by its capability flags (zoo/stacks/).

A stack registered with ``@STACK.register`` is exercised here the moment it registers, under each
option set of its ``contract_variants()``:

- every layer's aux losses come back (summed by name) and carry their gradient;
- every layer's stats come back as ``layer<i>/attn/<name>``, and layer i ran its block as layer i
  (a stack re-applying one block numbers its steps as layers, so depth-dependent patterns vary);
- cross-attention stats come back beside self-attention ones (``layer<i>/cross/<name>``), not over them
  (``supports_cross``);
- when it streams (``keeps_state`` and no ``stream_refusal``): the state has one entry per layer (step)
  and a sequence fed in two calls equals one call; otherwise a state is refused;
- with ``needs_additive``: a block that is not additive is refused at build time;
- ``forward`` takes no ``offset`` (positions belong to the model's position module).

The blocks are built here from a probe attention (plain softmax attention that reports an aux loss
and its layer index), so the checks do not depend on any registered mechanism's own behaviour.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

from zoo.attention.base import ATTENTION, Attention, AttnOutput
from zoo.blocks import Block
from zoo.feed_forward.mlp import MLP as FeedForward
from zoo.residual.base import RESIDUAL
from zoo.stacks.base import STACK

D, H, T, LAYERS = 16, 2, 7, 3
AUX_WEIGHT = 0.3

CASES = [(name, variant) for name in STACK.list() for variant in STACK.get(name).contract_variants()]
IDS = [f"{name}-{'-'.join(f'{k}={v}' for k, v in variant.items()) or 'default'}" for name, variant in CASES]


class ProbeAttention(Attention):
    """softmax(q k^T / sqrt(k)) v that reports aux = AUX_WEIGHT * mean(out^2) and, as stats, that
    value and the layer it ran as."""

    supports_cross = True

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        self.add_projections()

    def forward(self, x, *, context=None, pad_mask=None, state=None) -> AttnOutput:
        self.check_inputs(x, context, pad_mask, state)
        keys = context if context is not None else x
        q, k, v = (self.split_heads(f(y)) for f, y in ((self.to_q, x), (self.to_k, keys), (self.to_v, keys)))
        mask = None if pad_mask is None else pad_mask[:, None, None, :]
        causal = self.causal and context is None and mask is None
        out = self.to_out(self.merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)))
        aux = AUX_WEIGHT * out.square().mean()
        stats = {"aux_value": aux.detach(), "depth": torch.tensor(float(self.layer_index))}
        return AttnOutput(out, aux={"probe": aux}, stats=stats)


def additive_residual() -> str:
    return next(name for name in RESIDUAL.list() if RESIDUAL.get(name).additive)


def probe_stack(name: str, variant: dict, *, cross: bool = False, residual: str | None = None, attention=None):
    residual_cls = RESIDUAL.get(residual or additive_residual())

    def make_block(i: int) -> Block:
        attn = attention(i) if attention is not None else ProbeAttention(D, H, causal=True, layer_index=i)
        cross_attn = ProbeAttention(D, H, layer_index=i) if cross else None
        return Block(attn, FeedForward(D, 2 * D), lambda: residual_cls(D), cross_attn)

    torch.manual_seed(0)
    stack = STACK.get(name)(make_block, LAYERS, D, **variant)
    with torch.no_grad():  # move every parameter off its initial value (rezero's alpha = 0 makes blocks identities)
        for p in stack.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return stack


@pytest.mark.parametrize("name,variant", CASES, ids=IDS)
def test_every_layer_returns_its_aux_loss_and_stats(name, variant):
    stack = probe_stack(name, variant).train()
    x = torch.randn(2, T, D, requires_grad=True)
    out = stack(x)
    assert out.x.shape == x.shape and torch.isfinite(out.x).all()
    per_layer = [out.stats[f"layer{i}/attn/aux_value"] for i in range(LAYERS)]
    depths = [int(out.stats[f"layer{i}/attn/depth"]) for i in range(LAYERS)]
    assert depths == list(range(LAYERS)), "layer i must run its block as layer i"
    assert "probe" in out.aux  # beside any loss of the stack's own (ACT's ponder cost)
    assert all(value.dim() == 0 and torch.isfinite(value) for value in out.aux.values())
    torch.testing.assert_close(out.aux["probe"].detach(), sum(per_layer))
    # the aux loss trains: its gradient reaches the attention parameters and the input
    attention_params = [p for n, p in stack.named_parameters() if ".attention." in n or n.startswith("attention.")]
    grads = torch.autograd.grad(out.aux["probe"], [x, *attention_params], allow_unused=True)
    assert grads[0] is not None and grads[0].abs().sum() > 0
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads[1:])


@pytest.mark.parametrize(
    "name,variant",
    [c for c in CASES if STACK.get(c[0]).supports_cross],
    ids=[i for c, i in zip(CASES, IDS) if STACK.get(c[0]).supports_cross],
)
def test_cross_attention_stats_sit_beside_self_attention_stats(name, variant):
    stack = probe_stack(name, variant, cross=True).eval()
    context = torch.randn(2, 5, D)
    out = stack(torch.randn(2, T, D), context=context)
    for i in range(LAYERS):
        own, cross = out.stats[f"layer{i}/attn/aux_value"], out.stats[f"layer{i}/cross/aux_value"]
        assert not torch.equal(own, cross)
    total = sum(out.stats[f"layer{i}/{part}/aux_value"] for i in range(LAYERS) for part in ("attn", "cross"))
    torch.testing.assert_close(out.aux["probe"], total)


def streams(name: str, variant: dict) -> bool:
    """Whether the stack, built with these options, threads state (its own answer: ``stream_refusal``)."""
    return STACK.get(name).keeps_state and probe_stack(name, variant).stream_refusal() is None


STREAMING = [streams(*c) for c in CASES]


@pytest.mark.parametrize(
    "name,variant",
    [c for c, s in zip(CASES, STREAMING) if s],
    ids=[i for i, s in zip(IDS, STREAMING) if s],
)
def test_state_threads_one_entry_per_layer(name, variant):
    """A stateful attention (the first registered one with supports_memory and a plain KV cache
    contract) continues a sequence across calls: two calls equal one."""
    stateful = [n for n in ATTENTION.list() if ATTENTION.get(n).supports_memory and not ATTENTION.get(n).causal_only]
    attention_name = stateful[0]
    cls = ATTENTION.get(attention_name)

    def attention(i):
        return cls(D, H, causal=True, layer_index=i, **cls.contract_options())

    stack = probe_stack(name, variant, attention=attention).eval()
    x = torch.randn(2, T, D)
    with torch.no_grad():  # generation and evaluation: every stack that keeps state threads it here
        whole = stack(x, state=stack.init_state(2))
        first = stack(x[:, :4], state=stack.init_state(2))
        per_layer = first.state if isinstance(first.state, list) else first.state.steps  # universal: per step
        assert len(per_layer) == LAYERS
        second = stack(x[:, 4:], state=first.state)
    torch.testing.assert_close(torch.cat([first.x, second.x], dim=1), whole.x, rtol=1e-5, atol=1e-5)
    try:  # with gradients: the same, or a refusal that says why (a stack that recomputes in backward)
        with_grad = stack(x, state=stack.init_state(2))
    except ValueError as refusal:
        assert "no_grad" in str(refusal), refusal
    else:
        torch.testing.assert_close(with_grad.x, whole.x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "name,variant",
    [c for c, s in zip(CASES, STREAMING) if not s],
    ids=[i for i, s in zip(IDS, STREAMING) if not s],
)
def test_stateless_stack_refuses_a_state(name, variant):
    stack = probe_stack(name, variant)
    assert stack.init_state(2) is None and stack.stream_refusal()
    with pytest.raises(ValueError, match="state"):
        stack(torch.randn(2, T, D), state=[object()] * LAYERS)


@pytest.mark.parametrize(
    "name,variant",
    [c for c in CASES if STACK.get(c[0]).needs_additive],
    ids=[i for c, i in zip(CASES, IDS) if STACK.get(c[0]).needs_additive],
)
def test_needs_additive_refuses_other_residuals(name, variant):
    for residual in RESIDUAL.list():
        if not RESIDUAL.get(residual).additive:
            with pytest.raises(ValueError, match="additive"):
                probe_stack(name, variant, residual=residual)


@pytest.mark.parametrize("name", STACK.list())
def test_forward_takes_no_offset(name):
    assert "offset" not in inspect.signature(STACK.get(name).forward).parameters


def test_reversible_aux_loss_trains_as_with_stored_activations():
    """The recomputing stack returns each layer's aux loss as an output of its autograd function and
    pushes the aux gradient in during the recompute: loss + aux gives the gradients of plain autograd."""
    grads, values = [], []
    for variant in ({}, {"recompute": False}):
        stack = probe_stack("reversible", variant).train()
        x = torch.randn(2, T, D, generator=torch.Generator().manual_seed(3), requires_grad=True)
        out = stack(x)
        values.append(out.aux["probe"])
        total = out.x.square().mean() + out.aux["probe"]
        grads.append(torch.autograd.grad(total, [x, *stack.parameters()]))
    torch.testing.assert_close(values[0], values[1])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
