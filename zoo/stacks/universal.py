"""The Universal Transformer stack, with optional Adaptive Computation Time halting.

Papers: "Universal Transformers", Dehghani et al. 2019, arXiv:1807.03819 (Section 2, eqs. 1-5);
"Adaptive Computation Time for Recurrent Neural Networks", Graves 2016, arXiv:1603.08983
(Section 2, eqs. 5-14).

One block (any registered attention, any residual; its feed-forward part is the paper's transition
function: ``feed_forward=mlp`` its position-wise network, ``feed_forward=sepconv`` its separable
convolution, or any other part of the feed-forward axis) is applied T times with shared weights.
Before every step the coordinate signal P^t is added (paper, eq. 3):

    P^t[i, 2j] = sin(i / 10000^(2j/d)) + sin(t / 10000^(2j/d))
    P^t[i, 2j+1] = cos(i / 10000^(2j/d)) + cos(t / 10000^(2j/d))

i.e. the sinusoid of the position i plus the sinusoid of the step t (1-based). With
``random_offset_max = R > 0`` (the paper's randomised position offsets for the algorithmic tasks,
Section 3.3), training positions start at a random u_b in 0..R per sequence, drawn once per forward
(torch's global generator, so ``torch.manual_seed`` fixes it) and used by every step: P^t[i] reads
position i + u_b. Evaluation uses u = 0. The stack is then
the one owner of the position signal: the builder refuses a model ``position`` other than ``none``
beside ``position_signal=True`` (positions would be added twice), so the presets set ``none``.

Step t runs the shared block as layer t - 1 (``Block.at_depth``), so depth-dependent mechanisms
(interleaved sparse patterns, LSH's per-layer rotations) vary with the step as they would with
depth in a sequential stack, and per-step stats come back as ``layer<t-1>/...``.

ACT (``act=True``, Graves 2016 applied per position as in the paper, Section 2.2). At step n a
position's new state s^n = block(s^{n-1} + P^n) gets a halting probability
h^n = sigmoid(W_h s^n + b_h). It halts at N = min{n : h^1 + ... + h^n >= 1 - epsilon} or at
``max_steps``; its step weights are p^n = h^n for n < N and the remainder R = 1 - (h^1 + ... +
h^{N-1}) at n = N, so they sum to one. The output is the mean-field average sum_n p^n s^n. After it
halts a position's state is copied forward unchanged (it still serves as a key/value for the
positions that keep going). The ponder cost tau * mean(N + R) over real positions is returned as
the aux loss ``ponder`` (already weighted; only R carries a gradient, into the halting unit).

Compute is really saved: a batch row whose positions have all halted is dropped from the
sub-batch the block runs on, so later steps cost only the rows still running. ``act/steps_executed``
reports the block applications actually made per row, beside the mean/max of N.

Deviations:
- The halting unit reads the state after the step (Graves's s^n); tensor2tensor's UT reads the
  state before the transition. Both give every position at least one step.
- tensor2tensor's ``position_start_index="random"`` draws one shift for the whole batch, up to the
  sequence length, anew at every step; we draw one per sequence, up to ``random_offset_max``, kept
  across the steps, so a position keeps one signal through the recurrence (the paper's intent).
- tensor2tensor keeps updating halted positions' states and mixes outputs as
  s' = w * new + (1 - w) * s'; we follow the paper's text (copy forward) and Graves's mean field.
- State across calls (fixed depth, ``act=false``, a position-wise feed-forward): step n's attention sees the
  earlier tokens' step-n inputs, so the shared block keeps one cache per step (:class:`UniversalState`,
  with where the stream stands, which numbers the position signal) and a stream continues exactly. With
  ACT, each earlier position halts at its own step, and its step-n keys are those of its state frozen at
  halting, which these per-step caches do not hold, so ACT refuses a state, saying so; the separable-
  convolution feed-forward (``feed_forward=sepconv``) refuses for itself (it reads the kernel's earlier
  positions at every step, which no attention cache holds).

Shapes: x [b, t, d]; pad_mask [b, t] bool (True = real); context [b, c, d]; per-position maps [b, t].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.blocks import Block, merge_into, prefixed
from zoo.config import require
from zoo.position.base import check_random_offset_max, sinusoid_table
from zoo.precision import float32
from zoo.stacks.base import STACK, BlockFactory, Stack, StackOutput


@dataclass
class ACTTrace:
    """What one ACT forward did, step by step (recorded only when ``stack.trace = True``; tests and
    plots read it). Lists have one entry per executed step; tensors are detached, full batch."""

    weights: list[Tensor] = field(default_factory=list)  # [b, t] p^n (0 for positions not running)
    states: list[Tensor] = field(default_factory=list)  # [b, t, d] state after step n
    halted: list[Tensor] = field(default_factory=list)  # [b, t] bool, halted after step n
    rows: list[int] = field(default_factory=list)  # batch rows the block ran on at step n
    steps: Tensor | None = None  # [b, t] N per position (0 for padding)
    remainder: Tensor | None = None  # [b, t] R per position


@dataclass
class UniversalState:
    """A fixed-depth stream's state: the shared block's state at every step (its caches of the earlier
    tokens' step-n inputs), and ``offset``, the position of the next token (the position signal's)."""

    steps: list[Any]
    offset: int = 0


@STACK.register("universal")
class UniversalStack(Stack):
    """``n_layers`` is T, the number of steps (and the step limit under ACT unless ``max_steps``)."""

    no_packing_reason = (
        "adds its own position and timestep signal at every step, numbered along the row rather than from each "
        "packed document's start"
    )

    def stream_refusal(self) -> str | None:
        """Fixed depth streams (one cache per step); ACT refuses (module notes)."""
        if self.options.act:
            return (
                "stack 'universal' keeps no state between calls with act=true: each earlier position halts at its "
                "own step and later steps read its state frozen there, which its per-step caches do not hold "
                "(act=false streams)"
            )
        return None  # a feed-forward part that cannot stream (sepconv) refuses for itself (Block asks it)

    def left_padding_refusal(self) -> str:
        return (
            "stack 'universal' adds its own position and timestep signal, numbered from where the stream stands "
            "and not from each row's first real token, so a left-padded row would be numbered unlike its prompt alone"
        )

    def context_refusal(self) -> str:
        return (
            "stack 'universal' adds its own position signal, numbered from each call's first token, so a chunk of "
            "a sequence split over ranks would be numbered from 0"
        )

    @dataclass
    class Options:
        act: bool = False  # per-position halting (Graves 2016)
        max_steps: int | None = None  # ACT step limit; None = n_layers
        epsilon: float = 0.01  # halt once the cumulative halting probability reaches 1 - epsilon
        ponder_weight: float = 0.01  # tau: weight of the ponder cost in the aux loss
        halting_bias: float = 1.0  # initial b_h (tensor2tensor's act_halting_bias_init)
        position_signal: bool = True  # add the position sinusoid before each step
        timestep_signal: bool = True  # add the step sinusoid before each step
        random_offset_max: int = 0  # training positions start at a random 0..R (Dehghani et al. 2019)

        def __post_init__(self) -> None:
            require(
                self.max_steps is None or (isinstance(self.max_steps, int) and self.max_steps >= 1),
                f"max_steps must be an int >= 1 (or None = n_layers), got {self.max_steps!r}",
            )
            require(
                0.0 < self.epsilon < 1.0,
                f"epsilon must lie in (0, 1) (halting threshold is 1 - epsilon), got {self.epsilon}",
            )
            require(self.ponder_weight >= 0.0, f"ponder_weight (tau) must be >= 0, got {self.ponder_weight}")
            check_random_offset_max(self.random_offset_max)
            require(
                self.position_signal or not self.random_offset_max,
                f"random_offset_max={self.random_offset_max} shifts the stack's position signal, which "
                "position_signal=false turns off; set position_signal=true or random_offset_max=0",
            )

    def __init__(self, make_block: BlockFactory, n_layers: int, d_model: int, **options: Any):
        super().__init__(make_block, n_layers, d_model, **options)
        self.block = make_block(0)  # shared by every step; step n runs it as layer n - 1 (at_depth)
        self.steps = self.options.max_steps if (self.options.act and self.options.max_steps) else n_layers
        if self.options.act:
            self.halting = nn.Linear(d_model, 1)
            nn.init.zeros_(self.halting.weight)  # start from the bias alone: equal pondering everywhere
            nn.init.constant_(self.halting.bias, self.options.halting_bias)
        self.trace = False
        self.last_trace: ACTTrace | None = None

    @classmethod
    def contract_variants(cls) -> list[dict[str, Any]]:
        return [{}, {"act": True, "halting_bias": -1.0}]

    def block_applications(self) -> list[Block]:
        return [self.block] * self.steps  # under ACT an upper bound: halted rows leave the batch

    def layer_blocks(self) -> None:
        return None  # one block re-applied: its outputs are steps of one layer, not layers

    def kept_layers(self) -> int:
        return self.steps

    def recompute_passes(self) -> float:
        return 0.0

    @classmethod
    def adds_position_signal(cls, options: dict[str, Any]) -> bool:
        return bool(options.get("position_signal", cls.Options.position_signal))

    def init_state(self, batch_size: int) -> UniversalState | None:
        if self.stream_refusal() is not None:
            return None  # the model refuses a stream, saying why
        steps = [self.block.init_state(batch_size) for _ in range(self.steps)]
        return None if all(s is None for s in steps) else UniversalState(steps)

    def check_state(self, state: UniversalState | None) -> UniversalState | None:
        if state is None:
            return None
        reason = self.stream_refusal()
        if reason is not None:
            raise ValueError(f"{reason}; call with state=None (models recompute the prefix when decoding)")
        if not isinstance(state, UniversalState) or len(state.steps) != self.steps:
            raise ValueError(
                f"stack 'universal': state must be the UniversalState of {self.steps} steps it returned; "
                f"got {type(state).__name__}"
            )
        return state

    def draw_offsets(self, b: int, device: torch.device) -> Tensor | None:
        """Per-sequence start positions u [b, 1] for this forward (training with random_offset_max > 0),
        else None (positions start at 0)."""
        if not (self.training and self.options.random_offset_max):
            return None
        return torch.randint(0, self.options.random_offset_max + 1, (b, 1)).to(device)

    def signal(
        self, t: int, step: int, device: torch.device, dtype: torch.dtype, offsets: Tensor | None = None
    ) -> Tensor:
        """P^step for positions u + 0 .. u + t - 1: [t, d], or [b, t, d] with per-sequence ``offsets``
        u [b, 1] (zeros when both signals are off)."""
        out = torch.zeros(t, self.d_model, device=device, dtype=dtype)
        if self.options.position_signal:
            positions = torch.arange(t, device=device)
            if offsets is not None:
                positions = (positions + offsets).flatten()  # [b * t]
            table = sinusoid_table(positions, self.d_model, dtype=dtype)
            out = out + (table if offsets is None else table.view(-1, t, self.d_model))
        if self.options.timestep_signal:
            out = out + sinusoid_table(torch.tensor([float(step)], device=device), self.d_model, dtype=dtype)
        return out

    def forward(
        self,
        x: Tensor,
        *,
        pad_mask: Tensor | None = None,
        state: list[Any] | None = None,
        context: Tensor | None = None,
        context_pad_mask: Tensor | None = None,
    ) -> StackOutput:
        state = self.check_state(state)
        if self.options.act:
            return self._forward_act(x, pad_mask, context, context_pad_mask)
        aux: dict[str, Tensor] = {}
        stats: dict[str, Tensor] = {}
        offsets = self.draw_offsets(x.shape[0], x.device)  # one draw, kept by every step
        if state is not None and state.offset:  # a stream: the signal continues where it stands
            offsets = (0 if offsets is None else offsets) + torch.full((x.shape[0], 1), state.offset, device=x.device)
        new_steps = []
        for step in range(1, self.steps + 1):
            with self.block.at_depth(step - 1):
                out = self.block(
                    x + self.signal(x.shape[1], step, x.device, x.dtype, offsets),
                    pad_mask=pad_mask,
                    state=state.steps[step - 1] if state is not None else None,
                    context=context,
                    context_pad_mask=context_pad_mask,
                )
            x = out.x
            new_steps.append(out.state)
            merge_into(aux, out.aux)
            stats.update(prefixed(f"layer{step - 1}", out.stats))
        stats["universal/steps"] = torch.tensor(float(self.steps))
        new_state = None if state is None else UniversalState(new_steps, state.offset + x.shape[1])
        return StackOutput(x, new_state, aux, stats)

    def _forward_act(
        self, x: Tensor, pad_mask: Tensor | None, context: Tensor | None, context_pad_mask: Tensor | None
    ) -> StackOutput:
        b, t, _ = x.shape
        device = x.device
        threshold = 1.0 - self.options.epsilon
        real = pad_mask if pad_mask is not None else torch.ones(b, t, dtype=torch.bool, device=device)
        state = x
        output = torch.zeros_like(x)  # mean-field sum_n p^n s^n
        cumulative = torch.zeros(b, t, device=device)  # h^1 + ... + h^n of the steps before halting
        remainder = torch.zeros(b, t, device=device)
        steps = torch.zeros(b, t, device=device)  # N per position
        halted = ~real  # padding never runs: it must not keep its row alive
        executed = torch.zeros(b, device=device)  # block applications per row
        aux: dict[str, Tensor] = {}
        stats: dict[str, Tensor] = {}
        trace = ACTTrace() if self.trace else None
        offsets = self.draw_offsets(b, device)  # one draw, kept by every step
        for step in range(1, self.steps + 1):
            active = ~halted.all(dim=1)  # [b]: rows with a position still running
            if not bool(active.any()):
                break
            full = bool(active.all())
            rows = None if full else active.nonzero().squeeze(1)

            def pick(v: Tensor | None, rows: Tensor | None = rows) -> Tensor | None:
                return v if rows is None or v is None else v.index_select(0, rows)

            s_in = pick(state)
            with self.block.at_depth(step - 1):
                out = self.block(
                    s_in + self.signal(t, step, device, x.dtype, pick(offsets)),
                    pad_mask=pick(pad_mask),
                    context=pick(context),
                    context_pad_mask=pick(context_pad_mask),
                )
            merge_into(aux, out.aux)
            stats.update(prefixed(f"layer{step - 1}", out.stats))
            new = out.x  # [r, t, d]
            # float32: halting compares h^1 + ... + h^n with 1 - epsilon (0.99); in bf16 each h would
            # move by up to 2^-9 and decide one step more or fewer than the same logits in float32
            with float32(new, self.halting.weight, self.halting.bias) as (s_n, w_h, b_h):
                h = torch.sigmoid(F.linear(s_n, w_h, b_h)).squeeze(-1).float()  # [r, t]
            running = ~pick(halted)
            cum = pick(cumulative)
            if step == self.steps:
                stop = running  # the step limit: every running position halts here
            else:
                stop = running & (cum + h >= threshold)
            go_on = running & ~stop
            rem = 1.0 - cum  # R for the positions halting now
            weight = torch.where(go_on, h, torch.where(stop, rem, torch.zeros_like(h)))
            # halted positions keep their state; running ones take the new one
            kept = torch.where(running[..., None], new, s_in)
            contribution = weight[..., None].to(new.dtype) * new
            new_cum = cum + torch.where(go_on, h, torch.zeros_like(h))
            new_rem = torch.where(stop, rem, pick(remainder))
            new_steps = pick(steps) + running.float()
            new_halted = pick(halted) | stop
            if full:
                state, output, cumulative, remainder, steps, halted = (
                    kept,
                    output + contribution,
                    new_cum,
                    new_rem,
                    new_steps,
                    new_halted,
                )
            else:
                state = state.index_copy(0, rows, kept)
                output = output.index_add(0, rows, contribution)
                cumulative = cumulative.index_copy(0, rows, new_cum)
                remainder = remainder.index_copy(0, rows, new_rem)
                steps = steps.index_copy(0, rows, new_steps)
                halted = halted.index_copy(0, rows, new_halted)
            executed = executed + active.float()
            if trace is not None:
                full_weight = torch.zeros(b, t, device=device)
                full_weight[active] = weight.detach()
                trace.weights.append(full_weight)
                trace.states.append(state.detach().clone())
                trace.halted.append(halted.clone())
                trace.rows.append(int(active.sum()))
        # padding was never updated: pass its input through
        output = torch.where(real[..., None], output, x)
        n_real = real.float().sum().clamp_min(1.0)
        ponder = ((steps + remainder) * real.float()).sum() / n_real
        merge_into(aux, {"ponder": self.options.ponder_weight * ponder})
        real_steps = steps[real] if bool(real.any()) else steps.new_zeros(1)
        stats.update(
            {
                "act/steps_mean": real_steps.mean().detach(),
                "act/steps_max": real_steps.max().detach(),
                "act/steps": steps.detach(),  # [b, t] per-position N (0 = padding)
                "act/ponder": ponder.detach(),
                "act/steps_executed": executed.mean().detach(),  # block applications per row, really run
                "act/compute_fraction": (executed.sum() / (b * self.steps)).detach(),
            }
        )
        if trace is not None:
            trace.steps, trace.remainder = steps.detach(), remainder.detach()
            self.last_trace = trace
        return StackOutput(output, None, aux, stats)
