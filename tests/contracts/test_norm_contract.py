"""The contract every registered norm keeps (zoo/norm/), and the norm axis reaching every norm a model builds.

Per norm part (by its registration alone):

- shape and dtype kept (float32, float64), any leading shape (the stream's [b, t, d], a per-head
  [b, h, t, k]); each position normalised alone; every parameter receives a gradient;
- invariant to the input's scale (what makes it a normalisation), up to eps.

The axis: for every norm x every residual policy, each norm the policy and the final norm build is the
named part; for every preset with norm=rmsnorm no ``nn.LayerNorm`` is left anywhere in the model; and a
model config written before the axis (no ``norm`` key) builds today's LayerNorm with the same
parameter names, so its checkpoint loads.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import zoo
from zoo.norm import NORM, Norm, create_norm
from zoo.presets.factory import get_preset
from zoo.residual.base import RESIDUAL

NORMS = NORM.list()
D = 16


def build(name: str, dim: int = D) -> Norm:
    torch.manual_seed(0)
    norm = create_norm({"name": name, **NORM.get(name).contract_options()}, dim)
    with torch.no_grad():  # off the initial ones and zeros
        for p in norm.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return norm


@pytest.mark.parametrize("shape", [(2, 5, D), (2, 3, 5, D)], ids=["stream", "per_head"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", NORMS)
def test_shape_dtype_and_each_position_alone(name, dtype, shape):
    norm = build(name).to(dtype)
    x = torch.randn(*shape, dtype=dtype)
    y = norm(x)
    assert y.shape == x.shape and y.dtype == dtype and torch.isfinite(y).all()
    flat = x.reshape(-1, D)
    order = torch.randperm(flat.shape[0])
    torch.testing.assert_close(norm(flat[order]), y.reshape(-1, D)[order])
    torch.testing.assert_close(norm(flat[:1]), y.reshape(-1, D)[:1])


@pytest.mark.parametrize("name", NORMS)
def test_scale_invariant_and_every_parameter_gets_a_gradient(name):
    norm = build(name).double()
    x = torch.randn(3, 4, D, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(norm(70.0 * x), norm(10.0 * x), atol=1e-6, rtol=1e-6)  # eps negligible at this scale
    norm(x).square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for param_name, p in norm.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, param_name


def test_a_spec_is_a_name_or_a_dict_and_unknowns_are_refused():
    assert isinstance(create_norm("rmsnorm", 8), NORM.get("rmsnorm"))
    assert create_norm({"name": "rmsnorm", "eps": 1e-5}, 8).options.eps == 1e-5
    assert isinstance(create_norm(None, 8), NORM.get("layernorm"))  # a config from before the axis
    with pytest.raises(ValueError, match="rmsnorm"):
        create_norm("rmsnrom", 8)
    with pytest.raises(ValueError, match="bias"):
        create_norm({"name": "rmsnorm", "bias": False}, 8)
    with pytest.raises(ValueError, match="eps must be > 0"):
        create_norm({"name": "layernorm", "eps": 0.0}, 8)


# -- the axis reaches every norm a model builds ------------------------------------------------------


def norm_modules(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, (Norm, nn.LayerNorm))]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("residual", RESIDUAL.list())
def test_every_residual_and_the_final_norm_build_the_axis(residual, norm):
    model = zoo.create_model("vanilla_lm", **get_preset("vanilla_lm").tiny, residual=residual, norm=norm)
    expected = NORM.get(norm)
    block = model.stack.blocks[0]
    for policy in (block.attention_residual, block.feed_forward_residual):
        assert all(isinstance(m, expected) for m in norm_modules(policy)), (residual, norm)
    if RESIDUAL.get(residual).final_norm:
        assert isinstance(model.norm, expected)
    found = norm_modules(model)
    assert all(isinstance(m, expected) for m in found)
    assert bool(found) == any(RESIDUAL.get(residual).final_norm or norm_modules(p) for p in block.children())
    tokens = torch.randint(0, 32, (2, 7))
    model(tokens, tokens).loss.backward()
    assert all(p.grad is not None for m in found for p in m.parameters())


@pytest.mark.parametrize("preset", zoo.list_models())
def test_no_layernorm_is_left_in_any_preset_under_rmsnorm(preset):
    model = zoo.create_model(preset, **get_preset(preset).tiny, norm="rmsnorm")
    assert not [name for name, m in model.named_modules() if isinstance(m, nn.LayerNorm)]
    assert all(isinstance(m, NORM.get("rmsnorm")) for m in norm_modules(model))


def test_a_config_from_before_the_axis_builds_todays_layernorm_and_loads_its_weights():
    model = zoo.create_model("gtrxl", **get_preset("gtrxl").tiny)
    old = model.config.to_dict()
    del old["norm"]  # a checkpoint written before the norm axis
    rebuilt = zoo.create_model(**old)
    assert rebuilt.config.norm == {"name": "layernorm"}
    rebuilt.load_state_dict(model.state_dict())  # strict: the same names
    assert {k for k in model.state_dict() if k.endswith("norm.bias")}  # LayerNorm keeps its bias
    # the parameter names nn.LayerNorm had, so weights saved from it load
    reference = nn.LayerNorm(D)
    assert create_norm("layernorm", D).state_dict().keys() == reference.state_dict().keys()
