"""The training loop of the Hydra application (usable on its own from Python): a built model, a task.

Around :mod:`zoo.train.steps`'s step (``forward_backward`` per micro-batch, then ``optimizer_step``:
aux losses, clipping, schedules, post-step hooks) it adds: the device, optimiser, bf16 autocast (CUDA
and CPU: :mod:`zoo.precision`) and gradient accumulation (:mod:`zoo.train.options`); state carried
from step to step on contiguous tasks for every model that keeps segment memory, started with
``init_state`` where the streams start over; evaluation every N steps with the task metric
(:mod:`zoo.train.scoring`), logged (:mod:`zoo.train.loggers`); tokens/s, peak and activation memory
(:mod:`zoo.train.activation_meter`); checkpoints as data (:mod:`zoo.train.checkpoints.format`), never with non-finite
weights nor after a non-finite evaluation, and resuming (:mod:`zoo.train.checkpoints.resume`: the run directory
claimed and locked for the run, which checkpoint, whether it fits, what changed) so 2 + 2 steps equal
4 straight, bit for bit; early stopping on the validation metric; a NaN/inf loss stops the run naming
the step and the newest sound checkpoint; Ctrl-C and SIGTERM save first (:mod:`zoo.train.stop`); the
debugging aids of ``conf/debug/`` (:mod:`zoo.train.debug`); ``torchrun`` data parallelism: DDP, each
rank reads its own rows, only rank 0 logs and saves; context parallelism (``trainer.context_parallel=N``,
:mod:`zoo.parallel.context`): N ranks share each sequence, the rest are data-parallel replicas.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from zoo.config import part_label
from zoo.data.base import SPLITS, Task
from zoo.parallel.context import ContextParallel, context_mesh
from zoo.precision import autocast
from zoo.train import distributed
from zoo.train.activation_meter import ActivationMeter, peak_memory_mib, synchronize
from zoo.train.checkpoints.resume import open_run
from zoo.train.checkpoints.saving import CheckpointedRun
from zoo.train.debug import StepProfiler, anomaly_detection
from zoo.train.options import OptimOptions, TrainerOptions, make_optimizer, make_schedule, run_device
from zoo.train.rundir import write_text
from zoo.train.scoring import evaluate_model, scalar_stats
from zoo.train.steps import TrainingDiverged, forward_backward, initial_state, optimizer_step, set_training_progress
from zoo.train.stop import ImmediateInterrupt, StopSignals

log = logging.getLogger(__name__)


def check_splits(task: Task, world_size: int = 1) -> None:
    """Every split of ``task`` holds at least one batch at this batch size and ``seq_len``: found
    when the run starts, not at the final evaluation after hours of training."""
    for split in SPLITS:
        try:
            task.num_batches(split, world_size)
        except ValueError as exc:
            raise ValueError(f"data {task.registry_name!r}, {split} split: {exc}") from None


# -- the trainer ---------------------------------------------------------------------------------


class Trainer(CheckpointedRun):
    """Train ``model`` on ``task``, writing into ``run_dir`` (which must not hold another run
    unless ``trainer.resume`` continues it).

    ``loggers``: objects with ``log(metrics, step)`` and ``finish(summary)`` (rank 0 only).
    ``callbacks``: ``fn(trainer, step)`` called after each optimiser step (tests, custom stops).
    ``config``: the full application config, stored in checkpoints for evaluate/sample."""

    def __init__(
        self,
        model: nn.Module,
        task: Task,
        *,
        trainer: TrainerOptions,
        optim: OptimOptions,
        run_dir: str | Path,
        seed: int = 0,
        loggers: Iterable[Any] = (),
        callbacks: Iterable[Callable[[Trainer, int], None]] = (),
        config: dict[str, Any] | None = None,
    ):
        self.opts, self.optim_opts, self.task = trainer, optim, task
        self.run_dir = Path(run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.seed, self.config = seed, config or {}
        self.callbacks = list(callbacks)
        if trainer.threads:
            torch.set_num_threads(trainer.threads)
        self.dist = distributed.from_env(trainer.context_parallel)
        self.device = run_device(trainer, self.dist.local_rank)
        check_splits(task, self.dist.data_world)
        self.claim, self.resume_from = open_run(self.run_dir, trainer.resume, is_main=self.dist.is_main)
        try:
            self._set_up(model, trainer, optim, loggers)
        except BaseException:
            self.release()
            raise

    def _set_up(self, model: nn.Module, trainer: TrainerOptions, optim: OptimOptions, loggers: Iterable[Any]) -> None:
        """What follows the claim of the run directory (released if any of it fails)."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.dist = distributed.setup(self.device, trainer.context_parallel)
        self.loggers = list(loggers) if self.dist.is_main else []
        self.model = trainer.checkpoint_plan().apply(model.to(self.device))  # blocks recomputed (before DDP / FSDP)
        self.net: nn.Module = self.model
        self.context: ContextParallel | None = None
        if trainer.context_parallel > 1:  # N ranks share each sequence; gradients synced by sync_gradients
            mesh = context_mesh(trainer.context_parallel, self.device.type)
            self.context = ContextParallel(self.model, mesh, layout=trainer.context_layout)
            self.context.layout(trainer.seq_len)  # refuses a length the ranks cannot split, before any step
            self.net = self.context
        elif self.dist.enabled:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.net = nn.parallel.DistributedDataParallel(self.model, device_ids=device_ids)
        if trainer.compile:  # the training forward only; self.model (evaluation, checkpoints) stays eager
            self.net = torch.compile(self.net)
        self.optimizer = make_optimizer(self.model, optim)
        self.scheduler = make_schedule(self.optimizer, optim, d_model=model.config.d_model, total=trainer.max_steps)
        self.step = 0
        self.state: Any = None
        self.best: float | None = None
        self.best_step, self.evals_since_best = 0, 0  # early stopping
        self.resumed_at: int | None = None
        self.evaluation: dict[str, Any] | None = None  # the latest: {"step", "metric", "value"} (checkpoints keep it)
        self.last_checkpoint: Path | None = None  # the newest checkpoint written or resumed from
        self.last_checkpoint_sound = False  # its SHA-256 checked (written here, or resumed with its sidecar)
        self.tokens_per_s: list[float] = []  # per optimiser step: data, forward, backward, optimiser
        self.fwd_bwd_tokens_per_s: list[float] = []  # forward + backward only: zoo.bench's tokens_per_s
        self.act_mib: float | None = None

    @property
    def eval_split(self) -> str:
        """Overfitting batches, the run is scored on those training batches; else on trainer.eval_split."""
        return "train" if self.opts.overfit_batches else self.opts.eval_split

    # -- one optimiser step --------------------------------------------------------------------
    def autocast(self):
        return autocast(self.device, self.opts.precision)

    def forward_context(self, meter: ActivationMeter | None = None) -> contextlib.ExitStack:
        """What the forward pass runs under: autocast, and the activation meter on the first step."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.autocast())
        if meter is not None:
            stack.enter_context(meter)
        return stack

    def train_step(self) -> dict[str, float]:
        """Accumulate ``accumulate`` micro-batches (:func:`zoo.train.steps.forward_backward`), then
        clip and step (:func:`zoo.train.steps.optimizer_step`); returns this step's metrics."""
        self.net.train()
        accumulate, t0 = self.opts.accumulate, time.perf_counter()
        carry = self.task.contiguous and self.opts.carry_state
        loss_sum, aux_sum, tokens, stats, fwd_bwd_s = 0.0, {}, 0, {}, 0.0
        self.optimizer.zero_grad(set_to_none=True)
        set_training_progress(self.model, self.step / max(1, self.opts.max_steps))  # scheduled losses
        for micro in range(accumulate):
            index = self.step * accumulate + micro
            if self.opts.overfit_batches:  # the same few batches over and over (debug=overfit)
                index %= self.opts.overfit_batches
            rows = self.task.batch("train", index, rank=self.dist.data_rank, world_size=self.dist.data_world)
            batch = {k: v.to(self.device) for k, v in rows.items()}
            if not carry:
                self.state = None
            elif self.task.starts_stream(index):
                self.state = initial_state(self.model, next(iter(batch.values())).shape[0])
            last = micro == accumulate - 1 or not self.dist.enabled or self.context is not None
            sync = contextlib.nullcontext() if last else self.net.no_sync()
            meter = ActivationMeter(self.model) if self.act_mib is None else None
            context = functools.partial(self.forward_context, meter)
            try:
                with sync:
                    synchronize(self.device)
                    fwd_bwd_start = time.perf_counter()
                    out, _ = forward_backward(self.net, batch, state=self.state, scale=1 / accumulate, context=context)
                    synchronize(self.device)
                    fwd_bwd_s += time.perf_counter() - fwd_bwd_start
            except TrainingDiverged as exc:
                raise TrainingDiverged(
                    f"{exc} at step {self.step + 1} (micro-batch {micro}); stopping. {self.sound_checkpoint_note()}"
                ) from None
            if meter is not None:
                self.act_mib = meter.megabytes
            self.state = out.state if carry else None
            loss_sum += float(out.loss.detach()) / accumulate
            for name, value in out.aux_losses.items():
                aux_sum[name] = aux_sum.get(name, 0.0) + float(value.detach()) / accumulate
            stats = out.stats
            tokens += int((batch["tokens"] if "tokens" in batch else batch["tgt"]).numel())
        if self.context is not None:
            self.context.sync_gradients()
        grad_norm = optimizer_step(self.model, self.optimizer, scheduler=self.scheduler, clip=self.opts.clip)
        self.step += 1
        synchronize(self.device)
        elapsed = time.perf_counter() - t0
        tok_s = tokens * self.dist.data_world / max(elapsed, 1e-9)  # the ranks of a context group share rows
        metrics = {
            "train/loss": loss_sum,
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/grad_norm": float(grad_norm),
            "train/tokens_per_s": tok_s,
            "train/fwd_bwd_tokens_per_s": tokens * self.dist.data_world / max(fwd_bwd_s, 1e-9),
        }
        metrics.update({f"train/aux/{k}": v for k, v in aux_sum.items()})
        metrics.update(scalar_stats(stats, "train/stats/"))
        return metrics

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate(self, split: str | None = None, max_batches: int | None = None) -> dict[str, float]:
        split = split or self.eval_split
        if max_batches is None:
            max_batches = self.opts.overfit_batches or self.opts.eval_batches
        return evaluate_model(
            self.context if self.context is not None else self.model,
            self.task,
            split,
            max_batches,
            device=self.device,
            autocast=self.autocast,
            rank=self.dist.data_rank,
            world_size=self.dist.data_world,
        )

    def is_better(self, value: float) -> bool:
        if self.best is None or math.isnan(self.best):
            return not math.isnan(value)
        return value > self.best if self.task.higher_is_better else value < self.best

    def peak_memory_mb(self) -> dict[str, float]:
        return {f"mem/{k}": v for k, v in peak_memory_mib(self.device, self.act_mib).items()}

    def log(self, metrics: dict[str, float]) -> None:
        for logger in self.loggers:
            logger.log(metrics, self.step)

    # -- the loop ------------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train to ``max_steps`` (or the time budget, or early stopping); returns the run summary
        (also written to ``result.json``). The run directory is let go of at the end, however it ends."""
        try:
            return self._fit()
        finally:
            self.release()

    def _fit(self) -> dict[str, Any]:
        opts = self.opts
        self._start()
        o = self.optim_opts
        log.info("optimiser: %s, lr %s, schedule %s", o.describe(), o.lr, o.schedule)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        metric_key = f"{self.eval_split}/{self.task.metric}"
        from tqdm.auto import tqdm

        show = opts.progress and self.dist.is_main
        bar = tqdm(
            total=opts.max_steps,
            initial=self.step,
            disable=None if show else True,
            dynamic_ncols=True,
            mininterval=0.5,
            desc=self.model.config.name,
        )
        start = time.perf_counter()
        with StopSignals() as stop:
            try:
                last_eval, stop_reason = self._steps(bar, stop, metric_key, start)
            except ImmediateInterrupt:
                bar.close()
                print(f"\nstopped mid-step; {self.sound_checkpoint_note()}", flush=True)
                raise
            except KeyboardInterrupt:
                why = "terminated (SIGTERM)" if stop.received == "SIGTERM" else "interrupted"
                path = self._save_on_stop(metric_key)
                bar.close()
                off = "checkpoints are off (trainer.checkpoints=false)"
                resume_with = f"resume with trainer.resume={path}" if path else off
                print(f"\n{why} at step {self.step}; checkpoint saved to {path}; {resume_with}", flush=True)
                raise
            finally:
                bar.close()
        if last_eval is None:  # resumed at or past max_steps, or out of patience: evaluate it as it is
            last_eval = self._evaluate_and_save(metric_key)
        summary = self.summary(metric_key, last_eval, stop_reason, wall=time.perf_counter() - start)
        if self.dist.is_main:
            write_text(self.run_dir, self.run_dir / "result.json", json.dumps(summary, indent=2, default=str))
            for logger in self.loggers:
                logger.finish(summary)
        return summary

    def summary(self, metric_key: str, last_eval: dict[str, float], stop_reason: str, wall: float) -> dict[str, Any]:
        """What ``result.json`` holds: the run's final and best metric, why it stopped, throughput and memory."""
        steady = self.tokens_per_s[1:] or self.tokens_per_s  # the first step is the warm-up
        steady_fwd_bwd = self.fwd_bwd_tokens_per_s[1:] or self.fwd_bwd_tokens_per_s
        early = {"patience": self.opts.early_stop_patience, "best_step": self.best_step}
        early["evaluations_without_improvement"] = self.evals_since_best
        return {
            "status": "finished",
            "model": self.model.config.name,
            "attention": part_label(self.model.config.attention),
            "data": self.task.registry_name,
            "optimizer": self.optim_opts.describe(),
            "precision": self.opts.precision,
            "metric": self.task.metric,
            "metric_name": metric_key,
            "final_metric": last_eval[metric_key],
            "best_metric": self.best,
            "higher_is_better": self.task.higher_is_better,
            "steps": self.step,
            "stop_reason": stop_reason,  # max_steps | max_time_s | early_stop
            "stopped_early": stop_reason != "max_steps",
            "early_stop": early if self.opts.early_stop_patience else None,
            "resumed_at_step": self.resumed_at,
            # tokens_per_s as zoo.bench measures it (forward + backward); train_tokens_per_s: whole steps
            "tokens_per_s": float(np.median(steady_fwd_bwd)) if steady_fwd_bwd else float("nan"),
            "train_tokens_per_s": float(np.median(steady)) if steady else float("nan"),
            "params": sum(p.numel() for p in self.model.parameters()),
            "wall_s": wall,
            "seed": self.seed,
            **{k.split("/", 1)[1]: v for k, v in self.peak_memory_mb().items()},
            **{k: v for k, v in last_eval.items()},
        }

    def _steps(self, bar: Any, stop: StopSignals, metric_key: str, start: float) -> tuple[dict | None, str]:
        """Optimiser steps to ``max_steps``, evaluating and saving on schedule; returns (the last
        evaluation, why it stopped: ``max_steps``, ``max_time_s`` or ``early_stop``)."""
        opts, last_eval = self.opts, None
        profiler = StepProfiler(self.run_dir, opts.profile_steps, self.device, write=self.dist.is_main)
        with profiler, anomaly_detection(opts.detect_anomaly):
            while self.step < opts.max_steps:
                # every rank saw the same (all-reduced) metrics, so every rank stops here alike; checked
                # first, so a run resumed from the evaluation that ran out of patience stops at once
                if opts.early_stop_patience and self.evals_since_best >= opts.early_stop_patience:
                    return last_eval, "early_stop"
                metrics = self.train_step()
                profiler.step()
                self.tokens_per_s.append(metrics["train/tokens_per_s"])
                self.fwd_bwd_tokens_per_s.append(metrics["train/fwd_bwd_tokens_per_s"])
                bar.update(1)
                loss_text = f"{metrics['train/loss']:.3f}"
                bar.set_postfix(loss=loss_text, tok_s=f"{metrics['train/tokens_per_s']:.0f}", refresh=False)
                if self.step % opts.log_every == 0 or self.step == 1:
                    self.log({**metrics, **self.peak_memory_mb()})
                for callback in self.callbacks:
                    callback(self, self.step)
                # every rank stops after the same step
                if distributed.broadcast_flag(stop.received is not None, self.device):
                    raise KeyboardInterrupt
                over_time = bool(opts.max_time_s) and time.perf_counter() - start > opts.max_time_s
                over_time = distributed.broadcast_flag(over_time, self.device)
                if self.evaluation_due() or over_time:
                    last_eval = self._evaluate_and_save(metric_key)
                    bar.set_postfix(loss=loss_text, **{metric_key: f"{last_eval[metric_key]:.4f}"}, refresh=False)
                elif opts.checkpoint_every and self.step % opts.checkpoint_every == 0:
                    self.save()
                if over_time:
                    return last_eval, "max_time_s"
        return last_eval, "max_steps"

    def evaluation_due(self) -> bool:
        return bool(self.opts.eval_every and self.step % self.opts.eval_every == 0) or self.step == self.opts.max_steps

    def _save_on_stop(self, metric_key: str) -> Path | None:
        """The checkpoint of a run stopped between steps: the evaluation due at this step done first
        (it comes after the stop check), so the resumed run neither repeats nor skips it."""
        if self.evaluation_due() and (self.evaluation or {}).get("step") != self.step:
            self._evaluate_and_save(metric_key)
            return self.ckpt_dir / "last.pt" if self.opts.checkpoints and self.dist.is_main else None
        return self.save()

    def _evaluate_and_save(self, metric_key: str) -> dict[str, float]:
        result = self.evaluate()
        value = result[metric_key]
        bad = {k: v for k, v in result.items() if isinstance(v, float) and not math.isfinite(v)}
        if bad:
            found = ", ".join(f"{k}={v}" for k, v in bad.items())
            raise TrainingDiverged(
                f"evaluation at step {self.step} gave {found}; stopping without overwriting any "
                f"checkpoint. {self.sound_checkpoint_note()}"
            )
        improved = self.is_better(value)
        if improved:
            self.best, self.best_step, self.evals_since_best = value, self.step, 0
        elif self.step != self.resumed_at:  # re-evaluating the checkpoint it resumed from is no new evaluation
            self.evals_since_best += 1
        result[f"{metric_key}_best"] = self.best
        self.evaluation = {"step": self.step, "metric": metric_key, "value": value}
        self.log({**result, **self.peak_memory_mb()})
        payload = self.payload() if self.opts.checkpoints and self.dist.is_main else None
        if improved:
            self.save("best.pt", payload)
        self.save("last.pt", payload)
        distributed.barrier()
        return result
