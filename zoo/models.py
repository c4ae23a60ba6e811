"""Heads that turn a stack into a model, and the named presets.

- :class:`CausalLM` (``kind="lm"``): decoder-only language model. Token embeddings are scaled by
  sqrt(d_model) and tied to the output projection (Vaswani et al. 2017, Section 3.4).
- :class:`SequenceClassifier` (``kind="classifier"``): bidirectional encoder + mean or first-token
  pooling + a linear layer, for LRA-style tasks.
- :class:`EncoderDecoder` (``kind="seq2seq"``): the original Transformer, with cross-attention,
  optional three-way tying (source embedding = target embedding = output projection) when the
  vocabularies are shared, and greedy / beam-search decoding through the KV cache.

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
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.adaptive import adaptive_input_and_softmax
from zoo.al_rfou import AlRfouLosses
from zoo.blocks import merge_into
from zoo.build import attention_class, build_stack, create_position, split_part
from zoo.config import ModelConfig, check_type, merge_config
from zoo.inputs import (
    IGNORE_INDEX,
    check_count,
    check_embeds,
    check_pad_mask,
    check_same_batch,
    check_sampling,
    check_targets,
    check_tokens,
    count_scored,
    scored_loss,
)
from zoo.positional import LearnedPosition
from zoo.registry import MODEL, RESIDUAL, STACK


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


def map_tensors(state: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """Apply ``fn`` to every tensor inside a (nested) state: lists, tuples, dicts, dataclasses.
    Used to reorder caches in beam search and to move states between devices."""
    if isinstance(state, Tensor):
        return fn(state)
    if isinstance(state, list):
        return [map_tensors(s, fn) for s in state]
    if isinstance(state, tuple):
        return tuple(map_tensors(s, fn) for s in state)
    if isinstance(state, dict):
        return {k: map_tensors(v, fn) for k, v in state.items()}
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return dataclasses.replace(
            state, **{f.name: map_tensors(getattr(state, f.name), fn) for f in dataclasses.fields(state) if f.init}
        )
    return state


def reorder_state(state: Any, index: Tensor) -> Any:
    """Select batch rows of every tensor in a state (beam search)."""
    out = map_tensors(state, lambda t: t.index_select(0, index) if t.dim() > 0 else t)
    if isinstance(out, (ModelState, Seq2SeqState)):
        out = dataclasses.replace(out, batch_size=int(index.numel()))
    return out


class TokenEmbedding(nn.Module):
    """Token ids -> vectors scaled by sqrt(d_model); also the tied output projection."""

    def __init__(self, vocab_size: int, d_model: int, name: str = "tokens"):
        super().__init__()
        self.vocab_size, self.d_model, self.name = vocab_size, d_model, name
        self.weight = nn.Parameter(torch.randn(vocab_size, d_model) * d_model**-0.5)

    def forward(self, tokens: Tensor) -> Tensor:
        check_tokens(tokens, self.name, self.vocab_size)
        return F.embedding(tokens.long(), self.weight) * math.sqrt(self.d_model)


def token_loss(
    logits: Tensor, targets: Tensor, pad_mask: Tensor | None, label_smoothing: float
) -> tuple[Tensor, Tensor]:
    """(mean cross-entropy over real target positions, how many were scored). Targets == -100 or
    padded are skipped; none scored gives loss 0, never NaN (see :mod:`zoo.inputs`)."""
    check_targets(targets, tuple(logits.shape[:-1]), logits.shape[-1])
    targets = targets.long()
    if pad_mask is not None:
        targets = targets.masked_fill(~pad_mask, IGNORE_INDEX)
    flat_logits, flat_targets = logits.float().flatten(0, -2), targets.flatten()
    loss_sum = F.cross_entropy(
        flat_logits, flat_targets, ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing, reduction="sum"
    )
    scored = (targets != IGNORE_INDEX).sum()
    return scored_loss(loss_sum, scored, logits), scored


class ZooModel(nn.Module):
    """Shared plumbing: the resolved config, state checks, final norm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        # what a state must match to be fed back: the same preset, head, mechanism, stack and sizes
        parts = "/".join(split_part(getattr(config, axis))[0] for axis in ("attention", "stack"))
        self.signature = f"{config.name}:{config.kind}:{parts}:{config.n_layers}x{config.d_model}h{config.n_heads}"

    def final_norm(self) -> nn.Module:
        name, _ = split_part(self.config.residual)
        return nn.LayerNorm(self.config.d_model) if RESIDUAL.get(name).final_norm else nn.Identity()

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

    def attentions_keep_state(self) -> bool:
        """True when every attention can continue from a state (KV cache / memory) and the stack
        threads it (``Stack.keeps_state``; the universal stack does not), so decoding can feed one
        token at a time; otherwise it recomputes the whole prefix each step."""
        return (
            attention_class(self.config.attention).supports_memory
            and STACK.get(split_part(self.config.stack)[0]).keeps_state
        )

    def check_decode_length(self, length: int, what: str) -> None:
        """Refuse up front a decode that would run past a learned position table half way through."""
        if isinstance(self.position, LearnedPosition) and length > self.config.max_len:
            raise ValueError(
                f"{what} = {length} positions, past the learned position table (max_len={self.config.max_len}); "
                "ask for fewer or raise max_len"
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
        if state.offset and stack is not None and not stack.keeps_state:
            # continuing at offset > 0 needs the earlier tokens' cache, which this stack never keeps
            raise ValueError(
                f"stack {stack.registry_name!r} keeps no cache, so it cannot continue a sequence "
                f"at offset {state.offset}: "
                "the new tokens would not see the earlier ones; feed the whole prefix with state=None "
                "(attentions_keep_state() is False for this stack, so generate() does)"
            )

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


class CausalLM(ZooModel):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        adaptive = adaptive_input_and_softmax(config) if config.adaptive else None  # zoo/adaptive.py
        self.embed = adaptive[0] if adaptive else TokenEmbedding(config.vocab_size, config.d_model)
        self.position = create_position(config)
        self.drop = nn.Dropout(config.dropout)
        self.stack = build_stack(config, causal=True, cross=False, n_layers=config.n_layers)
        self.norm = self.final_norm()
        if adaptive:
            self.head = adaptive[1]
        else:
            self.head = nn.Linear(config.d_model, config.vocab_size, bias=False) if config.head == "linear" else None
        if config.tie_embeddings and self.head is not None and not adaptive:
            self.head.weight = self.embed.weight
        self.aux_heads = self.al_rfou_losses() if config.aux_losses else None

    def al_rfou_losses(self) -> AlRfouLosses:
        """Al-Rfou et al. 2018's intermediate-layer / multiple-target losses (zoo/al_rfou.py)."""
        name = self.config.stack["name"]
        if name != "sequential":  # the others have no per-layer outputs (universal) or skip block() (reversible)
            raise ValueError(
                f"aux_losses needs one block per layer, each called in turn (stack 'sequential'); stack {name!r} is not"
            )
        blocks = self.stack.blocks
        return AlRfouLosses(
            self.config.aux_losses,
            blocks=blocks,
            norm=self.norm,
            head=self.head,
            d_model=self.config.d_model,
            vocab_size=self.config.vocab_size,
        )

    def init_state(self, batch_size: int) -> ModelState:
        """An empty state that turns on caching (KV cache) for incremental decoding."""
        check_count(batch_size, "batch_size", 1)
        return ModelState(self.stack.init_state(batch_size), 0, batch_size, self.signature)

    def forward(
        self,
        tokens: Tensor | None = None,
        targets: Tensor | None = None,
        *,
        embeds: Tensor | None = None,
        pad_mask: Tensor | None = None,
        state: ModelState | None = None,
    ) -> ModelOutput:
        """tokens [b, t] ids, or embeds [b, t, d_model] vectors (exactly one)."""
        self.refuse_without_head(targets)
        x = self.input_vectors(self.embed, tokens, embeds)
        b, t = x.shape[:2]
        check_pad_mask(pad_mask, x[..., 0])
        self.check_state(state, b, stack=self.stack)
        offset = state.offset if state is not None else 0
        x = self.drop(self.position(x, offset))
        auxiliary = self.aux_heads is not None and self.training and targets is not None
        if self.aux_heads is not None:
            self.aux_heads.start(auxiliary)
        out = self.stack(x, pad_mask=pad_mask, state=state.layers if state is not None else None)
        hidden = self.norm(out.x)
        if auxiliary:
            out.aux.update(self.aux_heads.losses(hidden, targets, pad_mask, self.config.label_smoothing))
        loss, stats = None, out.stats
        if self.config.adaptive:  # full log-probabilities only outside training steps ([b, t, 0] there)
            if targets is not None:
                check_targets(targets, (b, t), self.config.vocab_size)
                stats = {**stats, "scored": count_scored(targets, pad_mask)}
            full = not (self.training and targets is not None)
            logits, loss = self.head(hidden, targets, pad_mask=pad_mask, full=full)
        else:
            logits = self.output_head(hidden)
            if targets is not None:
                loss, scored = token_loss(logits, targets, pad_mask, self.config.label_smoothing)
                stats = {**stats, "scored": scored}
        new_state = None
        if out.state is not None or state is not None:
            new_state = ModelState(out.state, offset + t, b, self.signature)
        return ModelOutput(logits, loss, out.aux, new_state, stats, hidden)

    @torch.no_grad()
    def generate(
        self,
        prompt: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Continue ``prompt`` [b, t0] by ``max_new_tokens``; returns [b, t0 + max_new_tokens].

        Mechanisms with a cache/memory see one new token per step; the others recompute the
        (position-table-limited) prefix each step."""
        self.require_head("generate() samples from the logits")
        check_tokens(prompt, "prompt", self.config.vocab_size)
        check_count(max_new_tokens, "max_new_tokens", 0)
        check_sampling(temperature=temperature, top_k=top_k, greedy=greedy, generator=generator)
        was_training = self.training
        self.eval()
        tokens = prompt
        incremental = self.attentions_keep_state()
        if incremental:  # the cache keeps every position (the recomputing path slides a window instead)
            self.check_decode_length(prompt.shape[1] + max_new_tokens, "prompt length + max_new_tokens")
        out = self(prompt, state=self.init_state(prompt.shape[0]) if incremental else None)
        for _ in range(max_new_tokens):
            next_token = sample_next(
                out.logits[:, -1], temperature=temperature, top_k=top_k, greedy=greedy, generator=generator
            )
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)
            if incremental:
                out = self(next_token[:, None], state=out.state)
            else:
                out = self(tokens[:, -self.config.max_len :])
        self.train(was_training)
        return tokens


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> Tensor:
    """[b, V] logits -> [b] token ids (argmax, or sampling with temperature and top-k)."""
    if greedy or temperature <= 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)[:, 0]


class SequenceClassifier(ZooModel):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.embed = TokenEmbedding(config.vocab_size, config.d_model)
        self.position = create_position(config)
        self.drop = nn.Dropout(config.dropout)
        self.stack = build_stack(config, causal=False, cross=False, n_layers=config.n_layers)
        self.norm = self.final_norm()
        self.head = nn.Linear(config.d_model, config.n_classes) if config.head == "linear" else None

    def forward(
        self,
        tokens: Tensor | None = None,
        targets: Tensor | None = None,
        *,
        embeds: Tensor | None = None,
        pad_mask: Tensor | None = None,
        state: Any = None,
    ) -> ModelOutput:
        """tokens [b, t] ids, or embeds [b, t, d_model] vectors (exactly one); targets [b] classes."""
        if state is not None:
            raise ValueError("the classifier reads a whole sequence per call and takes no state")
        self.refuse_without_head(targets)
        x = self.input_vectors(self.embed, tokens, embeds)
        check_pad_mask(pad_mask, x[..., 0])
        out = self.stack(self.drop(self.position(x)), pad_mask=pad_mask)
        h = self.norm(out.x)  # [b, t, d]
        if self.config.pooling == "first":
            pooled = h[:, 0]
        elif pad_mask is None:
            pooled = h.mean(1)
        else:
            weights = pad_mask.to(h.dtype)[..., None]
            pooled = (h * weights).sum(1) / weights.sum(1).clamp_min(1.0)
        logits = self.output_head(pooled)
        loss, stats = None, out.stats
        if targets is not None:
            n_classes = self.config.n_classes
            check_targets(targets, (x.shape[0],), n_classes, "classifier targets", what="n_classes", ignore=False)
            loss = F.cross_entropy(logits.float(), targets.long(), label_smoothing=self.config.label_smoothing)
            stats = {**stats, "scored": torch.tensor(targets.numel(), device=logits.device)}
        return ModelOutput(logits, loss, out.aux, None, stats, h)


@dataclass
class Seq2SeqState:
    """Encoder output (computed once) plus the decoder's per-layer caches."""

    memory: Tensor
    memory_pad_mask: Tensor | None
    layers: list[Any] | None
    offset: int
    batch_size: int
    signature: str = ""


class EncoderDecoder(ZooModel):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        d = config.d_model
        self.tgt_embed = TokenEmbedding(config.vocab_size, d, name="tgt")
        shared_vocab = config.src_vocab_size in (0, config.vocab_size)
        if shared_vocab and config.tie_embeddings:
            self.src_embed = self.tgt_embed  # three-way tying: source = target = output projection
        else:
            self.src_embed = TokenEmbedding(config.src_vocab_size or config.vocab_size, d, name="src")
        self.position = create_position(config)
        self.drop = nn.Dropout(config.dropout)
        self.encoder = build_stack(
            config, causal=False, cross=False, n_layers=config.n_encoder_layers or config.n_layers
        )
        self.encoder_norm = self.final_norm()
        self.decoder = build_stack(config, causal=True, cross=True, n_layers=config.n_layers)
        self.decoder_norm = self.final_norm()
        self.head = nn.Linear(d, config.vocab_size, bias=False) if config.head == "linear" else None
        if config.tie_embeddings and self.head is not None:
            self.head.weight = self.tgt_embed.weight

    def encode(
        self, src: Tensor | None = None, src_pad_mask: Tensor | None = None, *, src_embeds: Tensor | None = None
    ) -> Tensor:
        """Encoder output [b, s, d_model] for source ids ``src`` [b, s] or vectors ``src_embeds``."""
        return self._encode(src, src_pad_mask, src_embeds)[0]

    def _encode(
        self, src: Tensor | None, src_pad_mask: Tensor | None, src_embeds: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
        """Encoder output plus its aux losses and stats (an ACT encoder's ponder cost)."""
        x = self.input_vectors(self.src_embed, src, src_embeds, ("src", "src_embeds"))
        check_pad_mask(src_pad_mask, x[..., 0], "src_pad_mask")
        out = self.encoder(self.drop(self.position(x)), pad_mask=src_pad_mask)
        return self.encoder_norm(out.x), out.aux, out.stats

    def init_state(
        self, src: Tensor | None = None, src_pad_mask: Tensor | None = None, *, src_embeds: Tensor | None = None
    ) -> Seq2SeqState:
        """Encode the source (ids or vectors) once and start empty decoder caches."""
        memory = self.encode(src, src_pad_mask, src_embeds=src_embeds)
        b = memory.shape[0]
        return Seq2SeqState(memory, src_pad_mask, self.decoder.init_state(b), 0, b, self.signature)

    def forward(
        self,
        src: Tensor | None = None,
        tgt: Tensor | None = None,
        targets: Tensor | None = None,
        *,
        src_embeds: Tensor | None = None,
        tgt_embeds: Tensor | None = None,
        src_pad_mask: Tensor | None = None,
        tgt_pad_mask: Tensor | None = None,
        state: Seq2SeqState | None = None,
    ) -> ModelOutput:
        """Source as ids ``src`` or vectors ``src_embeds`` (not read when ``state`` holds the encoded
        source), target as ids ``tgt`` or vectors ``tgt_embeds``; each side chooses on its own."""
        self.refuse_without_head(targets)
        if state is None and src is not None:  # structure first: an empty source is named as such
            check_tokens(src, "src", None)
        y = self.input_vectors(self.tgt_embed, tgt, tgt_embeds, ("tgt", "tgt_embeds"))
        b, t = y.shape[:2]
        if state is None:
            check_same_batch(src=src if src is not None else src_embeds, tgt=y)
        self.check_state(state, b, Seq2SeqState, stack=self.decoder)
        encoder_aux: dict[str, Tensor] = {}
        encoder_stats: dict[str, Tensor] = {}
        if state is None:
            memory, encoder_aux, encoder_stats = self._encode(src, src_pad_mask, src_embeds)
            memory_pad_mask, layers, offset = src_pad_mask, None, 0
        else:
            memory, memory_pad_mask, layers, offset = state.memory, state.memory_pad_mask, state.layers, state.offset
        check_pad_mask(tgt_pad_mask, y[..., 0], "tgt_pad_mask")
        out = self.decoder(
            self.drop(self.position(y, offset)),
            pad_mask=tgt_pad_mask,
            state=layers,
            context=memory,
            context_pad_mask=memory_pad_mask,
        )
        hidden = self.decoder_norm(out.x)
        logits = self.output_head(hidden)
        loss, scored = None, None
        if targets is not None:
            loss, scored = token_loss(logits, targets, tgt_pad_mask, self.config.label_smoothing)
        new_state = None
        if state is not None:
            new_state = Seq2SeqState(memory, memory_pad_mask, out.state, offset + t, b, self.signature)
        aux = merge_into(dict(encoder_aux), out.aux)  # same-named losses (ponder) are summed
        stats = {**{f"encoder/{key}": value for key, value in encoder_stats.items()}, **out.stats}
        if scored is not None:
            stats["scored"] = scored
        return ModelOutput(logits, loss, aux, new_state, stats, hidden)

    @torch.no_grad()
    def generate(
        self,
        src: Tensor,
        *,
        max_len: int,
        src_pad_mask: Tensor | None = None,
        beam_size: int = 1,
        length_penalty: float = 0.6,
    ) -> Tensor:
        """Decode [b, max_len'] target ids (starting after BOS, ending at EOS, padded with pad_id).

        beam_size 1 is greedy decoding; otherwise beam search with the GNMT length penalty
        ((5 + len) / 6) ** alpha (Wu et al. 2016), as used for the paper's translation results."""
        self.require_head("generate() decodes from the logits")
        check_tokens(src, "src", None)
        check_count(max_len, "max_len", 1)
        check_count(beam_size, "beam_size", 1)
        check_type(length_penalty, float, "length_penalty")
        self.check_decode_length(max_len, "max_len")
        was_training = self.training
        self.eval()
        try:
            return self._beam_search(src, src_pad_mask, max_len, beam_size, length_penalty)
        finally:
            self.train(was_training)

    def _decode_step(self, prefix: Tensor, state: Seq2SeqState, incremental: bool) -> tuple[Tensor, Seq2SeqState]:
        """Log-probabilities of the next token for each row of ``prefix`` [n, l]."""
        if incremental:
            out = self(None, prefix[:, -1:], state=state)
            return torch.log_softmax(out.logits[:, -1].float(), -1), out.state
        fresh = dataclasses.replace(state, layers=None, offset=0)
        out = self(None, prefix, state=fresh)
        return torch.log_softmax(out.logits[:, -1].float(), -1), state

    def _beam_search(self, src: Tensor, src_pad_mask: Tensor | None, max_len: int, beam: int, alpha: float) -> Tensor:
        cfg = self.config
        b, device = src.shape[0], src.device
        state = self.init_state(src, src_pad_mask)
        index = torch.arange(b, device=device).repeat_interleave(beam)  # [b*beam]: rows of each beam
        state = reorder_state(state, index)
        incremental = self.attentions_keep_state()
        prefix = torch.full((b * beam, 1), cfg.bos_id, dtype=torch.long, device=device)
        scores = torch.zeros(b, beam, device=device)
        scores[:, 1:] = float("-inf")  # all beams start identical: keep one alive at first
        finished = torch.zeros(b * beam, dtype=torch.bool, device=device)
        for _ in range(max_len):
            logp, state = self._decode_step(prefix, state, incremental)  # [b*beam, V]
            vocab = logp.shape[-1]
            # a finished hypothesis can only be extended by padding, at no cost
            logp = torch.where(finished[:, None], torch.full_like(logp, float("-inf")), logp)
            logp[finished, cfg.pad_id] = 0.0
            total = (scores.view(-1, 1) + logp).view(b, beam * vocab)
            scores, flat = total.topk(beam, dim=-1)  # [b, beam]
            source_beam, token = flat // vocab, flat % vocab
            rows = (torch.arange(b, device=device)[:, None] * beam + source_beam).view(-1)
            prefix = torch.cat([prefix[rows], token.view(-1, 1)], dim=1)
            finished = finished[rows] | (token.view(-1) == cfg.eos_id)
            state = reorder_state(state, rows)
            if bool(finished.all()):
                break
        lengths = (prefix[:, 1:] != cfg.pad_id).sum(1).clamp_min(1).float().view(b, beam)
        normalised = scores / (((5.0 + lengths) / 6.0) ** alpha) if beam > 1 else scores
        best = normalised.argmax(-1)
        chosen = prefix.view(b, beam, -1)[torch.arange(b, device=device), best, 1:]
        return chosen


# -- presets ------------------------------------------------------------------------------------

TINY = dict(vocab_size=32, d_model=32, n_layers=2, n_heads=4, d_ff=64, dropout=0.0)


@dataclass
class Preset:
    name: str
    build_config: Callable[[], dict[str, Any]]
    description: str
    tiny: dict[str, Any]  # overrides giving a CPU-second-sized version (tests, demo)
    example_length: int  # a sequence length the tiny version accepts


def register_preset(
    name: str, description: str, *, tiny: dict[str, Any] | None = None, example_length: int = 24
) -> Callable[[Callable[[], dict]], Callable[[], dict]]:
    """Register a preset: a function returning the config values that differ from ModelConfig's.

    ``tiny`` is merged over the generic tiny size (:data:`TINY`) for tests and the demo."""

    def add(fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        MODEL.register(name, Preset(name, fn, description, {**TINY, **(tiny or {})}, example_length))
        return fn

    return add


def get_preset(name: str) -> Preset:
    return MODEL.get(name)


HEADS: dict[str, type[ZooModel]] = {"lm": CausalLM, "classifier": SequenceClassifier, "seq2seq": EncoderDecoder}


def preset_config(name: str, **overrides: Any) -> ModelConfig:
    """The resolved config of preset ``name`` with ``overrides`` merged in (nothing built)."""
    preset: Preset = MODEL.get(name)
    base = ModelConfig(name=name).to_dict()
    base = merge_config(base, preset.build_config())
    base["name"] = name
    overrides.pop("name", None)
    return ModelConfig(**merge_config(base, overrides))


def create_model(name: str, **overrides: Any) -> ZooModel:
    """Build preset ``name`` with ``overrides`` merged over its config.

    ``zoo.create_model("vanilla_lm", vocab_size=256, d_model=64, n_layers=2, n_heads=4)``;
    ``attention="lsh"`` swaps the mechanism, ``attention={"n_hashes": 8}`` tweaks it;
    ``zoo.create_model(**model.config.to_dict())`` rebuilds the exact model."""
    config = preset_config(name, **overrides)
    return HEADS[config.kind](config)


def list_models(pattern: str = "*") -> list[str]:
    return MODEL.list(pattern)
