"""Activation checkpointing of every stack (zoo/stacks/checkpointing.py over zoo/attention/recompute.py).

Checked, per stack (sequential decoder-only, encoder-decoder, classifier, XL / GTrXL / adaptive-span memory
carried from segment to segment, universal with and without ACT) and mode (full, every 2nd block, the attention
sub-layer): float64 gradients with dropout on equal the plain run's exactly (the generators replayed), the
chosen layers really run again in backward and keep fewer bytes; under bf16 autocast they equal the plain bf16
run's; a part with a once-per-step side effect (Performer's redraw counter) counts one call; the state dict is
unchanged; what cannot be done is refused with the reason. One fast case per stack; the rest are slow.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import zoo
from zoo.attention.base import Attention
from zoo.attention.recompute import recompute
from zoo.presets.factory import get_preset
from zoo.stacks import checkpointing
from zoo.stacks.checkpointing import CheckpointPlan, set_activation_checkpointing
from zoo.train.activation_meter import ActivationMeter
from zoo.train.options import TrainerOptions
from zoo.train.steps import total_loss

PLANS = {
    "full": CheckpointPlan("full"),
    "every2": CheckpointPlan.selective(2),
    "attention": CheckpointPlan.attention_only(),
}
# preset -> overrides: every stack, with dropout on (the recomputation must draw the same masks)
CASES = {
    "vanilla_lm": {"n_layers": 3},
    "vanilla_seq2seq": {},
    "vanilla_classifier": {},
    "transformer_xl": {"n_layers": 3},  # memory carried from the first segment into the second
    "gtrxl": {},
    "adaptive_span_lm": {},
    "universal_transformer": {"n_layers": 3},
    "universal_transformer_act": {},
}
FAST = {("vanilla_lm", "full"), ("vanilla_seq2seq", "attention"), ("transformer_xl", "every2"),
        ("universal_transformer_act", "full"), ("universal_transformer", "every2")}  # fmt: skip


def build(name: str, dtype=torch.float64, **extra) -> nn.Module:
    torch.manual_seed(0)
    preset = get_preset(name)
    model = zoo.create_model(name, **{**preset.tiny, "dropout": 0.2, **CASES.get(name, {}), **extra})
    return model.to(dtype).train()


def batches(model: nn.Module, segments: int = 2, b: int = 2, t: int = 12) -> list[dict]:
    """``segments`` consecutive training batches of the model's kind."""
    g = torch.Generator().manual_seed(1)
    cfg = model.config
    tokens = torch.randint(3, cfg.vocab_size, (b, segments * t + 1), generator=g)
    out = []
    for i in range(segments):
        x, y = tokens[:, i * t : (i + 1) * t], tokens[:, i * t + 1 : (i + 1) * t + 1]
        if cfg.kind == "seq2seq":
            out.append(dict(src=x, tgt=y, targets=x))
        elif cfg.kind == "classifier":
            out.append(dict(tokens=x, targets=x[:, 0] % cfg.n_classes))
        else:
            out.append(dict(tokens=x, targets=y))
    return out


def run(model: nn.Module, plan: CheckpointPlan, feed: list[dict], autocast: bool = False) -> dict:
    """Gradients of the last segment's loss (the earlier ones build the memory a stateful model carries),
    attention calls, bytes saved for backward."""
    set_activation_checkpointing(model, plan)
    torch.manual_seed(7)
    state = None
    keeps = model.attentions_keep_state() and model.config.kind == "lm"
    for batch in feed[:-1]:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            state = model(**batch, state=state).state if keeps else None
    calls = []
    hooks = [m.register_forward_hook(lambda *_: calls.append(1)) for m in model.modules() if isinstance(m, Attention)]
    model.zero_grad()
    with ActivationMeter(model) as meter, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(**feed[-1], **({"state": state} if keeps else {}))
        loss = total_loss(out)
    forward_calls = len(calls)
    loss.backward()
    for hook in hooks:
        hook.remove()
    set_activation_checkpointing(model, CheckpointPlan())
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return dict(grads=grads, calls=(forward_calls, len(calls)), bytes=meter.bytes, loss=loss.detach())


def cases():
    for name in CASES:
        for mode in PLANS:
            marks = () if (name, mode) in FAST else (pytest.mark.slow,)
            yield pytest.param(name, mode, id=f"{name}-{mode}", marks=marks)


@pytest.mark.parametrize("name,mode", cases())
def test_checkpointed_gradients_equal_the_plain_run(name, mode):
    model = build(name)
    feed = batches(model)
    plain = run(model, CheckpointPlan(), feed)
    checkpointed = run(model, PLANS[mode], feed)
    assert plain["grads"].keys() == checkpointed["grads"].keys()
    for key, grad in plain["grads"].items():
        torch.testing.assert_close(checkpointed["grads"][key], grad, rtol=0, atol=1e-12, msg=key)
    assert torch.equal(plain["loss"], checkpointed["loss"])
    assert checkpointed["bytes"] < plain["bytes"]  # fewer activations kept for backward
    if mode != "attention":  # recomputing a whole block runs its attention again (a sub-layer stops early)
        assert checkpointed["calls"][1] > checkpointed["calls"][0] == plain["calls"][0] == plain["calls"][1]


def test_the_xl_memory_is_carried_into_the_checkpointed_segment():
    """Guard for the case above: the second segment really attends over the first's memory."""
    model = build("transformer_xl")
    first, second = batches(model)
    with torch.no_grad():
        state = model(**first, state=None).state
    assert any(layer is not None and layer.attention.length > 0 for layer in state.layers)


@pytest.mark.parametrize("mode", ["full", pytest.param("attention", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", ["vanilla_lm", pytest.param("transformer_xl", marks=pytest.mark.slow)])
def test_bf16_autocast_gradients_equal_the_plain_bf16_run(name, mode):
    """The recomputation replays the forward's autocast state: a bf16 forward recomputed in float32 would give
    other saved tensors (dtype check) and other gradients."""
    model = build(name, dtype=torch.float32)
    feed = batches(model)
    plain = run(model, CheckpointPlan(), feed, autocast=True)
    checkpointed = run(model, PLANS[mode], feed, autocast=True)
    for key, grad in plain["grads"].items():
        torch.testing.assert_close(checkpointed["grads"][key], grad, rtol=0, atol=0, msg=key)


def test_dropout_masks_are_drawn_again_not_anew(monkeypatch):
    """Without the generators replayed the recomputed dropout masks differ and so do the gradients: the
    equality above is not one that holds whatever the recomputation draws."""
    model = build("vanilla_lm")
    feed = batches(model, segments=1)
    plain = run(model, CheckpointPlan(), feed)

    def forgetful(fn, *args, **kwargs):
        return recompute(fn, *args, **{**kwargs, "preserve_rng_state": False})

    monkeypatch.setattr(checkpointing, "recompute", forgetful)
    forgot = run(model, PLANS["full"], feed)
    assert any(not torch.allclose(forgot["grads"][k], g) for k, g in plain["grads"].items())


def test_performer_counts_a_recomputed_call_once_and_redraws_the_same_features():
    model = build("vanilla_lm", attention={"name": "performer", "redraw_interval": 1})
    feed = batches(model, segments=1)
    plain = run(model, CheckpointPlan(), feed)
    counts = [int(m.calls) for m in model.modules() if hasattr(m, "redraw")]
    checkpointed = run(model, PLANS["full"], feed)
    assert [int(m.calls) for m in model.modules() if hasattr(m, "redraw")] == [c + 1 for c in counts]
    # the features were redrawn once more by the second forward: compare against a plain run from the same draw
    model2 = build("vanilla_lm", attention={"name": "performer", "redraw_interval": 1})
    run(model2, CheckpointPlan(), feed)
    again = run(model2, CheckpointPlan(), feed)
    for key, grad in again["grads"].items():
        torch.testing.assert_close(checkpointed["grads"][key], grad, rtol=0, atol=1e-12, msg=key)
    assert plain["calls"][0] == checkpointed["calls"][0]


def test_state_dict_and_hooks_are_unchanged_and_none_undoes_a_plan():
    model = build("vanilla_lm")
    keys = list(model.state_dict())
    blocks = set_activation_checkpointing(model, CheckpointPlan.selective(2))
    assert list(model.state_dict()) == keys and len(blocks) == 3
    assert all("forward" in block.__dict__ for block in blocks)
    assert set_activation_checkpointing(model, CheckpointPlan()) == []
    assert not any("forward" in block.__dict__ or "_attend" in block.__dict__ for block in model.stack.blocks)


def test_refusals_name_the_reason():
    with pytest.raises(ValueError, match="'reversible' recomputes every layer in backward already"):
        set_activation_checkpointing(build("reformer"), CheckpointPlan("full"))
    model = build("vanilla_lm")
    with pytest.raises(ValueError, match="non-reentrant"):
        set_activation_checkpointing(
            model, CheckpointPlan("full"), checkpoint_fn=partial(checkpoint, use_reentrant=True)
        )
    with pytest.raises(ValueError, match="holds no zoo stack"):
        set_activation_checkpointing(nn.Linear(2, 2), CheckpointPlan("full"))
    model.stack.block_applications = lambda: None  # a stack of one's own that does not list its blocks
    with pytest.raises(ValueError, match="does not list the blocks it applies"):
        set_activation_checkpointing(model, CheckpointPlan("full"))
    with pytest.raises(ValueError, match="selective_checkpointing='attention' chooses what selective"):
        TrainerOptions(activation_checkpointing="full", selective_checkpointing="attention")
    with pytest.raises(ValueError, match="block interval k >= 1"):
        TrainerOptions(activation_checkpointing="selective", selective_checkpointing="0")
    with pytest.raises(ValueError, match="must be one of none, full, selective"):
        TrainerOptions(activation_checkpointing="some")
    with pytest.raises(ValueError, match="context_parallel > 1 is not supported yet"):
        TrainerOptions(activation_checkpointing="full", context_parallel=2)
    assert TrainerOptions(activation_checkpointing="selective").checkpoint_plan() == CheckpointPlan.selective(2)
    assert (
        CheckpointPlan.parse("selective:attention")
        == TrainerOptions(activation_checkpointing="selective", selective_checkpointing="attention").checkpoint_plan()
    )
    assert CheckpointPlan.parse("selective:3").spec == "selective:3"


# -- the application: trainer.activation_checkpointing reaches the run -----------------------------------------


def test_the_trainer_options_reach_the_plan():
    pytest.importorskip("hydra")
    from support.app_overrides import TINY

    from zoo.app.compose import compose
    from zoo.app.run import trainer_options

    keys = ["trainer.activation_checkpointing=selective", "trainer.selective_checkpointing=3"]
    assert trainer_options(compose(TINY + keys)).checkpoint_plan() == CheckpointPlan.selective(3)


@pytest.mark.slow  # two tiny training runs, about 5 s each here
def test_a_checkpointed_run_trains_as_the_plain_one(tmp_path):
    pytest.importorskip("hydra")
    from support.app_overrides import TINY

    from zoo.app.compose import compose
    from zoo.app.run import run as run_app
    from zoo.train.checkpoints.format import load_checkpoint

    common = TINY + ["trainer.max_steps=2", "trainer.eval_every=2", "trainer.threads=1", "model.dropout=0.1"]
    run_app(compose(common), run_dir=tmp_path / "plain")
    run_app(compose(common + ["trainer.activation_checkpointing=full"]), run_dir=tmp_path / "full")
    plain, full = (load_checkpoint(tmp_path / name / "checkpoints" / "last.pt")["model"] for name in ("plain", "full"))
    for key, value in plain.items():
        assert torch.equal(full[key], value), key


def test_the_cost_model_counts_the_recomputation():
    """Full checkpointing adds one forward of every block to a step's FLOPs (zoo/models/costs.py), the attention
    sub-layer only its attention; the activation estimate, which does not model checkpointing, says unknown."""
    from zoo.models.costs import activation_bytes_per_token, forward_flops, step_flops

    model, t = build("vanilla_lm"), 16
    plain = step_flops(model, t)["total"]
    blocks_forward = forward_flops(model, t) - model.output_flops(t)[0]
    set_activation_checkpointing(model, CheckpointPlan("full"))
    assert step_flops(model, t)["total"] == pytest.approx(plain + blocks_forward)
    assert activation_bytes_per_token(model, t, model.config.d_model) is None
    set_activation_checkpointing(model, CheckpointPlan.attention_only())
    attention = sum(block.attention.forward_flops(t).total for block in model.stack.blocks)
    assert step_flops(model, t)["total"] == pytest.approx(plain + attention)
    set_activation_checkpointing(model, CheckpointPlan())
    assert step_flops(model, t)["total"] == plain and activation_bytes_per_token(model, t, 32) is not None


@pytest.mark.slow  # compiling takes minutes on the shared CPU
def test_checkpointed_blocks_compile_with_the_same_gradients():
    """Under torch.compile the checkpoint is traced into the graph (dynamo takes no replay context)."""
    model = build("vanilla_lm", dtype=torch.float32, dropout=0.0)
    feed = batches(model, segments=1)
    plain = run(model, CheckpointPlan(), feed)
    set_activation_checkpointing(model, CheckpointPlan("full"))
    model.zero_grad()
    total_loss(torch.compile(model)(**feed[-1])).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, plain["grads"][name], rtol=1e-4, atol=1e-5, msg=name)
