"""The training loop of the Hydra application (usable on its own from Python).

What it does around :mod:`zoo.training`'s pieces (Adam, schedules, aux losses, post-step hooks):

- device auto-detection (CUDA, else CPU), bf16 autocast on CUDA, gradient accumulation, clipping;
- state (segment memory) carried from step to step on contiguous tasks, reset where the data
  streams start over; aux losses added to the loss and logged by name;
- evaluation every N steps with the task metric (bits per character, perplexity, accuracy);
- a tqdm bar with loss and tokens/s; tokens/s, peak memory and every metric to the loggers;
- checkpoints written atomically (temp file + ``os.replace``), ``last.pt`` and ``best.pt``; resume
  restores model, optimiser, scheduler, RNG states, data position (the step: batches are a pure
  function of their index) and the carried memory, so 2 + 2 steps equal 4 straight;
- a NaN/inf loss stops the run naming the step and the last good checkpoint; Ctrl-C saves first;
- ``torchrun`` data parallelism: DDP, each rank reads its own rows, only rank 0 logs and saves.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import json
import math
import os
import random
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo import distributed
from zoo.config import require
from zoo.data.base import IGNORE_INDEX, Task, metric_value
from zoo.models import ModelOutput, map_tensors
from zoo.training import adam, after_optimizer_step, detach_state, schedule, total_loss

CHECKPOINT_FORMAT = "transformer-zoo/checkpoint/v1"


@dataclass
class TrainerOptions:
    """``trainer.*`` keys of the app."""

    max_steps: int = 1000
    batch_size: int = 16  # per process (rank)
    seq_len: int = 256
    accumulate: int = 1  # micro-batches per optimiser step
    clip: float = 1.0  # max gradient norm (0 = off)
    eval_every: int = 200  # steps between evaluations (0 = only at the end)
    eval_batches: int = 20  # batches per evaluation (0 = the whole split)
    eval_split: str = "val"
    log_every: int = 10
    checkpoint_every: int = 0  # steps between last.pt saves besides each evaluation (0 = at evaluations)
    checkpoints: bool = True  # write last.pt / best.pt
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "fp32"  # fp32 | bf16 (autocast; CUDA)
    carry_state: bool = True  # carry segment memory across steps on contiguous data
    max_time_s: float = 0.0  # stop (and evaluate) after this many seconds of training (0 = no limit)
    resume: str = ""  # a checkpoint path, or "auto" = last.pt of this run directory if present
    progress: bool = True  # tqdm bar
    threads: int = 0  # torch.set_num_threads (0 = leave as is)

    def __post_init__(self) -> None:
        for key in ("max_steps", "batch_size", "seq_len", "accumulate", "log_every"):
            require(isinstance(getattr(self, key), int) and getattr(self, key) > 0, f"trainer.{key} must be a positive int, got {getattr(self, key)!r}")
        for key in ("eval_every", "eval_batches", "checkpoint_every", "threads"):
            require(getattr(self, key) >= 0, f"trainer.{key} must be >= 0, got {getattr(self, key)!r}")
        require(self.precision in ("fp32", "bf16"), f"trainer.precision must be fp32 or bf16, got {self.precision!r}")
        require(self.eval_split in ("val", "test"), f"trainer.eval_split must be val or test, got {self.eval_split!r}")
        require(self.clip >= 0 and self.max_time_s >= 0, "trainer.clip and trainer.max_time_s must be >= 0")


@dataclass
class OptimOptions:
    """``optim.*`` keys: the optimiser and the learning-rate schedule."""

    name: str = "adam"  # adam | adamw
    lr: float = 1e-3  # peak rate (a multiplier of the paper's rate for schedule=noam: use 1.0)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-9
    weight_decay: float = 0.0
    schedule: str = "cosine"  # noam | cosine | constant
    warmup: int = 100

    def __post_init__(self) -> None:
        require(self.name in ("adam", "adamw"), f"optim.name must be adam or adamw, got {self.name!r}")
        require(self.schedule in ("noam", "cosine", "constant"), f"optim.schedule must be noam, cosine or constant, got {self.schedule!r}")
        require(self.lr > 0 and self.warmup >= 0 and len(self.betas) == 2, f"need optim.lr > 0, optim.warmup >= 0, two optim.betas; got {self.lr}, {self.warmup}, {list(self.betas)}")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: unreadable, not ours, or from another model/task."""


class ImmediateInterrupt(KeyboardInterrupt):
    """A second Ctrl-C: stop now, possibly mid-step, so no checkpoint is written."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


# -- devices, seeds, checkpoints -----------------------------------------------------------------

def pick_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    if name == "auto":
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"trainer.device={name!r} but CUDA is not available here; use trainer.device=auto or cpu")
    return device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write atomically: a crash mid-write leaves the previous file intact, never half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read one of our checkpoints, refusing anything else with the reason.

    Checkpoints hold the carried memory and RNG states (Python objects), so they are unpickled in
    full (``weights_only=False``): load only checkpoints you trust."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path} (trainer.resume / checkpoint=)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # truncated, corrupt, not a torch file
        raise CheckpointError(f"cannot read checkpoint {path}: {type(exc).__name__}: {exc} (corrupt or not a torch file)") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointError(f"{path} is not a transformer-zoo checkpoint (format {found!r}, expected {CHECKPOINT_FORMAT!r})")
    missing = [k for k in ("model", "model_config", "step") if k not in payload]
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete: missing {', '.join(missing)}")
    return payload


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


# -- metrics -----------------------------------------------------------------------------------------

def score_batch(logits: Tensor, batch: dict[str, Tensor]) -> tuple[float, float, float]:
    """(summed NLL in nats, correct predictions, scored items) of one batch (LM or classifier)."""
    targets = batch["targets"]
    if logits.dim() == 3:  # LM: [b, t, V]
        targets = targets.masked_fill(~batch["pad_mask"], IGNORE_INDEX) if "pad_mask" in batch else targets
        flat_logits, flat_targets = logits.float().flatten(0, 1), targets.flatten()
    else:  # classifier: [b, C]
        flat_logits, flat_targets = logits.float(), targets
    scored = flat_targets != IGNORE_INDEX
    nll = F.cross_entropy(flat_logits, flat_targets, ignore_index=IGNORE_INDEX, reduction="sum")
    correct = ((flat_logits.argmax(-1) == flat_targets) & scored).sum()
    return float(nll), float(correct), float(scored.sum())


def scalar_stats(stats: dict[str, Any], prefix: str) -> dict[str, float]:
    out = {}
    for key, value in stats.items():
        if isinstance(value, Tensor) and value.numel():
            out[f"{prefix}{key}"] = float(value.detach().float().mean())
        elif isinstance(value, (int, float)):
            out[f"{prefix}{key}"] = float(value)
    return out


class ActivationMeter:
    """Bytes of tensors saved for backward during one step (each storage counted once)."""

    def __init__(self):
        self.storages: dict[int, int] = {}

    def pack(self, t: Tensor) -> Tensor:
        with contextlib.suppress(Exception):
            storage = t.untyped_storage()
            self.storages[storage.data_ptr()] = storage.nbytes()
        return t

    @property
    def megabytes(self) -> float:
        return sum(self.storages.values()) / 2**20


class MetricsFile:
    """Every logged metric as JSON lines (``metrics.jsonl``), and a CSV of them at the end, so no
    run depends on wandb to be read."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.dir / "metrics.jsonl"
        self._f = open(self.jsonl, "a")

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self._f.write(json.dumps({"step": step, **metrics}) + "\n")
        self._f.flush()

    def finish(self, summary: dict[str, Any]) -> None:
        self._f.close()
        rows = [json.loads(line) for line in self.jsonl.read_text().splitlines() if line.strip()]
        keys = ["step"] + sorted({k for r in rows for k in r} - {"step"})
        with open(self.dir / "metrics.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)


# -- the trainer ---------------------------------------------------------------------------------

class Trainer:
    """Train ``model`` on ``task``.

    ``loggers``: objects with ``log(metrics, step)`` and ``finish(summary)`` (rank 0 only).
    ``callbacks``: ``fn(trainer, step)`` called after each optimiser step (tests, custom stops).
    ``config``: the full application config, stored in checkpoints for evaluate/sample."""

    def __init__(self, model: nn.Module, task: Task, *, trainer: TrainerOptions, optim: OptimOptions, run_dir: str | Path, seed: int = 0, loggers: Iterable[Any] = (), callbacks: Iterable[Callable[[Trainer, int], None]] = (), config: dict[str, Any] | None = None):
        self.opts, self.optim_opts, self.task = trainer, optim, task
        self.run_dir = Path(run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.seed, self.config = seed, config or {}
        self.callbacks = list(callbacks)
        if trainer.threads:
            torch.set_num_threads(trainer.threads)
        self.dist = distributed.from_env()
        self.device = pick_device(trainer.device, self.dist.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.dist = distributed.setup(self.device)
        self.loggers = list(loggers) if self.dist.is_main else []
        self.model = model.to(self.device)
        self.net: nn.Module = self.model
        if self.dist.enabled:
            self.net = nn.parallel.DistributedDataParallel(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        o = optim
        if o.name == "adamw":
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
        else:
            self.optimizer = adam(self.model, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
        self.scheduler = schedule(self.optimizer, o.schedule, d_model=model.config.d_model, warmup=max(1, o.warmup) if o.schedule == "noam" else o.warmup, total=trainer.max_steps)
        self.step = 0
        self.state: Any = None
        self.best: float | None = None
        self.last_checkpoint: Path | None = None
        self.tokens_per_s: list[float] = []
        self.activation_mb: float | None = None
        self._ctrl_c = False
        if trainer.precision == "bf16" and self.device.type != "cuda":
            raise ValueError("trainer.precision=bf16 autocast needs CUDA here; use fp32 on CPU")

    # -- checkpoints ---------------------------------------------------------------------------
    def payload(self) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "model_config": self.model.config.to_dict(),
            "task": {"name": self.task.registry_name, "options": asdict(self.task.options), "batch_size": self.task.batch_size, "seq_len": self.task.seq_len, "seed": self.task.seed},
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
            "state": map_tensors(self.state, lambda t: t.detach().cpu()),
            "best": self.best,
            "world_size": self.dist.world_size,
            "config": self.config,
        }

    def save(self, name: str = "last.pt", payload: dict[str, Any] | None = None) -> Path | None:
        if not (self.opts.checkpoints and self.dist.is_main):
            return None
        path = save_checkpoint(self.ckpt_dir / name, payload or self.payload())
        if name == "last.pt":
            self.last_checkpoint = path
        return path

    def resume(self, path: str | Path) -> None:
        ckpt = load_checkpoint(path)
        diff = config_diff(ckpt["model_config"], self.model.config.to_dict())
        if diff:
            raise CheckpointError(f"checkpoint {path} was made by a different model: " + "; ".join(diff[:8]))
        task_now = {"name": self.task.registry_name, "options": asdict(self.task.options), "batch_size": self.task.batch_size, "seq_len": self.task.seq_len, "seed": self.task.seed}
        diff = config_diff(ckpt.get("task", {}), task_now)
        if diff:
            raise CheckpointError(f"checkpoint {path} was trained on different data (the data position would be meaningless): " + "; ".join(diff[:8]))
        if ckpt.get("world_size", 1) != self.dist.world_size:
            raise CheckpointError(f"checkpoint {path} was written with {ckpt.get('world_size')} processes, resuming with {self.dist.world_size}: data rows would not line up")
        try:
            self.model.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
            self.scheduler.load_state_dict(ckpt["scheduler"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"checkpoint {path} does not fit this model/optimiser: {exc}") from None
        self.step, self.best = int(ckpt["step"]), ckpt.get("best")
        self.state = map_tensors(ckpt.get("state"), lambda t: t.to(self.device))
        set_rng_state(ckpt["rng"])
        self.last_checkpoint = Path(path)

    # -- one optimiser step --------------------------------------------------------------------
    def autocast(self):
        if self.opts.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def forward(self, net: nn.Module, batch: dict[str, Tensor], state: Any) -> ModelOutput:
        with self.autocast():
            return net(**batch, state=state) if state is not None else net(**batch)

    def train_step(self) -> dict[str, float]:
        """Accumulate ``accumulate`` micro-batches, clip, step; returns this step's metrics."""
        self.net.train()
        accumulate, t0 = self.opts.accumulate, time.perf_counter()
        carry = self.task.contiguous and self.opts.carry_state
        loss_sum, aux_sum, tokens, stats = 0.0, {}, 0, {}
        self.optimizer.zero_grad(set_to_none=True)
        for micro in range(accumulate):
            index = self.step * accumulate + micro
            batch = {k: v.to(self.device) for k, v in self.task.batch("train", index, rank=self.dist.rank, world_size=self.dist.world_size).items()}
            if not carry or self.task.starts_stream(index):
                self.state = None
            sync = contextlib.nullcontext() if (micro == accumulate - 1 or not self.dist.enabled) else self.net.no_sync()
            meter = ActivationMeter() if self.activation_mb is None else None
            hooks = torch.autograd.graph.saved_tensors_hooks(meter.pack, lambda t: t) if meter else contextlib.nullcontext()
            with sync:
                with hooks:
                    out = self.forward(self.net, batch, self.state)
                    loss = total_loss(out)
                if not torch.isfinite(loss):
                    where = f"last good checkpoint: {self.last_checkpoint}" if self.last_checkpoint else "no checkpoint saved yet"
                    raise TrainingDiverged(f"loss is {float(loss.detach())} at step {self.step + 1} (micro-batch {micro}); stopping. {where}")
                (loss / accumulate).backward()
            if meter is not None:
                self.activation_mb = meter.megabytes
            self.state = detach_state(out.state) if carry else None
            loss_sum += float(out.loss.detach()) / accumulate
            for name, value in out.aux_losses.items():
                aux_sum[name] = aux_sum.get(name, 0.0) + float(value.detach()) / accumulate
            stats = out.stats
            tokens += int((batch["tokens"] if "tokens" in batch else batch["tgt"]).numel())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.opts.clip if self.opts.clip else float("inf"))
        self.optimizer.step()
        self.scheduler.step()
        after_optimizer_step(self.model)
        self.step += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - t0
        tok_s = tokens * self.dist.world_size / max(elapsed, 1e-9)
        metrics = {"train/loss": loss_sum, "train/lr": self.scheduler.get_last_lr()[0], "train/grad_norm": float(grad_norm), "train/tokens_per_s": tok_s}
        metrics.update({f"train/aux/{k}": v for k, v in aux_sum.items()})
        metrics.update(scalar_stats(stats, "train/stats/"))
        return metrics

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate(self, split: str | None = None, max_batches: int | None = None) -> dict[str, float]:
        split = split or self.opts.eval_split
        max_batches = self.opts.eval_batches if max_batches is None else max_batches
        return evaluate_model(self.model, self.task, split, max_batches, device=self.device, autocast=self.autocast, rank=self.dist.rank, world_size=self.dist.world_size)

    def is_better(self, value: float) -> bool:
        if self.best is None or math.isnan(self.best):
            return not math.isnan(value)
        return value > self.best if self.task.higher_is_better else value < self.best

    def peak_memory_mb(self) -> dict[str, float]:
        out = {"mem/rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        if self.device.type == "cuda":
            out["mem/peak_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        if self.activation_mb is not None:
            out["mem/activations_mb"] = self.activation_mb
        return out

    def log(self, metrics: dict[str, float]) -> None:
        for logger in self.loggers:
            logger.log(metrics, self.step)

    # -- the loop ------------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train to ``max_steps`` (or the time budget); returns the run summary (also written to
        ``result.json``)."""
        opts = self.opts
        resume = opts.resume
        if resume == "auto":
            resume = str(self.ckpt_dir / "last.pt") if (self.ckpt_dir / "last.pt").is_file() else ""
        if resume:
            self.resume(resume)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        metric_key = f"{opts.eval_split}/{self.task.metric}"
        from tqdm.auto import tqdm

        bar = tqdm(total=opts.max_steps, initial=self.step, disable=None if (opts.progress and self.dist.is_main) else True, dynamic_ncols=True, mininterval=0.5, desc=self.model.config.name)
        start, last_eval, stopped_early, status = time.perf_counter(), None, False, "finished"
        previous_handler = self._defer_ctrl_c()
        try:
            while self.step < opts.max_steps:
                metrics = self.train_step()
                self.tokens_per_s.append(metrics["train/tokens_per_s"])
                bar.update(1)
                bar.set_postfix(loss=f"{metrics['train/loss']:.3f}", tok_s=f"{metrics['train/tokens_per_s']:.0f}", refresh=False)
                if self.step % opts.log_every == 0 or self.step == 1:
                    self.log({**metrics, **self.peak_memory_mb()})
                for callback in self.callbacks:
                    callback(self, self.step)
                if distributed.broadcast_flag(self._ctrl_c, self.device):  # every rank stops after the same step
                    raise KeyboardInterrupt
                over_time = bool(opts.max_time_s) and time.perf_counter() - start > opts.max_time_s
                over_time = distributed.broadcast_flag(over_time, self.device)
                if (opts.eval_every and self.step % opts.eval_every == 0) or self.step == opts.max_steps or over_time:
                    last_eval = self._evaluate_and_save(metric_key)
                    bar.set_postfix(loss=f"{metrics['train/loss']:.3f}", **{metric_key: f"{last_eval[metric_key]:.4f}"}, refresh=False)
                elif opts.checkpoint_every and self.step % opts.checkpoint_every == 0:
                    self.save()
                if over_time:
                    stopped_early = True
                    break
        except ImmediateInterrupt:
            bar.close()
            print(f"\nstopped mid-step; last good checkpoint: {self.last_checkpoint or 'none saved'}", flush=True)
            raise
        except KeyboardInterrupt:
            status = "interrupted"
            path = self.save()
            bar.close()
            print(f"\ninterrupted at step {self.step}; checkpoint saved to {path}; resume with trainer.resume={path}", flush=True)
            raise
        finally:
            bar.close()
            if previous_handler is not None:
                signal.signal(signal.SIGINT, previous_handler)
        if last_eval is None:  # resumed at or past max_steps
            last_eval = self._evaluate_and_save(metric_key)
        wall = time.perf_counter() - start
        steady = self.tokens_per_s[1:] or self.tokens_per_s
        summary = {
            "status": status,
            "model": self.model.config.name,
            "attention": self.model.config.attention.get("name"),
            "data": self.task.registry_name,
            "metric": self.task.metric,
            "metric_name": metric_key,
            "final_metric": last_eval[metric_key],
            "best_metric": self.best,
            "higher_is_better": self.task.higher_is_better,
            "steps": self.step,
            "stopped_early": stopped_early,
            "tokens_per_s": float(np.median(steady)) if steady else float("nan"),
            "params": sum(p.numel() for p in self.model.parameters()),
            "wall_s": wall,
            "seed": self.seed,
            **{k.split("/", 1)[1]: v for k, v in self.peak_memory_mb().items()},
            **{k: v for k, v in last_eval.items()},
        }
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "result.json").write_text(json.dumps(summary, indent=2, default=str))
            for logger in self.loggers:
                logger.finish(summary)
        return summary

    def _defer_ctrl_c(self) -> Any:
        """Make the first Ctrl-C stop the run *between* steps (so the checkpoint it saves resumes
        exactly); a second Ctrl-C interrupts at once. Returns the previous handler (None when not
        on the main thread, where signals cannot be handled)."""
        self._ctrl_c = False
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum: int, frame: Any) -> None:
            if self._ctrl_c:
                raise ImmediateInterrupt
            self._ctrl_c = True
            print("\nCtrl-C: finishing this step, then saving a checkpoint (Ctrl-C again to stop now)", flush=True)

        return signal.signal(signal.SIGINT, handler)

    def _evaluate_and_save(self, metric_key: str) -> dict[str, float]:
        result = self.evaluate()
        value = result[metric_key]
        improved = self.is_better(value)
        if improved:
            self.best = value
        result[f"{metric_key}_best"] = self.best
        self.log({**result, **self.peak_memory_mb()})
        payload = self.payload() if self.opts.checkpoints and self.dist.is_main else None
        self.save("last.pt", payload)
        if improved:
            self.save("best.pt", payload)
        distributed.barrier()
        return result


@torch.no_grad()
def evaluate_model(model: nn.Module, task: Task, split: str = "val", max_batches: int | None = 0, *, device: torch.device | None = None, autocast: Callable[[], Any] = contextlib.nullcontext, rank: int = 0, world_size: int = 1) -> dict[str, float]:
    """The task metric of ``model`` on ``split`` (``max_batches`` 0/None = the whole split).

    On contiguous data the state the model returns is fed back segment after segment (XL-style
    memory), so a memory model is scored with its memory, as in its paper's evaluation."""
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    nll = correct = count = 0.0
    state = None
    for batch in task.eval_batches(split, max_batches, rank=rank, world_size=world_size):
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast():
            out = model(**batch, state=state) if state is not None else model(**batch)
        state = out.state if task.contiguous else None
        n, c, k = score_batch(out.logits, batch)
        nll, correct, count = nll + n, correct + c, count + k
    model.train(was_training)
    nll, correct, count = distributed.all_sum([nll, correct, count], device)
    return {f"{split}/loss": nll / max(count, 1), f"{split}/accuracy": correct / max(count, 1), f"{split}/{task.metric}": metric_value(task.metric, nll, correct, count), f"{split}/scored": count}


def build_model_for_task(preset: str, task: Task, **overrides: Any) -> nn.Module:
    """``zoo.create_model(preset, **overrides)`` with the task's vocabulary/classes filled in and a
    position table long enough for ``trainer.seq_len``; refuses a head the task cannot train."""
    from zoo.models import create_model, preset_config

    merged = {**task.model_overrides(), **{k: v for k, v in overrides.items() if v is not None}}
    config = preset_config(preset, **merged)
    if config.kind != task.kind:
        raise ValueError(f"model {preset!r} is a {config.kind} model but data {task.registry_name!r} trains a {task.kind}; pick a *_{task.kind} preset" if task.kind != "lm" else f"model {preset!r} is a {config.kind} model but data {task.registry_name!r} is a language-modelling task; pick an LM preset")
    task.check_model(config)
    if "max_len" not in merged and config.max_len < task.seq_len:
        merged["max_len"] = task.seq_len
    return create_model(preset, **copy.deepcopy(merged))
