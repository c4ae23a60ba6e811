"""Saving and resuming a training run: the :class:`~zoo.train.trainer.Trainer`'s checkpoint side,
on :mod:`zoo.train.checkpoints.resume`'s policy and :mod:`zoo.train.checkpoints.format`'s format.

:class:`CheckpointedRun` is a mixin: it uses the trainer's model, optimiser, schedule, task, options
(``opts``, ``optim_opts``), process group (``dist``), run directory and claim on it, and keeps the
run's progress (``step``, ``best``, ``best_step``, ``evals_since_best``) and carried ``state``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.train.checkpoints.format import save_checkpoint, verify_checksum
from zoo.train.checkpoints.resume import Progress, checked, restore, run_payload
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
        """Let go of the run directory (the end of the run; also done if the process dies)."""
        if self.claim is not None:
            self.claim.release()

    def payload(self) -> dict[str, Any]:
        """Everything resume needs, as tensors and plain types (:func:`zoo.train.checkpoints.resume.run_payload`)."""
        progress = Progress(self.step, self.best, self.best_step, self.evals_since_best, self.evaluation)
        return run_payload(
            model=self.model,
            task=self.task,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            optim=self.optim_opts,
            state=self.state,
            progress=progress,
            world_size=self.dist.data_world,  # data-parallel replicas: the rows each step reads
            config=self.config,
        )

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
        if not (self.opts.checkpoints and self.dist.is_main):
            return None
        if not finite_parameters(self.model):
            raise TrainingDiverged(
                f"the weights hold NaN/inf at step {self.step}; {name} not written. {self.sound_checkpoint_note()}"
            )
        path = save_checkpoint(self.ckpt_dir / name, payload or self.payload(), run_dir=self.run_dir)
        self.last_checkpoint, self.last_checkpoint_sound = path, True
        return path

    def resume(self, path: str | Path) -> None:
        """Continue the run saved at ``path`` (refused unless it continues this one: :mod:`.resume`)."""
        ckpt = checked(path, model=self.model, task=self.task, world_size=self.dist.data_world, optim=self.optim_opts)
        progress, self.state = restore(
            ckpt,
            path,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            optim=self.optim_opts,
            device=self.device,
        )
        self.step, self.best = progress.step, progress.best
        self.best_step, self.evals_since_best = progress.best_step, progress.evals_since_best
        self.evaluation = progress.evaluation
        self.resumed_at = self.step
        self.last_checkpoint = Path(path)
        self.last_checkpoint_sound = verify_checksum(path) is None  # a copy without its sidecar is never "sound"
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
