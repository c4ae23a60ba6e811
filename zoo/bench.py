"""Speed and memory harness: ``python -m zoo.bench``.

For each variant (a registered attention in an LM skeleton, a preset, or a peer library's model)
and each sequence length (or depth), it measures one training step (forward + backward):

- time: median over ``--repeats`` after ``--warmup`` steps, with ``torch.set_num_threads`` fixed;
- tokens per second (batch * length / median time);
- activation memory: bytes of tensors saved for backward, counted with
  ``torch.autograd.graph.saved_tensors_hooks`` (unique storages, parameters excluded): exact and
  noise-free on CPU;
- peak resident memory of a fresh process running one step (``--rss``; noisier, includes torch);

then fits the log-log slope of time and memory against length (the complexity claim), finds the
length from which each variant beats the baseline, and writes ``bench.csv``, ``bench.md`` and a
log-log ``bench.png`` into ``--out``.

``--paired`` instead times the variants in alternating rounds in one run (the order rotated each
round, a warm-up round unrecorded) and reports each one's median speed-up over ``--baseline`` with
its min-max over rounds: the only timing that holds on a machine whose load drifts (``paired.csv``,
``paired_rounds.csv``, ``paired.md``, ``paired.png``); ``--flops`` adds the share of the matmul FLOP
bound reached where the count is known (the Reformer). ``--device`` (auto: CUDA when present)
measures on a GPU (synchronised clocks; ``gpu_peak_mib`` = ``torch.cuda.max_memory_allocated``);
``--compile`` adds every variant under ``torch.compile`` as ``<label>+compile``.

Variants: ``--attention a,b`` (mechanisms in a skeleton preset), ``--model p,q`` (presets),
``--variant key=value ...`` (one variant per flag, as dotted config overrides, the app's syntax,
merged by :func:`zoo.config.merge_config`), ``--peers`` (other libraries, :data:`PEER`).
``--set key=value`` goes on top of every zoo variant. Examples::

    python -m zoo.bench --attention vanilla --lengths 256,512,1024
    python -m zoo.bench --attention vanilla --variant attention=lsh attention.n_hashes=4 --lengths 1024,4096 \
        --peers reformer-pytorch
    python -m zoo.bench --model reformer,vanilla_lm --layers 2,4,8,12 --lengths 1024 --set residual=pre_norm
    python -m zoo.bench --model reformer --variant model=reformer stack=sequential --layers 2,4,8 --lengths 1024
    python -m zoo.bench --paired --flops --model reformer,vanilla_lm --peers reformer-pytorch \
        --baseline peer:reformer-pytorch --lengths 8192 --rounds 5
"""

from __future__ import annotations

import argparse
import ast
import csv
import functools
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import zoo
from zoo.config import merge_config
from zoo.models.costs import step_flops as model_step_flops
from zoo.registry import Registry
from zoo.train.meter import ActivationMeter, synchronize
from zoo.train.options import pick_device as trainer_pick_device
from zoo.train.steps import total_loss

# other libraries' models, for the benchmark: (length, shape) -> module
PEER: Registry[Any] = Registry("peer")

# -- variants -----------------------------------------------------------------------------------


@dataclass
class Variant:
    """One thing to measure: ``kind`` ``zoo`` (preset ``name`` with ``overrides`` merged over it by
    :func:`zoo.config.merge_config`, e.g. ``{"attention": {"name": "lsh", "n_hashes": 8}}``) or
    ``peer`` (another library's model, ``name`` registered in :data:`PEER`)."""

    label: str
    kind: str
    name: str
    overrides: dict[str, Any] = field(default_factory=dict)
    compile: bool = False  # the step runs the module under torch.compile (label "<label>+compile")


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        lowered = text.lower()
        return {"true": True, "false": False, "none": None, "null": None}.get(lowered, text)


def parse_set(items: list[str]) -> dict[str, Any]:
    """Dotted ``key=value`` items (the app's syntax) -> the nested dict :func:`merge_config` takes.

    ``["attention=lsh", "attention.n_hashes=4", "residual=pre_norm"]`` ->
    ``{"attention": {"name": "lsh", "n_hashes": 4}, "residual": "pre_norm"}``: a part named and
    then given options (in either order) becomes one ``{"name": ..., **options}``."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected key=value (dotted keys for options: attention.n_hashes=4), got {item!r}")
        *parents, leaf = key.strip().split(".")
        target = overrides
        for parent in parents:
            node = target.get(parent)
            target[parent] = {"name": node} if isinstance(node, str) else node if isinstance(node, dict) else {}
            target = target[parent]
        parsed = _literal(value.strip())
        if isinstance(target.get(leaf), dict) and isinstance(parsed, str):
            target[leaf] = {**target[leaf], "name": parsed}
        else:
            target[leaf] = parsed
    return overrides


def names(text: str | None, flag: str) -> list[str]:
    """A comma-separated list of names; options go in ``--variant``, never in parentheses."""
    out = [n.strip() for n in (text or "").split(",") if n.strip()]
    for name in out:
        if not name.replace("-", "_").isidentifier():
            raise ValueError(
                f"{flag}: {name!r} is not a name; give options as one variant of dotted key=value items, "
                "e.g. --variant attention=lsh attention.n_hashes=4 (model=<preset> picks the preset)"
            )
    return out


def peer_variant(name: str) -> Variant:
    """``x-transformers`` or ``x_transformers`` (the pip name or the registry's); labelled as given."""
    key = name.replace("-", "_")
    PEER.get(key)  # an unknown peer: the valid ones, and the closest
    return Variant(f"peer:{name}", "peer", key)


def named_variant(label: str) -> Variant:
    """``peer:<name>`` -> that peer; anything else -> that preset as registered."""
    return peer_variant(label[len("peer:") :]) if label.startswith("peer:") else Variant(label, "zoo", label)


# -- peers: other libraries' models, same shape of step -----------------------------------------
# Each entry builds ``module(tokens) -> logits`` from ``(length, shape)``; its docstring's first line
# describes it in tables and --help. Install them with ``pip install transformer-zoo[peers]``.


@PEER.register("x_transformers")
def _peer_x_transformers(length: int, shape: dict[str, int]) -> nn.Module:
    """x-transformers Decoder, attn_flash=True (SDPA)"""
    from x_transformers import Decoder, TransformerWrapper

    return TransformerWrapper(
        num_tokens=shape["vocab"],
        max_seq_len=length,
        attn_layers=Decoder(dim=shape["d_model"], depth=shape["layers"], heads=shape["heads"], attn_flash=True),
    )


@PEER.register("local_attention")
def _peer_local_attention(length: int, shape: dict[str, int]) -> nn.Module:
    """local-attention LocalTransformer, window 128"""
    from local_attention import LocalTransformer

    return LocalTransformer(
        num_tokens=shape["vocab"],
        max_seq_len=length,
        dim=shape["d_model"],
        depth=shape["layers"],
        heads=shape["heads"],
        causal=True,
        local_attn_window_size=128,
    )


@PEER.register("reformer_pytorch")
def _peer_reformer_pytorch(length: int, shape: dict[str, int]) -> nn.Module:
    """reformer-pytorch ReformerLM, 4 hashes, bucket 64, reversible"""
    from reformer_pytorch import ReformerLM

    return ReformerLM(
        num_tokens=shape["vocab"],
        dim=shape["d_model"],
        depth=shape["layers"],
        max_seq_len=length,
        heads=shape["heads"],
        bucket_size=64,
        n_hashes=4,
        causal=True,
    )


# -- building and stepping ----------------------------------------------------------------------


def split_batch(tokens: Tensor) -> tuple[Tensor, Tensor]:
    """[batch, length + 1] -> inputs and targets [batch, length], each its own tensor as in a training
    batch: a slice would keep the whole [batch, length + 1] storage alive, and the activation meter
    (which counts storages) would report more than the trainer does for the same step."""
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def build(
    variant: Variant, length: int, shape: dict[str, int], overrides: dict[str, Any], device: torch.device | str = "cpu"
) -> tuple[nn.Module, Callable[[Tensor], Tensor]]:
    """The module (on ``device``) and a ``loss(tokens)`` closure for one training step.

    A zoo variant's config: its preset, then the bench's sizes, then the variant's overrides, then
    ``overrides`` (``--set``, for every variant), each merged by :func:`zoo.config.merge_config`.
    ``variant.compile``: the closure calls ``torch.compile(module)`` (compiled on its first call)."""
    torch.manual_seed(0)
    if variant.kind == "peer":
        module = PEER.get(variant.name)(length, shape).to(device)
        forward = torch.compile(module) if variant.compile else module

        def peer_loss(tokens: Tensor) -> Tensor:
            inputs, targets = split_batch(tokens)
            logits = forward(inputs)
            return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

        return module, peer_loss

    sizing = dict(
        vocab_size=shape["vocab"],
        d_model=shape["d_model"],
        n_heads=shape["heads"],
        n_layers=shape["layers"],
        d_ff=shape["d_ff"],
        dropout=0.0,
        max_len=max(length, 16),
    )
    config = zoo.preset_config(variant.name).to_dict()
    for layer in (sizing, variant.overrides, overrides):
        config = merge_config(config, layer)
    module = zoo.create_model(**config).to(device)
    forward = torch.compile(module) if variant.compile else module

    def zoo_loss(tokens: Tensor) -> Tensor:
        return total_loss(forward(*split_batch(tokens)))

    return module, zoo_loss


def bench_tokens(vocab: int, batch: int, length: int, device: torch.device | str = "cpu") -> Tensor:
    """The token batch every variant at ``length`` steps on: [batch, length + 1] (inputs and targets)."""
    return torch.randint(0, vocab, (batch, length + 1), generator=torch.Generator().manual_seed(length)).to(device)


def activation_bytes(module: nn.Module, loss_fn: Callable[[Tensor], Tensor], tokens: Tensor) -> int:
    with ActivationMeter(module) as meter:
        loss = loss_fn(tokens)
    del loss  # the count is complete once forward has run; a backward here would only cost time
    return meter.bytes


def pick_device(name: str = "auto") -> torch.device:
    """``--device``: auto (CUDA when present, else CPU), cpu, cuda, cuda:N (the trainer's rule)."""

    try:
        return trainer_pick_device(name)
    except ValueError as error:
        message = str(error).replace("trainer.device=auto", "--device auto")
        raise ValueError(message.replace("trainer.device", "--device")) from None


def timed_step(module: nn.Module, loss_fn: Callable[[Tensor], Tensor], tokens: Tensor) -> float:
    """Seconds of one forward + backward (synchronised on CUDA before and after)."""
    synchronize(tokens.device)
    start = time.perf_counter()
    loss_fn(tokens).backward()
    synchronize(tokens.device)
    elapsed = time.perf_counter() - start
    module.zero_grad(set_to_none=True)
    return elapsed


def time_steps(
    module: nn.Module,
    loss_fn: Callable[[Tensor], Tensor],
    tokens: Tensor,
    warmup: int,
    repeats: int,
    max_seconds: float,
) -> list[float]:
    """Seconds per forward + backward; fewer repeats when one step alone exceeds ``max_seconds``."""
    module.train()
    times = []
    for i in range(warmup + repeats):
        elapsed = timed_step(module, loss_fn, tokens)
        if i >= warmup:
            times.append(elapsed)
        if elapsed > max_seconds and (i >= warmup or warmup + repeats > 1):
            if i < warmup:  # a warm-up this slow: time one more step and stop
                times.append(timed_step(module, loss_fn, tokens))
            break
    return times


def gpu_peak_mib(module: nn.Module, loss_fn: Callable[[Tensor], Tensor], tokens: Tensor) -> float:
    """Peak CUDA memory allocated during one training step (weights, activations, gradients, workspace)."""
    synchronize(tokens.device)
    torch.cuda.reset_peak_memory_stats(tokens.device)
    timed_step(module, loss_fn, tokens)
    return torch.cuda.max_memory_allocated(tokens.device) / 2**20


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def measure_rss(
    variant: Variant, length: int, shape: dict[str, int], overrides: dict[str, Any], threads: int
) -> tuple[float, float]:
    """(peak MiB, step MiB) of a fresh process that builds the model and runs one step."""
    payload = json.dumps(
        {"variant": asdict(variant), "length": length, "shape": shape, "overrides": overrides, "threads": threads}
    )
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.bench", "--_rss-child", payload], capture_output=True, text=True, timeout=1800
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "rss child failed")
    peak, step = json.loads(proc.stdout.strip().splitlines()[-1])
    return peak, step


def _rss_child(payload: str) -> None:
    spec = json.loads(payload)
    torch.set_num_threads(spec["threads"])
    variant = Variant(**spec["variant"])
    module, loss_fn = build(variant, spec["length"], spec["shape"], spec["overrides"])
    tokens = torch.randint(0, spec["shape"]["vocab"], (spec["shape"]["batch"], spec["length"] + 1))
    before = _rss_kib()
    loss_fn(tokens).backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps([peak / 1024, max(0, peak - before) / 1024]))


# -- the run ------------------------------------------------------------------------------------


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
                            variant, length, shape, overrides, threads
                        )
                    if median > max_seconds:
                        stop_reason[variant.label] = f"step > {max_seconds:.0f} s"
                except Exception as error:  # noqa: BLE001  (recorded in the table, not hidden)
                    row["status"] = f"error: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
                    stop_reason[variant.label] = "failed at a smaller point"
                rows.append(row)
                progress(_progress_line(row))
    return rows


def _progress_line(row: dict[str, Any]) -> str:
    if row.get("status") != "ok":
        return f"{row['variant']:>28}  L={row['length']:>6}  layers={row['layers']:>2}  {row['status']}"
    timing = f"{row['time_ms']:9.1f} ms  {row['tokens_per_s']:9.0f} tok/s" if "time_ms" in row else "(not timed)"
    return (
        f"{row['variant']:>28}  L={row['length']:>6}  layers={row['layers']:>2}  "
        f"{timing}  act {row['act_mib']:8.1f} MiB"
    )


# -- paired timing: variants in alternating rounds ----------------------------------------------
# On a shared machine the load drifts by several times within minutes, so timing one variant after
# another turns their ratio into a ratio of two load levels. In paired mode every round times one
# step of each variant back to back, in an order rotated by one each round (A B C, B C A, C A B):
# each round gives ratios under nearly the same load, and no variant always runs first or last.


def rotation(labels: list[str], round_index: int) -> list[str]:
    """The order of round ``round_index``: ``labels`` rotated left by ``round_index``."""
    shift = round_index % len(labels)
    return labels[shift:] + labels[:shift]


def paired_rounds(
    steps: dict[str, Callable[[], float]],
    rounds: int,
    *,
    probe: Callable[[], float] | None = None,
    progress: Callable[[str], None] = print,
) -> list[dict[str, float]]:
    """Seconds per step of every variant in ``rounds`` recorded rounds, after one warm-up round that is
    not recorded; ``steps[label]()`` runs one step and returns its seconds. ``probe`` (the matmul
    rate probe of ``--flops``) runs before and after each round; its faster time is recorded."""
    labels = list(steps)
    recorded = []
    for round_index in range(-1, rounds):  # round -1: warm-up (allocator, lazy init, compilation)
        seconds = {"matmul_probe": probe()} if probe else {}
        ran = {label: steps[label]() for label in rotation(labels, round_index + 1)}
        seconds.update((label, ran[label]) for label in labels)  # recorded in the given order
        if probe:
            seconds["matmul_probe"] = min(seconds["matmul_probe"], probe())
        progress(
            f"round {round_index:2d}  "
            + "  ".join(f"{k} {v * 1e3:,.1f} ms" for k, v in seconds.items())
            + f"  load {os.getloadavg()[0]:.1f}"
        )
        if round_index >= 0:
            recorded.append(seconds)
    return recorded


def paired_ratios(rounds: list[dict[str, float]], baseline: str) -> dict[str, dict[str, float]]:
    """Per variant: median seconds, and the speed-up over ``baseline`` (baseline time / variant time,
    taken per round: > 1 is faster) as the median over rounds with its min and max."""
    if not rounds or baseline not in rounds[0]:
        raise ValueError(
            f"--baseline {baseline!r} is not a measured variant; "
            f"choose one of: {', '.join(k for k in (rounds[0] if rounds else {}) if k != 'matmul_probe')}"
        )
    out = {}
    for label in (k for k in rounds[0] if k != "matmul_probe"):
        ratios = [r[baseline] / r[label] for r in rounds]
        out[label] = dict(
            median_s=statistics.median(r[label] for r in rounds),
            ratio=statistics.median(ratios),
            ratio_min=min(ratios),
            ratio_max=max(ratios),
        )
    return out


def reformer_step_flops(
    t: int,
    d: int = 256,
    heads: int = 4,
    layers: int = 2,
    d_ff: int = 1024,
    vocab: int = 256,
    hashes: int = 4,
    chunk: int = 64,
    n_buckets: int = 0,
    batch: int = 1,
) -> dict[str, float]:
    """Matmul FLOPs of one training step of the ``reformer`` preset at these sizes, as its parts count
    them (:func:`step_flops`): LSH attention its projections, chunks and hashing; the reversible
    stack its recomputation (one more forward)."""
    lsh = {"n_hashes": hashes, "chunk_size": chunk, "n_buckets": n_buckets}
    sizes = dict(vocab_size=vocab, d_model=d, n_heads=heads, n_layers=layers, d_ff=d_ff, max_len=max(t, 16))
    with torch.device("meta"):  # shapes only: nothing allocated
        model = zoo.create_model("reformer", **sizes, dropout=0.0, attention=lsh)
    return step_flops(model, t, {"batch": batch})


def step_flops(module: nn.Module, length: int, shape: dict[str, int]) -> dict[str, float] | None:
    """The FLOP count of one training step, asked of the model's parts (zoo/models/costs.py): each
    attention's forward FLOPs, the feed-forward's, the stack's recomputation, the output layer. None
    where a part does not say (a mechanism without ``forward_flops``, a peer)."""
    return model_step_flops(module, length, shape["batch"])


def matmul_probe(length: int, shape: dict[str, int], device: torch.device) -> tuple[Callable[[], float], float]:
    """(seconds of one [t, d] x [d, d_ff] matmul, its FLOPs): the machine's achievable matmul rate at
    the feed-forward's shape, under the round's load."""
    a = torch.randn(length * shape["batch"], shape["d_model"], device=device)
    b = torch.randn(shape["d_model"], shape["d_ff"], device=device)

    def probe() -> float:
        synchronize(device)
        start = time.perf_counter()
        for _ in range(10):
            torch.mm(a, b)
        synchronize(device)
        return (time.perf_counter() - start) / 10

    return probe, 2.0 * a.shape[0] * a.shape[1] * b.shape[1]


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
    progress: Callable[[str], None] = print,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Alternating rounds at each length (see :func:`paired_rounds`). Returns (one row per round and
    variant: ms, speed-up over ``baseline`` in that round, load; one summary row per length and
    variant: median ms, median speed-up with min-max, activation MiB, FLOP-bound share where known)."""
    torch.set_num_threads(threads)
    device = torch.device(device)
    shape = dict(d_model=d_model, heads=heads, layers=layers, vocab=vocab, batch=batch, d_ff=d_ff or 4 * d_model)
    round_rows, summary = [], []
    for length in lengths:
        built = {v.label: build(v, length, shape, overrides or {}, device) for v in variants}
        tokens = bench_tokens(vocab, batch, length, device)
        acts = {label: activation_bytes(module, loss_fn, tokens) / 2**20 for label, (module, loss_fn) in built.items()}
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
            )
            eager = label.removesuffix("+compile")
            if label != eager and eager in built:  # --compile: the compiled twin against its own eager run
                own = paired_ratios(recorded, eager)[label]
                entry.update(
                    compile_speedup=own["ratio"],
                    compile_speedup_min=own["ratio_min"],
                    compile_speedup_max=own["ratio_max"],
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


def paired_markdown(summary: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    baseline = summary[0]["baseline"]
    lines = [
        f"# {meta.get('title') or 'zoo.bench --paired: alternating rounds'}",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Machine: {meta['machine']}; device {meta['device']}; torch {meta['torch']}, {meta['threads']} threads; "
        f"batch {meta['batch']}, d_model {meta['d_model']}, {meta['heads']} heads, {meta['layers']} layers, "
        f"vocab {meta['vocab']}; load average at the end {meta['load']}. One training step = forward + backward; "
        "every round times each variant once, in an order rotated each round, after one unrecorded "
        "warm-up round.",
        "",
    ]
    has_flops = any("flop_share" in s for s in summary)
    for length in dict.fromkeys(s["length"] for s in summary):
        lines += [
            f"## Length {length:,}",
            "",
            f"| variant | median ms | speed-up over `{baseline}` (median of per-round ratios) | min-max "
            "| activation MiB |" + (" FLOP-bound share (min-max) |" if has_flops else ""),
            "|---|---|---|---|---|" + ("---|" if has_flops else ""),
        ]
        for s in (s for s in summary if s["length"] == length):
            share = ""
            if has_flops:
                share = (
                    f" {s['flop_share']:.2f} ({s['flop_share_min']:.2f}-{s['flop_share_max']:.2f}) |"
                    if "flop_share" in s
                    else " |"
                )
            lines.append(
                f"| {s['variant']} | {s['median_ms']:,.1f} | {s['speedup']:.2f}x "
                f"| {s['speedup_min']:.2f}-{s['speedup_max']:.2f} | {s['act_mib']:,.1f} |{share}"
            )
        twins = [s for s in summary if s["length"] == length and "compile_speedup" in s]
        if twins:
            lines += [
                "",
                "torch.compile against eager (eager time / compiled time per round; compilation happens in "
                "the warm-up round):",
                "",
                "| variant | speed-up from compile | min-max |",
                "|---|---|---|",
            ]
            lines += [
                f"| {s['variant'].removesuffix('+compile')} | {s['compile_speedup']:.2f}x | "
                f"{s['compile_speedup_min']:.2f}-{s['compile_speedup_max']:.2f} |"
                for s in twins
            ]
        for s in (s for s in summary if s["length"] == length and "gflop" in s):
            lines += [
                "",
                f"FLOP bound of one `{s['variant']}` step: {s['gflop']:.1f} GFLOP ({s['flop_parts']}); "
                "share = "
                "that many FLOPs at the round's matmul rate ([t, d] x [d, d_ff] probe) / the step's time.",
            ]
        lines.append("")
    return "\n".join(lines)


def paired_plot(summary: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = list(dict.fromkeys(s["length"] for s in summary))
    labels = list(dict.fromkeys(s["variant"] for s in summary))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(labels) * len(lengths)), 4))
    width = 0.8 / len(lengths)
    for i, length in enumerate(lengths):
        rows = {s["variant"]: s for s in summary if s["length"] == length}
        xs = [j + i * width for j, label in enumerate(labels) if label in rows]
        mid = [rows[label]["speedup"] for label in labels if label in rows]
        low = [rows[label]["speedup"] - rows[label]["speedup_min"] for label in labels if label in rows]
        high = [rows[label]["speedup_max"] - rows[label]["speedup"] for label in labels if label in rows]
        ax.bar(xs, mid, width, yerr=[low, high], capsize=3, label=f"length {length:,}")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([j + width * (len(lengths) - 1) / 2 for j in range(len(labels))])
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=7)
    ax.set_ylabel(f"speed-up over {summary[0]['baseline']} (median, min-max)")
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_paired(
    round_rows: list[dict[str, Any]], summary: list[dict[str, Any]], out: Path, meta: dict[str, Any]
) -> dict[str, Path]:
    """``paired.csv`` (one row per length and variant), ``paired_rounds.csv`` (every round),
    ``paired.md``, ``paired.png``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": out / "paired.csv",
        "rounds": out / "paired_rounds.csv",
        "md": out / "paired.md",
        "png": out / "paired.png",
    }
    for key, rows in (("csv", summary), ("rounds", round_rows)):
        with open(paths[key], "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
            writer.writeheader()
            writer.writerows(rows)
    paths["md"].write_text(paired_markdown(summary, meta))
    paired_plot(summary, paths["png"], meta.get("title") or "zoo.bench --paired")
    return paths


# -- analysis and outputs -----------------------------------------------------------------------


def fit_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) against log(x); nan with fewer than two points."""
    points = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(points) < 2:
        return float("nan")
    mx = sum(p[0] for p in points) / len(points)
    my = sum(p[1] for p in points) / len(points)
    var = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / var if var else float("nan")


def sweep_axis(rows: list[dict[str, Any]]) -> str:
    return "layers" if len({r["layers"] for r in rows}) > 1 and len({r["length"] for r in rows}) == 1 else "length"


def series(rows: list[dict[str, Any]], label: str, axis: str, key: str) -> tuple[list[float], list[float]]:
    ok = [r for r in rows if r["variant"] == label and r.get("status") == "ok" and r.get(key) is not None]
    ok.sort(key=lambda r: r[axis])
    return [r[axis] for r in ok], [r[key] for r in ok]


def crossover(rows: list[dict[str, Any]], label: str, baseline: str, axis: str) -> str:
    """Smallest measured point from which ``label`` is faster than ``baseline`` at every larger one."""
    mine = dict(zip(*series(rows, label, axis, "time_ms")))
    base = dict(zip(*series(rows, baseline, axis, "time_ms")))
    shared = sorted(set(mine) & set(base))
    if not shared:
        return "n/a"
    winner = None
    for x in reversed(shared):
        if mine[x] < base[x]:
            winner = x
        else:
            break
    if winner is None:
        return f"not by {shared[-1]}"
    return f"{winner}" if winner != shared[0] else f"<= {winner}"


def summarise(rows: list[dict[str, Any]], baseline: str | None) -> list[dict[str, Any]]:
    axis = sweep_axis(rows)
    labels = list(dict.fromkeys(r["variant"] for r in rows))
    baseline = baseline if baseline in labels else labels[0]
    summary = []
    for label in labels:
        xs, ts = series(rows, label, axis, "time_ms")
        mxs, ms = series(rows, label, axis, "act_mib")  # its own points: memory may be measured untimed
        entry = dict(variant=label, time_slope=fit_slope(xs, ts), memory_slope=fit_slope(mxs, ms))
        if label != baseline:
            entry["faster_than_baseline_from"] = crossover(rows, label, baseline, axis)
        if ms:
            entry["memory_last_over_first"] = ms[-1] / ms[0] if ms[0] else float("nan")
        summary.append(entry)
    return summary


def markdown(
    rows: list[dict[str, Any]], summary: list[dict[str, Any]], meta: dict[str, Any], baseline: str | None
) -> str:
    axis = sweep_axis(rows)
    points = sorted({r[axis] for r in rows})
    labels = list(dict.fromkeys(r["variant"] for r in rows))
    baseline = baseline if baseline in labels else labels[0]
    lines = [f"# {meta.get('title', 'zoo.bench')}", "", f"Command: `{meta['command']}`", ""]
    lines.append(
        f"Machine: {meta['machine']}; device {meta.get('device', 'cpu')}; torch {meta['torch']}, "
        f"{meta['threads']} threads; batch {meta['batch']}, d_model {meta['d_model']}, {meta['heads']} heads, "
        f"vocab {meta['vocab']}. One training step = forward + backward, median of repeats after warm-up."
    )
    lines.append("")

    def table(key: str, title: str, fmt: str) -> None:
        lines.append(f"## {title}")
        lines.append("")
        lines.append("| variant | " + " | ".join(f"{axis} {p:,}" for p in points) + " |")
        lines.append("|---|" + "---|" * len(points))
        for label in labels:
            cells = []
            for p in points:
                row = next((r for r in rows if r["variant"] == label and r[axis] == p), None)
                if row is None:
                    cells.append("")
                elif row.get("status") != "ok" or row.get(key) is None:
                    cells.append(str(row.get("status", ""))[:40])
                else:
                    cells.append(format(row[key], fmt))
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")

    if any("time_ms" in r for r in rows):  # absent when only memory was measured (--repeats 0)
        table("time_ms", "Time per training step (ms)", ",.1f")
        table("tokens_per_s", "Tokens per second", ",.0f")
    table("act_mib", "Activation memory saved for backward (MiB)", ",.1f")
    if any("gpu_peak_mib" in r for r in rows):
        table("gpu_peak_mib", "Peak CUDA memory allocated in one step (MiB)", ",.0f")
    if any("rss_peak_mib" in r for r in rows):
        table("rss_peak_mib", "Peak RSS of a fresh process running one step (MiB)", ",.0f")
    lines.append(f"## Fitted log-log slopes (against {axis}) and crossover against `{baseline}`")
    lines.append("")
    lines.append(f"| variant | time slope | memory slope | memory last/first | faster than {baseline} from {axis} |")
    lines.append("|---|---|---|---|---|")
    for s in summary:
        lines.append(
            f"| {s['variant']} | {s['time_slope']:.2f} | {s['memory_slope']:.2f} | "
            f"{s.get('memory_last_over_first', float('nan')):.2f} | "
            f"{s.get('faster_than_baseline_from', '(baseline)')} |"
        )
    lines.append("")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], summary: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axis = sweep_axis(rows)
    slopes = {s["variant"]: s for s in summary}
    timed = any("time_ms" in r for r in rows)
    fig, axes = plt.subplots(1, 2 if timed else 1, figsize=(10 if timed else 5.5, 4), squeeze=False)
    ax_t, ax_m = (axes[0][0], axes[0][1]) if timed else (None, axes[0][0])
    for label in dict.fromkeys(r["variant"] for r in rows):
        xs, ts = series(rows, label, axis, "time_ms")
        if xs and ax_t is not None:
            ax_t.loglog(xs, ts, "o-", label=f"{label} (slope {slopes[label]['time_slope']:.2f})")
        xs, ms = series(rows, label, axis, "act_mib")
        if xs:
            ax_m.loglog(xs, ms, "o-", label=f"{label} (slope {slopes[label]['memory_slope']:.2f})")
    if ax_t is not None:
        ax_t.set(xlabel=axis, ylabel="ms per training step", title="time")
    ax_m.set(xlabel=axis, ylabel="MiB saved for backward", title="activation memory")
    for ax in (a for a in (ax_t, ax_m) if a is not None):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_outputs(
    rows: list[dict[str, Any]], out: Path, meta: dict[str, Any], baseline: str | None = None
) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(rows, baseline)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    paths = {"csv": out / "bench.csv", "md": out / "bench.md", "png": out / "bench.png", "json": out / "summary.json"}
    with open(paths["csv"], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    paths["md"].write_text(markdown(rows, summary, meta, baseline))
    paths["json"].write_text(json.dumps({"meta": meta, "summary": summary}, indent=2, default=str))
    plot(rows, summary, paths["png"], meta.get("title", "zoo.bench"))
    return paths


def add_variant_arguments(parser: argparse.ArgumentParser) -> None:
    """--attention, --model, --variant, --peers, --compile: what to measure."""
    parser.add_argument("--attention", help="comma-separated mechanisms, each in the --model skeleton (vanilla_lm)")
    parser.add_argument("--model", help="comma-separated presets; with --attention, a single preset is the skeleton")
    parser.add_argument(
        "--variant",
        action="append",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="one variant as dotted config overrides, e.g. "
        "--variant attention=lsh attention.n_hashes=8; "
        "model=<preset> picks the preset (default: the skeleton); repeat for more variants",
    )
    parser.add_argument("--peers", default="", help=f"comma-separated peer libraries: {', '.join(PEER.list())}")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also measure every variant under torch.compile, labelled <label>+compile",
    )


def variants_from_args(args: argparse.Namespace) -> list[Variant]:
    models = names(args.model, "--model")
    skeleton = "vanilla_lm"
    if args.attention and len(models) == 1:
        skeleton = models.pop()
    variants = [Variant(name, "zoo", skeleton, {"attention": name}) for name in names(args.attention, "--attention")]
    variants += [Variant(name, "zoo", name) for name in models]
    for items in args.variant:
        overrides = parse_set(items)
        variants.append(Variant(" ".join(items), "zoo", str(overrides.pop("model", skeleton)), overrides))
    variants += [peer_variant(name) for name in names(args.peers, "--peers")]
    if not variants:
        raise SystemExit("nothing to measure: give --attention, --model and/or --variant (and optionally --peers)")
    labels = [v.label for v in variants]
    if len(set(labels)) < len(labels):
        raise SystemExit(f"two variants share a label: {', '.join(sorted({x for x in labels if labels.count(x) > 1}))}")
    if getattr(args, "compile", False):  # each one beside its compiled self
        variants = [w for v in variants for w in (v, replace(v, label=f"{v.label}+compile", compile=True))]
    return variants


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m zoo.bench",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_variant_arguments(parser)
    parser.add_argument("--lengths", default="256,512,1024", help="comma-separated sequence lengths")
    parser.add_argument(
        "--layers", default="2", help="comma-separated depths (several with one length = a depth sweep)"
    )
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-ff", type=int, default=0, help="feed-forward width (default 4 * d_model)")
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override on top of every zoo variant, e.g. residual=pre_norm or attention.n_hashes=4",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="auto", help="auto (cuda when present, else cpu), cpu, cuda or cuda:N")
    parser.add_argument(
        "--paired",
        action="store_true",
        help="alternating rounds in one run: every round times one step of each variant, in an order "
        "rotated each round, after a warm-up round; reports the median speed-up over --baseline "
        "with its min-max over rounds (paired.csv, paired_rounds.csv, paired.md, paired.png)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="--paired: recorded rounds")
    parser.add_argument(
        "--flops",
        action="store_true",
        help="--paired: the share of the matmul FLOP bound each step reaches, where the count is "
        "known (the Reformer: LSH attention in a reversible stack), against a matmul probe "
        "timed each round",
    )
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed steps per point (0: activation memory and RSS only, no timing)"
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=60.0,
        help="a step slower than this is measured once and the variant skips larger points",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help="variant label the crossover (or --paired's speed-up) is measured against (default: the first)",
    )
    parser.add_argument("--no-rss", action="store_true", help="skip the fresh-process peak RSS measurement")
    parser.add_argument("--title", default=None)
    parser.add_argument("--out", default="results/bench", help="output folder for bench.csv, bench.md, bench.png")
    parser.add_argument("--_rss-child", dest="rss_child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        _rss_child(args.rss_child)
        return 0

    try:
        variants = variants_from_args(args)
        overrides = parse_set(args.set)
        device = pick_device(args.device)
    except ValueError as error:  # a bad name, item or device: the message says what is allowed
        parser.error(str(error))
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    layers = [int(x) for x in args.layers.split(",") if x.strip()]
    command = "python -m zoo.bench " + " ".join(_quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    meta = dict(
        title=args.title or "zoo.bench: one training step",
        command=command,
        machine=_machine(),
        torch=torch.__version__,
        threads=args.threads,
        batch=args.batch,
        d_model=args.d_model,
        heads=args.heads,
        vocab=args.vocab,
        device=str(device),
    )
    sizes = dict(
        d_model=args.d_model,
        heads=args.heads,
        vocab=args.vocab,
        batch=args.batch,
        d_ff=args.d_ff or None,
        overrides=overrides,
        threads=args.threads,
        device=device,
    )
    if args.paired:
        labels = [v.label for v in variants]
        baseline = args.baseline or labels[0]
        if baseline not in labels or len(layers) != 1 or args.rounds < 1:
            parser.error(
                f"--paired needs one --layers value, --rounds >= 1 and --baseline among the variants "
                f"({', '.join(labels)}); got --layers {args.layers}, --rounds {args.rounds}, "
                f"--baseline {baseline}"
            )
        round_rows, summary = run_paired(
            variants, lengths, baseline, rounds=args.rounds, layers=layers[0], flops=args.flops, **sizes
        )
        meta.update(title=args.title, layers=layers[0], load=", ".join(f"{x:.2f}" for x in os.getloadavg()))
        paths = write_paired(round_rows, summary, Path(args.out), meta)
        print(paths["md"].read_text())
        print(f"wrote {', '.join(str(p) for p in paths.values())}")
        return 0
    rows = run(
        variants,
        lengths,
        layers=layers,
        warmup=args.warmup,
        repeats=args.repeats,
        max_seconds=args.max_seconds,
        rss=not args.no_rss,
        **sizes,
    )
    paths = write_outputs(rows, Path(args.out), meta, args.baseline)
    print(paths["md"].read_text())
    print(f"wrote {paths['csv']}, {paths['md']}, {paths['png']}")
    return 0


def _quote(arg: str) -> str:
    return f"'{arg}'" if any(c in arg for c in " ()[]{}*;") else arg


def _machine() -> str:
    cpu = "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"


if __name__ == "__main__":
    raise SystemExit(main())
