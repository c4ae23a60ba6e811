"""Evaluate a checkpoint on a split with the task metric (bpc / ppl / accuracy).

On contiguous text the memory a model returns (Transformer-XL style) is carried from segment to
segment across the whole split.

    python experiments/evaluate.py outputs/.../checkpoints/best.pt --split test
    python experiments/evaluate.py CKPT --split val --batches 50 --data-path /elsewhere/enwik8
    python experiments/evaluate.py CKPT --protocol memory --seq-len 80 --mem-len 2100 --clamp-len 820
    python experiments/evaluate.py CKPT --protocol sliding --seq-len 512 --stride 1   # Al-Rfou et al.

--protocol segment|memory|sliding (zoo/train/eval_protocols.py); a run of experiment=paper/* defaults to
its paper's protocol and settings (paper.eval), which the flags override.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from zoo.app.run import load_run
from zoo.train.checkpoints.format import CheckpointError
from zoo.train.eval_protocols import add_protocol_arguments, evaluate_protocol, protocol_settings
from zoo.train.options import pick_device
from zoo.train.scoring import evaluate_model


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--split", default="test", choices=["train", "val", "test"])
    parser.add_argument("--batches", type=int, default=0, help="batches to score (0 = the whole split)")
    parser.add_argument("--batch-size", type=int, default=0, help="rows per batch (0 = as trained)")
    parser.add_argument("--data-path", default="", help="the data file, if it moved since training (data.path)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default="", help="also write the result as JSON here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr (--protocol runs)")
    add_protocol_arguments(parser)
    args = parser.parse_args(argv)
    _, task, model, ckpt = load_run(
        args.checkpoint, data={"path": args.data_path} if args.data_path else None, batch_size=args.batch_size or None
    )
    device = pick_device(args.device)
    model.to(device)
    start = time.perf_counter()
    settings = protocol_settings(args, ckpt.get("config") or {})
    if settings is not None:
        result = evaluate_protocol(
            model,
            task,
            args.split,
            settings,
            max_batches=args.batches,
            device=device,
            show_progress=not args.no_progress,
        )
    else:
        result = evaluate_model(model, task, args.split, args.batches, device=device)
    result.update(
        checkpoint=str(args.checkpoint),
        step=ckpt["step"],
        model=model.config.name,
        data=task.registry_name,
        seconds=time.perf_counter() - start,
        memory_carried=bool(task.contiguous),
    )
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


def command() -> None:
    """``python experiments/evaluate.py ARGS``: run with this process's arguments; exit 2 with the message on a
    refused input."""
    torch.set_grad_enabled(False)
    try:
        main()
    except (CheckpointError, ImportError) as exc:  # an unusable checkpoint, or its imports= module is gone: the
        # message names the file and what to do
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
