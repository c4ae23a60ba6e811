"""The contract every registered residual policy keeps, selected by its flags (zoo/residual/).

A policy registered with ``@RESIDUAL.register`` is exercised here the moment it registers:

- ``forward(x, f) == join(x, f(sublayer_input(x)))``, f called once: the two steps the block uses;
- ``sublayer_input`` acts on each position alone (what lets memory be normalised later);
- shape and dtype kept (float32, float64); every parameter receives a gradient;
- memory made before a weight change is read with the current weights: in a one-layer
  Transformer-XL, segment 2 does not depend on the weights that ran segment 1;
- ``additive``: ``forward == x + branch``, and the reversible stack's recomputed gradients equal
  plain autograd's (dropout on, padding); otherwise ``branch`` raises and reversible refuses it;
- ``final_norm``: the model ends in a norm (the model's norm axis) exactly when the flag says so;
- a tiny model with it learns a fixed batch.

The last test registers a throwaway policy in this file and runs the whole contract on it: adding a
residual needs nothing outside its own module.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.norm import Norm
from zoo.presets.factory import get_preset
from zoo.residual.base import RESIDUAL, AdditiveResidual

D = 16
NAMES = RESIDUAL.list()


def build(name: str, d: int = D, dropout: float = 0.0):
    torch.manual_seed(0)
    cls = RESIDUAL.get(name)
    residual = cls(d, dropout, **cls.contract_options())
    with torch.no_grad():  # off the initial values: rezero's alpha = 0 would make everything the identity
        for p in residual.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return residual


def perturb(model: nn.Module, scale: float = 0.1) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))


def sublayer(d: int = D, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(d, d), nn.Tanh()).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", NAMES)
def test_forward_is_the_join_of_the_sublayer_on_its_input(name, dtype):
    residual = build(name).to(dtype).eval()
    f = sublayer(dtype=dtype)
    calls = []

    def recorded(h):
        calls.append(h)
        return f(h)

    x = torch.randn(2, 5, D, dtype=dtype)
    y = residual(x, recorded)
    assert y.shape == x.shape and y.dtype == dtype and torch.isfinite(y).all()
    assert len(calls) == 1
    torch.testing.assert_close(calls[0], residual.sublayer_input(x))
    torch.testing.assert_close(y, residual.join(x, f(residual.sublayer_input(x))))


@pytest.mark.parametrize("name", NAMES)
def test_sublayer_input_acts_on_each_position_alone(name):
    residual = build(name).eval()
    x = torch.randn(3, 6, D)
    order = torch.randperm(6)
    torch.testing.assert_close(residual.sublayer_input(x)[:, order], residual.sublayer_input(x[:, order]))
    torch.testing.assert_close(residual.sublayer_input(x)[:, 2:4], residual.sublayer_input(x[:, 2:4]))
    torch.testing.assert_close(residual.sublayer_input(x)[1:2], residual.sublayer_input(x[1:2]))


@pytest.mark.parametrize("name", NAMES)
def test_every_parameter_gets_a_gradient(name):
    residual = build(name)
    f = sublayer()
    x = torch.randn(2, 5, D, requires_grad=True)
    residual(x, f).square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for param_name, p in residual.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, param_name


@pytest.mark.parametrize("name", NAMES)
def test_memory_is_read_with_the_current_weights(name):
    """One layer: the memory is the embedding, whatever the block's weights; so segment 2's logits
    must not depend on the block weights that were current when segment 1 ran."""
    torch.manual_seed(0)
    small = {**get_preset("transformer_xl").tiny, "n_layers": 1, "dropout": 0.0}
    model = zoo.create_model("transformer_xl", **small, residual=name)
    g = torch.Generator().manual_seed(2)
    seg1, seg2 = torch.randint(0, 32, (2, 6), generator=g), torch.randint(0, 32, (2, 6), generator=g)
    before = model(seg1, state=model.init_state(2)).state
    perturb(model.stack.blocks[0], 0.3)  # an "optimiser step" on every block weight
    after = model(seg1, state=model.init_state(2)).state
    torch.testing.assert_close(model(seg2, state=before).logits, model(seg2, state=after).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_branch_exists_exactly_when_additive(name):
    residual = build(name).eval()
    f = sublayer()
    x = torch.randn(2, 5, D)
    if RESIDUAL.get(name).additive:
        torch.testing.assert_close(residual(x, f), x + residual.branch(x, f))
    else:
        with pytest.raises(TypeError, match="not additive"):
            residual.branch(x, f)
        with pytest.raises(ValueError, match="additive"):
            zoo.create_model("reformer", residual=name, **REFORMER_SMALL)


REFORMER_SMALL = dict(
    vocab_size=40,
    d_model=32,
    n_heads=4,
    d_ff=96,
    n_layers=2,
    dropout=0.1,
    attention_dropout=0.1,
    attention={"chunk_size": 8, "n_hashes": 2},
    ff_chunk_size=8,
)


@pytest.mark.parametrize("name", [n for n in NAMES if RESIDUAL.get(n).additive])
def test_additive_residual_reversible_gradients_equal_stored_ones(name):
    """Same weights, same seed, dropout on, padding: the recomputing stack (RNG restored) and plain
    autograd through the same coupling give the same loss and the same gradient for every parameter."""
    ours = zoo.create_model("reformer", residual=name, **REFORMER_SMALL).train()
    perturb(ours)
    plain = zoo.create_model("reformer", residual=name, **{**REFORMER_SMALL, "stack": {"recompute": False}}).train()
    plain.load_state_dict(ours.state_dict())
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 40, (2, 21), generator=g)
    tokens, targets = tokens[:, :-1], tokens[:, 1:]
    pad = torch.ones_like(tokens, dtype=torch.bool)
    pad[1, -5:] = False
    losses = []
    for model in (ours, plain):
        torch.manual_seed(123)
        loss = model(tokens, targets, pad_mask=pad).loss
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1])
    for (param_name, p), q in zip(ours.named_parameters(), plain.parameters()):
        assert p.grad is not None and q.grad is not None, param_name
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=param_name)


@pytest.mark.parametrize("name", NAMES)
def test_final_norm_follows_the_flag(name):
    model = zoo.create_model("vanilla_lm", **get_preset("vanilla_lm").tiny, residual=name)
    assert isinstance(model.norm, Norm) == RESIDUAL.get(name).final_norm


@pytest.mark.parametrize("name", NAMES)
def test_tiny_model_learns_a_fixed_batch(name):
    torch.manual_seed(0)
    model = zoo.create_model("vanilla_lm", **{**get_preset("vanilla_lm").tiny, "n_layers": 2}, residual=name)
    perturb(model, 0.02)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, 32, (4, 13), generator=torch.Generator().manual_seed(0))
    first = None
    for _ in range(30):
        loss = model(tokens[:, :-1], tokens[:, 1:]).loss
        first = float(loss.detach()) if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert float(loss.detach()) < 0.7 * first


# -- reference maths of the registered policies --------------------------------------------------


def plain_sublayer(x):
    return 2.0 * x + 1.0


def test_policies_follow_their_formulas():
    x = torch.randn(2, 3, 8)
    post, pre, rz = (RESIDUAL.get(n)(8) for n in ("post_norm", "pre_norm", "rezero"))
    torch.testing.assert_close(post(x, plain_sublayer), F.layer_norm(x + plain_sublayer(x), (8,)))
    torch.testing.assert_close(pre(x, plain_sublayer), x + plain_sublayer(F.layer_norm(x, (8,))))
    torch.testing.assert_close(rz(x, plain_sublayer), x)  # alpha starts at 0: the identity
    with torch.no_grad():
        rz.alpha.fill_(0.5)
    torch.testing.assert_close(rz(x, plain_sublayer), x + 0.5 * plain_sublayer(x))


# -- a throwaway policy: registering it is all it takes --------------------------------------------


class HalfStep(AdditiveResidual):
    """x + 0.5 * Dropout(Sublayer(LayerNorm(x))): defined, registered and nothing else."""

    final_norm = True

    def __init__(self, d_model: int, dropout: float = 0.0, **options):
        super().__init__(d_model, dropout, **options)
        self.norm = nn.LayerNorm(d_model)

    def sublayer_input(self, x):
        return self.norm(x)

    def update(self, y):
        return 0.5 * self.drop(y)


@pytest.fixture
def half_step():
    RESIDUAL.register("_test_half_step", HalfStep)
    try:
        yield "_test_half_step"
    finally:
        RESIDUAL.unregister("_test_half_step")


def test_a_new_residual_needs_only_its_registration(half_step):
    checks = [
        test_sublayer_input_acts_on_each_position_alone,
        test_every_parameter_gets_a_gradient,
        test_memory_is_read_with_the_current_weights,
        test_branch_exists_exactly_when_additive,
        test_additive_residual_reversible_gradients_equal_stored_ones,
        test_final_norm_follows_the_flag,
        test_tiny_model_learns_a_fixed_batch,
    ]
    for dtype in (torch.float32, torch.float64):
        test_forward_is_the_join_of_the_sublayer_on_its_input(half_step, dtype)
    for check in checks:
        check(half_step)
    # and every builder takes it by name
    model = zoo.create_model("gtrxl", **get_preset("gtrxl").tiny, residual=half_step)
    assert isinstance(model.stack.blocks[0].attention_residual, HalfStep)
    assert zoo.create_model("reformer", residual=half_step, **REFORMER_SMALL).config.residual == {"name": half_step}
