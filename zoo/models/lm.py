"""The causal language model (``kind="lm"``): decoder-only. Token embeddings are scaled by
sqrt(d_model) and tied to the output projection (Vaswani et al. 2017, Section 3.4); optional
adaptive input and softmax (:mod:`zoo.models.adaptive_softmax`) and Al-Rfou et al.'s auxiliary
losses (:mod:`zoo.models.al_rfou_losses`); sampling through the KV cache.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.config import ModelConfig
from zoo.models.adaptive_softmax import adaptive_input_and_softmax
from zoo.models.al_rfou_losses import AlRfouLosses
from zoo.models.base import HEAD, ModelOutput, ModelState, TokenEmbedding, ZooModel
from zoo.models.inputs import (
    check_count,
    check_pad_mask,
    check_sampling,
    check_targets,
    check_tokens,
    count_scored,
)
from zoo.models.losses import token_loss
from zoo.stacks.build import build_stack, create_position


@HEAD.register("lm")
class CausalLM(ZooModel):
    attention_directions = ("causal",)

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
