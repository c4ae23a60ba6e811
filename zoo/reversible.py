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
- Chunked feed-forward: G is position-wise, so when ``FeedForward.chunk_size`` is set it is
  applied chunk by chunk along the sequence in forward *and* recomputed and differentiated chunk
  by chunk in backward: its [b, t, d_ff] activation never exists for the whole sequence.
- Gradients of the parameters are returned by the autograd function (they are its inputs), so
  both ``loss.backward()`` and ``torch.autograd.grad`` work.

Deviations: the streams start as two copies of the input (as the paper does) and the stack
returns their mean (y1 + y2) / 2, so its width stays d_model. Refused at build time, with the
reason: residuals that are not additive (post_norm, gru_gate: the branch cannot be subtracted),
attention that carries memory between calls (``supports_memory``: recomputation would replay a
cache that has moved on) and cross-attention blocks. ``recompute=False`` runs the same coupling
with ordinary autograd (stores every layer's activations): the reference the tests compare with.

Shapes: x [b, t, d]; pad_mask [b, t] bool (True = real).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from zoo.blocks import Block
from zoo.registry import STACK
from zoo.stacks import BlockFactory, Stack, StackOutput


def check_reversible_block(block: Block, layer_index: int) -> None:
    """Refuse, with the reason, a block the reversible coupling cannot invert or replay."""
    attention = block.attention
    if attention.supports_memory:
        raise ValueError(
            f"stack 'reversible' cannot hold attention {attention.registry_name!r} (layer {layer_index}): it keeps state across calls "
            "(supports_memory=True), and recomputing a layer in backward would replay it against a state that has moved on; "
            "use a stateless attention (e.g. lsh or shared_qk) or stack=sequential"
        )
    if block.cross_attention is not None:
        raise ValueError("stack 'reversible' supports blocks without cross-attention (decoder-only LM, encoder); use stack=sequential for the seq2seq decoder")
    for part in (block.attention_residual, block.feed_forward_residual):
        if not part.additive:
            raise ValueError(
                f"stack 'reversible' needs additive residuals (y = x + branch(x)) to recover a layer's input from its output; "
                f"residual {part.registry_name!r} is not (it normalises or gates after the addition); use residual=pre_norm or rezero"
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


@STACK.register("reversible")
class ReversibleStack(Stack):
    @dataclass
    class Options:
        recompute: bool = True  # False: same coupling, plain autograd (stores activations; test reference)

    def __init__(self, make_block: BlockFactory, n_layers: int, d_model: int, **options):
        super().__init__(make_block, n_layers, d_model, **options)
        self.blocks = nn.ModuleList(make_block(i) for i in range(n_layers))
        for i, block in enumerate(self.blocks):
            check_reversible_block(block, i)

    # the two branches -------------------------------------------------------------------------
    @staticmethod
    def attention_branch(block: Block, x: Tensor, pad_mask: Tensor | None, stats: dict | None = None, *, recomputed: bool = False) -> Tensor:
        out, result = block.attention_branch(x, pad_mask=pad_mask)
        if result.aux and recomputed:
            raise ValueError(f"stack 'reversible' does not carry auxiliary losses ({', '.join(result.aux)}) through its recomputation; use stack=sequential")
        if stats is not None:
            stats.update({key: value.detach() for key, value in result.stats.items()})
        return out

    @staticmethod
    def ff_chunks(block: Block, t: int) -> list[tuple[int, int]]:
        size = getattr(block.feed_forward, "chunk_size", 0) or t
        return [(s, min(s + size, t)) for s in range(0, t, size)]

    @classmethod
    def feed_forward_branch(cls, block: Block, y: Tensor) -> Tensor:
        """G(y), chunk by chunk along the sequence (the same slicing as the backward recompute, so
        dropout draws its masks in the same order)."""
        pieces = [block.feed_forward_branch(y[:, s:e]) for s, e in cls.ff_chunks(block, y.shape[1])]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)

    # forward ----------------------------------------------------------------------------------
    def forward(self, x: Tensor, *, pad_mask: Tensor | None = None, state: list[Any] | None = None, context: Tensor | None = None, context_pad_mask: Tensor | None = None, offset: int = 0) -> StackOutput:
        if any(s is not None for s in self.check_state(state)):
            raise ValueError("stack 'reversible' keeps no state between calls; pass state=None")
        if context is not None:
            raise ValueError("stack 'reversible' has no cross-attention: context must be None")
        stats: dict[str, Tensor] = {}
        if self.options.recompute and torch.is_grad_enabled():
            params = [p for p in self.parameters()]
            y1, y2 = _ReversibleFunction.apply(x, x, self, pad_mask, stats, *params)
        else:
            y1, y2 = x, x
            for block in self.blocks:
                y1 = y1 + self.attention_branch(block, y2, pad_mask, stats)
                y2 = y2 + self.feed_forward_branch(block, y1)
        return StackOutput((y1 + y2) / 2, None, {}, stats)


class _ReversibleFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x1: Tensor, x2: Tensor, stack: ReversibleStack, pad_mask: Tensor | None, stats: dict, *params: Tensor):
        rng: list[tuple[_RNG, _RNG]] = []
        with torch.no_grad():
            for block in stack.blocks:
                f_rng = _RNG(x1.device)
                x1 = x1 + stack.attention_branch(block, x2, pad_mask, stats, recomputed=True)
                g_rng = _RNG(x1.device)
                x2 = x2 + stack.feed_forward_branch(block, x1)
                rng.append((f_rng, g_rng))
        ctx.stack, ctx.pad_mask, ctx.rng = stack, pad_mask, rng
        ctx.save_for_backward(x1, x2)  # the only activations kept: the last layer's outputs
        return x1, x2

    @staticmethod
    def backward(ctx, dy1: Tensor, dy2: Tensor):
        stack: ReversibleStack = ctx.stack
        y1, y2 = ctx.saved_tensors
        index = {id(p): i for i, p in enumerate(stack.parameters())}
        grads: list[Tensor | None] = [None] * len(index)

        def accumulate(params: list[Tensor], new: tuple[Tensor | None, ...]) -> None:
            for p, g in zip(params, new):
                if g is not None:
                    i = index[id(p)]
                    grads[i] = g if grads[i] is None else grads[i] + g

        y1, y2 = y1.detach(), y2.detach()
        for block, (f_rng, g_rng) in zip(reversed(stack.blocks), reversed(ctx.rng)):
            # G: recover x2 = y2 - G(y1) and push dy2 through G, one sequence chunk at a time
            g_params = [p for p in _branch_params(block, "feed_forward") if p.requires_grad]
            x2_pieces, dy1_pieces = [], []
            with g_rng.fork():
                g_rng.restore()
                for s, e in stack.ff_chunks(block, y1.shape[1]):
                    with torch.enable_grad():
                        y1_piece = y1[:, s:e].detach().requires_grad_(True)
                        g = block.feed_forward_branch(y1_piece)
                        d = torch.autograd.grad(g, [y1_piece, *g_params], dy2[:, s:e], allow_unused=True)
                    x2_pieces.append(y2[:, s:e] - g.detach())
                    dy1_pieces.append(d[0])
                    accumulate(g_params, d[1:])
            x2 = torch.cat(x2_pieces, dim=1) if len(x2_pieces) > 1 else x2_pieces[0]
            dy1 = dy1 + (torch.cat(dy1_pieces, dim=1) if len(dy1_pieces) > 1 else dy1_pieces[0])
            del x2_pieces, dy1_pieces
            # F: recover x1 = y1 - F(x2) and push dy1 through F
            f_params = [p for p in _branch_params(block, "attention") if p.requires_grad]
            with f_rng.fork():
                f_rng.restore()
                with torch.enable_grad():
                    x2_in = x2.detach().requires_grad_(True)
                    f = stack.attention_branch(block, x2_in, ctx.pad_mask)
                    d = torch.autograd.grad(f, [x2_in, *f_params], dy1, allow_unused=True)
            x1 = y1 - f.detach()
            accumulate(f_params, d[1:])
            dy2 = dy2 + d[0]  # x2 reaches y2 directly and through F
            y1, y2 = x1, x2
            del f, d
        return (dy1, dy2, None, None, None, *grads)


def _branch_params(block: Block, branch: str) -> list[Tensor]:
    """The parameters one branch uses: its sub-layer and its residual wrapper."""
    if branch == "attention":
        modules = [block.attention, block.attention_residual]
    else:
        modules = [block.feed_forward, block.feed_forward_residual]
    return [p for module in modules for p in module.parameters()]
