"""mlpen/Nystromformer's LRA code (Xiong et al. 2021, arXiv:2102.03902), as the ``lra_parity`` study calls it.

Their ``ModelForSC`` (``LRA/code/model_wrapper.py``) with their ListOps config (``lra_config.py``) and the
optimiser, ``OneCycleLR`` and step of their ``run_tasks.py``, fp32 (their ``mixed_precision`` needs a GPU),
imported from an unmodified checkout (``zoo.bench.peers.import_checkout``). Their model is wrapped to be called
as ours are (:class:`TheirClassifier`), so the studies' one step loop (``zoo.studies.reference_loop.stepped``,
the app's ``train_step``) trains both: their step is ours without clipping (clip 0 scales the gradients by
exactly 1) and without post-step hooks (their modules have none). :func:`copy_into_theirs` starts their model
from our initial weights; :func:`train_theirs_alone` trains it at the setting's budget with dropout, logged
as our runs are (``metrics.jsonl`` with ``train/loss`` and ``val/accuracy``, read by ``lra_listops_budget``)
and resumable from ``last.pt``.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from zoo.bench.peers import import_checkout
from zoo.models.base import ModelOutput
from zoo.studies.reference_loop import stepped


def their_model(reference: Path, max_len: int, attention: str = "softmax", *, dropout: bool = False,
                seq_len: int = 0) -> tuple[nn.Module, dict[str, Any]]:
    """Their ModelForSC for ListOps with ``attention`` (a key of their extra_attn_config), fp32, position
    table of ``max_len``; dropout 0 unless ``dropout``. Returns (model, their training config)."""
    lra_config, wrapper = import_checkout(reference, "lra_config", "model_wrapper")
    config = {**lra_config.config["listops"]["model"], "mixed_precision": False, "attn_type": attention}
    config.update(lra_config.config["listops"]["extra_attn_config"][attention])
    config.update(max_seq_len=max_len)
    if seq_len:  # attention_nystrom.py reads config["seq_len"], which their run_tasks.py never sets
        config.update(seq_len=seq_len)
    if not dropout:
        config.update(dropout_prob=0.0, attention_dropout=0.0)
    return wrapper.ModelForSC(config), lra_config.config["listops"]["training"]


def their_optimiser(model: nn.Module, training: dict) -> tuple[torch.optim.Optimizer, Any]:
    """run_tasks.py: AdamW(betas (0.9, 0.999), eps 1e-6) and OneCycleLR(pct_start = warmup / steps, linear)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=training["learning_rate"], betas=(0.9, 0.999), eps=1e-6,
                                  weight_decay=training["weight_decay"])
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=training["learning_rate"], pct_start=training["warmup"] / training["num_train_steps"],
        anneal_strategy=training["lr_decay"], total_steps=training["num_train_steps"])
    return optimizer, scheduler


class TheirClassifier(nn.Module):
    """Their ModelForSC called as our classifiers are: ``(tokens, targets, pad_mask) -> ModelOutput`` with the
    mean of their per-example loss (run_tasks.py's ``outputs["loss"].mean()``)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, targets: Tensor, pad_mask: Tensor, **_: Any) -> ModelOutput:
        outputs = self.model(input_ids_0=tokens, mask_0=pad_mask.float(), label=targets)
        return ModelOutput(None, outputs["loss"].mean())


def their_names(n_layers: int) -> dict[str, str]:
    """Our parameter name -> theirs (the token table is handled apart: theirs has padded rows)."""
    names = {"position.table.weight": "model.embeddings.position_embeddings.weight",
             "norm.weight": "model.norm.weight", "norm.bias": "model.norm.bias"}
    for ours, theirs in (("head.0", "seq_classifer.mlpblock.0"), ("head.2", "seq_classifer.mlpblock.2")):
        for kind in ("weight", "bias"):
            names[f"{ours}.{kind}"] = f"{theirs}.{kind}"
    per_layer = {"attention.to_q": "mha.W_q", "attention.to_k": "mha.W_k", "attention.to_v": "mha.W_v",
                 "attention.to_out": "mha.ff", "feed_forward.w1": "mlpblock.0", "feed_forward.w2": "mlpblock.3",
                 "attention_residual.norm": "norm1", "feed_forward_residual.norm": "norm2"}
    for layer in range(n_layers):
        for ours, theirs in per_layer.items():
            for kind in ("weight", "bias"):
                names[f"stack.blocks.{layer}.{ours}.{kind}"] = f"model.transformer_{layer}.{theirs}.{kind}"
    return names


@torch.no_grad()
def copy_into_theirs(ours: nn.Module, theirs: nn.Module, n_layers: int) -> None:
    """Our weights into their model; every one of their parameters but the unused token rows is written."""
    mine, target = ours.state_dict(), theirs.state_dict()
    names = their_names(n_layers)
    unmapped = set(mine) - set(names) - {"embed.weight"}
    if unmapped:
        raise ValueError(f"no counterpart in their model for {sorted(unmapped)}: only softmax attention is mapped")
    for name, their_name in names.items():
        target[their_name].copy_(mine[name])
    rows = mine["embed.weight"].shape[0]
    target["model.embeddings.word_embeddings.weight"][:rows].copy_(mine["embed.weight"] * ours.embed.scale)
    theirs.load_state_dict(target)


@torch.no_grad()
def their_accuracy(model: nn.Module, task: Any, split: str) -> float:
    """Accuracy of their model over every batch of ``split`` (ListOps dev: 62 batches of 32 = 1,984)."""
    model.eval()
    correct = count = 0.0
    for batch in task.eval_batches(split, None):
        outputs = model(input_ids_0=batch["tokens"], mask_0=batch["pad_mask"].float(), label=batch["targets"])
        correct += float(outputs["accu"].sum())
        count += outputs["accu"].numel()
    model.train()
    return correct / count


def train_theirs_alone(reference: Path, attention: str, resolved: dict, task: Any, run_dir: Path,
                       stop_after: int = 0) -> dict[str, Any]:
    """Their model and loop alone at the setting's budget on our batches, dropout on, logged like our runs,
    resumable from ``last.pt`` (every 100 steps); ``stop_after`` > 0 stops there (a shorter look at the same
    schedule). The best dev state is scored on the test split into ``result.json``, which is returned."""
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = resolved["trainer"]
    torch.manual_seed(resolved["seed"])
    model, training = their_model(reference, resolved["model"]["max_len"], attention, dropout=True,
                                  seq_len=trainer["seq_len"])
    optimizer, scheduler = their_optimiser(model, training)
    start, best, last, log_path = 0, -1.0, run_dir / "last.pt", run_dir / "metrics.jsonl"
    if last.is_file():
        saved = torch.load(last, weights_only=True)  # data only: tensors, numbers, strings
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        torch.set_rng_state(saved["rng"])
        start, best = saved["step"], saved["best"]
        if log_path.is_file():  # rows logged after last.pt was written are run again: drop them
            kept = [line for line in log_path.read_text().splitlines() if json.loads(line)["step"] <= start]
            log_path.write_text("".join(line + "\n" for line in kept))
    total = training["num_train_steps"]
    stop = min(total, stop_after or total)
    losses: list[float] = []
    with open(log_path, "a") as log:
        for done, _, loss in stepped(TheirClassifier(model), partial(task.batch, "train"), optimizer, steps=stop,
                                     start=start, scheduler=scheduler, clip=0.0):
            losses.append(loss)
            row = {}
            if done % trainer["log_every"] == 0:
                row = {"step": done, "train/loss": sum(losses) / len(losses), "train/lr": scheduler.get_last_lr()[0]}
                losses = []
            if done % trainer["eval_every"] == 0 or done == stop:
                accuracy = their_accuracy(model, task, "val")
                row = {**row, "step": done, "val/accuracy": accuracy}
                if accuracy > best:
                    best = accuracy
                    torch.save({"model": model.state_dict(), "step": done}, run_dir / "best.pt")
            if row:
                log.write(json.dumps(row) + "\n")
                log.flush()
            if done % 100 == 0 or done == stop:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": done, "best": best}
                torch.save({**state, "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state()}, last)
    best_state = torch.load(run_dir / "best.pt", weights_only=True)
    model.load_state_dict(best_state["model"])
    result = {"attention": attention, "best_step": best_state["step"], "dev_accuracy": best,
              "test_accuracy": their_accuracy(model, task, "test")}
    (run_dir / "result.json").write_text(json.dumps(result, indent=1))
    return result
