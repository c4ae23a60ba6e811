"""Output-layer cost at a WikiText-103-sized vocabulary: full softmax against the adaptive softmax.

Paper: Grave, Joulin, Cissé, Grangier, Jégou 2017, "Efficient softmax approximation for GPUs",
arXiv:1609.04309 (the adaptive softmax), as Transformer-XL (Dai et al. 2019, arXiv:1901.02860) uses it on
WikiText-103 (267,735 words, cutoffs 20K / 40K / 200K): a frequent-word head cluster and narrower tail
clusters make the output layer several times cheaper than a full softmax over the vocabulary.

Here: one forward + backward of the output layer alone (hidden [tokens, d] -> mean NLL) for targets drawn
from a Zipf law over the vocabulary (word frequencies roughly follow one; the adaptive softmax's cost
depends on how many targets fall in the tail clusters), timed in ``zoo.bench``'s paired rounds (each variant
once per round, order rotated, a warm-up round unrecorded; the speed-up is the median of the per-round
ratios). Variants:

- ``full``: Linear(d, V) + cross-entropy (the LM head without ``model.adaptive``);
- ``adaptive div_val=1``: ``zoo.models.adaptive_softmax.AdaptiveSoftmax``, Transformer-XL's base layout;
- ``adaptive div_val=4``: its large layout (narrower tail clusters with projections);
- ``torch div_value=4``: ``torch.nn.AdaptiveLogSoftmaxWithLoss`` with the same cutoffs (untied).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from zoo.bench import clocked, paired_ratios, paired_rounds
from zoo.config import require
from zoo.models.adaptive_softmax import AdaptiveOptions, AdaptiveSoftmax
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, load_now, load_range, markdown_table, number

BASELINE = "full"
OURS, TORCH = "adaptive div_val=4", "torch div_value=4"  # the same clusters, ours and torch's
AS_TORCH = 1.25  # ours counts as torch's speed when its median time is within this factor of torch's


@dataclass
class Options:
    tokens: int = 256
    d_model: int = 410
    vocab: int = 267_735  # WikiText-103's word vocabulary
    cutoffs: list[int] = field(default_factory=lambda: [20_000, 40_000, 200_000])  # Transformer-XL's
    rounds: int = 5

    def __post_init__(self) -> None:
        require(self.tokens > 0 and self.d_model > 0 and self.rounds > 0, "study.tokens, d_model, rounds must be > 0")
        require(self.cutoffs == sorted(self.cutoffs) and 0 < self.cutoffs[0] and self.cutoffs[-1] < self.vocab,
                f"study.cutoffs must rise strictly inside (0, vocab={self.vocab}), got {self.cutoffs}")


def zipf_targets(n: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """n word ids drawn with probability proportional to 1 / rank."""
    weights = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    return torch.multinomial(weights, n, replacement=True, generator=generator)


def output_layers(o: Options) -> dict[str, tuple[torch.nn.Module, Callable]]:
    """Each variant's module and its loss (hidden [n, d], targets [n]) -> scalar."""
    full = torch.nn.Linear(o.d_model, o.vocab, bias=False)
    ours1 = AdaptiveSoftmax(o.vocab, o.d_model, AdaptiveOptions(cutoffs=o.cutoffs, div_val=1))
    ours4 = AdaptiveSoftmax(o.vocab, o.d_model, AdaptiveOptions(cutoffs=o.cutoffs, div_val=4))
    ref4 = torch.nn.AdaptiveLogSoftmaxWithLoss(o.d_model, o.vocab, o.cutoffs, div_value=4.0)
    return {
        BASELINE: (full, lambda h, y: F.cross_entropy(full(h), y)),
        "adaptive div_val=1": (ours1, lambda h, y: ours1.nll(h, y).mean()),
        OURS: (ours4, lambda h, y: ours4.nll(h, y).mean()),
        TORCH: (ref4, lambda h, y: ref4(h, y).loss),
    }


@STUDY.register("adaptive_softmax")
class AdaptiveSoftmaxCost(Study):
    Options = Options
    question = ("How much cheaper is the adaptive softmax than a full softmax over WikiText-103's vocabulary, "
                "and does ours run as fast as torch's with the same clusters?")
    toy_options = dict(tokens=16, d_model=64, vocab=400, cutoffs=[20, 40, 200], rounds=1)

    def run(self) -> None:
        o = self.options
        rows = Rows(self.rows_path, ("variant", "tokens", "d_model", "vocab"))
        if all(rows.has(variant=v, tokens=o.tokens, d_model=o.d_model, vocab=o.vocab) for v in (BASELINE, OURS)):
            return
        g = torch.Generator().manual_seed(0)
        hidden = torch.randn(o.tokens, o.d_model, generator=g, requires_grad=True)
        targets = zipf_targets(o.tokens, o.vocab, g)
        bounds = [0, *o.cutoffs, o.vocab]
        share = " ".join(f"{float(((targets >= lo) & (targets < hi)).float().mean()):.4f}"
                         for lo, hi in zip(bounds, bounds[1:]))
        layers = output_layers(o)

        def step(module: torch.nn.Module, loss_fn: Callable) -> float:
            module.zero_grad(set_to_none=True)
            hidden.grad = None
            return clocked(lambda: loss_fn(hidden, targets).backward())()

        timing = paired_ratios(paired_rounds({name: lambda m=m: step(*m) for name, m in layers.items()}, o.rounds),
                               BASELINE)
        rows.add(dict(
            variant=name, ms_median=round(timing[name]["median_s"] * 1e3, 2),
            speedup_vs_full=round(timing[name]["ratio"], 2), params=sum(p.numel() for p in module.parameters()),
            tokens=o.tokens, d_model=o.d_model, vocab=o.vocab, cutoffs=" ".join(map(str, o.cutoffs)),
            threads=self.threads, rounds=o.rounds, target_share=share, load_1min=load_now(),
        ) for name, (module, _) in layers.items())

    def report(self, rows: list[dict[str, str]]) -> str:
        lines = []
        for setting in dict.fromkeys((r["tokens"], r["d_model"], r["vocab"]) for r in rows):
            group = [r for r in rows if (r["tokens"], r["d_model"], r["vocab"]) == setting]
            first = group[0]
            shares = ", ".join(f"{100 * float(s):.1f}%" for s in first["target_share"].split())
            lines += [
                f"Output layer alone, hidden [{first['tokens']}, {first['d_model']}] -> mean NLL over "
                f"{int(first['vocab']):,} words (cutoffs {first['cutoffs']}); targets per cluster, head first: "
                f"{shares}. Median of {first['rounds']} paired rounds, {first['threads']} thread(s), 1-minute load "
                f"average {load_range(group)}: read the ratios, measured in one run, not the absolute times.",
                "",
                *markdown_table(
                    ["variant", "ms per forward + backward", "speed-up over full softmax", "parameters"],
                    ([r["variant"], f"{number(r, 'ms_median'):,.0f}", f"{number(r, 'speedup_vs_full'):.1f}x",
                      f"{int(r['params']) / 1e6:.1f}M"] for r in group)),
                "",
                self.verdict(group),
                "",
            ]
        return "\n".join(lines)

    @staticmethod
    def verdict(group: list[dict[str, str]]) -> str:
        """The claim shows when the large layout is faster than the full softmax and ours is within
        ``AS_TORCH`` of torch's time with the same clusters."""
        by = {r["variant"]: r for r in group}
        if not {OURS, TORCH} <= set(by):
            return "**Verdict: not enough rows** (ours and torch's large layout are needed)."
        speedup, ours, theirs = number(by[OURS], "speedup_vs_full"), number(by[OURS], "ms_median"), number(
            by[TORCH], "ms_median")
        holds = speedup > 1.0 and ours <= AS_TORCH * theirs
        return (f"**Verdict: the claim {'shows' if holds else 'does not show'}**: ours at div_val 4 is {speedup:.1f}x "
                f"the full softmax's speed and takes {ours / theirs:.2f}x torch's time with the same clusters "
                f"(counted as torch's speed within {AS_TORCH}x).")
