"""What a configuration builds, without data or training, beside the paper it reproduces.

``describe(overrides)`` composes the app's config (``experiment=paper/xl_enwik8_24l ...``), builds
the model on the ``meta`` device (shapes only, no memory: a 277M-parameter model describes in a
second) and returns the preset, each axis with its options, the exact parameter count, and
estimates of the training cost per token at the configured length:

- FLOPs per training token = 3 x the forward FLOPs (backward costs about twice the forward):
  2 x (every weight matrix a token passes through) + the attention term
  2 x n_terms x d_model x (keys each query sees, averaged over a causal segment) per layer, where
  n_terms is 2 (QK^T, AV) or 3 for Transformer-XL's relative scores (the Q R^T term). Keys per
  query follow each mechanism's pattern (:func:`keys_per_query`); adaptive-span counts the
  largest span (an upper bound: learned spans start at 0).
- Activation memory per token: Korthikanti et al. 2022 ("Reducing Activation Recomputation in
  Large Transformer Models", arXiv:2205.05198), bf16 with a fused attention kernel:
  (18 d_model + 4 d_ff) bytes per token per layer; a reversible stack keeps one layer's worth;
  memory models add their cached keys and values (4 d_model bytes per memory slot per layer).
  These are estimates: ``python -m zoo.bench`` measures saved tensors exactly.

``paper:`` blocks (conf/experiment/paper/*.yaml) carry the published figures; ``check_paper_data``
refuses a paper configuration asked of another dataset unless ``paper.allow_other_data=true``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from zoo.app.compose import compose, explain
from zoo.app.resolve import as_dict, model_config
from zoo.config import require
from zoo.data import TASK
from zoo.models.base import HEAD

# vocabularies of word-level data sets when their files are not at hand (describe needs no data)
WORD_VOCABS = {"wikitext103": 267_735, "wikitext2": 33_278, "ptb_word": 10_000}


def paper_block(resolved: dict[str, Any]) -> dict[str, Any] | None:
    return resolved.get("paper") or None


def check_paper_data(resolved: dict[str, Any]) -> None:
    """A paper configuration run on a dataset it was not written for is refused, naming both."""
    paper = paper_block(resolved)
    if not paper or not paper.get("dataset"):
        return
    data = resolved["data"]["name"]
    if data != paper["dataset"] and not paper.get("allow_other_data"):
        raise ValueError(
            f"experiment={resolved.get('experiment')} reproduces {paper.get('citation', 'a paper')} on "
            f"data={paper['dataset']}, "
            f"but data={data} was asked for: the paper's figures do not apply. Use data={paper['dataset']}, "
            f"or add paper.allow_other_data=true to run its configuration on {data} anyway"
        )


def nominal_vocab_size(data: dict[str, Any]) -> tuple[int, str]:
    """(vocabulary size, where it comes from) for a data node, without reading any file."""
    name = data["name"]
    if name in WORD_VOCABS:
        return WORD_VOCABS[name], f"the standard {name} vocabulary (the training file sets the real one)"
    if data.get("vocab", "bytes") == "bytes" and name in ("enwik8", "text8", "char_lm"):
        return 256, "bytes"

    task_cls = TASK.get(name)
    return int(getattr(task_cls, "vocab_size", 256)), f"{name}'s default vocabulary"


def resolved_config(overrides: list[str]) -> dict[str, Any]:
    """The composed config (``imports=`` honoured); an unknown key is a ValueError saying which."""
    try:
        return as_dict(compose(list(overrides)))
    except Exception as exc:
        message = explain(exc)
        if message:
            raise ValueError(message) from None
        raise


def model_config_for(resolved: dict[str, Any]):
    """The ModelConfig the app would build for ``resolved`` (vocabulary from the data's name)."""

    vocab, vocab_source = nominal_vocab_size(resolved["data"])
    config = model_config(resolved, {"vocab_size": vocab}, min_len=resolved["trainer"]["seq_len"])
    return config.name, config, vocab_source


def meta_model(config):
    """The model built on the meta device: real shapes, no storage, no initialisation cost."""

    with torch.device("meta"):
        return HEAD.get(config.kind)(config)


def count_parameters(model) -> dict[str, int]:
    """Unique parameters (tied ones once), split into embedding/head and the rest."""
    seen: dict[int, tuple[str, torch.nn.Parameter]] = {}
    for name, p in model.named_parameters():
        seen.setdefault(id(p), (name, p))
    total = sum(p.numel() for _, p in seen.values())
    io = sum(p.numel() for name, p in seen.values() if name.startswith(("embed.", "head.", "position.")))
    return {"params": total, "params_embedding_and_head": io, "params_blocks": total - io}


def keys_per_query(attention: dict[str, Any], t: int) -> tuple[float, str]:
    """Average keys a query attends to in a causal segment of ``t`` tokens, and the rule used."""
    name = attention["name"]
    if name == "xl_rel":
        mem = attention.get("mem_len", 0)
        return mem + (t + 1) / 2, f"memory {mem} + causal segment"
    if name == "adaptive_span":
        span = attention.get("max_span", 1024) + attention.get("ramp", 32)
        return float(min(span, attention.get("cache_size", 0) or span)), "max span + ramp (upper bound)"
    if name == "sparse_fixed":
        stride, c = attention.get("stride", 128) or math.ceil(math.sqrt(t)), attention.get("c", 8)
        own, summary = (stride + 1) / 2, c * (t / stride) / 2
        combine = attention.get("combine", "interleaved")
        if combine == "union":
            return own + summary, "own block + summary columns (union)"
        return (own + summary) / 2, f"mean of the two patterns ({combine})"
    if name == "sparse_strided":
        stride = attention.get("stride", 128) or math.ceil(math.sqrt(t))
        band, column = stride + 1, (t / stride) / 2
        combine = attention.get("combine", "interleaved")
        return (band + column) if combine == "union" else (band + column) / 2, f"band + column ({combine})"
    if name == "local_1d":
        return attention.get("block", 128) / 2 + attention.get("memory", 128), "query block + memory block"
    if name == "lsh":
        return attention.get("n_hashes", 4) * attention.get(
            "chunk_size", 64
        ), "hashes x chunk (causal window within buckets)"
    return (t + 1) / 2, "dense causal"


def estimate_costs(config, seq_len: int) -> dict[str, Any]:
    """FLOPs and activation bytes per training token (see the module docstring for the rules)."""
    d, f, layers, vocab = config.d_model, config.d_ff, config.n_layers, config.vocab_size
    attention = dict(config.attention)
    keys, rule = keys_per_query(attention, seq_len)
    terms = 3 if attention["name"] == "xl_rel" else 2
    projections = 4 * d * d + (d * d if attention["name"] == "xl_rel" else 0)  # q, k, v, out (+ W_R for XL)
    per_layer = 2 * (projections + 2 * d * f) + 2 * terms * d * keys
    if config.adaptive:
        cutoffs = list(config.adaptive["cutoffs"])
        head = 2 * d * (cutoffs[0] + len(cutoffs))  # the head cluster; tails add in proportion to their tokens
        head_rule = "adaptive softmax: head cluster only (tail clusters add per their token share)"
    else:
        head, head_rule = 2 * d * vocab, "full softmax"
    forward = layers * per_layer + head
    stack = config.stack["name"]
    kept_layers = 1 if stack == "reversible" else layers
    mem = attention.get("mem_len", 0) if attention["name"] == "xl_rel" else 0
    act_per_token = kept_layers * (18 * d + 4 * f) + layers * 4 * d * mem / max(seq_len, 1)
    return {
        "train_flops_per_token": 3 * forward,
        "forward_flops_per_token": forward,
        "keys_per_query": keys,
        "keys_rule": rule,
        "head_rule": head_rule,
        "activation_bytes_per_token": act_per_token,
        "activation_mib_per_sequence": act_per_token * seq_len / 2**20,
        "activation_rule": "Korthikanti et al. 2022, bf16, fused attention: (18 d + 4 d_ff) B/token/layer"
        + ("; reversible: one layer kept" if kept_layers == 1 else "")
        + ("; + memory K/V" if mem else ""),
    }


def describe(overrides: list[str]) -> dict[str, Any]:
    """Everything describe.py prints, as one JSON-able dict (``params`` an int)."""
    resolved = resolved_config(overrides)
    check_paper_data(resolved)
    preset, config, vocab_source = model_config_for(resolved)
    model = meta_model(config)
    counts = count_parameters(model)
    seq_len = resolved["trainer"]["seq_len"]
    costs = estimate_costs(config, seq_len)
    out: dict[str, Any] = {
        "experiment": resolved.get("experiment"),
        "preset": preset,
        "kind": config.kind,
        "size": {
            k: getattr(config, k)
            for k in ("n_layers", "d_model", "n_heads", "d_ff", "dropout", "attention_dropout", "vocab_size", "max_len")
        },
        "vocab_source": vocab_source,
        "axes": {axis: dict(getattr(config, axis)) for axis in ("attention", "residual", "stack", "position")},
        "adaptive": dict(config.adaptive),
        "data": resolved["data"],
        "trainer": {
            k: resolved["trainer"].get(k)
            for k in ("seq_len", "batch_size", "max_steps", "precision", "clip", "accumulate")
        },
        "optim": resolved["optim"],
        **counts,
        **costs,
    }
    paper = paper_block(resolved)
    if paper:
        published = paper.get("params")
        out["paper"] = {k: v for k, v in paper.items() if k != "toy"}
        out["paper"]["params_ours"] = counts["params"]
        out["paper"]["params_diff"] = (counts["params"] / published - 1.0) if published else None
    return out


def params_within(
    paper: dict[str, Any], ours: int, tolerance: float = 0.05, explained_tolerance: float = 0.2
) -> tuple[bool, str]:
    """Whether ``ours`` matches the published count: within ``tolerance``, or within
    ``explained_tolerance`` when the file explains the difference (``paper.params_note``)."""
    published = paper.get("params")
    if not published:
        return bool(paper.get("params_note")), "no published count" + (
            "" if paper.get("params_note") else " and no note saying so"
        )
    diff = ours / published - 1.0
    note = (paper.get("params_note") or "").strip()
    limit = explained_tolerance if note else tolerance
    return (
        abs(diff) <= limit,
        f"ours {ours:,} vs published {published:,} ({diff:+.1%}; limit {limit:.0%}{', explained' if note else ''})",
    )


def format_report(info: dict[str, Any]) -> str:
    """The human-readable table describe.py prints."""
    lines = [f"experiment: {info['experiment'] or '-'}    preset: {info['preset']} ({info['kind']})"]
    size = info["size"]
    lines.append(
        "size: " + ", ".join(f"{k} {v}" for k, v in size.items()) + f"    (vocabulary: {info['vocab_source']})"
    )
    for axis, part in info["axes"].items():
        options = ", ".join(f"{k}={v}" for k, v in part.items() if k != "name")
        lines.append(f"{axis:>9}: {part['name']}" + (f" ({options})" if options else ""))
    if info["adaptive"]:
        lines.append(f" adaptive: {info['adaptive']}")
    t = info["trainer"]
    lines.append(
        f"  trainer: seq_len {t['seq_len']}, batch {t['batch_size']}, steps {t['max_steps']}, precision "
        f"{t['precision']}, clip {t['clip']}"
    )
    o = info["optim"]
    lines.append(
        f"    optim: {o['name']} lr {o['lr']} betas {o['betas']} eps {o['eps']} schedule {o['schedule']} warm-up "
        f"{o['warmup']}"
    )
    lines.append(
        f"   params: {info['params']:,} (blocks {info['params_blocks']:,}; embeddings/head/positions "
        f"{info['params_embedding_and_head']:,})"
    )
    lines.append(
        f"    FLOPs: {info['train_flops_per_token'] / 1e9:.3f} GFLOP per training token (estimate; keys/query "
        f"{info['keys_per_query']:.0f}: {info['keys_rule']}; {info['head_rule']})"
    )
    lines.append(
        f"   memory: {info['activation_bytes_per_token'] / 1024:.1f} KiB activations per token, "
        f"{info['activation_mib_per_sequence']:.0f} MiB per sequence (estimate: {info['activation_rule']})"
    )
    paper = info.get("paper")
    if paper:
        lines.append("")
        lines.append(f"paper: {paper.get('citation')}, {paper.get('table')}, row {paper.get('row')}")
        lines.append(
            f"  published: {paper.get('metric')} {paper.get('value')} on {paper.get('dataset')}; params "
            f"{paper.get('params') or 'not published'}"
        )
        diff = paper.get("params_diff")
        lines.append(
            f"  ours:      params {paper['params_ours']:,}"
            + (f" ({diff:+.1%} vs published)" if diff is not None else "")
        )
        if paper.get("params_note"):
            lines.append(f"  note: {paper['params_note']}")
        if paper.get("eval"):
            lines.append(f"  evaluation protocol: {paper['eval']}")
        for item in paper.get("deviations") or []:
            lines.append(f"  deviation: {item}")
    return "\n".join(lines)


def require_paper(resolved: dict[str, Any]) -> dict[str, Any]:
    paper = paper_block(resolved)
    require(paper is not None, "this configuration has no paper: block (pick experiment=paper/<name>)")
    return paper
