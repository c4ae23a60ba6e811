"""Every registered preset: builds tiny, learns on a fixed batch, round-trips through its config.

Parametrised over ``zoo.list_models()``; a preset's ``tiny`` overrides and ``example_length`` give
its CPU-second-sized version."""

from __future__ import annotations

import pytest
import torch
from support.fast_cases import FAST_PRESETS, default_run_keeps

import zoo
from zoo.precision import autocast
from zoo.presets.factory import get_preset
from zoo.train.steps import adam, forward_backward, optimizer_step, total_loss

MODELS = zoo.list_models()


def tiny(name, **extra):
    preset = get_preset(name)
    return zoo.create_model(name, **{**preset.tiny, **extra})


def batch_for(model, name, b=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    t = get_preset(name).example_length
    if cfg.kind == "seq2seq":
        src = torch.randint(3, cfg.vocab_size, (b, t), generator=g)
        tgt = torch.cat([torch.full((b, 1), cfg.bos_id), src.flip(1)], 1)
        return dict(src=src, tgt=tgt[:, :-1], targets=tgt[:, 1:])
    if cfg.kind == "pair_classifier":  # two documents per row: [b, 2, t]
        pair = torch.randint(0, cfg.vocab_size, (b, 2, t), generator=g)
        return dict(tokens=pair, targets=(pair[:, 0, 0] % cfg.n_classes))
    tokens = torch.randint(0, cfg.vocab_size, (b, t + 1), generator=g)
    if cfg.kind == "classifier":
        return dict(tokens=tokens[:, :-1], targets=(tokens[:, 0] % cfg.n_classes))
    return dict(tokens=tokens[:, :-1], targets=tokens[:, 1:])


def test_presets_registered():
    assert {"vanilla_lm", "vanilla_classifier", "vanilla_seq2seq"} <= set(MODELS)


@pytest.mark.parametrize("name", default_run_keeps(MODELS, FAST_PRESETS))
def test_tiny_preset_learns_a_fixed_batch(name):
    torch.manual_seed(0)
    model = tiny(name)
    batch = batch_for(model, name)
    opt = adam(model, lr=3e-3)
    losses = []
    for _ in range(12):
        out = model(**batch)
        loss = total_loss(out)
        assert torch.isfinite(loss), f"{name}: non-finite loss"
        opt.zero_grad()
        loss.backward()
        opt.step()
        zoo.train.steps.after_optimizer_step(model)
        losses.append(out.loss.item())
    assert losses[-1] < 0.8 * losses[0], f"{name}: loss did not fall ({losses[0]:.3f} -> {losses[-1]:.3f})"


@pytest.mark.parametrize("name", default_run_keeps(MODELS, FAST_PRESETS))
def test_tiny_preset_trains_under_bf16_autocast(name):
    """trainer.precision=bf16's step (zoo.precision.autocast, the trainer's) on the CPU: the linear
    layers really run in bfloat16, every loss is finite and the loss falls."""
    torch.manual_seed(0)
    model = tiny(name)
    batch = batch_for(model, name)
    opt = adam(model, lr=3e-3)
    dtypes = set()
    hooks = [
        m.register_forward_hook(lambda m, i, out: dtypes.add(out.dtype))
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    losses = []
    for _ in range(8):
        opt.zero_grad()
        _, loss = forward_backward(model, batch, context=lambda: autocast("cpu", "bf16"))  # refuses a NaN/inf loss
        optimizer_step(model, opt)
        losses.append(loss.item())
    for hook in hooks:
        hook.remove()
    assert dtypes == {torch.bfloat16}, f"{name}: linear outputs {dtypes}"
    assert losses[-1] < 0.9 * losses[0], f"{name}: loss did not fall under bf16 ({losses[0]:.3f} -> {losses[-1]:.3f})"


@pytest.mark.parametrize("name", MODELS)
def test_state_dict_round_trip_through_stored_config(name, tmp_path):
    model = tiny(name).eval()
    batch = batch_for(model, name)
    batch.pop("targets")
    path = tmp_path / "ckpt.pt"
    torch.save({"config": model.config.to_dict(), "model": model.state_dict()}, path)
    ckpt = torch.load(path, weights_only=True)
    rebuilt = zoo.create_model(**ckpt["config"]).eval()
    rebuilt.load_state_dict(ckpt["model"])
    assert rebuilt.config == model.config
    torch.testing.assert_close(rebuilt(**batch).logits, model(**batch).logits)


@pytest.mark.parametrize("name", MODELS)
def test_preset_config_is_plain_and_named(name):
    cfg = zoo.preset_config(name)
    assert cfg.name == name
    assert get_preset(name).description
    if "_classifier" not in name and "_seq2seq" not in name:
        assert cfg.kind == "lm", "presets are causal LMs unless the name says otherwise"
