"""Sinusoid tables carry the model's precision: every user of ``sinusoid_table`` (absolute positions,
Transformer-XL's relative distances, the Universal Transformer's coordinate signal) matches the
paper's formula evaluated in float64 when the model is float64, far along a sequence (position 4K),
where a float32 angle is already off by ~1e-4."""

from __future__ import annotations

import torch

import zoo
from zoo.config import ModelConfig
from zoo.position.base import POSITION, sinusoid_table
from zoo.stacks.build import build_stack

D = 64
FAR = torch.arange(4090, 4100)  # position ~4K


def formula(positions: torch.Tensor, d: int, base: float = 10000.0) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d)), in float64
    with the power written as in the paper (not the log-space form the library uses)."""
    i = torch.arange(d // 2, dtype=torch.float64)
    angle = positions.to(torch.float64)[:, None] / base ** (2 * i / d)
    out = torch.empty(len(positions), d, dtype=torch.float64)
    out[:, 0::2], out[:, 1::2] = angle.sin(), angle.cos()
    return out


def test_table_in_float64_matches_the_formula_at_4k():
    table = sinusoid_table(FAR, D, dtype=torch.float64)
    assert table.dtype == torch.float64
    torch.testing.assert_close(table, formula(FAR, D), atol=1e-12, rtol=0)
    # float32 callers get the same numbers rounded once, not a float32 computation
    torch.testing.assert_close(sinusoid_table(FAR, D), formula(FAR, D).float(), atol=0, rtol=0)


def test_sinusoidal_position_of_a_float64_model_at_4k():
    position = POSITION.get("sinusoidal")(D, 8192)
    x = torch.zeros(1, len(FAR), D, dtype=torch.float64)
    torch.testing.assert_close(position(x, offset=int(FAR[0]))[0], formula(FAR, D), atol=1e-12, rtol=0)


def test_xl_relative_positional_keys_of_a_float64_model_at_4k():
    attn = zoo.create_attention("xl_rel", d_model=D, n_heads=4, causal=True).double()
    keys = attn._project_r(FAR, torch.float64)  # W_R r for the distances 4090..4099: [h, n, k]
    want = attn.to_r(formula(FAR, D)).view(len(FAR), 4, D // 4).transpose(0, 1)
    torch.testing.assert_close(keys, want, atol=1e-12, rtol=0)


def test_universal_coordinate_signal_of_a_float64_model_at_4k():
    """P^t = position sinusoid + step sinusoid (Dehghani et al. 2019, eq. 3), summed in float64."""
    config = ModelConfig(d_model=D, n_heads=4, d_ff=2 * D, position={"name": "none"}, stack={"name": "universal"})
    stack = build_stack(config, causal=True, cross=False, n_layers=3).double()
    step = 3
    got = stack.signal(int(FAR[-1]) + 1, step, torch.device("cpu"), torch.float64)[FAR]  # positions 0 .. ~4K
    want = formula(FAR, D) + formula(torch.tensor([step]), D)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
