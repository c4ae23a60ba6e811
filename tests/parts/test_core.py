"""Registries, positions, feed-forward, config errors, training pieces.

Residuals, stacks and positions each have a contract suite over their registry
(tests/contracts/test_residual_contract.py, test_stack_contract.py, test_position_contract.py)."""

from __future__ import annotations

import math

import pytest
import torch

import zoo
from zoo.feed_forward.mlp import MLP as FeedForward
from zoo.position.base import sinusoid_table
from zoo.registry import Registry, UnknownNameError
from zoo.train.steps import after_optimizer_step, noam_lambda, schedule, total_loss


def test_registry_rejects_duplicates_and_suggests():
    reg = Registry("thing")
    reg.register("alpha")(object)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("alpha")(int)
    with pytest.raises(UnknownNameError, match=r"valid: alpha\. Did you mean 'alpha'\?"):
        reg.get("alpah")
    reg.register("beta", float)
    assert reg.list() == ["alpha", "beta"] and reg.list("b*") == ["beta"]


def test_public_listing_functions():
    assert "vanilla" in zoo.list_attention() and "vanilla_lm" in zoo.list_models()
    assert zoo.list_residuals() == zoo.RESIDUAL.list() and zoo.list_residuals()
    assert zoo.list_stacks() == zoo.STACK.list() and zoo.list_positions() == zoo.POSITION.list()
    with pytest.raises(KeyError, match="Did you mean 'vanilla'"):
        zoo.create_attention("vanila", d_model=8, n_heads=2)


def test_config_errors_name_the_key_and_valid_values():
    with pytest.raises(KeyError, match="Did you mean 'd_model'"):
        zoo.create_model("vanilla_lm", d_modle=64)
    with pytest.raises(ValueError, match="divisible by n_heads"):
        zoo.create_model("vanilla_lm", d_model=30, n_heads=4)
    with pytest.raises(KeyError, match="valid: backend, bias, max_cache"):
        zoo.create_model("vanilla_lm", attention={"bais": False})
    with pytest.raises(KeyError, match="unknown residual"):
        zoo.create_model("vanilla_lm", residual="post_nrom")
    with pytest.raises(ValueError, match="activation must be relu or gelu"):
        zoo.create_model("vanilla_lm", activation="tanh")


def test_overrides_swap_or_tweak_a_part():
    cfg = zoo.preset_config("vanilla_lm", attention={"max_cache": 8})
    assert cfg.attention == {"name": "vanilla", "max_cache": 8}
    cfg = zoo.preset_config("vanilla_lm", attention="additive")
    assert cfg.attention == {"name": "additive"}


def test_bad_tokens_are_refused():
    model = zoo.create_model("vanilla_lm", vocab_size=10, d_model=16, n_layers=1, n_heads=2, d_ff=32)
    with pytest.raises(ValueError, match=r"\[0, vocab_size=10\)"):
        model(torch.tensor([[1, 2, 10]]))
    with pytest.raises(ValueError, match="integer tensor"):
        model(torch.randn(1, 3))
    with pytest.raises(ValueError, match="pad_mask must be a bool"):
        model(torch.tensor([[1, 2]]), pad_mask=torch.ones(1, 2))
    learned = zoo.create_model(
        "vanilla_lm", vocab_size=10, d_model=16, n_layers=1, n_heads=2, d_ff=32, position="learned", max_len=8
    )
    with pytest.raises(ValueError, match="max_len=8"):
        learned(torch.zeros(1, 9, dtype=torch.long))


def test_cross_attention_from_incapable_mechanism_refused_at_build():
    from zoo.attention.base import ATTENTION, Attention

    class NoCross(Attention):
        pass

    ATTENTION.register("_test_no_cross", NoCross)
    try:
        with pytest.raises(ValueError, match="supports_cross=False"):
            zoo.create_model(
                "vanilla_seq2seq", cross_attention="_test_no_cross", d_model=16, n_heads=2, n_layers=1, d_ff=16
            )
    finally:
        ATTENTION._entries.pop("_test_no_cross")


def test_sinusoid_matches_the_paper_formula():
    pos, d = torch.arange(50), 16
    table = sinusoid_table(pos, d)
    for p in (0, 7, 49):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert math.isclose(table[p, 2 * i].item(), math.sin(angle), abs_tol=1e-5)
            assert math.isclose(table[p, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-5)
    assert torch.isfinite(sinusoid_table(torch.arange(10**6, 10**6 + 3), 512)).all()


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_chunked_feed_forward_equals_unchunked(activation):
    full = FeedForward(8, 32, activation=activation)
    chunked = FeedForward(8, 32, activation=activation, chunk_size=3)
    chunked.load_state_dict(full.state_dict())
    x = torch.randn(2, 10, 8, requires_grad=True)
    torch.testing.assert_close(chunked(x), full(x))
    (g1,) = torch.autograd.grad(full(x).sum(), x)
    (g2,) = torch.autograd.grad(chunked(x).sum(), x)
    torch.testing.assert_close(g1, g2)
    manual = full.w2(torch.relu(full.w1(x))) if activation == "relu" else full.w2(torch.nn.functional.gelu(full.w1(x)))
    torch.testing.assert_close(full(x), manual)


def test_noam_schedule_matches_the_paper():
    rate = noam_lambda(512, 4000)
    assert math.isclose(rate(1), 512**-0.5 * 4000**-1.5)
    assert math.isclose(rate(4000), 512**-0.5 * 4000**-0.5)
    assert math.isclose(rate(16000), 512**-0.5 * 16000**-0.5)
    model = torch.nn.Linear(2, 2)
    opt = zoo.train.steps.adam(model)
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9
    schedule(opt, "noam", d_model=512, warmup=4000)
    assert math.isclose(opt.param_groups[0]["lr"], rate(1))
    with pytest.raises(ValueError, match="unknown schedule"):
        schedule(opt, "linear")


def test_label_smoothing_and_aux_loss_sum():
    model = zoo.create_model(
        "vanilla_lm", vocab_size=10, d_model=16, n_layers=1, n_heads=2, d_ff=32, label_smoothing=0.1
    ).eval()
    tokens = torch.randint(0, 10, (2, 5))
    out = model(tokens, tokens)
    expected = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), tokens.flatten(), label_smoothing=0.1)
    torch.testing.assert_close(out.loss, expected)
    out.aux_losses = {"a": torch.tensor(0.5), "b": torch.tensor(0.25)}
    torch.testing.assert_close(total_loss(out), expected + 0.75)


def test_after_optimizer_step_hooks_run():
    calls = []

    class Hooked(torch.nn.Module):
        def after_optimizer_step(self):
            calls.append(1)

    after_optimizer_step(torch.nn.Sequential(Hooked(), torch.nn.Sequential(Hooked())))
    assert len(calls) == 2


def test_padding_ignored_by_lm_loss_and_classifier_pooling():
    clf = zoo.create_model("vanilla_classifier", vocab_size=10, d_model=16, n_layers=1, n_heads=2, d_ff=32).eval()
    tokens = torch.randint(1, 10, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[:, 4:] = False
    changed = tokens.clone()
    changed[:, 4:] = 0
    torch.testing.assert_close(clf(tokens, pad_mask=mask).logits, clf(changed, pad_mask=mask).logits)
