"""Zoology's own Figure 2 attention model on the zoo's MQAR batches: the premise check of issue 39.

Paper: Arora et al. 2023, "Zoology", arXiv:2312.04927. Its ``LanguageModel`` with the ``MHA`` mixer
(1 head, dropout 0.1, no MLP: the Figure 2 block) is loaded by path from ``$ZOO_REFERENCES/zoology``
(default ``../ref``; HazyResearch/zoology at commit d88d6f54) and trained on ``zoo.data.mqar.mqar_batch``
(experiment=mqar/len64's task: vocabulary 256, length 64, 4 pairs), AdamW (weight decay 0.1), cosine to
zero, no warm-up (as its trainer), batch 32, one thread; query accuracy on 512 held-out examples, one JSON
line per 500 steps. Used by results/mqar_figure2:

    python experiments/mqar_zoology_reference.py --d-model 128 --lr 3e-3 --seed 0 --steps 6000

Two shims let it run on a CPU without torchvision: ``torchvision.ops.StochasticDepth`` (used only at
drop-path rate 0, where it is the identity) and the embedding's ``device='cuda'`` default mapped to cpu.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from pathlib import Path

import torch
from torch import nn

from zoo.config import IGNORE_INDEX
from zoo.data.mqar import mqar_batch


class StochasticDepth(nn.Module):
    """torchvision's drop path at rate 0 (the only rate Zoology's Figure 2 block uses): the identity."""

    def __init__(self, p: float, mode: str = "row"):
        super().__init__()
        if p != 0.0:
            raise ValueError(f"this shim stands in for drop path at rate 0 only, got {p}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def zoology_model(d_model: int, seq_len: int, vocab_size: int) -> nn.Module:
    root = Path(os.environ.get("ZOO_REFERENCES", "../ref")) / "zoology"
    if not root.is_dir():
        raise SystemExit(f"HazyResearch/zoology not fetched: {root} is missing (set ZOO_REFERENCES)")
    ops = types.ModuleType("torchvision.ops")
    ops.StochasticDepth = StochasticDepth
    sys.modules.setdefault("torchvision", types.ModuleType("torchvision")).ops = ops
    sys.modules["torchvision.ops"] = ops
    sys.path.insert(0, str(root))
    import zoology.model as zoology_models
    from zoology.config import ModelConfig

    for cls in vars(zoology_models).values():  # its embeddings default to device='cuda'
        init = getattr(cls, "__init__", None)
        if isinstance(cls, type) and "cuda" in (getattr(init, "__defaults__", None) or ()):
            init.__defaults__ = tuple("cpu" if d == "cuda" else d for d in init.__defaults__)
    attention = dict(name="zoology.mixers.attention.MHA", kwargs=dict(dropout=0.1, num_heads=1))
    config = ModelConfig(d_model=d_model, n_layers=2, block_type="TransformerBlock", vocab_size=vocab_size,
                         max_position_embeddings=seq_len, sequence_mixer=attention,
                         state_mixer=dict(name="torch.nn.Identity", kwargs={}))
    return zoology_models.LanguageModel(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    task = dict(vocab_size=256, num_kv_pairs=args.pairs)
    model = zoology_model(args.d_model, args.seq_len, task["vocab_size"])
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, args.steps)
    held_out = mqar_batch(512, args.seq_len, seed=10_000 + args.seed, **task)
    begin = time.time()
    for step in range(1, args.steps + 1):
        batch = mqar_batch(32, args.seq_len, seed=args.seed * 1_000_003 + step, **task)
        logits = model(batch["tokens"], return_embeddings=False)  # [b, t, vocab]
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten(), ignore_index=IGNORE_INDEX)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        schedule.step()
        if step % 500 == 0 or step == args.steps:
            model.eval()
            with torch.no_grad():
                predicted = model(held_out["tokens"], return_embeddings=False).argmax(-1)
            model.train()
            asked = held_out["targets"] != IGNORE_INDEX
            accuracy = float((predicted[asked] == held_out["targets"][asked]).float().mean())
            print(json.dumps(dict(d_model=args.d_model, lr=args.lr, seed=args.seed, step=step,
                                  accuracy=round(accuracy, 4), wall_s=round(time.time() - begin))), flush=True)


if __name__ == "__main__":
    main()
