"""From a composed config to a finished run: task, model, loggers, trainer.

``run(cfg)`` is what ``experiments/train.py`` calls (through :mod:`zoo.app.jobs` in a multirun);
it returns the validation metric so a Hydra sweeper can optimise it. ``build(cfg)`` gives the
pieces without training (evaluate/sample, tests). The modules a run names in ``imports`` are
imported first (a sweep's job may be a fresh process) and recorded in its config, so ``load_run``
(evaluate/sample) imports them again.

Hydra's record of a run (``.hydra/config.yaml``, ``hydra.yaml``, ``overrides.yaml``) is written
here, once the trainer has claimed the run directory: ``conf/config.yaml`` sets
``hydra.output_subdir`` to null, because Hydra writes it before the run starts, into a directory
that may hold another run (which a refused launch must leave as it was).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from zoo.app.paper import check_paper_data
from zoo.app.resolve import as_dict, model_layers
from zoo.app.schema import LoggerOptions, to_options
from zoo.attention.base import ATTENTION
from zoo.data import TASK, Task, create_task
from zoo.data.base import metric_higher_is_better
from zoo.models.base import HEAD
from zoo.presets.factory import build_model, create_model, model_config_for_task, preset_config, refuse_unpackable
from zoo.registry import import_plugins
from zoo.train.checkpoints.format import import_recorded, load_checkpoint, seed_everything
from zoo.train.distributed import from_env
from zoo.train.loggers import MetricsFile, WandbLogger
from zoo.train.options import OptimOptions, TrainerOptions, run_device
from zoo.train.output_checks import check_output
from zoo.train.rundir import make_dir, run_id, write_text
from zoo.train.trainer import Trainer

HYDRA_RECORD = ".hydra"  # where Hydra's own record of a run goes (its default output_subdir)

# conf/config.yaml ends hydra.run.dir and hydra.sweep.dir with ${zoo_run_id:}: two runs started in the
# same second get two directories (one token per process, shared with its torchrun ranks and jobs)
OmegaConf.register_new_resolver("zoo_run_id", run_id, replace=True)


def optimisation_direction(data_name: str) -> str:
    """``maximize`` or ``minimize``: how a sweeper should treat the run's returned metric (the task's
    own ``metric``: accuracy up, bpc/ppl/loss down). ``${zoo_direction:${data.name}}`` in conf/."""
    return "maximize" if metric_higher_is_better(TASK.get(data_name).metric) else "minimize"


OmegaConf.register_new_resolver("zoo_direction", optimisation_direction, replace=True)


def attention_for(preset: str) -> str:
    """Every registered mechanism preset ``preset``'s head can run, comma-separated for a sweep's
    params: chosen by the head's ``attention_directions`` and the mechanisms' own flags (an LM takes
    those with a causal form), so a mechanism registered later joins. ``${zoo_attention_for:${model.preset}}``."""
    head = HEAD.get(preset_config(preset).kind)
    return ",".join(name for name in ATTENTION.list() if head.takes_attention(ATTENTION.get(name)))


OmegaConf.register_new_resolver("zoo_attention_for", attention_for, replace=True)


def make_task(cfg: dict[str, Any]) -> Task:
    data = dict(cfg["data"])
    name = data.pop("name")
    trainer = cfg["trainer"]
    return create_task(
        name,
        batch_size=trainer["batch_size"],
        seq_len=trainer["seq_len"],
        seed=cfg.get("seed", 0),
        **to_options(TASK.get(name).Options, data),
    )


def trainer_options(cfg: dict[str, Any]) -> TrainerOptions:
    return TrainerOptions(**cfg["trainer"])


def optim_options(cfg: dict[str, Any]) -> OptimOptions:
    return OptimOptions(**cfg["optim"])


def build(cfg: DictConfig | dict) -> tuple[dict[str, Any], Task, Any]:
    """(resolved config dict, task, model) for a composed config."""
    resolved = as_dict(cfg)
    import_plugins(resolved.get("imports") or [])  # a job in a fresh process (a launcher's) needs them too
    check_paper_data(resolved)  # a paper's configuration on another dataset is refused (zoo/app/paper.py)
    seed_everything(int(resolved.get("seed", 0)))
    task = make_task(resolved)
    preset, layers = model_layers(resolved)
    model = refuse_unpackable(build_model(model_config_for_task(preset, task, *layers)), task)
    return resolved, task, model


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
    options = LoggerOptions(**resolved["logger"])
    if not from_env().is_main or options.name == "none":
        return []
    loggers: list[Any] = [MetricsFile(run_dir)]
    if options.name == "wandb":
        tags = [*options.tags, *(resolved.get("tags") or [])]  # the run's tags beside logger.tags
        loggers.append(WandbLogger(options, run_dir=run_dir, name=name, group=group, config=resolved, tags=tags))
    return loggers


def save_hydra_record(run_dir: Path, cfg: DictConfig | dict) -> None:
    """Hydra's record of the run (``.hydra/``: the composed config, Hydra's config, the command
    line's overrides), as Hydra would write it; nothing for a run Hydra did not start in ``run_dir``."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hydra_cfg = HydraConfig.instance().cfg
    except ImportError:
        return
    output_dir = OmegaConf.select(hydra_cfg, "hydra.runtime.output_dir") if hydra_cfg is not None else None
    if not output_dir or Path(output_dir).resolve() != Path(run_dir).resolve() or not isinstance(cfg, DictConfig):
        return
    folder = make_dir(run_dir, run_dir / HYDRA_RECORD)
    write_text(run_dir, folder / "config.yaml", OmegaConf.to_yaml(cfg))
    write_text(run_dir, folder / "hydra.yaml", OmegaConf.to_yaml(hydra_cfg))
    write_text(run_dir, folder / "overrides.yaml", OmegaConf.to_yaml(hydra_cfg.hydra.overrides.task))


def check_run(cfg: dict[str, Any]) -> None:
    """Refuse, naming the key and the fix, a run that cannot run here: a bad ``trainer.*`` or ``optim.*``
    value, a device this machine lacks, a ``trainer.precision`` its device cannot run. Asked before
    any data or model is built (``build`` alone, which trains nothing, does not ask)."""
    run_device(trainer_options(cfg), from_env().local_rank)
    optim_options(cfg)


def run(
    cfg: DictConfig | dict,
    *,
    run_dir: str | Path | None = None,
    callbacks: tuple = (),
    on_claimed: Callable[[Path], None] | None = None,
) -> float:
    """Train and evaluate one configuration; returns the final validation metric. ``on_claimed(run_dir)``
    is called once the run owns its directory, before it trains (a sweep's job marks it as its own)."""
    check_run(as_dict(cfg))
    hydra_dir, name, group = hydra_context()
    run_dir = Path(run_dir) if run_dir is not None else hydra_dir
    check_output(run_dir)  # before any work: a read-only file system, a parent that is a file
    resolved, task, model = build(cfg)
    if trainer_options(resolved).checkpoints:  # a file-size limit below the checkpoint, before training
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in model.state_dict().values()}
        weights = sum(storages.values())  # a tied tensor is saved once
        check_output(run_dir, checkpoint=run_dir / "checkpoints" / "last.pt", checkpoint_bytes=weights)
    name = resolved.get("name") or name
    loggers = make_loggers(resolved, run_dir, name, group)  # they write nothing before the trainer claims run_dir
    trainer = Trainer(
        model,
        task,
        trainer=trainer_options(resolved),
        optim=optim_options(resolved),
        run_dir=run_dir,
        seed=int(resolved.get("seed", 0)),
        loggers=loggers,
        callbacks=callbacks,
        config=resolved,
    )
    if trainer.dist.is_main:
        save_hydra_record(run_dir, cfg)
        if on_claimed is not None:
            on_claimed(run_dir)
        info = {
            "run": name,
            "config": resolved,
            "model_config": model.config.to_dict(),
            "params": sum(p.numel() for p in model.parameters()),
        }
        write_text(run_dir, run_dir / "config.json", json.dumps(info, indent=2, default=str))
    summary = trainer.fit()
    return float(summary["final_metric"])


def load_run(
    checkpoint: str | Path, *, data: dict[str, Any] | None = None, batch_size: int | None = None
) -> tuple[dict[str, Any], Task, Any, dict[str, Any]]:
    """(app config, task, model with the checkpoint's weights, checkpoint) for evaluate/sample.

    ``data`` overrides data options (e.g. ``{"path": ...}`` when the file moved)."""

    ckpt = load_checkpoint(checkpoint)
    cfg = ckpt.get("config") or {}
    import_recorded(cfg, checkpoint)
    task_info = ckpt["task"]
    options = {**task_info["options"], **(data or {})}
    task = create_task(
        task_info["name"],
        batch_size=batch_size or task_info["batch_size"],
        seq_len=task_info["seq_len"],
        seed=task_info["seed"],
        **options,
    )
    model = create_model(**ckpt["model_config"])
    model.load_state_dict(ckpt["model"])
    return cfg, task, model, ckpt
