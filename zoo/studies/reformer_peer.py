"""reformer-pytorch's ``ReformerLM`` (lucidrains, ``pip install reformer-pytorch``; run from the installed
package, nothing copied) as the ``reformer_duplication`` study trains it beside ours (Kitaev et al. 2020,
arXiv:2001.04451, Table 2's duplication task).

1 layer, the study's width, heads, head size and chunk (its ``bucket_size``), learned absolute positions,
d_ff = d_model, its defaults otherwise (attend across buckets, rotations shared by the heads and redrawn at
every call, no QK/V bias, GELU). ``peer-in-bucket`` limits it to same-bucket keys (its
``_attend_across_buckets``). It is wrapped to be called as ours are (:class:`PeerLM`), so the studies' one step
loop trains both on the same batches, and evaluated with another number of hashes or full attention by
switching its attention modules (:func:`set_peer_attention`, the same weights).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from zoo.models.base import ModelOutput
from zoo.models.losses import token_loss

PEERS = {"peer": True, "peer-in-bucket": False}  # name -> attends across buckets


def peer_module() -> Any:
    """The installed ``reformer_pytorch`` package, or None."""
    try:
        import reformer_pytorch
    except ImportError:
        return None
    return reformer_pytorch


def hashes(mode: str) -> int:
    return int(mode[3:])


class PeerLM(nn.Module):
    """The peer called like our models: ``(tokens, targets) -> ModelOutput``, scored by the loss our models use.

    The peer needs a length divisible by 2 x bucket_size: zero tokens are appended at the end (causal, so no
    earlier output reads them) and their logits are dropped."""

    def __init__(self, peer: nn.Module, multiple: int):
        super().__init__()
        self.peer, self.multiple = peer, multiple

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> ModelOutput:
        t = tokens.shape[1]
        logits = self.peer(F.pad(tokens, (0, -t % self.multiple)))[:, :t]
        return ModelOutput(logits, None if targets is None else token_loss(logits, targets, None, 0.0)[0])


def build_peer(name: str, mode: str, *, n_symbols: int, length: int, d_model: int, n_heads: int,
               chunk: int) -> PeerLM:
    """The peer ``name`` (a key of :data:`PEERS`) trained with ``mode`` (full or lsh<hashes>)."""
    reformer_pytorch = peer_module()
    if reformer_pytorch is None:
        raise RuntimeError(f"impl {name!r} needs reformer-pytorch (pip install reformer-pytorch); ours run without it")
    model = reformer_pytorch.ReformerLM(
        num_tokens=n_symbols + 1, dim=d_model, depth=1, max_seq_len=length, heads=n_heads,
        dim_head=d_model // n_heads, bucket_size=chunk, n_hashes=4 if mode == "full" else hashes(mode),
        use_full_attn=mode == "full", causal=True, ff_mult=1, ff_chunks=1, absolute_position_emb=True,
        reverse_thres=length + 1,  # one layer: the plain (non-recomputing) path of the same blocks
    )
    for module in model.modules():  # ReformerLM does not pass lsh_attend_across_buckets on to its layers
        if isinstance(module, reformer_pytorch.reformer_pytorch.LSHAttention):
            module._attend_across_buckets = PEERS[name]
    return PeerLM(model, 2 * chunk)


def set_peer_attention(model: nn.Module, mode: str) -> nn.Module:
    """Switch every LSHSelfAttention of a trained peer to ``mode`` (same weights); returns the model."""
    for module in model.modules():
        if hasattr(module, "use_full_attn") and hasattr(module, "lsh_attn"):
            module.use_full_attn = mode == "full"
            if mode != "full":
                module.lsh_attn.n_hashes = hashes(mode)
    return model
