"""Saving and resuming a training run: the :class:`~zoo.train.trainer.Trainer`'s checkpoint side,
on :mod:`zoo.train.checkpoints.resume`'s policy and :mod:`zoo.train.checkpoints.format`'s format.

:class:`CheckpointedRun` is a mixin: it uses the trainer's model, optimiser, schedule, task, options
(``opts``, ``optim_opts``), process group (``dist``), run directory and claim on it, and keeps the
run's progress (``step``, ``best``, ``best_step``, ``evals_since_best``) and carried ``state``.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.train import distributed
from zoo.train.checkpoints.format import CheckpointError, save_checkpoint, verify_checksum
from zoo.train.checkpoints.resume import (
    Progress,
    check_continues,
    checked,
    restore,
    restore_progress,
    run_payload,
    run_record,
)
from zoo.train.checkpoints.sharded import (
    SHARDED_SUFFIX,
    checked_directory,
    is_sharded,
    load_sharded,
    read_run_file,
    save_sharded,
)
from zoo.train.fsdp import all_finite
from zoo.train.steps import TrainingDiverged

log = logging.getLogger(__name__)


def finite_parameters(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


class CheckpointedRun:
    """Checkpoints of a run: what they hold, writing them (never with non-finite weights), resuming
    from one, and letting go of the run directory at the end."""

    claim: Any
    resume_from: Path | None
    last_checkpoint: Path | None
    resumed_at: int | None
    evaluation: dict[str, Any] | None
    loggers: list[Any]

    def release(self) -> None:
        """Let go of the run directory (the end of the run; also done if the process dies) and of a
        process group of one made for FSDP."""
        if self.claim is not None:
            self.claim.release()
        distributed.teardown(self.dist)

    def payload(self) -> dict[str, Any]:
        """Everything resume needs, as tensors and plain types (:func:`zoo.train.checkpoints.resume.run_payload`);
        under FSDP all but the weights and optimiser state, which every rank writes as shards."""
        progress = Progress(self.step, self.best, self.best_step, self.evals_since_best, self.evaluation)
        write = run_record if self.opts.fsdp else functools.partial(run_payload, optimizer=self.optimizer)
        return write(
            model=self.model,
            task=self.task,
            scheduler=self.scheduler,
            optim=self.optim_opts,
            state=self.state,
            progress=progress,
            world_size=self.dist.data_world,  # data-parallel replicas: the rows each step reads
            config=self.config,
        )

    def checkpoint_path(self, name: str) -> Path:
        """``checkpoints/<name>``: a ``.pt`` file, or under FSDP a sharded ``.dcp`` directory of that stem."""
        path = self.ckpt_dir / name
        return path.with_suffix(SHARDED_SUFFIX) if self.opts.fsdp else path

    def sound_checkpoint_note(self) -> str:
        if self.last_checkpoint is not None and self.last_checkpoint_sound:
            return f"newest sound checkpoint: {self.last_checkpoint}"
        if self.last_checkpoint is not None:  # resumed from a copy without its checksum file
            return (
                f"newest checkpoint: {self.last_checkpoint} (resumed from without its checksum file: its SHA-256 "
                "was never checked)"
            )
        return "no sound checkpoint was written yet"

    def save(self, name: str = "last.pt", payload: dict[str, Any] | None = None) -> Path | None:
        """Write ``checkpoints/<name>``; weights that are not finite are never written (raises)."""
        if self.opts.fsdp and self.opts.checkpoints:
            return self.save_sharded(name, payload)
        if not (self.opts.checkpoints and self.dist.is_main):
            return None
        if not finite_parameters(self.model):
            raise TrainingDiverged(
                f"the weights hold NaN/inf at step {self.step}; {name} not written. {self.sound_checkpoint_note()}"
            )
        path = save_checkpoint(self.ckpt_dir / name, payload or self.payload(), run_dir=self.run_dir)
        self.last_checkpoint, self.last_checkpoint_sound = path, True
        return path

    def save_sharded(self, name: str, record: dict[str, Any] | None) -> Path | None:
        """Every rank writes its shards of ``checkpoints/<stem>.dcp`` (:mod:`.sharded`); never non-finite weights."""
        path = self.checkpoint_path(name)
        if not all_finite(self.model):  # every rank gets the same answer, so all refuse together
            raise TrainingDiverged(
                f"the weights hold NaN/inf at step {self.step}; {path.name} not written. {self.sound_checkpoint_note()}"
            )
        record = (record or self.payload()) if self.dist.is_main else None
        save_sharded(path, model=self.model, optimizer=self.optimizer, record=record, run_dir=self.run_dir)
        self.last_checkpoint, self.last_checkpoint_sound = path, True
        return path if self.dist.is_main else None

    def resume(self, path: str | Path) -> None:
        """Continue the run saved at ``path`` (refused unless it continues this one: :mod:`.resume`)."""
        if is_sharded(path) != self.opts.fsdp:
            kind, now = ("sharded", "without") if is_sharded(path) else ("single-file", "with")
            fix = (
                "set trainer.fsdp=true, or convert it: python experiments/export.py CKPT --single-file OUT.pt"
                if is_sharded(path)
                else "resume it with trainer.fsdp=false"
            )
            raise CheckpointError(f"checkpoint {path} is {kind}, this run is {now} FSDP (trainer.fsdp): {fix}")
        common = dict(model=self.model, task=self.task, world_size=self.dist.data_world, optim=self.optim_opts)
        if self.opts.fsdp:
            path = Path(path)
            checked_directory(path)
            ckpt = read_run_file(path)
            check_continues(ckpt, path, **common, reshard=True)  # DCP reshards onto any number of ranks
            load_sharded(path, model=self.model, optimizer=self.optimizer, verify=False)
            restore_weights = restore_progress
        else:
            ckpt = checked(path, **common)
            restore_weights = functools.partial(restore, model=self.model)
        progress, self.state = restore_weights(
            ckpt, path, optimizer=self.optimizer, scheduler=self.scheduler, optim=self.optim_opts, device=self.device
        )
        self.step, self.best = progress.step, progress.best
        self.best_step, self.evals_since_best = progress.best_step, progress.evals_since_best
        self.evaluation = progress.evaluation
        self.resumed_at = self.step
        self.last_checkpoint = Path(path)
        # a copy without its sidecar is never "sound"; a sharded one was checked against its SHA256SUMS
        self.last_checkpoint_sound = self.opts.fsdp or verify_checksum(path) is None
        self.cut_logs(self.step)

    def cut_logs(self, step: int) -> None:
        """Drop what the loggers hold past ``step`` (logged again from there)."""
        for logger in self.loggers:
            if hasattr(logger, "cut"):
                logger.cut(step)

    def _start(self) -> None:
        """Resume (saying so when the checkpoint has nothing left to train), or start afresh: a
        directory reclaimed by a run that died before its first checkpoint keeps no metrics of it."""
        if self.resume_from is None:
            self.cut_logs(0)
            return
        self.resume(self.resume_from)
        if self.step >= self.opts.max_steps:
            where = "past" if self.step > self.opts.max_steps else "already at"
            note = (
                f"checkpoint {self.resume_from} is at step {self.step}, {where} trainer.max_steps="
                f"{self.opts.max_steps}: nothing left to train; evaluating it as it is (raise "
                "trainer.max_steps to train on)"
            )
            log.warning(note)
            if self.dist.is_main:
                print(note, flush=True)
