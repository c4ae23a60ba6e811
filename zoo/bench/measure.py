"""The two sweeps of ``python -m zoo.bench``: every variant at every (length, depth), timed with
repeats (:func:`run`), or in paired alternating rounds at each length (:func:`run_paired`), each
with its activation memory; the peak RSS of a fresh process per point (:func:`measure_rss`).
"""

from __future__ import annotations

import functools
import json
import os
import re
import resource
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from zoo.bench.flops import step_flops
from zoo.bench.report import progress_line
from zoo.bench.timing import (
    activation_bytes,
    clocked,
    gpu_peak_mib,
    matmul_probe,
    paired_ratios,
    paired_rounds,
    rss_kib,
    time_steps,
    timed_step,
)
from zoo.bench.variants import Variant, bench_tokens, build
from zoo.registry import import_plugins


def measure_rss(
    variant: Variant,
    length: int,
    shape: dict[str, int],
    overrides: dict[str, Any],
    threads: int,
    imports: list[str] | tuple[str, ...] = (),
) -> tuple[float, float]:
    """(peak MiB, step MiB) of a fresh process that builds the model and runs one step; it imports
    ``imports`` (``--imports``) first, so a researcher's own part is built there too."""
    payload = json.dumps(
        {
            "variant": asdict(variant),
            "length": length,
            "shape": shape,
            "overrides": overrides,
            "threads": threads,
            "imports": list(imports),
        }
    )
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.bench", "--_rss-child", payload], capture_output=True, text=True, timeout=1800
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "rss child failed")
    peak, step = json.loads(proc.stdout.strip().splitlines()[-1])
    return peak, step


def rss_child(payload: str) -> None:
    spec = json.loads(payload)
    import_plugins(spec.get("imports", []))
    torch.set_num_threads(spec["threads"])
    variant = Variant(**spec["variant"])
    module, loss_fn = build(variant, spec["length"], spec["shape"], spec["overrides"])
    tokens = torch.randint(0, spec["shape"]["vocab"], (spec["shape"]["batch"], spec["length"] + 1))
    before = rss_kib()
    loss_fn(tokens).backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps([peak / 1024, max(0, peak - before) / 1024]))


# -- the sweeps -------------------------------------------------------------------------------

# label suffixes of a twin measured beside its plain variant (--compile, --precision fp32,bf16)
TWINS = ("compile", "bf16")


def run(
    variants: list[Variant],
    lengths: list[int],
    *,
    layers: list[int] | None = None,
    d_model: int = 256,
    heads: int = 4,
    vocab: int = 256,
    batch: int = 1,
    d_ff: int | None = None,
    overrides: dict[str, Any] | None = None,
    threads: int = 2,
    warmup: int = 1,
    repeats: int = 3,
    max_seconds: float = 60.0,
    rss: bool = True,
    device: torch.device | str = "cpu",
    imports: list[str] | tuple[str, ...] = (),
    progress: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Measure every variant at every (length, depth) on ``device``; returns one row per point.

    On CUDA the memory figure beside ``act_mib`` is ``gpu_peak_mib`` (``torch.cuda.max_memory_allocated``
    over one step) and the fresh-process RSS is not measured (it counts host memory only).

    A variant that fails (error, out of memory) at a point records the error and is skipped at
    larger points; one whose step exceeds ``max_seconds`` is measured there once and skipped
    beyond, so a slow baseline cannot eat the whole budget."""
    torch.set_num_threads(threads)
    device = torch.device(device)
    rss = rss and device.type == "cpu"
    layers = layers or [2]
    overrides = overrides or {}
    rows: list[dict[str, Any]] = []
    stop_reason = {variant.label: "" for variant in variants}
    # points outer, variants inner: variants compared at one point are measured close together
    # in time, so load from other processes on a shared machine skews their ratio less
    for depth in layers:
        for length in lengths:
            for variant in variants:
                shape = dict(
                    d_model=d_model, heads=heads, layers=depth, vocab=vocab, batch=batch, d_ff=d_ff or 4 * d_model
                )
                row: dict[str, Any] = dict(
                    variant=variant.label,
                    kind=variant.kind,
                    length=length,
                    layers=depth,
                    batch=batch,
                    d_model=d_model,
                    heads=heads,
                    threads=threads,
                    device=str(device),
                    precision=variant.precision,
                    checkpointing=variant.checkpointing,
                )
                if stop_reason[variant.label]:
                    rows.append({**row, "status": f"skipped ({stop_reason[variant.label]})"})
                    continue
                try:
                    module, loss_fn = build(variant, length, shape, overrides, device)
                    tokens = bench_tokens(vocab, batch, length, device)
                    act = activation_bytes(module, loss_fn, tokens)
                    row.update(act_mib=act / 2**20, params=sum(p.numel() for p in module.parameters()), status="ok")
                    if device.type == "cuda":
                        row["gpu_peak_mib"] = gpu_peak_mib(module, loss_fn, tokens)
                    median = 0.0
                    if repeats > 0:  # repeats 0: activation memory only (exact, and cheap on a busy machine)
                        times = time_steps(module, loss_fn, tokens, warmup, repeats, max_seconds)
                        median = statistics.median(times)
                        row.update(
                            time_ms=median * 1e3,
                            time_min_ms=min(times) * 1e3,
                            repeats=len(times),
                            tokens_per_s=batch * length / median,
                        )
                    del module
                    if rss:
                        row["rss_peak_mib"], row["rss_step_mib"] = measure_rss(
                            variant, length, shape, overrides, threads, imports
                        )
                    if median > max_seconds:
                        stop_reason[variant.label] = f"step > {max_seconds:.0f} s"
                except Exception as error:  # noqa: BLE001  (recorded in the table, not hidden)
                    row["status"] = f"error: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
                    stop_reason[variant.label] = "failed at a smaller point"
                rows.append(row)
                progress(progress_line(row))
    return rows


def run_paired(
    variants: list[Variant],
    lengths: list[int],
    baseline: str,
    *,
    rounds: int = 5,
    d_model: int = 256,
    heads: int = 4,
    vocab: int = 256,
    batch: int = 1,
    d_ff: int | None = None,
    layers: int = 2,
    overrides: dict[str, Any] | None = None,
    threads: int = 2,
    device: torch.device | str = "cpu",
    flops: bool = False,
    forward_only: bool = False,
    progress: Callable[[str], None] = print,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Alternating rounds at each length (see :func:`paired_rounds`). Returns (one row per round and
    variant: ms, speed-up over ``baseline`` in that round, load; one summary row per length and
    variant: median ms, median speed-up with min-max, activation MiB, FLOP-bound share where known).
    ``forward_only``: each step is one forward in eval mode under ``torch.no_grad()`` (evaluation and
    generation's cost; the FlexAttention backend's only path on a CPU)."""
    torch.set_num_threads(threads)
    device = torch.device(device)
    shape = dict(d_model=d_model, heads=heads, layers=layers, vocab=vocab, batch=batch, d_ff=d_ff or 4 * d_model)
    round_rows, summary = [], []
    for length in lengths:
        built = {v.label: build(v, length, shape, overrides or {}, device) for v in variants}
        tokens = bench_tokens(vocab, batch, length, device)
        acts = {  # nothing is saved for backward under no_grad
            label: 0.0 if forward_only else activation_bytes(module, loss_fn, tokens) / 2**20
            for label, (module, loss_fn) in built.items()
        }
        if forward_only:
            steps = {
                label: clocked(_no_grad_forward(module, loss_fn, tokens), device)
                for label, (module, loss_fn) in built.items()
            }
        else:
            steps = {
                label: functools.partial(timed_step, module.train(), loss_fn, tokens)
                for label, (module, loss_fn) in built.items()
            }
        probe, probe_flops = matmul_probe(length, shape, device) if flops else (None, 0.0)
        progress(f"length {length}: {rounds} rounds after a warm-up round")
        recorded = paired_rounds(steps, rounds, probe=probe, progress=progress)
        ratios = paired_ratios(recorded, baseline)
        for index, seconds in enumerate(recorded):
            for label in built:
                round_rows.append(
                    dict(
                        length=length,
                        round=index,
                        variant=label,
                        ms=seconds[label] * 1e3,
                        speedup=seconds[baseline] / seconds[label],
                        load_1min=os.getloadavg()[0],
                    )
                )
        for label, (module, _) in built.items():
            entry = dict(
                length=length,
                variant=label,
                baseline=baseline,
                median_ms=ratios[label]["median_s"] * 1e3,
                speedup=ratios[label]["ratio"],
                speedup_min=ratios[label]["ratio_min"],
                speedup_max=ratios[label]["ratio_max"],
                act_mib=acts[label],
                rounds=len(recorded),
                device=str(device),
                threads=threads,
                precision=next(v.precision for v in variants if v.label == label),
                checkpointing=next(v.checkpointing for v in variants if v.label == label),
            )
            plain = re.sub(r"\+ac=[^+]+", "", label)  # --activation-checkpointing: the twin against its plan-less self
            if label != plain and plain in built:
                own = paired_ratios(recorded, plain)[label]
                entry.update(ac_of=plain, ac_speedup=own["ratio"], ac_speedup_min=own["ratio_min"])
                entry.update(ac_speedup_max=own["ratio_max"], ac_act_mib_without=acts[plain])
            for twin in TWINS:  # --compile, --precision fp32,bf16: the twin against its own plain run
                plain = label.removesuffix(f"+{twin}")
                if label != plain and plain in built:
                    own = paired_ratios(recorded, plain)[label]
                    entry.update(
                        {
                            f"{twin}_speedup": own["ratio"],
                            f"{twin}_speedup_min": own["ratio_min"],
                            f"{twin}_speedup_max": own["ratio_max"],
                        }
                    )
            count = step_flops(module, length, shape) if flops else None
            if count is not None:  # bound = FLOPs at the round's matmul rate; share = bound / step time
                shares = [count["total"] / (probe_flops / r["matmul_probe"]) / r[label] for r in recorded]
                entry.update(
                    gflop=count["total"] / 1e9,
                    flop_share=statistics.median(shares),
                    flop_share_min=min(shares),
                    flop_share_max=max(shares),
                    flop_parts=", ".join(
                        f"{k.replace('_', ' ')} {v / 1e9:.1f}" for k, v in count.items() if k != "total"
                    ),
                )
            summary.append(entry)
        del built
    return round_rows, summary


def _no_grad_forward(module: torch.nn.Module, loss_fn: Callable, tokens: torch.Tensor) -> Callable[[], None]:
    module.eval()

    def forward() -> None:
        with torch.no_grad():
            loss_fn(tokens)

    return forward
