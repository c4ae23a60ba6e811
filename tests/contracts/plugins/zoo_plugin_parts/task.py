"""A researcher's own task: copy with an offset, target i = token i - ``shift`` (random tokens; the
first ``shift`` targets are not scored). Registered as ``plugin_task`` when imported."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from zoo.config import IGNORE_INDEX, require
from zoo.data.base import TASK, Task, check_split, seeded_generator


@TASK.register("plugin_task")
class ShiftedCopy(Task):
    kind = "lm"
    metric = "loss"
    vocab_size = 16

    @dataclass
    class Options:
        shift: int = 2

        def __post_init__(self) -> None:
            require(
                isinstance(self.shift, int) and self.shift >= 1, f"data.shift must be an int >= 1, got {self.shift}"
            )

    def batch(self, split: str, index: int, *, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        check_split(split, index=index, rank=rank, world_size=world_size)
        g = seeded_generator(self.seed, "plugin_task", split, index, rank)
        tokens = torch.randint(0, self.vocab_size, (self.batch_size, self.seq_len), generator=g)
        targets = torch.full_like(tokens, IGNORE_INDEX)
        targets[:, self.options.shift :] = tokens[:, : -self.options.shift]
        return {"tokens": tokens, "targets": targets}

    def num_batches(self, split: str, world_size: int = 1) -> int | None:
        return None if split == "train" else 2
