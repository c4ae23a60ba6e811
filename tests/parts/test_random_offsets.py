"""Randomised position offsets (Dehghani et al. 2019): option random_offset_max of the position axis."""

from __future__ import annotations

import pytest
import torch

from zoo.config import ModelConfig
from zoo.position.base import sinusoid_table
from zoo.presets.factory import create_model
from zoo.stacks.build import create_position

R, T, D, B = 20, 6, 16, 64


def position(name: str, random_offset_max: int = R, max_len: int = 64):
    torch.manual_seed(0)
    config = ModelConfig(
        d_model=D, n_heads=2, max_len=max_len, position={"name": name, "random_offset_max": random_offset_max}
    )
    return create_position(config)


def table(module, n: int) -> torch.Tensor:
    if hasattr(module, "table"):
        return module.table.weight.detach()[:n]
    return sinusoid_table(torch.arange(n), D)


def recovered_offsets(module, x, out, offset: int = 0) -> list[int]:
    """For each sequence, the start u whose table rows offset+u .. offset+u+T-1 the output carries."""
    rows = table(module, offset + R + T)
    found = []
    for b in range(x.shape[0]):
        signal = (out[b] - x[b]).detach()
        matches = [u for u in range(R + 1) if torch.allclose(signal, rows[offset + u : offset + u + T], atol=1e-6)]
        assert len(matches) == 1, (b, matches)
        found.append(matches[0])
    return found


@pytest.mark.parametrize("name", ["sinusoidal", "learned"])
def test_training_offsets_are_random_within_the_range_and_rows_of_the_table(name):
    module = position(name).train()
    x = torch.randn(B, T, D)
    offsets = recovered_offsets(module, x, module(x))  # every row is exactly the table at its offset
    assert all(0 <= u <= R for u in offsets)
    assert len(set(offsets)) > 5  # drawn per sequence, not one shift for the batch
    assert min(offsets) <= 2 and max(offsets) >= R - 2  # the whole range is used (64 draws over 21 values)
    # an offset the caller gives (a continued stream) adds to the random start
    assert all(3 <= u + 3 <= R + 3 for u in recovered_offsets(module, x, module(x, 3), offset=3))


@pytest.mark.parametrize("name", ["sinusoidal", "learned"])
def test_evaluation_uses_offset_zero(name):
    module = position(name).eval()
    x = torch.randn(B, T, D)
    assert recovered_offsets(module, x, module(x)) == [0] * B
    torch.testing.assert_close(module(x), x + table(module, T))


@pytest.mark.parametrize("name", ["sinusoidal", "learned"])
def test_offsets_follow_the_seed(name):
    module = position(name).train()
    x = torch.randn(B, T, D)
    torch.manual_seed(5)
    first = module(x)
    torch.manual_seed(5)
    torch.testing.assert_close(module(x), first)
    torch.manual_seed(6)
    assert not torch.allclose(module(x), first)


def test_default_is_off_and_bad_values_are_refused():
    module = position("sinusoidal", random_offset_max=0).train()
    x = torch.randn(2, T, D)
    torch.testing.assert_close(module(x), x + table(module, T))
    with pytest.raises(ValueError, match="random_offset_max"):
        position("sinusoidal", random_offset_max=-1)
    with pytest.raises(ValueError, match="random_offset_max=64 must be below max_len=64"):
        position("learned", random_offset_max=64)
    with pytest.raises(ValueError, match="random_offset_max=20"):
        position("learned", max_len=24).train()(torch.randn(1, T, D))


def test_reaches_a_model_from_the_config():
    model = create_model(
        "vanilla_lm",
        vocab_size=16,
        d_model=D,
        n_layers=1,
        n_heads=2,
        d_ff=32,
        dropout=0.0,
        position={"name": "sinusoidal", "random_offset_max": R},
    )
    assert model.position.options.random_offset_max == R
    tokens = torch.randint(0, 16, (4, T))
    model.eval()
    torch.testing.assert_close(model(tokens).logits, model(tokens).logits)  # eval: no randomness
    model.train()
    torch.manual_seed(0)
    first = model(tokens).logits
    torch.manual_seed(1)
    assert not torch.allclose(model(tokens).logits, first)


def test_universal_transformer_takes_the_offsets_with_its_own_position_signal_off():
    """The route for the length-generalisation runs: stack.position_signal=false hands the position
    signal to the position axis, which then draws the offsets (added once, at the embedding)."""
    model = create_model(
        "universal_transformer",
        vocab_size=16,
        d_model=D,
        n_layers=2,
        n_heads=2,
        d_ff=32,
        dropout=0.0,
        position={"name": "sinusoidal", "random_offset_max": R},
        stack={"position_signal": False},
    )
    tokens = torch.randint(0, 16, (4, T))
    model.eval()
    torch.testing.assert_close(model(tokens).logits, model(tokens).logits)
    model.train()
    torch.manual_seed(0)
    first = model(tokens).logits
    torch.manual_seed(0)
    torch.testing.assert_close(model(tokens).logits, first)
    torch.manual_seed(1)
    assert not torch.allclose(model(tokens).logits, first)


def universal_stack(act: bool, **options):
    torch.manual_seed(0)
    model = create_model(
        "universal_seq2seq_act",
        vocab_size=16,
        d_model=D,
        n_layers=3,
        n_heads=2,
        d_ff=32,
        dropout=0.0,
        stack={"act": act, "halting_bias": -3.0, **options},  # ACT: a low bias keeps positions going
    )
    return model.encoder


def step_signals(stack, x):
    """The signal each step added: the block's input minus the state it was given (x, then the
    previous step's output), [steps][b, t, d]."""
    inputs, outputs = [], []
    hooks = [
        stack.block.register_forward_pre_hook(lambda m, args: inputs.append(args[0].detach())),
        stack.block.register_forward_hook(lambda m, args, out: outputs.append(out.x.detach())),
    ]
    stack(x)
    for hook in hooks:
        hook.remove()
    return [inp - prev for inp, prev in zip(inputs, [x, *outputs])]


@pytest.mark.parametrize("act", [False, True])
def test_universal_stack_shifts_its_per_step_position_signal_by_one_offset_per_sequence(act):
    """With stack.random_offset_max the offsets reach the paper's per-step signal P^t (position +
    timestep, eq. 3): every step reads positions u_b .. u_b + t - 1 with the same u_b (0 in eval)."""
    stack = universal_stack(act, random_offset_max=R).train()
    x = torch.randn(B, T, D)
    torch.manual_seed(3)
    signals = step_signals(stack, x)
    assert len(signals) == 3
    starts = []
    for b in range(B):
        found = set()
        for step, signal in enumerate(signals, start=1):
            timestep = sinusoid_table(torch.tensor([float(step)]), D)
            matches = [
                u
                for u in range(R + 1)
                if torch.allclose(signal[b], sinusoid_table(torch.arange(u, u + T), D) + timestep, atol=1e-5)
            ]
            assert len(matches) == 1, (b, step, matches)
            found.add(matches[0])
        assert len(found) == 1, (b, found)  # one offset for all the steps of a sequence
        starts.append(found.pop())
    assert len(set(starts)) > 5 and min(starts) <= 2 and max(starts) >= R - 2  # per sequence, whole range
    torch.manual_seed(3)
    torch.testing.assert_close(step_signals(stack, x)[0], signals[0])  # seeded
    stack.eval()
    for step, signal in enumerate(step_signals(stack, x), start=1):
        expected = sinusoid_table(torch.arange(T), D) + sinusoid_table(torch.tensor([float(step)]), D)
        torch.testing.assert_close(signal, expected.expand(B, T, D), atol=1e-5, rtol=0)


def test_universal_stack_offsets_need_its_position_signal():
    with pytest.raises(ValueError, match="random_offset_max=4 shifts the stack's position signal"):
        universal_stack(False, random_offset_max=4, position_signal=False)
    with pytest.raises(ValueError, match="random_offset_max"):
        universal_stack(False, random_offset_max=-1)
