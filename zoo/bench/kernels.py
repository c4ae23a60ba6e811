"""The chunk kernels of the gated linear family, timed alone: ``python -m zoo.bench --kernels``.

For each mechanism named (``--kernels deltanet,gated_deltanet,mamba2,retention,gla``) and each length, one
training step (forward + backward of the output's sum) of its chunkwise kernel on the inputs its own layer
makes (the part's projections, short convolution and gates applied once to a random [batch, t, d_model]
input, then detached): ``delta_chunks.chunk_delta_rule`` for the delta-rule and SSD mixers, ``decay_chunks.
chunk_decay_attention`` for retention and GLA. Beside it in the same paired rounds (:func:`paired_rounds`):

- ``vanilla``: causal SDPA on [batch, heads, t, d_model / heads] (what the kernel replaces);
- the naive chunk reference of flash-linear-attention (``fla/ops/<op>/naive.py`` at commit bc3b101d, loaded
  by path from ``$ZOO_REFERENCES``, default ``../ref``; its own scaling and layout, the same shapes; GLA has
  only a recurrent reference, timed as that). A reference that is absent is reported so, not timed.

The matmul FLOP bound: the kernel's FLOPs (asked of the part: its ``forward_flops`` without the projections,
x3 for forward + backward) over a matmul rate measured each round at the block's feed-forward shape (the
probe of ``--paired --flops``); ``flop_share`` = that bound / the measured step time. Vanilla's FLOPs: the
causal half of Q K^T and P V, x3. Outputs in ``--out``: ``kernels.csv``, ``kernels_rounds.csv``,
``kernels.md``.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

import zoo
from zoo.attention.decay_chunks import chunk_decay_attention
from zoo.attention.decay_layer import DecayAttention
from zoo.attention.delta_chunks import chunk_delta_rule
from zoo.attention.state_mixer import StateMixer
from zoo.bench.peers import module_from_file
from zoo.bench.report import write_csv
from zoo.bench.timing import clocked, matmul_probe, paired_rounds

Kernel = Callable[[list[Tensor]], Tensor]  # the step's leaves -> the output whose sum is backpropagated


def kernel_inputs(part: torch.nn.Module, x: Tensor) -> tuple[list[Tensor], Kernel]:
    """The inputs the part's own layer hands its chunk kernel for ``x`` [b, t, d], detached, and the kernel."""
    chunk = part.options.chunk_size
    with torch.no_grad():
        if isinstance(part, StateMixer):
            mixed, rest = part.conv_input(x, None)
            if part.conv is not None:
                mixed, _ = part.conv(mixed, None)
            r = part.recurrence_inputs(mixed, rest)
            names = [n for n in ("q", "k", "v", "beta", "g") if getattr(r, n) is not None]
            leaves = [getattr(r, n).detach() for n in names]

            def delta(xs: list[Tensor]) -> Tensor:
                given = dict(zip(names, xs, strict=True))
                q, k, v = given["q"], given["k"], given["v"]
                return chunk_delta_rule(q, k, v, given.get("beta"), given.get("g"), None, chunk)[0]

            return leaves, delta
        if isinstance(part, DecayAttention):
            leaves = [y.detach() for y in part.project(x, torch.arange(x.shape[1]))]
            return leaves, lambda xs: chunk_decay_attention(*xs, chunk_size=chunk)[0]
    raise ValueError(f"{part.registry_name}: not a chunk-kernel mechanism (a StateMixer or DecayAttention part)")


def kernel_flops(part: torch.nn.Module, t: int, batch: int) -> float:
    """Matmul FLOPs of one forward of the kernel, as the part counts them (its forward_flops without the
    projections)."""
    count = part.forward_flops(t)
    return batch * sum(v for k, v in count.forward.items() if k != "projections")


# -- flash-linear-attention's naive references, by the part that each one checks --------------------------


def fla_naive(op: str) -> ModuleType | None:
    """``fla/ops/<op>/naive.py`` of the reference folder as a module (it imports torch and einops only);
    None when it is absent."""
    root = Path(os.environ.get("ZOO_REFERENCES", "../ref")) / "flash-linear-attention" / "fla" / "ops"
    path, key = root / op / "naive.py", f"zoo_bench_fla_naive_{op}"
    return module_from_file(path, key) if path.is_file() else None


def to_fla(*xs: Tensor) -> list[Tensor]:
    """[b, h, t, ...] -> fla's [b, t, h, ...]."""
    return [rearrange(x, "b h t ... -> b t h ...") for x in xs]


# registry name -> (fla op, its function, how it takes our leaves (q, k, v[, beta][, g or log_decay]))
NAIVE: dict[str, tuple[str, str, Callable[..., Any]]] = {
    "deltanet": ("delta_rule", "delta_rule_chunkwise", lambda f, xs, c: f(*xs, chunk_size=c)),
    "gated_deltanet": (
        "gated_delta_rule",
        "naive_chunk_gated_delta_rule",
        lambda f, xs, c: f(*to_fla(*xs[:3], xs[4], xs[3]), chunk_size=c),
    ),
    # a scalar decay per head is simple GLA's recurrence
    "mamba2": ("simple_gla", "naive_chunk_simple_gla", lambda f, xs, c: f(*to_fla(*xs), chunk_size=c)),
    "retention": ("simple_gla", "naive_chunk_simple_gla", lambda f, xs, c: f(*to_fla(*xs), chunk_size=c)),
    "gla": ("gla", "naive_recurrent_gla", lambda f, xs, c: f(*to_fla(*xs))),  # fla has no chunked naive GLA
}


def naive_kernel(name: str, chunk: int) -> tuple[str, Kernel | None]:
    """(the reference's name, a kernel taking the same leaves as ours; None when absent or unknown)."""
    if name not in NAIVE:
        return "none for this mechanism", None
    op, function, call = NAIVE[name]
    module = fla_naive(op)
    if module is None:
        return f"{op}.{function}", None
    return f"{op}.{function}", lambda xs: call(getattr(module, function), xs, chunk)[0]


def vanilla_kernel(xs: list[Tensor]) -> Tensor:
    return F.scaled_dot_product_attention(*xs, is_causal=True)


def training_step(kernel: Kernel, leaves: list[Tensor]) -> Callable[[], None]:
    """Forward + backward of ``kernel`` on fresh leaves (copies that require a gradient) each call."""

    def step() -> None:
        fresh = [x.clone().requires_grad_(x.is_floating_point()) for x in leaves]
        kernel(fresh).sum().backward()

    return step


def run_kernels(
    names: list[str],
    lengths: list[int],
    *,
    rounds: int = 3,
    d_model: int = 256,
    heads: int = 4,
    batch: int = 1,
    d_ff: int | None = None,
    threads: int = 1,
    naive: bool = True,
    max_seconds: float = 60.0,
    progress: Callable[[str], None] = print,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(one row per round and entry, one summary row per length and entry); see the module docstring. An
    entry whose median step exceeds ``max_seconds`` is skipped at longer lengths (fla's recurrent GLA)."""
    torch.set_num_threads(threads)
    slow: dict[str, str] = {}
    shape = dict(d_model=d_model, batch=batch, d_ff=d_ff or 4 * d_model)
    round_rows, summary = [], []
    for t in lengths:
        torch.manual_seed(0)
        x = torch.randn(batch, t, d_model)
        dense = [torch.randn(batch, heads, t, d_model // heads) for _ in range(3)]
        steps = {"vanilla": clocked(training_step(vanilla_kernel, dense))}
        flops = {"vanilla": 3 * batch * heads * 2 * 2 * (t * (t + 1) / 2) * (d_model // heads)}
        rows: dict[str, dict[str, Any]] = {"vanilla": dict(kernel="vanilla", reference="SDPA, is_causal=True")}
        for name in names:
            part = zoo.create_attention(name, d_model=d_model, n_heads=heads, causal=True).eval()
            leaves, ours = kernel_inputs(part, x)
            steps[name], flops[name] = clocked(training_step(ours, leaves)), 3 * kernel_flops(part, t, batch)
            rows[name] = dict(kernel=name, reference=f"ours, chunk {part.options.chunk_size}")
            if naive:
                label, reference = naive_kernel(name, part.options.chunk_size)
                rows[f"{name} naive"] = dict(kernel=f"{name} naive", reference=f"fla {label}")
                if reference is None:
                    rows[f"{name} naive"]["status"] = "reference absent (set ZOO_REFERENCES)"
                elif f"{name} naive" in slow:
                    rows[f"{name} naive"]["status"] = slow[f"{name} naive"]
                else:
                    steps[f"{name} naive"] = clocked(training_step(reference, leaves))
        probe, probe_flops = matmul_probe(t, shape, torch.device("cpu"))
        progress(f"length {t}: {rounds} rounds after a warm-up round")
        recorded = paired_rounds(steps, rounds, probe=probe, progress=progress)
        for index, seconds in enumerate(recorded):
            for label in steps:
                round_rows.append(
                    dict(
                        length=t,
                        round=index,
                        kernel=label,
                        ms=seconds[label] * 1e3,
                        matmul_gflop_s=probe_flops / seconds["matmul_probe"] / 1e9,
                        load_1min=os.getloadavg()[0],
                    )
                )
        for label, row in rows.items():
            row.update(length=t, batch=batch, heads=heads, d_model=d_model, threads=threads)
            if label not in steps:
                summary.append(row)
                continue
            times = [r[label] for r in recorded]
            if statistics.median(times) > max_seconds:
                slow[label] = f"skipped (step > {max_seconds:.0f} s at {t:,})"
            row.update(
                status="ok",
                median_ms=statistics.median(times) * 1e3,
                vs_vanilla=statistics.median(r["vanilla"] / r[label] for r in recorded),
                matmul_gflop_s=statistics.median(probe_flops / r["matmul_probe"] for r in recorded) / 1e9,
            )
            own = label.removesuffix(" naive")
            if label != own and own in steps:
                row["ours_vs_this"] = statistics.median(r[label] / r[own] for r in recorded)
            if label in flops:
                shares = [flops[label] / (probe_flops / r["matmul_probe"]) / r[label] for r in recorded]
                row.update(
                    step_gflop=flops[label] / 1e9,
                    flop_share=statistics.median(shares),
                    flop_share_min=min(shares),
                    flop_share_max=max(shares),
                )
            summary.append(row)
    return round_rows, summary


def write_kernels(
    round_rows: list[dict[str, Any]], summary: list[dict[str, Any]], out_dir: Path, meta: dict[str, Any]
) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": write_csv(out_dir / "kernels.csv", summary),
        "rounds": write_csv(out_dir / "kernels_rounds.csv", round_rows or [{}]),
        "md": out_dir / "kernels.md",
    }
    lines = [
        "# zoo.bench --kernels: the chunk kernels alone, one training step each",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Machine: {meta['machine']}; torch {meta['torch']}, {meta['threads']} threads; batch {meta['batch']}, "
        f"d_model {meta['d_model']}, {meta['heads']} heads, fp32; load average before {meta['load_before']}, after "
        f"{meta['load']}. Paired rounds (order rotated, one warm-up round unrecorded). FLOP share: the kernel's "
        "FLOPs (its part's count without the projections, x3 for forward + backward) at the matmul rate measured "
        "each round, over the step's time. vs vanilla: vanilla's time / this one's (> 1 faster); ours / naive: the "
        "naive reference's time / ours (> 1: ours faster).",
        "",
        "| kernel | length | ms | vs vanilla | ours / naive | GFLOP | FLOP share (min-max) | matmul GFLOP/s "
        "| reference |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary:
        if r.get("status") != "ok":
            lines.append(f"| {r['kernel']} | {r['length']:,} | | | | | | | {r['reference']}: {r.get('status', '')} |")
            continue
        share = (
            f"{r['flop_share']:.2f} ({r['flop_share_min']:.2f}-{r['flop_share_max']:.2f})" if "flop_share" in r else ""
        )
        mine = f"{r['ours_vs_this']:.2f}x" if "ours_vs_this" in r else ""
        gflop = f"{r['step_gflop']:.2f}" if "step_gflop" in r else ""
        lines.append(
            f"| {r['kernel']} | {r['length']:,} | {r['median_ms']:,.1f} | {r['vs_vanilla']:.2f}x | {mine} | {gflop} | "
            f"{share} | {r['matmul_gflop_s']:.1f} | {r['reference']} |"
        )
    paths["md"].write_text("\n".join(lines) + "\n")
    return paths
