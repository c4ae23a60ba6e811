"""The feed-forward parts against their formulas and a reference we did not write (zoo/feed_forward/).

- the gated units of Shazeer 2020 equal the hand-written (act(x W_gate) * x W_up) W_down, which differs
  from the same formula with gate and up swapped or another activation; and equal HF's ``LlamaMLP``
  (the ``references`` extra; skipped where absent) with its activation set to each one;
- the 2/3 d_ff rule gives Llama-7B's width (11,008 from d_model 4,096);
- ``mlp`` is eq. 2 of the 2017 paper, with and without biases;
- the model's ``activation`` key still reaches mlp, a gated name there points to ``feed_forward=``, and a
  config written before the axis (no ``feed_forward`` key) builds today's network with the same names.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import zoo
from zoo.feed_forward import FEED_FORWARD, create_feed_forward
from zoo.feed_forward.gated import hidden_width
from zoo.feed_forward.mlp import MLP
from zoo.presets.factory import get_preset

D, FF = 12, 18
GATED = {"swiglu": F.silu, "geglu": F.gelu, "reglu": F.relu}
HF_ACTIVATION = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu"}


def randomised(part):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in part.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return part.double()


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("name", list(GATED))
def test_gated_unit_is_the_papers_formula(name, bias):
    part = randomised(create_feed_forward({"name": name, "bias": bias}, D, FF))
    x = torch.randn(2, 5, D, dtype=torch.float64)
    gate, up, down = part.gate_proj, part.up_proj, part.down_proj
    act = GATED[name]
    expected = down(act(gate(x)) * up(x))
    torch.testing.assert_close(part(x), expected, atol=1e-12, rtol=1e-12)
    swapped = down(act(up(x)) * gate(x))
    assert not torch.allclose(part(x), swapped), "gate and up must not be interchangeable"
    for other_name, other in GATED.items():
        if other_name != name:
            assert not torch.allclose(part(x), down(other(gate(x)) * up(x))), other_name
    assert (gate.bias is not None) == (up.bias is not None) == (down.bias is not None) == bias


@pytest.mark.parametrize("name", list(GATED))
def test_gated_unit_equals_hf_llama_mlp(name):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    config = LlamaConfig(
        hidden_size=D, intermediate_size=FF, hidden_act=HF_ACTIVATION[name], mlp_bias=False, num_attention_heads=3
    )
    reference = LlamaMLP(config).double()
    part = randomised(create_feed_forward(name, D, FF))
    reference.load_state_dict(part.state_dict())  # the same names: gate_proj, up_proj, down_proj
    x = torch.randn(3, 7, D, dtype=torch.float64)
    torch.testing.assert_close(part(x), reference(x), atol=1e-12, rtol=1e-12)


def test_two_thirds_rule_is_llamas():
    assert hidden_width(4 * 4096, True, 256) == 11008  # Llama-7B's intermediate_size
    assert hidden_width(4 * 5120, True, 256) == 13824  # Llama-13B's
    assert hidden_width(96, True, 1) == 64 and hidden_width(96, False, 1) == 96 and hidden_width(90, False, 32) == 96
    part = create_feed_forward({"name": "swiglu", "two_thirds": True, "multiple_of": 8}, 32, 128)
    assert part.hidden == 88 and part.gate_proj.out_features == 88  # floor(256 / 3) = 85, up to 88
    mlp = create_feed_forward("mlp", 32, 128)
    assert abs(part.parameter_count() - mlp.parameter_count()) / mlp.parameter_count() < 0.05


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("bias", [True, False])
def test_mlp_is_eq_2(activation, bias):
    part = randomised(create_feed_forward({"name": "mlp", "bias": bias}, D, FF, activation=activation))
    x = torch.randn(2, 5, D, dtype=torch.float64)
    act = F.relu if activation == "relu" else F.gelu
    torch.testing.assert_close(part(x), part.w2(act(part.w1(x))), atol=1e-12, rtol=1e-12)
    assert (part.w1.bias is not None) == bias


def test_the_activation_key_reaches_mlp_and_points_gated_names_to_the_axis():
    tiny = get_preset("vanilla_lm").tiny
    model = zoo.create_model("vanilla_lm", **tiny, activation="gelu")
    assert model.stack.blocks[0].feed_forward.options.activation == "gelu"
    own = zoo.create_model("vanilla_lm", **tiny, activation="gelu", feed_forward={"name": "mlp", "activation": "relu"})
    assert own.stack.blocks[0].feed_forward.options.activation == "relu"  # the part's own option wins
    with pytest.raises(ValueError, match="the feed_forward axis: feed_forward=swiglu"):
        zoo.create_model("vanilla_lm", **tiny, activation="swiglu")
    with pytest.raises(ValueError, match="fixes its own"):
        zoo.create_model("vanilla_lm", **tiny, activation="gelu", feed_forward="swiglu")
    with pytest.raises(ValueError, match="activation must be relu or gelu"):
        zoo.create_model("vanilla_lm", **tiny, activation="tanh")
    with pytest.raises(ValueError, match="activation must be one of relu, gelu"):
        zoo.create_model("vanilla_lm", **tiny, feed_forward={"name": "mlp", "activation": "swish"})


def test_a_config_from_before_the_axis_builds_todays_network_and_loads_its_weights():
    model = zoo.create_model("reformer", **get_preset("reformer").tiny)
    old = model.config.to_dict()
    del old["feed_forward"], old["norm"]  # a checkpoint written before both axes
    rebuilt = zoo.create_model(**old)
    assert rebuilt.config.feed_forward == {"name": "mlp"}
    assert isinstance(rebuilt.stack.blocks[0].feed_forward, MLP)
    assert rebuilt.stack.blocks[0].feed_forward.chunk_size == model.config.ff_chunk_size > 0
    rebuilt.load_state_dict(model.state_dict())
    assert any(k.endswith("feed_forward.w1.weight") for k in model.state_dict())


def test_every_part_is_registered_with_a_paper():
    for name in FEED_FORWARD.list():
        module = __import__(FEED_FORWARD.get(name).__module__, fromlist=["_"])
        assert "arXiv:" in module.__doc__, name
