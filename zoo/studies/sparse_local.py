"""Sparse and local attention against dense SDPA and the peers: how a training step grows with length.

Papers: Child et al. 2019, "Generating Long Sequences with Sparse Transformers", arXiv:1904.10509
(strided and fixed patterns, O(t sqrt t)); Parmar et al. 2018, "Image Transformer", arXiv:1802.05751
(1D and 2D local query blocks with memory blocks, O(t l)). Question: do our blocked implementations
deliver that growth in code (time and activation memory against length), and from which length is each
faster than dense attention?

Setting: ``zoo.bench``'s training step (forward + backward) of a causal LM skeleton (``vanilla_lm``, 2
layers, d 256, 4 heads, vocab 256, batch 1) with each mechanism swapped in, the peers' models beside
(lucidrains' ``local-attention``, ``x-transformers``), every variant at every length (points outer,
variants inner, so variants compared at one length are measured close together in time). Slopes are
fitted on the fastest repeat from ``fit_from`` up: on a shared CPU a roughly constant contention overhead
per step flattens slopes fitted from the shortest lengths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from zoo.bench import Variant, crossover, fit_slope, parse_set, peer_variant, summarise
from zoo.bench import run as bench_run
from zoo.bench.report import plot
from zoo.config import require
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, typed

NINE = [
    "attention=vanilla",
    "attention=local_1d",
    "attention=local_2d attention.width=128",
    *(f"attention={p} attention.stride=0 attention.combine={c}" for p in ("sparse_strided", "sparse_fixed")
      for c in ("interleaved", "union", "per_head")),
]


def variant_label(spec: str) -> str:
    """``"attention=local_2d attention.width=128"`` -> ``"local_2d(width=128)"``: the mechanism and its options."""
    items = spec.split()
    mechanism = next((i.split("=", 1)[1] for i in items if i.startswith("attention=")), "")
    options = [i.removeprefix("attention.") for i in items if not i.startswith(("attention=", "model="))]
    return f"{mechanism or 'model'}({','.join(options)})" if options else mechanism or spec


def spec_variant(spec: str) -> Variant:
    """One ``--variant`` of ``zoo.bench`` from its app-syntax overrides (``model=`` picks the preset)."""
    overrides = parse_set(spec.split())
    return Variant(variant_label(spec), "zoo", str(overrides.pop("model", "vanilla_lm")), overrides)


@dataclass
class Options:
    variants: list[str] = field(default_factory=lambda: list(NINE))  # each: app-syntax overrides of one variant
    peers: list[str] = field(default_factory=lambda: ["local-attention", "x-transformers"])
    lengths: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384])
    repeats: int = 2
    max_seconds: float = 60.0  # a step slower than this skips the variant's larger lengths
    fit_from: int = 4096  # the slopes of the table are fitted from this length up
    baseline: str = "vanilla"
    d_model: int = 256
    heads: int = 4
    layers: int = 2
    batch: int = 1

    def __post_init__(self) -> None:
        require(self.repeats > 0, "study.repeats must be positive (this study times every step)")
        require(bool(self.variants), "study.variants must name at least one variant")


@STUDY.register("sparse_local")
class SparseLocal(Study):
    Options = Options
    question = ("Do the sparse and local mechanisms' training steps grow more slowly with length than dense "
                "attention's, and from which length is each faster?")
    figures = ("bench.png",)
    toy_options = dict(variants=["attention=vanilla", "attention=local_1d attention.block=16 attention.memory=16"],
                       peers=[], lengths=[32, 64], repeats=1, fit_from=32, d_model=16, heads=2, layers=1)

    def run(self) -> None:
        o, rows = self.options, Rows(self.rows_path, ("variant", "length"))
        variants = [spec_variant(s) for s in o.variants] + [peer_variant(p) for p in o.peers]
        for length in o.lengths:  # points outer, variants inner, as zoo.bench measures
            stopped = self.stopped(rows.read())
            todo = [v for v in variants if not rows.has(variant=v.label, length=length)]
            rows.add({"variant": v.label, "length": length, "status": f"skipped ({stopped[v.label]})"}
                     for v in todo if v.label in stopped)
            measured = bench_run([v for v in todo if v.label not in stopped], [length], layers=[o.layers],
                                 d_model=o.d_model, heads=o.heads, batch=o.batch, threads=self.threads,
                                 repeats=o.repeats, max_seconds=o.max_seconds, rss=False)
            rows.add({**row, "load_1min": round(os.getloadavg()[0], 1)} for row in measured)

    def stopped(self, rows: list[dict[str, str]]) -> dict[str, str]:
        """Variants that failed or ran past ``max_seconds`` at a measured length: skipped at larger ones."""
        out = {}
        for row in typed(rows):
            if row.get("status") != "ok":
                out[row["variant"]] = "failed or skipped at a smaller length"
            elif row.get("time_ms", 0.0) > 1e3 * self.options.max_seconds:
                out[row["variant"]] = f"step > {self.options.max_seconds:.0f} s"
        return out

    def report(self, rows: list[dict[str, str]]) -> str:
        o, measured = self.options, typed(rows)
        labels = list(dict.fromkeys(r["variant"] for r in measured))
        lengths = sorted({r["length"] for r in measured})
        ok = {(r["variant"], r["length"]): r for r in measured if r.get("status") == "ok"}
        baseline = o.baseline if o.baseline in labels else labels[0]
        first = {**{k: getattr(o, k) for k in ("layers", "batch", "d_model", "heads", "repeats")}, **measured[0]}
        loads = [r["load_1min"] for r in measured if "load_1min" in r]
        lines = [
            f"One training step of a {first['layers']}-layer causal LM (batch {first['batch']}, d {first['d_model']}, "
            f"{first['heads']} heads, vocab 256), {first.get('threads', self.threads)} thread(s), median of "
            f"{first['repeats']} repeats after a warm-up step"
            + (f"; 1-minute load average {min(loads)}-{max(loads)}" if loads else "") + ".",
            "",
            "| variant | " + " | ".join(f"{n:,} ms" for n in lengths) + f" | activation MiB @{lengths[-1]:,} "
            f"| time slope from {o.fit_from:,} (fastest repeat) | time slope, all lengths | memory slope "
            f"| faster than {baseline} from | speed-up over {baseline} at the largest shared length |",
            "|---|" + "---|" * (len(lengths) + 6),
        ]
        slopes = {}
        for label in labels:
            mine = sorted((n, r["time_min_ms"], r["act_mib"]) for (v, n), r in ok.items() if v == label)
            tail = [m for m in mine if m[0] >= o.fit_from]
            slopes[label] = fit_slope([m[0] for m in tail], [m[1] for m in tail])
            cells = [f"{ok[label, n]['time_ms']:,.0f}" if (label, n) in ok else
                     next((r["status"] for r in measured if r["variant"] == label and r["length"] == n), "")[:24]
                     for n in lengths]
            shared = [n for n, *_ in mine if (baseline, n) in ok]
            speedup = (f"{ok[baseline, shared[-1]]['time_min_ms'] / ok[label, shared[-1]]['time_min_ms']:.2f}x at "
                       f"{shared[-1]:,}" if shared else "n/a")
            memory = f"{ok[label, lengths[-1]]['act_mib']:,.0f}" if (label, lengths[-1]) in ok else "-"
            lines.append(
                f"| {label} | " + " | ".join(cells) + f" | {memory} | {slopes[label]:.2f} | "
                f"{fit_slope([m[0] for m in mine], [m[1] for m in mine]):.2f} | "
                f"{fit_slope([m[0] for m in tail], [m[2] for m in tail]):.2f} | "
                f"{'(baseline)' if label == baseline else crossover(measured, label, baseline, 'length')} | {speedup} |"
            )
        plot(measured, summarise(measured, baseline), self.paths.out / "bench.png",
             "Training step against length (log-log; slopes over all lengths, median times)")
        lines += ["", "![time and activation memory against length](bench.png)", "", self.verdict(ok, slopes, baseline)]
        return "\n".join(lines)

    def verdict(self, ok: dict, slopes: dict[str, float], baseline: str) -> str:
        """The claim shows for a mechanism (not a peer) whose time grows more slowly than the baseline's from
        ``fit_from`` up and which is faster than it at the longest length both reached."""
        ours = [label for label in slopes if label != baseline and not label.startswith("peer:")]
        if baseline not in slopes or not ours:
            return f"**Verdict: not enough rows yet** (`{baseline}` and a mechanism are needed)."
        shows, not_shown = [], []
        for label in ours:
            shared = sorted(n for v, n in ok if v == label and (baseline, n) in ok)
            faster = bool(shared) and ok[label, shared[-1]]["time_min_ms"] < ok[baseline, shared[-1]]["time_min_ms"]
            (shows if faster and slopes[label] < slopes[baseline] else not_shown).append(label)
        text = (f"**Verdict: {len(shows)} of {len(ours)} mechanisms grow more slowly than `{baseline}` "
                f"(slope {slopes[baseline]:.2f}) from {self.options.fit_from:,} up and are faster at the longest "
                "shared length**")
        return text + (f"; not: {', '.join(not_shown)}." if not_shown else ".")
