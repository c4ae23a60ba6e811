"""Activation checkpointing of every stack: blocks (or their attention sub-layers) recomputed in backward.

Paper: "Training Deep Nets with Sublinear Memory Cost", Chen, Xu, Zhang & Guestrin 2016, arXiv:1604.06174
(Section 4: keep every k-th layer's input, recompute the segment between them in backward); the selective
form as torchtitan and Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", arXiv:2205.05198) pick it: recompute the part that keeps the most per FLOP (the attention).

A :class:`CheckpointPlan` says what is recomputed; :func:`set_activation_checkpointing` applies it to every
stack of a model (decoder-only, encoder-decoder: both stacks, classifiers, XL / GTrXL memory, universal with
or without ACT), whoever asks (``trainer.activation_checkpointing``, ``zoo.bench --activation-checkpointing``,
the hub's ``gradient_checkpointing_enable``):

- ``none``: nothing (a plan applied again undoes an earlier one);
- ``full``: every block's forward keeps only its input and runs again in backward;
- ``selective`` every k-th block (``CheckpointPlan.selective(k)``): the blocks running as layer i with
  i % k == 0 (layers 0, k, 2k, ...; a stack that re-applies one block, universal, runs it as layer
  ``step - 1`` (``Block.at_depth``), so its steps 1, k + 1, ... are recomputed);
- ``selective`` attention (``CheckpointPlan.attention_only()``): every block's attention sub-layer (its
  norm and mechanism: ``Block._attend``), the feed-forward keeping its activations.

How: the chosen method (``forward`` or ``_attend``) of each block becomes an instance attribute running the
class's method through :func:`zoo.attention.recompute.recompute` (non-reentrant ``torch.utils.checkpoint``, the
generators, autocast state and sequence chunk replayed). Nothing is wrapped in a new module: the module tree,
parameter names and state dict are unchanged (checkpoints load either way), forward hooks run once per
forward (``Module.__call__`` is untouched), and FSDP2's ``fully_shard`` applied to each block afterwards
composes as with torchtitan's wrapper: its hooks sit on ``__call__``, and backward's recomputation runs after
its pre-backward hook has gathered the parameters.

A state threaded through a checkpointed block (XL memory, the adaptive-span cache) is an input like any
other: the recomputation reads the same memory, and a cache appended to in place
(:mod:`zoo.attention.append`) copies instead of appending twice, since the first run's entries are then its
tip. A part whose forward has a side effect that must happen once per step asks
:func:`zoo.attention.recompute.recomputing` (Performer's redraw counter).

Refused, with the reason (never silently ignored): a stack that recomputes already or never calls its
blocks' methods (``Stack.checkpoint_refusal``: reversible), a stack that does not list its blocks
(``block_applications() is None``), a model with no stack, and reentrant checkpointing (it cannot carry a
block's keyword arguments and dataclass outputs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from zoo.attention.recompute import recompute
from zoo.blocks import Block
from zoo.config import require
from zoo.stacks.base import Stack

MODES = ("none", "full", "selective")
SUBLAYERS = {"block": "forward", "attention": "_attend"}  # what is recomputed -> the Block method run again


@dataclass(frozen=True)
class CheckpointPlan:
    """What backward recomputes. ``every``: a block running as layer i is chosen when i % every == 0;
    ``sublayer``: ``block`` (its whole forward) or ``attention`` (its attention sub-layer)."""

    mode: str = "none"
    every: int = 1
    sublayer: str = "block"

    def __post_init__(self) -> None:
        require(self.mode in MODES, f"activation_checkpointing must be one of {', '.join(MODES)}, got {self.mode!r}")
        require(isinstance(self.every, int) and self.every >= 1, f"every must be an int >= 1, got {self.every!r}")
        require(self.sublayer in SUBLAYERS, f"sublayer must be block or attention, got {self.sublayer!r}")
        full = self.mode == "full"
        require(not full or (self.every, self.sublayer) == (1, "block"), "full recomputes every whole block")

    @classmethod
    def selective(cls, every: int = 2) -> CheckpointPlan:
        return cls("selective", every)

    @classmethod
    def attention_only(cls) -> CheckpointPlan:
        return cls("selective", 1, "attention")

    @classmethod
    def from_options(cls, mode: str, selective: str | int = "", key: str = "trainer") -> CheckpointPlan:
        """``<key>.activation_checkpointing`` (none | full | selective) and ``<key>.selective_checkpointing``:
        a block interval k (every k-th block; 2 when left empty) or ``attention``; set only with selective."""
        selective = str(selective).strip()
        if mode not in MODES:
            raise ValueError(f"{key}.activation_checkpointing must be one of {', '.join(MODES)}, got {mode!r}")
        if mode != "selective":
            require(
                not selective,
                f"{key}.selective_checkpointing={selective!r} chooses what selective checkpointing recomputes, but "
                f"{key}.activation_checkpointing={mode}; set activation_checkpointing=selective or leave it empty",
            )
            return cls(mode)
        if selective == "attention":
            return cls.attention_only()
        if not selective:
            return cls.selective()
        require(
            selective.isdigit() and int(selective) >= 1,
            f"{key}.selective_checkpointing must be a block interval k >= 1 (every k-th block) or 'attention', "
            f"got {selective!r}",
        )
        return cls.selective(int(selective))

    @classmethod
    def parse(cls, spec: str) -> CheckpointPlan:
        """``none``, ``full``, ``selective`` (every 2nd block), ``selective:<k>``, ``selective:attention``."""
        mode, _, selective = spec.strip().partition(":")
        return cls.from_options(mode, selective, key="--activation-checkpointing")

    @property
    def spec(self) -> str:
        """The text :meth:`parse` reads back (bench labels, logs)."""
        if self.mode != "selective":
            return self.mode
        return f"selective:{'attention' if self.sublayer == 'attention' else self.every}"

    def apply(self, model: nn.Module) -> nn.Module:
        """``model`` with this plan applied to its blocks (:func:`set_activation_checkpointing`)."""
        set_activation_checkpointing(model, self)
        return model


def stacks_of(model: nn.Module) -> list[Stack]:
    """Every stack of ``model`` (the encoder's and the decoder's of a seq2seq), outermost first."""
    return [module for module in model.modules() if isinstance(module, Stack)]


def set_activation_checkpointing(
    model: nn.Module, plan: CheckpointPlan, *, checkpoint_fn: Callable[..., Any] | None = None
) -> list[Block]:
    """Apply ``plan`` to every block of every stack of ``model`` (undoing any earlier plan); returns the blocks
    whose method now recomputes (each block once, however often its stack applies it). Refuses, naming the
    stack and the reason, what cannot be done (module notes). ``checkpoint_fn``: torch's ``checkpoint`` with
    keywords bound (the hub passes HF's ``gradient_checkpointing_kwargs``); non-reentrant only."""
    stacks = stacks_of(model)
    if plan.mode != "none":
        require(bool(stacks), f"activation_checkpointing={plan.spec}: {type(model).__name__} holds no zoo stack")
        keywords = getattr(checkpoint_fn, "keywords", None) or {}
        require(
            keywords.get("use_reentrant") is not True,
            "activation checkpointing runs non-reentrant (use_reentrant=False): reentrant checkpointing cannot "
            "carry a block's keyword arguments (padding mask, state) and its dataclass outputs",
        )
        for stack in stacks:
            reason = stack.checkpoint_refusal()
            if reason is None and stack.block_applications() is None:
                reason = f"stack {stack.registry_name!r} does not list the blocks it applies (block_applications)"
            if reason is not None:
                raise ValueError(f"activation_checkpointing={plan.spec}: {reason}; set it to none")
    chosen: list[Block] = []
    for stack in stacks:
        blocks = {id(block): block for block in stack.block_applications() or []}
        for block in blocks.values():
            for method in SUBLAYERS.values():
                block.__dict__.pop(method, None)  # back to the class's method
            if plan.mode == "none":
                continue
            method = SUBLAYERS[plan.sublayer]
            setattr(block, method, functools.partial(run_chosen, block, method, plan.every, checkpoint_fn))
            chosen.append(block)
        for block in blocks.values():  # what recomputed() reads (cost models)
            block.__dict__["checkpointing"] = plan if plan.mode != "none" else None
    return chosen


def recomputed(block: Block, layer_index: int, *, any_layer: bool = False) -> str | None:
    """What backward recomputes of ``block`` running as layer ``layer_index`` (``block`` or ``attention``), or
    None; ``any_layer``: at any layer (whether the block is checkpointed at all)."""
    plan = block.__dict__.get("checkpointing")
    if plan is None or not (any_layer or layer_index % plan.every == 0):
        return None
    return plan.sublayer


def run_chosen(
    block: Block, method: str, every: int, checkpoint_fn: Callable[..., Any] | None, *args: Any, **kwargs: Any
) -> Any:
    """``block.<method>(*args, **kwargs)``, recomputed in backward when the block runs as a chosen layer (its
    attention's ``layer_index``: the stack's layer, or the universal stack's step, set by ``at_depth``)."""
    bound = getattr(type(block), method).__get__(block)
    if block.attention.layer_index % every:
        return bound(*args, **kwargs)
    return recompute(bound, *args, checkpoint_fn=checkpoint_fn, **kwargs)
