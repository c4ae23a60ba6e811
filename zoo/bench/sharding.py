"""FSDP measured on one machine: the bytes of parameters and of optimiser state each rank holds, at 1, 2,
4 ... ranks (``python -m zoo.bench --fsdp-ranks 1,2,4 --model vanilla_lm``).

Each count runs in fresh processes (:func:`zoo.parallel.launch.run_ranks`, gloo): the variant is built at
the bench's shape, sharded exactly as the trainer shards it (:func:`zoo.train.fsdp.shard_model`: every
block a unit, the model the root, over all ranks), and takes one Adam step so that the optimiser's state
exists; then every rank counts the bytes of its own shards (:func:`zoo.train.fsdp.rank_bytes`). One rank
is the same code over a group of one (everything on that rank). Sharding splits each tensor along its
first dimension, padded to a multiple of the ranks, so a rank holds at most one row more than its share;
the table reports the most loaded rank.
"""

from __future__ import annotations

from typing import Any

import torch

from zoo.bench.variants import Variant, bench_tokens, build
from zoo.parallel.context import context_mesh
from zoo.parallel.launch import run_ranks
from zoo.train.fsdp import rank_bytes, shard_model


def _bytes_on_rank(rank: int, world: int, variant: Variant, length: int, shape: dict, overrides: dict) -> dict:
    module, loss = build(variant, length, shape, overrides)
    shard_model(module, context_mesh(1), precision=variant.precision)
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
    loss(bench_tokens(shape["vocab"], shape["batch"], length)).backward()
    optimizer.step()
    return rank_bytes(module, optimizer)


def fsdp_bytes(
    variants: list[Variant], ranks: list[int], *, length: int, shape: dict[str, Any], overrides: dict[str, Any]
) -> list[dict[str, Any]]:
    """One row per variant and rank count: the most loaded rank's parameter and optimiser bytes, and their
    sum's ratio to one rank's."""
    rows = []
    for variant in variants:
        if variant.kind != "zoo":
            raise ValueError(f"--fsdp-ranks shards zoo models; {variant.label!r} is another library's")
        alone = None
        for world in ranks:
            counts = run_ranks(world, _bytes_on_rank, variant, length, shape, overrides, timeout=1800)
            heaviest = max(counts, key=lambda c: c["param_bytes"] + c["optimizer_bytes"])
            total = heaviest["param_bytes"] + heaviest["optimizer_bytes"]
            alone = alone or (total if world == 1 else None)
            rows.append(
                {
                    "variant": variant.label,
                    "ranks": world,
                    "param_mib": heaviest["param_bytes"] / 2**20,
                    "optimizer_mib": heaviest["optimizer_bytes"] / 2**20,
                    "total_mib": total / 2**20,
                    "of_one_rank": total / alone if alone else float("nan"),
                }
            )
    return rows


def fsdp_table(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"# {meta['title']}",
        "",
        f"`{meta['command']}`  ",
        f"{meta['machine']}, torch {meta['torch']}; load average before {meta['load_before']}, after {meta['load']}",
        "",
        "| variant | ranks | parameters MiB / rank | optimiser MiB / rank | total MiB / rank | of one rank's |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['ranks']} | {r['param_mib']:.3f} | {r['optimizer_mib']:.3f} | "
            f"{r['total_mib']:.3f} | {r['of_one_rank']:.3f} |"
        )
    return "\n".join(lines) + "\n"
