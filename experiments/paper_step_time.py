"""Seconds per training step of every paper configuration, at a stated small scale, on this machine.

Each row is the paper's configuration (width, heads, d_ff, attention options, vocabulary, adaptive
head, memory length) with only depth, batch and segment length cut down (defaults: 2 layers,
batch 1, 512 tokens), trained for a few Adam steps on random tokens with the state carried
(memory models see their memory). The parameter count of the full-size model comes from
describe (meta device). Timed in zoo.bench's paired rounds: each round runs ``--steps`` steps of
every configuration in turn (order rotated each round, a warm-up round unrecorded), so load
affects all alike; s/step is the median over rounds of each round's mean.

    python experiments/paper_step_time.py --layers 2 --seq-len 512 --steps 3 --rounds 2 --out results/paper
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import sys
from pathlib import Path

import torch

from zoo.app.paper import count_parameters, meta_model, model_config_for, resolved_config
from zoo.bench import clocked, paired_ratios, paired_rounds
from zoo.models.base import HEAD
from zoo.train.steps import adam, train_step

PAPER_DIR = Path(__file__).resolve().parents[1] / "conf" / "experiment" / "paper"


def build(name: str, layers: int, seq_len: int) -> tuple[dict, torch.nn.Module, dict]:
    resolved = resolved_config([f"experiment=paper/{name}"])
    _, full_config, _ = model_config_for(resolved)
    full_params = count_parameters(meta_model(full_config))["params"]
    small = resolved_config([f"experiment=paper/{name}", f"model.n_layers={layers}", f"trainer.seq_len={seq_len}"])
    _, config, _ = model_config_for(small)
    torch.manual_seed(0)
    model = HEAD.get(config.kind)(config)
    return resolved, model, {"full_params": full_params, "small_params": sum(p.numel() for p in model.parameters())}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--names", default="", help="comma-separated configurations (default: all)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round (after a warm-up round)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = args.names.split(",") if args.names else sorted(p.stem for p in PAPER_DIR.glob("*.yaml"))
    runs = {}
    for name in names:
        resolved, model, info = build(name, args.layers, args.seq_len)
        runs[name] = dict(resolved=resolved, model=model, info=info, opt=adam(model, 1e-4), state=None)
        model.train()
        vocab = model.config.vocab_size
        runs[name]["batch"] = lambda v=vocab: (lambda t: {"tokens": t[:, :-1], "targets": t[:, 1:]})(
            torch.randint(0, v, (args.batch_size, args.seq_len + 1))
        )

    def one_step(run: dict, batch: dict) -> None:
        out, _ = train_step(run["model"], batch, run["opt"], state=run["state"])
        run["state"] = out.state  # detached by train_step: truncated BPTT across steps

    def round_of_steps(run: dict) -> float:
        """``--steps`` training steps on fresh random batches; mean seconds per step."""
        return sum(clocked(functools.partial(one_step, run, run["batch"]()))() for _ in range(args.steps)) / args.steps

    rounds = paired_rounds(
        {name: functools.partial(round_of_steps, run) for name, run in runs.items()},
        args.rounds,
        progress=lambda line: print(line, file=sys.stderr),
    )
    seconds = paired_ratios(rounds, next(iter(runs)))
    load = os.getloadavg()
    rows = []
    for name, run in runs.items():
        paper = run["resolved"]["paper"]
        rows.append(
            {
                "config": name,
                "paper_row": f"{paper['citation'].split(',')[0]}, {paper['table']}: {paper['row']}",
                "published_params": paper.get("params"),
                "our_params": run["info"]["full_params"],
                "s_per_step": round(seconds[name]["median_s"], 3),
                "scale": (
                    f"{args.layers} layers, batch {args.batch_size} x {args.seq_len} tokens, CPU fp32, "
                    f"{args.threads} thread(s)"
                ),
                "small_model_params": run["info"]["small_params"],
                "load_avg_1m": round(load[0], 1),
            }
        )
        print(json.dumps(rows[-1]))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with (out / "step_time.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return rows


if __name__ == "__main__":
    main()
