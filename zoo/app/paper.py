"""What a configuration builds, without data or training, beside the paper it reproduces.

``describe(overrides)`` composes the app's config (``experiment=paper/xl_enwik8_24l ...``), builds
the model on the ``meta`` device (shapes only, no memory: a 277M-parameter model describes in a
second) and returns the preset, each axis with its options, the exact parameter count, and
estimates of the training cost per token at the configured length, asked of the built model's
parts (:mod:`zoo.models.costs`):

- FLOPs per training token: forward + backward (about twice the forward) + what the stack
  recomputes (reversible: one more forward). Per layer, the attention answers its own forward
  FLOPs (``Attention.forward_flops``: by default its projections, 2 x every weight matrix a token
  passes through, plus 2 x score_terms x d_model x the keys each query sees, ``keys_per_query``:
  score_terms is 2, QK^T and AV, or 3 for Transformer-XL's Q R^T; adaptive span counts its
  largest span, an upper bound; LSH counts what it computes, its chunks and its hashing).
- Activation memory per token: Korthikanti et al. 2022 (arXiv:2205.05198), bf16 with a fused
  attention kernel: (18 d_model + the feed-forward part's own, 4 d_ff for mlp) bytes per token per layer the stack keeps
  (``Stack.kept_layers``: reversible keeps one), plus each layer's memory keys and values
  (``Attention.memory_keys``, 4 d_model bytes each). These are estimates: ``python -m zoo.bench``
  measures saved tensors exactly.

A part that does not answer is reported as unknown, never estimated as dense.

``paper:`` blocks (conf/experiment/paper/*.yaml) carry the published figures; ``check_paper_data``
refuses a paper configuration asked of another dataset unless ``paper.allow_other_data=true``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from zoo.app.compose import compose, explain
from zoo.app.resolve import as_dict, model_config
from zoo.config import require
from zoo.data import TASK
from zoo.models.base import HEAD
from zoo.models.costs import describe_costs


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
    """(vocabulary size, where it comes from) for a data node, without reading any file: the task says."""
    options = dict(data)
    return TASK.get(options.pop("name")).nominal_vocab_size(options)


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


DESCRIBED_AXES = ("attention", "residual", "stack", "position", "norm", "feed_forward", "init")


def describe(overrides: list[str]) -> dict[str, Any]:
    """Everything describe.py prints, as one JSON-able dict (``params`` an int)."""
    resolved = resolved_config(overrides)
    check_paper_data(resolved)
    preset, config, vocab_source = model_config_for(resolved)
    model = meta_model(config)
    counts = count_parameters(model)
    seq_len = resolved["trainer"]["seq_len"]
    costs = describe_costs(model, seq_len)
    out: dict[str, Any] = {
        "experiment": resolved.get("experiment"),
        "preset": preset,
        "kind": config.kind,
        "size": {
            k: getattr(config, k)
            for k in ("n_layers", "d_model", "n_heads", "d_ff", "dropout", "attention_dropout", "vocab_size", "max_len")
        },
        "vocab_source": vocab_source,
        "axes": {
            axis: copy.deepcopy(getattr(config, axis))
            for axis in ("attention", "residual", "stack", "position", "norm", "feed_forward")
        },
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
        reference = paper.get("reference_params")  # the authors' code's own count, where it was built
        out["paper"]["reference_diff"] = (counts["params"] / reference - 1.0) if reference else None
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
        for i, each in enumerate(part if isinstance(part, list) else [part]):  # a hybrid: its per-layer list
            options = ", ".join(f"{k}={v}" for k, v in each.items() if k != "name")
            label = f"{axis}[{i}]" if isinstance(part, list) else axis
            lines.append(f"{label:>12}: {each['name']}" + (f" ({options})" if options else ""))
    if info["adaptive"]:
        lines.append(f" adaptive: {info['adaptive']}")
    t = info["trainer"]
    lines.append(
        f"  trainer: seq_len {t['seq_len']}, batch {t['batch_size']}, steps {t['max_steps']}, precision "
        f"{t['precision']}, clip {t['clip']}"
    )
    o = info["optim"]
    moments = f"momentum {o.get('momentum')}" if o["name"] == "sgd" else f"betas {o['betas']} eps {o['eps']}"
    lines.append(f"    optim: {o['name']} lr {o['lr']} {moments} schedule {o['schedule']} warm-up {o['warmup']}")
    lines.append(
        f"   params: {info['params']:,} (blocks {info['params_blocks']:,}; embeddings/head/positions "
        f"{info['params_embedding_and_head']:,})"
    )
    flops, keys = info["train_flops_per_token"], info["keys_per_query"]
    lines.append(
        f"    FLOPs: {'unknown' if flops is None else f'{flops / 1e9:.3f} GFLOP'} per training token (estimate; "
        f"keys/query {'' if keys is None else f'{keys:.0f}: '}{info['keys_rule']}; {info['feed_forward_rule']}; "
        f"{info['head_rule']})"
    )
    names = {row["attention"] for row in info.get("layers") or []}
    for row in info.get("layers") or [] if len(names) > 1 else []:  # a hybrid: what each layer sees and costs
        flops, keys = row["forward_flops_per_token"], row["keys_per_query"]
        lines.append(
            f"  layer {row['layer']}: {row['attention']}, keys/query "
            f"{'unknown' if keys is None else f'{keys:.0f}'} ({row['keys_rule']}), forward "
            f"{'unknown' if flops is None else f'{flops / 1e6:.2f} MFLOP'} per token"
        )
    per_token, per_sequence = info["activation_bytes_per_token"], info["activation_mib_per_sequence"]
    lines.append(
        f"   memory: {'unknown' if per_token is None else f'{per_token / 1024:.1f} KiB'} activations per token, "
        f"{'unknown' if per_sequence is None else f'{per_sequence:.0f} MiB'} per sequence "
        f"(estimate: {info['activation_rule']})"
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
        if paper.get("reference_params"):
            lines.append(
                f"  reference code: params {paper['reference_params']:,} (ours {paper['reference_diff']:+.3%})"
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
