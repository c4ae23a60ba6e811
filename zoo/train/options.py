"""The ``trainer.*`` and ``optim.*`` options of a training run, and what they build: the device
and the optimiser (Adam is Adam: its weight decay is an L2 penalty; AdamW's is decoupled).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from zoo.config import require
from zoo.precision import PRECISIONS, check_precision
from zoo.stacks.checkpointing import CheckpointPlan
from zoo.train.adagrad import ParameterClippedAdagrad
from zoo.train.steps import adam, schedule


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
    precision: str = "fp32"  # fp32 | bf16 (autocast, on CUDA and CPU: zoo/precision.py)
    carry_state: bool = True  # carry segment memory across steps on contiguous data
    max_time_s: float = 0.0  # stop (and evaluate) after this many seconds of training (0 = no limit)
    resume: str = ""  # a checkpoint path, or "auto" = last.pt of this run directory if present
    progress: bool = True  # tqdm bar
    threads: int = 0  # torch.set_num_threads (0 = leave as is)
    # train under torch.compile (compiled on the first step; evaluation stays eager). Measured with
    # ``python -m zoo.bench --paired --compile``: on CPU it helped LSH, slowed dense and local attention
    compile: bool = False
    # stop after this many evaluations in a row without a better validation metric (0 = off)
    early_stop_patience: int = 0
    # debugging aids (conf/debug/): train on the first N training batches over and over and evaluate
    # on them (0 = off); a torch.profiler trace of N steps into <run dir>/profile/ (0 = off);
    # autograd anomaly detection (the backward op that made a NaN, named with its forward trace)
    overfit_batches: int = 0
    profile_steps: int = 0
    detect_anomaly: bool = False
    # context parallelism (zoo/parallel): this many torchrun ranks share each sequence, each holding a chunk
    # of it; the other processes form data-parallel replicas. The layout of the chunks: auto (what every
    # attention layer runs on, zigzag for dense causal attention), contiguous or zigzag
    context_parallel: int = 1
    context_layout: str = "auto"
    # activation checkpointing (zoo/stacks/checkpointing.py): none | full (every block recomputed in backward) |
    # selective, which recomputes every k-th block (selective_checkpointing=k; left empty: 2) or every block's
    # attention sub-layer (selective_checkpointing=attention)
    activation_checkpointing: str = "none"
    selective_checkpointing: str = ""

    def __post_init__(self) -> None:
        for key in ("max_steps", "batch_size", "seq_len", "accumulate", "log_every"):
            value = getattr(self, key)
            require(isinstance(value, int) and value > 0, f"trainer.{key} must be a positive int, got {value!r}")
        for key in (
            "eval_every",
            "eval_batches",
            "checkpoint_every",
            "threads",
            "early_stop_patience",
            "overfit_batches",
            "profile_steps",
        ):
            require(getattr(self, key) >= 0, f"trainer.{key} must be >= 0, got {getattr(self, key)!r}")
        require(
            isinstance(self.context_parallel, int) and self.context_parallel >= 1,
            f"trainer.context_parallel must be an int >= 1 (ranks per sequence), got {self.context_parallel!r}",
        )
        require(
            self.context_layout in ("auto", "contiguous", "zigzag"),
            f"trainer.context_layout must be auto, contiguous or zigzag, got {self.context_layout!r}",
        )
        require(
            self.context_parallel == 1 or not self.compile,
            "trainer.compile is not supported with trainer.context_parallel > 1 (the exchanges between ranks run "
            "eagerly); set one of them back",
        )
        require(
            self.checkpoint_plan().mode == "none" or self.context_parallel == 1,
            "trainer.activation_checkpointing with trainer.context_parallel > 1 is not supported yet: recomputing a "
            "layer in backward would run its exchanges between ranks again, which no test covers; set one of them back",
        )
        require(self.precision in PRECISIONS, f"trainer.precision must be fp32 or bf16, got {self.precision!r}")
        require(self.eval_split in ("val", "test"), f"trainer.eval_split must be val or test, got {self.eval_split!r}")
        require(self.clip >= 0 and self.max_time_s >= 0, "trainer.clip and trainer.max_time_s must be >= 0")

    def checkpoint_plan(self) -> CheckpointPlan:
        """What backward recomputes (``activation_checkpointing``, ``selective_checkpointing``); refuses a bad pair."""
        return CheckpointPlan.from_options(self.activation_checkpointing, self.selective_checkpointing)


@dataclass
class OptimOptions:
    """``optim.*`` keys: the optimiser and the learning-rate schedule.

    ``name=adam`` is Adam, its ``weight_decay`` an L2 penalty added to the gradient;
    ``name=adamw`` is AdamW, its ``weight_decay`` decoupled from the gradient; ``name=sgd`` is SGD
    with ``momentum`` (Al-Rfou et al. 2018 train with momentum 0.99; ``betas`` and ``eps`` unused); ``name=adagrad``
    is Adagrad with the adaptive-span authors' per-tensor ``parameter_clip`` (``betas`` unused)."""

    name: str = "adam"  # adam | adamw | sgd | adagrad (zoo/train/adagrad.py)
    lr: float = 1e-3  # peak rate (a multiplier of the paper's rate for schedule=noam: use 1.0)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-9
    weight_decay: float = 0.0
    schedule: str = "cosine"  # noam | cosine | constant | one_cycle (zoo/train/one_cycle.py)
    warmup: int = 100
    min_lr_ratio: float = 0.1  # cosine: the rate's floor at the last step, a fraction of lr (Transformer-XL: 0)
    momentum: float = 0.0  # sgd only: heavy-ball momentum
    nesterov: bool = False  # sgd only
    # adagrad only: each parameter tensor's step scaled by clip / |g| when its gradient norm |g| exceeds it (the
    # adaptive-span authors' clipping, zoo/train/adagrad.py; 0 = none); trainer.clip still clips the total norm
    parameter_clip: float = 0.0

    def __post_init__(self) -> None:
        require(self.name in OPTIMIZERS, f"optim.name must be one of {', '.join(OPTIMIZERS)}, got {self.name!r}")
        require(
            self.schedule in SCHEDULES,
            f"optim.schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}",
        )
        require(0.0 <= self.min_lr_ratio <= 1.0, f"optim.min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")
        require(0.0 <= self.momentum < 1.0, f"optim.momentum must lie in [0, 1), got {self.momentum}")
        require(
            self.name == "sgd" or (self.momentum == 0.0 and not self.nesterov),
            f"optim.momentum / optim.nesterov are SGD's; optim.name={self.name} has betas instead",
        )
        require(not self.nesterov or self.momentum > 0, "optim.nesterov needs optim.momentum > 0")
        require(self.parameter_clip >= 0, f"optim.parameter_clip must be >= 0, got {self.parameter_clip}")
        require(
            self.name == "adagrad" or self.parameter_clip == 0.0,
            f"optim.parameter_clip is the adaptive-span authors' Adagrad clipping; optim.name={self.name} "
            "clips with trainer.clip (the total gradient norm)",
        )
        require(
            self.lr > 0 and self.warmup >= 0 and len(self.betas) == 2,
            f"need optim.lr > 0, optim.warmup >= 0, two optim.betas; got {self.lr}, {self.warmup}, {list(self.betas)}",
        )
        require(self.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {self.weight_decay}")

    def describe(self) -> str:
        """What runs, in words (logged at the start and stored in result.json)."""
        if self.name == "adamw":
            return f"AdamW (decoupled weight decay {self.weight_decay})"
        if self.name == "adagrad":
            clip = f", each tensor's step clipped at gradient norm {self.parameter_clip}" if self.parameter_clip else ""
            return f"Adagrad (L2 weight decay {self.weight_decay}{clip})"
        if self.name == "sgd":
            nesterov = ", Nesterov" if self.nesterov else ""
            return f"SGD (momentum {self.momentum}{nesterov}, L2 weight decay {self.weight_decay})"
        return f"Adam (L2 weight decay {self.weight_decay})" if self.weight_decay else "Adam"


OPTIMIZERS = ("adam", "adamw", "sgd", "adagrad")
SCHEDULES = ("noam", "cosine", "constant", "one_cycle")
# optimiser settings its saved state (moment estimates) depends on: a change is refused on resume
OPTIM_STATE_KEYS = ("name", "betas")
# settings applied on resume (the schedule is rebuilt from the current options at every start)
OPTIM_APPLIED_KEYS = (
    "lr",
    "schedule",
    "warmup",
    "weight_decay",
    "eps",
    "min_lr_ratio",
    "momentum",
    "nesterov",
    "parameter_clip",
)


def pick_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    """``trainer.device``: auto (CUDA when present, else CPU), cpu, cuda, cuda:N, or any torch device."""
    if name == "auto":
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"trainer.device={name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"trainer.device={name!r} but CUDA is not available here; use trainer.device=auto or cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"trainer.device={name!r} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def run_device(options: TrainerOptions, local_rank: int = 0) -> torch.device:
    """The device a run with ``options`` trains on; refuses, naming the key and the fix, a device this
    machine lacks or a ``trainer.precision`` it cannot run. The app asks before building any data or
    model (:func:`zoo.app.run.build`), the trainer again when it starts."""
    device = pick_device(options.device, local_rank)
    check_precision(options.precision, device)
    return device


def make_optimizer(model: nn.Module, options: OptimOptions) -> torch.optim.Optimizer:
    if options.name == "adagrad":
        return ParameterClippedAdagrad(
            model.parameters(),
            lr=options.lr,
            eps=options.eps,
            clip=options.parameter_clip,
            weight_decay=options.weight_decay,
        )
    if options.name == "sgd":
        return torch.optim.SGD(
            model.parameters(),
            lr=options.lr,
            momentum=options.momentum,
            nesterov=options.nesterov,
            weight_decay=options.weight_decay,
        )
    return adam(
        model,
        lr=options.lr,
        betas=tuple(options.betas),
        eps=options.eps,
        weight_decay=options.weight_decay,
        decoupled=options.name == "adamw",
    )


def make_schedule(optimizer: torch.optim.Optimizer, options: OptimOptions, *, d_model: int, total: int):
    """The learning-rate schedule ``optim.schedule`` names, over ``total`` optimiser steps."""
    return schedule(
        optimizer,
        options.schedule,
        d_model=d_model,
        warmup=options.warmup,
        total=total,
        min_ratio=options.min_lr_ratio,
    )
