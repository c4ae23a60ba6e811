"""FLOP models of one training step, for ``--paired --flops`` (the share of the matmul bound a step
reaches), asked of the model's parts (:mod:`zoo.models.costs`): each attention counts its forward
(LSH its chunks and its hashing), the feed-forward its two matrices, the stack its recomputation
(reversible: one more forward), the head its output layer. Where a part does not say (a mechanism
without ``forward_flops``, a peer), :func:`step_flops` answers None (unknown), never a dense estimate.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.models.costs import step_flops as model_step_flops
from zoo.presets.factory import create_model


def reformer_step_flops(
    t: int,
    d: int = 256,
    heads: int = 4,
    layers: int = 2,
    d_ff: int = 1024,
    vocab: int = 256,
    hashes: int = 4,
    chunk: int = 64,
    n_buckets: int = 0,
    batch: int = 1,
) -> dict[str, float]:
    """Matmul FLOPs of one training step of the ``reformer`` preset at these sizes, as its parts count
    them (:func:`step_flops`): per layer, the projections to_qk, to_v, to_out (3 x 2 t d^2), the
    feed-forward (2 x 2 t d d_ff) and LSH attention's chunks (2 x 2 t h R 2c d_k), x4 for backward and
    the reversible stack's recomputation; the hashing (2 t h d_k R n_buckets / 2, no backward) x2; the
    output layer (3 x 2 t d vocab)."""
    lsh = {"n_hashes": hashes, "chunk_size": chunk, "n_buckets": n_buckets}
    sizes = dict(vocab_size=vocab, d_model=d, n_heads=heads, n_layers=layers, d_ff=d_ff, max_len=max(t, 16))
    with torch.device("meta"):  # shapes only: nothing allocated
        model = create_model("reformer", **sizes, dropout=0.0, attention=lsh)
    return step_flops(model, t, {"batch": batch})


def step_flops(module: nn.Module, length: int, shape: dict[str, int]) -> dict[str, float] | None:
    """The FLOP count of one training step of ``shape["batch"]`` sequences of ``length`` tokens, asked
    of the model's parts; None where a part does not say."""
    return model_step_flops(module, length, shape["batch"])
