"""One loop for streams read one segment per call, the state carried between calls: the ground the memory
studies stand on (``backbone_memory``, ``gtrxl_recall``, ``gtrxl_robustness``), for models we wrote and
models we did not (DI-engine's GTrXL, :class:`DIEngineGTrXL`).

Why not the app (``zoo.studies.common.train``): its trainer takes an optimiser step per segment and scores
the task's metric over the whole split. These studies need what it cannot express: one step per *stream*
(each segment's loss backpropagated as it is read, scaled, the memory detached between calls: truncated
back-propagation through one segment), a score per delay or per where the source lies, a run that stops
once solved, a regression on vectors through a backbone between our own read-in and read-out (no token
task), and a reference model behind the same calls. So every model of these comparisons is trained here.

A *stream model* has ``reset(batch)`` (the state a stream starts from) and ``model(**piece) ->
ModelOutput`` (one segment; it keeps its state for the next call): :class:`Carried` makes one of a zoo
model, :class:`DIEngineGTrXL` of the reference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from zoo.bench import import_checkout
from zoo.models.base import ModelOutput
from zoo.models.losses import token_loss
from zoo.train.steps import (
    TrainingDiverged,
    detach_state,
    forward_backward,
    initial_state,
    optimizer_step,
)

DI_ENGINE_MODULE = "ding.torch_utils.network.gtrxl"


class Carried(nn.Module):
    """A zoo model read one segment per call: its state (XL memory, a span cache) kept between calls and
    started afresh by ``reset``; a model that carries none (``vanilla_lm``'s KV cache is not memory) is called
    with ``state=None`` every time."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.state: Any = None

    def reset(self, batch: int) -> None:
        self.state = initial_state(self.model, batch)

    def forward(self, **piece: Tensor) -> ModelOutput:
        out = self.model(**piece, state=self.state)
        self.state = detach_state(out.state) if self.state is not None else None
        return out


def read_stream(
    model: nn.Module,
    pieces: Sequence[dict[str, Tensor]],
    *,
    scale: Callable[[int, dict], float] | None = None,
    step: Callable[[], None] | None = None,
) -> list[ModelOutput]:
    """Reset ``model`` and feed ``pieces`` (one segment each, [b, t, ...]) in order. With ``scale`` (training),
    each piece's loss x ``scale(index, piece)`` is backpropagated as it is read (0: forward only) and ``step``,
    when given, is called after each trained piece (an optimiser step per segment); else the pieces are only
    read. A NaN loss raises :class:`TrainingDiverged` before any gradient is touched."""
    model.reset(next(iter(pieces[0].values())).shape[0])
    outputs = []
    for index, piece in enumerate(pieces):
        weight = scale(index, piece) if scale is not None else 0.0
        if weight:
            out, _ = forward_backward(model, piece, scale=weight)
            if step is not None:
                step()
        else:
            out = model(**piece)
        outputs.append(out)
    return outputs


@torch.no_grad()
def evaluate_stream(model: nn.Module, pieces: Sequence[dict[str, Tensor]]) -> list[ModelOutput]:
    """The outputs of reading ``pieces`` in evaluation mode (the model is left in training mode)."""
    model.eval()
    try:
        return read_stream(model, pieces)
    finally:
        model.train()


def train_streams(model: nn.Module, optimizer: torch.optim.Optimizer, draw: Callable[[], list[dict[str, Tensor]]], *,
                  steps: int, scale: Callable[[int, dict], float], clip: float,
                  after: Callable[[int, float], bool], per_segment: bool = False) -> int:
    """Train on ``steps`` streams drawn by ``draw()`` (a list of pieces each): one optimiser step per stream
    (clip ``clip``), or per trained segment with ``per_segment``. After each stream ``after(step, mean loss)``
    is called (evaluate there); it returns True to stop. A NaN loss ends the run with ``after(step, nan)``
    (no step taken). Returns the steps run."""

    def clipped_step() -> None:
        optimizer_step(model, optimizer, clip=clip)
        optimizer.zero_grad(set_to_none=True)

    model.train()
    for index in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        try:
            outputs = read_stream(model, draw(), scale=scale, step=clipped_step if per_segment else None)
            losses = [float(out.loss.detach()) for out in outputs if out.loss is not None and torch.isfinite(out.loss)]
            if not per_segment:
                optimizer_step(model, optimizer, clip=clip)
            loss = sum(losses) / max(len(losses), 1)
        except TrainingDiverged:
            after(index, float("nan"))
            return index
        if after(index, loss):
            return index
    return steps


def import_di_engine(path: str | Path | None) -> tuple[Any, str]:
    """DI-engine's gtrxl module from ``path`` (a folder holding ``ding/``), or (None, why not)."""
    if not path:
        return None, "no DI-engine folder given (study.ref_path or $GTRXL_REF)"
    if not (Path(path) / "ding" / "torch_utils" / "network" / "gtrxl.py").is_file():
        return None, f"{str(path)!r} has no ding/torch_utils/network/gtrxl.py"
    try:
        return import_checkout(str(path), DI_ENGINE_MODULE)[0], ""
    except ImportError as error:
        return None, f"importing {DI_ENGINE_MODULE} from {str(path)!r} failed: {error}"


class DIEngineGTrXL(nn.Module):
    """DI-engine's ``GTrXL`` (it maps embeddings to hidden states) between our token embedding and a LayerNorm +
    LM head, scored by the loss our models use, behind the stream-model calls. ``gated=False`` is its TrXL-I;
    it has no post-norm variant. Its memory starts as ``memory_len`` zero vectors (attended); ours empty."""

    def __init__(self, ref: Any, *, gated: bool, gate_bias: float, vocab: int, d_model: int, heads: int,
                 layers: int, memory: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.core = ref.GTrXL(input_dim=d_model, head_dim=d_model // heads, embedding_dim=d_model, head_num=heads,
                              layer_num=layers, memory_len=memory, gru_gating=gated, gru_bias=gate_bias,
                              use_embedding_layer=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def reset(self, batch: int) -> None:
        self.core.reset_memory(batch)

    def forward(self, tokens: Tensor, targets: Tensor | None = None) -> ModelOutput:
        hidden = self.core(self.embed(tokens), batch_first=True, return_mem=False)["logit"]
        logits = self.head(self.norm(hidden))
        return ModelOutput(logits, None if targets is None else token_loss(logits, targets, None, 0.0)[0])
