"""Transformer-XL's segment-level memory (Dai et al. 2019, arXiv:1901.02860, Section 3.2): the state
``XLMemory`` and what :class:`~zoo.attention.xl_rel.XLRelativeAttention` does with it (``xl_rel.py``
holds the mechanism, its relative scores and its answers to the contract).

``XLMemoryKeeper`` checks a memory it is given, projects the keys and values of [memory ; x] (reusing the
memory's projections while gradients are off and the weights unchanged) and keeps the next memory: the
last ``memory_length`` layer inputs. Shapes: x [b, t, d]; memory [b, m, d]; keys/values [b, h, m + t, k].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class XLMemory:
    """Hidden states that entered the layer in earlier segments. states: [b, m, d] (detached);
    pad_mask: [b, m] bool (True = real) or None when every remembered position is real."""

    states: Tensor | None = None
    pad_mask: Tensor | None = None
    # evaluation only: the states' projected keys/values [b, h, m, k], valid while the weights
    # are unchanged (``version``), so a segment projects only its own tokens. Training recomputes
    # them from ``states`` (the weights move every step), as the paper does.
    keys: Tensor | None = None
    values: Tensor | None = None
    version: tuple | None = None

    @property
    def length(self) -> int:
        return 0 if self.states is None else self.states.shape[1]


class XLMemoryKeeper:
    """Memory handling mixed into ``XLRelativeAttention``; reads its ``options`` (mem_len, eval_mem_len),
    ``d_model``, projections (``to_qkv``, ``to_kv``) and ``split_heads``."""

    @property
    def memory_length(self) -> int:
        """How many states the next segment will see: eval_mem_len in eval mode when set."""
        if not self.training and self.options.eval_mem_len:
            return self.options.eval_mem_len
        return self.options.mem_len

    def _check_memory(self, memory: XLMemory, x: Tensor) -> None:
        if not isinstance(memory, XLMemory):
            raise ValueError(
                "xl_rel: state must be the XLMemory this attention returned (or init_state()); got "
                f"{type(memory).__name__}"
            )
        if memory.states is None:
            return
        got = memory.states
        if got.dim() != 3 or got.shape[0] != x.shape[0]:
            raise ValueError(
                f"xl_rel: memory holds batch size {got.shape[0]} but the input has batch size {x.shape[0]}; start "
                f"fresh with state=None or init_state({x.shape[0]})"
            )
        if got.shape[-1] != self.d_model:
            raise ValueError(
                f"xl_rel: memory has d={got.shape[-1]} but this attention has d_model={self.d_model}: it comes from "
                "a different model"
            )
        if got.dtype != x.dtype or got.device != x.device:
            raise ValueError(
                f"xl_rel: memory is {got.dtype} on {got.device} but the input is {x.dtype} on {x.device}; convert "
                "the state (zoo.models.base.map_tensors) or start fresh"
            )

    def _next_memory(self, keys_in: Tensor, key_pad: Tensor | None, cache: tuple | None) -> XLMemory:
        keep = self.memory_length
        if keep == 0:
            return XLMemory()
        # float32: the memory keeps the layer's inputs as they are, float32 under bf16 autocast (only
        # their projections run in bf16), so carried from segment to segment it is never rounded to bf16
        states = keys_in[:, -keep:].detach()
        memory = XLMemory(states, None if key_pad is None else key_pad[:, -keep:])
        if cache is not None:
            k, v, memory.version = cache
            memory.keys, memory.values = k[:, :, -keep:], v[:, :, -keep:]
        return memory

    def _keys_values(
        self, x: Tensor, keys_in: Tensor, memory: XLMemory, norm_version: tuple = ()
    ) -> tuple[Tensor, Tensor, tuple | None]:
        """Keys/values of [memory ; x] -> (k, v [b, h, s, k], what to cache for evaluation or None).

        With gradients on, everything is projected from the states (the paper). Without, the
        memory's projections from the previous call are reused if the weights are unchanged."""
        if torch.is_grad_enabled() and self.to_qkv.weight.requires_grad:
            k, v = (self.split_heads(y) for y in self.to_kv(keys_in))
            return k, v, None
        w = self.to_qkv.weight
        version = (w.data_ptr(), w._version, norm_version)  # norm_version: the block's LayerNorm that made them
        if (
            memory.length
            and memory.version == version
            and memory.keys is not None
            and memory.keys.shape[2] == memory.length
        ):
            k_new, v_new = (self.split_heads(y) for y in self.to_kv(x))
            k, v = torch.cat([memory.keys, k_new], dim=2), torch.cat([memory.values, v_new], dim=2)
        else:
            k, v = (self.split_heads(y) for y in self.to_kv(keys_in))
        return k, v, (k, v, version)
