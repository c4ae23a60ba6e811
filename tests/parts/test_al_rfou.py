"""Al-Rfou et al. 2018 auxiliary losses (zoo/models/al_rfou_losses.py): formulas against a hand computation, gradient
reach, the l/(2L) schedule, and off by default."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zoo.models.al_rfou_losses import intermediate_layer_active
from zoo.presets.factory import create_model, get_preset, list_models, preset_config
from zoo.train.steps import set_training_progress, total_loss

N_LAYERS = 4


def tiny_model(**overrides):
    torch.manual_seed(0)
    options = {**get_preset("al_rfou_lm").tiny, "n_layers": N_LAYERS, **overrides}
    return create_model("al_rfou_lm", **options).train()


def batch(t: int = 12):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 32, (2, t), generator=g)
    targets = torch.randint(0, 32, (2, t), generator=g)
    return tokens, targets


def layer_outputs(model, tokens):
    """Each block's output, computed by walking the stack by hand (no hooks)."""
    x = model.drop(model.position(model.embed(tokens), 0))
    outs = []
    for block in model.stack.blocks:
        x = block(x).x
        outs.append(x)
    return outs


def test_preset_is_the_paper_t64_with_losses_on():
    config = preset_config("al_rfou_lm")
    assert (config.n_layers, config.d_model, config.n_heads, config.d_ff, config.max_len) == (64, 512, 8, 2048, 512)
    assert config.aux_losses == {"intermediate": True, "multi_target": 0.5, "layer_heads": True}


@pytest.mark.parametrize("layer_heads", [True, False])
def test_each_loss_matches_a_hand_computation(layer_heads):
    """layer_heads: layer l predicts through its own two classifiers (next_char_heads[l-1], after_next_heads[l-1]);
    else through the model's head and one shared after-next classifier."""
    model = tiny_model(aux_losses={"intermediate": True, "multi_target": 0.5, "layer_heads": layer_heads})
    tokens, targets = batch()
    out = model(tokens, targets)
    hidden = layer_outputs(model, tokens)
    aux = model.aux_heads

    def heads(layer):
        if not layer_heads:
            return model.head, aux.multi_target_head
        own = aux.next_char_heads[layer - 1] if layer < N_LAYERS else model.head
        return own, aux.after_next_heads[layer - 1]

    final = model.norm(hidden[-1])
    head, mt_head = heads(N_LAYERS)
    torch.testing.assert_close(out.loss, F.cross_entropy(head(final).flatten(0, 1), targets.flatten()))
    after_next = F.cross_entropy(mt_head(final[:, :-1]).flatten(0, 1), targets[:, 1:].flatten())
    torch.testing.assert_close(out.aux_losses["multi_target"], 0.5 * after_next)
    for layer in range(1, N_LAYERS):
        h = model.norm(hidden[layer - 1])
        head, mt_head = heads(layer)
        next_char = F.cross_entropy(head(h).flatten(0, 1), targets.flatten())
        char_after = F.cross_entropy(mt_head(h[:, :-1]).flatten(0, 1), targets[:, 1:].flatten())
        torch.testing.assert_close(out.aux_losses[f"intermediate_l{layer}"], next_char + 0.5 * char_after)
    assert f"intermediate_l{N_LAYERS}" not in out.aux_losses  # the last layer's is the LM loss itself
    expected_total = out.loss + sum(out.aux_losses.values())
    torch.testing.assert_close(total_loss(out), expected_total)


def test_weights_are_applied_and_pad_positions_skipped():
    model = tiny_model(
        aux_losses={"intermediate": True, "intermediate_weight": 0.25, "multi_target": 0.0, "layer_heads": False}
    )
    tokens, targets = batch()
    pad_mask = torch.ones_like(tokens, dtype=torch.bool)
    pad_mask[0, -4:] = False
    out = model(tokens, targets, pad_mask=pad_mask)
    assert "multi_target" not in out.aux_losses
    h = model.norm(layer_outputs(model, tokens)[0])
    kept = targets.masked_fill(~pad_mask, -100)
    expected = 0.25 * F.cross_entropy(model.head(h).flatten(0, 1), kept.flatten(), ignore_index=-100)
    torch.testing.assert_close(out.aux_losses["intermediate_l1"], expected)


def test_layer_heads_give_the_papers_parameter_count():
    """Each layer's own next-character and character-after-next classifiers, used only in training: that is
    what makes the paper's totals (T12 44M, T64 235M with a learned position table per layer, as listed by
    Dai et al. 2019) add up; shared heads leave them ~3M / ~17M short."""
    d, vocab = 512, 256

    def paper_total(layers, per_layer_classifiers):
        block = 4 * (d * d + d) + (d * 2048 + 2048 + 2048 * d + d) + 2 * 2 * d  # attention, FFN, 2 LayerNorms
        classifiers = layers * per_layer_classifiers * d * vocab
        return layers * (block + 512 * d) + vocab * d + classifiers

    assert round(paper_total(12, 2) / 1e6) == 44 and round(paper_total(64, 2) / 1e6) == 235
    assert round(paper_total(12, 0) / 1e6) != 44 and round(paper_total(64, 0) / 1e6) != 235
    own = tiny_model(aux_losses={"intermediate": True, "multi_target": 0.5, "layer_heads": True})
    shared = tiny_model(aux_losses={"intermediate": True, "multi_target": 0.5, "layer_heads": False})
    d_small, n_vocab = own.config.d_model, own.config.vocab_size
    extra = own.num_parameters - shared.num_parameters
    assert extra == (2 * N_LAYERS - 1 - 1) * d_small * n_vocab  # L-1 next-char + L after-next, minus 1 shared


def test_layer_heads_keep_each_layers_gradient_in_its_own_classifier():
    model = tiny_model(aux_losses={"intermediate": True, "multi_target": 0.5, "layer_heads": True})
    tokens, targets = batch()
    model(tokens, targets).aux_losses["intermediate_l1"].backward()
    aux = model.aux_heads
    assert float(aux.next_char_heads[0].weight.grad.abs().sum()) > 0
    assert float(aux.after_next_heads[0].weight.grad.abs().sum()) > 0
    untouched = [aux.next_char_heads[1], aux.after_next_heads[1], aux.after_next_heads[N_LAYERS - 1]]
    assert all(head.weight.grad is None for head in untouched)


def test_intermediate_loss_gradient_reaches_its_layers_only():
    model = tiny_model()
    tokens, targets = batch()
    model(tokens, targets).aux_losses["intermediate_l1"].backward()
    below = [p.grad for p in model.stack.blocks[0].parameters()]
    above = [p.grad for p in model.stack.blocks[1].parameters()]
    assert all(g is not None for g in below) and sum(float(g.abs().sum()) for g in below) > 0
    assert all(g is None or float(g.abs().sum()) == 0 for g in above)


def test_multi_target_gradient_reaches_the_bottom_layer():
    model = tiny_model(aux_losses={"intermediate": False, "multi_target": 0.5, "layer_heads": False})
    tokens, targets = batch()
    out = model(tokens, targets)
    assert set(out.aux_losses) == {"multi_target"}
    out.aux_losses["multi_target"].backward()
    grads = [p.grad for p in model.stack.blocks[0].parameters()]
    assert all(g is not None for g in grads) and sum(float(g.abs().sum()) for g in grads) > 0
    assert float(model.aux_heads.multi_target_head.weight.grad.abs().sum()) > 0


def test_schedule_drops_layer_l_after_l_over_2L():
    model = tiny_model()
    tokens, targets = batch()
    for progress, expected in [
        (0.0, {1, 2, 3}),
        (1 / 8 - 1e-6, {1, 2, 3}),
        (1 / 8, {2, 3}),
        (2 / 8, {3}),
        (3 / 8 - 1e-6, {3}),
        (3 / 8, set()),
        (1.0, set()),
    ]:
        set_training_progress(model, progress)
        names = {k for k in model(tokens, targets).aux_losses if k.startswith("intermediate_l")}
        assert names == {f"intermediate_l{i}" for i in expected}, progress
    assert intermediate_layer_active(32, 64, 0.249) and not intermediate_layer_active(32, 64, 0.25)


def test_hydra_run_reaches_the_losses_and_the_trainer_sets_progress(tmp_path):
    """model.aux_losses.* from the command line reaches the model; the trainer sets progress = step / max_steps
    before each step, so layer 1 of 4 (dropped at 1/8) is gone from step 1 of 4 on."""
    pytest.importorskip("hydra")
    from zoo.app.compose import compose
    from zoo.app.run import run

    seen = []

    def record(trainer, step):
        seen.append((trainer.model.aux_heads.progress, trainer.model.aux_heads.options.multi_target))

    overrides = [
        "experiment=tiny",
        "logger=csv",
        "trainer.max_steps=4",
        "trainer.eval_every=0",
        "trainer.batch_size=2",
        "trainer.seq_len=16",
        "trainer.progress=false",
        "trainer.device=cpu",
        "model=al_rfou_lm",
        "model.n_layers=4",
        "model.d_model=32",
        "model.n_heads=2",
        "model.d_ff=64",
        "model.aux_losses={intermediate:true,multi_target:0.25}",
    ]
    run(compose(overrides), run_dir=tmp_path, callbacks=[record])
    assert seen == [(0.0, 0.25), (0.25, 0.25), (0.5, 0.25), (0.75, 0.25)]


def test_not_in_eval_and_off_for_other_presets():
    model = tiny_model().eval()
    tokens, targets = batch()
    assert model(tokens, targets).aux_losses == {}
    for name in list_models():
        if name == "al_rfou_lm":
            continue
        assert preset_config(name).aux_losses == {}, name
    vanilla = create_model("vanilla_lm", **get_preset("vanilla_lm").tiny).train()
    assert vanilla.aux_heads is None and vanilla(tokens, targets).aux_losses == {}


def test_bad_options_and_stacks_are_refused():
    with pytest.raises(ValueError, match="aux_losses"):
        tiny_model(aux_losses={"intermediat": True})
    with pytest.raises(ValueError, match="multi_target"):
        tiny_model(aux_losses={"multi_target": -1.0})
    with pytest.raises(ValueError, match="one block per layer"):
        tiny_model(stack={"name": "universal"}, position="none")
    with pytest.raises(ValueError, match="one block per layer"):  # it has blocks, but never calls them
        tiny_model(stack={"name": "reversible"}, residual="pre_norm", attention="shared_qk")
    with pytest.raises(ValueError, match=r"full softmax output head \(adaptive=\{\}\)"):
        tiny_model(adaptive={"cutoffs": [8]})
    with pytest.raises(ValueError, match="progress"):
        tiny_model().aux_heads.set_progress(1.5)


def test_a_copy_and_a_reload_compute_the_same_losses_from_their_own_layers():
    """The hooks and the shared head belong to each model: a deep copy records its own blocks, and the
    character-after-next classifier is saved in the state dict."""
    import copy

    model = tiny_model()
    tokens, targets = batch()
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.stack.blocks[0].parameters():
            p.add_(0.1)
    assert not torch.allclose(
        twin(tokens, targets).aux_losses["intermediate_l1"], model(tokens, targets).aux_losses["intermediate_l1"]
    )
    rebuilt = create_model(**model.config.to_dict()).train()
    rebuilt.load_state_dict(model.state_dict())
    for name, value in model(tokens, targets).aux_losses.items():
        torch.testing.assert_close(rebuilt(tokens, targets).aux_losses[name], value)


def test_an_override_of_one_loss_option_keeps_the_presets_others():
    """aux_losses={"layer_heads": False} changes that option only: the preset's intermediate and
    multiple-target losses stay on (the dict used to replace the preset's, silently turning them off)."""
    model = tiny_model(aux_losses={"layer_heads": False})
    assert model.config.aux_losses == {"intermediate": True, "multi_target": 0.5, "layer_heads": False}
    tokens, targets = batch()
    assert {"multi_target", "intermediate_l1"} <= set(model(tokens, targets).aux_losses)
