"""What every head shares: the model output, the state a model carries between calls, the token
embedding, and :class:`ZooModel` (the resolved config, state checks, the final norm).

Heads (one file each, registered in ``HEAD`` under their ``kind``): ``lm`` (:mod:`zoo.models.lm`),
``classifier`` (:mod:`zoo.models.classifier`), ``seq2seq`` (:mod:`zoo.models.seq2seq`),
``pair_classifier`` (:mod:`zoo.models.two_tower`).

Calls: ``model(tokens, targets=None, *, pad_mask=None, state=None) -> ModelOutput`` and, for the
encoder-decoder, ``model(src, tgt, targets=None, *, src_pad_mask=None, tgt_pad_mask=None,
state=None)``. Feeding ``out.state`` back continues the sequence (XL memory, KV cache).

Backbone use: every model also takes vectors in place of token ids, ``model(embeds=x)`` with x
[b, t, d_model] float (the encoder-decoder: ``src_embeds=`` / ``tgt_embeds=``, each side on its own);
the token embedding and its sqrt(d_model) scale are skipped, everything after it (position signal,
dropout, padding masks, state) is the same. ``ModelOutput.hidden`` is always the final hidden
states [b, t, d_model] (after the final norm where the residual has one); ``head="none"`` builds no
output projection (``logits`` is None, ``targets`` are refused) so a caller puts its own head on
``hidden``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.attention.documents import check_documents, positions_in_documents
from zoo.blocks import Block
from zoo.config import ModelConfig, part_label, split_part
from zoo.models.inputs import (
    check_embeds,
    check_tokens,
)
from zoo.norm.base import create_norm
from zoo.registry import Registry
from zoo.residual.base import RESIDUAL


@dataclass
class ModelOutput:
    logits: Tensor | None  # None when the model was built with head="none"
    loss: Tensor | None = None  # task loss when targets are given
    aux_losses: dict[str, Tensor] = field(default_factory=dict)  # summed over layers: span_l1, ponder, ...
    state: Any = None  # per-layer memory / cache to feed back next call
    stats: dict[str, Tensor] = field(default_factory=dict)
    hidden: Tensor | None = None  # [b, t, d_model] final hidden states, after the final norm (decoder's for seq2seq)


@dataclass
class ModelState:
    """What a model carries between calls: one entry per layer, plus where the stream stands.

    ``offset`` is the absolute position of the next token (for absolute position signals);
    ``batch_size`` and ``signature`` let a model refuse a state that is not its own."""

    layers: list[Any] | None
    offset: int
    batch_size: int
    signature: str = ""
    # [b] long or None: left padding of each row, whose positions then start at -shift (its first real
    # token at 0), as when the row is decoded alone (zoo/models/generation.py)
    shift: Tensor | None = None


def map_tensors(state: Any, fn: Callable[[Tensor], Tensor], *, rows_only: bool = False) -> Any:
    """Apply ``fn`` to every tensor inside a (nested) state: lists, tuples, dicts, dataclasses.
    Used to reorder caches in beam search and to move states between devices. ``rows_only``: skip
    the dataclass fields a cache marks as shared by every row (``field(metadata={"batch": False})``,
    ``zoo.attention.state.NOT_PER_ROW``: the kept keys' positions, a pinned feature map)."""
    if isinstance(state, Tensor):
        return fn(state)
    if isinstance(state, list):
        return [map_tensors(s, fn, rows_only=rows_only) for s in state]
    if isinstance(state, tuple):
        return tuple(map_tensors(s, fn, rows_only=rows_only) for s in state)
    if isinstance(state, dict):
        return {k: map_tensors(v, fn, rows_only=rows_only) for k, v in state.items()}
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        mapped = {
            f.name: map_tensors(getattr(state, f.name), fn, rows_only=rows_only)
            for f in dataclasses.fields(state)
            if f.init and not (rows_only and f.metadata.get("batch", True) is False)
        }
        return dataclasses.replace(state, **mapped)
    return state


def reorder_state(state: Any, index: Tensor) -> Any:
    """Select batch rows of every tensor in a state (beam search), leaving what is shared by every row."""
    out = map_tensors(state, lambda t: t.index_select(0, index) if t.dim() > 0 else t, rows_only=True)
    if isinstance(out, (ModelState, Seq2SeqState)):
        out = dataclasses.replace(out, batch_size=int(index.numel()))
    return out


class TokenEmbedding(nn.Module):
    """Token ids -> vectors; also the tied output projection.

    ``init_std=0`` (the default): weights N(0, 1/d_model) read times sqrt(d_model) (Vaswani et al.
    2017, Section 3.4), so rows enter the stack at RMS 1. ``init_std > 0``: a plain table N(0, init_std)
    read as it is (BERT's and the PyTorch LRA code's 0.02). The two differ in training, not only at
    the start: Adam moves a weight by about lr per step whatever its gradient's scale, so a row read
    times sqrt(d_model) moves sqrt(d_model) times faster than a plain one."""

    def __init__(self, vocab_size: int, d_model: int, name: str = "tokens", init_std: float = 0.0):
        super().__init__()
        self.vocab_size, self.d_model, self.name = vocab_size, d_model, name
        self.scale = math.sqrt(d_model) if init_std == 0 else 1.0
        self.weight = nn.Parameter(torch.randn(vocab_size, d_model) * (init_std or d_model**-0.5))

    def reset(self, std: float) -> None:
        """A plain table N(0, std) read unscaled (what ``init_std`` > 0 builds): the init schemes' tables."""
        self.scale = 1.0
        nn.init.normal_(self.weight, std=std)

    def forward(self, tokens: Tensor) -> Tensor:
        check_tokens(tokens, self.name, self.vocab_size)
        vectors = F.embedding(tokens.long(), self.weight)
        return vectors * self.scale if self.scale != 1.0 else vectors


class ZooModel(nn.Module):
    """Shared plumbing: the resolved config, state checks, final norm."""

    # how its self-attention runs: "causal" (a decoder) and/or "bidirectional" (an encoder); empty = either
    # (the mechanism's own flags choose). A sweep over mechanisms asks it (``takes_attention``).
    attention_directions: ClassVar[tuple[str, ...]] = ()
    packs_documents: ClassVar[bool] = False  # forward takes documents= (packed rows): packing_refusal

    @classmethod
    def takes_attention(cls, attention: type) -> bool:
        """Whether every self-attention this head builds can be the mechanism class ``attention``."""
        if "causal" in cls.attention_directions and not attention.supports_causal:
            return False
        return "bidirectional" not in cls.attention_directions or not attention.causal_only

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        # what a state must match to be fed back: the same preset, head, mechanism, stack and sizes
        parts = "/".join(part_label(getattr(config, axis)) for axis in ("attention", "stack"))
        self.signature = f"{config.name}:{config.kind}:{parts}:{config.n_layers}x{config.d_model}h{config.n_heads}"

    def final_norm(self) -> nn.Module:
        name, _ = split_part(self.config.residual)
        return create_norm(self.config.norm, self.config.d_model) if RESIDUAL.get(name).final_norm else nn.Identity()

    def input_vectors(
        self,
        embedding: TokenEmbedding,
        tokens: Tensor | None,
        embeds: Tensor | None,
        names: tuple[str, str] = ("tokens", "embeds"),
    ) -> Tensor:
        """[b, t, d_model] vectors entering the stack: token ids through ``embedding`` (scaled by
        sqrt(d)), or the caller's own vectors as they are (a backbone fed observations/features)."""
        tokens_name, embeds_name = names
        d = self.config.d_model
        if (tokens is None) == (embeds is None):
            given = "both" if tokens is not None else "neither"
            raise ValueError(
                f"pass exactly one of {tokens_name} (token ids [b, t]) or {embeds_name} "
                f"(vectors [b, t, d_model={d}]); got {given}"
            )
        if tokens is not None:
            return embedding(tokens)
        check_embeds(embeds, embeds_name, d, embedding.weight.dtype)
        return embeds

    def output_head(self, logits_in: Tensor) -> Tensor | None:
        """The output projection (vocabulary or classes), or None for a model built with head="none"."""
        return None if self.head is None else self.head(logits_in)

    def require_head(self, why: str) -> None:
        if self.head is None:
            raise ValueError(
                f"{why}, but this model was built with head='none' (no output projection, logits=None): compute your "
                f"loss from out.hidden [b, t, d_model={self.config.d_model}], or build with head='linear'"
            )

    def refuse_without_head(self, targets: Tensor | None) -> None:
        if targets is not None:
            self.require_head("targets were given")

    def training_batch(self, tokens: Tensor) -> dict[str, Tensor]:
        """A training call's keyword arguments made from random ids ``tokens`` [b, t + 1] (the benchmark
        steps every model on them): a language model predicts each next token; a head with other targets
        says so by overriding this."""
        return {"tokens": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}

    def output_flops(self, t: int) -> tuple[float, str] | None:
        """(matmul FLOPs of the output layer over a sequence of t tokens, the rule), asked by the cost
        model (zoo/models/costs.py); None when the head does not say."""
        return None

    def decoding_stack(self) -> nn.Module:
        """The stack a state continues (the LM's stack; the encoder-decoder's decoder)."""
        return self.stack

    def stream_refusal(self) -> str | None:
        """Why this model cannot continue a sequence from a state, asked of its parts: the stack
        (``Stack.stream_refusal``: the universal stack keeps no per-layer cache) and every
        self-attention (``Attention.stream_refusal``: a layer without a state, a bidirectional one, or
        options whose key sets depend on the whole sequence). None when it can: then feeding a stream
        in pieces with ``state`` equals one call over it."""
        reason = self.decoding_stack().stream_refusal()
        if reason is not None:
            return reason
        for i, block in enumerate(self.decoding_blocks()):
            reason = block.attention.stream_refusal() or block.feed_forward.stream_refusal()
            if reason is not None:
                return f"layer {i}: {reason}"
        return None

    def decoding_blocks(self) -> list[Block]:
        """The blocks of the stack a state continues, in order."""
        return [m for m in self.decoding_stack().modules() if isinstance(m, Block)]

    def refuse_stream(self) -> None:
        """Raise, with the reason, when this model cannot continue a sequence from a state."""
        reason = self.stream_refusal()
        if reason is not None:
            raise ValueError(
                f"{self.config.name} cannot continue a sequence from a state: {reason}. Feed the whole sequence "
                "with state=None instead (generate() does so by itself)"
            )

    def attentions_keep_state(self) -> bool:
        """True when the model can continue a sequence from a state (``stream_refusal`` is None), so
        decoding feeds one token at a time through the caches; otherwise it recomputes the prefix."""
        return self.stream_refusal() is None

    def check_decode_length(self, length: int, what: str) -> None:
        """Refuse up front a decode that would run past the position signal's limit (a learned table)
        half way through."""
        limit = self.position.length_limit()
        if limit is not None and length > limit:
            raise ValueError(
                f"{what} = {length} positions, past what position {self.position.registry_name!r} holds ({limit}, "
                f"max_len={self.config.max_len}); ask for fewer or raise max_len"
            )

    def check_state(self, state: Any, batch_size: int, cls: type = None, *, stack: nn.Module | None = None) -> None:
        cls = cls or ModelState
        if state is None:
            return
        if not isinstance(state, cls):
            raise ValueError(
                f"state must be the {cls.__name__} this model returned (out.state); got {type(state).__name__}"
            )
        if state.signature and state.signature != self.signature:
            raise ValueError(f"state comes from a different model ({state.signature}); this model is {self.signature}")
        if state.batch_size != batch_size:
            raise ValueError(
                f"state holds batch size {state.batch_size} but the input has batch size {batch_size}; start fresh "
                f"with state=None or model.init_state({batch_size})"
            )
        if stack is not None and (state.offset or state.layers is not None):
            # continuing needs every layer's cache of the earlier tokens: never compute without them
            self.refuse_stream()

    # -- packed rows (data.pack; zoo/attention/documents.py) -------------------------------------
    def packing_refusal(self) -> str | None:
        """Why this model cannot take packed rows (``documents=`` [b, t]: several documents per row, each kept
        apart), asked of its parts by their flags: the head (``packs_documents``), the stack, the position
        part, every layer's attention (``Attention.packing_refusal``) and feed-forward (``position_wise``).
        None when every part keeps each token inside its own document."""
        if not self.packs_documents:
            return f"a {self.config.kind} model takes no packed rows (only the lm and classifier heads do)"
        stack = self.stack
        if not stack.packs_documents:
            return f"stack {stack.registry_name!r} {stack.no_packing_reason}"
        reason = self.position.packing_refusal()
        if reason is not None:
            return reason
        for i, block in enumerate(m for m in stack.modules() if isinstance(m, Block)):
            reason = block.attention.packing_refusal()
            if reason is None and not block.feed_forward.position_wise:
                name = block.feed_forward.registry_name
                reason = f"feed-forward {name!r} reads neighbouring positions, which would cross documents"
            if reason is not None:
                return f"layer {i}: {reason}"
        return None

    def packed_positions(self, documents: Tensor, x: Tensor, state: Any) -> Tensor:
        """Check a packed call (``documents`` long [b, t] for x [b, t, ...]) and return each token's place in its
        document, long [b, t], for the position part. Refuses, with the reason, a model that cannot keep the
        documents apart and a state (a packed row is a fresh stream of whole documents)."""
        reason = self.packing_refusal()
        if reason is not None:
            raise ValueError(f"{self.config.name} cannot take packed documents (documents=): {reason}")
        if state is not None:
            raise ValueError("packed documents (documents=) start fresh in every row: pass state=None")
        check_documents(documents, x, self.config.name)
        return positions_in_documents(documents)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # -- sharing (zoo/hub, through SHARING): Hugging Face's PyTorchModelHubMixin names --------------
    def save_pretrained(self, save_directory: str | Path, *, training: dict[str, Any] | None = None) -> Path:
        """Write ``model.safetensors`` + ``config.json`` + ``README.md`` (the model card) into a folder."""
        return SHARING["save_pretrained"](self, save_directory, training=training)

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> str:
        """Upload that folder to Hugging Face Hub repository ``repo_id`` (needs ``huggingface_hub``)."""
        return SHARING["push_to_hub"](self, repo_id, **kwargs)

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, **kwargs: Any) -> ZooModel:
        """``zoo.from_pretrained`` (a folder or a Hub repository id), refusing a model of another head."""
        model = SHARING["from_pretrained"](name_or_path, **kwargs)
        if not isinstance(model, cls):
            raise TypeError(
                f"{name_or_path} holds a {type(model).__name__} ({model.config.kind}), not a {cls.__name__}: "
                "load it with zoo.from_pretrained"
            )
        return model


@dataclass
class Seq2SeqState:
    """Encoder output (computed once) plus the decoder's per-layer caches."""

    memory: Tensor
    memory_pad_mask: Tensor | None
    layers: list[Any] | None
    offset: int
    batch_size: int
    signature: str = ""


# the heads, by ``ModelConfig.kind``: each head file registers its class (``@HEAD.register("lm")``)
HEAD: Registry[type[ZooModel]] = Registry("head", ZooModel)

# ZooModel's save_pretrained / push_to_hub / from_pretrained, filled in by zoo.hub when it is imported
# (``import zoo`` does): the folder format needs the preset registry, which needs this module
SHARING: dict[str, Callable[..., Any]] = {}
