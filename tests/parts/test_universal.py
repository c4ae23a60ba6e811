"""Universal Transformer stack and ACT halting (zoo/stacks/universal.py)."""

from __future__ import annotations

import pytest
import torch

import zoo
from tests.contracts.test_streaming import stream
from zoo.config import ModelConfig
from zoo.data.algorithmic import algorithmic_batch, score, vocab_size
from zoo.position.base import sinusoid_table
from zoo.stacks.build import build_stack
from zoo.stacks.sequential import SequentialStack
from zoo.stacks.universal import UniversalStack
from zoo.train.steps import total_loss

D, H = 16, 2


def make_stack(
    *, causal: bool = False, cross: bool = False, residual: str = "post_norm", n_layers: int = 4, **stack_options
) -> UniversalStack:
    config = ModelConfig(
        d_model=D,
        n_heads=H,
        d_ff=32,
        dropout=0.0,
        residual={"name": residual},
        position={"name": "none"},
        stack={"name": "universal", **stack_options},
    )
    stack = build_stack(config, causal=causal, cross=cross, n_layers=n_layers)
    return stack.eval()


def test_halting_weights_sum_to_one_and_output_is_their_mean_field():
    stack = make_stack(act=True, halting_bias=-1.0, n_layers=6)
    nn_init = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a halting unit that varies by position, so N differs across positions
        stack.halting.weight.copy_(torch.randn(1, D, generator=nn_init))
    stack.trace = True
    x = torch.randn(3, 7, D)
    pad = torch.ones(3, 7, dtype=torch.bool)
    pad[1, 5:] = False
    out = stack(x, pad_mask=pad)
    trace = stack.last_trace
    total = torch.stack(trace.weights).sum(0)  # [b, t]
    torch.testing.assert_close(total[pad], torch.ones(int(pad.sum())))
    assert torch.all(total[~pad] == 0)
    assert len(set(trace.steps[pad].tolist())) > 1, "the test needs positions that halt at different steps"
    mean_field = sum(w[..., None] * s for w, s in zip(trace.weights, trace.states))
    torch.testing.assert_close(out.x[pad], mean_field[pad])
    torch.testing.assert_close(out.x[~pad], x[~pad])  # padding passes through untouched
    assert out.stats["act/steps"].shape == (3, 7)
    assert float(out.stats["act/steps_max"]) == float(trace.steps.max())


def test_never_more_than_max_steps_and_remainder_on_the_last():
    stack = make_stack(act=True, halting_bias=-8.0, max_steps=3, n_layers=10)  # h ~ 3e-4: never reaches 1 - eps
    stack.trace = True
    calls = []
    stack.block.register_forward_pre_hook(lambda module, args: calls.append(1))
    out = stack(torch.randn(2, 5, D))
    trace = stack.last_trace
    assert len(calls) == 3 and stack.steps == 3
    assert torch.all(trace.steps == 3) and float(out.stats["act/steps_max"]) == 3.0
    earlier = trace.weights[0] + trace.weights[1]
    torch.testing.assert_close(trace.remainder, 1 - earlier)
    torch.testing.assert_close(trace.weights[2], trace.remainder)


def test_fixed_depth_equals_weight_shared_sequential_stack():
    stack = make_stack(n_layers=4, position_signal=False, timestep_signal=False)
    shared = SequentialStack(lambda i: stack.block, 4, D).eval()
    assert len({id(b) for b in shared.blocks}) == 1
    x = torch.randn(2, 6, D)
    torch.testing.assert_close(stack(x).x, shared(x).x)
    # with the signals: P^t = position sinusoid + step sinusoid before every step
    stack = make_stack(n_layers=3)
    pos = sinusoid_table(torch.arange(6), D)
    h = x
    for t in range(1, 4):
        h = stack.block(h + pos + sinusoid_table(torch.tensor([float(t)]), D)).x
    torch.testing.assert_close(stack(x).x, h)


def test_ponder_cost_has_gradients_into_the_halting_unit():
    stack = make_stack(act=True, halting_bias=0.0, ponder_weight=0.5, n_layers=5)
    stack.trace = True
    out = stack(torch.randn(2, 5, D))
    trace = stack.last_trace
    torch.testing.assert_close(out.aux["ponder"], 0.5 * (trace.steps + trace.remainder).mean())
    out.aux["ponder"].backward()
    assert stack.halting.weight.grad.abs().sum() > 0 and stack.halting.bias.grad.abs() > 0
    # R = 1 - sum of earlier h: raising b_h raises the h's, so lowers the remainder (cost)
    assert stack.halting.bias.grad < 0


def test_halted_positions_are_not_updated():
    stack = make_stack(act=True, halting_bias=-1.0, n_layers=6)
    with torch.no_grad():
        stack.halting.weight.copy_(torch.randn(1, D, generator=torch.Generator().manual_seed(1)))
    stack.trace = True
    stack(torch.randn(2, 8, D))
    trace = stack.last_trace
    checked = 0
    for n in range(1, len(trace.states)):
        done = trace.halted[n - 1]
        assert torch.equal(trace.states[n][done], trace.states[n - 1][done])
        assert torch.all(trace.weights[n][done] == 0)
        checked += int(done.sum())
    assert checked > 0


def test_rows_whose_positions_all_halted_are_not_computed():
    # rezero starts as the identity and no signals: each step's state is x, so the halting
    # unit reading feature 0 makes row 0 halt at once and row 1 run to the limit
    stack = make_stack(act=True, residual="rezero", position_signal=False, timestep_signal=False, max_steps=5)
    with torch.no_grad():
        stack.halting.weight.zero_()
        stack.halting.weight[0, 0] = 1.0
        stack.halting.bias.zero_()
    x = torch.randn(3, 4, D)
    x[0, :, 0], x[1, :, 0], x[2, :, 0] = 20.0, -20.0, 20.0
    rows = []
    stack.block.register_forward_pre_hook(lambda module, args: rows.append(args[0].shape[0]))
    out = stack(x)
    assert rows == [3, 1, 1, 1, 1]
    torch.testing.assert_close(out.stats["act/steps_executed"], torch.tensor(7 / 3))
    torch.testing.assert_close(out.stats["act/compute_fraction"], torch.tensor(7 / 15))
    assert out.stats["act/steps"][0].tolist() == [1, 1, 1, 1] and out.stats["act/steps"][1].tolist() == [5] * 4
    # the pruned rows' results equal running each row alone
    alone = stack(x[1:2]).x
    torch.testing.assert_close(out.x[1:2], alone)


def test_padding_does_not_change_real_positions_under_act():
    stack = make_stack(act=True, halting_bias=-1.0, n_layers=5)
    x = torch.randn(1, 6, D)
    padded = torch.cat([x, torch.randn(1, 3, D)], dim=1)
    pad = torch.tensor([[True] * 6 + [False] * 3])
    torch.testing.assert_close(stack(padded, pad_mask=pad).x[:, :6], stack(x).x)


@pytest.mark.parametrize("act", [False, True])
def test_universal_lm_is_causal(act):
    model = zoo.create_model(
        "universal_transformer_act" if act else "universal_transformer",
        vocab_size=20,
        d_model=D,
        n_heads=H,
        d_ff=32,
        n_layers=4,
        dropout=0.0,
    ).eval()
    tokens = torch.randint(0, 20, (2, 9))
    changed = tokens.clone()
    changed[:, 5] = (changed[:, 5] + 1) % 20
    a, b = model(tokens).logits, model(changed).logits
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_presets_build_train_and_decode_by_recomputation():
    lm = zoo.create_model("universal_transformer_act", vocab_size=20, d_model=D, n_heads=H, d_ff=32, n_layers=3)
    assert lm.config.stack["act"] and lm.config.position["name"] == "none"
    assert not lm.attentions_keep_state()  # vanilla has a KV cache, but the stack threads none
    tokens = torch.randint(0, 20, (2, 6))
    out = lm(tokens, tokens)
    (out.loss + out.aux_losses["ponder"]).backward()
    assert lm.stack.halting.weight.grad is not None
    generated = lm.generate(tokens[:, :2], 3, greedy=True)
    manual = tokens[:, :2]
    lm.eval()
    for _ in range(3):
        manual = torch.cat([manual, lm(manual).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generated, manual)

    s2s = zoo.create_model("universal_seq2seq_act", vocab_size=20, d_model=D, n_heads=H, d_ff=32, n_layers=3)
    src, tgt = torch.randint(3, 20, (2, 7)), torch.randint(3, 20, (2, 5))
    out = s2s(src, tgt, tgt)
    assert "encoder/act/steps_mean" in out.stats and "act/steps_mean" in out.stats
    expected = s2s.config.stack.get("ponder_weight", 0.01) * (out.stats["encoder/act/ponder"] + out.stats["act/ponder"])
    torch.testing.assert_close(out.aux_losses["ponder"].detach(), expected)
    assert s2s.generate(src, max_len=4, beam_size=2).shape[0] == 2
    clf = zoo.create_model(
        "universal_transformer", kind="classifier", vocab_size=20, d_model=D, n_heads=H, d_ff=32, n_layers=2
    )
    assert clf(src, torch.tensor([0, 1])).loss.isfinite()


def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="max_steps"):
        make_stack(act=True, max_steps=0)
    for eps in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="epsilon"):
            make_stack(act=True, epsilon=eps)
    stack = make_stack(causal=True)
    with pytest.raises(ValueError, match="must be the UniversalState of 4 steps"):
        stack(torch.randn(1, 3, D), state=[stack.block.init_state(1)] * 4)
    act = zoo.create_model("universal_transformer_act", vocab_size=20, d_model=D, n_heads=H, d_ff=32, n_layers=2)
    with pytest.raises(ValueError, match="cannot continue a sequence.*act=true: each earlier position halts"):
        act.init_state(1)


def test_a_fixed_depth_universal_transformer_streams_with_a_cache_per_step():
    """Before: universal_transformer (no ACT) refused a state, citing ACT. Its T steps share one block, and
    step n attends over the earlier tokens' step-n inputs: a cache per step continues a stream exactly (the
    position signal numbered from where the stream stands): token by token and in pieces == one call."""
    torch.manual_seed(0)
    lm = zoo.create_model("universal_transformer", vocab_size=20, d_model=D, n_heads=H, d_ff=32, n_layers=3).eval()
    assert not lm.config.stack.get("act", False) and lm.stream_refusal() is None
    tokens = torch.randint(0, 20, (2, 17))
    with torch.no_grad():
        whole = lm(tokens).logits
        for pieces in ([1] * 17, [5, 1, 11]):
            logits, state = stream(lm, tokens, pieces)
            torch.testing.assert_close(logits, whole, atol=1e-5, rtol=1e-5)
    assert len(state.layers.steps) == 3 and state.layers.offset == 17


def test_algorithmic_data():
    g = torch.Generator().manual_seed(0)
    batch = algorithmic_batch("addition", 64, 1, 6, generator=g)
    for src, targets in zip(batch["src"], batch["targets"]):
        digits = [int(v) - 3 for v in src if v != 0]
        plus = digits.index(10)
        a = int("".join(map(str, digits[:plus][::-1])))
        b = int("".join(map(str, digits[plus + 1 :][::-1])))
        answer = [int(v) - 3 for v in targets if v >= 3]
        assert int("".join(map(str, answer[::-1]))) == a + b
    rev = algorithmic_batch("reverse", 4, 3, 5, generator=g)
    n = rev["src_pad_mask"].sum(1)
    for i in range(4):
        assert torch.equal(rev["targets"][i, : n[i]], rev["src"][i, : n[i]].flip(0))
        assert torch.equal(rev["tgt"][i, 1 : n[i] + 1], rev["targets"][i, : n[i]])
    assert score(rev["targets"].clamp_min(0), rev["targets"]) == (1.0, 1.0)
    assert vocab_size("copy") == 13 and vocab_size("addition") == 14
    with pytest.raises(ValueError, match="task"):
        algorithmic_batch("sort", 2, 1, 2)


@pytest.mark.slow
def test_universal_act_learns_copy():
    torch.manual_seed(0)
    model = zoo.create_model(
        "universal_seq2seq_act", vocab_size=vocab_size("copy"), d_model=32, n_heads=4, d_ff=64, n_layers=4, dropout=0.0
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(300):
        batch = algorithmic_batch("copy", 32, 3, 6, generator=g)
        out = model(**batch)
        loss = total_loss(out)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    test = algorithmic_batch("copy", 64, 5, 5, generator=g)
    char, _ = score(model.generate(test["src"], max_len=6, src_pad_mask=test["src_pad_mask"]), test["targets"])
    assert char > 0.9


def test_each_step_runs_the_block_as_its_layer_so_interleaved_patterns_alternate():
    """Sparse Transformer's interleaved combination puts A1 in even layers and A2 in odd ones; a
    universal stack's step n is layer n - 1, so T steps equal a weight-shared sequential stack."""
    config = ModelConfig(
        d_model=D,
        n_heads=H,
        d_ff=32,
        dropout=0.0,
        position={"name": "none"},
        attention={"name": "sparse_strided", "stride": 3, "combine": "interleaved"},
        stack={"name": "universal", "position_signal": False, "timestep_signal": False},
    )
    stack = build_stack(config, causal=True, cross=False, n_layers=4).eval()
    seen = []
    stack.block.attention.register_forward_pre_hook(lambda module, args: seen.append(module.head_patterns()[0]))
    x = torch.randn(2, 12, D)
    out = stack(x)
    assert seen == ["A1", "A2", "A1", "A2"]
    sequential_config = ModelConfig(**{**config.to_dict(), "stack": {"name": "sequential"}})
    sequential = build_stack(sequential_config, causal=True, cross=False, n_layers=4).eval()
    for block in sequential.blocks:
        block.load_state_dict(stack.block.state_dict())
    torch.testing.assert_close(out.x, sequential(x).x)
    assert stack.block.attention.layer_index == 0  # restored after the forward


def test_one_owner_of_the_position_signal():
    """The universal stack adds the position sinusoid before every step; a model position on top
    would add positions twice, so the builder refuses the pair and says how to resolve it."""
    small = dict(vocab_size=20, d_model=D, n_heads=H, d_ff=32, n_layers=2)
    with pytest.raises(ValueError, match="added twice.*position=none"):
        zoo.create_model("vanilla_lm", stack="universal", **small)
    zoo.create_model("vanilla_lm", stack={"name": "universal", "position_signal": False}, **small)  # the model owns it
    zoo.create_model("vanilla_lm", stack="universal", position="none", **small)  # the stack owns it
    assert zoo.preset_config("universal_transformer").position["name"] == "none"
