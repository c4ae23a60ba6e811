"""experiments/sink_mass.py: the attention weights it recomputes are the ones the layer uses (weights times
values through the output projection give the layer's output, with rope and with ALiBi), and the mass on
the first keys is read from them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.script_modules import load_script

import zoo
from zoo.position.base import POSITION

SCRIPT = Path(__file__).parents[2] / "experiments" / "sink_mass.py"


def load():
    return load_script(SCRIPT)


@pytest.mark.parametrize("position", ["none", "rope", "alibi"])
@torch.no_grad()
def test_recomputed_weights_give_the_layers_output(position):
    sink_mass = load()
    torch.manual_seed(0)
    part = POSITION.get(position)(16, 64, n_heads=2)
    attn = zoo.create_attention("vanilla", d_model=16, n_heads=2, causal=True, position=part).eval()
    x = torch.randn(2, 12, 16)
    weights = sink_mass.attention_weights(attn, x)  # [b, h, t, t]
    values = attn.split_heads(attn.to_v(x))
    out = attn.to_out(attn.merge_heads(weights @ values))
    torch.testing.assert_close(out, attn(x).out, atol=1e-5, rtol=1e-4)
    assert torch.all(weights.triu(1) == 0)


@torch.no_grad()
def test_mass_on_the_first_keys_per_layer_and_head():
    sink_mass = load()
    torch.manual_seed(0)
    model = zoo.create_model("vanilla_lm", vocab_size=11, d_model=16, n_layers=2, n_heads=2, d_ff=32, position="rope")
    rows = sink_mass.sink_mass(model.eval(), torch.randint(0, 11, (3, 20)), first=10, sinks=2)
    assert [(r["layer"], r["head"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    uniform = float((2 / torch.arange(11, 21, dtype=torch.float64)).mean())
    assert all(r["uniform"] == pytest.approx(uniform) and 0 <= r["mass"] <= 1 for r in rows)
    assert rows[0]["ratio"] == pytest.approx(rows[0]["mass"] / uniform)

