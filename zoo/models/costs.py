"""What a model's training step costs, asked of its parts: one FLOP and activation model for
``experiments/describe.py`` (zoo/app/paper.py) and the benchmark's FLOP-bound share (zoo.bench).

Every figure comes from the parts that know it: each attention's ``forward_flops``,
``keys_per_query`` and ``memory_keys``; each block's feed-forward ``forward_flops``; the stack's
``block_applications``, ``kept_layers`` and ``recompute_passes``; the model's ``output_flops``. A
part that does not answer makes the figure unknown (None), never a dense guess.

- A training step = forward + backward (about twice the forward) + the stack's recomputation of
  its differentiable work, and one more forward of each block (or attention sub-layer) that activation
  checkpointing recomputes (``zoo.stacks.checkpointing.recomputed``); work a part does without gradient (LSH's
  hashing) runs once per forward pass, the recomputation's included. The output layer costs 3 x its forward.
- Activation memory: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  Transformer Models", arXiv:2205.05198), bf16 with a fused attention kernel: (18 d_model + the
  feed-forward's own) bytes per token per kept layer, the feed-forward answering its d_ff-wide
  tensors (``FeedForward.activation_bytes_per_token``: 4 d_ff for the two-layer mlp, Korthikanti's
  figure; 8 h for a gated unit of hidden width h), plus the keys and values of each layer's memory
  (4 d_model bytes per memory key). Estimates: ``python -m zoo.bench`` measures saved tensors exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from zoo.blocks import Block
from zoo.stacks.base import Stack
from zoo.stacks.checkpointing import recomputed


@dataclass(frozen=True)
class KeysSummary:
    """Keys per query averaged over the layers one forward applies, with the mechanisms' rules."""

    keys: float
    rule: str
    upper_bound: bool


def stacks(model: nn.Module) -> list[Stack]:
    return [m for m in model.modules() if isinstance(m, Stack)]


def applied_blocks(model: nn.Module) -> list[Block] | None:
    """Every block application of one forward over all the model's stacks; None when a stack does not
    say, or when a block attends to another sequence (its cost depends on that sequence's length)."""
    found = stacks(model)
    if not found:
        return None
    blocks = []
    for stack in found:
        applied = stack.block_applications()
        if applied is None or any(block.cross_attention is not None for block in applied):
            return None
        blocks.extend(applied)
    return blocks


def keys_per_query(model: nn.Module, t: int) -> KeysSummary | None:
    blocks = applied_blocks(model)
    answers = [block.attention.keys_per_query(t) for block in blocks or []]
    if not answers or any(a is None for a in answers):
        return None
    rule = "; ".join(dict.fromkeys(a.rule for a in answers))
    return KeysSummary(sum(a.keys for a in answers) / len(answers), rule, any(a.upper_bound for a in answers))


def feed_forward_flops(block: Block, t: int) -> float | None:
    ask = getattr(block.feed_forward, "forward_flops", None)
    return ask(t) if callable(ask) else None


def feed_forward_bytes(block: Block) -> float | None:
    ask = getattr(block.feed_forward, "activation_bytes_per_token", None)
    return ask() if callable(ask) else None


def step_flops(model: nn.Module, t: int, batch: int = 1) -> dict[str, float] | None:
    """Matmul FLOPs of one training step on ``batch`` sequences of ``t`` tokens, by component, with
    "total"; None when a part does not say (see the module docstring for the rule)."""
    blocks = applied_blocks(model)
    output = model.output_flops(t) if callable(getattr(model, "output_flops", None)) else None
    passes = [stack.recompute_passes() for stack in stacks(model)]
    if blocks is None or output is None or any(p is None for p in passes) or len(set(passes)) > 1:
        return None
    recompute = passes[0]
    flops: dict[str, float] = {}

    def add(name: str, value: float) -> None:
        flops[name] = flops.get(name, 0.0) + value * batch

    applications = [(i, block) for stack in stacks(model) for i, block in enumerate(stack.block_applications())]
    for layer, block in applications:
        attention, feed_forward = block.attention.forward_flops(t), feed_forward_flops(block, t)
        if attention is None or feed_forward is None:
            return None
        again = recomputed(block, layer)  # activation checkpointing: one more forward of the block or its attention
        for name, value in attention.forward.items():
            add(name, (3.0 + recompute + (again is not None)) * value)
        add("feed_forward", (3.0 + recompute + (again == "block")) * feed_forward)
        for name, value in attention.no_backward.items():
            add(name, (1.0 + recompute + (again is not None)) * value)
    add("output_layer", 3.0 * output[0])
    flops["total"] = sum(flops.values())
    return flops


def forward_flops(model: nn.Module, t: int) -> float | None:
    """Matmul FLOPs of one forward pass over one sequence of ``t`` tokens (no recomputation)."""
    blocks = applied_blocks(model)
    output = model.output_flops(t) if callable(getattr(model, "output_flops", None)) else None
    if blocks is None or output is None:
        return None
    total = output[0]
    for block in blocks:
        attention, feed_forward = block.attention.forward_flops(t), feed_forward_flops(block, t)
        if attention is None or feed_forward is None:
            return None
        total += attention.total + feed_forward
    return total


def activation_bytes_per_token(model: nn.Module, t: int, d_model: int) -> tuple[float, str] | None:
    """(bytes of activations kept per token of a training step, the rule), or None when unknown."""
    blocks = applied_blocks(model)
    kept = [stack.kept_layers() for stack in stacks(model)]
    if blocks is None or any(k is None for k in kept) or any(recomputed(b, 0, any_layer=True) for b in blocks):
        return None  # activation checkpointing keeps less than this model says: measured by zoo.bench instead
    memory = [block.attention.memory_keys() for block in blocks]
    feed_forward = [feed_forward_bytes(block) for block in blocks]
    if any(m is None for m in memory) or any(f is None for f in feed_forward):
        return None
    per_layer = 18 * d_model + sum(feed_forward) / len(feed_forward)  # a kept layer's, averaged over the blocks
    per_token = sum(kept) * per_layer + sum(4 * d_model * m / max(t, 1) for m in memory)
    rule = "Korthikanti et al. 2022, bf16, fused attention: (18 d + the feed-forward's own) B/token/layer"
    if sum(kept) < len(blocks):
        rule += f"; {sum(kept)} of {len(blocks)} layers kept (the stack recomputes the rest)"
    if any(memory):
        rule += "; + memory K/V"
    return per_token, rule


def unanswered(model: nn.Module, t: int) -> list[str]:
    """The parts whose silence makes a figure unknown, named for the report."""
    found = stacks(model)
    if not found:
        return ["the model has no stack"]
    silent = []
    for stack in found:
        applied = stack.block_applications()
        if applied is None or stack.recompute_passes() is None or stack.kept_layers() is None:
            silent.append(f"stack {stack.registry_name!r}")
            continue
        for block in applied:
            if block.cross_attention is not None:
                silent.append("cross-attention (its cost depends on the other sequence)")
            attention = block.attention
            name = attention.registry_name or type(attention).__name__
            if attention.keys_per_query(t) is None or attention.forward_flops(t) is None:
                silent.append(f"attention {name!r}")
            if attention.memory_keys() is None:
                silent.append(f"attention {name!r} (memory_keys)")
            if feed_forward_flops(block, t) is None or feed_forward_bytes(block) is None:
                silent.append(f"feed-forward {type(block.feed_forward).__name__}")
    if not callable(getattr(model, "output_flops", None)) or model.output_flops(t) is None:
        silent.append(f"head {getattr(getattr(model, 'config', None), 'kind', type(model).__name__)!r}")
    return list(dict.fromkeys(silent))


def per_layer_costs(model: nn.Module, t: int) -> list[dict[str, Any]] | None:
    """Each applied block's attention, keys per query and forward FLOPs per token at length t (a hybrid's
    layers differ); None when a stack does not say which blocks it applies."""
    blocks = applied_blocks(model)
    if blocks is None:
        return None
    rows = []
    for i, block in enumerate(blocks):
        attention = block.attention
        keys, flops, feed_forward = (
            attention.keys_per_query(t),
            attention.forward_flops(t),
            feed_forward_flops(block, t),
        )
        rows.append(
            {
                "layer": i,
                "attention": attention.registry_name or type(attention).__name__,
                "keys_per_query": None if keys is None else keys.keys,
                "keys_rule": "unknown" if keys is None else keys.rule,
                "forward_flops_per_token": None
                if flops is None or feed_forward is None
                else (flops.total + feed_forward) / t,
            }
        )
    return rows


def describe_costs(model: nn.Module, t: int) -> dict[str, Any]:
    """The cost entries of ``describe`` for a model (built on the meta device is enough) at length t;
    an unknown figure is None and its rule says "unknown"."""
    config = model.config
    keys = keys_per_query(model, t)
    step, forward = step_flops(model, t), forward_flops(model, t)
    output = model.output_flops(t) if callable(getattr(model, "output_flops", None)) else None
    activations = activation_bytes_per_token(model, t, config.d_model)
    if activations is not None and keys is not None and keys.upper_bound and "memory" in activations[1]:
        activations = (activations[0], activations[1] + " (at most: the keys/query figure is an upper bound)")
    unknown = "unknown: " + ", ".join(unanswered(model, t)) + " does not say"
    return {
        "train_flops_per_token": None if step is None else step["total"] / t,
        "forward_flops_per_token": None if forward is None else forward / t,
        "keys_per_query": None if keys is None else keys.keys,
        "keys_rule": unknown if keys is None else keys.rule,
        "head_rule": f"unknown: head {config.kind!r} does not say" if output is None else output[1],
        "activation_bytes_per_token": None if activations is None else activations[0],
        "activation_mib_per_sequence": None if activations is None else activations[0] * t / 2**20,
        "activation_rule": unknown if activations is None else activations[1],
        "layers": per_layer_costs(model, t),
        "feed_forward_rule": feed_forward_rule(model),
    }


def feed_forward_rule(model: nn.Module) -> str:
    """The feed-forward parts' own FLOP rules (one per kind of part the model applies)."""
    blocks = applied_blocks(model) or []
    rules = [getattr(block.feed_forward, "flops_rule", None) for block in blocks]
    said = [rule() for rule in rules if callable(rule)]
    return "; ".join(dict.fromkeys(said)) if said else "unknown: the feed-forward does not say"
