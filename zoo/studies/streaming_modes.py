"""What the streaming study measures on a trained model (``zoo/studies/streaming.py``): the four ways to
stream it, and the attention mass its queries give the first keys.

Paper: Xiao, Tian, Chen, Han, Lewis 2023, "Efficient Streaming Language Models with Attention Sinks",
arXiv:2309.17453. Modes, each an ``attention=`` override of the same weights:

- ``dense``: the unbounded KV cache (every earlier token; memory and time per token grow);
- ``window``: ``max_cache=W`` (the most recent W keys; the paper's "window attention");
- ``sinks``: ``max_cache=W, sinks=k`` (the first k keys kept, the window rolled; StreamingLLM);
- ``recompute``: the model re-run from scratch on the last W + 1 tokens for every token ("sliding window
  with re-computation"; O(W^2) per token).

A rolled cache numbers its keys by their place in it (Section 3.2) where the position part can
(``cache_positions``, rope): a key's rotation then never exceeds the window, the distances trained on.

The sink mass (Section 3.1, Figure 2) is recomputed from each layer's input as its ``forward`` would
(projections, the position part's rotation and bias, the causal mask): a [t, t] matrix per head, a
diagnostic at a few hundred tokens, not a mechanism.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import zoo
from zoo.attention.base import ATTENTION
from zoo.attention.vanilla import VanillaAttention
from zoo.bench.generate import state_bytes
from zoo.config import NoOptions
from zoo.position.base import POSITION

MODES = ("dense", "window", "sinks", "recompute")


def mode_models(model: torch.nn.Module, window: int, sinks: int) -> dict[str, torch.nn.Module]:
    """The trained model under each mode's attention options (the same weights, loaded into each)."""
    config = model.config.to_dict()
    attention = {"dense": {"max_cache": 0}, "window": {"max_cache": window},
                 "sinks": {"max_cache": window, "sinks": sinks}}
    attention["recompute"] = attention["dense"]
    position = dict(config["position"] if isinstance(config["position"], dict) else {"name": config["position"]})
    renumber = "cache_positions" in getattr(POSITION.get(position["name"]), "Options", NoOptions).__dataclass_fields__
    out = {}
    for mode in MODES:
        part = dict(config["attention"] if isinstance(config["attention"], dict) else {"name": config["attention"]})
        cache_options = getattr(ATTENTION.get(part["name"]), "Options", NoOptions).__dataclass_fields__
        if not {"max_cache", "sinks"} <= set(cache_options):  # the modes are options of a bounded KV cache
            raise ValueError(f"the four modes set max_cache and sinks of the model's KV cache; its attention "
                             f"{part['name']!r} has no such options")
        rolled = {"cache_positions": True} if renumber and mode in ("window", "sinks") else {}
        built = zoo.create_model(
            **{**config, "attention": {**part, **attention[mode]}, "position": {**position, **rolled}})
        built.load_state_dict(model.state_dict())
        out[mode] = built.eval()
    return out


class Stream:
    """One mode's pass over the stream: NLL per predicted token, seconds, the state's bytes."""

    def __init__(self, mode: str, model: torch.nn.Module, window: int):
        self.mode, self.model, self.window = mode, model, window
        self.state = None if mode == "recompute" else model.init_state(1)
        self.nll: list[float] = []
        self.seconds = 0.0

    @torch.no_grad()
    def run(self, tokens: torch.Tensor, start: int, end: int) -> None:
        """Predict tokens[start + 1 ... end] from everything before them (as the mode allows)."""
        begin = time.perf_counter()
        if self.mode == "recompute":
            self.nll.extend(self.recompute(tokens, start, end))
        else:
            for i in range(start, end):
                out = self.model(tokens[None, i : i + 1], state=self.state)
                self.state = out.state
                self.nll.append(float(F.cross_entropy(out.logits[0, -1], tokens[i + 1])))
        self.seconds += time.perf_counter() - begin

    def recompute(self, tokens: torch.Tensor, start: int, end: int, batch: int = 64) -> list[float]:
        """Every position i re-run from scratch on tokens[i - W ... i] (W + 1 tokens; the whole prefix
        while it is shorter), in batches of windows."""
        nll, w = [], self.window
        for first in range(start, end, batch):
            rows = range(first, min(first + batch, end))
            for i in (i for i in rows if i < w):  # the stream's first W positions: each its whole prefix
                logits = self.model(tokens[None, : i + 1]).logits[0, -1]
                nll.append(float(F.cross_entropy(logits, tokens[i + 1])))
            full = [i for i in rows if i >= w]
            if full:
                logits = self.model(torch.stack([tokens[i - w : i + 1] for i in full])).logits[:, -1]
                nll.extend(F.cross_entropy(logits, tokens[[i + 1 for i in full]], reduction="none").tolist())
        return nll

    def cache_mib(self) -> float:
        return 0.0 if self.state is None else state_bytes(self.state) / 2**20


def attention_weights(attn: VanillaAttention, x: torch.Tensor) -> torch.Tensor:
    """softmax of the layer's causal scores over x [b, t, d] (the attention's input) -> [b, h, t, t]."""
    t = x.shape[1]
    positions = torch.arange(t, device=x.device)
    q, k = attn.split_heads(attn.to_q(x)), attn.split_heads(attn.to_k(x))
    q, k = attn.rotate(q, positions), attn.rotate(k, positions)
    scores = torch.einsum("bhik,bhjk->bhij", q, k) * q.shape[-1] ** -0.5
    bias = attn.pair_bias(positions[:, None] - positions[None, :], scores.dtype)  # [h, t, t] or None
    if bias is not None:
        scores = scores + bias
    future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1)


@torch.no_grad()
def sink_mass(model: torch.nn.Module, segments: torch.Tensor, first: int, sinks: int) -> list[dict]:
    """Per layer and head: the mean weight queries first ... t - 1 give to keys 0 ... sinks - 1, beside the
    uniform share (sinks / (i + 1) for the query at i). segments: long [n, t]."""
    layers = [m for m in model.modules() if isinstance(m, VanillaAttention)]
    if not layers:
        raise ValueError("the model has no vanilla attention: the weights are recomputed as vanilla computes them")
    inputs: dict[int, torch.Tensor] = {}
    hooks = [layer.register_forward_pre_hook(lambda module, args, index=index: inputs.__setitem__(index, args[0]))
             for index, layer in enumerate(layers)]
    try:
        model(segments)
    finally:
        for hook in hooks:
            hook.remove()
    t = segments.shape[1]
    uniform = float((sinks / torch.arange(first + 1, t + 1, dtype=torch.float64)).mean())
    rows = []
    for index, layer in enumerate(layers):
        weights = attention_weights(layer, inputs[index])[:, :, first:, :sinks].sum(-1)  # [n, h, t - first]
        for head, mass in enumerate(weights.mean((0, 2)).tolist()):
            rows.append(dict(layer=index, head=head, mass=mass, uniform=uniform, ratio=mass / uniform))
    return rows
