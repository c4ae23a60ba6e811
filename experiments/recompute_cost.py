"""What recomputing the band in backward costs: one attention call (forward + backward), plain
autograd against ``recompute_in_backward``, in alternating rounds in one process.

Adaptive span's blocked attention (zoo/attention/adaptive_span.py) and the merged-head sparse
pattern (zoo/attention/sparse.py) on projected heads [1, 4, t, 64]. Usage::

    python experiments/recompute_cost.py --length 4096 --rounds 5
"""

from __future__ import annotations

import argparse
import functools
import os

import torch

import zoo
from zoo.attention.adaptive_span import blocked_span_attention
from zoo.attention.blocked import key_validity
from zoo.attention.recompute import recompute_in_backward
from zoo.bench import clocked, paired_ratios, paired_rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    t = args.length
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, t, 64, generator=g, requires_grad=True) for _ in range(3))
    valid = key_validity(None, t, t, q.device)
    union = zoo.create_attention(
        "sparse_fixed", d_model=256, n_heads=4, causal=True, stride=128, c=32, combine="union"
    ).train()
    cases = {}
    for label, span in (("adaptive_span fixed S=1024", 1024.0), ("adaptive_span z=224", 224.0)):
        spans = torch.full((4,), span, requires_grad=True)

        def span_attention(q, k, v, spans, reach=min(1024, int(span) + 31)):
            return blocked_span_attention(q, k, v, spans=spans, ramp=32, reach=reach)

        cases[label] = (span_attention, (q, k, v, spans))
    cases["sparse_fixed union l=128"] = (functools.partial(union.merged, stride=128), (q, k, v, valid))

    def step(fn, inputs, recompute: bool) -> None:
        out = recompute_in_backward(fn, *inputs) if recompute else fn(*inputs)
        out.sum().backward()

    for label, (fn, inputs) in cases.items():
        # zoo.bench's paired rounds: order rotated each round, warm-up round not recorded
        steps = {
            mode: clocked(functools.partial(step, fn, inputs, mode == "recomputed")) for mode in ("plain", "recomputed")
        }
        rounds = paired_rounds(steps, args.rounds, progress=lambda line: None)
        cost = paired_ratios(rounds, "recomputed")["plain"]  # recomputed time / plain time, per round
        print(
            f"{label} at {t}: recomputed / plain time {cost['ratio']:.2f}x ({cost['ratio_min']:.2f}-"
            f"{cost['ratio_max']:.2f}), {args.rounds} rounds, {args.threads} thread(s), load {os.getloadavg()[0]:.1f}"
        )


if __name__ == "__main__":
    main()
