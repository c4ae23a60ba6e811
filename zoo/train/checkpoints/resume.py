"""The resume policy, beside the checkpoint format (:mod:`zoo.train.checkpoints.format`): which checkpoint a
run continues, whether it may, and what of today's options applies.

- :func:`open_run` claims the run directory, once per run (locked while the run lasts; one holding
  another run is refused unless resuming), finishes the saves a kill cut between their two renames,
  sweeps the temp files of killed saves and names the checkpoint to continue:
  ``trainer.resume=auto`` is ``checkpoints/last.pt`` when there is one, a path is that file;
- :func:`run_payload` is what a checkpoint holds of a run (everything resume needs, as data);
- :func:`checked` reads a checkpoint and refuses one that does not continue this run: another
  model, other data (the data position would be meaningless), another number of processes (the
  rows would not line up), or optimiser state made with settings it would not fit (``optim.name``,
  ``optim.betas``);
- :func:`restore` loads it into the model, optimiser and schedule, then applies today's learning
  rate, schedule, warm-up, weight decay and eps (saying what changed), and gives back the run's
  progress (:class:`Progress`: step, best metric, early-stopping count) and the carried state; the
  RNG states are restored last, so 2 + 2 steps equal 4 straight, bit for bit.
"""

from __future__ import annotations

import json
import logging
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from zoo.config import model_defaults
from zoo.data.base import Task
from zoo.train.checkpoints.format import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    complete_saves,
    load_checkpoint,
    rng_state,
    set_rng_state,
    state_from_data,
    state_to_data,
    sweep_temp_files,
)
from zoo.train.checkpoints.sharded import SHARDED_SUFFIX, complete_sharded_saves
from zoo.train.options import OPTIM_APPLIED_KEYS, OPTIM_STATE_KEYS, OptimOptions
from zoo.train.rundir import RunClaim, claim

log = logging.getLogger(__name__)


def open_run(run_dir: Path, resume: str, *, is_main: bool) -> tuple[RunClaim | None, Path | None]:
    """Claim ``run_dir`` for this run (on the main process: the claim is held until released) and
    name the checkpoint it continues (None: a fresh start). ``resume``: ``""``, ``"auto"`` or a
    path (``~`` expanded)."""
    checkpoints = run_dir / "checkpoints"
    held = None
    if is_main:
        held = claim(run_dir, resuming=bool(resume))
        complete_saves(checkpoints)
        for directory in (run_dir, checkpoints):
            sweep_temp_files(directory)
        complete_sharded_saves(checkpoints)
    if resume == "auto":
        found = [p for p in (checkpoints / "last.pt", checkpoints / f"last{SHARDED_SUFFIX}") if p.exists()]
        return held, found[0] if found else None
    return held, Path(resume).expanduser() if resume else None


@dataclass
class Progress:
    """Where a run stands, saved in every checkpoint: optimiser steps taken, the best validation
    metric so far and the step it came at, the evaluations since then (early stopping), and the
    latest evaluation, ``{"step", "metric", "value"}`` (a shared model's card reports it)."""

    step: int = 0
    best: float | None = None
    best_step: int = 0
    evals_since_best: int = 0
    evaluation: dict[str, Any] | None = None


def task_info(task: Task) -> dict[str, Any]:
    """What identifies a task's data stream: a resumed run must read the same one."""
    return {
        "name": task.registry_name,
        "options": asdict(task.options),
        "batch_size": task.batch_size,
        "seq_len": task.seq_len,
        "seed": task.seed,
    }


def run_payload(*, optimizer: torch.optim.Optimizer, **fields: Any) -> dict[str, Any]:
    """A checkpoint of a run: tensors and plain types only (see :mod:`zoo.train.checkpoints.format`);
    ``fields``: :func:`run_record`'s."""
    return {**run_record(**fields), "model": fields["model"].state_dict(), "optimizer": optimizer.state_dict()}


def run_record(
    *,
    model: nn.Module,
    task: Task,
    scheduler: Any,
    optim: OptimOptions,
    state: Any,
    progress: Progress,
    world_size: int,
    config: dict[str, Any],
) -> dict[str, Any]:
    """A checkpoint less the model's and optimiser's state (which a sharded checkpoint holds in its shards)."""
    return {
        "format": CHECKPOINT_FORMAT,
        "step": progress.step,
        "model_config": model.config.to_dict(),
        "task": task_info(task),
        "scheduler": scheduler.state_dict(),
        "optim": asdict(optim),
        "rng": rng_state(),
        "state": state_to_data(state),
        "best": progress.best,
        "best_step": progress.best_step,
        "evals_since_best": progress.evals_since_best,
        "evaluation": progress.evaluation,
        "world_size": world_size,
        "config": json.loads(json.dumps(config, default=str)),
    }


def config_diff(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """Readable differences between two nested config dicts."""
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, "<absent>"), b.get(key, "<absent>")
        if isinstance(va, dict) and isinstance(vb, dict):
            out += config_diff(va, vb, f"{prefix}{key}.")
        elif va != vb:
            out.append(f"{prefix}{key}: checkpoint {va!r} vs now {vb!r}")
    return out


def with_new_defaults(saved: dict[str, Any], task: Task) -> dict[str, Any]:
    """The saved task info with each data option added since it was written set to that option's default,
    which is what the run used then (e.g. listops ``path``, added with reading the released files)."""
    if not saved or not isinstance(saved.get("options"), dict):
        return saved
    defaults = {
        f.name: f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        for f in fields(task.options)
        if f.default is not MISSING or f.default_factory is not MISSING
    }
    added = {k: v for k, v in defaults.items() if k not in saved["options"]}
    return {**saved, "options": {**added, **saved["options"]}}


def with_new_model_defaults(saved: dict[str, Any]) -> dict[str, Any]:
    """The saved model config with each field added to :class:`~zoo.config.ModelConfig` since it was written
    set to that field's default, which is what the model was then (a new field's default keeps the old
    behaviour: e.g. ``pool_length``, added with the PyTorch LRA code's padded length)."""
    return {**model_defaults(), **saved}


def checked(path: str | Path, *, model: nn.Module, task: Task, world_size: int, optim: OptimOptions) -> dict:
    """The checkpoint at ``path``, refused (:class:`CheckpointError`) unless it continues this run."""
    ckpt = load_checkpoint(path)
    check_continues(ckpt, path, model=model, task=task, world_size=world_size, optim=optim)
    return ckpt


def check_continues(
    ckpt: dict,
    path: str | Path,
    *,
    model: nn.Module,
    task: Task,
    world_size: int,
    optim: OptimOptions,
    reshard: bool = False,
) -> None:
    """Refuse (:class:`CheckpointError`) a checkpoint that does not continue this run. ``reshard``: a sharded
    checkpoint may resume on another number of data replicas when each step reads the same rows
    (``trainer.batch_size`` x replicas unchanged) and the task numbers its rows over every rank's
    (``Task.rows_by_global_index``: rank r of w reads rows r*b ... r*b + b - 1 of the w*b)."""
    diff = config_diff(with_new_model_defaults(ckpt["model_config"]), model.config.to_dict())
    if diff:
        raise CheckpointError(f"checkpoint {path} was made by a different model: " + "; ".join(diff[:8]))
    saved, now = with_new_defaults(ckpt.get("task", {}), task), task_info(task)
    saved_world = ckpt.get("world_size", 1)
    if reshard and saved_world != world_size:  # the rows are checked below, with the number of ranks
        same_rows = saved.get("batch_size", 0) * saved_world == now["batch_size"] * world_size
        saved_world = world_size if task.rows_by_global_index and same_rows else saved_world
        saved, now = {**saved, "batch_size": None}, {**now, "batch_size": None}
    diff = config_diff(saved, now)
    if diff:
        raise CheckpointError(
            f"checkpoint {path} was trained on different data (the data position would be "
            "meaningless): " + "; ".join(diff[:8])
        )
    if saved_world != world_size:
        rows = "data rows would not line up"
        if reshard and not task.rows_by_global_index:
            rows = f"data {task.registry_name!r} draws each rank's rows by its rank and the number of ranks"
        elif reshard:
            rows = "the rows of a step (trainer.batch_size x data replicas) must stay the same"
        raise CheckpointError(
            f"checkpoint {path} was written with {ckpt.get('world_size')} processes, resuming with {world_size}: {rows}"
        )
    saved, now = ckpt.get("optim") or {}, asdict(optim)
    refused = [
        f"optim.{k}: checkpoint {saved[k]!r} vs now {now[k]!r}"
        for k in OPTIM_STATE_KEYS
        if k in saved and list(np.atleast_1d(saved[k])) != list(np.atleast_1d(now[k]))
    ]
    if refused:
        raise CheckpointError(
            f"checkpoint {path} holds optimiser state made with other settings, which it would "
            f"not fit: {'; '.join(refused)}; resume with the checkpoint's values, or start a "
            "new run from the weights"
        )
    return ckpt


def restore(
    ckpt: dict[str, Any],
    path: str | Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    optim: OptimOptions,
    device: torch.device,
) -> tuple[Progress, Any]:
    """Load a :func:`checked` checkpoint; returns (the run's progress, the carried state)."""
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {path} does not fit this model/optimiser: {exc}") from None
    return restore_progress(ckpt, path, optimizer=optimizer, scheduler=scheduler, optim=optim, device=device)


def restore_progress(
    ckpt: dict[str, Any],
    path: str | Path,
    *,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    optim: OptimOptions,
    device: torch.device,
) -> tuple[Progress, Any]:
    """What :func:`restore` does past the weights and the optimiser's state (a sharded checkpoint loads
    those itself): the schedule, today's options, the carried state, the RNG, the progress."""
    try:
        scheduler.load_state_dict(ckpt["scheduler"])
    except (RuntimeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {path} does not fit this schedule: {exc}") from None
    apply_optim_options(optimizer, scheduler, optim, ckpt.get("optim") or {})
    state = state_from_data(ckpt.get("state"), device)
    set_rng_state(ckpt["rng"])
    # checkpoints written before early stopping hold no counts: count from their step
    progress = Progress(
        step=int(ckpt["step"]),
        best=ckpt.get("best"),
        best_step=int(ckpt.get("best_step", ckpt["step"])),
        evals_since_best=int(ckpt.get("evals_since_best", 0)),
        evaluation=ckpt.get("evaluation"),  # checkpoints written before it was kept: the best value only
    )
    return progress, state


def apply_optim_options(optimizer: torch.optim.Optimizer, scheduler: Any, o: OptimOptions, saved: dict) -> None:
    """``load_state_dict`` brought back the checkpoint's rate, decay and eps: put the current
    options in their place (the schedule is already today's) and say what changed."""
    for group in optimizer.param_groups:
        group.update(initial_lr=o.lr, weight_decay=o.weight_decay)
        group.update({"eps": o.eps} if "eps" in group else {"momentum": o.momentum, "nesterov": o.nesterov})
        if "clip" in group:  # adagrad's per-tensor clipping
            group.update(clip=o.parameter_clip)
    scheduler.base_lrs = [o.lr for _ in optimizer.param_groups]
    for group, base, rate in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * rate(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
    if hasattr(scheduler, "set_momentum"):  # one_cycle: beta1 / momentum follow the step, not the options
        scheduler.set_momentum()
    for key in OPTIM_APPLIED_KEYS:
        if key in saved and saved[key] != getattr(o, key):
            now = getattr(o, key)
            log.warning("resume: optim.%s=%r applied (the checkpoint was trained with %r)", key, now, saved[key])
