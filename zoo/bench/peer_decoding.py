"""How ``zoo.bench --generate`` decodes with another library's model: each peer's own cached decoding, as its
users run it, timed from a state prefilled once (each round starts from that prompt again).

- ``hf_llama``: HF transformers' ``LlamaForCausalLM.generate()`` with a ``DynamicCache`` (grows per token);
- ``hf_llama_static``: the same ``generate()`` with a ``StaticCache`` sized once for prompt + new tokens
  (written in place; attention reads the whole preallocated length, masked);
- ``x_transformers``: x-transformers' cached decoding, the loop of its ``AutoregressiveWrapper.generate``
  (``net(tokens, cache=cache, return_intermediates=True)`` per token, greedy), its cache of keys and values
  concatenated per token (a new tensor each step, so the prefilled cache stays as it was).

HF's caches grow or are written in place (they are not values), so they are cropped back to the prompt before
each round. Every adapter answers ``prefill(model, prompt) -> cache``, ``decoder(model, cache, prompt, new)
-> a callable decoding ``new`` tokens`` and ``tensors(cache)`` (what the state's bytes count).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class PeerDecoding:
    prefill: Callable[[nn.Module, Tensor, int], Any]  # (model, prompt, new tokens) -> the prefilled cache
    decoder: Callable[[nn.Module, Any, Tensor, int], Callable[[], None]]
    tensors: Callable[[Any], list[Tensor]]


def hf_prefill(static: bool) -> Callable[[nn.Module, Tensor, int], Any]:
    """An HF model's cache after all but the last prompt token (its generate() feeds that one)."""

    def prefill(model: nn.Module, prompt: Tensor, new_tokens: int) -> Any:
        from transformers import DynamicCache, StaticCache

        if static:
            cache = StaticCache(config=model.config, max_cache_len=prompt.shape[1] + new_tokens)
        else:
            cache = DynamicCache(config=model.config)
        model(prompt[:, :-1], cache=cache, use_cache=True)
        return cache

    return prefill


def hf_tensors(cache: Any) -> list[Tensor]:
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def hf_decoder(model: nn.Module, cache: Any, prompt: Tensor, new_tokens: int) -> Callable[[], None]:
    """HF's generate() (greedy, exactly ``new_tokens`` tokens, as many forward calls as ours) from the
    prefilled cache, cropped back to the prompt first."""
    context = prompt.shape[1] - 1

    def decode() -> None:
        seen = int(cache.get_seq_length())
        if seen > context:
            cache.crop(context - seen)
        options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        model.generate(input_ids=prompt, cache=cache, **options)

    return decode


def x_prefill(model: nn.Module, prompt: Tensor, new_tokens: int) -> Any:
    """x-transformers' cache after the whole prompt: (the last logits, the cache)."""
    logits, cache = model(prompt, return_intermediates=True)
    return logits[:, -1], cache


def x_tensors(prefilled: Any) -> list[Tensor]:
    _, cache = prefilled
    return [t for inter in cache.attn_intermediates if inter.cached_kv is not None for t in inter.cached_kv]


def x_decoder(model: nn.Module, prefilled: Any, prompt: Tensor, new_tokens: int) -> Callable[[], None]:
    """The loop of x-transformers' AutoregressiveWrapper.generate with cache_kv: the whole sequence so far
    goes in each step (the net reads only what its cache has not seen), greedy."""
    last, start = prefilled

    def decode() -> None:
        out, logits, cache = prompt, last, start
        for _ in range(new_tokens):
            out = torch.cat([out, logits.argmax(-1, keepdim=True)], dim=1)
            logits, cache = model(out, return_intermediates=True, cache=cache)
            logits = logits[:, -1]

    return decode


PEER_DECODING: dict[str, PeerDecoding] = {
    "hf_llama": PeerDecoding(hf_prefill(static=False), hf_decoder, hf_tensors),
    "hf_llama_static": PeerDecoding(hf_prefill(static=True), hf_decoder, hf_tensors),
    "x_transformers": PeerDecoding(x_prefill, x_decoder, x_tensors),
}
