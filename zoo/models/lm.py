"""The causal language model (``kind="lm"``): decoder-only. Token embeddings are scaled by
sqrt(d_model) and tied to the output projection (Vaswani et al. 2017, Section 3.4); optional
adaptive input and softmax (:mod:`zoo.models.adaptive_softmax`) and Al-Rfou et al.'s auxiliary
losses (:mod:`zoo.models.al_rfou_losses`); decoding through the
caches (:mod:`zoo.models.generation`, :mod:`zoo.models.sampling`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from zoo.config import ModelConfig, check_type
from zoo.models.adaptive_softmax import adaptive_input_and_softmax
from zoo.models.al_rfou_losses import AlRfouLosses
from zoo.models.base import HEAD, ModelOutput, ModelState, TokenEmbedding, ZooModel
from zoo.models.generation import Step, decode
from zoo.models.inputs import check_count, check_pad_mask, check_targets, count_scored
from zoo.models.losses import token_loss
from zoo.models.sampling import Sampling
from zoo.stacks.build import build_stack, create_position


@HEAD.register("lm")
class CausalLM(ZooModel):
    attention_directions = ("causal",)
    packs_documents = True  # documents=: targets are cut per document before packing (zoo/data/packing.py)

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        adaptive = adaptive_input_and_softmax(config) if config.adaptive else None  # zoo/models/adaptive_softmax.py
        self.embed = (
            adaptive[0]
            if adaptive
            else TokenEmbedding(config.vocab_size, config.d_model, init_std=config.token_init_std)
        )
        self.position = create_position(config)
        self.drop = nn.Dropout(config.dropout)
        self.stack = build_stack(config, causal=True, cross=False, n_layers=config.n_layers, position=self.position)
        self.position.attach(self.stack)  # a signal at every layer's input (Al-Rfou et al. 2018) hooks in here
        self.norm = self.final_norm()
        if adaptive:
            self.head = adaptive[1]
        else:
            self.head = nn.Linear(config.d_model, config.vocab_size, bias=False) if config.head == "linear" else None
        if config.tie_embeddings and self.head is not None and not adaptive:
            self.head.weight = self.embed.weight
        self.aux_heads = self.al_rfou_losses() if config.aux_losses else None

    def al_rfou_losses(self) -> AlRfouLosses:
        """Al-Rfou et al. 2018's intermediate-layer / multiple-target losses (zoo/models/al_rfou_losses.py)."""
        blocks = self.stack.layer_blocks()
        if blocks is None:  # no per-layer outputs (universal re-applies one block; reversible skips block())
            raise ValueError(
                f"aux_losses needs one block per layer, each called in turn (stack 'sequential'); stack "
                f"{self.stack.registry_name!r} has no per-layer outputs (Stack.layer_blocks() is None)"
            )
        return AlRfouLosses(
            self.config.aux_losses,
            blocks=blocks,
            norm=self.norm,
            head=self.head,
            d_model=self.config.d_model,
            vocab_size=self.config.vocab_size,
        )

    def output_flops(self, t: int) -> tuple[float, str] | None:
        if self.head is None:
            return 0.0, "no output head"
        if isinstance(self.head, nn.Linear):
            return 2.0 * t * self.head.weight.numel(), "full softmax"
        ask = getattr(self.head, "forward_flops", None)  # the adaptive softmax counts its own clusters
        return (ask(t), self.head.flops_rule) if callable(ask) else None

    def init_state(self, batch_size: int) -> ModelState:
        """An empty state that turns on caching (KV cache) for incremental decoding."""
        check_count(batch_size, "batch_size", 1)
        self.refuse_stream()
        return ModelState(self.stack.init_state(batch_size), 0, batch_size, self.signature)

    def forward(
        self,
        tokens: Tensor | None = None,
        targets: Tensor | None = None,
        *,
        embeds: Tensor | None = None,
        pad_mask: Tensor | None = None,
        state: ModelState | None = None,
        documents: Tensor | None = None,
    ) -> ModelOutput:
        """tokens [b, t] ids, or embeds [b, t, d_model] vectors (exactly one). ``documents`` long [b, t]: packed
        rows, each position's document in its row (zoo/attention/documents.py); no token sees another document,
        positions count from each document's start, and ``targets`` must already be cut per document."""
        self.refuse_without_head(targets)
        x = self.input_vectors(self.embed, tokens, embeds)
        b, t = x.shape[:2]
        check_pad_mask(pad_mask, x[..., 0])
        self.check_state(state, b, stack=self.stack)
        offset = state.offset if state is not None else 0
        shift = state.shift if state is not None else None
        if documents is not None:  # per-token positions [b, t], each document from 0
            shift, offset = None, self.packed_positions(documents, x, state)
        # a left-padded row's positions count from its first real token ([b] starts; generation.py)
        x = self.drop(self.position(x, offset if shift is None else offset - shift))
        auxiliary = self.aux_heads is not None and self.training and targets is not None
        if self.aux_heads is not None:
            self.aux_heads.start(auxiliary)
        layers = state.layers if state is not None else None
        packed = {} if documents is None else {"documents": documents}
        out = self.stack(x, pad_mask=pad_mask, state=layers, **packed)
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
        if documents is None and (out.state is not None or state is not None):
            new_state = ModelState(out.state, offset + t, b, self.signature, shift)
        return ModelOutput(logits, loss, out.aux, new_state, stats, hidden)

    def packing_refusal(self) -> str | None:
        if self.aux_heads is not None:  # Al-Rfou et al.'s multiple targets predict tokens further ahead
            return "aux_losses predict several tokens ahead from targets that are cut per document only once"
        return super().packing_refusal()

    def left_padding_refusal(self) -> str | None:
        """Why this model cannot decode left-padded prompts through its caches, or None: it must
        continue a sequence from a state (the recomputing path would shift the padded rows' patterns), and
        every layer's cache must keep padding out (``Attention.left_padding_refusal``)."""
        reason = self.stream_refusal()
        if reason is not None:
            return f"it recomputes the prefix each step instead of keeping a state ({reason})"
        reason = self.decoding_stack().left_padding_refusal()
        if reason is not None:
            return reason
        for i, block in enumerate(self.decoding_blocks()):
            reason = block.attention.left_padding_refusal()
            if reason is not None:
                return f"layer {i}: {reason}"
        return None

    def stream(
        self,
        prompt: Tensor,
        max_new_tokens: int,
        *,
        pad_mask: Tensor | None = None,
        do_sample: bool | None = None,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> Iterator[Step]:
        """:meth:`generate` one step at a time: yields a :class:`~zoo.models.generation.Step` (the [b]
        tokens emitted, the raw [b, V] logits, the rows finished) as each token is chosen."""
        self.require_head("generate() samples from the logits")
        sampling = sampling_options(do_sample, greedy, temperature, top_k, top_p, min_p, repetition_penalty)
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                yield from decode(
                    self,
                    prompt,
                    max_new_tokens,
                    sampling=sampling,
                    pad_mask=pad_mask,
                    eos_token_id=eos_token_id,
                    pad_token_id=pad_token_id,
                    generator=generator,
                )
        finally:
            self.train(was_training)

    def generate(
        self,
        prompt: Tensor,
        max_new_tokens: int,
        *,
        streamer: Callable[[Tensor], Any] | None = None,
        **options: Any,
    ) -> Tensor:
        """Continue ``prompt`` [b, t0] by up to ``max_new_tokens``; returns [b, t0 + n], n the steps taken
        (fewer than ``max_new_tokens`` only when every row emitted an end token).

        Options (HF ``generate``'s names): ``pad_mask`` [b, t0] bool for left-padded prompts (True = real
        token); ``do_sample`` (default: sample unless ``greedy`` or temperature 0), ``temperature``,
        ``top_k``, ``top_p``, ``min_p``, ``repetition_penalty``; ``eos_token_id`` (an int or a list) with
        per-row stopping, a stopped row emitting ``pad_token_id`` (default the first end token);
        ``generator`` (a seeded torch.Generator). ``streamer`` is called with each step's [b] tokens as
        they come. Mechanisms with a cache see one new token per step; the others recompute the
        (position-table-limited) prefix each step (zoo/models/generation.py)."""
        pieces = [prompt]
        for step in self.stream(prompt, max_new_tokens, **options):
            pieces.append(step.tokens[:, None])
            if streamer is not None:
                streamer(step.tokens)
        return torch.cat(pieces, dim=1)


def sampling_options(
    do_sample: bool | None,
    greedy: bool,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    repetition_penalty: float,
) -> Sampling:
    """The :class:`Sampling` these arguments ask for. ``greedy`` is the older spelling of
    ``do_sample=False``; left unset, ``do_sample`` samples unless ``greedy`` (the zoo's default)."""
    check_type(greedy, bool, "greedy")
    if do_sample is None:
        do_sample = not greedy
    elif greedy and do_sample:
        raise ValueError("greedy=True and do_sample=True ask for opposite things: pass one of them")
    options = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    if not do_sample and any(value != Sampling.__dataclass_fields__[key].default for key, value in options.items()):
        set_ = ", ".join(f"{k}={v}" for k, v in options.items() if v != Sampling.__dataclass_fields__[k].default)
        raise ValueError(f"{set_} shape sampling, but decoding is greedy (do_sample=False): set do_sample=True")
    return Sampling(do_sample=do_sample, repetition_penalty=repetition_penalty, **options)
