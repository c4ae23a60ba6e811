"""The initialisation axis (zoo/init/): ``default`` leaves every preset exactly as it was built before the
axis; ``gpt2`` draws what its docstring lists at the stated scales and nothing else; ``default``'s
``table_std`` is the LRA patch (``token_init_std`` + ``position.init_std``) as one switch."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import zoo
from zoo.models.base import HEAD
from zoo.presets.factory import get_preset, preset_config

BIG = dict(vocab_size=512, d_model=128, n_layers=3, n_heads=4, d_ff=256, dropout=0.0)


@pytest.mark.parametrize("preset", zoo.list_models())
def test_default_is_every_parts_own_initialisation(preset):
    """The same draws as building the head with no scheme at all: every existing preset unchanged."""
    config = preset_config(preset, **get_preset(preset).tiny)
    assert config.init == {"name": "default"}
    torch.manual_seed(0)
    plain = HEAD.get(config.kind)(config)
    torch.manual_seed(0)
    ours = zoo.create_model(preset, **get_preset(preset).tiny)
    for (name, a), b in zip(plain.state_dict().items(), ours.state_dict().values()):
        assert torch.equal(a, b), name


def close_std(tensor, std, rel=0.1):
    return abs(tensor.float().std().item() - std) < rel * std


@pytest.mark.parametrize("scale_depth", [True, False])
def test_gpt2_draws_what_it_says(scale_depth):
    torch.manual_seed(0)
    model = zoo.create_model(
        "vanilla_lm",
        **BIG,
        residual="pre_norm",
        norm="rmsnorm",
        feed_forward={"name": "swiglu", "bias": True},
        position="learned",
        tie_embeddings=False,
        init={"name": "gpt2", "scale_depth": scale_depth},
    )
    out_std = 0.02 / math.sqrt(2 * BIG["n_layers"]) if scale_depth else 0.02
    assert model.embed.scale == 1.0 and close_std(model.embed.weight, 0.02) and close_std(model.head.weight, 0.02)
    assert close_std(model.position.table.weight, 0.02)
    for block in model.stack.blocks:
        attention, ff = block.attention, block.feed_forward
        for linear in (attention.to_q, attention.to_k, attention.to_v, ff.gate_proj, ff.up_proj):
            assert close_std(linear.weight, 0.02)
        for linear in (attention.to_out, ff.down_proj):
            assert close_std(linear.weight, out_std)
        for linear in (attention.to_q, attention.to_out, ff.gate_proj, ff.down_proj):
            assert linear.bias is None or not linear.bias.any()
        assert all(torch.equal(p, torch.ones_like(p)) for p in block.attention_residual.norm.parameters())
    assert torch.equal(model.norm.weight, torch.ones_like(model.norm.weight))  # norms keep their own


def test_gpt2_keeps_what_it_does_not_name_and_refuses_what_it_cannot_do():
    torch.manual_seed(0)
    default = zoo.create_model("universal_transformer_act", **get_preset("universal_transformer_act").tiny)
    torch.manual_seed(0)
    gpt2 = zoo.create_model("universal_transformer_act", **get_preset("universal_transformer_act").tiny, init="gpt2")
    assert torch.equal(gpt2.stack.halting.weight, default.stack.halting.weight)  # the halting unit: its own
    assert not torch.equal(gpt2.stack.block.attention.to_q.weight, default.stack.block.attention.to_q.weight)
    with pytest.raises(ValueError, match="leave token_init_std at 0"):
        zoo.create_model("vanilla_lm", **BIG, init="gpt2", token_init_std=0.02)
    with pytest.raises(ValueError, match="adaptive input"):
        zoo.create_model("vanilla_lm", **BIG, adaptive={"cutoffs": [64]}, init="gpt2")
    with pytest.raises(ValueError, match="std must be > 0"):
        zoo.create_model("vanilla_lm", **BIG, init={"name": "gpt2", "std": 0.0})


def test_table_std_is_the_lra_patch_as_one_switch():
    """init.table_std=0.02 draws the tables lra_setting=nystromformer asks with token_init_std=0.02 and
    position.init_std=0.02: plain N(0, 0.02) tables read unscaled; the rest as the parts draw it."""
    learned = {"name": "learned"}
    torch.manual_seed(0)
    switch = zoo.create_model(
        "vanilla_classifier", **BIG, position=learned, init={"name": "default", "table_std": 0.02}
    )
    torch.manual_seed(0)
    patch = zoo.create_model("vanilla_classifier", **BIG, position={**learned, "init_std": 0.02}, token_init_std=0.02)
    for model in (switch, patch):
        assert model.embed.scale == 1.0 and close_std(model.embed.weight, 0.02)
        assert close_std(model.position.table.weight, 0.02)
    for a, b in zip(switch.stack.parameters(), patch.stack.parameters()):
        assert torch.equal(a, b)  # the blocks are drawn before the tables are redrawn: the same
    with pytest.raises(ValueError, match="both set the token table"):
        zoo.create_model("vanilla_lm", **BIG, token_init_std=0.02, init={"name": "default", "table_std": 0.02})


def test_a_config_from_before_the_axis_builds_the_default():
    model = zoo.create_model("vanilla_lm", **get_preset("vanilla_lm").tiny, init="gpt2")
    old = model.config.to_dict()
    del old["init"]
    assert zoo.create_model(**old).config.init == {"name": "default"}
    rebuilt = zoo.create_model(**model.config.to_dict())  # a gpt2 checkpoint rebuilds with its unscaled table
    assert rebuilt.embed.scale == 1.0
    rebuilt.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 32, (2, 6))
    torch.testing.assert_close(rebuilt.eval()(tokens).logits, model.eval()(tokens).logits)


@pytest.mark.parametrize("preset", zoo.list_models())
def test_every_preset_takes_gpt2_or_refuses_with_the_reason(preset):
    try:
        model = zoo.create_model(preset, **get_preset(preset).tiny, init="gpt2")
    except ValueError as error:
        assert "init=gpt2" in str(error), str(error)
        return
    assert any(isinstance(m, nn.Linear) and abs(m.weight.std().item() - 0.02) < 0.01 for m in model.modules())


# seed 0, each preset's tiny variant: the sum of its initial parameters and the next torch.rand(1), recorded
# before the norm, feed-forward and init axes; building a model must draw what it drew then (validating a
# part's options draws nothing), so seeded runs replay. A change that redraws must say so here.
DRAWN_BEFORE_THE_AXES = {
    "vanilla_lm": (144.23927913350417, 0.6662487983703613),
    "universal_transformer": (70.80988649134088, 0.8464396595954895),
    "gtrxl": (433.13201057126935, 0.965022087097168),
    "reformer": (173.16573670321668, 0.42856407165527344),
    "vanilla_seq2seq": (345.4776794403042, 0.5332179069519043),
}


@pytest.mark.parametrize("preset", list(DRAWN_BEFORE_THE_AXES))
def test_building_draws_what_it_drew_before_the_axes(preset):
    torch.manual_seed(0)
    model = zoo.create_model(preset, **get_preset(preset).tiny)
    total = sum(float(p.detach().double().sum()) for p in model.parameters())
    assert (total, float(torch.rand(1))) == pytest.approx(DRAWN_BEFORE_THE_AXES[preset], rel=1e-12)
