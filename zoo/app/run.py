"""From a composed config to a finished run: task, model, loggers, trainer.

``run(cfg)`` is what ``experiments/train.py`` calls; it returns the validation metric so a Hydra
sweeper can optimise it. ``build(cfg)`` gives the pieces without training (evaluate/sample, tests).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from zoo.app.schema import LoggerOptions, options_defaults, to_options
from zoo.data import TASK, Task, create_task
from zoo.paper import check_paper_data
from zoo.registry import ATTENTION
from zoo.trainer import MetricsFile, OptimOptions, Trainer, TrainerOptions, build_model_for_task, seed_everything

GROUP_NODES = ("model", "attention", "data", "optim", "trainer", "logger")


def as_dict(cfg: DictConfig | dict) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)


def attention_override(attention: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``attention`` group node -> a model override.

    Only options that differ from the mechanism's ``Options`` defaults are passed, so picking the
    mechanism a preset already uses keeps the preset's tuned values (``attention=lsh
    attention.n_hashes=8`` on ``reformer`` changes n_hashes only), while picking another mechanism
    swaps it in with its defaults plus what the user set."""
    if not attention:
        return None
    attention = dict(attention)
    name = attention.pop("name")
    cls = ATTENTION.get(name)
    defaults = options_defaults(cls.Options)
    changed = {k: v for k, v in attention.items() if k not in defaults or defaults[k] != v}
    return {"name": name, **to_options(cls.Options, changed)}


def model_overrides(cfg: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(preset, overrides) from the ``model`` and ``attention`` nodes; null = the preset's value.

    ``model.tiny=true`` starts from the preset's registered tiny variant (its vocabulary excepted:
    the task sets it); the user's ``model.*`` keys and the ``attention`` group go on top."""
    from zoo.config import merge_config
    from zoo.models import get_preset, preset_config

    model = dict(cfg["model"])
    preset = model.pop("preset")
    tiny = model.pop("tiny", False)
    overrides = {k: v for k, v in model.items() if v is not None}
    if tiny:
        base = {k: v for k, v in get_preset(preset).tiny.items() if k != "vocab_size"}
        overrides = merge_config(base, overrides)
    attention = attention_override(cfg.get("attention"))
    if attention is not None:
        current = overrides.get("attention")
        if isinstance(current, dict) and "name" not in current:  # tweaks of the preset's own mechanism
            overrides["attention"] = {"name": preset_config(preset).attention["name"], **current}
        overrides = merge_config(overrides, {"attention": attention})
    return preset, overrides


def make_task(cfg: dict[str, Any]) -> Task:
    data = dict(cfg["data"])
    name = data.pop("name")
    trainer = cfg["trainer"]
    return create_task(name, batch_size=trainer["batch_size"], seq_len=trainer["seq_len"], seed=cfg.get("seed", 0), **to_options(TASK.get(name).Options, data))


def trainer_options(cfg: dict[str, Any]) -> TrainerOptions:
    return TrainerOptions(**cfg["trainer"])


def optim_options(cfg: dict[str, Any]) -> OptimOptions:
    return OptimOptions(**cfg["optim"])


def build(cfg: DictConfig | dict) -> tuple[dict[str, Any], Task, Any]:
    """(resolved config dict, task, model) for a composed config."""
    resolved = as_dict(cfg)
    check_paper_data(resolved)  # a paper's configuration on another dataset is refused (zoo/paper.py)
    seed_everything(int(resolved.get("seed", 0)))
    task = make_task(resolved)
    preset, overrides = model_overrides(resolved)
    model = build_model_for_task(preset, task, **overrides)
    return resolved, task, model


# -- loggers --------------------------------------------------------------------------------------

class WandbLogger:
    """wandb, ``mode=offline`` by default (no network, no account): the run is named from the
    command-line overrides, carries the full config, and a sweep's runs share a group."""

    def __init__(self, options: LoggerOptions, *, run_dir: Path, name: str, group: str, config: dict[str, Any]):
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=options.project, entity=options.entity or None, mode=options.mode, dir=str(run_dir), name=name,
            group=options.group or group or None, tags=list(options.tags) or None, config=config, reinit="finish_previous",
            settings=wandb.Settings(silent=True, console="off"),
        )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.run.log(metrics, step=step)

    def finish(self, summary: dict[str, Any]) -> None:
        for key, value in summary.items():
            if isinstance(value, (int, float, str, bool)) or value is None:
                self.run.summary[key] = value
        self.run.finish()


def hydra_context() -> tuple[Path, str, str]:
    """(run directory, run name from the overrides, sweep group) from Hydra, when running under it."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except (ImportError, ValueError):
        return Path("outputs/run"), "run", ""
    run_dir = Path(hc.runtime.output_dir)
    name = hc.job.override_dirname or "default"
    group = Path(hc.sweep.dir).name if hc.mode == RunMode.MULTIRUN else ""
    if hc.mode == RunMode.MULTIRUN:
        name = f"{hc.job.num}:{name}"
    return run_dir, name, group


def make_loggers(resolved: dict[str, Any], run_dir: Path, name: str, group: str) -> list[Any]:
    from zoo.distributed import from_env

    options = LoggerOptions(**resolved["logger"])
    if not from_env().is_main or options.name == "none":
        return []
    loggers: list[Any] = [MetricsFile(run_dir)]
    if options.name == "wandb":
        loggers.append(WandbLogger(options, run_dir=run_dir, name=name, group=group, config=resolved))
    return loggers


def run(cfg: DictConfig | dict, *, run_dir: str | Path | None = None, callbacks: tuple = ()) -> float:
    """Train and evaluate one configuration; returns the final validation metric."""
    resolved, task, model = build(cfg)
    hydra_dir, name, group = hydra_context()
    run_dir = Path(run_dir) if run_dir is not None else hydra_dir
    name = resolved.get("name") or name
    trainer_opts = trainer_options(resolved)
    if trainer_opts.resume and trainer_opts.resume != "auto":
        trainer_opts = dataclasses.replace(trainer_opts, resume=str(Path(trainer_opts.resume).expanduser()))
    loggers = make_loggers(resolved, run_dir, name, group)
    trainer = Trainer(model, task, trainer=trainer_opts, optim=optim_options(resolved), run_dir=run_dir, seed=int(resolved.get("seed", 0)), loggers=loggers, callbacks=callbacks, config=resolved)
    if trainer.dist.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps({"run": name, "config": resolved, "model_config": model.config.to_dict(), "params": sum(p.numel() for p in model.parameters())}, indent=2, default=str))
    summary = trainer.fit()
    return float(summary["final_metric"])


def load_run(checkpoint: str | Path, *, data: dict[str, Any] | None = None, batch_size: int | None = None) -> tuple[dict[str, Any], Task, Any, dict[str, Any]]:
    """(app config, task, model with the checkpoint's weights, checkpoint) for evaluate/sample.

    ``data`` overrides data options (e.g. ``{"path": ...}`` when the file moved)."""
    from zoo.models import create_model
    from zoo.trainer import load_checkpoint

    ckpt = load_checkpoint(checkpoint)
    cfg = ckpt.get("config") or {}
    task_info = ckpt["task"]
    options = {**task_info["options"], **(data or {})}
    task = create_task(task_info["name"], batch_size=batch_size or task_info["batch_size"], seq_len=task_info["seq_len"], seed=task_info["seed"], **options)
    model = create_model(**ckpt["model_config"])
    model.load_state_dict(ckpt["model"])
    return cfg, task, model, ckpt
