"""Decoding a causal language model: the loop behind ``CausalLM.generate`` and ``CausalLM.stream``.

What it offers is what users of HF ``generate`` reach for: greedy or sampled tokens
(:mod:`zoo.models.sampling`), end tokens with per-row stopping, a seeded generator, left-padded
batched prompts, and the tokens step by step as they come (an iterator, or a callback).

Left padding: a batch of prompts of different lengths is right-aligned, ``pad_mask`` [b, t0] False
on each row's leading pad positions. Every row then decodes as it would alone: padded keys are never
attended (the caches keep their key padding), and a row's positions count from its first real token
(``ModelState.shift``: the absolute input signal is shifted per row; the relative ones inside
attention see the same distances). A mechanism whose cache cannot take that (a pattern laid out by
absolute position, a state that padding would update) refuses with the reason
(``Attention.left_padding_refusal``), and so does a model that recomputes the prefix each step.

Per-row stopping: once a row has emitted one of ``eos_token_id`` it emits ``pad_token_id`` (default:
the first end token) from then on; decoding ends when every row has stopped or after
``max_new_tokens``. A stopped row still rides through the batched forward calls; what it computes
there is never used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from zoo.models.inputs import check_count, check_pad_mask, check_tokens
from zoo.models.sampling import Sampling, check_generator


@dataclass
class Step:
    """One step of decoding, for every row of the batch."""

    tokens: Tensor  # [b] long: the token each row emits (pad_token_id for a row stopped earlier)
    logits: Tensor  # [b, V]: the model's next-token logits this step, before any processor
    finished: Tensor  # [b] bool: rows that have emitted an end token (this step included)


def end_tokens(eos_token_id: int | list[int] | tuple[int, ...] | None, vocab_size: int) -> list[int]:
    """The end tokens as a list (empty: never stop early), each checked against the vocabulary."""
    if eos_token_id is None:
        return []
    ids = [eos_token_id] if isinstance(eos_token_id, int) and not isinstance(eos_token_id, bool) else eos_token_id
    if not isinstance(ids, (list, tuple)) or not ids:
        raise ValueError(f"eos_token_id must be an int or a non-empty list of ints; got {eos_token_id!r}")
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab_size:
            raise ValueError(f"eos_token_id: every end token must be an int in [0, vocab_size={vocab_size}); got {i!r}")
    return list(ids)


def left_padding(pad_mask: Tensor | None, prompt: Tensor) -> Tensor | None:
    """Pad positions leading each row, long [b] (None when ``pad_mask`` is None); refuses a mask that
    is not left padding (a pad after a real token) or a row with no real token."""
    if pad_mask is None:
        return None
    check_pad_mask(pad_mask, prompt)
    real_so_far = pad_mask.long().cummax(dim=1).values.bool()  # True from each row's first real token on
    if not torch.equal(real_so_far, pad_mask):
        raise ValueError(
            "pad_mask must be left padding for generate(): each row's pad positions (False) all before its real "
            "tokens, so that every row's next token follows its prompt; right-align the prompts"
        )
    if not pad_mask[:, -1].all():
        raise ValueError("pad_mask: every row needs at least one real token (a row is all padding)")
    return (~pad_mask).sum(dim=1)


def decode(
    model,
    prompt: Tensor,
    max_new_tokens: int,
    *,
    sampling: Sampling,
    pad_mask: Tensor | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    generator: torch.Generator | None = None,
) -> Iterator[Step]:
    """Steps of decoding ``prompt`` [b, t0] with ``model`` (a ``CausalLM`` in eval mode, no grad)."""
    cfg = model.config
    check_tokens(prompt, "prompt", cfg.vocab_size)
    check_count(max_new_tokens, "max_new_tokens", 0)
    check_generator(generator)
    ends = end_tokens(eos_token_id, cfg.vocab_size)
    if pad_token_id is None:
        pad_token_id = ends[0] if ends else cfg.pad_id
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int) or not 0 <= pad_token_id < cfg.vocab_size:
        raise ValueError(f"pad_token_id must be an int in [0, vocab_size={cfg.vocab_size}); got {pad_token_id!r}")
    shift = left_padding(pad_mask, prompt)
    if shift is not None and not bool(shift.any()):  # no row is padded: nothing to refuse or shift
        shift = pad_mask = None
    incremental = model.attentions_keep_state()
    if shift is not None:
        reason = model.left_padding_refusal()
        if reason is not None:
            raise ValueError(
                f"{cfg.name} cannot decode left-padded prompts (pad_mask=): {reason}. Generate each prompt alone "
                "(pad_mask=None), or prompts of one length together"
            )
    b, t0 = prompt.shape
    if incremental:  # the cache keeps every position (the recomputing path slides a window instead)
        model.check_decode_length(t0 + max_new_tokens, "prompt length + max_new_tokens")
        state = model.init_state(b)
        if shift is not None:
            state = dataclasses.replace(state, shift=shift)
        out = model(prompt, pad_mask=pad_mask, state=state)
    else:
        out = model(prompt[:, -cfg.max_len :])
    seen = None
    if sampling.repetition_penalty != 1.0:  # the row's real tokens, never its padding
        real = torch.ones_like(prompt) if pad_mask is None else pad_mask.long()
        seen = torch.zeros(b, cfg.vocab_size, dtype=torch.long, device=prompt.device).scatter_add_(1, prompt, real) > 0
    ends_tensor = torch.tensor(ends, dtype=torch.long, device=prompt.device)
    finished = torch.zeros(b, dtype=torch.bool, device=prompt.device)
    tokens = prompt
    for step in range(max_new_tokens):
        logits = out.logits[:, -1]
        chosen = sampling.next_tokens(logits, seen, generator)
        chosen = torch.where(finished, torch.full_like(chosen, pad_token_id), chosen)
        finished = finished | torch.isin(chosen, ends_tensor)
        if seen is not None:
            seen.scatter_(1, chosen[:, None], True)
        yield Step(chosen, logits, finished.clone())
        if step == max_new_tokens - 1 or bool(finished.all()):
            return
        if incremental:
            out = model(chosen[:, None], state=out.state)
        else:
            tokens = torch.cat([tokens, chosen[:, None]], dim=1)
            out = model(tokens[:, -cfg.max_len :])
