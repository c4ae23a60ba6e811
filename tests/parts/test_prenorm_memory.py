"""Pre-norm memory follows GTrXL's block: LayerNorm([StopGrad(M), E]) (Parisotto et al. 2019).

The memory M is the layer's raw input from earlier segments, normalised by the *current*
LayerNorm inside the graph; post-norm models are unchanged by this."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import zoo
from zoo.attention.xl_rel import XLMemory
from zoo.presets.factory import get_preset

# 1-layer pre-norm models with input memory: the paper's two (trxl_i, gtrxl), XL with pre_norm, and
# adaptive span (whose cache is also of layer inputs) with pre_norm
PRE_NORM = [
    ("trxl_i", {}),
    ("gtrxl", {}),
    ("transformer_xl", {"residual": "pre_norm"}),
    ("adaptive_span_lm", {"residual": "pre_norm"}),
]


def one_layer(name: str, **overrides) -> zoo.models.ZooModel:
    torch.manual_seed(0)
    return zoo.create_model(name, **{**get_preset(name).tiny, "n_layers": 1, "dropout": 0.0, **overrides})


def norms(model) -> list[torch.nn.LayerNorm]:
    """The LayerNorms inside the block's residual policies (not the model's final norm)."""
    return [m for m in model.stack.blocks[0].modules() if isinstance(m, torch.nn.LayerNorm)]


def segments(seed: int = 1, t: int = 8):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 32, (2, t), generator=g), torch.randint(0, 32, (2, t), generator=g)


PRE_NORM_IDS = [name + "".join(f"_{v}" for v in overrides.values()) for name, overrides in PRE_NORM]


@pytest.mark.parametrize("grad", [True, False], ids=["train", "eval_no_grad"])
@pytest.mark.parametrize("name,overrides", PRE_NORM, ids=PRE_NORM_IDS)
def test_segment_two_does_not_depend_on_which_layernorm_made_the_memory(name, overrides, grad):
    """One layer: its input is the embedding, so the memory cannot depend on the LayerNorm's weights.
    Segment 2 run with weights B gives the same logits whether segment 1's memory was made under
    weights A (before an 'optimiser step' on the norm) or under B."""
    model = one_layer(name, **overrides)
    model.train(grad)
    seg1, seg2 = segments()
    with torch.set_grad_enabled(grad):
        made_under_a = model(seg1, state=model.init_state(2)).state
        with torch.no_grad():
            for norm in norms(model):
                norm.weight.mul_(1.7).add_(0.3)
                norm.bias.add_(0.5)
        made_under_b = model(seg1, state=model.init_state(2)).state
        logits_a = model(seg2, state=made_under_a).logits
        logits_b = model(seg2, state=made_under_b).logits
    torch.testing.assert_close(logits_a, logits_b, rtol=1e-5, atol=1e-5)


def test_layernorm_gradient_includes_memory_positions():
    """Against the formula written out: h = LayerNorm([StopGrad(M), E]), attention of h's last t rows
    over all of h, x + Attn, the feed-forward half, the head. The LayerNorm's weight gradient gets
    the memory positions' share (the old stored-normalised memory misses it)."""
    model = one_layer("transformer_xl", residual="pre_norm")
    seg1, seg2 = segments()
    state = model(seg1, state=model.init_state(2)).state
    out = model(seg2, seg2, state=state)
    block = model.stack.blocks[0]
    norm = block.attention_residual.norm
    (ours,) = torch.autograd.grad(out.loss, [norm.weight])

    def reference(memory_through_norm: bool) -> torch.Tensor:
        memory = model.embed(seg1).detach()  # StopGrad(M): layer 0's input in segment 1
        e = model.embed(seg2)
        h = F.layer_norm(torch.cat([memory, e], dim=1), (e.shape[-1],), norm.weight, norm.bias, norm.options.eps)
        m = memory.shape[1]
        h_memory = h[:, :m] if memory_through_norm else h[:, :m].detach()
        attended = block.attention(h[:, m:], state=XLMemory(h_memory)).out
        x = e + attended
        ff_norm = block.feed_forward_residual.norm
        x = x + block.feed_forward(F.layer_norm(x, (x.shape[-1],), ff_norm.weight, ff_norm.bias, ff_norm.options.eps))
        logits = model.head(model.norm(x))
        loss = F.cross_entropy(logits.flatten(0, 1), seg2.flatten())
        torch.testing.assert_close(loss, out.loss)
        return torch.autograd.grad(loss, [norm.weight])[0]

    torch.testing.assert_close(ours, reference(True))
    stale = reference(False)  # no gradient through memory positions: what stored-normalised memory gives
    assert (ours - stale).norm() > 1e-3 * ours.norm(), "the memory positions must contribute to the gradient"


@pytest.mark.parametrize("name,overrides", [("transformer_xl", {}), ("adaptive_span_lm", {})])
def test_post_norm_models_are_unchanged(name, overrides):
    """Post-norm: the sub-layer sees the raw stream, so the block's LayerInput path must equal the
    plain call (no layer_input) bit for bit, logits and stored memory, over three segments."""
    model = one_layer(name, n_layers=2, **overrides)
    assert model.config.residual["name"] == "post_norm"
    plain = one_layer(name, n_layers=2, **overrides)
    plain.load_state_dict(model.state_dict())
    for block in plain.stack.blocks:
        block.attention.remembers_inputs = False  # the block then calls attention(h, state=...) only
    state, plain_state = model.init_state(2), plain.init_state(2)
    for seed in range(3):
        tokens, _ = segments(seed)
        out, plain_out = model(tokens, state=state), plain(tokens, state=plain_state)
        torch.testing.assert_close(out.logits, plain_out.logits, rtol=0, atol=0)
        state, plain_state = out.state, plain_out.state
    for layer, plain_layer in zip(state.layers, plain_state.layers):
        mine = layer.attention.states if hasattr(layer.attention, "states") else layer.attention.x
        theirs = plain_layer.attention.states if hasattr(plain_layer.attention, "states") else plain_layer.attention.x
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)


def test_pre_norm_memory_holds_the_raw_stream():
    """What is stored is the block's input (here the embedding), not its normalised view."""
    model = one_layer("gtrxl")
    seg1, _ = segments()
    memory = model(seg1, state=model.init_state(2)).state.layers[0].attention
    torch.testing.assert_close(memory.states, model.embed(seg1))
