"""Activation checkpointing (zoo/stacks/checkpointing.py) composes with FSDP2: ``fully_shard`` applied to each
block after the plan, on two real gloo processes, gives the gradients of one plain process (dropout on: every
rank replays its own masks), and backward recomputes every block after FSDP gathered its parameters."""

from __future__ import annotations

import pytest
import torch

from zoo.parallel.launch import run_ranks
from zoo.stacks.checkpointing import CheckpointPlan, set_activation_checkpointing
from zoo.train.steps import total_loss

pytest.importorskip("torch.distributed.fsdp")


def model_and_batch():
    import zoo
    from zoo.presets.factory import get_preset

    torch.manual_seed(0)
    model = zoo.create_model("vanilla_lm", **{**get_preset("vanilla_lm").tiny, "n_layers": 3, "dropout": 0.2})
    tokens = torch.randint(0, model.config.vocab_size, (2, 13), generator=torch.Generator().manual_seed(1))
    return model.double().train(), dict(tokens=tokens[:, :-1], targets=tokens[:, 1:])


def _sharded_checkpointed(rank: int, world: int, mode: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model, batch = model_and_batch()
    set_activation_checkpointing(model, CheckpointPlan.parse(mode))
    mesh = init_device_mesh("cpu", (world,))
    for block in model.stack.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    calls = []
    for block in model.stack.blocks:
        block.attention.register_forward_hook(lambda *_: calls.append(1))
    torch.manual_seed(7)  # the same batch and masks on every rank: the mean of their gradients is one process's
    total_loss(model(**batch)).backward()
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    return {"grads": grads, "calls": len(calls)}


@pytest.mark.slow  # two forked processes sharding a model: seconds
@pytest.mark.parametrize("mode", ["full", "selective:attention"])
def test_fully_shard_per_block_after_the_plan_gives_one_plain_process_gradients(mode):
    model, batch = model_and_batch()
    torch.manual_seed(7)
    total_loss(model(**batch)).backward()
    for result in run_ranks(2, _sharded_checkpointed, mode):
        assert result["calls"] == (6 if mode == "full" else 3)  # each block's attention again in backward
        for name, p in model.named_parameters():
            torch.testing.assert_close(result["grads"][name], p.grad, rtol=0, atol=1e-12, msg=name)
