"""The layer skeleton shared by ``deltanet``, ``gated_deltanet`` and ``mamba2`` (nothing registers here):
projections -> short causal convolution -> a matrix-state recurrence (``delta_chunks.py``) -> read-out.

A subclass says what its projections give (:meth:`StateMixer.project`: what goes through the convolution
and what does not), how the recurrence's q, k, v, beta and log-decay g come out of them
(:meth:`StateMixer.recurrence_inputs`) and how its output is read out (:meth:`StateMixer.read_out`). This
class runs the rest under the zoo's contracts:

- training runs the chunkwise-parallel form (``chunk_size`` positions a chunk, no t x t matrix);
- streaming (:class:`MixerState`): the convolution's last ``conv_size - 1`` inputs and the matrix state S
  [b, h, k, e], both of constant size: ``state_bound`` is conv_size - 1 (the tokens the convolution tail
  remembers; the matrix remembers no token). A segment shorter than a chunk (decoding) runs the recurrent
  form, a longer one the chunk form, from the state either way;
- padding: a padded position's convolution input is zeroed, and its key and log-decay are zero, so it
  neither reads nor updates the state (beta times a zero key; decay exp(0) = 1);
- context parallelism: the convolution reads its halo from the earlier ranks, the matrix state is handed
  on as an exclusive scan of affine maps (``delta_chunks.delta_rule_over_ranks``);
- positions: none inside (the convolution and the decay order the tokens); rope, alibi and t5_bias are
  refused with the reason.

Shapes: x [b, t, d]; q, k [b, h, t, k]; v [b, h, t, e]; beta, g [b, h, t]; S [b, h, k, e].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from zoo.attention.base import Attention, AttnOutput, KeysPerQuery, StateContract, dense_keys
from zoo.attention.delta_chunks import delta_rule, delta_rule_over_ranks
from zoo.attention.documents import packed_segments
from zoo.attention.short_conv import ShortConv, conv_over_ranks


@dataclass
class MixerState:
    """A stream's state, detached: ``conv`` [b, conv_size - 1, c], the convolution's last inputs (None
    without a convolution); ``memory`` [b, h, k, e], the recurrence's matrix S; ``seen``: tokens so far;
    ``window``: conv_size - 1, the tokens the convolution tail holds once it is full."""

    conv: Tensor | None = None
    memory: Tensor | None = None
    seen: int = 0
    window: int = 0

    @property
    def length(self) -> int:
        return min(self.seen, self.window)


@dataclass
class RecurrenceInputs:
    """What the recurrence reads: q, k [b, h, t, k], v [b, h, t, e], beta [b, h, t] or None (no delta rule),
    g [b, h, t] or None (no decay), the log of the decay a_t."""

    q: Tensor
    k: Tensor
    v: Tensor
    beta: Tensor | None
    g: Tensor | None

    def masked(self, pad_mask: Tensor | None) -> RecurrenceInputs:
        """Padded positions neither update nor decay the state: k = 0 (so nothing is written) and g = 0."""
        if pad_mask is None:
            return self
        real = pad_mask[:, None, :]  # [b, 1, t]
        k = torch.where(real[..., None], self.k, 0.0)
        g = None if self.g is None else torch.where(real, self.g, 0.0)
        return RecurrenceInputs(self.q, k, self.v, self.beta, g)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension, in at least float32 (a float32 island
    under bf16: the mean of squares)."""
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    return (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps) * weight).to(x.dtype)


class StateMixer(Attention):
    """Base of the matrix-state mechanisms (module docstring). Subclasses set ``self.conv`` (a
    :class:`ShortConv` or None) and implement ``project``, ``recurrence_inputs`` and ``read_out``; their
    Options carry ``chunk_size`` and ``conv_size``."""

    packs_documents = True  # the short convolution and the state both restart at every document

    causal_only = True  # the papers give these recurrences causal forms only
    supports_memory = True
    position_kinds = ()
    no_position_reason = (
        "it forms no score per query-key pair to rotate or bias: the order of the tokens enters through its "
        "short convolution and its decay (the papers use no position encoding)"
    )
    # read by the projection options (grouped keys, qk_norm, softcap) where the base class offers them
    no_projection_reason = (
        "its q, k, v come from its own projections through a short convolution and k is L2-normalised by the "
        "paper; grouped keys/values, qk_norm and softcap are not defined for it"
    )

    @classmethod
    def contract_options(cls) -> dict[str, Any]:
        return {"chunk_size": 4, "conv_size": 4}  # chunks of 4: the contract lengths cross chunk boundaries

    @classmethod
    def contract_state(cls) -> StateContract:
        return StateContract(bound=cls.contract_options()["conv_size"] - 1)

    def state_bound(self) -> int:
        return self.conv.size - 1 if self.conv is not None else 0

    def init_state(self, batch_size: int) -> MixerState:
        super().init_state(batch_size)
        return MixerState(window=self.state_bound())

    def keys_per_query(self, t: int) -> KeysPerQuery:
        keys = dense_keys(t, True)
        return KeysPerQuery(keys.keys, f"{keys.rule}, through the matrix state (no score per key)")

    # -- what a subclass says --------------------------------------------------------------------------
    def project(self, x: Tensor) -> tuple[Tensor, Any]:
        """x [b, t, d] -> (what goes through the short convolution [b, t, c], what does not)."""
        raise NotImplementedError

    def recurrence_inputs(self, mixed: Tensor, rest: Any) -> RecurrenceInputs:
        """The convolution's output [b, t, c] (its input when there is none) and the rest -> the recurrence's
        inputs, the query already scaled."""
        raise NotImplementedError

    def read_out(self, o: Tensor, mixed: Tensor, rest: Any) -> Tensor:
        """The recurrence's output o [b, h, t, e] -> the layer's [b, t, d]."""
        raise NotImplementedError

    # -- the contracts ---------------------------------------------------------------------------------
    def conv_input(self, x: Tensor, pad_mask: Tensor | None) -> tuple[Tensor, Any]:
        mixed, rest = self.project(x)
        if pad_mask is not None:  # a padded position's input is never read by a later convolution
            mixed = torch.where(pad_mask[..., None], mixed, 0.0)
        return mixed, rest

    def forward(
        self,
        x: Tensor,
        *,
        context: Tensor | None = None,
        pad_mask: Tensor | None = None,
        state=None,
        documents: Tensor | None = None,
    ) -> AttnOutput:
        """``documents`` [b, t] (packed rows): the convolution's taps and the matrix state stay inside each
        document (``ShortConv``'s masked taps, the kernels' ``segments``)."""
        self.check_inputs(x, context, pad_mask, state)
        segments = packed_segments(self, documents, x, state)
        if state is not None and state.memory is not None and state.memory.shape[0] != x.shape[0]:
            raise ValueError(
                f"{self.registry_name}: the state holds batch size {state.memory.shape[0]}, the input has {x.shape[0]}"
            )
        mixed, rest = self.conv_input(x, pad_mask)
        tail = None
        if self.conv is not None:
            mixed, tail = self.conv(mixed, None if state is None else state.conv, documents)
        inputs = self.recurrence_inputs(mixed, rest).masked(pad_mask)
        memory = None if state is None else state.memory
        q, k, v, beta, g = inputs.q, inputs.k, inputs.v, inputs.beta, inputs.g
        o, memory = delta_rule(q, k, v, beta, g, memory, self.options.chunk_size, segments)
        new_state = None
        if state is not None:
            tail = None if tail is None else tail.detach()
            new_state = MixerState(tail, memory.detach(), state.seen + x.shape[1], state.window)
        return AttnOutput(self.read_out(o, mixed, rest), state=new_state)

    # -- context parallelism (zoo/parallel) ------------------------------------------------------------
    def context_refusal(self) -> str | None:
        return None

    def attend_chunk(self, x: Tensor, chunk, *, pad_mask: Tensor | None = None, state=None, **kwargs) -> AttnOutput:
        """This rank's part of a sequence split over a context group: the convolution reads the conv_size - 1
        inputs before the part from the earlier ranks; the matrix state before the part is composed from the
        earlier ranks' affine maps (``delta_chunks.delta_rule_over_ranks``), so the result equals one
        process's, gradients included."""
        self.check_inputs(x, None, pad_mask, None)
        self.refuse_chunk_state(state)
        mixed, rest = self.conv_input(x, pad_mask)
        if self.conv is not None:
            mixed = conv_over_ranks(self.conv, mixed, chunk)
        inputs = self.recurrence_inputs(mixed, rest).masked(pad_mask)
        o = delta_rule_over_ranks(inputs.q, inputs.k, inputs.v, inputs.beta, inputs.g, chunk, self.options.chunk_size)
        return AttnOutput(self.read_out(o, mixed, rest))


def short_conv(channels: int, options: Any, bias: bool = False) -> ShortConv | None:
    """The layer's short convolution from its options (``use_short_conv`` where it has one, ``conv_size``)."""
    if not getattr(options, "use_short_conv", True):
        return None
    return ShortConv(channels, options.conv_size, bias=bias)
