"""Our side of the Transformer-XL parity run beside kimiyoung/transformer-xl (results/xl_parity/README.md).

Trains ``transformer_xl`` scaled down (2 layers, d 128, 2 heads of 64, d_ff 256, tgt_len = mem_len = 64,
batch 4, dropout 0, one (u, v) pair as the reference) on a ``char_lm`` directory of split files, with the
app's own parts: the char_lm task's contiguous lanes, ``make_optimizer`` / ``make_schedule`` (Adam, cosine
to 0 as the reference's ``eta_min=0``), ``train_step`` with clipping at 0.25, the memory carried across
steps; then scores the test split with ``evaluate_protocol`` (memory protocol: segments, memory and clamp
lengths, ``same_length`` on and off). The weights start from ``torch.manual_seed(seed)`` and the preset's
initialisation; the reference run starts from the same weights, copied into its ``MemTransformerLM``
(the mapping is in the README), so the two loops can be compared step by step:

    python experiments/xl_parity.py --data DIR --steps 200 --lr 2.5e-4 --out results/xl_parity/ours_200.json \
        --reference-log REF_TRAIN_LOG --csv results/xl_parity/steps_200.csv

``--reference-log`` reads the per-step ``bpc`` lines its ``train.py --log-interval 1`` prints (5 decimals)
and writes both losses and their relative difference per step.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
from pathlib import Path

import torch

import zoo
from zoo.data import TASK
from zoo.train.eval_protocols import ProtocolSettings, evaluate_protocol
from zoo.train.options import OptimOptions, make_optimizer, make_schedule
from zoo.train.steps import train_step

SIZE = dict(n_layers=2, d_model=128, n_heads=2, d_ff=256, dropout=0.0, attention_dropout=0.0)


def build(vocab_size: int, seq_len: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    attention = {"mem_len": seq_len, "share_biases": True}
    return zoo.create_model("transformer_xl", vocab_size=vocab_size, **SIZE, attention=attention)


def reference_losses(path: Path) -> list[float]:
    """Per-step training loss (nats) from the reference's log: its bpc lines times ln 2."""
    text = path.read_text()
    return [float(m.group(1)) * math.log(2) for m in re.finditer(r"step +\d+ \|.*?\| bpc +([\d.]+)", text)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a char_lm directory of train/valid/test files")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=2.5e-4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--eval-batch", type=int, default=10)
    parser.add_argument("--eval-mem-len", type=int, default=128)
    parser.add_argument("--clamp-len", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="JSON of the per-step losses and the test scores")
    parser.add_argument("--save", default="", help="also save the final state dict here")
    parser.add_argument("--reference-log", default="", help="the reference train.py log to compare with")
    parser.add_argument("--csv", default="", help="per-step comparison (needs --reference-log)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    def task(batch: int):
        return TASK.get("char_lm")(path=args.data, vocab="chars", seq_len=args.seq_len, batch_size=batch, seed=0)

    train = task(args.batch)
    model = build(train.vocab_size, args.seq_len, args.seed)
    options = OptimOptions(
        name="adam", lr=args.lr, betas=[0.9, 0.999], eps=1e-8, schedule="cosine", warmup=0, min_lr_ratio=0.0
    )
    optimizer = make_optimizer(model, options)
    scheduler = make_schedule(optimizer, options, d_model=SIZE["d_model"], total=args.steps)
    state, losses = model.init_state(args.batch), []
    for step in range(args.steps):
        batch = train.batch("train", step)
        out, loss = train_step(model, batch, optimizer, scheduler=scheduler, clip=0.25, state=state)
        state = out.state
        losses.append(float(loss))
    tests = {}
    for same_length in (True, False):
        settings = ProtocolSettings(
            protocol="memory",
            seq_len=args.seq_len,
            batch_size=args.eval_batch,
            mem_len=args.eval_mem_len,
            clamp_len=args.clamp_len,
            same_length=same_length,
        )
        result = evaluate_protocol(model, task(args.eval_batch), "test", settings)
        tests[f"same_length={same_length}"] = {"bpc": result["test/bpc"], "scored": result["test/scored"]}
        print(f"test bpc, same_length={same_length}: {result['test/bpc']:.7f} over {result['test/scored']} bytes")
    Path(args.out).write_text(json.dumps({"losses": losses, "test": tests}, indent=1))
    if args.save:
        torch.save(model.state_dict(), args.save)
    if args.reference_log:
        theirs = reference_losses(Path(args.reference_log))[: len(losses)]
        rel = [abs(a - b) / b for a, b in zip(losses, theirs)]
        worst = max(range(len(rel)), key=rel.__getitem__)
        print(f"{len(rel)} steps compared; largest relative difference {rel[worst]:.2e} at step {worst + 1}")
        if args.csv:
            with open(args.csv, "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["step", "ours_loss", "reference_loss", "relative_difference"])
                for step, (a, b, r) in enumerate(zip(losses, theirs, rel), start=1):
                    writer.writerow([step, f"{a:.7f}", f"{b:.7f}", f"{r:.3e}"])


if __name__ == "__main__":
    main()
