"""Decoding through the state against context length, beside what users would otherwise run: the study behind
``results/generate`` (issue 40 item 3; issue 38 item 6's decoding rates of the gated linear family).

For every causal mechanism (``attention``, each in the 2-layer ``vanilla_lm`` skeleton), every extra variant
(``variants``: dotted ``key=value`` items joined by ``:``, as ``zoo.bench --variant`` takes them space-separated;
labelled with spaces, as the bench labels them) and every
peer (``peers``: HF's ``LlamaForCausalLM.generate`` with its dynamic and its static cache, x-transformers'
cached decoding, all of the same shape), at each context and batch: tokens/s decoding ``new_tokens`` greedy
tokens from a prefilled state, in paired rounds (:func:`zoo.bench.generate.run_generate`, the timing of
``python -m zoo.bench --generate``), with the state's bytes and the memory-bandwidth bound (the state's
bytes read once per step at a measured copy bandwidth) beside each figure. Rows are appended per batch, so
a killed study keeps the batches it finished.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from zoo.bench.generate import plot_generate, read_share, run_generate
from zoo.bench.variants import Variant, build, parse_set, peer_variant
from zoo.config import require
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, machine_line

CAUSAL = [
    "vanilla",
    "shared_qk",
    "local_1d",
    "local_2d",
    "sparse_strided",
    "sparse_fixed",
    "xl_rel",
    "adaptive_span",
    "linear",
    "retention",
    "gla",
    "based",
    "deltanet",
    "gated_deltanet",
    "mamba2",
]
EXTRA = [
    "attention=additive:attention.score=general",  # score=concat materialises [t, s, d_head] by design
    "attention=lsh:attention.n_buckets=64",
    "attention=vanilla:attention.max_cache=1024:attention.sinks=4",
]
NUMBERS = (
    "tokens_per_s",
    "tokens_per_s_min",
    "tokens_per_s_max",
    "cache_mib",
    "bound_tokens_per_s",
    "bound_ms_per_step",
    "read_share",
    "prefill_s",
    "bandwidth_gib_s",
    "load_1min",
)


@dataclass
class Options:
    attention: list[str] = field(default_factory=lambda: list(CAUSAL))
    variants: list[str] = field(default_factory=lambda: list(EXTRA))
    peers: list[str] = field(default_factory=lambda: ["hf_llama", "hf_llama_static", "x_transformers"])
    contexts: list[int] = field(default_factory=lambda: [1024, 4096, 16384, 65536])
    batches: list[int] = field(default_factory=lambda: [1, 8])
    d_model: int = 128
    heads: int = 4
    layers: int = 2
    vocab: int = 256
    new_tokens: int = 16
    rounds: int = 3
    max_seconds: float = 60.0  # a prefill slower than this: the variant skips longer contexts
    # every variant's state is held at once (the rounds are paired): at batch 8 x 64K the 21 states passed
    # this machine's 23 GiB and the process was killed, so a cell of more tokens is listed as skipped
    max_batch_tokens: int = 131072
    prefill_chunk: int = 4096

    def __post_init__(self) -> None:
        require(
            min(self.contexts + self.batches) >= 1 and self.new_tokens >= 1 and self.rounds >= 1,
            "study.contexts, batches, new_tokens and rounds must be >= 1",
        )


@STUDY.register("generate")
class Generate(Study):
    Options = Options
    question = (
        "How fast does each causal mechanism decode from 1K to 64K tokens of context, against its "
        "memory-bandwidth bound and beside HF's generate (dynamic and static cache) and x-transformers?"
    )
    figures = ("generate.png",)
    toy_options = dict(
        attention=["vanilla", "local_1d"],
        variants=[],
        peers=[],
        contexts=[16, 32],
        batches=[1, 2],
        d_model=16,
        heads=2,
        layers=1,
        vocab=32,
        new_tokens=2,
        rounds=1,
    )

    def variants(self) -> list[Variant]:
        o = self.options
        out = [Variant(name, "zoo", "vanilla_lm", {"attention": name}) for name in o.attention]
        for joined in o.variants:  # ':' joins a variant's items so that a command line holds it as one word
            items = joined.split(":")
            overrides = parse_set(items)
            out.append(Variant(" ".join(items), "zoo", str(overrides.pop("model", "vanilla_lm")), overrides))
        return out + [peer_variant(name) for name in o.peers]

    def run(self) -> None:
        o, rows = self.options, Rows(self.rows_path, ("batch", "context", "variant"))
        variants = self.variants()
        for batch in o.batches:
            if all(rows.has(batch=batch, context=c, variant=v.label) for c in o.contexts for v in variants):
                continue
            contexts = [c for c in o.contexts if batch * c <= o.max_batch_tokens]
            why = f"skipped (batch x context > study.max_batch_tokens = {o.max_batch_tokens:,}: all states at once)"
            over = [dict(variant=v.label, batch=batch, context=c, status=why) for c in o.contexts if c not in contexts
                    for v in variants]
            _, summary = run_generate(
                variants,
                contexts,
                new_tokens=o.new_tokens,
                rounds=o.rounds,
                d_model=o.d_model,
                heads=o.heads,
                vocab=o.vocab,
                batch=batch,
                layers=o.layers,
                threads=self.threads,
                max_seconds=o.max_seconds,
                prefill_chunk=o.prefill_chunk,
            )
            machine = machine_line(self.threads)
            rows.add([{**r, "load_1min": round(os.getloadavg()[0], 1), "machine": machine} for r in summary + over])

    def report(self, rows: list[dict[str, str]]) -> str:
        parsed = [
            {  # a skipped or refused row's empty cells are absent, not strings
                **{k: v for k, v in r.items() if v != ""},
                **{k: float(r[k]) for k in NUMBERS if r.get(k)},
                "batch": int(r["batch"]),
                "context": int(r["context"]),
            }
            for r in rows
        ]
        self.bound_by_read_share(parsed)
        o = self.options
        loads = [r["load_1min"] for r in parsed if "load_1min" in r] or [0.0]
        measured = [r["bandwidth_gib_s"] for r in parsed if "bandwidth_gib_s" in r] or [0.0]
        lines = [
            f"{o.layers}-layer LMs at d {o.d_model}, {o.heads} heads, vocab {o.vocab}, fp32, {o.new_tokens} greedy "
            f"tokens per round from a state prefilled once, {o.rounds} rounds (median, min-max); "
            f"{parsed[0].get('machine', '')}; 1-minute load average {min(loads):.1f}-{max(loads):.1f} while measuring. "
            "Bound: the bytes a step reads (the state's, once; LSH's bucket cache: its bucket's slots, one bucket in "
            f"n_buckets) at the copy bandwidth measured at each context (rows' range "
            f"{min(measured):,.1f}-{max(measured):,.1f} GiB/s; "
            "weights not counted): the tokens/s and ms per step no decoder of that state can beat. share: measured "
            "tokens/s over that bound.",
            "",
            "| variant | batch | context | tokens/s (min-max) | ms/step | bound tokens/s (ms/step) | share | state MiB "
            "| tokens a layer keeps | status |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in parsed:
            rate = share = step = bound = cache = ""
            if "tokens_per_s" in r:
                rate = f"{r['tokens_per_s']:,.1f} ({r['tokens_per_s_min']:,.1f}-{r['tokens_per_s_max']:,.1f})"
                step = f"{r['batch'] * 1e3 / r['tokens_per_s']:,.2f}"
                share = f"{r['tokens_per_s'] / r['bound_tokens_per_s']:.3f}"
            if "bound_tokens_per_s" in r:
                bound = f"{r['bound_tokens_per_s']:,.0f} ({r['bound_ms_per_step']:.3f})"
                cache = f"{r['cache_mib']:,.2f}"
            kept = r.get("state_bound") or ("grows" if cache else "")  # CSV writes None (no bound) as empty
            lines.append(
                f"| {r['variant']} | {r['batch']} | {r['context']:,} | {rate} | {step} | {bound} | {share} | "
                f"{cache} | {kept} | {r['status']} |"
            )
        lines += ["", *self.comparisons(parsed), "", "![tokens/s and state MiB against context](generate.png)"]
        plot_generate(parsed, self.paths.out / "generate.png", {"title": "decoding through the state"})
        return "\n".join(lines)

    def bound_by_read_share(self, rows: list[dict]) -> None:
        """Each measured row's bound from the bytes a step reads: rows written before the bench recorded
        ``read_share`` get it from their variant's layers, built again at the study's shape."""
        o, known = self.options, {}
        shape = dict(d_model=o.d_model, heads=o.heads, layers=o.layers, vocab=o.vocab, batch=1, d_ff=4 * o.d_model)
        for variant in self.variants():
            if variant.kind == "zoo" and any(r["variant"] == variant.label and "read_share" not in r for r in rows):
                known[variant.label] = read_share(build(variant, 64, shape, {}, "cpu")[0])
        for r in rows:
            if "cache_mib" in r and "bandwidth_gib_s" in r:
                r.setdefault("read_share", known.get(r["variant"], 1.0))
                read = r["cache_mib"] * 2**20 * r["read_share"]
                r["bound_ms_per_step"] = read / (r["bandwidth_gib_s"] * 2**30) * 1e3
                r["bound_tokens_per_s"] = r["batch"] * 1e3 / r["bound_ms_per_step"]

    @staticmethod
    def comparisons(rows: list[dict]) -> list[str]:
        """Dense decoding against its bound and against HF's generate, at each batch's longest measured context."""
        lines = []
        measured = {(r["variant"], r["batch"], r["context"]): r for r in rows if "tokens_per_s" in r}
        for batch in sorted({r["batch"] for r in rows}):
            contexts = sorted({c for (v, b, c) in measured if b == batch and v == "vanilla"})
            for context in contexts[-1:]:
                ours = measured[("vanilla", batch, context)]
                text = (
                    f"- batch {batch}, {context:,} tokens: vanilla {ours['tokens_per_s']:,.1f} tokens/s, "
                    f"{ours['tokens_per_s'] / ours['bound_tokens_per_s']:.3f} of its bandwidth bound"
                )
                for peer in ("peer:hf_llama", "peer:hf_llama_static", "peer:x_transformers"):
                    if (peer, batch, context) in measured:
                        ratio = ours["tokens_per_s"] / measured[(peer, batch, context)]["tokens_per_s"]
                        text += f"; {ratio:.2f}x {peer.removeprefix('peer:')}"
                lines.append(text + ".")
        return lines
