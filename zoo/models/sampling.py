"""How the next token is picked from a language model's logits: the processors users know from HF
``generate`` and x-transformers, each a small function of [b, V] logits, applied in HF's order
(repetition penalty, then temperature, top-k, top-p, min-p) by :class:`Sampling`.

- repetition penalty: Keskar et al. 2019, "CTRL", arXiv:1909.05858, Section 4.1 (a seen token's
  logit is divided by the penalty when positive, multiplied by it when negative, as HF does).
- top-k: Fan et al. 2018, "Hierarchical Neural Story Generation", arXiv:1805.04833.
- top-p (nucleus): Holtzman et al. 2019, "The Curious Case of Neural Text Degeneration",
  arXiv:1904.09751: the smallest set of most likely tokens whose probability reaches p.
- min-p: Nguyen et al. 2024, "Turning Up the Heat: Min-p Sampling", arXiv:2407.01082: tokens whose
  probability is below min_p times the top token's are dropped.

Every filter keeps at least the most likely token, so a row never has nothing to sample from.
Filtered logits are -inf (their probability 0). tests/parts/test_sampling.py checks each against
HF transformers' logits processors, a reference we did not write.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from zoo.config import ArgumentTypeError, check_type

REMOVED = float("-inf")


def penalise_repeats(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """logits [b, V]; seen bool [b, V] (True = the token occurs in the row's real tokens so far)."""
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


def keep_top_k(logits: Tensor, k: int) -> Tensor:
    """Keep the k largest logits of each row (ties with the k-th kept too); k = 0 keeps all."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = logits.topk(k, dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth, REMOVED)


def keep_top_p(logits: Tensor, p: float) -> Tensor:
    """Keep the most likely tokens until their probability reaches p: a token is dropped when the
    tokens more likely than it already hold at least p of the mass."""
    if p >= 1.0:
        return logits
    ordered, order = logits.sort(dim=-1, descending=True)
    probs = ordered.softmax(-1)
    before = probs.cumsum(-1) - probs  # mass of the tokens ranked above each one
    drop_sorted = before >= p
    drop_sorted[:, 0] = False  # the most likely token always stays
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, REMOVED)


def keep_min_p(logits: Tensor, min_p: float) -> Tensor:
    """Drop tokens whose probability is below min_p x the row's most likely token's."""
    if min_p <= 0.0:
        return logits
    probs = logits.softmax(-1)
    floor = min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < floor, REMOVED)


@dataclass(frozen=True)
class Sampling:
    """The choice of the next token. ``do_sample`` False: the argmax of the (repetition-penalised)
    logits, as HF's greedy search; True: a draw from softmax(processed logits / temperature)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0 = every token
    top_p: float = 1.0  # 1 = every token
    min_p: float = 0.0  # 0 = every token
    repetition_penalty: float = 1.0  # 1 = none

    def __post_init__(self) -> None:
        check_type(self.do_sample, bool, "do_sample")
        for name in ("temperature", "top_p", "min_p", "repetition_penalty"):
            check_type(getattr(self, name), float, name)
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        check_type(self.top_k, int, "top_k")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = every token), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1] (1 = every token), got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must lie in [0, 1] (0 = every token), got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 = none), got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0.0

    def process(self, logits: Tensor, seen: Tensor | None = None) -> Tensor:
        """[b, V] logits -> the float logits the next token is drawn from (greedy: penalised only)."""
        logits = logits.float()
        if seen is not None:
            logits = penalise_repeats(logits, seen, self.repetition_penalty)
        if self.greedy:
            return logits
        logits = logits / self.temperature
        logits = keep_top_k(logits, self.top_k)
        logits = keep_top_p(logits, self.top_p)
        return keep_min_p(logits, self.min_p)

    def next_tokens(
        self, logits: Tensor, seen: Tensor | None = None, generator: torch.Generator | None = None
    ) -> Tensor:
        """[b, V] logits -> [b] token ids."""
        processed = self.process(logits, seen)
        if self.greedy:
            return processed.argmax(-1)
        return torch.multinomial(processed.softmax(-1), 1, generator=generator)[:, 0]


def check_generator(generator: object) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ArgumentTypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
