"""FLOP models of one training step, for ``--paired --flops`` (the share of the matmul bound a step
reaches). Counts are known where a model is written down here (the Reformer: LSH attention in a
reversible stack); elsewhere :func:`step_flops` answers None (unknown), never a dense estimate.
"""

from __future__ import annotations

from torch import nn


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
    """Matmul FLOPs of one training step of the ``reformer`` preset (multiply-add = 2; elementwise
    work not counted). Per layer, forward: projections to_qk, to_v, to_out (3 x 2 t d^2), feed-forward
    (2 x 2 t d d_ff), LSH attention with R hashes and chunk c (scores and weighted values, each query
    chunk against a key block 2c wide: 2 x 2 t h R 2c d_k), hashing (2 t h d_k R n_buckets / 2, no
    backward). A training step is forward + backward (2x forward) + the reversible stack's
    recomputation (one more forward): 4x the differentiable forward FLOPs, 2x the hashing; plus the
    output layer (3 x 2 t d vocab)."""
    d_k = d // heads
    n_buckets = n_buckets or max(2, (t // chunk) + (t // chunk) % 2)  # 0 = the preset's automatic count
    forward = {
        "projections": 3 * 2 * t * d * d,
        "feed_forward": 2 * 2 * t * d * d_ff,
        "lsh_attention": 2 * 2 * t * heads * hashes * (2 * chunk) * d_k,
    }
    flops = {name: 4.0 * layers * f * batch for name, f in forward.items()}
    flops["hashing"] = 2.0 * layers * 2 * t * heads * d_k * hashes * (n_buckets // 2) * batch
    flops["output_layer"] = 3.0 * 2 * t * d * vocab * batch
    flops["total"] = sum(flops.values())
    return flops


def step_flops(module: nn.Module, length: int, shape: dict[str, int]) -> dict[str, float] | None:
    """The FLOP count of one training step where one is known: a zoo model with LSH attention in a
    reversible stack (the Reformer); None otherwise."""
    config = getattr(module, "config", None)
    if config is None:
        return None
    attention, stack = config.attention, config.to_dict().get("stack")
    stack_name = stack.get("name") if isinstance(stack, dict) else stack
    if attention.get("name") != "lsh" or stack_name != "reversible":
        return None
    return reformer_step_flops(
        length,
        d=shape["d_model"],
        heads=shape["heads"],
        layers=shape["layers"],
        d_ff=shape["d_ff"],
        vocab=shape["vocab"],
        hashes=attention.get("n_hashes", 4),
        chunk=attention.get("chunk_size", 64),
        n_buckets=attention.get("n_buckets", 0),
        batch=shape["batch"],
    )
