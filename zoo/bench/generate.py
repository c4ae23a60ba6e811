"""Decoding speed and cache size against context length: ``python -m zoo.bench --generate``.

For each context length L and each variant (a causal LM built as ``zoo.bench`` builds it, without
gradients, in eval mode): the prompt of L tokens is fed through ``model.init_state`` (the prefill,
``--prefill-chunk`` tokens per call so that a dense layer's scores stay [chunk, L]; timed once), then
every round decodes ``--new-tokens`` tokens one at a time from that same prefilled state (states are
values: each round starts from it again), the variants timed in the rotated order of
:func:`zoo.bench.timing.paired_rounds`. Reported per point: tokens per second (median over rounds,
with min-max), the state's bytes after the prefill (``cache_mib``: every tensor the model carries, all
layers), the bound the layers answer (``state_bound``, None = grows with the stream) and the prefill
seconds. A model that cannot continue a sequence is listed with its refusal, not measured; a variant
whose prefill fails or exceeds ``--max-seconds`` is skipped at longer contexts, with the reason in the
table. Bounded mechanisms should show constant tokens/s and cache bytes; the dense ones fall and grow
with L.

Outputs in ``--out``: ``generate.csv``, ``generate_rounds.csv``, ``generate.md``, ``generate.png``.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from zoo.attention.base import Attention
from zoo.bench.peer_decoding import PEER_DECODING
from zoo.bench.report import write_csv
from zoo.bench.timing import clocked, paired_rounds
from zoo.bench.variants import Variant, build
from zoo.models.base import map_tensors
from zoo.precision import autocast
from zoo.train.activation_meter import synchronize


def state_bytes(state: Any) -> int:
    """Bytes of every tensor a model state holds (all layers; a tensor shared twice counts once)."""
    seen: dict[int, int] = {}
    map_tensors(state, lambda t: seen.setdefault(t.untyped_storage().data_ptr(), t.nbytes) and t)
    return sum(seen.values())


def layer_bound(model: torch.nn.Module) -> int | None:
    """The most tokens any layer's state holds (``Attention.state_bound``); None when some layer's grows
    with the stream (an interleaved sparse model's A2 layers, dense attention)."""
    bounds = [m.state_bound() for m in model.modules() if isinstance(m, Attention)]
    return None if not bounds or None in bounds else max(bounds)


def read_share(model: torch.nn.Module) -> float:
    """Share of the state's bytes one decoding step reads, the mean of its layers' (``Attention.state_read_share``;
    the layers of one model keep states of one size): 1.0 but for a state a step reads only part of (LSH's buckets)."""
    shares = [m.state_read_share() for m in model.modules() if isinstance(m, Attention)]
    return sum(shares) / len(shares) if shares else 1.0


def run_generate(
    variants: list[Variant],
    contexts: list[int],
    *,
    new_tokens: int = 16,
    rounds: int = 3,
    d_model: int = 256,
    heads: int = 4,
    vocab: int = 256,
    batch: int = 1,
    d_ff: int | None = None,
    layers: int = 2,
    overrides: dict[str, Any] | None = None,
    threads: int = 2,
    device: torch.device | str = "cpu",
    max_seconds: float = 120.0,
    prefill_chunk: int = 4096,
    progress: Callable[[str], None] = print,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(one row per round and variant, one summary row per context and variant)."""
    torch.set_num_threads(threads)
    device = torch.device(device)
    shape = dict(d_model=d_model, heads=heads, layers=layers, vocab=vocab, batch=batch, d_ff=d_ff or 4 * d_model)
    stop = {v.label: "" for v in variants}
    round_rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    for context in contexts:
        bandwidth = copy_bandwidth(device)  # bytes/s: the state read per token over it bounds tokens/s
        progress(f"context {context:,}: measured copy bandwidth {bandwidth / 2**30:,.1f} GiB/s")
        prompt = torch.randint(0, vocab, (batch, context), generator=torch.Generator().manual_seed(context))
        prompt = prompt.to(device)
        steps, rows = {}, {}
        for variant in variants:
            row: dict[str, Any] = dict(
                variant=variant.label,
                batch=batch,
                context=context,
                new_tokens=new_tokens,
                device=str(device),
                precision=variant.precision,
            )
            rows[variant.label] = row
            if stop[variant.label]:
                row["status"] = f"skipped ({stop[variant.label]})"
                continue
            try:
                model, _ = build(variant, context + new_tokens + 1, shape, overrides or {}, device)
                model.eval()
                peer = PEER_DECODING.get(variant.name) if variant.kind == "peer" else None
                reason = "" if peer else peer_refusal(variant) or model.stream_refusal()
                if reason:
                    row["status"] = f"refused: {reason}"
                    stop[variant.label] = "cannot continue a sequence"
                    continue
                with torch.no_grad(), autocast(device, variant.precision):
                    synchronize(device)
                    start = time.perf_counter()
                    out = (
                        peer.prefill(model, prompt, new_tokens) if peer else prefill_state(model, prompt, prefill_chunk)
                    )
                    synchronize(device)
                    prefill = time.perf_counter() - start
                cache_bytes = state_bytes(peer.tensors(out) if peer else out.state)
                share = 1.0 if peer else read_share(model)  # a peer's cache: every step reads all of it
                row.update(
                    status="ok",
                    prefill_s=prefill,
                    cache_mib=cache_bytes / 2**20,
                    state_bound=None if peer else layer_bound(model),
                    read_share=share,
                    bound_tokens_per_s=batch * bandwidth / max(cache_bytes * share, 1),
                    bound_ms_per_step=cache_bytes * share / bandwidth * 1e3,
                    bandwidth_gib_s=bandwidth / 2**30,
                )
                decoder = (
                    peer.decoder(model, out, prompt, new_tokens)
                    if peer
                    else _decoder(model, out, new_tokens, variant.precision)
                )
                steps[variant.label] = clocked(decoder, device)
                if prefill > max_seconds:
                    stop[variant.label] = f"prefill > {max_seconds:.0f} s"
            except Exception as error:  # noqa: BLE001  (recorded in the table, not hidden)
                row["status"] = f"error: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
                stop[variant.label] = "failed at a shorter context"
        if steps:
            progress(f"context {context:,}: {rounds} rounds of {new_tokens} tokens after a warm-up round")
            recorded = paired_rounds(steps, rounds, progress=progress)
            for index, seconds in enumerate(recorded):
                for label, value in seconds.items():
                    round_rows.append(
                        dict(
                            batch=batch,
                            context=context,
                            round=index,
                            variant=label,
                            tokens_per_s=batch * new_tokens / value,
                            load_1min=os.getloadavg()[0],
                        )
                    )
            for label in steps:
                rates = [batch * new_tokens / r[label] for r in recorded]
                rows[label].update(
                    tokens_per_s=statistics.median(rates), tokens_per_s_min=min(rates), tokens_per_s_max=max(rates)
                )
        summary.extend(rows.values())
    return round_rows, summary


def prefill_state(model: torch.nn.Module, prompt: torch.Tensor, chunk: int) -> Any:
    """The model's output after reading ``prompt`` through its state, ``chunk`` tokens per call (a stream
    fed in pieces equals one call, so this only bounds the memory of a dense layer's [chunk, context]
    scores; 0 = one call)."""
    state, out = model.init_state(prompt.shape[0]), None
    for piece in prompt.split(chunk or prompt.shape[1], dim=1):
        out = model(piece, state=state)
        state = out.state
    return out


def _decoder(model: torch.nn.Module, prefilled: Any, new_tokens: int, precision: str) -> Callable[[], None]:
    """Decode ``new_tokens`` greedy tokens from the prefilled output, one at a time through the state."""

    def decode() -> None:
        out = prefilled
        with torch.no_grad(), autocast(prefilled.logits.device, precision):
            for _ in range(new_tokens):
                out = model(out.logits[:, -1].argmax(-1, keepdim=True), state=out.state)

    return decode


def peer_refusal(variant: Variant) -> str:
    if variant.kind == "peer":
        return (
            f"peer {variant.name!r} is timed in training steps only (cached decoding adapters: "
            f"{', '.join(PEER_DECODING)})"
        )
    return ""


def copy_bandwidth(device: torch.device, mib: int = 64, repeats: int = 5) -> float:
    """Bytes per second of a tensor copy larger than the caches (read + write counted), the best of ``repeats``;
    measured at each context, under the load of the moment (a figure from another load makes a bound a
    measured rate can beat)."""
    source = torch.empty(mib * 2**20, dtype=torch.uint8, device=device).fill_(1)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        target.copy_(source)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * source.numel() / best


def write_generate(
    round_rows: list[dict[str, Any]], summary: list[dict[str, Any]], out_dir: Path, meta: dict[str, Any]
) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": write_csv(out_dir / "generate.csv", summary),
        "rounds": write_csv(out_dir / "generate_rounds.csv", round_rows or [{}]),
        "md": out_dir / "generate.md",
        "png": out_dir / "generate.png",
    }
    paths["md"].write_text(generate_markdown(summary, meta))
    plot_generate(summary, paths["png"], meta)
    return paths


def generate_markdown(summary: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    measured = [r["bandwidth_gib_s"] for r in summary if "bandwidth_gib_s" in r] or [0.0]
    lines = [
        f"# {meta.get('title') or 'zoo.bench --generate: decoding through the cache'}",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Machine: {meta['machine']}; device {meta['device']}, precision {meta.get('precision', 'fp32')}; "
        f"torch {meta['torch']}, {meta['threads']} threads; "
        f"batch {meta['batch']}, d_model {meta['d_model']}, {meta['heads']} heads, {meta['layers']} layers, vocab "
        f"{meta['vocab']}; load average before {meta['load_before']}, after {meta['load']}. Each round decodes "
        f"{meta['new_tokens']} tokens one at a time from the same prefilled state, the variants in an order "
        "rotated each round, after one unrecorded warm-up round. cache MiB: every tensor of the model's state "
        "after the prefill (all layers); bound: the tokens a layer's state holds at most (none = grows). bandwidth "
        "bound: batch x measured copy bandwidth / the bytes a step reads (the state's, once; LSH: its bucket's "
        "share), the tokens/s no such step can beat, and that step's ms (those bytes / the bandwidth; weights not "
        "counted; copy "
        f"bandwidth {min(measured):,.1f}-{max(measured):,.1f} GiB/s, measured at each context); ms/step: one "
        "measured decoding step of the whole batch.",
        "",
        "| variant | batch | context | tokens/s (min-max) | ms/step | bandwidth bound tokens/s (ms/step) | cache MiB "
        "| bound | prefill s | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary:
        rate = (
            f"{row['tokens_per_s']:,.1f} ({row['tokens_per_s_min']:,.1f}-{row['tokens_per_s_max']:,.1f})"
            if "tokens_per_s" in row
            else ""
        )
        cache = f"{row['cache_mib']:,.2f}" if "cache_mib" in row else ""
        bound = (
            "" if "cache_mib" not in row else ("none" if row.get("state_bound") is None else f"{row['state_bound']:,}")
        )
        prefill = f"{row['prefill_s']:,.2f}" if "prefill_s" in row else ""
        limit = (
            f"{row['bound_tokens_per_s']:,.0f} ({row['bound_ms_per_step']:.3f})" if "bound_ms_per_step" in row else ""
        )
        step = f"{row.get('batch', 1) * 1e3 / row['tokens_per_s']:,.2f}" if "tokens_per_s" in row else ""
        lines.append(
            f"| {row['variant']} | {row.get('batch', 1)} | {row['context']:,} | {rate} | {step} | {limit} | {cache} | "
            f"{bound} | {prefill} | {row['status']} |"
        )
    return "\n".join(lines) + "\n"


def plot_generate(summary: list[dict[str, Any]], path: Path, meta: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6))
    for r in summary:  # one line per variant and batch
        r.setdefault("line", r["variant"] if r.get("batch", 1) == 1 else f"{r['variant']} (batch {r['batch']})")
    labels = list(dict.fromkeys(r["line"] for r in summary))
    colours = plt.get_cmap("tab20")(range(len(labels)))
    for index, label in enumerate(labels):
        points = [r for r in summary if r["line"] == label and "tokens_per_s" in r]
        if not points:
            continue
        x = [r["context"] for r in points]
        style = dict(marker="os^Dv"[index % 5], color=colours[index], label=label)
        left.plot(x, [r["tokens_per_s"] for r in points], **style)
        right.plot(x, [r["cache_mib"] for r in points], **style)
    for axis, title in ((left, "decoding tokens/s"), (right, "state MiB (all layers)")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("context (tokens already in the state)")
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(meta.get("title") or "zoo.bench --generate", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
