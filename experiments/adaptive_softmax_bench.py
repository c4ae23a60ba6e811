"""Output-layer cost at a WikiText-103-sized vocabulary: full softmax vs adaptive softmax.

One forward + backward of the output layer alone (hidden [n, d] -> loss) for n tokens whose ids
follow a Zipf law over the vocabulary (word frequencies roughly do; the adaptive softmax's cost
depends on how many targets fall in the tail clusters). Variants, timed in zoo.bench's paired rounds
(each once per round, order rotated, a warm-up round unrecorded; the speed-up is the median of the
per-round ratios):

- ``full``: Linear(d, V) + cross-entropy (what the LM head does without model.adaptive);
- ``adaptive div_val=1``: zoo.models.adaptive_softmax.AdaptiveSoftmax, Transformer-XL base layout
  (cutoffs 20K/40K/200K);
- ``adaptive div_val=4``: the large layout (narrower tail clusters with projections);
- ``torch div_value=4``: torch.nn.AdaptiveLogSoftmaxWithLoss with the same cutoffs (untied).

    python experiments/adaptive_softmax_bench.py --tokens 256 --d-model 410 --rounds 5 --out results/adaptive_softmax
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from zoo.bench import clocked, paired_ratios, paired_rounds
from zoo.models.adaptive_softmax import AdaptiveOptions, AdaptiveSoftmax

VOCAB = 267_735
CUTOFFS = [20_000, 40_000, 200_000]


def zipf_targets(n: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    weights = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    return torch.multinomial(weights, n, replacement=True, generator=generator)


def variants(d: int) -> dict[str, tuple[torch.nn.Module, callable]]:
    full = torch.nn.Linear(d, VOCAB, bias=False)
    ours1 = AdaptiveSoftmax(VOCAB, d, AdaptiveOptions(cutoffs=CUTOFFS, div_val=1))
    ours4 = AdaptiveSoftmax(VOCAB, d, AdaptiveOptions(cutoffs=CUTOFFS, div_val=4))
    ref4 = torch.nn.AdaptiveLogSoftmaxWithLoss(d, VOCAB, CUTOFFS, div_value=4.0)
    return {
        "full": (full, lambda h, y: F.cross_entropy(full(h), y)),
        "adaptive div_val=1": (ours1, lambda h, y: ours1.nll(h, y).mean()),
        "adaptive div_val=4": (ours4, lambda h, y: ours4.nll(h, y).mean()),
        "torch div_value=4": (ref4, lambda h, y: ref4(h, y).loss),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=410)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.tokens, args.d_model, generator=g, requires_grad=True)
    targets = zipf_targets(args.tokens, VOCAB, g)
    share = {
        f"cluster {i}": float(((targets >= lo) & (targets < hi)).float().mean())
        for i, (lo, hi) in enumerate(zip([0, *CUTOFFS], [*CUTOFFS, VOCAB]))
    }
    models = variants(args.d_model)

    def step(module: torch.nn.Module, loss_fn) -> float:
        module.zero_grad(set_to_none=True)
        hidden.grad = None
        return clocked(lambda: loss_fn(hidden, targets).backward())()

    rounds = paired_rounds({name: lambda m=m: step(*m) for name, m in models.items()}, args.rounds, progress=print)
    timing = paired_ratios(rounds, "full")
    rows = []
    for name, (module, _) in models.items():
        params = sum(p.numel() for p in module.parameters())
        rows.append(
            {
                "variant": name,
                "ms_median": round(timing[name]["median_s"] * 1e3, 2),
                "speedup_vs_full": round(timing[name]["ratio"], 2),
                "params": params,
                "tokens": args.tokens,
                "d_model": args.d_model,
                "vocab": VOCAB,
                "threads": args.threads,
            }
        )
    for row in rows:
        print(json.dumps(row))
    print(json.dumps({"target_share": share}))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with (out / f"bench_d{args.d_model}.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        (out / f"target_share_d{args.d_model}.json").write_text(json.dumps(share, indent=2))
    return rows


if __name__ == "__main__":
    main()
