"""The Hydra app's configuration: every YAML composes, registries and conf/ agree, typos fail early
listing the valid keys, attention= swaps the mechanism of a preset."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
import torch

pytest.importorskip("hydra")

from hydra.errors import ConfigCompositionException  # noqa: E402
from support.script_modules import load_script

import zoo  # noqa: E402
from zoo.app import sync  # noqa: E402
from zoo.app.compose import CONF_DIR, compose, explain_overrides, hydra_context  # noqa: E402
from zoo.app.resolve import model_layers  # noqa: E402
from zoo.app.run import build  # noqa: E402
from zoo.app.schema import named_schema, options_defaults, schema_type  # noqa: E402
from zoo.config import merge_config  # noqa: E402
from zoo.data import list_tasks  # noqa: E402
from zoo.registry import UnknownNameError  # noqa: E402

GROUPS = [
    "model",
    "attention",
    "residual",
    "stack",
    "position",
    "norm",
    "feed_forward",
    "init",
    "data",
    "optim",
    "trainer",
    "logger",
    "experiment",
    "sweep",
    "debug",
]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def test_every_yaml_composes():
    """One composition per row of a zip over every group's options covers every file quickly."""
    from hydra import compose as hydra_compose

    columns = [[f"{g}={o}" for o in options(g)] for g in GROUPS]
    rows = list(itertools.zip_longest(*columns))
    with hydra_context():
        for row in rows:
            overrides = [o for o in row if o is not None]
            # an experiment picks its own data and may set that data's keys: compose it apart
            experiment = [o for o in overrides if o.startswith("experiment=")]
            rest = [o for o in overrides if not o.startswith("experiment=")]
            alone = experiment + [o for o in rest if not o.startswith("data=")]
            for overrides in (rest, alone) if experiment else (rest,):
                cfg = hydra_compose(config_name="config", overrides=overrides)
                assert cfg.model.preset and cfg.data.name and cfg.trainer.max_steps > 0, overrides
    assert len(rows) == max(len(c) for c in columns)


def test_launcher_yamls_compose_when_plugin_installed():
    """Each conf/hydra/launcher/*.yaml composes onto its plugin's schema (a key the plugin lacks would
    fail), every value it sets is the launcher's, and its target is a Hydra launcher class. The plugin
    is in the dev extra, so this runs under `make test`."""
    import yaml
    from hydra.plugins.launcher import Launcher
    from hydra.utils import get_class

    try:
        found = importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        pytest.skip("hydra-submitit-launcher not installed (pip install transformer-zoo[dev])")
    names = options("hydra/launcher")
    assert names == ["local_jobs", "slurm"]
    for name in names:
        launcher = compose([f"hydra/launcher={name}"], return_hydra_config=True).hydra.launcher
        written = yaml.safe_load((CONF_DIR / "hydra" / "launcher" / f"{name}.yaml").read_text())
        for key, value in written.items():
            if key != "defaults":
                assert launcher[key] == value, (name, key)
        cls = get_class(launcher._target_)
        assert issubclass(cls, Launcher), (name, launcher._target_)
        assert cls.__name__ == {"local_jobs": "LocalLauncher", "slurm": "SlurmLauncher"}[name]


def test_registry_names_and_conf_stems_agree_both_ways():
    from zoo.app.schema import PART_GROUPS

    for axis, registry in PART_GROUPS.items():  # attention, residual, stack, position
        assert options(axis) == registry.list(), axis
    assert options("model") == zoo.list_models()
    assert sync.check(CONF_DIR) == [], "run experiments/sync_configs.py"
    import yaml

    data_tasks = {yaml.safe_load((CONF_DIR / "data" / f"{o}.yaml").read_text())["name"] for o in options("data")}
    assert data_tasks == set(list_tasks()), "every registered task has a data/ config"


def test_sync_is_idempotent_and_repairs(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    assert sync.sync(conf) == ([], [])
    (conf / "attention" / "vanilla.yaml").write_text("name: vanilla\n")  # stale
    (conf / "model" / "vanilla_lm.yaml").unlink()  # missing
    (conf / "attention" / "gone.yaml").write_text(sync.GENERATED + " from nowhere\nname: gone\n")  # unregistered
    (conf / "residual" / "gru_gate.yaml").write_text("name: gru_gate\ngate_bias: 2.0\n")  # stale: filled with a default
    (conf / "stack" / "universal.yaml").unlink()  # missing
    (conf / "position" / "gone.yaml").write_text(sync.GENERATED + " from nowhere\nname: gone\n")  # unregistered
    (conf / "data" / "enwik8.yaml").write_text("name: enwik8\npath: /home/me/enwik8\n")  # stale: hand-edited
    (conf / "data" / "shakespeare.yaml").unlink()  # missing: a task's named setup
    (conf / "data" / "gone.yaml").write_text(sync.GENERATED + " from nowhere\nname: gone\n")  # unregistered
    problems = sync.check(conf)
    assert any("stale" in p and "enwik8.yaml" in p for p in problems)
    assert any("missing" in p and "shakespeare.yaml" in p for p in problems)
    assert any("not registered" in p and "data/gone.yaml" in p for p in problems)
    assert any("stale" in p and "vanilla.yaml" in p for p in problems)
    assert any("missing" in p and "vanilla_lm.yaml" in p for p in problems)
    assert any("gone.yaml" in p for p in problems)
    assert any("stale" in p and "gru_gate.yaml" in p for p in problems)
    assert any("missing" in p and "universal.yaml" in p for p in problems)
    changes, left = sync.sync(conf)
    assert len(changes) == 9 and left == []
    assert "gate_bias: null" in (conf / "residual" / "gru_gate.yaml").read_text()  # null = unset: the preset's value
    assert "path: ${data_dir}/enwik8\n" in (conf / "data" / "enwik8.yaml").read_text()  # from Enwik8Task.data_dir_path
    assert sync.check(conf) == [] and sync.sync(conf) == ([], [])
    (conf / "model" / "not_a_preset.yaml").write_text("preset: not_a_preset\n")
    assert any("not_a_preset" in p and "vanilla_lm" in p for p in sync.check(conf))
    (conf / "data" / "mine.yaml").write_text("name: char_lm\n")  # hand-written, no task or setup of that name
    assert any("mine.yaml" in p and "hand-written" in p for p in sync.check(conf))


def test_data_configs_say_what_the_task_class_says():
    """conf/data/<task>.yaml comes from the task: its Options at their defaults, data.path under the data
    directory where the task names one, its docstring as the comment, and one file per named setup
    (a setup naming an option the task lacks is refused)."""
    from dataclasses import dataclass

    from zoo.data import TASK
    from zoo.data.base import Task

    @dataclass
    class Options:
        path: str = ""
        width: int = 3

    class Throwaway(Task):
        """A throwaway task for this test."""

        data_dir_path = "throwaway/files"
        setups = {"throwaway_wide": ("The wide one.", {"width": 9})}

    Throwaway.Options = Options
    TASK.register("_test_throwaway", Throwaway)
    try:
        files = sync.data_files()
        mine, wide = files["_test_throwaway"], files["throwaway_wide"]
        assert "# A throwaway task for this test." in mine and "# The wide one." in wide
        assert mine.endswith("name: _test_throwaway\npath: ${data_dir}/throwaway/files\nwidth: 3\n")
        assert wide.endswith("name: _test_throwaway\npath: ${data_dir}/throwaway/files\nwidth: 9\n")
        Throwaway.setups = {"throwaway_bad": ("Bad.", {"height": 2})}
        with pytest.raises(ValueError, match="unknown options.*height"):
            sync.data_files()
    finally:
        TASK.unregister("_test_throwaway")


@pytest.mark.parametrize(
    "override,valid",
    [
        ("attention.max_cach=3", "max_cache"),
        ("trainer.max_step=3", "max_steps"),
        ("model.dmodel=3", "d_model"),
        ("data.n_symbol=3", "n_symbols"),
        ("sed=1", "seed"),
    ],
)
def test_typo_fails_at_compose_time_listing_valid_keys(override, valid):
    argv = ["attention=vanilla", override] if override.startswith("attention") else [override]
    message = explain_overrides(argv)
    assert message and "valid:" in message and valid in message and f"Did you mean '{valid}'" in message
    with pytest.raises(ConfigCompositionException):
        compose(argv)


def test_the_command_line_explains_a_typo_from_hydras_own_failure(monkeypatch, capsys):
    """experiments/train.py composes once (no pre-check): Hydra's failure is explained, exit 2."""

    from hydra.core.global_hydra import GlobalHydra

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    module = load_script(CONF_DIR.parent / "experiments" / "train.py")
    for argv, expected in (
        (["trainer.max_step=3"], "valid: accumulate"),
        (["attention.n_hashs=8"], "Did you mean 'n_hashes'"),  # the preset's part: every mechanism's options, checked
    ):
        monkeypatch.setattr(sys, "argv", ["train.py", *argv])
        GlobalHydra.instance().clear()
        with pytest.raises(SystemExit) as info:
            module.main()
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.startswith("error: ") and expected in err, err
    assert "HYDRA_FULL_ERROR" not in os.environ  # set for the launch only


def test_part_options_apply_to_the_presets_own_part_without_picking_it():
    """The issue's command: attention.n_kv_heads=1 (no attention=...) reaches the preset's mechanism, beside the
    norm and feed-forward picked on their axes; an option the preset's part lacks composes (some mechanism has
    it) and is refused when the model is built, naming the part and its options."""
    base = ["experiment=tiny", "model=vanilla_lm", "trainer.seq_len=16", "trainer.batch_size=2"]
    _, _, model = build(compose(base + ["norm=rmsnorm", "feed_forward=swiglu", "attention.n_kv_heads=1"]))
    assert model.config.attention == {"name": "vanilla", "n_kv_heads": 1}
    assert (model.config.norm["name"], model.config.feed_forward["name"]) == ("rmsnorm", "swiglu")
    assert model.stack.blocks[0].attention.to_k.out_features == model.config.d_model // model.config.n_heads
    _, _, model = build(compose(base + ["norm.eps=0.001"]))  # the same on another axis
    assert model.config.norm == {"name": "layernorm", "eps": 0.001}
    with pytest.raises(UnknownNameError, match="attention 'vanilla' 'score'; valid: .*n_kv_heads"):
        build(compose(base + ["attention.score=dot"]))
    # an option no mechanism has is refused when the config is composed
    assert "Did you mean 'n_hashes'" in explain_overrides(["attention.n_hashs=8"])


def test_unknown_choice_lists_options():
    with pytest.raises(Exception) as info:
        compose(["attention=no_such_attention"])
    assert "vanilla" in str(info.value) and "additive" in str(info.value)
    with pytest.raises(Exception) as info:
        compose(["model=no_such_preset"])
    assert "vanilla_lm" in str(info.value)


def test_wrong_type_fails_at_compose_time():
    with pytest.raises(ConfigCompositionException, match="max_steps"):
        compose(["trainer.max_steps=many"])


def test_first_keys_users_reach_for():
    cfg = compose(
        [
            "model=vanilla_lm",
            "attention=additive",
            "data=associative_recall",
            "logger=csv",
            "seed=3",
            "trainer.max_steps=7",
            "trainer.eval_every=2",
            "trainer.device=cpu",
            "trainer.batch_size=5",
            "trainer.seq_len=32",
        ]
    )
    assert (cfg.model.preset, cfg.attention.name, cfg.data.name, cfg.logger.name, cfg.seed) == (
        "vanilla_lm",
        "additive",
        "associative_recall",
        "csv",
        3,
    )
    assert (
        cfg.trainer.max_steps,
        cfg.trainer.eval_every,
        cfg.trainer.device,
        cfg.trainer.batch_size,
        cfg.trainer.seq_len,
    ) == (7, 2, "cpu", 5, 32)


def test_attention_group_swaps_and_tweaks_the_mechanism():
    base = ["experiment=tiny", "trainer.seq_len=16", "trainer.batch_size=2"]
    _, _, model = build(compose(base + ["attention=additive", "attention.score=dot"]))
    assert model.config.attention == {"name": "additive", "score": "dot"}
    assert type(model.stack.blocks[0].attention).registry_name == "additive"
    # picking the preset's own mechanism keeps its options except what is set
    cfg = zoo.app.resolve.as_dict(compose(base + ["attention=vanilla", "attention.max_cache=5"]))
    _, layers = model_layers(cfg)
    overrides = layers[-1]  # the attention group's layer, the last to apply
    assert overrides["attention"] == {"name": "vanilla", "max_cache": 5}  # only what was set
    preset_values = {"attention": {"name": "vanilla", "bias": False}}  # a preset with tuned options
    assert merge_config(preset_values, {"attention": overrides["attention"]})["attention"] == {
        "name": "vanilla",
        "bias": False,
        "max_cache": 5,
    }
    assert merge_config(preset_values, {"attention": {"name": "additive"}})["attention"] == {"name": "additive"}
    # null attention keeps the preset's mechanism
    _, _, model = build(compose(base))
    assert model.config.attention["name"] == "vanilla"


def test_every_preset_yaml_builds_or_is_refused_clearly():
    """Every LM preset trains on the default task; classifier/seq2seq presets are refused with the reason."""
    for preset in zoo.list_models():
        cfg = compose(["experiment=tiny", f"model={preset}", "trainer.seq_len=16", "trainer.batch_size=2"])
        kind = zoo.preset_config(preset).kind
        if kind == "lm":
            build(cfg)
        else:
            with pytest.raises(ValueError, match="language-modelling task"):
                build(cfg)


def test_schema_types_from_options():
    @dataclasses.dataclass
    class Options:
        n: int = 4
        ratio: float = 0.5
        flag: bool = True
        mode: str = "a"
        maybe: Optional[int] = None  # noqa: UP045
        pep604: int | None = None
        sizes: tuple[int, ...] = (1, 2)
        odd: object = None

    schema = named_schema("attention", "fake", Options)
    hints = {f.name: f.type for f in dataclasses.fields(schema)}
    assert hints["n"] is int and hints["sizes"] == list[int] and hints["pep604"] == Optional[int]  # noqa: UP045
    assert options_defaults(Options)["sizes"] == [1, 2]
    assert schema_type(dict) == dict[str, Any] and schema_type(dict[str, int]) == dict[str, Any]


def test_conf_has_no_machine_paths():
    for path in Path(CONF_DIR).rglob("*.yaml"):
        assert "/work/" not in path.read_text(), path


def test_model_tiny_starts_from_the_presets_tiny_variant():
    cfg = zoo.app.resolve.as_dict(
        compose(
            ["model=vanilla_lm", "model.tiny=true", "model.n_layers=3", "attention=vanilla", "attention.max_cache=4"]
        )
    )
    preset, (tiny_layer, user, group) = model_layers(cfg)
    tiny = zoo.presets.get_preset("vanilla_lm").tiny
    assert tiny_layer["d_model"] == tiny["d_model"] and "vocab_size" not in tiny_layer and user["n_layers"] == 3
    assert group["attention"] == {"name": "vanilla", "max_cache": 4}
    config = zoo.app.resolve.model_config(cfg)
    assert (config.d_model, config.n_layers, config.attention) == (
        tiny["d_model"],
        3,
        {"name": "vanilla", "max_cache": 4},
    )


def test_every_lm_presets_tiny_variant_takes_the_tiny_trainers_sequence():
    """``sweep=all_lm experiment=tiny``: al_rfou_lm's tiny variant held a 64-row position table while
    trainer=tiny feeds 128 tokens. A tiny variant's max_len is a size, raised to the trainer's sequence;
    a max_len the user sets is still kept (and refused when too short)."""
    seq_len = compose(["experiment=tiny"]).trainer.seq_len
    for preset in zoo.list_models():
        if zoo.preset_config(preset).kind != "lm":
            continue
        config = zoo.app.resolve.model_config(
            zoo.app.resolve.as_dict(compose(["experiment=tiny", f"model={preset}"])), min_len=seq_len
        )
        assert config.max_len >= seq_len, preset
    _, task, model = build(compose(["experiment=tiny", "model=al_rfou_lm", "trainer.batch_size=1"]))
    tokens = torch.zeros(1, task.seq_len, dtype=torch.long)
    assert model(tokens, targets=tokens).loss.isfinite()
    with pytest.raises(ValueError, match="max_len=64"):
        _, _, model = build(compose(["experiment=tiny", "model=al_rfou_lm", "model.max_len=64"]))
        model(tokens)


def test_attention_seed_sweep_chooses_mechanisms_by_their_flags():
    """``sweep=attention_seed experiment=tiny`` listed bigbird, linformer and nystromformer (no causal
    form) in an LM, and 9 of its jobs failed: the sweep asks the preset's head and the mechanisms' flags,
    so a mechanism registered later joins (or stays out) by its flags alone."""
    from zoo.attention.base import ATTENTION
    from zoo.attention.vanilla import VanillaAttention

    cfg = compose(["sweep=attention_seed", "experiment=tiny"], return_hydra_config=True)
    listed = cfg.hydra.sweeper.params.attention.split(",")
    causal = [name for name in zoo.list_attention() if ATTENTION.get(name).supports_causal]
    assert listed == causal and "vanilla" in listed and "linformer" not in listed
    encoder = compose(["sweep=attention_seed", "experiment=tiny", "model=bigbird_classifier"], return_hydra_config=True)
    assert "linformer" in encoder.hydra.sweeper.params.attention.split(",")

    class LaterCausal(VanillaAttention):
        pass

    class LaterEncoderOnly(VanillaAttention):
        supports_causal, no_causal_reason = False, "a test part"

    ATTENTION.register("zz_later_causal")(LaterCausal)
    ATTENTION.register("zz_later_encoder")(LaterEncoderOnly)
    try:
        listed = zoo.app.run.attention_for("vanilla_lm").split(",")
        assert "zz_later_causal" in listed and "zz_later_encoder" not in listed
    finally:
        ATTENTION.unregister("zz_later_causal")
        ATTENTION.unregister("zz_later_encoder")
