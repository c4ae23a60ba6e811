"""Set == runs: every key a user sets on the command line is the value the built model (or the
run) uses, even one equal to a default; a key left unset keeps the preset's value; an
experiment's values never beat the command line nor leak into a group choice the user made."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

pytest.importorskip("hydra")

from hydra.errors import ConfigCompositionException  # noqa: E402

import zoo  # noqa: E402
from zoo.app.compose import compose, explain_overrides, hydra_context  # noqa: E402
from zoo.app.resolve import as_dict, model_config  # noqa: E402
from zoo.app.run import build  # noqa: E402
from zoo.app.schema import PART_GROUPS, options_fields  # noqa: E402
from zoo.config import ModelConfig  # noqa: E402
from zoo.presets.factory import get_preset, preset_config  # noqa: E402

SMALL = ["trainer.seq_len=16", "trainer.batch_size=2"]


def marker(default):
    """A value of the same kind as ``default`` that differs from it: what a preset might tune."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 3
    if isinstance(default, float):
        return default + 0.5
    if isinstance(default, str):
        return default + "_preset"
    return 2  # a None default (e.g. universal's max_steps)


def as_override(value) -> str:
    return json.dumps(value)  # Hydra reads JSON scalars: true, 3, 0.5, "text"


@pytest.fixture
def composer():
    """compose(overrides) inside one Hydra context per test: composing is slow, these tests do many."""
    from hydra import compose as hydra_compose

    with hydra_context():
        yield lambda overrides: as_dict(hydra_compose(config_name="config", overrides=list(overrides)))


def final_config(cfg: dict) -> ModelConfig:
    """The config the model is built from (the run binds the same layers to its task)."""
    return model_config(cfg)


def only(cfg: dict, axis: str, keep: set[str]) -> dict:
    """``cfg`` as composed had only the ``keep`` options of ``axis`` been set (the rest null, as in
    the generated group files)."""
    cfg = copy.deepcopy(cfg)
    for key in cfg[axis]:
        if key not in keep | {"name", "preset", "tiny"}:
            cfg[axis][key] = None
    return cfg


def part_options(axis: str) -> list[tuple[str, list[tuple[str, object]]]]:
    registry = PART_GROUPS[axis]
    return [(name, [(o, d) for o, _, d in options_fields(registry.get(name).Options)]) for name in registry.list()]


def test_every_option_of_every_part_reaches_the_model(composer, monkeypatch):
    """A preset tunes every option of a part away from its default; the user sets an option back to
    its default: the model gets exactly that, and every option not set stays the preset's."""
    preset = get_preset("vanilla_lm")
    checked = 0
    for axis in PART_GROUPS:
        for name, options in part_options(axis):
            settable = [(o, d) for o, d in options if d is not None]  # a null on the command line is "unset"
            tuned = {o: marker(d) for o, d in options}
            monkeypatch.setattr(
                preset, "build_config", lambda axis=axis, name=name, tuned=tuned: {axis: {"name": name, **tuned}}
            )
            cfg = composer(
                ["model=vanilla_lm", f"{axis}={name}", *(f"{axis}.{o}={as_override(d)}" for o, d in settable)]
            )
            assert getattr(final_config(cfg), axis) == {"name": name, **tuned, **dict(settable)}, (
                "every option set reaches the model"
            )
            assert getattr(final_config(only(cfg, axis, set())), axis) == {"name": name, **tuned}, (
                "unset keeps the preset's"
            )
            for option, default in settable:
                got = getattr(final_config(only(cfg, axis, {option})), axis)
                assert got == {"name": name, **tuned, option: default}, (
                    f"{axis}={name} {axis}.{option}={default!r} gave {got}"
                )
                checked += 1
    assert checked >= 40


def test_every_model_key_reaches_the_model(composer, monkeypatch):
    """model.<key>=<ModelConfig default> on a preset that sets every scalar key otherwise."""
    scalar = {
        f.name: f.default
        for f in dataclasses.fields(ModelConfig)
        if f.default is not dataclasses.MISSING and f.name != "name"
    }
    # a preset's own values for every key, all different from ModelConfig's and valid together;
    # a key added later whose marker is not a valid value keeps its default in the preset (and is
    # still set back on the command line below)
    tuned = {k: marker(v) for k, v in scalar.items()} | dict(
        kind="seq2seq", head="none", d_model=96, n_heads=4, activation="gelu", pooling="first"
    )
    for key in list(tuned):
        try:
            ModelConfig(**{key: tuned[key]})
        except ValueError:
            tuned.pop(key)
    assert {"kind", "d_model", "n_layers", "dropout", "tie_embeddings", "activation"} <= set(tuned)
    monkeypatch.setattr(get_preset("vanilla_lm"), "build_config", lambda: dict(tuned))
    cfg = composer(["model=vanilla_lm", *(f"model.{k}={as_override(v)}" for k, v in scalar.items())])
    assert all(getattr(final_config(cfg), k) == v for k, v in scalar.items())
    for key, default in scalar.items():
        got = final_config(only(cfg, "model", {key}))
        assert getattr(got, key) == default, key
        assert all(getattr(got, k) == v for k, v in tuned.items() if k != key), key


def test_issue_examples_build_what_was_asked():
    """The reported cases, built for real: values equal to the mechanism's default used to be dropped."""
    _, _, model = build(
        compose(
            ["experiment=tiny", "model=adaptive_span_lm", "attention=adaptive_span", "attention.max_span=1024", *SMALL]
        )
    )
    assert model.config.attention["max_span"] == 1024
    assert model.stack.blocks[0].attention.options.max_span == 1024
    _, _, model = build(
        compose(["model=adaptive_span_lm", "attention=adaptive_span", "attention.max_span=1024", *SMALL])
    )
    assert model.config.attention["max_span"] == 1024
    _, _, model = build(
        compose(
            [
                "model=sparse_transformer",
                "attention=sparse_fixed",
                "attention.c=8",
                "attention.combine=interleaved",
                *SMALL,
            ]
        )
    )
    options = model.stack.blocks[0].attention.options
    assert (options.c, options.combine, options.stride) == (8, "interleaved", 128)  # stride: the preset's, unset


def test_tiny_never_beats_the_command_line(composer):
    """Every value experiment=tiny brings (its own keys and each preset's tiny variant), set on the
    command line to something else, is what runs."""
    cfg = composer(
        [
            "experiment=tiny",
            "trainer.max_steps=7",
            "trainer.batch_size=3",
            "trainer.seq_len=40",
            "trainer.eval_every=0",
            "trainer.eval_batches=2",
            "optim.lr=0.02",
            "optim.warmup=5",
        ]
    )
    assert [cfg["trainer"][k] for k in ("max_steps", "batch_size", "seq_len", "eval_every", "eval_batches")] == [
        7,
        3,
        40,
        0,
        2,
    ]
    assert (cfg["optim"]["lr"], cfg["optim"]["warmup"]) == (0.02, 5)
    got = final_config(
        composer(
            [
                "experiment=tiny",
                "model.d_model=48",
                "model.n_layers=3",
                "model.n_heads=2",
                "model.d_ff=96",
                "model.dropout=0.25",
            ]
        )
    )
    assert (got.d_model, got.n_layers, got.n_heads, got.d_ff, got.dropout) == (48, 3, 2, 96, 0.25)
    seen = []
    for preset in zoo.list_models():
        tiny = {k: v for k, v in get_preset(preset).tiny.items() if k != "vocab_size"}  # the task sets the vocabulary
        own = preset_config(preset)
        if isinstance(own.attention, list):  # a per-layer hybrid: its overrides are tests/contracts/test_hybrids.py's
            continue
        if (tiny, own.attention["name"]) in seen:  # same tiny variant of the same mechanism: already checked
            continue
        seen.append((tiny, own.attention["name"]))
        asked, argv = {}, ["experiment=tiny", f"model={preset}"]
        for key, value in tiny.items():
            if isinstance(value, dict):  # tweaks of the preset's own part: set each back to its default
                name = getattr(own, key)["name"]
                defaults = {o: d for o, _, d in options_fields(PART_GROUPS[key].get(name).Options)}
                asked[key] = {o: defaults[o] if defaults[o] != v else marker(v) for o, v in value.items()}
                argv += [f"{key}={name}", *(f"{key}.{o}={as_override(v)}" for o, v in asked[key].items())]
            else:  # ints tripled (widths stay divisible by tiny's 4 heads), heads 2, rates + 0.25
                asked[key] = 2 if key == "n_heads" else value * 3 if isinstance(value, int) else value + 0.25
                argv.append(f"model.{key}={as_override(asked[key])}")
        got = final_config(composer(argv))
        for key, value in asked.items():
            if isinstance(value, dict):
                assert all(getattr(got, key)[o] == v for o, v in value.items()), (preset, key)
            else:
                assert getattr(got, key) == value, (preset, key)
    assert len(seen) >= 5


def test_experiment_values_do_not_leak_into_another_choice(composer):
    """experiment=tiny optim=noam used to run Noam with multiplier 0.003 and warm-up 30: a group the
    user picks gets its own file's values (the experiments pick trainer=tiny/demo, optim=adam_tiny)."""
    checks = [
        ("tiny", group, choice)
        for group, choices in (("optim", ["adam", "adamw", "noam"]), ("trainer", ["default", "debug", "gpu"]))
        for choice in choices
    ] + [("demo", "optim", "noam"), ("demo", "trainer", "debug")]
    alone = {}
    for experiment, group, choice in checks:
        alone.setdefault((group, choice), composer([f"{group}={choice}"])[group])
        assert composer([f"experiment={experiment}", f"{group}={choice}"])[group] == alone[group, choice], (
            experiment,
            group,
            choice,
        )
    assert alone["optim", "noam"]["lr"] == 1.0 and alone["optim", "noam"]["warmup"] == 4000


def test_part_groups_set_their_options_and_refuse_typos():
    _, _, model = build(
        compose(["experiment=tiny", "model=gtrxl", "residual=gru_gate", "residual.gate_bias=0", *SMALL])
    )
    assert model.config.residual == {"name": "gru_gate", "gate_bias": 0.0}
    gates = [m for m in model.modules() if getattr(type(m), "registry_name", None) == "gru_gate"]
    assert gates and all(float(g.gate_bias.detach().abs().max()) == 0.0 for g in gates)
    _, _, model = build(
        compose(
            [
                "experiment=tiny",
                "model=vanilla_lm",
                "residual=rezero",
                "stack=universal",
                "stack.act=true",
                "stack.max_steps=3",
                "stack.position_signal=false",  # one owner of the position signal: here the embedding's
                "position=learned",
                *SMALL,
            ]
        )
    )
    assert (model.config.residual, model.config.position) == ({"name": "rezero"}, {"name": "learned"})
    assert model.config.stack == {"name": "universal", "act": True, "max_steps": 3, "position_signal": False}
    assert model.stack.steps == 3
    message = explain_overrides(["residual=gru_gate", "residual.gate_bais=0"])
    assert "valid: gate_bias, name" in message and "Did you mean 'gate_bias'" in message
    with pytest.raises(ConfigCompositionException):
        compose(["residual=gru_gate", "residual.gate_bais=0"])
    message = explain_overrides(["model.residual.gate_bias=0"])  # the model key of an axis: say how
    assert "residual=gru_gate residual.gate_bias=" in message and "pre_norm" in message, message
    # the group's default node is the preset's own part, its options set in place (gtrxl's gru_gate)
    assert explain_overrides(["model=gtrxl", "residual.gate_bias=1"]) is None
    assert "Did you mean 'act'" in explain_overrides(["stack=universal", "stack.actt=true"])
    with pytest.raises(ConfigCompositionException, match="max_steps"):
        compose(["stack=universal", "stack.max_steps=many"])


def test_null_part_keeps_the_presets_choice_and_options(composer):
    for preset in ("gtrxl", "reformer", "sparse_transformer", "universal_transformer_act"):
        got = final_config(composer([f"model={preset}"]))
        own = preset_config(preset)
        assert (got.attention, got.residual, got.stack, got.position) == (
            own.attention,
            own.residual,
            own.stack,
            own.position,
        )
