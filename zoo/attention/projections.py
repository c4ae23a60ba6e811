"""Options every mechanism's q/k/v projections share: grouped keys and values, QK-norm, soft-capping.

Not a mechanism (nothing registers here). Every attention's ``Options`` takes these fields besides its
own (``Attention.__init_subclass__`` adds them), so ``attention.n_kv_heads=2`` reaches any mechanism
and one that cannot apply a field refuses it when the layer is built, saying why
(``Attention.projection_features`` / ``no_projection_reason``, as positions are refused):

- ``n_kv_heads`` (grouped-query attention, Ainslie et al. 2023, arXiv:2305.13245; 1 = multi-query
  attention, Shazeer 2019, arXiv:1911.02150): the key and value projections give ``n_kv_heads`` heads and
  each serves ``n_heads / n_kv_heads`` query heads (query head i reads key head i // group, the grouping of
  Hugging Face's ``repeat_kv`` and SDPA's ``enable_gqa``). A mechanism that applies it keeps the grouped
  keys and values in its cache (KV cache, pattern caches), so a decoding state is n_heads / n_kv_heads
  times smaller, and widens them to every head only where it scores.
- ``qk_norm`` (Henry et al. 2020, "Query-Key Normalization for Transformers", arXiv:2010.04245; per head,
  as Dehghani et al. 2023 and OLMo 2 / Qwen 3 apply it): a norm of the norm axis (``zoo/norm``: rmsnorm,
  layernorm, ...) over each head's queries and keys, right after the projection and before any rotation,
  with its own weights for q and for k. ``none`` = off.
- ``softcap`` (Gemma 2, Gemma Team 2024, arXiv:2408.00118): scores become cap * tanh(scores / cap)
  before the softmax, where the mechanism writes its scores out. 0 = off.

Shapes as in ``base.py``; ``g`` = n_heads / n_kv_heads (query heads per key head), ``j`` = n_kv_heads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from einops import rearrange, repeat
from torch import Tensor, nn

from zoo.config import require
from zoo.norm import NORM, create_norm
from zoo.registry import unknown

PROJECTION_FEATURES = ("grouped_kv", "qk_norm", "softcap")  # what a mechanism may list in projection_features


@dataclass
class ProjectionOptions:
    """The projection options of every mechanism (see the module notes)."""

    n_kv_heads: int = 0  # key/value heads (0 = n_heads); n_heads / n_kv_heads query heads share each (GQA; 1 = MQA)
    qk_norm: str = "none"  # none, or a norm (rmsnorm, layernorm, ...): per head, on queries and keys before rotation
    softcap: float = 0.0  # scores -> softcap * tanh(scores / softcap) before the softmax (Gemma 2); 0 = off

    def __post_init__(self) -> None:
        require(self.n_kv_heads >= 0, f"n_kv_heads must be an int >= 0 (0 = n_heads), got {self.n_kv_heads}")
        if self.qk_norm != "none" and self.qk_norm not in NORM:
            raise unknown("qk_norm (none or a norm)", self.qk_norm, ["none", *NORM.list()])
        require(self.softcap >= 0.0, f"softcap must be >= 0 (0 = off), got {self.softcap}")
        after = getattr(super(), "__post_init__", None)  # the mechanism's own checks (later in the MRO)
        if after is not None:
            after()

    def features(self) -> list[str]:
        """The features these options ask for (names of ``PROJECTION_FEATURES``)."""
        asked = {"grouped_kv": self.n_kv_heads != 0, "qk_norm": self.qk_norm != "none", "softcap": self.softcap > 0}
        return [name for name in PROJECTION_FEATURES if asked[name]]


PROJECTION_KEYS = frozenset(f.name for f in dataclasses.fields(ProjectionOptions))


def with_projection_options(own: type) -> type:
    """A mechanism's ``Options`` with the projection fields after its own (one dataclass: the Hydra
    schema, the generated YAML and the option checks read it as they read any Options)."""
    taken = PROJECTION_KEYS & {f.name for f in dataclasses.fields(own)}
    require(not taken, f"{own.__qualname__} declares {sorted(taken)}, which every mechanism's projections take")
    merged = type(own.__name__, (ProjectionOptions, own), {"__module__": own.__module__, "__doc__": own.__doc__})
    merged.__qualname__ = own.__qualname__
    return dataclass(merged)


class HeadNormedLinear(nn.Linear):
    """A q or k projection followed by a norm over each head: [b, t, d] -> [b, t, heads * k], every head's
    k entries normalised on their own (QK-norm). Holds the norm as ``head_norm``, so a model without
    QK-norm keeps the plain ``nn.Linear`` state-dict keys."""

    def __init__(self, d_in: int, heads: int, head_dim: int, *, bias: bool, norm: str):
        super().__init__(d_in, heads * head_dim, bias=bias)
        self.head_dim = head_dim
        self.head_norm = create_norm(norm, head_dim)  # the norm axis (zoo/norm), over one head's k entries

    def forward(self, x: Tensor) -> Tensor:
        y = rearrange(super().forward(x), "... (h k) -> ... h k", k=self.head_dim)
        return rearrange(self.head_norm(y), "... h k -> ... (h k)")


def expand_kv(x: Tensor, n_heads: int) -> Tensor:
    """Grouped keys or values [b, j, ..., k] -> [b, h, ..., k]: kv head i serves query heads i g ... i g + g - 1."""
    groups = n_heads // x.shape[1]
    return x if groups == 1 else repeat(x, "b j ... -> b (j g) ...", g=groups)


def softcapped_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    cap: float,
    allowed: Callable[[int, int], Tensor | None],
    bias: Callable[[int, int], Tensor | None] = lambda start, stop: None,
    dropout: float = 0.0,
    block: int = 256,
) -> Tensor:
    """softmax(cap * tanh(q k^T / (sqrt(k) cap)) + bias) v over queries in blocks of ``block`` (so no
    [t, s] score tensor is built past one block's [block, s]). q [b, h, t, k]; k, v [b, h, s, k] (expanded).
    ``allowed(start, stop)``: bool broadcastable to [b, h, stop - start, s] for those queries (None = every
    key); ``bias(start, stop)``: an additive float term of the same shape, added after the cap (ALiBi, T5),
    or None. A query with no allowed key returns 0."""
    scale = q.shape[-1] ** -0.5
    outs = []
    for start in range(0, q.shape[2], block):
        stop = min(start + block, q.shape[2])
        scores = torch.einsum("bhtk,bhsk->bhts", q[:, :, start:stop], k) * scale
        scores = cap * torch.tanh(scores / cap)
        extra = bias(start, stop)
        if extra is not None:
            scores = scores + extra
        mask = allowed(start, stop)
        has_key = None
        if mask is not None:
            has_key = mask.any(-1, keepdim=True)  # a row with no key sees every key, and returns 0 (no NaN)
            scores = scores.masked_fill(~(mask | ~has_key), float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if dropout:
            weights = nn.functional.dropout(weights, dropout)
        out = torch.einsum("bhts,bhsk->bhtk", weights, v)
        outs.append(out if has_key is None else out * has_key.to(out.dtype))
    return torch.cat(outs, dim=2)
