"""The papers' evaluation protocols for language models on contiguous text.

- ``segment``: the split cut into consecutive segments of ``seq_len`` tokens (lanes of
  ``batch_size`` rows), each scored on its own, no state carried: a token sees only the part of its
  segment before it (what a fixed-context model sees in training; the cheapest protocol).
- ``memory``: the same segments with the model's state carried across the whole split, and the
  evaluation-time memory of the papers: Transformer-XL's longer memory (``mem_len``, e.g. 2,100 at
  segments of 80 for the 12-layer enwik8 model) and ``clamp_len`` (distances beyond it share one
  relative embedding) are set on every attention for the duration and then restored, each through
  its own ``Attention.evaluation_memory`` (a mechanism without them refuses a non-zero setting);
  ``same_length`` gives every query the same number of keys (the reference code's eval option);
  adaptive-span models carry their span cache. Dai et al. 2019, Section 3.2 and the released eval
  scripts.
- ``stream``: the split's lanes fed ``seq_len`` tokens at a time (1 unless given: token by token)
  through the model's state from ``model.init_state``, carried across the whole split: what a
  deployed model streaming past any training length sees, in the memory its parts keep (a bounded
  window, attention sinks, XL memory, an unbounded KV cache). A model that cannot continue a
  sequence is refused with the reason. Where the context does not depend on how the stream is cut
  (a cache or memory holding every earlier token of a lane), it equals ``memory``.
- ``sliding``: a window of ``seq_len`` tokens moved by ``stride``; each window scores only the
  tokens the previous one did not, so after the first window every token is predicted with at
  least ``seq_len - stride`` tokens of context and, with stride 1, each with the full context
  (Al-Rfou et al. 2018's protocol for fixed-context models; its cost is seq_len / stride times a
  segment pass, which is why Transformer-XL's Table 9 compares against it).

Every protocol reports the summed NLL, the number of tokens scored, and the task metric.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm

from zoo.attention.base import Attention
from zoo.config import IGNORE_INDEX, require
from zoo.data.base import Task, metric_value

PROTOCOLS = ("segment", "memory", "stream", "sliding")


@dataclasses.dataclass
class ProtocolSettings:
    protocol: str = "segment"
    seq_len: int = 0  # 0 = the task's (training) length; stream: tokens per call (0 = 1, token by token)
    batch_size: int = 0  # 0 = the task's
    mem_len: int = 0  # memory protocol: evaluation memory of each attention (xl_rel's eval_mem_len; 0 = the model's)
    clamp_len: int = 0  # memory protocol: relative-distance clamp (xl_rel's clamp_len; 0 = the model's)
    same_length: bool = False  # memory protocol: every query sees the last mem_len keys (xl_rel's same_length)
    stride: int = 0  # sliding protocol: tokens the window moves (0 = seq_len // 2)

    def __post_init__(self) -> None:
        require(self.protocol in PROTOCOLS, f"--protocol must be one of {', '.join(PROTOCOLS)}; got {self.protocol!r}")
        require(isinstance(self.same_length, bool), f"same_length must be true or false, got {self.same_length!r}")
        for key in ("seq_len", "batch_size", "mem_len", "clamp_len", "stride"):
            require(
                isinstance(getattr(self, key), int) and getattr(self, key) >= 0,
                f"{key} must be an int >= 0, got {getattr(self, key)!r}",
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ProtocolSettings:
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - valid)
        require(not unknown, f"evaluation settings have unknown keys {unknown}; valid: {', '.join(sorted(valid))}")
        return cls(**values)


@contextlib.contextmanager
def evaluation_memory(model: nn.Module, mem_len: int, clamp_len: int, same_length: bool = False) -> Iterator[int]:
    """Ask every attention of ``model`` for ``mem_len`` / ``clamp_len`` / ``same_length`` (0 / False leaves
    a value alone) through its ``evaluation_memory``; yields how many attentions set something, and restores
    them afterwards. A mechanism that has no such setting refuses a non-zero one (ValueError naming it)."""
    with contextlib.ExitStack() as stack:
        attentions = [m for m in model.modules() if isinstance(m, Attention)]
        yield sum(bool(stack.enter_context(a.evaluation_memory(mem_len, clamp_len, same_length))) for a in attentions)


def split_stream(task: Task, split: str) -> np.ndarray:
    """The split's tokens as one contiguous array (text tasks: char_lm, enwik8, text8, word level)."""
    require(
        hasattr(task, "bounds") and hasattr(task, "data"),
        f"protocol sliding needs a contiguous text task; data {task.registry_name!r} is not one",
    )
    start, end = task.bounds[split]
    return np.asarray(task.data[start:end], dtype=np.int64)


def sliding_batches(stream: np.ndarray, seq_len: int, stride: int, batch_size: int) -> Iterator[dict[str, Tensor]]:
    """Windows of ``seq_len`` moved by ``stride``; targets already scored are -100, so each of the
    ``len(stream) - 1`` targets is scored exactly once. Yields batches of ``batch_size`` windows."""
    n_targets = len(stream) - 1
    require(n_targets >= 1, "the split holds fewer than two tokens")
    seq_len = min(seq_len, n_targets)
    starts = list(range(0, max(n_targets - seq_len, 0) + 1, stride))
    if starts[-1] + seq_len < n_targets:
        starts.append(n_targets - seq_len)  # a last window flush with the end
    scored_until = 0  # targets [0, scored_until) are done
    rows_tokens, rows_targets = [], []
    for s in starts:
        tokens = stream[s : s + seq_len]
        targets = stream[s + 1 : s + seq_len + 1].copy()
        first_new = max(scored_until - s, 0)
        targets[:first_new] = IGNORE_INDEX
        scored_until = s + seq_len
        rows_tokens.append(tokens)
        rows_targets.append(targets)
        if len(rows_tokens) == batch_size:
            yield {
                "tokens": torch.from_numpy(np.stack(rows_tokens)),
                "targets": torch.from_numpy(np.stack(rows_targets)),
            }
            rows_tokens, rows_targets = [], []
    if rows_tokens:
        yield {"tokens": torch.from_numpy(np.stack(rows_tokens)), "targets": torch.from_numpy(np.stack(rows_targets))}


def batch_nll(model: nn.Module, batch: dict[str, Tensor], state: Any) -> tuple[float, int, Any]:
    """(summed NLL in nats, tokens scored, new state) of one batch."""
    out = (
        model(batch["tokens"], batch["targets"], state=state)
        if state is not None
        else model(batch["tokens"], batch["targets"])
    )
    scored = int((batch["targets"] != IGNORE_INDEX).sum())
    return float(out.loss) * scored, scored, out.state


@torch.no_grad()
def progress(batches: Iterable, *, total: int | None, desc: str, show: bool = True) -> Iterable:
    """``batches`` with a progress bar on stderr: redrawn every half second on a terminal; elsewhere (a log
    file, a pipe) a line every 30 seconds, so a long evaluation (a split streamed token by token takes
    minutes) shows it is moving wherever its output goes. ``show=False``: none."""
    terminal = sys.stderr.isatty()
    return tqdm(
        batches,
        total=total,
        desc=desc,
        unit="batch",
        disable=not show,
        file=sys.stderr,
        mininterval=0.5 if terminal else 30.0,
        dynamic_ncols=terminal,
    )


def evaluate_protocol(
    model: nn.Module,
    task: Task,
    split: str,
    settings: ProtocolSettings,
    *,
    max_batches: int = 0,
    device: torch.device | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Score ``split`` of a contiguous LM task with one of :data:`PROTOCOLS`, showing its progress on
    stderr (:func:`progress`) unless ``show_progress`` is False."""
    require(
        task.kind == "lm" and task.contiguous,
        f"evaluation protocols score contiguous LM text; data {task.registry_name!r} is not",
    )
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    seq_len = settings.seq_len or task.seq_len
    batch_size = settings.batch_size or task.batch_size
    nll, count, n_batches = 0.0, 0, 0
    if settings.protocol == "sliding":
        stride = settings.stride or max(1, seq_len // 2)
        require(stride <= seq_len, f"stride ({stride}) must be <= seq_len ({seq_len})")
        batches: Any = sliding_batches(split_stream(task, split), seq_len, stride, batch_size)
        batches = progress(batches, total=max_batches or None, desc=settings.protocol, show=show_progress)
        carry = False
    else:
        stride = 0
        if settings.protocol == "stream":
            seq_len = settings.seq_len or 1
        view = copy.copy(task)  # the same data, cut at the evaluation length and batch
        view.seq_len, view.batch_size = seq_len, batch_size
        batches = view.eval_batches(split, None)
        carry = settings.protocol in ("memory", "stream")
        total = view.num_batches(split)
        batches = progress(batches, total=min(total, max_batches or total), desc=settings.protocol, show=show_progress)
    memory = (
        evaluation_memory(model, settings.mem_len, settings.clamp_len, settings.same_length)
        if carry
        else contextlib.nullcontext(0)
    )
    state = model.init_state(batch_size) if settings.protocol == "stream" else None  # refuses, with the reason
    with memory as changed:
        for batch in batches:
            batch = {k: v.to(device) for k, v in batch.items()}
            n, k, new_state = batch_nll(model, batch, state)
            state = new_state if carry else None
            nll, count, n_batches = nll + n, count + k, n_batches + 1
            if max_batches and n_batches >= max_batches:
                break
    model.train(was_training)
    return {
        f"{split}/loss": nll / max(count, 1),
        f"{split}/{task.metric}": metric_value(task.metric, nll, 0.0, count),
        f"{split}/scored": count,
        "protocol": settings.protocol,
        "settings": {
            "seq_len": seq_len,
            "batch_size": batch_size,
            "mem_len": settings.mem_len,
            "clamp_len": settings.clamp_len,
            "same_length": settings.same_length,
            "stride": stride,
            "attentions_set": changed,
        },
        "batches": n_batches,
    }


def add_protocol_arguments(parser) -> None:
    """evaluate.py's protocol flags (0 / empty = the paper's setting, else the task's)."""
    parser.add_argument(
        "--protocol",
        default="",
        choices=["", *PROTOCOLS],
        help="segment | memory | stream | sliding (default: the run's paper.eval, else the plain evaluation)",
    )
    parser.add_argument(
        "--seq-len", type=int, default=0, help="evaluation segment / window length (0 = paper's, else as trained)"
    )
    parser.add_argument(
        "--eval-batch-size",
        type=int,
        default=0,
        help="rows per evaluation batch for the protocol (0 = paper's, else as trained)",
    )
    parser.add_argument(
        "--mem-len",
        type=int,
        default=0,
        help="memory protocol: Transformer-XL evaluation memory (0 = paper's, else the model's)",
    )
    parser.add_argument(
        "--clamp-len",
        type=int,
        default=0,
        help="memory protocol: Transformer-XL clamp length (0 = paper's, else the model's)",
    )
    parser.add_argument(
        "--same-length",
        action="store_true",
        help="memory protocol: every query sees the last mem_len keys (Transformer-XL's eval; default: the paper's)",
    )
    parser.add_argument(
        "--stride",
        type=int,
        default=0,
        help="sliding protocol: tokens per window move (0 = paper's, else seq_len // 2)",
    )


def protocol_settings(args, run_config: dict[str, Any]) -> ProtocolSettings | None:
    """The settings from the run's ``paper.eval`` with the command-line flags on top; None when
    neither names a protocol (evaluate.py then runs its plain evaluation)."""
    paper_eval = dict(((run_config or {}).get("paper") or {}).get("eval") or {})
    flags = {
        "protocol": args.protocol,
        "seq_len": args.seq_len,
        "batch_size": args.eval_batch_size,
        "mem_len": args.mem_len,
        "clamp_len": args.clamp_len,
        "same_length": getattr(args, "same_length", False),
        "stride": args.stride,
    }
    merged = {**paper_eval, **{k: v for k, v in flags.items() if v}}
    if not merged.get("protocol"):
        return None
    return ProtocolSettings.from_dict(merged)
