"""Stacks: how blocks are composed in depth.

A stack is built from a block factory ``make_block(layer_index) -> Block`` and called as
``stack(x, *, pad_mask, state, context, context_pad_mask) -> StackOutput``. ``state`` is a list
with one entry per layer (``None`` = start fresh).

The contract every stack keeps (``tests/contracts/test_stack_contract.py`` checks it over the registry):
every layer's aux losses come back (summed by name, as ``ModelOutput.aux_losses``) and every
layer's stats come back under ``layer<i>/<block stat>`` (``layer3/attn/span_mean``,
``layer3/cross/...``; a stack re-applying one block numbers its steps as layers); stack-level
stats get the stack's own prefix (``act/steps_mean``).

What a stack knows about itself it answers (None = it does not say; consumers print "unknown"):
``block_applications`` (the blocks one forward runs, for FLOP counts), ``layer_blocks`` (blocks
called in turn whose outputs are the layers' outputs, for per-layer losses), ``kept_layers`` and
``recompute_passes`` (activation memory and the extra work of recomputing them).

The stacks, one file each: ``sequential``, ``reversible``, ``universal``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor, nn

from zoo.blocks import Block
from zoo.config import NoOptions, build_options, require
from zoo.registry import Registry

BlockFactory = Callable[[int], Block]


@dataclass
class StackOutput:
    x: Tensor
    state: list[Any] | None = None  # one entry per layer; None when no layer keeps state
    aux: dict[str, Tensor] = field(default_factory=dict)
    stats: dict[str, Tensor] = field(default_factory=dict)


class Stack(nn.Module):
    Options: ClassVar[type] = NoOptions
    registry_name: ClassVar[str | None] = None
    # capability flags: the builder and the contract suite (tests/contracts/test_stack_contract.py) read these
    keeps_state: ClassVar[bool] = True  # can thread its blocks' caches across calls (universal: no)
    no_state_reason: ClassVar[str] = ""  # why keeps_state is False, for the refusal a model gives
    supports_cross: ClassVar[bool] = True  # can hold blocks with cross-attention (seq2seq decoder)
    needs_additive: ClassVar[bool] = False  # needs additive residuals (reversible: subtracts the branches)
    packs_documents: ClassVar[bool] = False  # passes a packed row's documents= to every block (data.pack)
    no_packing_reason: ClassVar[str] = "does not pass a packed row's document ids to its blocks"

    def __init__(self, make_block: BlockFactory, n_layers: int, d_model: int, **options):
        super().__init__()
        require(isinstance(n_layers, int) and n_layers > 0, f"n_layers must be a positive int, got {n_layers!r}")
        self.n_layers, self.d_model = n_layers, d_model
        self.options = build_options(self.Options, options, f"stack {self.registry_name!r}")

    @classmethod
    def contract_variants(cls) -> list[dict[str, Any]]:
        """Option sets under which the stack contract suite exercises this stack (one case each)."""
        return [{}]

    @classmethod
    def adds_position_signal(cls, options: dict[str, Any]) -> bool:
        """True when a stack built with ``options`` adds an absolute position signal itself, so the
        model must add none (one owner of the position signal; the builder checks it)."""
        return False

    # -- what the stack answers (None = it does not say) ---------------------------------------------
    def block_applications(self) -> list[Block] | None:
        """The blocks one forward pass applies, in order; a block applied again is listed again (the
        FLOPs of a forward are the sum over this list)."""
        return None

    def layer_blocks(self) -> list[Block] | None:
        """One block per layer, called in turn through ``Block.forward`` on the previous one's output, so
        each layer's output exists and a forward hook sees it (Al-Rfou et al.'s intermediate losses read
        them). None when the stack has no such per-layer outputs."""
        return None

    def kept_layers(self) -> int | None:
        """How many layers' activations one training step keeps for backward (reversible: one)."""
        return None

    def recompute_passes(self) -> float | None:
        """Extra forward passes backward makes to rebuild what was not kept (reversible: one)."""
        return None

    def init_state(self, batch_size: int) -> list[Any] | None:
        return None

    def left_padding_refusal(self) -> str | None:
        """Why a left-padded batch decoded through this stack would not equal each prompt alone (a signal of the
        stack's own numbered from where the stream stands rather than from each row's first real token), or
        None (generate(pad_mask=...) asks it; zoo/models/generation.py)."""
        return None

    def stream_refusal(self) -> str | None:
        """Why this stack cannot thread its layers' states from one call to the next (so a model built
        on it cannot continue a sequence), or None when it can."""
        if self.keeps_state:
            return None
        return f"stack {self.registry_name!r} keeps no state between calls" + (
            f": {self.no_state_reason}" if self.no_state_reason else ""
        )

    def checkpoint_refusal(self) -> str | None:
        """Why activation checkpointing (``zoo.stacks.checkpointing``: each block's forward, or its attention
        sub-layer, run again in backward) cannot apply to this stack, or None when it can: the stack then calls
        each block of ``block_applications`` through ``Block.forward``."""
        return None

    def context_refusal(self) -> str | None:
        """Why this stack cannot run on a chunk of a sequence split over ranks (``zoo.parallel``), or None
        when it can: its blocks then see the chunk through ``zoo.parallel.chunk.active_chunk``."""
        return f"stack {self.registry_name!r} does not say that it runs on a chunk of a sequence split over ranks"

    def check_state(self, state: list[Any] | None) -> list[Any]:
        if state is None:
            return [None] * self.n_layers
        if not isinstance(state, (list, tuple)) or len(state) != self.n_layers:
            length = len(state) if hasattr(state, "__len__") else "?"
            raise ValueError(
                f"stack {self.registry_name!r}: state must be a list with one entry per layer "
                f"({self.n_layers}); got {type(state).__name__} of length {length}"
            )
        return list(state)


STACK: Registry[type[Stack]] = Registry("stack", Stack)
