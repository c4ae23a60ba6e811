"""The helpers a mechanism may call on itself, mixed into :class:`zoo.attention.base.Attention`: the standard
q/k/v/output projections and head reshapes, positions inside attention applied to the pairs it computes,
clear refusals of wrong inputs and of states the layer cannot continue; and ``require_length`` for
mechanisms sized by the longest sequence. What a mechanism must declare and answer is the contract in
``base.py``; masks are in ``masks.py``, keys-per-query and FLOP rules in ``costs.py``, state helpers in
``state.py``. Shapes as in ``base.py``."""

from __future__ import annotations

from typing import Any

import torch
from einops import rearrange
from torch import Tensor, nn

from zoo.attention.flex import DistanceBias
from zoo.attention.projections import HeadNormedLinear, expand_kv
from zoo.config import require


class AttentionHelpers:
    """Methods every mechanism inherits through :class:`~zoo.attention.base.Attention`. They read what its
    ``__init__`` sets (``d_model``, ``n_heads``, ``n_kv_heads``, ``head_dim``, ``causal``, ``options``,
    ``position``) and its capability flags; none is part of what a mechanism must implement."""

    # -- positions inside attention -----------------------------------------------------------
    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Queries or keys [..., n, k] at absolute positions long [n], rotated when the layer's position
        part rotates (rope), else x itself."""
        position = self.position
        return x if position is None or not position.rotary else position.rotate(x, positions)

    @property
    def has_pair_bias(self) -> bool:
        return self.position is not None and self.position.pair_bias

    def flex_bias(self, query_positions: Tensor, key_positions: Tensor, dtype: torch.dtype) -> DistanceBias | None:
        """The position part's pair bias as FlexAttention's score_mod (``zoo.attention.flex.DistanceBias``)
        over the distances of these queries [t] and keys [s] (a table of t + s - 1 entries at most), or None."""
        if not self.has_pair_bias or query_positions.numel() == 0 or key_positions.numel() == 0:
            return None
        low = int(query_positions.min() - key_positions.max())
        high = int(query_positions.max() - key_positions.min())
        table = self.pair_bias(torch.arange(low, high + 1, device=query_positions.device), dtype)
        return DistanceBias(table, low, query_positions, key_positions)

    def pair_bias(self, distance: Tensor, dtype: torch.dtype, head: Tensor | None = None) -> Tensor | None:
        """b_h(i - j) of the layer's position part for query-minus-key distances (long [...]) ->
        [h, ...] in ``dtype`` (or [...] with ``head``, see ``Position.distance_bias``); None when the
        part adds no bias."""
        if not self.has_pair_bias:
            return None
        return self.position.distance_bias(distance, causal=self.causal, dtype=dtype, head=head)

    # -- shared input checks -----------------------------------------------------------------
    def check_inputs(self, x: Tensor, context: Tensor | None, pad_mask: Tensor | None, state: Any) -> None:
        """Clear errors for wrong shapes/dtypes instead of a shape error deep inside torch."""
        name = self.registry_name or type(self).__name__
        if not (isinstance(x, Tensor) and x.dim() == 3 and x.is_floating_point()):
            raise ValueError(f"{name}: x must be a float tensor [b, t, d]; got {_describe(x)}")
        if x.shape[-1] != self.d_model:
            raise ValueError(f"{name}: x has d={x.shape[-1]} but the attention was built with d_model={self.d_model}")
        if x.shape[0] == 0 or x.shape[1] == 0:
            raise ValueError(f"{name}: x is empty ({_describe(x)}): attention needs b >= 1 rows of t >= 1 positions")
        weight = next(self.parameters(), None)
        autocast = torch.is_autocast_enabled(x.device.type)  # mixed dtypes are autocast's business
        if weight is not None and x.dtype != weight.dtype and not autocast:
            raise ValueError(
                f"{name}: x has dtype {x.dtype} but the attention's parameters are {weight.dtype}; "
                f"convert one to the other (x.to({weight.dtype}) or attn.to({x.dtype}))"
            )
        if context is not None:
            if not self.supports_cross:
                raise ValueError(
                    f"{name} does not support cross-attention (context=...); mechanisms that do: see "
                    "zoo.list_attention() with supports_cross"
                )
            fits = isinstance(context, Tensor) and context.dim() == 3 and context.shape[0] == x.shape[0]
            fits = fits and context.shape[1] > 0 and context.shape[-1] == self.d_model
            if not (fits and (autocast or context.dtype == x.dtype)):
                raise ValueError(
                    f"{name}: context must be [b={x.shape[0]}, c >= 1, d={self.d_model}] of x's dtype {x.dtype}; "
                    f"got {_describe(context)}"
                )
        if pad_mask is not None:
            keys = context if context is not None else x
            if not (isinstance(pad_mask, Tensor) and pad_mask.dtype == torch.bool):
                raise ValueError(
                    f"{name}: pad_mask must be a bool tensor (True = real token); got {_describe(pad_mask)}"
                )
            if tuple(pad_mask.shape) != tuple(keys.shape[:2]):
                raise ValueError(
                    f"{name}: pad_mask must be [b, {'c' if context is not None else 't'}] = "
                    f"{tuple(keys.shape[:2])}; got {tuple(pad_mask.shape)}"
                )
        if state is not None and not self.supports_memory:
            raise ValueError(f"{name} keeps no state (supports_memory=False) but was given one")
        if state is not None and context is None:
            self.refuse_state(state)

    def refuse_state(self, state: Any) -> None:
        """Raise, with the reason, when a self-attention ``state`` is given to a layer that cannot
        continue from it (never compute without the earlier context)."""
        if state is not None:
            reason = self.stream_refusal()
            if reason is not None:
                raise ValueError(reason)

    def refuse_chunk_state(self, state: Any) -> None:
        """A decoding cache is not continued over a split sequence: refuse one, naming the layer."""
        if state is not None:
            name = self.registry_name or type(self).__name__
            raise ValueError(
                f"attention {name!r} does not continue a state over a sequence split across ranks; feed the whole "
                "sequence (state=None) or run it in one process"
            )

    # -- projections -------------------------------------------------------------------------
    def add_projections(self, bias: bool = True) -> None:
        """The standard separate q/k/v/output projections, shared by every mechanism that does not tie
        them (LSH ties q and k and builds its own): q and output d -> d, k and v d -> n_kv_heads * k
        (grouped-query attention), q and k normalised per head under ``qk_norm`` (projections.py)."""
        d, heads, k, norm = self.d_model, self.n_heads, self.head_dim, self.options.qk_norm
        kv = self.n_kv_heads * k
        if norm == "none":
            self.to_q, self.to_k = nn.Linear(d, d, bias=bias), nn.Linear(d, kv, bias=bias)
        else:
            self.to_q = HeadNormedLinear(d, heads, k, bias=bias, norm=norm)
            self.to_k = HeadNormedLinear(d, self.n_kv_heads, k, bias=bias, norm=norm)
        self.to_v = nn.Linear(d, kv, bias=bias)
        self.to_out = nn.Linear(d, d, bias=bias)

    def expand_kv(self, *tensors: Tensor) -> Tensor | tuple[Tensor, ...]:
        """Grouped keys/values [b, n_kv_heads, ..., k] widened to every query head [b, h, ..., k] (as
        they are when n_kv_heads = n_heads): where a mechanism scores, after it has cached them."""
        out = tuple(expand_kv(x, self.n_heads) for x in tensors)
        return out[0] if len(out) == 1 else out

    # -- head reshapes -----------------------------------------------------------------------
    def split_heads(self, x: Tensor) -> Tensor:
        """[b, t, h*k] -> [b, h, t, k]: h = n_kv_heads for grouped keys and values (width n_kv_heads * head_dim),
        else n_heads. Split by the head count, not the head width: a mechanism whose per-head width is its own
        (Based's feature_dim, RetNet's and GLA's expand_k / expand_v) keeps n_heads heads."""
        grouped = self.n_kv_heads != self.n_heads and x.shape[-1] == self.n_kv_heads * self.head_dim
        return rearrange(x, "b t (h k) -> b h t k", h=self.n_kv_heads if grouped else self.n_heads)

    @staticmethod
    def merge_heads(x: Tensor) -> Tensor:
        """[b, h, t, k] -> [b, t, h*k]"""
        return rearrange(x, "b h t k -> b t (h k)")


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return type(value).__name__


def require_length(max_len: int, name: str) -> None:
    """Refuse a length-sized mechanism built on its own with ``max_len`` left 0 (only a model knows its length)."""
    require(
        max_len >= 1,
        f"{name}: max_len=0 means the model's max_len, filled in when a model is built; built on its own, give "
        "max_len (the longest sequence it will take)",
    )
