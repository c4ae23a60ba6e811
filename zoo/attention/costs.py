"""What a mechanism sees and costs: the answers to ``Attention.keys_per_query`` and
``Attention.forward_flops`` (the contract in ``base.py``), and the rules most mechanisms answer with."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class KeysPerQuery:
    """How many keys a query attends to, averaged over a segment, and the rule that says so."""

    keys: float
    rule: str  # e.g. "memory 512 + causal segment"
    upper_bound: bool = False  # at most this many (learned spans may be shorter, buckets may be smaller)


@dataclass(frozen=True)
class FlopCount:
    """Matmul FLOPs (a multiply-add counts 2; element-wise work is not counted) of one forward call over
    one sequence, by component. ``forward`` is differentiable work (its backward costs about twice it);
    ``no_backward`` is work done without a gradient (LSH's hashing), which backward does not repeat."""

    forward: dict[str, float]
    no_backward: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.forward.values()) + sum(self.no_backward.values())


def dense_keys(t: int, causal: bool, memory: int = 0) -> KeysPerQuery:
    """Every key: (t + 1) / 2 on average over a causal segment (query i sees i + 1), t otherwise,
    plus ``memory`` keys carried from earlier segments."""
    keys = (t + 1) / 2 if causal else float(t)
    rule = "dense causal" if causal else "dense"
    return KeysPerQuery(memory + keys, f"memory {memory} + {rule}" if memory else rule)


def at_most_segment(keys: float, t: int, causal: bool) -> float:
    """A pattern's keys per query, capped at what a segment of t holds: (t + 1) / 2 on average when
    causal, t otherwise (a window wider than the segment sees every earlier key)."""
    return min(keys, (t + 1) / 2 if causal else float(t))
