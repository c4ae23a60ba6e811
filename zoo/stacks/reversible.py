"""Reversible residual stack: activations stored once, not once per layer.

Papers: "The Reversible Residual Network: Backpropagation Without Storing Activations", Gomez,
Ren, Urtasun & Grosse 2017, arXiv:1707.04585; applied to the Transformer in "Reformer: The
Efficient Transformer", Kitaev, Kaiser & Levskaya 2020, arXiv:2001.04451, Section 3.

Each block's two additive residual branches, F = attention and G = feed-forward, couple two
streams::

    y1 = x1 + F(x2)          x2 = y2 - G(y1)     (backward: inputs recovered from outputs)
    y2 = x2 + G(y1)          x1 = y1 - F(x2)

The forward pass runs under ``no_grad`` and keeps only the last layer's (y1, y2); backward walks
the layers from the top, recomputing each layer's branches to rebuild its inputs and taking their
gradients one layer at a time. So the activations held for backward do not grow with depth.

- Dropout (and anything else drawing random numbers) repeats exactly: the CPU/CUDA RNG state at
  the start of each branch is recorded in forward and restored for its recomputation.
- Mixed precision repeats too: backward recomputes each branch under the autocast state the
  forward ran in (:class:`zoo.precision.AutocastState`, replayed by :class:`zoo.attention.recompute.Replaying`, as
  every recomputation in the zoo is); recomputed in float32, a bf16 forward's
  inputs would be rebuilt from other branch values and the gradients taken of another function.
- Chunked feed-forward: G is position-wise (a part that is not is refused), so when ``chunk_size`` is set it is
  applied chunk by chunk along the sequence in forward *and* recomputed and differentiated chunk
  by chunk in backward: its [b, t, d_ff] activation never exists for the whole sequence.
- Gradients of the parameters are returned by the autograd function (they are its inputs), so
  both ``loss.backward()`` and ``torch.autograd.grad`` work.
- Auxiliary losses (a mechanism's ``AttnOutput.aux``) are extra outputs of the autograd function,
  one per layer and name; backward recomputes them with their layer's F and pushes their
  gradient in with F's, so they train exactly as in the stored-activation run. Stats come back
  per layer (``layer<i>/attn/<name>``) as in every stack.
- The stack only uses the block's public additive view (``Block.additive``, ``attention_branch``,
  ``feed_forward_branch``, ``feed_forward_slices``, ``branch_parameters``).

Deviations: the streams start as two copies of the input (as the paper does) and the stack
returns their mean (y1 + y2) / 2, so its width stays d_model. Refused at build time, with the
reason: residuals that are not additive (post_norm, gru_gate: the branch cannot be subtracted),
attention that carries memory from one training segment to the next (``carries_segment_memory``:
recomputation would replay a memory that has moved on) and cross-attention blocks. Decoding
caches are threaded without gradients (generation, evaluation: nothing is recomputed then) and
refused with them. ``recompute=False`` runs the same coupling with ordinary autograd (stores every
layer's activations): the reference the tests compare with.

Shapes: x [b, t, d]; pad_mask [b, t] bool (True = real).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from zoo.attention.recompute import Replaying
from zoo.blocks import Block, merge_into, prefixed
from zoo.parallel.chunk import active_chunk
from zoo.precision import AutocastState
from zoo.stacks.base import STACK, BlockFactory, Stack, StackOutput


def check_reversible_block(block: Block, layer_index: int) -> None:
    """Refuse, with the reason, a block the reversible coupling cannot invert or replay."""
    if block.has_cross:
        raise ValueError(
            "stack 'reversible' supports blocks without cross-attention (decoder-only LM, encoder); "
            "use stack=sequential for the seq2seq decoder"
        )
    if block.carries_segment_memory:
        raise ValueError(
            f"stack 'reversible' cannot hold layer {layer_index} ({block.describe()}): its attention carries memory "
            "from one training segment to the next (carries_segment_memory), and recomputing a layer in backward "
            "would replay it against a memory that has moved on; use an attention without segment memory (e.g. lsh, "
            "shared_qk, vanilla without max_cache) or stack=sequential"
        )
    if not block.feed_forward.position_wise:
        raise ValueError(
            f"stack 'reversible' cannot hold layer {layer_index}: feed_forward {block.feed_forward.registry_name!r} "
            "reads neighbouring positions, and the reversible coupling runs the feed-forward branch on slices of "
            "positions without the padding mask; use a position-wise feed-forward (mlp, swiglu, ...) or "
            "stack=sequential"
        )
    if not block.additive:
        raise ValueError(
            f"stack 'reversible' needs additive residuals (y = x + branch(x)) to recover a layer's input from its "
            f"output; layer {layer_index} ({block.describe()}) is not (it normalises or gates after the addition); "
            "use an additive residual such as pre_norm or rezero"
        )


class _RNG:
    """The RNG state(s) a branch starts from, so its recomputation draws the same numbers."""

    def __init__(self, device: torch.device):
        self.cpu = torch.get_rng_state()
        self.device = device if device.type == "cuda" else None
        self.cuda = torch.cuda.get_rng_state(device) if self.device is not None else None

    def fork(self):
        devices = [self.device] if self.device is not None else []
        return torch.random.fork_rng(devices=devices)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.device is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


def feed_forward_branch(block: Block, y: Tensor) -> Tensor:
    """G(y), slice by slice along the sequence (the same slicing as the backward recompute, so
    dropout draws its masks in the same order)."""
    pieces = [block.feed_forward_branch(y[:, part]) for part in block.feed_forward_slices(y.shape[1])]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)


@STACK.register("reversible")
class ReversibleStack(Stack):
    # threads its layers' decoding caches without gradients (generation, evaluation); with gradients
    # the recomputation in backward would replay a cache that has moved on, so a state is refused then
    keeps_state = True
    supports_cross = False
    needs_additive = True
    packs_documents = True  # the forward and the recomputing backward give every branch the same documents

    @dataclass
    class Options:
        recompute: bool = True  # False: same coupling, plain autograd (stores activations; test reference)

    @classmethod
    def contract_variants(cls) -> list[dict[str, Any]]:
        return [{}, {"recompute": False}]

    def __init__(self, make_block: BlockFactory, n_layers: int, d_model: int, **options):
        super().__init__(make_block, n_layers, d_model, **options)
        self.blocks = nn.ModuleList(make_block(i) for i in range(n_layers))
        for i, block in enumerate(self.blocks):
            check_reversible_block(block, i)

    def block_applications(self) -> list[Block]:
        return list(self.blocks)

    def layer_blocks(self) -> None:
        return None  # the layers run as their two branches (attention_branch, feed_forward_branch), never forward

    def kept_layers(self) -> int:
        return 1 if self.options.recompute else self.n_layers  # the last layer's (y1, y2) only

    def recompute_passes(self) -> float:
        return 1.0 if self.options.recompute else 0.0  # backward runs every layer's branches again

    def checkpoint_refusal(self) -> str:
        return (
            "stack 'reversible' recomputes every layer in backward already (it keeps one layer's activations "
            "and rebuilds each layer's input from its output), running its blocks as two branches inside its own "
            "autograd function, so there is nothing for activation checkpointing to recompute"
        )

    def context_refusal(self) -> None:
        return None  # backward recomputes each layer's attention over the forward's chunk (kept with its RNG)

    def forward(
        self,
        x: Tensor,
        *,
        pad_mask: Tensor | None = None,
        state: list[Any] | None = None,
        context: Tensor | None = None,
        context_pad_mask: Tensor | None = None,
        documents: Tensor | None = None,
    ) -> StackOutput:
        masks = {"pad_mask": pad_mask, "documents": documents}  # what every attention branch is called with
        states = self.check_state(state)
        threading = any(s is not None for s in states)
        if threading and self.options.recompute and torch.is_grad_enabled():
            raise ValueError(
                "stack 'reversible' threads a state only without gradients (generation, evaluation under "
                "torch.no_grad()): with gradients it recomputes each layer in backward, which would replay the "
                "layer against a cache that has moved on"
            )
        if context is not None:
            raise ValueError("stack 'reversible' has no cross-attention: context must be None")
        stats: dict[str, Tensor] = {}
        aux: dict[str, Tensor] = {}
        new_states: list[Any] = []
        if self.options.recompute and torch.is_grad_enabled():
            aux_names: list[str] = []  # filled by the forward: the name of each extra output
            y1, y2, *aux_values = _ReversibleFunction.apply(x, x, self, masks, stats, aux_names, *self.parameters())
            for name, value in zip(aux_names, aux_values):
                merge_into(aux, {name: value})
        else:
            y1, y2 = x, x
            for i, (block, layer_state) in enumerate(zip(self.blocks, states)):
                f, layer_aux, layer_stats, new_state = block.attention_branch(y2, state=layer_state, **masks)
                y1 = y1 + f
                y2 = y2 + feed_forward_branch(block, y1)
                merge_into(aux, layer_aux)
                stats.update(prefixed(f"layer{i}", layer_stats))
                new_states.append(new_state)
        carried = new_states if any(s is not None for s in new_states) else None
        return StackOutput((y1 + y2) / 2, carried, aux, stats)

    def init_state(self, batch_size: int) -> list[Any] | None:
        states = [block.init_state(batch_size) for block in self.blocks]
        return None if all(s is None for s in states) else states


class _ReversibleFunction(torch.autograd.Function):
    """(x1, x2, parameters) -> (y1, y2, one scalar per layer and aux loss), storing only (y1, y2)."""

    @staticmethod
    def forward(
        ctx,
        x1: Tensor,
        x2: Tensor,
        stack: ReversibleStack,
        masks: dict[str, Tensor | None],
        stats: dict,
        aux_names: list[str],
        *params: Tensor,
    ):
        rng: list[tuple[_RNG, _RNG]] = []
        aux_values: list[Tensor] = []
        layer_aux_counts: list[int] = []
        with torch.no_grad():
            for i, block in enumerate(stack.blocks):
                f_rng = _RNG(x1.device)
                f, layer_aux, layer_stats, _ = block.attention_branch(x2, **masks)
                x1 = x1 + f
                g_rng = _RNG(x1.device)
                x2 = x2 + feed_forward_branch(block, x1)
                rng.append((f_rng, g_rng))
                stats.update({key: value.detach() for key, value in prefixed(f"layer{i}", layer_stats).items()})
                aux_names.extend(layer_aux)
                aux_values.extend(layer_aux.values())
                layer_aux_counts.append(len(layer_aux))
        ctx.stack, ctx.masks, ctx.rng, ctx.layer_aux_counts = stack, masks, rng, layer_aux_counts
        ctx.chunk = active_chunk()  # a sequence split over ranks (zoo/parallel): recomputed over the same chunk
        ctx.autocast = AutocastState.now(x1.device)  # backward runs outside autocast: replayed there
        ctx.save_for_backward(x1, x2)  # the only activations kept: the last layer's outputs
        return (x1, x2, *aux_values)

    @staticmethod
    def backward(ctx, dy1: Tensor, dy2: Tensor, *d_aux: Tensor):
        stack: ReversibleStack = ctx.stack
        y1, y2 = ctx.saved_tensors
        index = {id(p): i for i, p in enumerate(stack.parameters())}
        grads: list[Tensor | None] = [None] * len(index)
        # the aux gradients of each layer, in layer order
        ends = torch.tensor([0, *ctx.layer_aux_counts]).cumsum(0).tolist()
        layer_d_aux = [d_aux[ends[i] : ends[i + 1]] for i in range(len(stack.blocks))]

        def accumulate(params: list[Tensor], new: tuple[Tensor | None, ...]) -> None:
            for p, g in zip(params, new):
                if g is not None:
                    i = index[id(p)]
                    grads[i] = g if grads[i] is None else grads[i] + g

        y1, y2 = y1.detach(), y2.detach()
        layers = zip(reversed(stack.blocks), reversed(ctx.rng), reversed(layer_d_aux))
        for block, (f_rng, g_rng), d_layer_aux in layers:
            # G: recover x2 = y2 - G(y1) and push dy2 through G, one sequence slice at a time
            g_params = [p for p in block.branch_parameters("feed_forward") if p.requires_grad]
            x2_pieces, dy1_pieces = [], []
            with g_rng.fork():
                g_rng.restore()
                for part in block.feed_forward_slices(y1.shape[1]):
                    with torch.enable_grad():
                        y1_piece = y1[:, part].detach().requires_grad_(True)
                        with Replaying(ctx.autocast):
                            g = block.feed_forward_branch(y1_piece)
                        d = torch.autograd.grad(g, [y1_piece, *g_params], dy2[:, part], allow_unused=True)
                    x2_pieces.append(y2[:, part] - g.detach())
                    dy1_pieces.append(d[0])
                    accumulate(g_params, d[1:])
            x2 = torch.cat(x2_pieces, dim=1) if len(x2_pieces) > 1 else x2_pieces[0]
            dy1 = dy1 + (torch.cat(dy1_pieces, dim=1) if len(dy1_pieces) > 1 else dy1_pieces[0])
            del x2_pieces, dy1_pieces
            # F: recover x1 = y1 - F(x2) and push dy1 (and the layer's aux gradients) through F
            f_params = [p for p in block.branch_parameters("attention") if p.requires_grad]
            with f_rng.fork():
                f_rng.restore()
                with torch.enable_grad():
                    x2_in = x2.detach().requires_grad_(True)
                    with Replaying(ctx.autocast, ctx.chunk):
                        f, layer_aux, _, _ = block.attention_branch(x2_in, **ctx.masks)
                    outputs, upstream = [f], [dy1]
                    for value, d_value in zip(layer_aux.values(), d_layer_aux):
                        if value.requires_grad:
                            outputs.append(value)
                            upstream.append(d_value)
                    d = torch.autograd.grad(outputs, [x2_in, *f_params], upstream, allow_unused=True)
            x1 = y1 - f.detach()
            accumulate(f_params, d[1:])
            dy2 = dy2 + (d[0] if d[0] is not None else 0)  # x2 reaches y2 directly and through F
            y1, y2 = x1, x2
            del f, d
        return (dy1, dy2, None, None, None, None, *grads)
